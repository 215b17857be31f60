"""Admin conformance against a broker process: authorized operations (KIP-430) as a broker
without an authorizer answers them; auto-created topics (``num.partitions``,
``default.replication.factor``, ``auto.create.topics.enable=false`` for Metadata and Produce);
manual replica assignments in CreateTopics and CreatePartitions."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewPartitions, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.errors import InvalidReplicationAssignmentError, KafkaTimeoutError

from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S

TOPIC_OPERATIONS = {
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}
CLUSTER_OPERATIONS = {
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
}
GROUP_OPERATIONS = {
    AclOperation.READ,
    AclOperation.DELETE,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_confluent_kafka_sees_every_operation_when_asked(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("ops")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()

    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[
        topic
    ].result(10)
    assert set(described.authorized_operations) == TOPIC_OPERATIONS
    assert len(described.authorized_operations) == 8
    plain = admin.describe_topics(TopicCollection([topic]))[topic].result(10)
    assert not plain.authorized_operations

    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == CLUSTER_OPERATIONS
    assert not admin.describe_cluster().result(10).authorized_operations

    group = unique("ops-group")
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + PATIENCE_S
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    try:
        future = admin.describe_consumer_groups([group], include_authorized_operations=True)
        described_group = future[group].result(10)
        assert set(described_group.authorized_operations) == GROUP_OPERATIONS
        plain_group = admin.describe_consumer_groups([group])[group].result(10)
        assert not plain_group.authorized_operations
    finally:
        consumer.close()


def started(tmp_path: Path, *overrides: str) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", *overrides)
    broker.start()
    return broker


def stop(broker: BrokerProcess) -> None:
    broker.stop()
    dropped = broker.unawaited_coroutines()
    assert not dropped, f"the broker dropped coroutines unawaited: {dropped}"


def test_auto_created_topics_take_num_partitions(tmp_path: Path) -> None:
    broker = started(tmp_path, "num.partitions=3", "default.replication.factor=1")
    try:
        topic = unique("auto")
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        producer.send(topic, b"v").get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
        assert consumer.partitions_for_topic(topic) == {0, 1, 2}
        consumer.close()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        made = unique("made")
        admin.create_topics([NewTopic(made)])[made].result(10)  # -1 and -1: the defaults
        described = admin.describe_topics(TopicCollection([made]))[made].result(10)
        assert len(described.partitions) == 3
        assert all(len(p.replicas) == 1 for p in described.partitions)
    finally:
        stop(broker)


def test_auto_create_disabled_for_metadata_and_produce(tmp_path: Path) -> None:
    broker = started(tmp_path, "auto.create.topics.enable=false", "num.partitions=2")
    try:
        # confluent-kafka: the delivery fails with the unknown topic; nothing is created.
        # librdkafka fails it so once the broker has called the topic unknown and the
        # propagation time has passed; the message timeout, which would fail it as timed out
        # instead on a slow machine, is kept out of the way.
        missing = unique("missing-ck")
        errors: list[KafkaError | None] = []
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "topic.metadata.propagation.max.ms": 1000,
                "message.timeout.ms": int(PATIENCE_S * 1000),
            }
        )
        producer.produce(missing, b"v", on_delivery=lambda error, _: errors.append(error))
        producer.flush(PATIENCE_S)
        assert [e.code() if e else None for e in errors] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed = admin.list_topics(missing, timeout=10).topics[missing]
        assert listed.error is not None
        assert listed.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

        # kafka-python: the producer never learns the topic; the admin never sees it.
        missing_kp = unique("missing-kp")
        kp_producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_block_ms=2000)
        with pytest.raises(KafkaTimeoutError):
            kp_producer.send(missing_kp, b"v").get(timeout=10)
        kp_producer.close()
        kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        names = set(kp_admin.list_topics())
        kp_admin.close()
        assert missing not in names and missing_kp not in names

        # Created explicitly, the topic has num.partitions partitions and takes writes.
        present = unique("present")
        admin.create_topics([NewTopic(present)])[present].result(10)
        producer.produce(present, b"v", on_delivery=lambda error, _: errors.append(error))
        producer.flush(PATIENCE_S)
        assert errors[1:] == [None]
    finally:
        stop(broker)


def partition_count(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.describe_topics(TopicCollection([topic]))[topic].result(10).partitions)


def test_confluent_kafka_manual_replica_assignment(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("assigned-ck")
    admin.create_topics([NewTopic(topic, 3, replica_assignment=[[0], [0], [0]])])[topic].result(10)
    assert partition_count(broker.bootstrap, topic) == 3
    grown = admin.create_partitions([NewPartitions(topic, 5, replica_assignment=[[0], [0]])])
    grown[topic].result(10)
    assert partition_count(broker.bootstrap, topic) == 5

    elsewhere = unique("elsewhere-ck")
    future = admin.create_topics([NewTopic(elsewhere, 2, replica_assignment=[[0], [4]])])[elsewhere]
    with pytest.raises(KafkaException) as raised:
        future.result(10)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert "broker 4" in error.str()
    future = admin.create_partitions([NewPartitions(topic, 6, replica_assignment=[[0, 0]])])[topic]
    with pytest.raises(KafkaException) as raised:
        future.result(10)
    assert raised.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert partition_count(broker.bootstrap, topic) == 5


def test_kafka_python_manual_replica_assignment(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        topic = unique("assigned-kp")
        admin.create_topics([KpNewTopic(topic, replica_assignments={0: [0], 1: [0]})])
        assert partition_count(broker.bootstrap, topic) == 2
        admin.create_partitions({topic: KpNewPartitions(3, [[0]])})
        assert partition_count(broker.bootstrap, topic) == 3
        gap = unique("gap-kp")
        with pytest.raises(InvalidReplicationAssignmentError):
            admin.create_topics([KpNewTopic(gap, replica_assignments={0: [0], 2: [0]})])
    finally:
        admin.close()
