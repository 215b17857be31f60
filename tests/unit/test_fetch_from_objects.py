"""A consumer catching up through Fetch on many partitions whose data is in objects: the store is
asked for the bytes delivered, not more (issue 19's target: bytes fetched <= 1.2x delivered).

Fetch gives each partition what is left of ``max_bytes`` (KIP-74), so past the partitions that
fill a response the others get less than a batch: a read of theirs must not GET a block for a
batch it then leaves out (:func:`automq_ref.kafka.log_state.read_budget`)."""

from __future__ import annotations

import os
from pathlib import Path

from kio.schema.types import TopicName

from automq_ref.config import BrokerConfig
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.log_state import BatchEntry, read_budget
from automq_ref.node import start_node
from tests.unit.test_broker_fetch import PEER, fetch_records, produce
from tests.unit.test_broker_node import create_topic, node_config

TOPIC = TopicName("backlog")
PARTITIONS = 40
BATCHES = 6
RECORD_BYTES = 8000
BATCH_BYTES = len(build_record_batch([(None, b"x" * RECORD_BYTES)]))
BACKLOG_BYTES = PARTITIONS * BATCHES * BATCH_BYTES
# A librdkafka consumer's defaults, scaled to the backlog: a response holds about five
# partitions' data, a partition's limit is larger than all it has.
MAX_BYTES = 5 * BATCHES * BATCH_BYTES + BATCH_BYTES // 3
PARTITION_MAX_BYTES = 1 << 20


def entries(*sizes: int) -> list[BatchEntry]:
    """Batches of two offsets each, of ``sizes`` bytes."""
    return [BatchEntry(2 * n, 2 * n + 2, 0, size) for n, size in enumerate(sizes)]


def test_the_budget_asked_of_storage_is_the_batches_that_fit() -> None:
    index = entries(100, 200, 300, 400)
    assert read_budget(index, 0, 1000, min_one=False) == 1000
    assert read_budget(index, 0, 999, min_one=False) == 600
    assert read_budget(index, 0, 599, min_one=False) == 300
    # From inside a batch: that whole batch is read.
    assert read_budget(index, 3, 500, min_one=False) == 500
    # None fits: nothing to ask, unless the first may pass the limit.
    assert read_budget(index, 4, 299, min_one=False) == 0
    assert read_budget(index, 4, 299, min_one=True) == 300
    assert read_budget(index, 4, 0, min_one=True) == 300
    # Where the index stops short (the batches past it unknown), the limit as it is.
    assert read_budget(index, 4, 10_000, min_one=False) == 10_000
    assert read_budget([], 0, 500, min_one=True) == 500


def config(tmp_path: Path) -> BrokerConfig:
    # The block cache 16x smaller than the backlog, as in the catch-up benchmark.
    return node_config(tmp_path).model_copy(update={"s3_block_cache_size": BACKLOG_BYTES // 16})


async def test_a_catch_up_through_fetch_gets_from_the_store_what_it_delivers(
    tmp_path: Path,
) -> None:
    node = await start_node(config(tmp_path))
    try:
        await create_topic(node.front_end.admit, PEER, TOPIC, PARTITIONS)
        for _ in range(BATCHES):
            records = [os.urandom(RECORD_BYTES) for _ in range(PARTITIONS)]
            await produce(node, TOPIC, [build_record_batch([(None, r)]) for r in records])
    finally:
        await node.shutdown()  # uploads everything: the catch-up reads objects only
    node = await start_node(config(tmp_path))
    try:
        reads = node.storage.reads
        gets_before, bytes_before = reads.gets, reads.get_bytes
        readers_before = node.storage.block_cache_stats().readers
        offsets = [0] * PARTITIONS
        delivered = fetches = 0
        while min(offsets) < BATCHES:
            records = await fetch_records(node, TOPIC, MAX_BYTES, PARTITION_MAX_BYTES, offsets)
            sizes = [len(data) for data in records]
            assert all(size % BATCH_BYTES == 0 for size in sizes)
            assert sum(sizes) > 0
            fetches += 1
            for index, size in enumerate(sizes):
                offsets[index] += size // BATCH_BYTES
            delivered += sum(sizes)
        assert delivered == BACKLOG_BYTES
        assert fetches > 5  # the response's limit cut partitions many times
        # Counted by the store: every data block once, and the objects' indexes.
        assert reads.get_bytes - bytes_before <= 1.2 * delivered
        assert reads.gets > gets_before
        # One reader per partition's data stream, reused from one Fetch to the next.
        assert node.storage.block_cache_stats().readers == readers_before + PARTITIONS
    finally:
        await node.shutdown()


async def test_a_read_the_log_cache_holds_is_answered_at_once_and_the_same(
    tmp_path: Path,
) -> None:
    """``Partition.read_now`` (a Fetch's reads the LogCache holds whole, answered without a
    task) answers what ``read`` does, and nothing (None) where the data is in objects."""
    node = await start_node(config(tmp_path))
    try:
        await create_topic(node.front_end.admit, PEER, TOPIC, 2)
        for _ in range(BATCHES):
            records = [os.urandom(RECORD_BYTES) for _ in range(2)]
            await produce(node, TOPIC, [build_record_batch([(None, r)]) for r in records])
        partition = node.topics.partitions[(TOPIC, 0)]
        limits = [0, 1, BATCH_BYTES - 1, BATCH_BYTES, 2 * BATCH_BYTES + 7, 1 << 20]
        for offset in range(BATCHES + 1):
            for limit in limits:
                for min_one in (False, True):
                    now = partition.read_now(offset, limit, min_one)
                    assert now is not None
                    later = await partition.read(offset, limit, min_one)
                    assert [bytes(chunk) for chunk in now] == [bytes(chunk) for chunk in later]
                    assert bool(now) == (offset < BATCHES and (limit >= BATCH_BYTES or min_one))
    finally:
        await node.shutdown()  # uploads everything
    node = await start_node(config(tmp_path))
    try:
        partition = node.topics.partitions[(TOPIC, 0)]
        assert partition.read_now(0, 1 << 20) is None
        assert partition.read_now(BATCHES, 1 << 20) == []  # at the high watermark
        assert len(await partition.read(0, 1 << 20)) == BATCHES
    finally:
        await node.shutdown()
