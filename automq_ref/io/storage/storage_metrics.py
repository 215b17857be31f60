"""The storage's series of the metrics endpoint (:mod:`automq_ref.io.metrics`): what the node's
:class:`~automq_ref.io.storage.s3stream.S3Storage` counts, read when Prometheus scrapes, and
its upload stages told to the metrics as they end (:func:`measure_storage`).

- ``kafka_stream_block_cache_reads_total{status}``: blocks the read path from objects read
  through its block cache, found there or on their way (``hit``) or fetched for the read
  (``miss``); readahead's own GETs are neither. With cold reads in a process of their own,
  as of the child's last report;
- ``kafka_stream_block_cache_size``: the bytes the block cache holds;
- ``kafka_stream_log_cache_reads_total{status}``: reads of the storage answered from the
  LogCache (``hit``) and those that went to objects (``miss``), per turn of a read (one that
  crosses from objects into the cache counts one of each);
- ``kafka_stream_compaction_objects_total{operation}``: what object compaction
  (:mod:`automq_ref.io.storage.compaction`) did to objects: ``replaced`` (sources merged or split
  into new objects), ``written`` (the objects it wrote), ``cleaned`` (objects dropped with no
  successor: their data deleted or trimmed);
- ``kafka_stream_compaction_write_size_total``: the bytes of the objects compaction wrote.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from automq_ref.io.metrics import BrokerMetrics
from automq_ref.io.storage.compaction import CompactionTotals
from automq_ref.io.storage.s3stream import S3Storage


def measure_storage(
    metrics: BrokerMetrics, storage: S3Storage, compaction: CompactionTotals | None = None
) -> None:
    """Count ``storage``'s upload stages into ``metrics`` from now on (start-up recovery's
    uploads are before) and read its caches' counts, and ``compaction``'s totals, at each
    scrape."""
    storage.counts.stage_listener = metrics.upload_stage
    metrics.register(StorageState(storage, compaction or CompactionTotals()))


class StorageState(Collector):
    """The series above, of one storage and its compaction."""

    def __init__(self, storage: S3Storage, compaction: CompactionTotals) -> None:
        self._storage = storage
        self._compaction = compaction

    def collect(self) -> Iterator[Metric]:
        storage = self._storage
        stats = storage.block_cache_stats(take_peak=False)  # the peak is the storage log's
        counts = storage.counts
        for name, what, hits, misses in (
            (
                "kafka_stream_block_cache_reads",
                "Blocks read through the block cache: found (hit) or fetched (miss).",
                stats.hits,
                stats.misses,
            ),
            (
                "kafka_stream_log_cache_reads",
                "Reads answered from the LogCache (hit) or from objects (miss).",
                counts.log_cache_hits,
                counts.log_cache_misses,
            ),
        ):
            family = CounterMetricFamily(name, what, labels=["status"])
            family.add_metric(["hit"], hits)
            family.add_metric(["miss"], misses)
            yield family
        yield GaugeMetricFamily(
            "kafka_stream_block_cache_size",
            "Bytes the block cache holds.",
            value=stats.resident_bytes,
        )
        compaction = self._compaction
        objects = CounterMetricFamily(
            "kafka_stream_compaction_objects",
            "Objects compaction replaced, wrote, or cleaned away without a successor.",
            labels=["operation"],
        )
        for operation, count in (
            ("replaced", compaction.replaced),
            ("written", compaction.written),
            ("cleaned", compaction.cleaned),
        ):
            objects.add_metric([operation], count)
        yield objects
        yield CounterMetricFamily(
            "kafka_stream_compaction_write_size",
            "Bytes of the objects compaction wrote.",
            value=compaction.written_bytes,
        )
