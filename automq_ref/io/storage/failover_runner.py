"""Crash failover, the target's side: take a failed node's WAL over, upload what it holds as
that node, close its streams.

Every broker runs a :class:`FailoverRunner` that follows its image: a failover context (the
KV entry the active controller writes, :mod:`automq_ref.io.metadata.failover_contexts`) naming
this broker as the target starts a task for it, which runs :func:`take_over_failed_node` until
it succeeds, retrying with a growing pause (1 s doubling up to 60 s, as AutoMQ does), and gives
up when the context is gone or the failed node restarted (its node epoch moved on: it recovers
its WAL itself; the Failover machine's ``AbortFailover``).

:func:`take_over_failed_node` is driven by the Failover machine's target projection
(:mod:`automq_ref.state_machines.failover.target`): it asks the machine for the next step of
the task and carries out the effects that step returns, until the machine ends the task:

1. ``FenceWal`` (effect ``AcquireReservation``): the WAL is opened in failover mode
   (``ObjectWal.take_over``): its reservation is overwritten with (failed node, its node epoch,
   failover), so the old writer, if it still runs (a zombie), fails its next reservation check
   and acknowledges nothing more; the WAL is read only after that, so every record the old
   writer acknowledged is listed.
2. ``RecoverFailedWal`` (effects ``CommitRecords``, ``ResetWal``): ``FenceNode`` (AutoMQ's
   getOpeningStreams in failover mode) marks the node taken over, so its own later requests get
   ``NODE_FENCED``, and answers the streams still OPENED on it with their committed ends; then
   the same recovery a node runs at its own start (``S3Storage.start``, without its closes)
   replays the WAL's records past those ends (a link record turned back into its data through
   the ``link_resolver``, which reads the proxy's RouterChannel), uploads them, commits them
   *as the failed node* in failover mode, and resets the WAL. ``NODE_EPOCH_EXPIRED`` (the node
   restarted) means the step did not happen: the machine's next step is then ``AbortFailover``.
3. ``CloseFailedStreams`` (effect ``CloseStreams``): the node's streams are closed as that
   node, all at once, which lets the partitions' new brokers open them.

With a :class:`~automq_ref.io.metadata.failover_trace.FailoverTrace` each step the machine took
is recorded once its effects are done: ``RecoverFailedWal`` as committed at the index applied
then, ``FenceWal`` and ``AbortFailover`` as local steps, ``CloseFailedStreams`` as a local step
right after the index applied before its first close.

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
from automq_ref.io.metadata.failover_trace import FailoverTrace
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.object_store import ObjectStore
from automq_ref.io.storage.s3stream import LinkResolver, S3Storage, close_streams
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.state_machines import failover as fo
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.failover import AbortFailover, CloseFailedStreams
from automq_ref.state_machines.failover import target as fo_target

log = logging.getLogger(__name__)

RETRY_BASE_S = 1.0
RETRY_MAX_S = 60.0

# (WAL setting of the context, failed node id, its node epoch) -> its WAL, taken over.
WalTakeover = Callable[[str, int, int], Awaitable[WriteAheadLog]]


@dataclass(frozen=True, slots=True)
class FailoverTarget:
    """This broker as a failover target: what each takeover works with. ``take_over_wal``
    opens a failed node's WAL in failover mode; ``store``, ``client`` and ``view`` are this
    broker's; a takeover prepares object ids as this broker (``node_id``, ``node_epoch``) and
    recovers with its ``namespace``, LogCache ``params`` and ``clock``."""

    take_over_wal: WalTakeover
    store: ObjectStore
    client: ControllerClient
    view: MetadataView
    node_id: int
    node_epoch: int
    namespace: str
    params: lc.LogCacheParams
    clock: Clock
    # Turns the WAL's link records back into data (the zone router's channels); None: a WAL
    # holding a link record to replay fails the takeover rather than dropping it.
    link_resolver: LinkResolver | None = None


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
    # Seconds spent on each kind of effect (the WAL taken over, its records recovered and
    # committed, the streams closed): where a slow takeover's time went.
    wal_s: float = 0.0
    recover_s: float = 0.0
    close_s: float = 0.0


async def take_over_failed_node(
    context: StoredContext, target: FailoverTarget, trace: FailoverTrace | None = None
) -> FailoverResult:
    """The target's steps 1-3 (module docstring), once, each the step the machine's target
    projection takes next (:func:`~automq_ref.state_machines.failover.target.next_step`), its
    effects carried out here; raises on any failure, and :class:`FailoverAborted` when the
    machine aborts the task (the failed node runs a newer epoch)."""
    takeover = _Takeover(context, target)
    view = target.view
    node_id = target.node_id
    task = fo_target.start_task(node_id, context.context, _current_epoch(view, context))
    try:
        while True:
            decided = fo_target.next_step(task)
            if isinstance(decided, fo_target.StepRefused):
                raise RuntimeError(f"failover of {context.context}: no step: {decided.refusals}")
            before = trace.index() if trace is not None else 0
            committed = await takeover.carry_out(decided.effects)
            if takeover.newer_epoch is not None and not decided.done:
                # The controller refused the step: the failed node restarted. The step did not
                # happen; the machine's next one is AbortFailover.
                task = task.with_failed_epoch(takeover.newer_epoch)
                continue
            if trace is not None and isinstance(decided.event, CloseFailedStreams):
                # Placed right after what was applied before its first close: between that
                # close and the last one only steps it commutes with can commit (the failed
                # node's streams are still OPENED on it until closed), while a new broker's
                # open of a closed stream may, and must come after it.
                trace.record(decided.event, index=before, closed=takeover.opened)
            elif trace is not None:
                trace.record(decided.event, committed=committed)
            if isinstance(decided.event, AbortFailover):
                raise FailoverAborted(takeover.aborted or "the failed node restarted")
            if decided.done:
                return takeover.result()
            task = decided.view.with_opened(takeover.opened)
    finally:
        await takeover.close()


def _current_epoch(view: MetadataView, context: StoredContext) -> int:
    node = view.image.nodes.get(context.failed_node_id)
    return context.node_epoch if node is None else node.node_epoch


class _Takeover:
    """The I/O of one takeover attempt: the effects of the target's steps, and what they learn
    (the failed node's streams, a newer epoch of it)."""

    def __init__(self, context: StoredContext, target: FailoverTarget) -> None:
        self._context = context
        self._take_over_wal = target.take_over_wal
        self._store = target.store
        self._client = target.client
        self._view = target.view
        self._node_id = target.node_id
        self._node_epoch = target.node_epoch
        self._namespace = target.namespace
        self._params = target.params
        self._clock = target.clock
        self._link_resolver = target.link_resolver
        self._wal: WriteAheadLog | None = None
        self._storage: S3Storage | None = None
        self._opening: tuple[sm.OpeningStream, ...] = ()
        self.newer_epoch: int | None = None  # the failed node's, once the controller said so
        self.aborted: str | None = None
        self._wal_s = self._recover_s = self._close_s = 0.0

    @property
    def opened(self) -> frozenset[int]:
        """The streams the controller said are still OPENED on the failed node."""
        return frozenset(s.stream_id for s in self._opening)

    async def carry_out(self, effects: tuple[fo.FailoverEffect, ...]) -> bool:
        """Do the effects; whether one of them committed a metadata record."""
        committed = False
        for effect in effects:
            began_s = self._clock.monotonic_s()
            match effect:
                case fo.AcquireReservation():
                    self._wal = await self._take_over_wal(
                        self._context.wal_config, effect.wal_node_id, effect.reservation.epoch
                    )
                    self._wal_s += self._clock.monotonic_s() - began_s
                case fo.CommitRecords():
                    committed = await self._recover() or committed
                    self._recover_s += self._clock.monotonic_s() - began_s
                case fo.CloseStreams():
                    failed, epoch = self._context.failed_node_id, self._context.node_epoch
                    await close_streams(self._client, failed, epoch, self._opening)
                    committed = committed or bool(self._opening)
                    self._close_s += self._clock.monotonic_s() - began_s
                case fo.ResetWal():
                    pass  # the recovery resets the WAL once its records are committed
                case fo.RemoveFailoverContext():
                    pass  # the controller's next round forgets the context (ClearFailover)
                case _:
                    raise AssertionError(f"not a target's effect: {effect}")
        return committed

    async def _recover(self) -> bool:
        """``FenceNode`` (failover mode at the controller, the streams still OPENED on the
        failed node), then the node's own start-up recovery as that node, without its closes."""
        failed, epoch = self._context.failed_node_id, self._context.node_epoch
        assert self._wal is not None, "RecoverFailedWal before FenceWal"
        fenced = await self._client.submit(sm.FenceNode(failed, epoch))
        if fenced.error is sm.StreamErrorCode.NODE_EPOCH_EXPIRED:
            # The node restarted: the machine's next step is AbortFailover.
            self.aborted = fenced.message
            self.newer_epoch = max(_current_epoch(self._view, self._context), epoch + 1)
            return False
        if not fenced.ok:
            raise RuntimeError(f"FenceNode({failed}, {epoch}): {fenced.error.value}")
        self._opening = fenced.opening_streams
        self._storage = await S3Storage.start(
            wal=self._wal,
            store=self._store,
            client=ActingClient(self._client, self._node_id, self._node_epoch),
            view=self._view,
            registration=Registration(failed, epoch, fenced.opening_streams),
            namespace=self._namespace,
            params=self._params,
            clock=self._clock,
            runs_lifecycle=lambda: False,
            close_recovered=False,
            link_resolver=self._link_resolver,
        )
        return True

    def result(self) -> FailoverResult:
        assert self._storage is not None
        recovered = self._storage.recovered
        return FailoverResult(
            len(self._opening),
            recovered.records,
            recovered.bytes,
            round(self._wal_s, 3),
            round(self._recover_s, 3),
            round(self._close_s, 3),
        )

    async def close(self) -> None:
        if self._storage is not None:
            await self._storage.shutdown()  # nothing left to upload: closes the WAL
        elif self._wal is not None:
            await self._wal.close()


class FailoverRunner:
    """This broker's failover tasks (see the module docstring)."""

    def __init__(
        self,
        target: FailoverTarget,
        *,
        retry_base_s: float = RETRY_BASE_S,
        retry_max_s: float = RETRY_MAX_S,
        trace: FailoverTrace | None = None,
    ) -> None:
        self._target = target
        self._view = target.view
        self.node_id = target.node_id
        self.node_epoch = target.node_epoch
        self._clock = target.clock
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._trace = trace
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
        if node is not None:
            view = fo_target.start_task(self.node_id, context.context, node.node_epoch)
            decided = fo_target.next_step(view)
            if isinstance(decided, fo_target.TargetStep) and isinstance(
                decided.event, AbortFailover
            ):
                if self._trace is not None:
                    self._trace.record(decided.event)
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
                result = await take_over_failed_node(context, self._target, self._trace)
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
                    attempts=attempt + 1,
                    wal_seconds=result.wal_s,
                    recover_seconds=result.recover_s,
                    close_seconds=result.close_s,
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
