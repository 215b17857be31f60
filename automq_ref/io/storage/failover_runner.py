"""Crash failover, the target's side: take a failed node's WAL over, upload what it holds as
that node, close its streams.

Every broker runs a :class:`FailoverRunner` that follows its image: a failover context (the
KV entry the active controller writes, :mod:`automq_ref.io.metadata.failover_contexts`) naming
this broker as the target starts a task for it, which runs :func:`take_over_failed_node` until
it succeeds, retrying with a growing pause (1 s doubling up to 60 s, as AutoMQ does), and gives
up when the context is gone or the failed node restarted (its node epoch moved on: it recovers
its WAL itself; the Failover machine's ``AbortFailover``).

:func:`take_over_failed_node` is the Failover machine's three target steps:

1. ``FenceWal``: the WAL is opened in failover mode (``ObjectWal.take_over``): its reservation is
   overwritten with (failed node, its node epoch, failover), so the old writer, if it still runs
   (a zombie), fails its next reservation check and acknowledges nothing more; the WAL is read
   only after that, so every record the old writer acknowledged is listed.
2. ``RecoverFailedWal``: ``FenceNode`` (AutoMQ's getOpeningStreams in failover mode) marks the
   node taken over, so its own later requests get ``NODE_FENCED``, and answers the streams still
   OPENED on it with their committed ends; then the same recovery a node runs at its own start
   (``S3Storage.start``) replays the WAL's records past those ends, uploads them, commits them
   *as the failed node* in failover mode, and resets the WAL.
3. ``CloseFailedStreams``: that recovery closes the node's streams, which lets the partitions'
   new brokers open them.

Acting as the failed node: the storage's requests go through :class:`ActingClient`, which marks
its commits ``failover_mode`` and asks for object ids as this broker (a node in failover mode
may not prepare objects itself; object ids belong to nobody).

Nothing is uploaded twice: a record is replayed only past its stream's committed end, so a
retried takeover after a partial one, or the failed node's own recovery after a restart (which
overwrites the reservation with its newer epoch and so fences this runner), skips what was
committed; a commit of this runner that arrives after the node registered again is refused
(``NODE_EPOCH_EXPIRED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from automq_ref.io.clock import Clock
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient, Registration
from automq_ref.io.metadata.failover_contexts import StoredContext, stored_contexts
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.object_store import ObjectStore
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.failover.controller import abort_failover

log = logging.getLogger(__name__)

RETRY_BASE_S = 1.0
RETRY_MAX_S = 60.0

# (WAL setting of the context, failed node id, its node epoch) -> its WAL, taken over.
WalTakeover = Callable[[str, int, int], Awaitable[WriteAheadLog]]


class FailoverAborted(Exception):
    """The failed node restarted meanwhile (its node epoch moved on): nothing to take over."""


class ActingClient:
    """This broker's controller client, acting for a failed node: commits in failover mode,
    object ids prepared as this broker (``node_id``, ``node_epoch``)."""

    def __init__(self, client: ControllerClient, node_id: int, node_epoch: int) -> None:
        self._client = client
        self._node_id = node_id
        self._node_epoch = node_epoch

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        if isinstance(event, sm.PrepareObject):
            event = replace(event, node_id=self._node_id, node_epoch=self._node_epoch)
        elif isinstance(event, sm.CommitStreamSetObject):
            event = replace(event, failover_mode=True)
        return await self._client.submit(event)


@dataclass(frozen=True, slots=True)
class FailoverResult:
    streams: int  # streams closed
    records: int  # WAL records uploaded
    bytes: int


async def take_over_failed_node(
    context: StoredContext,
    *,
    take_over_wal: WalTakeover,
    store: ObjectStore,
    client: ControllerClient,
    view: MetadataView,
    node_id: int,
    node_epoch: int,
    namespace: str,
    params: lc.LogCacheParams,
    clock: Clock,
) -> FailoverResult:
    """The target's steps 1-3 (module docstring), once; raises on any failure, and
    :class:`FailoverAborted` when the failed node runs a newer epoch."""
    failed, epoch = context.failed_node_id, context.node_epoch
    wal = await take_over_wal(context.wal_config, failed, epoch)
    try:
        fenced = await client.submit(sm.FenceNode(failed, epoch))
        if fenced.error is sm.StreamErrorCode.NODE_EPOCH_EXPIRED:
            raise FailoverAborted(fenced.message)
        if not fenced.ok:
            raise RuntimeError(f"FenceNode({failed}, {epoch}): {fenced.error.value}")
        storage = await S3Storage.start(
            wal=wal,
            store=store,
            client=ActingClient(client, node_id, node_epoch),
            view=view,
            registration=Registration(failed, epoch, fenced.opening_streams),
            namespace=namespace,
            params=params,
            clock=clock,
            runs_lifecycle=lambda: False,
        )
    except BaseException:
        await wal.close()
        raise
    recovered = storage.recovered
    await storage.shutdown()  # nothing left to upload: closes the WAL
    return FailoverResult(len(fenced.opening_streams), recovered.records, recovered.bytes)


class FailoverRunner:
    """This broker's failover tasks (see the module docstring)."""

    def __init__(
        self,
        *,
        take_over_wal: WalTakeover,
        store: ObjectStore,
        client: ControllerClient,
        view: MetadataView,
        node_id: int,
        node_epoch: int,
        namespace: str,
        params: lc.LogCacheParams,
        clock: Clock,
        retry_base_s: float = RETRY_BASE_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._take_over_wal = take_over_wal
        self._store = store
        self._client = client
        self._view = view
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._namespace = namespace
        self._params = params
        self._clock = clock
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._follower: asyncio.Task[None] | None = None
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.completed: list[tuple[StoredContext, FailoverResult]] = []

    def start(self) -> None:
        self._follower = asyncio.create_task(self._follow(), name="failover-runner")

    async def _follow(self) -> None:
        version = self._view.version
        while True:
            self._start_tasks()
            version = await self._view.wait_for_change(version)

    def _mine(self) -> dict[tuple[int, int], StoredContext]:
        return {
            (c.failed_node_id, c.node_epoch): c
            for c in stored_contexts(self._view.image)
            if c.target_node_id == self.node_id
        }

    def _start_tasks(self) -> None:
        mine = self._mine()
        # A finished task is forgotten once its context is gone: should the controller assign
        # the same failover here again (it had moved it elsewhere meanwhile), it runs again.
        for key in [k for k, task in self._tasks.items() if task.done() and k not in mine]:
            del self._tasks[key]
        for key, context in mine.items():
            task = self._tasks.get(key)
            if task is None:
                self._tasks[key] = asyncio.create_task(
                    self._run(context), name=f"failover-{key[0]}-{key[1]}"
                )

    def _abandoned(self, context: StoredContext) -> str | None:
        """Why this task should stop, if it should: the failed node restarted, or the
        controller no longer asks this broker."""
        node = self._view.image.nodes.get(context.failed_node_id)
        if node is not None and abort_failover(self.node_id, context.context, node.node_epoch):
            return "the failed node restarted"
        if (context.failed_node_id, context.node_epoch) not in self._mine():
            return "the context is gone"
        return None

    async def _run(self, context: StoredContext) -> None:
        started_s = self._clock.monotonic_s()
        attempt = 0
        what = fields(failed_node=context.failed_node_id, node_epoch=context.node_epoch)
        log.warning("failover started %s", what)
        while (reason := self._abandoned(context)) is None:
            try:
                result = await take_over_failed_node(
                    context,
                    take_over_wal=self._take_over_wal,
                    store=self._store,
                    client=self._client,
                    view=self._view,
                    node_id=self.node_id,
                    node_epoch=self.node_epoch,
                    namespace=self._namespace,
                    params=self._params,
                    clock=self._clock,
                )
            except FailoverAborted as error:
                reason = str(error)
                break
            except Exception as error:
                delay_s = min(self._retry_base_s * 2**attempt, self._retry_max_s)
                attempt += 1
                log.warning("failover failed %s: %s; again in %.1f s", what, error, delay_s)
                await asyncio.sleep(delay_s)
                continue
            self.completed.append((context, result))
            log.warning(
                "failover done %s",
                fields(
                    failed_node=context.failed_node_id,
                    node_epoch=context.node_epoch,
                    streams=result.streams,
                    records=result.records,
                    bytes=result.bytes,
                    seconds=round(self._clock.monotonic_s() - started_s, 3),
                ),
            )
            return
        log.warning("failover given up %s: %s", what, reason)

    async def close(self) -> None:
        tasks = [t for t in (self._follower, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._follower = None
        self._tasks.clear()
