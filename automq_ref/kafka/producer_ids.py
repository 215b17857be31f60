"""Producer ids for idempotent producers, handed out from blocks reserved in the controller's KV.

``producer-ids/next`` holds the first id no node has reserved; a node that has used up its block
reserves the next ``PRODUCER_ID_BLOCK`` ids by moving that key forward, so a restarted node never
hands out an id it handed out before.
"""

from __future__ import annotations

import asyncio

from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.io.metadata.controller import Controller
from automq_ref.kafka.server import CloseConnection
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import PRODUCER_ID_KEY

PRODUCER_ID_BLOCK = 1000


class ProducerIdAllocator:
    def __init__(self, controller: Controller) -> None:
        self._controller = controller
        self._next = 0
        self._limit = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        # One at a time: two InitProducerId requests that both found the block used up would
        # otherwise both take the new block's first id (the history checker caught two
        # producers sharing an id, the second one's batches answered as duplicates).
        async with self._lock:
            return await self._allocate_locked()

    async def _allocate_locked(self) -> int:
        if self._next >= self._limit:
            current = self._controller.image.kv.get(PRODUCER_ID_KEY)
            start = decode_kv_integer(current, "next producer id") if current is not None else 0
            limit = start + PRODUCER_ID_BLOCK
            response = await self._controller.handle(
                sm.PutKV(PRODUCER_ID_KEY, encode_kv_integer(limit), True)
            )
            if not response.ok:
                raise CloseConnection(f"cannot allocate producer ids: {response.message}")
            self._next, self._limit = start, limit
        producer_id = self._next
        self._next += 1
        return producer_id
