"""A consumer group across a cluster: three ``automq-ref serve`` processes on one etcd and one
object store, the group's members bootstrapped to different brokers (confluent-kafka and
kafka-python in one group). They find one coordinator (the broker leading the group's
``__consumer_offsets`` partition), form one generation in which every partition is assigned
once, consume everything and commit; the coordinator's broker is restarted (its coordinator
partitions move to the others and back) and the committed offsets are read back through the
other brokers. On the same cluster, a transaction over partitions led by all three brokers: its
coordinator writes the markers of the partitions other brokers lead with WriteTxnMarkers, so a
``read_committed`` consumer reads the committed transaction whole and nothing of the aborted one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer

from tests.e2e.conftest import BrokerProcess
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.waiting import PATIENCE_S, wait_until

PARTITIONS = 6
RECORDS = 600
SESSION_MS = 6000


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


class Member(threading.Thread):
    """One group member consuming and committing in a thread of its own until stopped."""

    def __init__(self, kind: str, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(name=f"member-{kind}", daemon=True)
        self.kind, self.bootstrap, self.topic, self.group = kind, bootstrap, topic, group
        self.values: list[bytes] = []
        self.assigned: set[int] = set()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.kind == "confluent":
                self._confluent()
            else:
                self._kafka_python()
        except BaseException as error:  # reported by the test
            self.error = error

    def _confluent(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self.stop_event.is_set():
                message = consumer.poll(0.2)
                self.assigned = {tp.partition for tp in consumer.assignment()}
                if message is None or message.error() is not None:
                    continue
                self.values.append(message.value() or b"")
                consumer.commit(message=message, asynchronous=False)
        finally:
            consumer.close()

    def _kafka_python(self) -> None:
        consumer = KafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=500,
        )
        try:
            while not self.stop_event.is_set():
                polled = consumer.poll(timeout_ms=200)
                self.assigned = {tp.partition for tp in consumer.assignment()}
                for records in polled.values():
                    self.values.extend(record.value for record in records)
                if polled:
                    consumer.commit()
        finally:
            consumer.close()


def check_transactions(admin: AdminClient, bootstrap: str) -> None:
    """A committed and an aborted transaction over PARTITIONS partitions spread over the
    brokers; a read_committed consumer reads exactly the committed one."""
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    for future in admin.create_topics([NewTopic(topic, PARTITIONS)], request_timeout=30).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(60)
    committed = [f"c{index}".encode() for index in range(PARTITIONS * 2)]
    for values in (committed, [b"aborted"] * PARTITIONS):
        producer.begin_transaction()
        for index, value in enumerate(values):
            producer.produce(topic, value=value, partition=index % PARTITIONS)
        if values is committed:
            producer.commit_transaction(60)
        else:
            producer.flush(60)
            producer.abort_transaction(60)
    # After the markers of the abort: every partition's stable offset is past both.
    producer.begin_transaction()
    producer.produce(topic, value=b"last", partition=0)
    producer.commit_transaction(60)
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    read: list[bytes] = []
    deadline = time.monotonic() + PATIENCE_S
    try:
        while b"last" not in read and time.monotonic() < deadline:
            message = reader.poll(0.5)
            found = None if message is None or message.error() else message.value()
            if found is not None:
                read.append(found)
        # Partition 0's "last" may come before the other partitions' records: read them out.
        quiet = time.monotonic() + 3
        while time.monotonic() < quiet:
            message = reader.poll(0.3)
            found = None if message is None or message.error() else message.value()
            if found is not None:
                read.append(found)
    finally:
        reader.close()
    assert sorted(read) == sorted([*committed, b"last"])


def test_a_group_across_three_brokers(tmp_path: Path, etcd: EtcdServer) -> None:
    common = (
        f"metadata.etcd.endpoints={etcd.endpoint}",
        f"cluster.id={unique_cluster_id('groups')}",
        f"s3.data.buckets={(tmp_path / 'objects').as_uri()}",
        "controller.lease.ttl.ms=2000",
        f"group.min.session.timeout.ms={SESSION_MS}",
    )
    brokers = {
        node_id: BrokerProcess(
            tmp_path / f"broker-{node_id}",
            *common,
            f"node.id={node_id}",
            f"broker.rack=az{node_id}",
        )
        for node_id in (1, 2, 3)
    }
    members: list[Member] = []
    try:
        for broker in brokers.values():
            broker.start()
        everyone = ",".join(b.bootstrap for b in brokers.values())
        topic, group = "spread", f"across-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": everyone})
        for future in admin.create_topics(
            [NewTopic(topic, PARTITIONS)], request_timeout=30
        ).values():
            future.result(60)
        # Each member knows one broker only.
        started = time.monotonic()
        members = [
            Member("confluent", brokers[1].bootstrap, topic, group),
            Member("confluent", brokers[2].bootstrap, topic, group),
            Member("kafka-python", brokers[3].bootstrap, topic, group),
        ]
        for member in members:
            member.start()

        def one_generation() -> bool:
            for member in members:
                assert member.error is None, f"{member.name}: {member.error!r}"
            try:
                described = admin.describe_consumer_groups([group])[group].result(30)
            except KafkaException as error:  # the group's shard still loading: asked again
                print(f"describe: {error}")
                return False
            assigned = [
                tp.partition for m in described.members for tp in m.assignment.topic_partitions
            ]
            return (
                described.state.name == "STABLE"
                and len(described.members) == len(members)
                and sorted(assigned) == list(range(PARTITIONS))
                # Every member sees the assignment the coordinator handed out.
                and sorted(p for m in members for p in m.assigned) == list(range(PARTITIONS))
            )

        wait_until(one_generation, "one generation of three members, each partition once")
        print(f"one generation of three members after {time.monotonic() - started:.1f} s")
        # Produced once the generation stands: each member reads its own partitions' records.
        producer = Producer({"bootstrap.servers": everyone, "enable.idempotence": True})
        values = [f"v{index}".encode() for index in range(RECORDS)]
        for index, value in enumerate(values):
            producer.produce(topic, value=value, partition=index % PARTITIONS)
        assert producer.flush(60) == 0
        wait_until(
            lambda: {v for m in members for v in m.values} == set(values),
            "every record consumed by the group",
        )
        # Once each: no rebalance since, no record read by two members.
        assert sum(len(m.values) for m in members) == RECORDS
        assert one_generation()
        coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        for member in members:
            member.stop_event.set()
        for member in members:
            member.join(PATIENCE_S)
            assert member.error is None, f"{member.name}: {member.error!r}"
        assert all(member.values for member in members), "a member consumed nothing"

        # The coordinator's broker restarts; the offsets are read through the other brokers.
        brokers[coordinator].stop()
        brokers[coordinator].start()
        others = ",".join(b.bootstrap for n, b in brokers.items() if n != coordinator)
        expected = {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}

        def committed_confluent() -> bool:
            check = Consumer({"bootstrap.servers": others, "group.id": group})
            try:
                found = check.committed(
                    [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
                )
            except Exception:  # the coordinator still moving: asked again
                return False
            finally:
                check.close()
            return {tp.partition: tp.offset for tp in found} == expected

        wait_until(committed_confluent, "the committed offsets, read with confluent-kafka")
        kp_admin = KafkaAdminClient(bootstrap_servers=others)
        try:
            offsets = kp_admin.list_group_offsets(group)[group]
        finally:
            kp_admin.close()
        assert {tp.partition: meta.offset for tp, meta in offsets.items()} == expected
        check_transactions(admin, everyone)
    finally:
        for member in members:
            member.stop_event.set()
        for broker in brokers.values():
            if broker.alive():
                broker.stop()
    for broker in brokers.values():
        assert not broker.unawaited_coroutines()
