"""Producer ids for idempotent producers, handed out from blocks the controller reserves.

The controller keeps the first id no node has reserved (KV ``producer-ids/next``); a node that
has used up its block asks for the next ``PRODUCER_ID_BLOCK`` ids (``AllocateProducerIds``), and
the controller reads and advances that counter in one decision. So no two nodes, and no
restarted node, ever hand out the same id.
"""

from __future__ import annotations

import asyncio

from automq_ref.io.metadata.client import ControllerClient
from automq_ref.kafka.server import CloseConnection
from automq_ref.state_machines import stream_metadata as sm

PRODUCER_ID_BLOCK = 1000


class ProducerIdAllocator:
    def __init__(self, client: ControllerClient, node_id: int, node_epoch: int) -> None:
        self._client = client
        self._node_id = node_id
        self._node_epoch = node_epoch
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
            response = await self._client.submit(
                sm.AllocateProducerIds(self._node_id, self._node_epoch, PRODUCER_ID_BLOCK)
            )
            if not response.ok or response.first_producer_id is None:
                raise CloseConnection(
                    f"cannot allocate producer ids: {response.error.value}: {response.message}"
                )
            self._next = response.first_producer_id
            self._limit = self._next + PRODUCER_ID_BLOCK
        producer_id = self._next
        self._next += 1
        return producer_id
