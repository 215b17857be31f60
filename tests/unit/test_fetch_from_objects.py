"""A consumer catching up through Fetch on many partitions whose data is in objects: the store is
asked for the bytes delivered, not more (issue 19's target: bytes fetched <= 1.2x delivered).

Fetch gives each partition what is left of ``max_bytes`` (KIP-74), so past the partitions that
fill a response the others get less than a batch: a read of theirs must not GET a block for a
batch it then leaves out (:func:`automq_ref.kafka.log_state.read_budget`)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i64

from automq_ref.config import load_config
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.log_state import BatchEntry, read_budget
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import call

TOPIC = TopicName("backlog")
PARTITIONS = 40
BATCHES = 6
RECORD_BYTES = 8000
PEER = Peer(1, "127.0.0.1:1")
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


def config(tmp_path: Path) -> Any:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            # 16x smaller than the backlog, as in the catch-up benchmark.
            f"s3.block.cache.size={BACKLOG_BYTES // 16}",
        ],
        environment={},
    )


async def fill(node: Node) -> None:
    created = await call(
        node.front_end.admit,
        PEER,
        19,  # CreateTopics
        5,
        topics=(
            CreatableTopic(
                name=TOPIC,
                num_partitions=i32(PARTITIONS),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    assert int(created.topics[0].error_code) == 0
    for _ in range(BATCHES):
        produced = await call(
            node.front_end.admit,
            PEER,
            0,  # Produce
            9,
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                TopicProduceData(
                    name=TOPIC,
                    partition_data=tuple(
                        PartitionProduceData(
                            index=i32(index),
                            records=Records(build_record_batch([(None, os.urandom(RECORD_BYTES))])),
                        )
                        for index in range(PARTITIONS)
                    ),
                ),
            ),
        )
        for partition in produced.responses[0].partition_responses:
            assert int(partition.error_code) == 0


async def fetch(node: Node, offsets: list[int]) -> list[int]:
    """One Fetch of every partition at its offset; the bytes each partition's answer holds."""
    response: Any = await call(
        node.front_end.admit,
        PEER,
        1,  # Fetch
        12,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        max_bytes=MAX_BYTES,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=TOPIC,
                partitions=tuple(
                    FetchPartition(
                        partition=i32(index),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(offset),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(PARTITION_MAX_BYTES),
                    )
                    for index, offset in enumerate(offsets)
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    sizes = []
    for partition in response.responses[0].partitions:
        assert int(partition.error_code) == 0
        size = len(partition.records or b"")
        assert size % BATCH_BYTES == 0
        sizes.append(size)
    return sizes


async def test_a_catch_up_through_fetch_gets_from_the_store_what_it_delivers(
    tmp_path: Path,
) -> None:
    node = await start_node(config(tmp_path))
    try:
        await fill(node)
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
            sizes = await fetch(node, offsets)
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
