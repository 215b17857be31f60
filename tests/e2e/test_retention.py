"""Retention and DeleteRecords trim partitions; acks=0 produces are stored all the same."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_clients import consume_all, unique
from tests.waiting import PATIENCE_S


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return low, high


def produce_batches(bootstrap: str, topic: str, batches: int, per_batch: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for batch in range(batches):
        for index in range(per_batch):
            producer.produce(topic, value=b"x" * 1000, key=f"{batch}-{index}".encode())
        assert producer.flush(PATIENCE_S) == 0  # one batch per flush


def test_retention_bytes_trims_whole_batches_from_the_start(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", "log.retention.check.interval.ms=300")
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = unique("retained")
        config = {"retention.bytes": "30000"}
        admin.create_topics([NewTopic(topic, num_partitions=1, config=config)])[topic].result()
        produce_batches(broker.bootstrap, topic, batches=10, per_batch=10)  # ~10 KB per batch
        # A retention pass may run while batches are still arriving and trim only some: wait
        # for the pass that sees all of them, then check that later passes leave it there.
        deadline = time.monotonic() + PATIENCE_S
        while watermarks(broker.bootstrap, topic)[0] < 50:
            assert time.monotonic() < deadline, "retention never trimmed to ~30 KB"
            time.sleep(0.3)
        time.sleep(1.0)  # three more retention passes
        low, high = watermarks(broker.bootstrap, topic)
        # Whole batches go (librdkafka decides the batch boundaries), about 30 KB stay.
        assert high == 100 and 50 <= low < 100, (low, high)
        got = consume_all(broker.bootstrap, topic, 1, high - low)
        assert len(got) == high - low
    finally:
        broker.stop()


def test_delete_records_moves_the_log_start(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("deleted-records")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    produce_batches(broker.bootstrap, topic, batches=5, per_batch=4)
    result = admin.delete_records([TopicPartition(topic, 0, 8)])
    for future in result.values():
        future.result()
    assert watermarks(broker.bootstrap, topic) == (8, 20)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": unique("dr"),
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])  # below the start: reset to earliest
    consumer.close()
    assert len(consume_all(broker.bootstrap, topic, 1, 12)) == 12


def test_acks_zero_produce_is_stored(broker: BrokerProcess) -> None:
    topic = unique("acks0")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures need it
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=0, enable_idempotence=False)
    for index in range(50):
        producer.send(topic, f"z{index}".encode())
    producer.flush()
    producer.close()
    deadline = time.monotonic() + PATIENCE_S
    while watermarks(broker.bootstrap, topic)[1] < 50:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert consume_all(broker.bootstrap, topic, 1, 50) == [f"z{i}".encode() for i in range(50)]
