"""Compacted topics with real clients: after the cleaner has run, a consumer reading from the
beginning sees exactly each key's last record (tombstones included, within
``delete.retention.ms``), at the offset its producer was told, with gaps between offsets; the
same after a graceful restart and after SIGKILL. Keyless records are refused (INVALID_RECORD).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonPartition

from tests.e2e.conftest import BrokerProcess
from tests.e2e.test_clients import unique

Entry = tuple[int, bytes, bytes | None]  # offset, key, value


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path / "data",
        "log.cleaner.backoff.ms=200",
        "log.cleaner.min.cleanable.ratio=0",  # clean as soon as anything is dirty
    )
    broker.start()
    yield broker
    if broker.alive():
        broker.stop()
    assert not broker.unawaited_coroutines()


def read_from_start(bootstrap: str, topic: str) -> list[Entry]:
    """Every record of partition 0 from offset 0 to the end, with confluent-kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("compacted"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[Entry] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                raise AssertionError(error)
            offset, key = message.offset(), message.key()
            assert offset is not None and key is not None
            found.append((offset, key, message.value()))
        raise AssertionError(f"no end of partition within 30 s; read {found}")
    finally:
        consumer.close()


def read_with_kafka_python(bootstrap: str, topic: str) -> list[Entry]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    partition = KafkaPythonPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    end = consumer.end_offsets([partition])[partition]
    found: list[Entry] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(partition) < end:
            assert time.monotonic() < deadline, f"kafka-python stuck at {found}"
            for records in consumer.poll(timeout_ms=500).values():
                found.extend((r.offset, r.key, r.value) for r in records)
        return found
    finally:
        consumer.close()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Writer:
    """An idempotent confluent-kafka producer that remembers where each key's last record went."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self.last: dict[bytes, tuple[int, bytes | None]] = {}
        self.errors: list[KafkaError] = []

    def send(self, records: list[tuple[bytes | None, bytes | None]]) -> None:
        def delivered(error: KafkaError | None, message: object) -> None:
            if error is not None:
                self.errors.append(error)
                return
            key, offset = message.key(), message.offset()  # type: ignore[attr-defined]
            previous = self.last.get(key)
            if previous is None or previous[0] < offset:
                self.last[key] = (offset, message.value())  # type: ignore[attr-defined]

        for key, value in records:
            self.producer.produce(self.topic, key=key, value=value, on_delivery=delivered)
        assert self.producer.flush(30) == 0

    def expected(self) -> list[Entry]:
        return sorted((offset, key, value) for key, (offset, value) in self.last.items())


def test_compacted_topic_keeps_the_last_record_per_key(broker: BrokerProcess) -> None:
    topic = unique("compacted")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = admin.create_topics(
        [NewTopic(topic, num_partitions=1, config={"cleanup.policy": "compact"})]
    )
    created[topic].result()
    writer = Writer(broker.bootstrap, topic)
    keys = [f"key-{index}".encode() for index in range(20)]
    for round_ in range(5):
        writer.send([(key, f"{key.decode()}={round_}".encode()) for key in keys])
    writer.send([(key, None) for key in keys[:5]])  # tombstones, kept for delete.retention.ms
    assert not writer.errors
    expected = writer.expected()
    produced = 20 * 5 + 5

    # The cleaner runs every 200 ms: wait until a reader sees only the last record per key.
    wait_for(lambda: read_from_start(broker.bootstrap, topic) == expected, "the clean")
    offsets = [offset for offset, _, _ in expected]
    assert len(offsets) == 20 < produced and offsets[-1] == produced - 1
    assert read_with_kafka_python(broker.bootstrap, topic) == expected
    low, high = watermarks(broker.bootstrap, topic)
    assert (low, high) == (0, produced)

    # More overwrites after a clean, cleaned in turn.
    writer.send([(key, b"again") for key in keys[::2]])
    expected = writer.expected()
    wait_for(lambda: read_from_start(broker.bootstrap, topic) == expected, "the second clean")
    offsets = [offset for offset, _, _ in expected]
    assert any(b - a > 1 for a, b in itertools.pairwise(offsets))  # gaps
    assert read_with_kafka_python(broker.bootstrap, topic) == expected

    # A record without a key is refused: a clean would drop it.
    refused = Writer(broker.bootstrap, topic)
    refused.producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    refused.send([(None, b"no key")])
    assert [error.code() for error in refused.errors] == [KafkaError.INVALID_RECORD]

    # The same log after a graceful restart and after SIGKILL.
    broker.stop()
    broker.start()
    assert read_from_start(broker.bootstrap, topic) == expected
    assert read_with_kafka_python(broker.bootstrap, topic) == expected
    broker.kill()
    broker.start()
    assert read_from_start(broker.bootstrap, topic) == expected
    # And the producer state survived: the writer goes on with its sequence.
    writer.send([(keys[1], b"after restarts")])
    assert not writer.errors
    expected = writer.expected()
    wait_for(lambda: read_from_start(broker.bootstrap, topic) == expected, "a clean after restart")


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return low, high
