"""Classic consumer groups against a broker process: two members through a rebalance, committed
offsets across a broker restart, admin listing and deletion of groups, static members that
leave through their session timeout, and the session timeout bounds."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer

from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S, wait_until

PARTITIONS = 4


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for index, value in enumerate(values):
        producer.produce(topic, value=value, partition=index % PARTITIONS)
    assert producer.flush(30) == 0


def group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )


def poll_into(consumer: Consumer, into: list[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None or message.error() is not None:
            continue
        value = message.value()
        assert value is not None
        into.append(value)
        consumer.commit(message=message, asynchronous=False)


def test_two_members_rebalance_commit_and_resume_after_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        topic, group = "grouped", f"g-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
        values = [f"v{index}".encode() for index in range(400)]
        produce(broker.bootstrap, topic, values)

        first = group_consumer(broker.bootstrap, group)
        first.subscribe([topic])
        seen_first: list[bytes] = []
        poll_into(first, seen_first, 4)
        second = group_consumer(broker.bootstrap, group)
        second.subscribe([topic])
        seen_second: list[bytes] = []
        deadline = time.monotonic() + PATIENCE_S
        # Poll both until the second has joined (the first may have read everything already)
        # and everything has been read.
        while (
            len(set(seen_first) | set(seen_second)) < len(values)
            or not first.assignment()
            or not second.assignment()
        ):
            assert time.monotonic() < deadline, "the group did not consume everything"
            poll_into(first, seen_first, 0.5)
            poll_into(second, seen_second, 0.5)
        # After the rebalance both members own partitions.
        assert first.assignment() and second.assignment()
        assert len(first.assignment()) + len(second.assignment()) == PARTITIONS
        listed = admin.list_consumer_groups().result()
        assert group in {g.group_id for g in listed.valid}
        first.close()
        second.close()

        assert broker.stop() == 0
        broker.start()
        more = [f"after-{index}".encode() for index in range(20)]
        produce(broker.bootstrap, topic, more)
        resumed = group_consumer(broker.bootstrap, group)
        resumed.subscribe([topic])
        seen: list[bytes] = []
        deadline = time.monotonic() + PATIENCE_S
        while len(seen) < len(more) and time.monotonic() < deadline:
            poll_into(resumed, seen, 0.5)
        poll_into(resumed, seen, 1)
        # Committed offsets survived the restart: only the new records arrive.
        assert sorted(seen) == sorted(more)
        committed = resumed.committed(
            [TopicPartition(topic, index) for index in range(PARTITIONS)], timeout=10
        )
        assert sum(tp.offset for tp in committed) == len(values) + len(more)
        resumed.close()

        deleted = admin.delete_consumer_groups([group])
        deleted[group].result()
        listed = admin.list_consumer_groups().result()
        assert group not in {g.group_id for g in listed.valid}
    finally:
        if broker.alive():
            broker.stop()


def test_kafka_python_group_consumer_commits(broker: BrokerProcess) -> None:
    topic, group = f"kp-group-{uuid.uuid4().hex[:6]}", f"kg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    values = [f"k{index}".encode() for index in range(100)]
    produce(broker.bootstrap, topic, values)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: list[bytes] = []

    def read_all() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(record.value for record in records)
        return len(got) >= len(values)

    wait_until(read_all, "the group member to read every record", interval_s=0)
    consumer.commit()
    consumer.close()
    assert sorted(got) == sorted(values)
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committed = check.committed([TopicPartition(topic, i) for i in range(PARTITIONS)], timeout=10)
    assert sum(tp.offset for tp in committed) == len(values)
    check.close()


def test_described_member_host_is_the_connections(broker: BrokerProcess) -> None:
    """DescribeGroups reports each member's host as the broker saw its connection (Kafka's
    ``/address`` form), recorded by JoinGroup from the connection's peer."""
    topic, group = f"hosts-{uuid.uuid4().hex[:6]}", f"hg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "client.id": "host-reporter",
            "session.timeout.ms": 6000,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + PATIENCE_S
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the consumer never got its assignment"
            consumer.poll(0.2)
        described = admin.describe_consumer_groups([group])[group].result()
        (member,) = described.members
        assert member.client_id == "host-reporter"
        assert member.host == "/127.0.0.1"  # the broker listens on, and clients come from, it
    finally:
        consumer.close()


