"""A broker whose network bandwidth is all but nothing (``s3.network.baseline.bandwidth=1``: a
byte a refill period, 100 B/s): produce is still answered at once while a catch-up Fetch waits
in the outbound bucket, and a tail Fetch that came later is answered first.

Nothing here measures time: what waits is read from the limiter's queue and counters, and the
test hands out the tokens itself (``refill``); the clock's own byte a period cannot release a
response of kilobytes within any test's patience."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i64

from automq_ref.config import load_config
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines.network_limiter import Priority
from tests.unit.test_broker_node import call
from tests.waiting import PATIENCE_S

TOPIC = TopicName("throttled")
PEER = Peer(1, "127.0.0.1:1")
BATCH = build_record_batch([(None, b"x" * 1000)])
BACKLOG_BATCHES = 3


def config(tmp_path: Path) -> Any:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "s3.network.baseline.bandwidth=1",
        ],
        environment={},
    )


async def produce(node: Node) -> int:
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
                partition_data=(PartitionProduceData(index=i32(0), records=Records(BATCH)),),
            ),
        ),
    )
    partition = produced.responses[0].partition_responses[0]
    assert int(partition.error_code) == 0
    return int(partition.base_offset)


async def fetch(node: Node, offset: int) -> int:
    """The record bytes of partition 0's answer from ``offset``."""
    response: Any = await call(
        node.front_end.admit,
        PEER,
        1,  # Fetch
        12,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=10 * len(BATCH),
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=TOPIC,
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(offset),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(10 * len(BATCH)),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    partition = response.responses[0].partitions[0]
    assert int(partition.error_code) == 0
    return len(partition.records or b"")


async def until(condition: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def test_produce_goes_at_once_while_a_catch_up_fetch_waits_behind_a_tail_one(
    tmp_path: Path,
) -> None:
    first = await start_node(config(tmp_path))
    try:
        created = await call(
            first.front_end.admit,
            PEER,
            19,  # CreateTopics
            5,
            topics=(
                CreatableTopic(
                    name=TOPIC,
                    num_partitions=i32(1),
                    replication_factor=i16(1),
                    assignments=(),
                    configs=(),
                ),
            ),
            timeout=datetime.timedelta(seconds=10),
            validate_only=False,
        )
        assert int(created.topics[0].error_code) == 0
        for _ in range(BACKLOG_BATCHES):
            await produce(first)
    finally:
        await first.shutdown()  # uploads the backlog: the next start reads it from objects
    node = await start_node(config(tmp_path))
    try:
        outbound = node.limiters.outbound
        catch_up = asyncio.create_task(fetch(node, 0))
        await until(lambda: outbound.waited[Priority.CATCH_UP] == 1)
        # The catch-up response waits; a producer does not, nor does its records' upload.
        tail_offset = await produce(node)
        assert not catch_up.done() and outbound.waiting == 1
        tail = asyncio.create_task(fetch(node, tail_offset))
        await until(lambda: outbound.waited[Priority.TAIL] == 1)
        # Tokens for the tail response alone: it is served first, though it came second.
        outbound.refill(len(BATCH))
        assert await asyncio.wait_for(tail, PATIENCE_S) == len(BATCH)
        assert not catch_up.done()
        outbound.refill(10 * BACKLOG_BATCHES * len(BATCH))
        assert await asyncio.wait_for(catch_up, PATIENCE_S) >= BACKLOG_BATCHES * len(BATCH)
        assert (
            outbound.waited[Priority.BYPASS] == 0
            and node.limiters.inbound.waited[Priority.BYPASS] == 0
        )
        assert outbound.granted_bytes[Priority.TAIL] == len(BATCH)
    finally:
        await node.shutdown()
