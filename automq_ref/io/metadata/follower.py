"""Following a shared metadata log: a broker's image kept up with what the controller decides.

On a log that several brokers share (etcd), each broker keeps its own image, as KRaft brokers
do: a :class:`~automq_ref.io.metadata.controller.Controller` over the log that decides nothing
unless its node is elected, and a :class:`MetadataFollower` that waits for the log to grow
(``wait_for`` on the next index) and has that controller replay what is new (``catch_up``:
records after what it applied, or the snapshot first when the records it needs were truncated).
Each replayed batch reaches the node's :class:`~automq_ref.io.metadata.view.ImageView` through
the controller's ``subscribe``. A node opened on a log with a snapshot starts from it, not from
index 0 (``Controller.open``).

An unreachable log is retried (with a short pause) for as long as the follower runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from automq_ref.io.metadata.background import stop
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import MetadataLog, MetadataLogClosed, MetadataLogError

log = logging.getLogger(__name__)

RETRY_S: Final = 0.5


class MetadataFollower:
    def __init__(self, replica: Controller, metadata_log: MetadataLog) -> None:
        self.replica = replica
        self._log = metadata_log
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._follow_forever(), name="metadata-follower")

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop(task)

    async def _follow_forever(self) -> None:
        while True:
            try:
                await self._log.wait_for(self.replica.applied_index)
                await self.replica.catch_up()
            except MetadataLogClosed:
                return
            except MetadataLogError as error:
                log.warning("following the metadata log: %s; again in %.1f s", error, RETRY_S)
                await asyncio.sleep(RETRY_S)
            except Exception:
                # A record this node cannot replay: nothing later can be applied either.
                log.exception("replaying the metadata log failed; again in %.1f s", RETRY_S)
                await asyncio.sleep(RETRY_S)