SESSION_TIMEOUT_MS = 6000  # the smallest the broker allows by default (Kafka's too)


def test_static_members_are_gone_once_their_session_times_out(broker: BrokerProcess) -> None:
    """Static members (``group.instance.id``) send no LeaveGroup when they close: they leave
    when their session times out, and every request from then on sees them gone. librdkafka's
    own admin test closes such consumers, sleeps the session timeout and deletes the groups; a
    coordinator that expired members on a periodic tick answered NON_EMPTY_GROUP."""
    topic = f"static-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    values = [f"s{index}".encode() for index in range(40)]
    produce(broker.bootstrap, topic, values)
    groups = [f"sg-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    consumers = []
    for index, group in enumerate(groups):
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "group.instance.id": f"instance-{index}",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        seen: list[bytes] = []
        deadline = time.monotonic() + PATIENCE_S
        while len(seen) < len(values):
            assert time.monotonic() < deadline, "the static member read too little"
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
        consumers.append(consumer)
    described = admin.describe_consumer_groups(groups)
    for group in groups:
        (member,) = described[group].result().members
        assert member.group_instance_id is not None
    for consumer in consumers:
        consumer.close()  # commits its offsets (the session's last extension), no LeaveGroup
    # Not a guess at how long something takes: the sleep starts once close has returned, after
    # the broker answered the member's last request, so on the broker's clock at least one
    # session timeout has passed when DeleteGroups arrives, however busy the machine.
    time.sleep(SESSION_TIMEOUT_MS / 1000)
    deleted = admin.delete_consumer_groups(groups)
    for group in groups:
        deleted[group].result()


def test_kafka_python_static_member_is_gone_once_its_session_times_out(
    broker: BrokerProcess,
) -> None:
    topic, group = f"kp-static-{uuid.uuid4().hex[:6]}", f"kps-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    values = [f"p{index}".encode() for index in range(40)]
    produce(broker.bootstrap, topic, values)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        group_instance_id="kp-instance",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=1000,
        auto_offset_reset="earliest",
    )
    # The topic's partitions known before the member joins: on a busy machine kafka-python may
    # join first, assign as the leader without them ("No partition metadata for topic") and
    # give itself nothing; once, loaded, it then read nothing for two minutes.
    assert consumer.partitions_for_topic(topic) == set(range(PARTITIONS))
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + PATIENCE_S
    while len(got) < len(values):
        assert time.monotonic() < deadline, "the static member read too little"
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(record.value for record in records)
    consumer.close()  # commits, and a static member sends no LeaveGroup
    time.sleep(SESSION_TIMEOUT_MS / 1000)
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert kp_admin.delete_groups([group]) == {group: "OK"}
    finally:
        kp_admin.close()


def test_session_timeout_below_the_minimum_is_refused(broker: BrokerProcess) -> None:
    """``group.min.session.timeout.ms`` (6000 by default, as in Kafka) bounds JoinGroup's
    session timeout: below it the member is refused INVALID_SESSION_TIMEOUT and never joins."""
    topic, group = f"short-{uuid.uuid4().hex[:6]}", f"shg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "session.timeout.ms": SESSION_TIMEOUT_MS - 1000,
        }
    )
    try:
        consumer.subscribe([topic])
        errors: list[int] = []
        deadline = time.monotonic() + PATIENCE_S
        while not errors and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            error = None if message is None else message.error()
            if error is not None:
                errors.append(error.code())
        assert errors == [KafkaError.INVALID_SESSION_TIMEOUT]
    finally:
        consumer.close()
    try:
        admin.delete_consumer_groups([group])[group].result()
    except KafkaException as error:
        assert error.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
    else:
        raise AssertionError("a refused member created its group")
