"""Real Kafka clients against a real broker process: produce, consume, every codec, admin."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S, wait_until

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, index, 0) for index in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + PATIENCE_S
    while len(values) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        value = message.value()
        assert value is not None
        values.append(value)
    consumer.close()
    return values


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_round_trip_with_codec(broker: BrokerProcess, codec: str) -> None:
    topic = unique(f"codec-{codec}")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "compression.type": codec,
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    sent = [f"{codec}-{index}".encode() * (1 + index % 7) for index in range(400)]
    for index, value in enumerate(sent):
        producer.produce(topic, value=value, key=str(index).encode(), partition=index % 2)
    assert producer.flush(30) == 0
    got = consume_all(broker.bootstrap, topic, 2, len(sent))
    assert sorted(got) == sorted(sent)


def test_kafka_python_produce_auto_creates_and_consumes_in_order(broker: BrokerProcess) -> None:
    topic = unique("kp")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for index in range(200):
        producer.send(topic, f"v{index}".encode(), key=b"k")
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
    partition = KpTopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    messages: list[Any] = []

    def read_200() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            messages.extend(records)
        return len(messages) >= 200

    wait_until(read_200, "200 records read back", interval_s=0)
    # Nothing past them: the log ends there (rather than: nothing more came for a while).
    end = consumer.end_offsets([partition])[partition]
    consumer.close()
    assert [m.value for m in messages] == [f"v{index}".encode() for index in range(200)]
    assert [m.offset for m in messages] == list(range(200))
    assert end == 200


def test_aiokafka_round_trip(broker: BrokerProcess) -> None:
    topic = unique("aio")

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="gzip")
        await producer.start()
        try:
            for index in range(50):
                await producer.send_and_wait(topic, f"a{index}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await consumer.start()
        try:
            partition = AioTopicPartition(topic, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            got: list[bytes] = []
            deadline = time.monotonic() + PATIENCE_S
            while len(got) < 50 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000)
                for messages in batches.values():
                    got += [message.value for message in messages if message.value is not None]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"a{index}".encode() for index in range(50)]


def test_kcat_produce_and_consume(broker: BrokerProcess) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (.ci/run installs the Debian package)")
    topic = unique("kcat")
    lines = "".join(f"line-{index}\n" for index in range(100))
    subprocess.run(
        [kcat, "-b", broker.bootstrap, "-P", "-t", topic, "-z", "lz4"],
        input=lines,
        text=True,
        check=True,
        timeout=30,
    )
    consumed = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert consumed.stdout.splitlines() == [f"line-{index}" for index in range(100)]


def test_admin_create_describe_alter_partitions_delete(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("admin")
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config={"retention.ms": "60000"})]
    )[topic].result()
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    with pytest.raises(KafkaException, match="INVALID_REPLICATION_FACTOR"):
        name = unique("replicated")
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=3)])[name].result()
    resource = ConfigResource("topic", topic)
    described = admin.describe_configs([resource])[resource].result()
    assert described["retention.ms"].value == "60000"
    assert described["cleanup.policy"].value == "delete"
    change = ConfigResource("topic", topic)
    change.add_incremental_config(
        __import__("confluent_kafka.admin", fromlist=["ConfigEntry"]).ConfigEntry(
            "retention.bytes",
            "1048576",
            incremental_operation=__import__(
                "confluent_kafka.admin", fromlist=["AlterConfigOpType"]
            ).AlterConfigOpType.SET,
        )
    )
    admin.incremental_alter_configs([change])[change].result()
    described = admin.describe_configs([resource])[resource].result()
    assert described["retention.bytes"].value == "1048576"
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result()
    metadata = admin.list_topics(topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 3
    admin.delete_topics([topic])[topic].result()
    assert topic not in admin.list_topics(timeout=10).topics


def test_describe_cluster_and_list_offsets_by_time(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cluster = admin.describe_cluster().result()
    assert [node.port for node in cluster.nodes] == [broker.port]
    topic = unique("times")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for index in range(10):
        producer.produce(topic, value=b"t", timestamp=1_000_000 + index * 1000)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("lo")})
    found = consumer.offsets_for_times([TopicPartition(topic, 0, 1_004_500)], timeout=10)
    assert found[0].offset == 5
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert (low, high) == (0, 10)
    consumer.close()
