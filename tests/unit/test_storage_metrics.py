"""The storage's series (automq_ref/io/storage/storage_metrics.py): a stream written through
S3Storage with its metrics measured, uploaded, then read back; the upload stages, the LogCache's
and the block cache's hits and misses move as the reads go where they go; a compaction of stream
set objects moves the compaction series."""

from __future__ import annotations

import random
from pathlib import Path

from automq_ref.io.metrics import BrokerMetrics
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.storage_metrics import measure_storage
from automq_ref.state_machines import log_cache as lc
from tests.storage_fixtures import start_storage
from tests.unit.test_metrics import scrape_text
from tests.unit.test_object_compaction import open_harness, produce_round
from tests.unit.test_s3stream import PARAMS, WalMedium, payload

# Enough records that the oldest leave the LogCache (PARAMS' capacity) once uploaded.
RECORDS = 400


def sample(metrics: BrokerMetrics, name: str, **labels: str) -> float:
    return scrape_text(metrics.exposition().decode()).get((name, tuple(sorted(labels.items()))), 0)


async def test_uploads_and_cache_reads_are_counted(tmp_path: Path) -> None:
    medium = WalMedium("block", tmp_path)
    running = await start_storage(
        tmp_path,
        await medium.open(1),
        LocalDirectoryObjectStore(tmp_path / "objects", fsync=False),
        params=PARAMS,
    )
    storage = running.storage
    metrics = BrokerMetrics()
    measure_storage(metrics, storage)
    try:
        stream_id = await storage.create_stream()
        await storage.open_stream(stream_id, 0)
        for offset in range(RECORDS):
            await storage.append(stream_id, 0, payload(stream_id, offset), 1)
        # Read from the LogCache before anything is uploaded: hits only.
        assert await storage.read(stream_id, RECORDS - 1, RECORDS, 1 << 20)
        log_cache = "kafka_stream_log_cache_reads_total"
        assert sample(metrics, log_cache, status="hit") >= 1
        assert sample(metrics, log_cache, status="miss") == 0

        await storage.force_upload(lc.ALL_STREAMS)
        stages = "kafka_stream_upload_stage_latency_count"
        blocks = sample(metrics, stages, stage="commit")
        assert blocks >= 1
        assert sample(metrics, stages, stage="prepare") == blocks
        assert sample(metrics, stages, stage="put") == blocks
        objects = sample(metrics, "kafka_stream_upload_object_count_total")
        assert objects >= blocks
        uploaded = sample(metrics, "kafka_stream_upload_object_size_total")
        assert uploaded >= sum(len(payload(stream_id, o)) for o in range(RECORDS)) * 0.5

        # The first records left the LogCache: read from objects, through the block cache.
        blocks_read = "kafka_stream_block_cache_reads_total"
        assert await storage.read(stream_id, 0, 1, 1 << 20)
        assert sample(metrics, log_cache, status="miss") == 1
        misses = sample(metrics, blocks_read, status="miss")
        assert misses >= 1
        hits = sample(metrics, blocks_read, status="hit")
        assert await storage.read(stream_id, 1, 2, 1 << 20)  # the same block, kept
        assert sample(metrics, blocks_read, status="hit") > hits
        assert sample(metrics, "kafka_stream_block_cache_size") > 0
    finally:
        await running.stop()
        await medium.close()


async def test_compaction_is_counted(tmp_path: Path) -> None:
    h, rng = await open_harness(tmp_path), random.Random(5)
    metrics = BrokerMetrics()
    measure_storage(metrics, h.running.storage, h.compactor.totals)
    try:
        for _ in range(3):
            await h.add_stream()
        for _ in range(6):
            await produce_round(h, rng)
        objects = "kafka_stream_compaction_objects_total"
        assert sample(metrics, objects, operation="replaced") == 0
        sets_before = h.set_objects()
        await h.compactor.compact_stream_set_objects()
        assert sample(metrics, objects, operation="replaced") == sets_before > 1
        assert sample(metrics, objects, operation="written") >= 1
        assert sample(metrics, "kafka_stream_compaction_write_size_total") > 0
    finally:
        await h.running.stop(close_store=True)
