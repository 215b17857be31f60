"""S3Storage: durable, readable streams over a WAL, LogCache, objects and controller.

The WAL is any :class:`~automq_ref.io.storage.wal.WriteAheadLog` (the block WAL or the object WAL;
the node picks one). Append: the stream's next offset is assigned first, the StreamRecordBatch goes
to the WAL, and once the WAL has made it durable the record enters the LogCache machine (in WAL
completion order) and the stream's confirm offset moves; only then does the caller get its offset.
Reads never pass the confirm offset: they take the LogCache's contiguous run when it holds the
start, else read objects (found through the metadata view's image, through the stream readers of
:mod:`automq_ref.io.storage.block_cache`) up to where the cache takes over, on a cold-read loop
or process when given one (``cold_reads.py``, ``cold_read_process.py``). Objects are read and
uploaded through :mod:`automq_ref.io.storage.shaped_store` (GETs merged, reads and writes apart).

The LogCache machine decides when blocks become objects; this shell executes its effects through
the shell's one driver (:mod:`automq_ref.io.driver`): each executor spawns a task and returns, so
the cache's state advances at once (records enter it in WAL completion order, from the WAL's
callbacks) and the tasks answer with events later: ``PrepareObjects`` and ``CommitBlock`` through
the controller client, ``UploadBlock`` against the object store, ``TrimWal`` on the WAL. The
machine emits a commit only after the commit of every earlier block, and a trim only after the
commit that covers it. A refusal (``Rejected``: a record out of order, an answer for no request)
is a bug here and fails like one (``StorageError``). A commit the controller refuses is fatal for
the storage, as in AutoMQ (which halts), and so is a prepare, commit, open or close whose outcome
stayed unknown (the controller client sends such a request again while it may, and gives up only
when no controller answered it in time): the storage records the failure, sets ``failed``, and
the node restarts in process (:func:`automq_ref.node.serve`), as a fenced broker does: the new
incarnation registers at a new node epoch, recovers the WAL (uploading only what is not committed
yet) and closes the streams the failed one held, so their partitions open again. An upload
is not: when the object store's own retries run out (``ObjectStoreUnavailable``: throttling, 5xx,
lost connections) the block's objects are PUT again after a growing pause, for as long as it
takes, since the data is safe in the WAL meanwhile and a PUT under an already prepared object id
can be repeated. Only once shutdown has begun does an exhausted upload fail the storage, leaving
the data to WAL recovery at the next start. A read from objects that fails is a ``StorageError``
(Fetch answers ``KAFKA_STORAGE_ERROR`` for that partition and the client retries).

What was uploaded is summed in :class:`UploadTotals`, which the node takes and logs now and then,
and what recovery replayed in :class:`RecoveryTotals` (``S3Storage.recovered``); each committed
block is logged at DEBUG.

Start-up recovery: the node has registered (``RegisterNode``, before its WAL was opened: the WAL
carries the granted epoch) and learnt which streams it still owns (the :class:`Registration`);
every WAL record of those streams at or past the stream's committed end is replayed into a fresh
cache (records below it are already in objects; a record past the expected offset is a
discontinuity, logged as an error and refused); the cache is force-uploaded and committed; the
WAL is reset; the recovered streams are closed so they can be reopened.

Link records (the zone router): data a proxy routed through its RouterChannel is appended with
its :class:`~automq_ref.formats.zone_router.LinkRecord` (``append(..., link=...)``); the WAL gets
a batch of count ``-count`` carrying the link record, the LogCache the data itself, so uploads
hold real data and the WAL only a pointer into the channel. Recovery (a restart, or a failover
target's, which runs the same code) turns each link record it replays back into the data by
reading the channel through the :class:`LinkResolver` it is given, at most
``RECOVERY_LINK_WINDOW`` reads at once and caching in WAL order, at the offsets the leader
assigned. A WAL with a link record to replay and no resolver fails recovery with a
``StorageError``: dropping it would lose acknowledged data. The channel data stays until every
main has committed what links to it (route epochs), so a link record in a WAL always resolves.

The controller is reached only through its seams: requests through a ``ControllerClient``, reads
through a ``MetadataView``; time through the injected ``Clock``. Once a second the storage also
runs the object lifecycle (:mod:`automq_ref.io.storage.object_lifecycle`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from automq_ref.formats.errors import FormatError
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.stream_record_batch import decode as decode_stream_record_batch
from automq_ref.formats.zone_router import LinkRecord
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.driver import Driver
from automq_ref.io.metadata.client import (
    ControllerClient,
    ControllerError,
    ControllerUnavailable,
    Registration,
)
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.network_limiter import NetworkLimiters
from automq_ref.io.storage import storage_errors
from automq_ref.io.storage.block_cache import BlockCacheStats
from automq_ref.io.storage.cold_read_process import ColdReadsFailed, InChildProcess
from automq_ref.io.storage.cold_reads import ColdReads, object_read_path
from automq_ref.io.storage.compaction import retry_compacted_away
from automq_ref.io.storage.object_lifecycle import run_object_lifecycle
from automq_ref.io.storage.object_store import (
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    RequestShaping,
    ShapedObjectStore,
    ThrottledStore,
)
from automq_ref.io.storage.storage_totals import RecoveryTotals, StorageCounts, UploadTotals
from automq_ref.io.storage.stream_objects import (
    ReadOrigin,
    StreamReadError,
    upload_layout,
)
from automq_ref.io.storage.wal import AppendResult, WalOverCapacityError, WriteAheadLog
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.network_limiter import Priority

log = logging.getLogger(__name__)

# The storage's errors (storage_errors.py), which callers import from here.
StorageError = storage_errors.StorageError
StreamFencedError = storage_errors.StreamFencedError
NodeEpochExpiredError = storage_errors.NodeEpochExpiredError
PlacementRefusedError = storage_errors.PlacementRefusedError
OffsetOutOfRangeError = storage_errors.OffsetOutOfRangeError
PLACEMENT_REFUSALS = storage_errors.PLACEMENT_REFUSALS

OBJECT_TTL_MS = 60 * 60 * 1000
WAL_FULL_RETRIES = 3
# An upload whose object-store retries ran out is tried again after this (doubling, capped).
UPLOAD_RETRY_BASE_S = 1.0
UPLOAD_RETRY_MAX_S = 30.0
DEFAULT_BLOCK_CACHE_BYTES = 64 * 1024 * 1024
# Link records recovery resolves at once (channel reads in flight), in WAL order.
RECOVERY_LINK_WINDOW: Final = 64


class LinkResolver(Protocol):
    """Turns a link record back into the data it stands for, read from the channel it points
    into: the payload the leader stored (the batch with the offsets it assigned)."""

    async def resolve(self, link: LinkRecord) -> bytes: ...


@dataclass(slots=True)
class _PendingAppend:
    batch: StreamRecordBatch  # what the LogCache gets: the data
    encoded: bytes  # what the WAL gets: the data, or its link record
    durable: asyncio.Future[None]


@dataclass(slots=True)
class _OpenStream:
    epoch: int
    start_offset: int
    next_offset: int
    confirm_offset: int
    closing: bool = False


async def _resolve_link(resolver: LinkResolver, batch: StreamRecordBatch) -> StreamRecordBatch:
    """The full batch a link record stands for, at the offsets the leader assigned."""
    what = f"stream {batch.stream_id}: link record at {batch.base_offset}"
    try:
        link = LinkRecord.decode(batch.payload)
    except FormatError as error:
        raise StorageError(f"{what}: {error}") from error
    try:
        payload = await resolver.resolve(link)
    except Exception as error:
        owner = link.channel_offset.channel_owner
        raise StorageError(
            f"{what}: reading its data from node {owner}'s channel: {error}"
        ) from error
    return StreamRecordBatch(batch.stream_id, batch.epoch, batch.base_offset, -batch.count, payload)


async def close_streams(
    client: ControllerClient,
    node_id: int,
    node_epoch: int,
    opening: Iterable[sm.OpeningStream],
) -> None:
    """Close recovered streams as ``node_id`` at ``node_epoch``. All at once: each close lets
    another broker open its stream, and a partition's broker waits for all of its streams (a
    failover closes a dead node's streams this way)."""
    streams = list(opening)
    closes = await asyncio.gather(
        *(client.submit(sm.CloseStream(node_id, node_epoch, s.stream_id, s.epoch)) for s in streams)
    )
    for stream, closed in zip(streams, closes, strict=True):
        if not closed.ok and closed.error is not sm.StreamErrorCode.STREAM_FENCED:
            raise StorageError(f"closing recovered stream {stream.stream_id}: {closed.message}")


