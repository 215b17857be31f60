"""A broker whose network bandwidth is all but nothing (``s3.network.baseline.bandwidth=1``: a
byte a refill period, 100 B/s): produce is still answered at once while a catch-up Fetch waits
in the outbound bucket, and a tail Fetch that came later is answered first.

Nothing here measures time: what waits is read from the limiter's queue and counters, and the
test hands out the tokens itself (``refill``); the clock's own byte a period cannot release a
response of kilobytes within any test's patience."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kio.schema.types import TopicName

from automq_ref.config import BrokerConfig
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.network_limiter import NetworkBandwidthLimiter
from automq_ref.node import Node, start_node
from automq_ref.state_machines.network_limiter import Priority
from tests.unit.test_broker_fetch import BATCH, PEER, fetch_records, produce
from tests.unit.test_broker_node import create_topic, node_config
from tests.waiting import PATIENCE_S

TOPIC = TopicName("throttled")
BACKLOG_BATCHES = 3


def config(tmp_path: Path) -> BrokerConfig:
    return node_config(tmp_path).model_copy(update={"s3_network_baseline_bandwidth": 1})


async def fetch(node: Node, offset: int) -> int:
    """The record bytes of partition 0's answer from ``offset``."""
    big = 10 * BATCH
    (records,) = await fetch_records(node, TOPIC, big, big, offsets=(offset,))
    return len(records)


async def produce_one(node: Node) -> int:
    """One batch of the size of the fetch tests' to partition 0: its offset."""
    (offset,) = await produce(node, TOPIC, [build_record_batch([(None, b"x" * 1000)])])
    return offset


async def feed(limiter: NetworkBandwidthLimiter) -> None:
    """Refill ``limiter`` at every turn of the loop, until cancelled."""
    while True:
        limiter.refill(1)
        await asyncio.sleep(0)


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
        await create_topic(first.front_end.admit, PEER, TOPIC, 1)
        for _ in range(BACKLOG_BATCHES):
            await produce_one(first)
    finally:
        await first.shutdown()  # uploads the backlog: the next start reads it from objects
    node = await start_node(config(tmp_path))
    try:
        outbound = node.limiters.outbound
        catch_up = asyncio.create_task(fetch(node, 0))
        await until(lambda: outbound.waited[Priority.CATCH_UP] == 1)
        # The catch-up response waits; a producer does not, nor does its records' upload.
        tail_offset = await produce_one(node)
        assert not catch_up.done() and outbound.waiting == 1
        tail = asyncio.create_task(fetch(node, tail_offset))
        await until(lambda: outbound.waited[Priority.TAIL] == 1)
        # Tokens for the tail response alone: it is served first, though it came second.
        outbound.refill(BATCH)
        assert await asyncio.wait_for(tail, PATIENCE_S) == BATCH
        assert not catch_up.done()
        # The bucket holds a few bytes at most (the clock's give 100 B/s): the catch-up is fed
        # them as it takes them.
        feeding = asyncio.create_task(feed(outbound))
        try:
            assert await asyncio.wait_for(catch_up, PATIENCE_S) >= BACKLOG_BATCHES * BATCH
        finally:
            feeding.cancel()
        assert (
            outbound.waited[Priority.BYPASS] == 0
            and node.limiters.inbound.waited[Priority.BYPASS] == 0
        )
        assert outbound.granted_bytes[Priority.TAIL] == BATCH
    finally:
        await node.shutdown()
