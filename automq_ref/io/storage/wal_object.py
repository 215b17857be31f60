"""The object WAL: AutoMQ's S3 WAL, records batched into objects of an object store.

Theory of operation
-------------------
Appends are batched into *bulks*. A bulk is sealed when it holds more than
``max_bytes_in_batch`` bytes, when the next record would take it past 64 MiB, at close, or by a
timer armed when the bulk is created: ``min(max(10 ms, last_timer_seal + batch_interval - now),
batch_interval)``, so an idle WAL lingers 10 ms and a trickle of appends costs at most one
timer-sealed PUT per ``batch_interval``. In failover mode every append seals at once.

A sealed bulk becomes one WAL object, PUT under
``<MD5(node)>/<namespace>/<node>/<epoch>/wal/<start>-<end>``
(:func:`~automq_ref.vocabulary.naming.wal_object_key`). WAL offsets are sparse: every object
starts at a multiple of 64 MiB, and the next one starts at the first multiple at or after its
last byte, so ``end`` in the key is that aligned value. The object is a 44-byte header
(:class:`~automq_ref.formats.wal_object.WalObjectHeader`: start, length, node, epoch, and the
writer's trim offset when it was sealed) followed by WAL records (the 24-byte header of
:mod:`automq_ref.formats.wal_record` and a body), in submission order: the record at byte
``44 + p`` has WAL offset ``start + p``. A record's ``next_offset`` is the offset just past it,
except for the last record of an object, whose ``next_offset`` is the object's aligned end.

Up to ``max_inflight_uploads`` PUTs run at once, but completions are taken strictly in bulk
order: once a prefix of sealed bulks has landed, the writer reads its reservation object back
(one GET) and, only if it still holds exactly the bytes this writer put there, acknowledges
that group's records. So an append is acknowledged only when its object is durable *and* the
writer still owned the WAL after it landed. A writer whose reservation was overwritten (a newer
epoch of the node, or a survivor taking the WAL over in failover mode) is *fenced*: its pending
and later appends fail with :class:`WalFencedError` and it acknowledges nothing more. A survivor
reads the WAL only after it overwrote the reservation, so every record the old writer
acknowledged landed before the takeover, and the survivor's listing sees it.

Opening (:meth:`ObjectWal.open`; :meth:`ObjectWal.take_over` for the failover) reads the
reservation (a newer epoch there, or a takeover of this very epoch, refuses with
:class:`WalFencedError`), writes its own (node id, node epoch, failover flag) and reads it back,
then lists the node's objects of every epoch in (epoch, start) order. An object of an older
epoch that ends past the first object of a newer epoch is a fenced writer's late PUT and is
deleted. An object of a newer epoch than the opener's refuses with :class:`WalFencedError`. The
next offset is the largest end listed.

Recovery reads the trim offset from the newest object's header, then the first contiguous run of
objects ending past it (the first must start at or before the trim point; each next one where
the previous ended), a bounded number of bytes ahead. Every record is checked (header CRC, magic,
its body offset against its position, body CRC) and records ending at or before the trim offset
are skipped. It stops at the first record that does not check or at the first gap in offsets,
as the block WAL stops at a torn tail: PUTs run concurrently, so a crash can leave a later
object without an earlier one, and those later records were never acknowledged.

``trim(offset)`` sets the trim offset, appends a padding record (a header with an empty body) so
that an object whose header carries it is uploaded and verified, then deletes the objects that
end at or before ``offset``, except the newest (it anchors the next offset for the next start).
``reset()`` is ``trim(next_offset)``: afterwards recovery returns nothing. ``resume()`` is
the other way to start appending, for a WAL read by offsets rather than replayed (the zone
router's RouterChannel, :mod:`automq_ref.io.storage.router_channel`): the objects there are
kept, and the first trim deletes them as it deletes its own. A node's other WALs than its data
WAL are opened with a ``wal_type`` (``rc`` for the channel), which gives them keys and a
reservation of their own. A delete that fails is
left for the next trim; recovery skips such objects by the trim offset anyway.

Failures: a PUT whose store retries ran out (``ObjectStoreUnavailable``) is tried again after a
growing pause, with the same bytes under the same key, until it lands (nothing waiting on it is
acknowledged meanwhile); once closing, it fails instead. A reservation read that is unavailable
is retried the same way. Any other store error fails the WAL (:class:`WalIOError`).

Differences from AutoMQ's S3 WAL: the namespace (``_kafka_automq_ref``) stands where AutoMQ
writes ``_kafka_<clusterId>``; records keep submission order within an object instead of being
sorted by stream (the WAL does not read its bodies, and S3Storage needs WAL offsets to follow
the order it caches records in); the trim point is a padding record instead of AutoMQ's fake
StreamRecordBatch; trim deletes by ``next_offset`` as the block WAL's trim does; an upload or a
reservation read that fails transiently is retried rather than fencing the writer (AutoMQ counts
any error as a lost reservation); CRC-32C in the record header.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Final

from automq_ref.formats.errors import FormatError
from automq_ref.formats.wal_object import (
    WAL_OBJECT_HEADER_SIZE,
    Reservation,
    WalObjectHeader,
)
from automq_ref.formats.wal_record import (
    RECORD_MAGIC_PADDING,
    WAL_RECORD_HEADER_SIZE,
    check_wal_record_body,
    decode_wal_record_header,
    encode_padding_header,
    encode_wal_record_header,
)
from automq_ref.io.storage.object_store import (
    DeleteManyError,
    NotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
)
from automq_ref.io.storage.wal import (
    AppendResult,
    Buffer,
    RecoveredRecord,
    WalError,
    WalFencedError,
    WalIOError,
    WalOverCapacityError,
    WalRecordTooLargeError,
    WalStateError,
)
from automq_ref.vocabulary.naming import (
    parse_wal_object_key,
    wal_object_key,
    wal_objects_prefix,
    wal_reservation_key,
)

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
DATA_ALIGN_BYTES: Final = 64 * MIB
DEFAULT_BATCH_INTERVAL_MS: Final = 250
DEFAULT_MAX_BYTES_IN_BATCH: Final = 8 * MIB
DEFAULT_MAX_UNFLUSHED_BYTES: Final = 1024 * MIB
DEFAULT_MAX_INFLIGHT_UPLOADS: Final = 50
DEFAULT_READAHEAD_BYTES: Final = 100 * MIB
MIN_LINGER_S: Final = 0.010


class OpenMode(enum.Enum):
    READ_WRITE = "read-write"  # the node's own WAL
    FAILOVER = "failover"  # a survivor's takeover of a failed node's WAL


@dataclass(frozen=True, slots=True)
class ObjectWalConfig:
    """AutoMQ's S3 WAL settings (its URI query parameters, in the same units)."""

    batch_interval_ms: int = DEFAULT_BATCH_INTERVAL_MS
    max_bytes_in_batch: int = DEFAULT_MAX_BYTES_IN_BATCH
    max_unflushed_bytes: int = DEFAULT_MAX_UNFLUSHED_BYTES
    max_inflight_uploads: int = DEFAULT_MAX_INFLIGHT_UPLOADS
    readahead_bytes: int = DEFAULT_READAHEAD_BYTES
    # A PUT or a reservation read whose store retries ran out is tried again after this pause,
    # doubling up to the cap (not an AutoMQ parameter: its S3 WAL fences itself instead).
    retry_base_s: float = 0.05
    retry_max_s: float = 5.0

    def __post_init__(self) -> None:
        for name in (
            "batch_interval_ms",
            "max_bytes_in_batch",
            "max_unflushed_bytes",
            "max_inflight_uploads",
            "readahead_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not 0 < self.retry_base_s <= self.retry_max_s:
            raise ValueError("retry pauses must satisfy 0 < retry_base_s <= retry_max_s")


@dataclass(frozen=True, slots=True)
class WalObject:
    """One WAL object as listed: its key, the epoch that wrote it, its offsets, its size."""

    key: str
    epoch: int
    start: int
    end: int
    size_bytes: int


class _State(enum.Enum):
    OPENED = "opened"
    RECOVERING = "recovering"
    READY = "ready"
    FENCED = "fenced"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(slots=True)
class _Pending:
    body: Buffer | None  # None: a padding record carrying a trim point
    future: asyncio.Future[AppendResult]

    @property
    def record_bytes(self) -> int:
        return WAL_RECORD_HEADER_SIZE + (0 if self.body is None else len(self.body))


@dataclass(slots=True)
class _Bulk:
    records: list[_Pending] = field(default_factory=list)
    data_bytes: int = 0
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class _Upload:
    key: str
    start: int
    end: int
    data_bytes: int
    size_bytes: int
    records: list[_Pending]
    results: list[AppendResult]
    chunks: list[Buffer]
    task: asyncio.Task[None] | None = None
    landed: bool = False


def align_up(value: int) -> int:
    return -(-value // DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES


class ObjectWal:
    """A write-ahead log over an :class:`ObjectStore`. Open with :meth:`open` (the node's own
    WAL) or :meth:`take_over` (a failed node's, in failover mode)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        mode: OpenMode,
        config: ObjectWalConfig,
        owns_store: bool,
        reservation: bytes,
        objects: list[WalObject],
        wal_type: str = "",
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._wal_type = wal_type
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._mode = mode
        self._config = config
        self._owns_store = owns_store
        self._reservation = reservation
        self._reservation_key = wal_reservation_key(namespace, node_id, wal_type)
        # Durable objects in offset order; the last one anchors the next offset.
        self._objects = objects
        next_offset = max((o.end for o in objects), default=0)
        self._next_offset = next_offset
        self._confirm_offset = next_offset
        self._trim_offset = 0
        self._state = _State.OPENED
        self._closing = False
        self._released = False
        self._failure: WalError | None = None
        self._bulk: _Bulk | None = None
        self._last_timer_seal = float("-inf")
        self._uploads: collections.deque[_Upload] = collections.deque()
        self._started_uploads = 0
        self._unflushed_bytes = 0
        self._wakeup = asyncio.Event()
        self._processor: asyncio.Task[None] | None = None
        self.put_count = 0
        self.verify_count = 0

    # ---------------------------------------------------------------- opening

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        config: ObjectWalConfig | None = None,
        mode: OpenMode = OpenMode.READ_WRITE,
        owns_store: bool = False,
        wal_type: str = "",
    ) -> ObjectWal:
        """Take the reservation of node ``node_id``'s WAL at ``node_epoch`` and list its objects.

        With ``owns_store`` the WAL closes ``store`` when it closes (or when opening fails).
        ``wal_type`` names another WAL of the node than its data WAL (``rc``: its RouterChannel),
        with keys and a reservation of its own (:mod:`automq_ref.vocabulary.naming`)."""
        try:
            return await cls._open(
                store,
                namespace=namespace,
                node_id=node_id,
                node_epoch=node_epoch,
                config=config or ObjectWalConfig(),
                mode=mode,
                owns_store=owns_store,
                wal_type=wal_type,
            )
        except BaseException:
            if owns_store:
                with contextlib.suppress(ObjectStoreError):
                    await store.close()
            raise

    @classmethod
    async def take_over(
        cls,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        config: ObjectWalConfig | None = None,
        owns_store: bool = False,
    ) -> ObjectWal:
        """Open failed node ``node_id``'s WAL, last written at ``node_epoch``, in failover mode.

        The reservation is overwritten with (``node_id``, ``node_epoch``, failover), so the old
        writer, should it still run, fails its next check and acknowledges nothing more; then
        the caller recovers the WAL (:meth:`recover`), uploads what it holds, and resets it.
        Refused with :class:`WalFencedError` if the node already runs a newer epoch."""
        return await cls.open(
            store,
            namespace=namespace,
            node_id=node_id,
            node_epoch=node_epoch,
            config=config,
            mode=OpenMode.FAILOVER,
            owns_store=owns_store,
        )

    @classmethod
    async def _open(
        cls,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        config: ObjectWalConfig,
        mode: OpenMode,
        owns_store: bool,
        wal_type: str,
    ) -> ObjectWal:
        key = wal_reservation_key(namespace, node_id, wal_type)
        failover = mode is OpenMode.FAILOVER
        current = await _read_reservation(store, key)
        if current is not None:
            if current.node_id != node_id:
                raise WalFencedError(
                    f"the reservation at {key} names node {current.node_id}, not {node_id}"
                )
            if current.epoch > node_epoch:
                raise WalFencedError(
                    f"node {node_id}'s WAL is reserved by epoch {current.epoch}, "
                    f"newer than epoch {node_epoch}"
                )
            if current.epoch == node_epoch and current.failover and not failover:
                raise WalFencedError(
                    f"node {node_id}'s WAL was taken over at epoch {node_epoch} by a failover"
                )
        reservation = Reservation(node_id, node_epoch, failover).encode()
        try:
            await store.put(key, reservation)
            verified = await store.get(key) == reservation
        except NotFound:
            verified = False
        except ObjectStoreError as error:
            raise WalIOError(f"taking the WAL reservation {key}: {error}") from error
        if not verified:
            raise WalFencedError(f"node {node_id}'s WAL reservation was taken while opening it")
        prefix = wal_objects_prefix(namespace, node_id, wal_type)
        try:
            listed = await store.list(prefix)
        except ObjectStoreError as error:
            raise WalIOError(f"listing the WAL objects under {prefix}: {error}") from error
        objects: list[WalObject] = []
        for info in listed:
            parsed = parse_wal_object_key(prefix, info.key)
            if parsed is None:
                log.warning("object WAL: ignoring %s, not a WAL object key", info.key)
                continue
            epoch, start, end = parsed
            objects.append(WalObject(info.key, epoch, start, end, info.size_bytes))
        objects.sort(key=lambda o: (o.epoch, o.start, o.end))
        if objects and objects[-1].epoch > node_epoch:
            raise WalFencedError(
                f"node {node_id}'s WAL holds objects of epoch {objects[-1].epoch}, "
                f"newer than epoch {node_epoch}"
            )
        objects = await _drop_late_writes(store, objects)
        return cls(
            store,
            namespace=namespace,
            node_id=node_id,
            node_epoch=node_epoch,
            mode=mode,
            config=config,
            owns_store=owns_store,
            reservation=reservation,
            objects=objects,
            wal_type=wal_type,
        )

    # --------------------------------------------------------------- properties

    @property
    def confirm_offset(self) -> int:
        """Every record that ends at or before this offset is durable and acknowledged."""
        return self._confirm_offset

    @property
    def next_offset(self) -> int:
        """Where the next object starts."""
        return self._next_offset

    @property
    def trim_offset(self) -> int:
        return self._trim_offset

    @property
    def max_record_bytes(self) -> int:
        return DATA_ALIGN_BYTES - WAL_RECORD_HEADER_SIZE

    @property
    def objects(self) -> list[WalObject]:
        """The durable objects this WAL knows of, in offset order."""
        return list(self._objects)

    @property
    def fenced(self) -> bool:
        return self._state is _State.FENCED

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def node_epoch(self) -> int:
        return self._node_epoch

    @property
    def mode(self) -> OpenMode:
        return self._mode

    # ---------------------------------------------------------------- recovery

    async def recover(self) -> AsyncIterator[RecoveredRecord]:
        """Yield every record past the trim offset up to the first gap or damaged record."""
        if self._state is not _State.OPENED:
            raise WalStateError(f"recover() in state {self._state.value}")
        self._state = _State.RECOVERING
        if not self._objects:
            return
        self._trim_offset = await self._newest_trim_offset()
        run: list[WalObject] = []
        expected = align_up(self._trim_offset)
        for wal_object in self._objects:
            if wal_object.end <= self._trim_offset:
                continue
            # The first object past the trim point must hold it or start right after it;
            # every later one must start where the previous one ended.
            contiguous = wal_object.start == expected if run else wal_object.start <= expected
            if not contiguous:
                log.info(
                    "object WAL recovery stops before %s: offsets jump from %d",
                    wal_object.key,
                    expected,
                )
                break
            run.append(wal_object)
            expected = wal_object.end
        async with contextlib.aclosing(self._read_ahead(run)) as fetched:
            async for wal_object, data in fetched:
                intact = True
                for record in self._records(wal_object, data):
                    if record is None:
                        intact = False
                        break
                    if record.next_offset > self._trim_offset:
                        yield record
                if not intact:
                    break

    async def _newest_trim_offset(self) -> int:
        """The trim offset in the newest object's header; 0 (trim nothing) when that header is
        unreadable or does not check: a trim offset always lies at or below the start of the
        object that carries it, and one that does not was damaged."""
        newest = self._objects[-1]
        try:
            data = await self._store.get_range(newest.key, 0, WAL_OBJECT_HEADER_SIZE)
            header = WalObjectHeader.decode(data)
        except ObjectStoreUnavailable as error:
            raise WalIOError(f"reading {newest.key}: {error}") from error
        except (FormatError, ObjectStoreError) as error:
            log.warning("object WAL: newest object %s has no header: %s", newest.key, error)
            return 0
        if header.start_offset != newest.start or header.trim_offset > header.start_offset:
            log.warning("object WAL: newest object %s has a damaged header %s", newest.key, header)
            return 0
        return header.trim_offset

    async def _read_ahead(
        self, run: list[WalObject]
    ) -> AsyncGenerator[tuple[WalObject, bytes | None]]:
        """The objects of ``run`` in order, fetching up to ``readahead_bytes`` ahead."""
        fetching: collections.deque[tuple[WalObject, asyncio.Task[bytes | None]]] = (
            collections.deque()
        )
        index = 0
        ahead = 0
        try:
            while index < len(run) or fetching:
                while index < len(run) and (
                    not fetching or ahead + run[index].size_bytes <= self._config.readahead_bytes
                ):
                    wal_object = run[index]
                    fetching.append((wal_object, asyncio.create_task(self._fetch(wal_object))))
                    ahead += wal_object.size_bytes
                    index += 1
                wal_object, task = fetching.popleft()
                ahead -= wal_object.size_bytes
                yield wal_object, await task
        finally:
            for _, task in fetching:
                task.cancel()
            await asyncio.gather(*(task for _, task in fetching), return_exceptions=True)

    async def _fetch(self, wal_object: WalObject) -> bytes | None:
        try:
            return await self._store.get(wal_object.key)
        except NotFound:
            log.warning("object WAL: %s vanished during recovery", wal_object.key)
            return None
        except ObjectStoreError as error:
            raise WalIOError(f"reading {wal_object.key}: {error}") from error

    def _records(
        self, wal_object: WalObject, data: bytes | None
    ) -> Iterator[RecoveredRecord | None]:
        """The records of one object, then None if the object is damaged or short."""
        if data is None:
            yield None
            return
        try:
            header = WalObjectHeader.decode(data)
        except FormatError as error:
            log.warning("object WAL recovery stops at %s: %s", wal_object.key, error)
            yield None
            return
        if (
            header.start_offset != wal_object.start
            or header.node_id != self._node_id
            or header.epoch != wal_object.epoch
            or align_up(header.start_offset + header.data_length) != wal_object.end
        ):
            log.warning("object WAL recovery stops at %s: header %s", wal_object.key, header)
            yield None
            return
        view = memoryview(data)[WAL_OBJECT_HEADER_SIZE:]
        available = min(len(view), header.data_length)
        position = 0
        while position < header.data_length:
            record_offset = wal_object.start + position
            try:
                if position + WAL_RECORD_HEADER_SIZE > available:
                    raise FormatError(f"object ends at {available} bytes of records")
                record = decode_wal_record_header(view, position, record_offset)
                body_start = position + WAL_RECORD_HEADER_SIZE
                end = body_start + record.body_length
                if end > available:
                    raise FormatError(f"record runs to {end}, past {available} bytes of records")
                if record.magic != RECORD_MAGIC_PADDING:
                    check_wal_record_body(record, view[body_start:end])
            except FormatError as error:
                log.warning(
                    "object WAL recovery stops at %d in %s: %s",
                    record_offset,
                    wal_object.key,
                    error,
                )
                yield None
                return
            next_offset = wal_object.end if end == header.data_length else wal_object.start + end
            if record.magic != RECORD_MAGIC_PADDING:
                yield RecoveredRecord(record_offset, next_offset, bytes(view[body_start:end]))
            position = end

    async def resume(self) -> None:
        """Accept appends after the objects already there, keeping them: instead of
        :meth:`recover` and :meth:`reset`, for a WAL whose records are read by their offsets
        rather than replayed (a RouterChannel: other nodes may still need what an earlier
        incarnation wrote). The trim offset of the newest object is carried on, so a later
        trim deletes the inherited objects as it deletes its own."""
        if self._state is not _State.OPENED:
            raise WalStateError(f"resume() in state {self._state.value}")
        if self._objects:
            self._trim_offset = await self._newest_trim_offset()
        self._state = _State.READY
        self._processor = asyncio.create_task(self._acknowledge_forever(), name="object-wal")

    async def reset(self) -> None:
        """Discard everything recovery could return (trim to the next offset); then accept
        appends."""
        if self._state is not _State.RECOVERING:
            raise WalStateError(f"reset() needs recover() first; state is {self._state.value}")
        self._state = _State.READY
        self._processor = asyncio.create_task(self._acknowledge_forever(), name="object-wal")
        if self._next_offset > self._trim_offset:
            await self.trim(self._next_offset, seal_now=True)
        else:
            await self._delete_trimmed()

    # ------------------------------------------------------------------ append

    async def append(self, body: Buffer) -> AppendResult:
        """Write one record; return once its object is durable and the reservation checked."""
        return await self.submit(body)

    def submit(self, body: Buffer) -> asyncio.Future[AppendResult]:
        """Queue one record now and return the future of its acknowledgement."""
        if self._state is not _State.READY or self._closing:
            raise self._not_ready("append")
        size = len(body)
        if size == 0:
            raise ValueError("a WAL record body must not be empty")
        if size > self.max_record_bytes:
            raise WalRecordTooLargeError(
                f"WAL record of {size} bytes exceeds the limit of {self.max_record_bytes}"
            )
        record_bytes = WAL_RECORD_HEADER_SIZE + size
        if (
            self._unflushed_bytes
            and self._unflushed_bytes + record_bytes > self._config.max_unflushed_bytes
        ):
            raise WalOverCapacityError(
                f"{self._unflushed_bytes} bytes are not uploaded yet (limit "
                f"{self._config.max_unflushed_bytes}); wait for the uploads"
            )
        return self._add(body, seal_now=False)

    def _add(self, body: Buffer | None, *, seal_now: bool) -> asyncio.Future[AppendResult]:
        loop = asyncio.get_running_loop()
        pending = _Pending(body, loop.create_future())
        record_bytes = pending.record_bytes
        bulk = self._bulk
        if bulk is not None and bulk.data_bytes + record_bytes > DATA_ALIGN_BYTES:
            self._seal()
            bulk = None
        if bulk is None:
            bulk = self._bulk = _Bulk()
            interval = self._config.batch_interval_ms / 1000
            delay = min(max(MIN_LINGER_S, self._last_timer_seal + interval - loop.time()), interval)
            bulk.timer = loop.call_later(delay, self._on_timer, bulk)
        bulk.records.append(pending)
        bulk.data_bytes += record_bytes
        self._unflushed_bytes += record_bytes
        if (
            seal_now
            or self._mode is OpenMode.FAILOVER
            or bulk.data_bytes > self._config.max_bytes_in_batch
        ):
            self._seal()
        return pending.future

    def _on_timer(self, bulk: _Bulk) -> None:
        if self._bulk is bulk:
            self._last_timer_seal = asyncio.get_running_loop().time()
            self._seal()

    def _seal(self) -> None:
        """Lay the open bulk out as an object at the next offset and queue its PUT."""
        bulk = self._bulk
        if bulk is None:
            return
        self._bulk = None
        if bulk.timer is not None:
            bulk.timer.cancel()
        start = self._next_offset
        end = align_up(start + bulk.data_bytes)
        header = WalObjectHeader(
            start, bulk.data_bytes, self._node_id, self._node_epoch, self._trim_offset
        )
        chunks: list[Buffer] = [header.encode()]
        results: list[AppendResult] = []
        position = start
        for index, pending in enumerate(bulk.records):
            if pending.body is None:
                chunks.append(encode_padding_header(position, 0))
            else:
                chunks.append(encode_wal_record_header(pending.body, position))
                chunks.append(pending.body)
            next_position = position + pending.record_bytes
            last = index == len(bulk.records) - 1
            results.append(AppendResult(position, end if last else next_position))
            position = next_position
        self._next_offset = end
        key = wal_object_key(
            self._namespace, self._node_id, self._node_epoch, start, end, self._wal_type
        )
        self._uploads.append(
            _Upload(
                key,
                start,
                end,
                bulk.data_bytes,
                WAL_OBJECT_HEADER_SIZE + bulk.data_bytes,
                bulk.records,
                results,
                chunks,
            )
        )
        self._start_uploads()

    def _start_uploads(self) -> None:
        if self._state is not _State.READY:
            return
        in_flight = sum(1 for u in self._uploads if u.task is not None and not u.landed)
        for upload in self._uploads:
            if in_flight >= self._config.max_inflight_uploads:
                break
            if upload.task is None:
                upload.task = asyncio.create_task(self._upload(upload))
                in_flight += 1

    async def _upload(self, upload: _Upload) -> None:
        pause = self._config.retry_base_s
        while self._state is _State.READY:
            try:
                self.put_count += 1
                await self._store.put(upload.key, upload.chunks)
            except ObjectStoreUnavailable as error:
                if self._closing:
                    self._fail(WalIOError(f"uploading {upload.key} while closing: {error}"))
                    return
                log.warning("object WAL: PUT %s failed, trying again: %s", upload.key, error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._config.retry_max_s)
                continue
            except Exception as error:
                self._fail(WalIOError(f"uploading {upload.key}: {error}"))
                return
            upload.landed = True
            self._wakeup.set()
            self._start_uploads()
            return

    async def _acknowledge_forever(self) -> None:
        """Acknowledge landed objects in order, one verified group at a time."""
        while self._state is _State.READY:
            group: list[_Upload] = []
            for upload in self._uploads:
                if not upload.landed:
                    break
                group.append(upload)
            if not group:
                if self._closing and not self._uploads and self._bulk is None:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            verified = await self._verify()
            if self._state is not _State.READY:
                return
            if not verified:
                self._fence(f"node {self._node_id}'s WAL reservation is no longer this writer's")
                return
            for upload in group:
                self._uploads.popleft()
                self._unflushed_bytes -= upload.data_bytes
                self._confirm_offset = upload.end
                self._objects.append(
                    WalObject(
                        upload.key, self._node_epoch, upload.start, upload.end, upload.size_bytes
                    )
                )
                for pending, result in zip(upload.records, upload.results, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(result)

    async def _verify(self) -> bool:
        """Whether the reservation object still holds this writer's bytes."""
        pause = self._config.retry_base_s
        while self._state is _State.READY:
            try:
                self.verify_count += 1
                return await self._store.get(self._reservation_key) == self._reservation
            except NotFound:
                return False
            except ObjectStoreUnavailable as error:
                if self._closing:
                    self._fail(WalIOError(f"checking the reservation while closing: {error}"))
                    return False
                log.warning("object WAL: reservation check failed, trying again: %s", error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._config.retry_max_s)
            except ObjectStoreError as error:
                self._fail(WalIOError(f"checking the reservation: {error}"))
                return False
        return False

    # ------------------------------------------------------------------ failure

    def _not_ready(self, operation: str) -> WalError:
        if self._failure is not None:
            return type(self._failure)(f"{operation}: {self._failure}")
        if self._closing:
            return WalStateError(f"{operation}() while closing")
        return WalStateError(f"{operation}() in state {self._state.value}")

    def _fence(self, reason: str) -> None:
        log.error("object WAL fenced: %s", reason)
        self._stop(_State.FENCED, WalFencedError(reason))

    def _fail(self, error: WalIOError) -> None:
        if self._state is not _State.READY:
            return
        log.error("object WAL failed: %s", error)
        self._stop(_State.FAILED, error)

    def _stop(self, state: _State, error: WalError) -> None:
        """Fail everything not acknowledged yet; nothing is acknowledged after this."""
        self._state = state
        self._failure = error
        bulk, self._bulk = self._bulk, None
        pending = [p for u in self._uploads for p in u.records]
        if bulk is not None:
            if bulk.timer is not None:
                bulk.timer.cancel()
            pending += bulk.records
        current = asyncio.current_task()
        for upload in self._uploads:
            if upload.task is not None and upload.task is not current:
                upload.task.cancel()
        self._uploads.clear()
        self._unflushed_bytes = 0
        for item in pending:
            if not item.future.done():
                item.future.set_exception(type(error)(str(error)))
        self._wakeup.set()

    # -------------------------------------------------------------------- trim

    async def trim(self, offset: int, *, seal_now: bool = False) -> None:
        """Declare every record that ends at or before ``offset`` dead, durably (an object
        carrying the new trim offset is uploaded and verified), then delete the objects that
        lie wholly below it. ``seal_now`` uploads that object at once instead of batching it."""
        if self._state is not _State.READY or self._closing:
            raise self._not_ready("trim")
        if offset <= self._trim_offset:
            return
        if offset > self._confirm_offset:
            raise ValueError(
                f"trim to {offset} beyond the durable end {self._confirm_offset} of the WAL"
            )
        self._trim_offset = offset
        await self._add(None, seal_now=seal_now)
        await self._delete_trimmed()

    async def _delete_trimmed(self) -> None:
        doomed = [o for o in self._objects[:-1] if o.end <= self._trim_offset]
        if not doomed:
            return
        keys = [o.key for o in doomed]
        failed: set[str] = set()
        try:
            await self._store.delete_many(keys)
        except DeleteManyError as error:
            failed = set(error.failures)
            log.warning("object WAL: %d trimmed objects not deleted yet: %s", len(failed), error)
        except ObjectStoreError as error:
            log.warning("object WAL: trimmed objects not deleted yet: %s", error)
            return
        gone = set(keys) - failed
        self._objects = [o for o in self._objects if o.key not in gone]

    # ------------------------------------------------------------------- close

    async def close(self) -> None:
        """Upload what is queued, acknowledge it, and release the WAL (and an owned store).
        A fenced or failed WAL stays so (its errors keep saying why)."""
        if self._released:
            return
        self._released = True
        try:
            if self._state is _State.READY and not self._closing:
                self._closing = True
                self._seal()
                self._wakeup.set()
            if self._processor is not None:
                await self._processor
        finally:
            self._closing = True
            if self._state in (_State.OPENED, _State.RECOVERING, _State.READY):
                self._state = _State.CLOSED
            tasks = [u.task for u in self._uploads if u.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._owns_store:
                with contextlib.suppress(ObjectStoreError):
                    await self._store.close()


async def _read_reservation(store: ObjectStore, key: str) -> Reservation | None:
    try:
        data = await store.get(key)
    except NotFound:
        return None
    except ObjectStoreError as error:
        raise WalIOError(f"reading the WAL reservation {key}: {error}") from error
    try:
        return Reservation.decode(data)
    except FormatError as error:
        log.warning("object WAL: the reservation at %s does not decode: %s", key, error)
        return None


async def _drop_late_writes(store: ObjectStore, objects: list[WalObject]) -> list[WalObject]:
    """Delete objects of an older epoch that end past the first object of a newer epoch: a
    fenced writer's PUTs that landed after a newer epoch had started. ``objects`` is sorted by
    (epoch, start)."""
    first_start: dict[int, int] = {}
    for wal_object in objects:
        first_start.setdefault(wal_object.epoch, wal_object.start)
    # For each epoch, the lowest offset any newer epoch started at.
    newer_start: dict[int, int | None] = {}
    lowest: int | None = None
    for epoch in sorted(first_start, reverse=True):
        newer_start[epoch] = lowest
        lowest = first_start[epoch] if lowest is None else min(lowest, first_start[epoch])
    dirty = [o for o in objects if (bound := newer_start[o.epoch]) is not None and o.end > bound]
    if not dirty:
        return objects
    log.warning(
        "object WAL: deleting %d objects written by a fenced epoch after a newer one started",
        len(dirty),
    )
    try:
        await store.delete_many(o.key for o in dirty)
    except ObjectStoreError as error:
        log.warning("object WAL: could not delete every late object yet: %s", error)
    gone = {o.key for o in dirty}
    return [o for o in objects if o.key not in gone]
