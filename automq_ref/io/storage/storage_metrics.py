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
  crosses from objects into the cache counts one of each).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from automq_ref.io.metrics import BrokerMetrics
from automq_ref.io.storage.s3stream import S3Storage


def measure_storage(metrics: BrokerMetrics, storage: S3Storage) -> None:
    """Count ``storage``'s upload stages into ``metrics`` from now on (start-up recovery's
    uploads are before) and read its caches' counts at each scrape."""
    storage.counts.stage_listener = metrics.upload_stage
    metrics.register(StorageState(storage))


class StorageState(Collector):
    """The series above, of one storage."""

    def __init__(self, storage: S3Storage) -> None:
        self._storage = storage

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
