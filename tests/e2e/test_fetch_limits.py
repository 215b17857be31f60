"""Fetch's byte limits across partitions (KIP-74) with real clients.

Only the first record batch of a whole Fetch response may be larger than the request's
``max_bytes`` (so a consumer can always make progress); every later partition gets only the whole
batches that still fit, possibly none. A client that sizes its receive buffer from ``max_bytes``
(librdkafka: ``receive.message.max.bytes`` must be at least ``fetch.max.bytes`` + 512) rejects
a larger response and reconnects forever, so it never reads a record.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S

PARTITIONS = 3
PER_PARTITION = 4
RECORD_BYTES = 900 * 1024
FETCH_MAX_BYTES = 1_000_000


def big_topic(broker: BrokerProcess) -> tuple[str, set[bytes]]:
    """A topic of three partitions, each holding batches of one uncompressed 900 KiB record."""
    topic = f"big-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "none"})
    values: set[bytes] = set()
    for partition in range(PARTITIONS):
        for index in range(PER_PARTITION):
            value = f"{partition}-{index}-".encode().ljust(RECORD_BYTES, b".")
            values.add(value)
            producer.produce(topic, value=value, partition=partition)
            # One record per batch: flush before the next one joins it.
            assert producer.flush(30) == 0
    return topic, values


def test_confluent_kafka_reads_batches_larger_than_half_of_fetch_max_bytes(
    broker: BrokerProcess,
) -> None:
    topic, values = big_topic(broker)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"big-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": FETCH_MAX_BYTES,
            "max.partition.fetch.bytes": 20_000_000,
            "receive.message.max.bytes": FETCH_MAX_BYTES + 512,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, index, 0) for index in range(PARTITIONS)])
        got: set[bytes] = set()
        deadline = time.monotonic() + PATIENCE_S
        while len(got) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            value = message.value()
            assert value is not None
            got.add(value)
        assert len(got) == len(values), f"read {len(got)} of {len(values)} records"
        assert got == values
    finally:
        consumer.close()


def test_kafka_python_fetches_stay_within_fetch_max_bytes(broker: BrokerProcess) -> None:
    """kafka-python accepts any response size, so its own metric tells: the most record bytes
    one fetch brought must not pass ``fetch_max_bytes`` (one 900 KiB batch fits, two do not)."""
    topic, values = big_topic(broker)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=20_000_000,
    )
    try:
        consumer.assign([KpTopicPartition(topic, index) for index in range(PARTITIONS)])
        got: set[bytes] = set()
        deadline = time.monotonic() + PATIENCE_S
        while len(got) < len(values) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update(record.value for record in records)
        assert got == values
        metrics = consumer.metrics()["consumer-fetch-manager-metrics"]
        largest = metrics["fetch-size-max"]
        assert 0 < largest <= FETCH_MAX_BYTES, f"a fetch brought {largest} bytes"
    finally:
        consumer.close()
