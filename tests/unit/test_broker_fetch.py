"""Fetch's byte limits in process (KIP-74): whole batches within ``min(partition_max_bytes,
what is left of max_bytes)``, in the request's partition order; only the first partition that
has data gets its first batch past both limits; a response the limits filled is not held for
``min_bytes``."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i64

from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import call, node_config
from tests.waiting import PATIENCE_S

TOPIC = TopicName("limits")
PARTITIONS = 3
BATCHES = 3
PEER = Peer(1, "127.0.0.1:1")
BATCH = len(build_record_batch([(None, b"x" * 1000)]))


async def create_topic(node: Node, name: TopicName, partitions: int) -> None:
    created = await call(
        node.front_end.admit,
        PEER,
        19,  # CreateTopics
        5,
        topics=(
            CreatableTopic(
                name=name,
                num_partitions=i32(partitions),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    assert int(created.topics[0].error_code) == 0


async def produce(node: Node, name: TopicName, partitions: int) -> list[int]:
    """One batch of a 1,000-byte record to each partition; the offsets they were given."""
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
                    PartitionProduceData(
                        index=i32(index),
                        records=Records(build_record_batch([(None, b"x" * 1000)])),
                    )
                    for index in range(partitions)
                ),
            ),
        ),
    )
    responses = produced.responses[0].partition_responses
    assert all(int(partition.error_code) == 0 for partition in responses)
    return [int(partition.base_offset) for partition in responses]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await start_node(node_config(tmp_path))
    try:
        await create_topic(node, TOPIC, PARTITIONS)
        for _ in range(BATCHES):
            await produce(node, TOPIC, PARTITIONS)
        yield node
    finally:
        await node.shutdown()


async def fetch_sizes(
    node: Node,
    max_bytes: int,
    partition_max_bytes: int,
    offsets: tuple[int, ...] = (0, 0, 0),
    min_bytes: int = 1,
    max_wait_ms: int = 0,
    topic: TopicName = TOPIC,
) -> list[int]:
    """The record bytes of each partition's answer."""
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
                topic=topic,
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
    sizes = []
    for partition in response.responses[0].partitions:
        assert int(partition.error_code) == 0
        sizes.append(len(partition.records or b""))
    return sizes


async def fetch(
    node: Node,
    max_bytes: int,
    partition_max_bytes: int,
    offsets: tuple[int, ...] = (0, 0, 0),
    min_bytes: int = 1,
    max_wait_ms: int = 0,
) -> list[int]:
    """How many batches each partition's answer holds."""
    sizes = await fetch_sizes(node, max_bytes, partition_max_bytes, offsets, min_bytes, max_wait_ms)
    assert all(size % BATCH == 0 for size in sizes)
    return [size // BATCH for size in sizes]


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