class S3Storage:
    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        store: ObjectStore,
        client: ControllerClient,
        view: MetadataView,
        node_id: int,
        node_epoch: int,
        namespace: str,
        params: lc.LogCacheParams,
        block_size_threshold_bytes: int = 512 * 1024,
        clock: Clock | None = None,
        block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES,
        runs_lifecycle: Callable[[], bool] = lambda: True,
        cold_reads: ColdReads | InChildProcess | None = None,
        limiters: NetworkLimiters | None = None,
        request_shaping: RequestShaping | None = None,
    ) -> None:
        self._wal = wal
        self._objects = ShapedObjectStore(store, request_shaping, owns_store=False)
        # Uploads' PUTs take their bytes from the outbound bucket at BYPASS: never waiting, the
        # debt theirs to run into (reads from objects consume inbound, in the block cache).
        self._upload_store = (
            self._objects
            if limiters is None
            else ThrottledStore(self._objects, limiters, Priority.BYPASS)
        )
        self._client = client
        self._view = view
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._namespace = namespace
        self._block_size_threshold_bytes = block_size_threshold_bytes
        # Wall-clock milliseconds: object deadlines, upload intervals, lifecycle. Tests inject
        # their own clock to move time past a deadline.
        self._clock = clock or SystemClock()
        # Whether this broker runs the object lifecycle now: in a cluster only the active
        # controller's broker does, so three brokers do not race for the same objects.
        self._runs_lifecycle = runs_lifecycle
        self._cache: Driver[lc.LogCacheState, lc.LogCacheEvent, lc.LogCacheEffect] = Driver(
            lambda state, event: lc.step(state, event, params),
            lc.LogCacheState(),
            {
                lc.PrepareObjects: self._spawn_effect,
                lc.UploadBlock: self._spawn_effect,
                lc.CommitBlock: self._spawn_effect,
                lc.TrimWal: self._spawn_effect,
                lc.Rejected: self._refused,
            },
        )
        self._streams: dict[int, _OpenStream] = {}
        # Reads from objects, counted under their own shaping (the GETs the store sees, which
        # the node logs beside the cache's size), the block GETs through the limiter's inbound
        # bucket; on the cold reads' loop or process when given, which this storage then owns.
        self._object_reads = object_read_path(
            store,
            namespace,
            block_cache_bytes,
            lambda: self._view.image,
            cold_reads,
            limiter=None if limiters is None else limiters.inbound,
            shaping=request_shaping,
        )
        self.reads = self._object_reads.counts
        self._committed: dict[int, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wal_backlog: collections.deque[_PendingAppend] = collections.deque()
        self._last_wal_write: asyncio.Future[AppendResult] | None = None
        self._failure: BaseException | None = None
        # Set when the storage fails: the node then starts a new incarnation (module docstring).
        self.failed = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self._sizes: dict[int, dict[int, int]] = {}
        # During recovery the WAL is replayed, not appended: reset after it, never trimmed before.
        self._recovering = False
        # Set when shutdown begins: an upload that runs out of retries then fails the storage.
        self._shutting_down = asyncio.Event()
        self._upload_totals = UploadTotals()
        self.counts = StorageCounts()  # for the metrics: LogCache hits, upload stages
        self.recovered = RecoveryTotals()
        # Called in WAL completion order with each durable record as the WAL holds it (the
        # encoded stream record batch, a link record's for routed data), its WAL offset and
        # the next: the main's side of snapshot reads (kafka/snapshot_sessions.py).
        self.append_listeners: list[Callable[[bytes, int, int], None]] = []
        # How long a WAL trim waits after its commit: proxies reading the WAL objects for
        # snapshot reads need them a while longer (AutoMQ: 30 s with snapshot reads on).
        self.wal_trim_delay_s = 0.0

    # ---------------------------------------------------------------------------- start-up

    @classmethod
    async def start(
        cls,
        *,
        wal: WriteAheadLog,
        store: ObjectStore,
        client: ControllerClient,
        view: MetadataView,
        registration: Registration,
        namespace: str,
        params: lc.LogCacheParams,
        block_size_threshold_bytes: int = 512 * 1024,
        clock: Clock | None = None,
        block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES,
        runs_lifecycle: Callable[[], bool] = lambda: True,
        close_recovered: bool = True,
        link_resolver: LinkResolver | None = None,
        cold_reads: ColdReads | InChildProcess | None = None,
        limiters: NetworkLimiters | None = None,
        request_shaping: RequestShaping | None = None,
    ) -> S3Storage:
        """Recover the WAL (opened at the registration's epoch) into objects, reset it, close
        the recovered streams (unless ``close_recovered`` is off: a failover target closes
        them as a step of its own, :func:`close_streams`). A link record to replay is turned
        back into its data through ``link_resolver``; without one, recovery fails with a
        :class:`StorageError` rather than drop it."""
        node_id, node_epoch = registration.node_id, registration.node_epoch
        storage = cls(
            wal=wal,
            store=store,
            client=client,
            view=view,
            node_id=node_id,
            node_epoch=node_epoch,
            namespace=namespace,
            params=params,
            block_size_threshold_bytes=block_size_threshold_bytes,
            clock=clock,
            block_cache_bytes=block_cache_bytes,
            runs_lifecycle=runs_lifecycle,
            cold_reads=cold_reads,
            limiters=limiters,
            request_shaping=request_shaping,
        )
        storage._recovering = True
        recovering = {s.stream_id: s for s in registration.opening_streams}
        expected = {stream_id: s.end_offset for stream_id, s in recovering.items()}
        replayed, replayed_bytes, refused, links = 0, 0, 0, 0
        replayed_streams: set[int] = set()
        # Records accepted but not cached yet, in WAL order: a link record waits for its data.
        window: collections.deque[tuple[StreamRecordBatch | asyncio.Task[StreamRecordBatch], int]]
        window = collections.deque()

        async def cache_oldest() -> None:
            nonlocal replayed_bytes
            item, next_offset = window.popleft()
            batch = item if isinstance(item, StreamRecordBatch) else await item
            storage._cache_record(batch, next_offset)
            replayed_bytes += batch.encoded_size_bytes

        try:
            async for record in wal.recover():
                try:
                    batch, _ = decode_stream_record_batch(record.body)
                except FormatError as error:
                    raise StorageError(f"WAL record at {record.record_offset}: {error}") from error
                next_offset = expected.get(batch.stream_id)
                if next_offset is None or batch.last_offset <= next_offset:
                    continue  # not ours any more, or already in committed objects
                if batch.base_offset != next_offset:
                    log.error(
                        "WAL recovery: stream %d record at %d, expected %d: refused",
                        batch.stream_id,
                        batch.base_offset,
                        next_offset,
                    )
                    refused += 1
                    continue
                expected[batch.stream_id] = batch.last_offset
                if batch.is_link_record:
                    if link_resolver is None:
                        raise StorageError(
                            f"stream {batch.stream_id}: the WAL record at {record.record_offset} "
                            f"is a link record (offsets {batch.base_offset}-{batch.last_offset}) "
                            "and no channel reader was given to resolve it: refusing to recover "
                            "rather than drop acknowledged data"
                        )
                    task = asyncio.create_task(_resolve_link(link_resolver, batch))
                    window.append((task, record.next_offset))
                    links += 1
                else:
                    window.append((batch, record.next_offset))
                replayed += 1
                replayed_streams.add(batch.stream_id)
                while len(window) > RECOVERY_LINK_WINDOW:
                    await cache_oldest()
            while window:
                await cache_oldest()
        except BaseException:
            # Recovery stopped half way (a link it could not resolve): nothing of it runs on,
            # such as the upload of a block it filled; the next start recovers again.
            await storage._cancel_tasks()
            raise
        finally:
            pending = [item for item, _ in window if isinstance(item, asyncio.Task)]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        storage.recovered = RecoveryTotals(
            replayed, replayed_bytes, len(replayed_streams), refused, links
        )
        await storage.force_upload(lc.ALL_STREAMS)
        await wal.reset()
        storage._recovering = False
        if close_recovered:
            await close_streams(client, node_id, node_epoch, registration.opening_streams)
        # Start the live cache empty but keep numbering blocks after the recovered ones: a block
        # id names one block for the storage's lifetime (commit waiters are keyed by it).
        storage._cache.reset(lc.LogCacheState(next_block_id=storage._cache.state.next_block_id))
        storage._committed.clear()
        storage.take_upload_totals()  # recovery's uploads are in ``recovered``
        storage._ticker = asyncio.create_task(storage._tick_forever())
        return storage

    def take_upload_totals(self) -> UploadTotals:
        """The totals since they were last taken; counting starts again from zero."""
        totals, self._upload_totals = self._upload_totals, UploadTotals()
        return totals

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def node_epoch(self) -> int:
        return self._node_epoch

    # ------------------------------------------------------------------------------ streams

    async def create_stream(
        self, topic_id: str = sm.NO_TOPIC, partition: int = sm.NO_PARTITION
    ) -> int:
        """A new stream; tagged with a partition (``topic_id``, ``partition``), it can be
        created only while the partition is placed on this broker, and opened only here at
        the partition's leader epoch."""
        response = await self._client.submit(
            sm.CreateStream(self._node_id, self._node_epoch, topic_id, partition)
        )
        self._check(response, "create stream")
        assert response.stream_id is not None
        return response.stream_id

    async def open_stream(self, stream_id: int, epoch: int) -> tuple[int, int]:
        response = await self._submit_or_fail(
            sm.OpenStream(self._node_id, self._node_epoch, stream_id, epoch),
            f"open stream {stream_id}",
        )
        self._check(response, f"open stream {stream_id}")
        assert response.start_offset is not None and response.next_offset is not None
        # Other brokers may have appended since this one last held the stream.
        self._apply(lc.StreamReopened(stream_id, response.next_offset))
        self._streams[stream_id] = _OpenStream(
            epoch, response.start_offset, response.next_offset, response.next_offset
        )
        return response.start_offset, response.next_offset

    def next_offset(self, stream_id: int, epoch: int) -> int:
        """The offset the stream's next append will get (open streams only)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.epoch != epoch:
            raise StreamFencedError(f"stream {stream_id} is not open here at epoch {epoch}")
        return stream.next_offset

    def confirm_offset(self, stream_id: int) -> int:
        """The end of the stream's durable prefix: reads never pass it."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamFencedError(f"stream {stream_id} is not open here")
        return stream.confirm_offset

    def start_offset(self, stream_id: int) -> int:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamFencedError(f"stream {stream_id} is not open here")
        return stream.start_offset

    async def append(
        self,
        stream_id: int,
        epoch: int,
        payload: bytes | memoryview,
        count: int,
        *,
        link: LinkRecord | None = None,
    ) -> int:
        """Append ``count`` offsets carried by ``payload``; return the first, once durable."""
        base, durable = self.append_nowait(stream_id, epoch, payload, count, link=link)
        await durable
        return base

    def append_nowait(
        self,
        stream_id: int,
        epoch: int,
        payload: bytes | memoryview,
        count: int,
        *,
        link: LinkRecord | None = None,
    ) -> tuple[int, asyncio.Future[None]]:
        """Assign the offsets and queue the WAL write now; return the first offset and a future
        that completes once the append is durable (and readable).

        Appends are written to the WAL in the order of these calls, even while the WAL is full
        (they then queue behind each other until an upload has trimmed it), so each stream's
        records reach the WAL, and so the LogCache, in offset order. A caller that must know the
        offset before the payload is final (a Kafka batch carries its base offset) reads
        ``next_offset`` and calls this without awaiting anything in between.

        With ``link`` (data a proxy routed through its RouterChannel) the WAL gets the link
        record instead of the data: a batch of count ``-count`` whose payload is ``link``,
        while the LogCache, and so the upload, gets ``payload`` itself. Recovery turns the link
        record back into ``payload`` through the channel (:class:`LinkResolver`). ``payload``
        is copied here: its buffer may be reused once this returns.
        """
        self._check_healthy()
        stream = self._streams.get(stream_id)
        if stream is None or stream.epoch != epoch or stream.closing:
            raise StreamFencedError(f"stream {stream_id} is not open here at epoch {epoch}")
        if count <= 0:
            raise ValueError(f"an append must cover at least one offset, not {count}")
        base = stream.next_offset
        stream.next_offset += count
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if link is None:
            # The one copy of the payload (a request frame's view): the WAL body the cache views.
            encoded, batch = StreamRecordBatch(stream_id, epoch, base, count, payload).encode_held()
        else:
            batch = StreamRecordBatch(stream_id, epoch, base, count, bytes(payload))
            encoded = StreamRecordBatch(stream_id, epoch, base, -count, link.encode()).encode()
        pending = _PendingAppend(batch, encoded, durable)
        if not self._wal_backlog:
            try:
                self._submit(pending)
                return base, durable
            except WalOverCapacityError:
                pass
        # The WAL is full of data not yet in objects (or appends already wait for it): queue
        # behind them; one task uploads, which trims the WAL, and submits them in order.
        self._wal_backlog.append(pending)
        if len(self._wal_backlog) == 1:
            self._spawn(self._drain_wal_backlog())
        return base, durable

    def _submit(self, pending: _PendingAppend) -> None:
        written = self._wal.submit(pending.encoded)
        self._last_wal_write = written

        def on_written(future: asyncio.Future[AppendResult]) -> None:
            # Runs in WAL completion order (= submission order), unlike the coroutines awaiting.
            batch = pending.batch
            if future.cancelled() or future.exception() is not None:
                error = future.exception() if not future.cancelled() else None
                self._fail_stream(batch.stream_id, error)
                if not pending.durable.done():
                    pending.durable.set_exception(
                        StorageError(f"stream {batch.stream_id}: WAL append failed: {error}")
                    )
                return
            stream = self._streams.get(batch.stream_id)
            if stream is None or stream.epoch != batch.epoch:
                # An earlier write of the stream failed (which closed it here): this record
                # lies past a gap, so no upload could commit it. Written, but not durable as
                # part of the stream: neither cached nor acknowledged.
                if not pending.durable.done():
                    pending.durable.set_exception(
                        StorageError(
                            f"stream {batch.stream_id}: an earlier WAL append of the stream failed"
                        )
                    )
                return
            result = future.result()
            self._cache_record(batch, result.next_offset)
            stream.confirm_offset = max(stream.confirm_offset, batch.last_offset)
            for listener in self.append_listeners:
                listener(pending.encoded, result.record_offset, result.next_offset)
            if not pending.durable.done():
                pending.durable.set_result(None)

        written.add_done_callback(on_written)

    async def _drain_wal_backlog(self) -> None:
        while self._wal_backlog:
            pending = self._wal_backlog[0]
            for attempt in range(WAL_FULL_RETRIES):
                try:
                    self._submit(pending)
                    break
                except WalOverCapacityError as error:
                    if attempt == WAL_FULL_RETRIES - 1:
                        self._fail_backlog(error)
                        return
                    # Records still on their way to the disk are not in the cache yet: wait
                    # for them, so that the upload covers everything the WAL holds.
                    if self._last_wal_write is not None:
                        await asyncio.wait([self._last_wal_write])
                    await self.force_upload(lc.ALL_STREAMS)
                    # Let the trims that follow the commits run (not this task itself).
                    current = asyncio.current_task()
                    others = [task for task in self._tasks if task is not current]
                    await asyncio.gather(*others, return_exceptions=True)
                except Exception as error:
                    self._fail_backlog(error)
                    return
            self._wal_backlog.popleft()

    def _fail_backlog(self, error: BaseException) -> None:
        while self._wal_backlog:
            pending = self._wal_backlog.popleft()
            self._fail_stream(pending.batch.stream_id, error)
            if not pending.durable.done():
                pending.durable.set_exception(
                    StorageError(f"stream {pending.batch.stream_id}: WAL append failed: {error}")
                )

    def _fail_stream(self, stream_id: int, error: BaseException | None) -> None:
        # Later offsets may already be assigned: the stream cannot continue without a gap.
        if self._streams.pop(stream_id, None) is not None:
            log.error("stream %d: WAL append failed, stream closed here: %s", stream_id, error)

    def _cache_record(self, batch: StreamRecordBatch, wal_next_offset: int) -> None:
        record = lc.CachedRecord(
            batch.stream_id, batch.base_offset, batch.count, bytes(batch.payload), wal_next_offset
        )
        self._apply(lc.RecordAppended(record, self._clock.now_ms()))

    async def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int,
        max_bytes: int,
        origin: ReadOrigin | None = None,
    ) -> list[StreamRecordBatch]:
        """Contiguous batches from ``start_offset``, never past the confirm offset; ``origin``,
        if given, learns whether any came from objects."""
        end_offset = self._read_end(stream_id, start_offset, end_offset)
        if start_offset >= end_offset:
            return []
        found: list[StreamRecordBatch] = []
        cursor = start_offset
        budget = max_bytes
        # Alternate between the cache and objects: the cache holds a suffix of the stream, but
        # a block read as "cached" a moment ago may be evicted (it was committed) while objects
        # are read, so every turn looks again.
        while cursor < end_offset and (not found or budget > 0):
            cached = lc.read(self._cache.state, stream_id, cursor, end_offset, budget)
            if not cached and origin is not None:
                origin.from_objects = True
            if self.counts.log_cache_read(cached):
                batches = [self._as_batch(record) for record in cached]
            else:
                self.counts.log_cache_misses += 1
                first_cached = lc.first_cached_offset(self._cache.state, stream_id)
                object_end = end_offset
                if first_cached is not None and first_cached > cursor:
                    object_end = min(end_offset, first_cached)

                async def read(
                    _: object, at: int = cursor, to: int = object_end, most: int = budget
                ) -> list[StreamRecordBatch]:
                    return await self._object_reads.read(stream_id, at, to, most)

                try:  # read again from a fresh image if an object was compacted away meanwhile
                    batches = await retry_compacted_away(self._view, read)
                except (ObjectStoreError, StreamReadError, ColdReadsFailed) as error:
                    raise StorageError(
                        f"stream {stream_id}: reading objects from {cursor} failed: {error}"
                    ) from error
            if not batches:
                break
            found.extend(batches)
            budget -= sum(len(batch.payload) for batch in batches)
            cursor = batches[-1].last_offset
        return found

    def read_cached(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch] | None:
        """What :meth:`read` answers, when the LogCache holds all of it (nothing to wait for: a
        Fetch of many tail partitions answers those without a task each); else None."""
        end_offset = self._read_end(stream_id, start_offset, end_offset)
        cached = lc.read(self._cache.state, stream_id, start_offset, end_offset, max_bytes)
        batches = [self._as_batch(record) for record in cached]
        if start_offset >= end_offset or (
            batches
            and (
                batches[-1].last_offset >= end_offset
                or sum(len(batch.payload) for batch in batches) >= max_bytes
            )
        ):
            return self.counts.log_cache_read(batches)
        return None

    def _read_end(self, stream_id: int, start_offset: int, end_offset: int) -> int:
        """Where a read up to ``end_offset`` stops: at the confirm offset at most."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return end_offset
        if start_offset < stream.start_offset:
            raise OffsetOutOfRangeError(
                f"stream {stream_id}: {start_offset} is below the start {stream.start_offset}"
            )
        return min(end_offset, stream.confirm_offset)

    def block_cache_stats(self, *, take_peak: bool = True) -> BlockCacheStats:
        """The read path's block cache: bytes held, readers open, GETs and bytes fetched."""
        return self._object_reads.stats(take_peak=take_peak)

    def _as_batch(self, record: lc.CachedRecord) -> StreamRecordBatch:
        epoch = self._streams[record.stream_id].epoch if record.stream_id in self._streams else 0
        return StreamRecordBatch(
            record.stream_id, epoch, record.base_offset, record.count, record.payload
        )

    async def trim_stream(self, stream_id: int, epoch: int, new_start_offset: int) -> None:
        response = await self._client.submit(
            sm.TrimStream(self._node_id, self._node_epoch, stream_id, epoch, new_start_offset)
        )
        self._check(response, f"trim stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.start_offset = max(stream.start_offset, new_start_offset)

    async def close_stream(self, stream_id: int, epoch: int) -> None:
        """Refuse new appends, let the ones in flight become durable, upload everything of the
        stream, then close it in the controller (a later block holding the stream's records
        would otherwise be committed after the close, and refused)."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.epoch == epoch:
            stream.closing = True
            while stream.confirm_offset < stream.next_offset and stream_id in self._streams:
                self._check_healthy()
                await asyncio.sleep(0.001)
        await self.force_upload(stream_id)
        response = await self._submit_or_fail(
            sm.CloseStream(self._node_id, self._node_epoch, stream_id, epoch),
            f"close stream {stream_id}",
        )
        # STREAM_FENCED: a newer owner opened the stream, so it was closed (by this close, if
        # its answer was lost and it was sent again, or by a failover); AutoMQ's client takes
        # it the same way. Everything of it was committed above.
        if response.error is not sm.StreamErrorCode.STREAM_FENCED:
            self._check(response, f"close stream {stream_id}")
        self._streams.pop(stream_id, None)

    async def delete_stream(self, stream_id: int, epoch: int) -> None:
        """Delete a closed stream; its objects are destroyed, then reclaimed by the object
        lifecycle."""
        response = await self._client.submit(
            sm.DeleteStream(self._node_id, self._node_epoch, stream_id, epoch, self._clock.now_ms())
        )
        self._check(response, f"delete stream {stream_id}")

    async def force_upload(self, stream_id: int) -> None:
        """Seal the active block if it holds the stream and wait until it is committed."""
        self._apply(lc.ForceUpload(stream_id, self._clock.now_ms()))
        waits = [
            self._committed_event(block.block_id).wait()
            for block in lc.uncommitted_blocks(self._cache.state)
            if stream_id == lc.ALL_STREAMS or stream_id in block.by_stream
        ]
        await asyncio.gather(*waits)
        self._check_healthy()

    async def commit_appended(self, linger_s: float = 0.0) -> None:
        """Return once every record whose append completed before the call is in committed
        objects (the zone router's commit before a node reports its committed route epoch):
        the uploads that happen anyway are waited for up to ``linger_s``, then the active
        block is sealed and uploaded. Records appended meanwhile may ride along; nothing to
        wait for when the cache holds nothing uncommitted."""
        blocks = [b.block_id for b in lc.uncommitted_blocks(self._cache.state) if b.records]
        if not blocks:
            self._check_healthy()
            return
        waits = asyncio.gather(*(self._committed_event(b).wait() for b in blocks))
        if linger_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waits), linger_s)
        if not waits.done():
            self._apply(lc.ForceUpload(lc.ALL_STREAMS, self._clock.now_ms()))
            await waits
        self._check_healthy()

    async def shutdown(self) -> None:
        """Upload everything, so that a restart recovers nothing, then close the WAL.

        An upload already waiting to be tried again still gets one more round of the object
        store's retries; if that fails too, shutdown raises and the WAL keeps the data."""
        self._shutting_down.set()
        await self.force_upload(lc.ALL_STREAMS)
        if self._ticker is not None:
            self._ticker.cancel()
        for task in list(self._tasks):
            await task
        await self._object_reads.close()
        await self._objects.close()
        await self._wal.close()

    async def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._object_reads.close()
        await self._objects.close()

    async def abandon(self) -> None:
        """Stop without uploading: this broker was fenced (its node epoch bumped), so nothing
        it uploads could be committed. What the WAL holds stays there for the next start's
        recovery, which uploads it under the new epoch."""
        self._shutting_down.set()
        if self._ticker is not None:
            self._ticker.cancel()
        await self._cancel_tasks()
        await self._wal.close()

    # -------------------------------------------------------------------- effect execution

    def _apply(self, event: lc.LogCacheEvent) -> None:
        self._cache.apply(event)

    def _spawn_effect(self, effect: lc.LogCacheEffect) -> None:
        self._spawn(self._execute(effect))

    def _refused(self, effect: lc.Rejected[lc.LogCacheError]) -> None:
        raise StorageError(f"LogCache refused an event: {effect.error.value}: {effect.message}")

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, effect: lc.LogCacheEffect) -> None:
        try:
            started_s = self._clock.monotonic_s()
            match effect:
                case lc.PrepareObjects():
                    response = await self._client.submit(
                        sm.PrepareObject(
                            self._node_id,
                            self._node_epoch,
                            effect.count,
                            OBJECT_TTL_MS,
                            self._clock.now_ms(),
                        )
                    )
                    self._check(response, "prepare objects")
                    assert response.first_object_id is not None
                    self._apply(lc.ObjectsPrepared(effect.block_id, response.first_object_id))
                case lc.UploadBlock():
                    self._sizes[effect.block_id] = await self._upload(effect)
                    totals = self._upload_totals
                    totals.slowest_s = max(totals.slowest_s, self._clock.monotonic_s() - started_s)
                    self._apply(lc.BlockUploaded(effect.block_id))
                case lc.CommitBlock():
                    await self._commit(effect)
                case lc.TrimWal():
                    if self.wal_trim_delay_s > 0:
                        # Snapshot reads: proxies may still read the WAL objects (a stop ends
                        # the wait, so shutdown's trims are not held up).
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(
                                self._shutting_down.wait(), self.wal_trim_delay_s
                            )
                    if not self._recovering:
                        await self._wal.trim(effect.wal_offset)
            self.counts.effect_done(effect, self._clock.monotonic_s() - started_s, self._sizes)
        except Exception as error:
            self._fail(f"storage effect {type(effect).__name__}", error)

    @property
    def failure(self) -> BaseException | None:
        """What failed the storage (None while it is healthy)."""
        return self._failure

    @property
    def fenced(self) -> bool:
        """Whether the storage failed because the controller fenced this incarnation."""
        return isinstance(self._failure, NodeEpochExpiredError)

    def _fail(self, what: str, error: BaseException) -> None:
        if self._failure is None:
            log.error(
                "storage failed: %s: %s; this broker's appends fail until it restarts and "
                "recovers its WAL",
                what,
                error,
            )
        self._failure = error
        self.failed.set()
        for event in self._committed.values():
            event.set()  # wake waiters: they see the failure

    async def _submit_or_fail(self, event: sm.StreamMetadataEvent, what: str) -> sm.Response:
        """Submit a request that changes who holds a stream; one whose outcome stayed unknown
        fails the storage (module docstring). Nothing decided (no controller): only this
        request fails."""
        try:
            return await self._client.submit(event)
        except ControllerUnavailable:
            raise
        except ControllerError as error:
            self._fail(what, error)
            raise

    async def _upload(self, effect: lc.UploadBlock) -> dict[int, int]:
        """PUT the block's objects until they land (see the module docstring)."""
        retry = 0
        while True:
            try:
                return await upload_layout(
                    self._upload_store,
                    self._namespace,
                    effect.layout,
                    effect.records,
                    block_size_threshold_bytes=self._block_size_threshold_bytes,
                )
            except ObjectStoreUnavailable as error:
                if self._shutting_down.is_set():
                    raise
                delay_s = min(UPLOAD_RETRY_BASE_S * 2 ** min(retry, 16), UPLOAD_RETRY_MAX_S)
                log.warning(
                    "block %d: upload failed (%s); its data stays in the WAL; "
                    "uploading again in %.1f s",
                    effect.block_id,
                    error,
                    delay_s,
                )
                retry += 1
                with contextlib.suppress(TimeoutError):  # shutdown cuts the pause short
                    await asyncio.wait_for(self._shutting_down.wait(), delay_s)

    async def _commit(self, effect: lc.CommitBlock) -> None:
        layout = effect.layout
        sizes = self._sizes.pop(effect.block_id)
        ranges = tuple(
            sm.CommitRange(run.stream_id, sm.ANY_STREAM_EPOCH, run.start_offset, run.end_offset)
            for run in layout.stream_set_runs
        )
        stream_objects = tuple(
            sm.CommitStreamObjectEntry(
                object_id, run.stream_id, run.start_offset, run.end_offset, sizes[object_id]
            )
            for object_id, run in layout.stream_objects
        )
        set_object_id = layout.stream_set_object_id if layout.stream_set_runs else sm.NO_OBJECT
        response = await self._client.submit(
            sm.CommitStreamSetObject(
                self._node_id,
                self._node_epoch,
                set_object_id,
                sm.NO_OBJECT,
                sizes.get(set_object_id, 0),
                ranges,
                stream_objects,
                (),
                False,
                self._clock.now_ms(),
            )
        )
        self._check(response, f"commit block {effect.block_id}")
        streams = {run.stream_id for run in layout.stream_set_runs}
        streams.update(run.stream_id for _, run in layout.stream_objects)
        self._upload_totals.add_block(sizes, streams)
        log.debug(
            "block committed block=%d objects=%d bytes=%d streams=%d",
            effect.block_id,
            len(sizes),
            sum(sizes.values()),
            len(streams),
        )
        self._apply(lc.BlockCommitted(effect.block_id))
        self._committed_event(effect.block_id).set()

    def _committed_event(self, block_id: int) -> asyncio.Event:
        return self._committed.setdefault(block_id, asyncio.Event())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(1)
            self._apply(lc.Tick(self._clock.now_ms()))
            if not self._runs_lifecycle():
                continue
            try:
                await self.run_object_lifecycle()
            except Exception as error:  # the next round retries; nothing is lost meanwhile
                log.warning("object lifecycle round failed: %s", error)

    async def run_object_lifecycle(self) -> tuple[int, int]:
        """One lifecycle round now (the ticker's are a second apart); (expired, removed)."""
        return await run_object_lifecycle(
            self._client, self._view, self._objects, self._namespace, self._clock.now_ms()
        )

    def _check(self, response: sm.Response, what: str) -> None:
        if response.ok:
            return
        if response.error is sm.StreamErrorCode.NODE_EPOCH_EXPIRED:
            raise NodeEpochExpiredError(f"{what}: {response.error.value}: {response.message}")
        if response.error in (sm.StreamErrorCode.STREAM_FENCED, sm.StreamErrorCode.NODE_FENCED):
            raise StreamFencedError(f"{what}: {response.error.value}: {response.message}")
        if response.error in PLACEMENT_REFUSALS:
            raise PlacementRefusedError(
                f"{what}: {response.error.value}: {response.message}", response.error
            )
        raise StorageError(f"{what}: {response.error.value}: {response.message}")

    def _check_healthy(self) -> None:
        if self._failure is not None:
            raise StorageError(f"storage failed: {self._failure}") from self._failure
