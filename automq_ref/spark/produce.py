"""``automq-ref produce``: write self-describing records and a manifest of what was acknowledged.

Records are spread round robin: record ``i`` goes to partition ``i % P`` with sequence ``i // P``,
so every partition holds sequences 0, 1, 2, ... in the order they were handed to the producer.
The producer is idempotent (``enable.idempotence``: acks=all, at most 5 requests in flight,
retries without duplicates or reordering) and tuned for throughput (1 MB batches, a few ms of
linger, a deep local queue). One delivery callback, set in the configuration, feeds every report
into a :class:`~automq_ref.spark.manifest.PartitionTally`; a failed report is counted and left out,
so the manifest describes exactly the acknowledged records. Nothing is kept per record, so ten
million records cost the same memory as ten. A :class:`ProduceTally` counts what was handed over,
acknowledged and failed as it happens; the command shows it as a progress line on stderr
(:mod:`automq_ref.progress`: a bar on a terminal, a line every few seconds otherwise).
"""

from __future__ import annotations

import logging
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.progress import Progress, Status
from automq_ref.spark.manifest import Manifest, PartitionTally, ValueScheme

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
FLUSH_TIMEOUT_S = 600.0
METADATA_TIMEOUT_S = 30.0
# librdkafka's own log lines (a refused connection is one per retry) go here, not to stderr
# directly, so the command can keep them out of its one-line failure.
CLIENT_LOG = logging.getLogger("automq_ref.librdkafka")


@dataclass(frozen=True)
class ProduceSettings:
    bootstrap: str
    topic: str
    partitions: int
    records: int
    codec: str = "none"
    value_bytes: int = 100
    producer: str = field(default_factory=lambda: secrets.token_hex(4))
    linger_ms: float = 5.0
    batch_bytes: int = 1_000_000


@dataclass(frozen=True)
class ProduceResult:
    manifest: Manifest
    seconds: float
    failed: int
    first_error: str | None

    @property
    def records_per_second(self) -> float:
        return self.manifest.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        records = self.manifest.records
        megabytes = records * self.manifest.scheme.value_bytes / 1e6
        line = (
            f"produced {records} records ({megabytes:.1f} MB of values) to "
            f"{self.manifest.topic} in {self.seconds:.2f} s: {self.records_per_second:,.0f} "
            f"records/s, {megabytes / self.seconds if self.seconds else 0:.1f} MB/s"
        )
        if self.failed:
            line += f"; {self.failed} not acknowledged (first error: {self.first_error})"
        return line


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> int:
    """Create ``topic`` with ``partitions`` partitions unless it exists; return its partition
    count once every partition is in the metadata."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": CLIENT_LOG}
    admin = AdminClient(config)
    existing = admin.list_topics(timeout=METADATA_TIMEOUT_S).topics
    if topic not in existing:
        future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
        try:
            future.result(timeout=METADATA_TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        if (
            metadata is not None
            and metadata.error is None
            and metadata.partitions
            and all(p.leader >= 0 for p in metadata.partitions.values())
        ):
            return len(metadata.partitions)
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} has no leader for every partition")


@dataclass
class ProduceTally:
    """How far a run is, for the progress line. The producing thread alone writes it (the
    delivery callback runs inside its ``poll`` and ``flush``); the progress thread only reads."""

    records: int
    stage: str = "creating the topic"
    handed: int = 0  # records handed to the producer
    acknowledged: int = 0
    failed: int = 0
    producing_since: float | None = None  # time.monotonic() when the first record was handed

    def status(self, _elapsed_s: float) -> Status:
        detail = f"{self.acknowledged:,}/{self.records:,} acknowledged, {self.handed:,} queued"
        if self.producing_since is not None:
            seconds = time.monotonic() - self.producing_since
            if seconds > 0:
                detail += f", {self.acknowledged / seconds:,.0f} records/s"
        if self.failed:
            detail += f", {self.failed:,} not acknowledged"
        done = (self.acknowledged + self.failed) / self.records if self.records else 1.0
        return Status(self.stage, detail, done)


class _Deliveries:
    """The one delivery callback: tallies acknowledged records per partition."""

    def __init__(
        self, scheme: ValueScheme, tallies: list[PartitionTally], progress: ProduceTally
    ) -> None:
        self.tallies = tallies
        self.progress = progress
        self.sequence_slice = scheme.sequence_slice
        self.failed = 0
        self.first_error: str | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed += 1
            self.progress.failed += 1
            self.first_error = self.first_error or str(error)
            return
        self.progress.acknowledged += 1
        value = message.value()
        partition = message.partition()
        offset = message.offset()
        assert value is not None and partition is not None and offset is not None
        self.tallies[partition].add(int(value[self.sequence_slice]), offset, value)


def produce(settings: ProduceSettings, progress: ProduceTally | None = None) -> ProduceResult:
    """Produce ``settings.records`` records; the manifest of the acknowledged ones. ``progress``
    is kept current as the run goes."""
    if settings.codec not in CODECS:
        raise ValueError(f"codec {settings.codec!r}: choose from {', '.join(CODECS)}")
    progress = progress if progress is not None else ProduceTally(settings.records)
    partitions = ensure_topic(settings.bootstrap, settings.topic, settings.partitions)
    scheme = ValueScheme(producer=settings.producer, value_bytes=settings.value_bytes)
    tallies = [PartitionTally(index) for index in range(partitions)]
    deliveries = _Deliveries(scheme, tallies, progress)
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": settings.codec,
            "linger.ms": settings.linger_ms,
            "batch.size": settings.batch_bytes,
            "batch.num.messages": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "on_delivery": deliveries,
            "logger": CLIENT_LOG,
        }
    )
    value = scheme.value
    topic = settings.topic
    started = time.perf_counter()
    progress.stage, progress.producing_since = "producing", time.monotonic()
    for index in range(settings.records):
        partition = index % partitions
        payload = value(partition, index // partitions)
        while True:
            try:
                producer.produce(topic, payload, partition=partition)
                break
            except BufferError:
                producer.poll(0.01)
        if index % 1_000 == 999:
            progress.handed = index + 1
            if index % 10_000 == 9_999:
                producer.poll(0)
    progress.handed = settings.records
    progress.stage = "waiting for the acknowledgements"
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if remaining:
        raise RuntimeError(f"{remaining} records still undelivered after {FLUSH_TIMEOUT_S} s")
    for tally in tallies:
        tally.sent = settings.records // partitions + (
            tally.partition < settings.records % partitions
        )
    manifest = Manifest(
        topic=settings.topic,
        codec=settings.codec,
        scheme=scheme,
        partitions=[tally.manifest() for tally in tallies],
        produce_seconds=seconds,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    progress.stage = "done"
    return ProduceResult(manifest, seconds, deliveries.failed, deliveries.first_error)


def main(settings: ProduceSettings, manifest_path: Path) -> int:
    """The command: produce, write the manifest, print the rate. Exit 1 if any record failed,
    2 if the broker stopped answering before the records were handed over."""
    tally = ProduceTally(settings.records)
    try:
        with Progress("automq-ref produce", tally.status):
            result = produce(settings, tally)
    except (KafkaException, RuntimeError) as error:
        print(
            f"automq-ref produce: the broker at {settings.bootstrap} did not answer: {error}; "
            "check that it is running and reachable",
            file=sys.stderr,
        )
        return 2
    result.manifest.write(manifest_path)
    print(result.summary(), flush=True)
    print(f"manifest: {manifest_path}", flush=True)
    return 1 if result.failed else 0
