"""The admin APIs admin clients send, with real clients against a broker process:
DescribeLogDirs, OffsetDelete and DescribeTopicPartitions (kafka-python's admin client), and
ConsumerGroupDescribe (confluent-kafka's describe_consumer_groups, which librdkafka sends it
for when the broker advertises it, falling back to DescribeGroups on GROUP_ID_NOT_FOUND)."""

from __future__ import annotations

import uuid

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import GroupIdNotFoundError
from kafka.structs import OffsetAndMetadata

from tests.e2e.conftest import BrokerProcess

TIMEOUT_S = 30


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin(broker: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)


def create(kp_admin: KafkaAdminClient, topic: str, partitions: int) -> None:
    kp_admin.create_topics([NewTopic(topic, partitions, 1)])


def test_describe_log_dirs_reports_the_partitions_and_their_sizes(broker: BrokerProcess) -> None:
    topic = unique("logdirs")
    kp_admin = admin(broker)
    try:
        create(kp_admin, topic, 2)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for _ in range(20):
            producer.send(topic, b"v" * 100, partition=1)
        producer.flush(TIMEOUT_S)
        producer.close()
        (answer,) = kp_admin.describe_log_dirs()
        assert answer["broker"] == 0
        (log_dir,) = answer["log_dirs"]
        assert log_dir["error_code"] == 0
        assert log_dir["log_dir"] == str(broker.data_dir.absolute())
        (described,) = [t for t in log_dir["topics"] if t["name"] == topic]
        sizes = {p["partition_index"]: p["partition_size"] for p in described["partitions"]}
        assert sizes[0] == 0
        assert sizes[1] > 20 * 100
        assert log_dir["total_bytes"] > 0
    finally:
        kp_admin.close()


def test_delete_group_offsets(broker: BrokerProcess) -> None:
    topic, group = unique("offsets"), unique("group")
    kp_admin = admin(broker)
    try:
        create(kp_admin, topic, 2)
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        consumer.assign(partitions)
        consumer.commit({tp: OffsetAndMetadata(3, "", -1) for tp in partitions})
        consumer.close()
        deleted = kp_admin.delete_group_offsets(group, [TopicPartition(topic, 0)])
        assert {tp: error.errno for tp, error in deleted.items()} == {TopicPartition(topic, 0): 0}
        offsets = kp_admin.list_group_offsets(group)[group]
        assert {tp.partition: meta.offset for tp, meta in offsets.items()} == {1: 3}
        try:
            kp_admin.delete_group_offsets(unique("never"), [TopicPartition(topic, 0)])
        except GroupIdNotFoundError:
            pass
        else:
            raise AssertionError("an unknown group's offsets were deleted")
    finally:
        kp_admin.close()


def test_describe_topic_partitions_pages(broker: BrokerProcess) -> None:
    topic = unique("dtp")
    kp_admin = admin(broker)
    try:
        create(kp_admin, topic, 3)
        first = kp_admin.describe_topic_partitions([topic], response_partition_limit=2)
        (described,) = first["topics"]
        assert described["error_code"] == 0 and described["name"] == topic
        assert [p["partition_index"] for p in described["partitions"]] == [0, 1]
        assert first["next_cursor"] == {"topic_name": topic, "partition_index": 2}
        rest = kp_admin.describe_topic_partitions([topic], cursor=first["next_cursor"])
        assert [p["partition_index"] for p in rest["topics"][0]["partitions"]] == [2]
        assert rest["next_cursor"] is None
    finally:
        kp_admin.close()


def test_describe_consumer_groups_of_a_classic_group(broker: BrokerProcess) -> None:
    topic, group = unique("cgd"), unique("group")
    kp_admin = admin(broker)
    try:
        create(kp_admin, topic, 1)
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        consumer.assign([TopicPartition(topic, 0)])
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
        consumer.close()
    finally:
        kp_admin.close()
    ck_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    future = ck_admin.describe_consumer_groups([group])[group]
    described = future.result(TIMEOUT_S)
    assert described.group_id == group
    assert described.state == ConsumerGroupState.EMPTY
