"""Fetch's byte limits in process (KIP-74): whole batches within ``min(partition_max_bytes,
what is left of max_bytes)``, in the request's partition order; only the first partition that
has data gets its first batch past both limits; a response the limits filled is not held for
``min_bytes``."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i32, i64

from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import call, create_topic, node_config
from tests.waiting import PATIENCE_S

TOPIC = TopicName("limits")
PARTITIONS = 3
BATCHES = 3
PEER = Peer(1, "127.0.0.1:1")
BATCH = len(build_record_batch([(None, b"x" * 1000)]))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await start_node(node_config(tmp_path))
    try:
        await create_topic(node.front_end.admit, PEER, TOPIC, PARTITIONS)
        for _ in range(BATCHES):
            await produce(node, TOPIC, [build_record_batch([(None, b"x" * 1000)])] * PARTITIONS)
        yield node
    finally:
        await node.shutdown()


async def produce(node: Node, name: TopicName, batches: Sequence[bytes]) -> list[int]:
    """One Produce (acks=all) of ``batches[i]`` to partition ``i`` of topic ``name``: each
    partition's base offset."""
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
                name=name,
                partition_data=tuple(
                    PartitionProduceData(index=i32(index), records=Records(batch))
                    for index, batch in enumerate(batches)
                ),
            ),
        ),
    )
    for partition in produced.responses[0].partition_responses:
        assert int(partition.error_code) == 0
    return [int(partition.base_offset) for partition in produced.responses[0].partition_responses]


async def fetch_records(
    node: Node,
    name: TopicName,
    max_bytes: int,
    partition_max_bytes: int,
    offsets: Sequence[int],
    min_bytes: int = 1,
    max_wait_ms: int = 0,
) -> list[bytes]:
    """One Fetch (v12) of partition ``i`` of topic ``name`` at ``offsets[i]``: the records each
    partition's answer holds."""
    response: Any = await call(
        node.front_end.admit,
        PEER,
        1,  # Fetch
        12,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=name,
                partitions=tuple(
                    FetchPartition(
                        partition=i32(index),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(offset),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(partition_max_bytes),
                    )
                    for index, offset in enumerate(offsets)
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    records = []
    for partition in response.responses[0].partitions:
        assert int(partition.error_code) == 0
        records.append(bytes(partition.records or b""))
    return records


async def fetch(
    node: Node,
    max_bytes: int,
    partition_max_bytes: int,
    offsets: tuple[int, ...] = (0, 0, 0),
    min_bytes: int = 1,
    max_wait_ms: int = 0,
) -> list[int]:
    """How many batches each partition's answer holds."""
    records = await fetch_records(
        node, TOPIC, max_bytes, partition_max_bytes, offsets, min_bytes, max_wait_ms
    )
    assert all(len(data) % BATCH == 0 for data in records)
    return [len(data) // BATCH for data in records]


async def test_max_bytes_spans_the_partitions(node: Node) -> None:
    big = 100 * BATCH
    assert await fetch(node, big, big) == [3, 3, 3]
    assert await fetch(node, 4 * BATCH, big) == [3, 1, 0]
    # What is left after a partition is less than a batch: later partitions get nothing.
    assert await fetch(node, int(2.5 * BATCH), big) == [2, 0, 0]


async def test_only_the_responses_first_batch_may_pass_the_limits(node: Node) -> None:
    big = 100 * BATCH
    assert await fetch(node, BATCH // 2, big) == [1, 0, 0]
    assert await fetch(node, big, BATCH // 2) == [1, 0, 0]
    assert await fetch(node, BATCH // 2, BATCH // 2) == [1, 0, 0]
    # The first partition with data is the one that may pass them, wherever it stands.
    assert await fetch(node, BATCH // 2, big, offsets=(BATCHES, 0, 0)) == [0, 1, 0]


async def test_partition_max_bytes_limits_each_partition(node: Node) -> None:
    big = 100 * BATCH
    assert await fetch(node, big, int(1.5 * BATCH)) == [1, 1, 1]
    assert await fetch(node, big, 2 * BATCH) == [2, 2, 2]
    assert await fetch(node, 5 * BATCH, 2 * BATCH) == [2, 2, 1]


async def test_a_response_the_limits_filled_is_answered_at_once(node: Node) -> None:
    """A partition left out by the byte limits has data: waiting for ``min_bytes`` could not
    add to the response, so it is answered without the long poll (an hour: a response that
    waited for it would fail the test at its hang guard, however slow the machine)."""
    filled = fetch(node, 2 * BATCH, 100 * BATCH, min_bytes=100 * BATCH, max_wait_ms=3_600_000)
    assert await asyncio.wait_for(filled, PATIENCE_S) == [2, 0, 0]
