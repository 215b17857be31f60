"""Producer ids are unique even when InitProducerId requests arrive together (regression: two
concurrent requests that found the id block used up both took the new block's first id)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from automq_ref.config import load_config
from automq_ref.kafka.broker import PRODUCER_ID_BLOCK, Broker


async def test_concurrent_allocations_are_distinct_across_blocks_and_restarts(
    tmp_path: Path,
) -> None:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    broker = await Broker.start(config)
    try:
        first = await asyncio.gather(
            *(broker._allocate_producer_id() for _ in range(PRODUCER_ID_BLOCK + 50))
        )
    finally:
        await broker.shutdown()
    assert len(set(first)) == len(first)
    broker = await Broker.start(config)
    try:
        again = await asyncio.gather(*(broker._allocate_producer_id() for _ in range(10)))
    finally:
        await broker.shutdown()
    assert not set(again) & set(first), "a restarted broker reused producer ids"
