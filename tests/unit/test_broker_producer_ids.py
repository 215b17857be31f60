"""Producer ids are unique even when InitProducerId requests arrive together (regression: two
concurrent requests that found the id block used up both took the new block's first id), across
restarts, and across nodes: the controller hands out the blocks (``AllocateProducerIds``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from automq_ref.config import load_config
from automq_ref.io.metadata.client import register_node
from automq_ref.kafka.producer_ids import PRODUCER_ID_BLOCK, ProducerIdAllocator
from automq_ref.node import start_node


async def test_concurrent_allocations_are_distinct_across_blocks_and_restarts(
    tmp_path: Path,
) -> None:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        first = await asyncio.gather(
            *(node.producer_ids.allocate() for _ in range(PRODUCER_ID_BLOCK + 50))
        )
    finally:
        await node.shutdown()
    assert len(set(first)) == len(first)
    node = await start_node(config)
    try:
        again = await asyncio.gather(*(node.producer_ids.allocate() for _ in range(10)))
    finally:
        await node.shutdown()
    assert not set(again) & set(first), "a restarted node reused producer ids"


async def test_two_nodes_never_share_a_producer_id(tmp_path: Path) -> None:
    """A second node (its allocator on the same controller) takes blocks of its own, even when
    both run out of their blocks at the same time."""
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        other_node = config.node_id + 1
        registration = await register_node(node.client, other_node, 1)
        other = ProducerIdAllocator(node.client, other_node, registration.node_epoch)
        count = 2 * PRODUCER_ID_BLOCK + 10
        both = await asyncio.gather(
            *(
                allocator.allocate()
                for _ in range(count)
                for allocator in (node.producer_ids, other)
            )
        )
    finally:
        await node.shutdown()
    assert len(set(both)) == len(both) == 2 * count
