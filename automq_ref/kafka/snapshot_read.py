"""The proxy's side of snapshot reads: read-only copies of the partitions its mains lead, kept up
with ``AutomqGetPartitionSnapshot`` and the mains' WALs, serving Fetch in the client's zone.

Theory of operation
-------------------
With the zone router on, every broker is the proxy, in its zone, of some brokers of the other
zones (its *mains*: :func:`automq_ref.kafka.zones.proxy_mapping`, recomputed whenever the
registered brokers change). For each main, :class:`MainSubscriber` holds a session with it
(:mod:`automq_ref.kafka.snapshot_sessions` answers): a request at most every millisecond, each
answer long-polled by the main up to 100 ms. An answer brings the partitions' changes (ADD,
PATCH, REMOVE with the leader epoch, log start and end, the data stream) and the main's
confirmed WAL end; the records between the previous end and this one come with the answer
(``confirm_wal_delta_data``) or, when the main's buffer overflowed, are read from the main's WAL
objects read-only (:func:`read_wal_records`: each 64 MiB slot of its object WAL is one object
whose key the reader computes). A record of a partition's data stream goes into that
:class:`SnapshotPartition`'s cache; a link record (data a proxy routed through its
RouterChannel) is resolved by reading the channel (the :class:`LinkResolver`), keeping the
offsets the main assigned.

Each partition is driven by the ConfirmWal machine
(:mod:`automq_ref.state_machines.confirm_wal`, specs/ConfirmWal.tla): the shell asks it for each
step and carries out what the step stands for, as the failover runner does with the Failover
machine. The machine's WAL is the partition's records in the order the proxy learnt them (the
main's events it mirrors, ``Produce``/``AppendLink`` for a link record, ``AppendDirect`` for
data, then ``AdvanceConfirm``, come first, since the proxy learns them only from the answer);
then ``Poll`` and ``ReceiveAnswer``; ``ReplayRecord`` puts a record into the cache (a record
seen again is ``ReplayDuplicate``, which changes nothing); ``ResolveLink`` reads a link's data;
``ApplySnapshot`` raises the end fetches may read up to (waking waiting fetches) once every
record below the main's end is data; ``ServeRead`` is a fetch served from the cache. The
machine's partition offsets are record numbers (the real records cover many offsets each).
With tracing on, every step's state (``tla_state``) is kept as a trace that TLC validates
against the spec; without it, the machine starts afresh once its records are all applied and
its WAL is long, so its state stays small.

Transactions. A copy answers a READ_COMMITTED read as its main would: up to the main's last
stable offset, with the aborted transactions the answered records overlap, from what the
answers tell it of its main's transaction state and, for reads below what they told, from
questions to the main (:mod:`automq_ref.kafka.snapshot_transactions`).

Offsets below a partition's *floor* are read from committed objects, as any reader of the
stream reads them (``S3Storage.read`` over the metadata image): what the partition held when
the proxy first heard of it (the main commits its WAL before a session's first answer), and what
the bounded cache (:data:`CACHE_BYTES`) evicted. A gap the replay could not fill (the WAL
objects unreadable, a block WAL) is filled from committed objects too once they cover it; until
then the proxy asks the main to commit. Nothing is served past what the main had made durable,
so a main's restart takes nothing back that a fetch here returned.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from automq_ref.formats.errors import FormatError
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.stream_record_batch import decode as decode_batch
from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE, WalObjectHeader
from automq_ref.formats.wal_record import (
    RECORD_MAGIC_PADDING,
    WAL_RECORD_HEADER_SIZE,
    check_wal_record_body,
    decode_wal_record_header,
)
from automq_ref.formats.zone_router import LinkRecord, RecordOffset
from automq_ref.io.storage.object_store import ObjectStore, ObjectStoreError
from automq_ref.io.storage.s3stream import OffsetOutOfRangeError, StorageError
from automq_ref.io.storage.wal_object import DATA_ALIGN_BYTES
from automq_ref.kafka.listeners import Connect
from automq_ref.kafka.log_state import cut_at
from automq_ref.kafka.snapshot_sessions import CLEANED_SUFFIX, LOG_STREAM
from automq_ref.kafka.snapshot_transactions import (
    AbortedLookup,
    AbortedQueries,
    CopyTransactions,
)
from automq_ref.protocol.partition_snapshot import (
    MAX_VERSION,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
    PartitionSnapshot,
    SnapshotOperation,
    decode_response_frame,
    encode_request_frame,
)
from automq_ref.state_machines import confirm_wal as cw
from automq_ref.vocabulary.naming import wal_object_key

log = logging.getLogger(__name__)

POLL_SPACING_S: Final = 0.001
RECONNECT_S: Final = 0.5
CACHE_BYTES: Final = 64 * 1024 * 1024  # per proxy, across its snapshot-read partitions
REBASE_RECORDS: Final = 256
FILL_ROUNDS: Final = 8  # gaps filled from committed objects per answer, at most
FILL_BYTES: Final = 8 * 1024 * 1024  # read from committed objects per fill
_LENGTH = struct.Struct(">i")


class LinkResolver(Protocol):
    async def resolve(self, link: LinkRecord) -> bytes: ...


class CommittedReader(Protocol):
    """Reads committed data of any stream (``S3Storage.read``)."""

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]: ...


# ======================================================================== the main's WAL


class WalUnreadableError(Exception):
    """The main's WAL objects could not be read (trimmed, not an object WAL, a store error)."""


async def read_wal_records(
    store: ObjectStore, namespace: str, node_id: int, epoch: int, start: int, end: int
) -> list[StreamRecordBatch]:
    """The records of ``node_id``'s object WAL (written at ``epoch``) from WAL offset ``start``
    up to ``end``, read-only: one GET per 64 MiB slot (each slot is one object)."""
    found: list[StreamRecordBatch] = []
    slot = start // DATA_ALIGN_BYTES * DATA_ALIGN_BYTES
    while slot < end:
        key = wal_object_key(namespace, node_id, epoch, slot, slot + DATA_ALIGN_BYTES)
        try:
            data = await store.get(key)
        except ObjectStoreError as error:
            raise WalUnreadableError(f"{key}: {error}") from error
        try:
            header = WalObjectHeader.decode(data)
            view = memoryview(data)[WAL_OBJECT_HEADER_SIZE:]
            position = 0
            while position < min(header.data_length, len(view)):
                offset = slot + position
                record = decode_wal_record_header(view, position, offset)
                body_end = position + WAL_RECORD_HEADER_SIZE + record.body_length
                body = view[position + WAL_RECORD_HEADER_SIZE : body_end]
                if record.magic != RECORD_MAGIC_PADDING and start <= offset < end:
                    check_wal_record_body(record, body)
                    batch, _ = decode_batch(bytes(body))
                    found.append(batch)
                position = body_end
        except FormatError as error:
            raise WalUnreadableError(f"{key}: {error}") from error
        slot += DATA_ALIGN_BYTES
    return found


def decode_delta(data: bytes) -> list[StreamRecordBatch]:
    """The stream record batches of a ``confirm_wal_delta_data``, in WAL order."""
    found = []
    position = 0
    while position < len(data):
        batch, position = decode_batch(data, position)
        found.append(batch)
    return found


# ================================================================ a snapshot-read partition


@dataclass(slots=True)
class _Cached:
    base: int
    count: int
    payload: bytes | None  # None: a link not resolved yet
    link: LinkRecord | None
    index: int  # the record's number in the machine (its partition offset there)


class SnapshotPartition:
    """A read-only copy of a partition a main leads, readable by Fetch (duck-typed like
    ``automq_ref.kafka.partition.Partition`` for the handler)."""

    def __init__(
        self,
        *,
        topic: str,
        index: int,
        topic_id: uuid.UUID,
        snapshot: PartitionSnapshot,
        sources: frozenset[int],
        committed: CommittedReader,
        resolver: LinkResolver | None,
        record_trace: bool = False,
        trace_path: Path | None = None,
        on_cache_change: Callable[[int], None] = lambda delta: None,
        lookup: AbortedLookup | None = None,
    ) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.epoch = snapshot.leader_epoch
        self.data_stream_id = _data_stream(snapshot)
        start, end = _offsets(snapshot)
        self._log_start = start
        self.transactions = CopyTransactions(f"{topic}-{index}", snapshot, end, lookup)
        self.cleaned = _cleaned(snapshot)  # below its end: the cleaned stream's objects
        self.floor = end  # below: read from committed objects
        self.exposed = end  # fetches read below it
        self.target_end = end  # the main's durable end in its newest answer
        self.bytes_out = 0
        self._committed = committed
        self._resolver = resolver
        self._sources = sources
        self._cache: dict[int, _Cached] = {}
        self._bases: list[int] = []  # sorted cached base offsets
        self.cached_bytes = 0
        self._on_cache_change = on_cache_change
        self.wants_commit = False
        self._appended = asyncio.Event()
        self._lock = asyncio.Lock()
        self._machine = cw.initial_state(sources)
        self.record_trace = record_trace or trace_path is not None
        self._trace_path = trace_path
        self.trace: list[tuple[str, dict[str, object]]] = []
        self.steps: dict[str, int] = {}
        self.served = 0  # fetches answered
        self.served_from_cache = 0
        self.served_from_objects = 0
        if self.record_trace:
            self._record("Init")

    # ------------------------------------------------------------------- the machine

    def _step(self, event: cw.ConfirmWalEvent) -> cw.Response | None:
        transition = cw.step(self._machine, event)
        for effect in transition.effects:
            if isinstance(effect, cw.Rejected):
                raise StorageError(f"{self.topic}-{self.index}: {type(event).__name__}: {effect}")
        self._machine = transition.state
        if self.record_trace:  # tests: the machine's invariants after every step
            cw.check_invariants(self._machine)
        name = type(event).__name__
        self.steps[name] = self.steps.get(name, 0) + 1
        if self.record_trace:
            self._record(name)
        return cw.response_of(transition)

    def _record(self, action: str) -> None:
        state = cw.tla_state(self._machine)
        self.trace.append((action, state))
        if self._trace_path is not None:  # a line a step, readable while the broker runs
            with self._trace_path.open("a") as file:
                file.write(json.dumps({"action": action, "state": state}, sort_keys=True) + "\n")

    def _rebase(self) -> None:
        """Start the machine afresh once all is applied (tracing off): its state stays small."""
        proxy = self._machine.proxy
        wal = self._machine.main.wal
        if self.record_trace or len(wal) < REBASE_RECORDS:
            return
        if proxy.last_replayed != len(wal) or proxy.exposed_end != len(wal):
            return
        self._machine = cw.initial_state(self._sources)
        for cached in self._cache.values():
            cached.index = -1  # served from the cache, no longer the machine's

    # ------------------------------------------------------------------ from answers

    def start_at(self, offset: int) -> None:
        """Before any fetch: the replay begins at ``offset`` (below it: committed objects,
        which the main is asked to upload)."""
        if offset < self.floor:
            self.floor = self.exposed = max(offset, self._log_start)
            self.wants_commit = True

    def update(self, snapshot: PartitionSnapshot) -> None:
        self.epoch = snapshot.leader_epoch
        start, end = _offsets(snapshot)
        self._log_start = start
        self.cleaned = _cleaned(snapshot)
        self.transactions.told(snapshot, start, end, newest=end >= self.target_end)
        self.target_end = max(self.target_end, end)
        if self.exposed >= self.target_end:
            self.transactions.applied()

    async def ingest(self, records: list[StreamRecordBatch]) -> None:
        """Replay the partition's records of one answer (WAL order = offset order) and apply
        what they complete."""
        async with self._lock:
            fresh: list[tuple[StreamRecordBatch, LinkRecord | None]] = []
            for batch in records:
                count = -batch.count if batch.count < 0 else batch.count
                link = LinkRecord.decode(batch.payload) if batch.count < 0 else None
                cached = self._cache.get(batch.base_offset)
                if cached is not None and cached.index >= 0:
                    self._step(cw.ReplayDuplicate(cached.index))
                    continue
                if cached is not None or batch.base_offset + count <= self.exposed:
                    continue  # already served below the applied end
                plain = StreamRecordBatch(
                    batch.stream_id, batch.epoch, batch.base_offset, count, batch.payload
                )
                fresh.append((plain, link))
            await self._replay(fresh)
            await self._apply()

    async def _replay(self, fresh: list[tuple[StreamRecordBatch, LinkRecord | None]]) -> None:
        if not fresh:
            return
        kinds: list[tuple[StreamRecordBatch, LinkRecord | None]] = []
        for batch, link in fresh:
            if link is not None and link.channel_offset.channel_owner in self._sources:
                source = link.channel_offset.channel_owner
                channel_index = self._step(cw.Produce(source, b""))
                assert isinstance(channel_index, int)
                self._step(cw.AppendLink(source, channel_index))
                kinds.append((batch, link))
            else:
                payload = bytes(batch.payload)
                if link is not None:  # a source the machine does not know: read it at once
                    payload = await self._resolve(link)
                self._step(cw.AppendDirect(b""))
                kinds.append(
                    (
                        StreamRecordBatch(
                            batch.stream_id, 0, batch.base_offset, batch.count, payload
                        ),
                        None,
                    )
                )
        length = len(self._machine.main.wal)
        self._step(cw.AdvanceConfirm(length))
        answer = self._step(cw.Poll())
        assert isinstance(answer, cw.PollAnswer)
        if answer.wal_end > self._machine.proxy.target.wal_end:
            self._step(cw.ReceiveAnswer(answer))
        for batch, link in kinds:
            index = self._machine.proxy.last_replayed
            self._step(cw.ReplayRecord())
            data = None if link is not None else bytes(batch.payload)
            self._put(_Cached(batch.base_offset, batch.count, data, link, index))
        for batch, link in kinds:
            if link is not None:
                cached = self._cache[batch.base_offset]
                with contextlib.suppress(Exception):
                    payload = await self._resolve(link)
                    self._step(cw.ResolveLink(cached.index))
                    cached.payload = payload
                    self._account(len(payload))

    async def _retry_link(self, cached: _Cached) -> bool:
        assert cached.link is not None
        try:
            payload = await self._resolve(cached.link)
        except Exception:
            return False
        if cached.index >= 0:
            self._step(cw.ResolveLink(cached.index))
        cached.payload = payload
        self._account(len(payload))
        return True

    async def _resolve(self, link: LinkRecord) -> bytes:
        if self._resolver is None:
            raise StorageError("no link resolver: the zone router's channels are not readable")
        return await self._resolver.resolve(link)

    def _put(self, cached: _Cached) -> None:
        self._cache[cached.base] = cached
        bisect.insort(self._bases, cached.base)
        if cached.payload is not None:
            self._account(len(cached.payload))

    def _account(self, size: int) -> None:
        self.cached_bytes += size
        self._on_cache_change(size)

    async def _fill_from_objects(self, start: int, end: int) -> bool:
        """A gap [start, end) of the replay, filled from committed objects if they hold it."""
        try:
            batches = await self._committed.read(self.data_stream_id, start, end, FILL_BYTES)
        except StorageError:
            return False
        if not batches or batches[0].base_offset > start:
            return False
        await self._replay([(batch, None) for batch in batches if batch.base_offset < end])
        return True

    async def _apply(self) -> None:
        """Apply the newest answer once the cache holds every offset below its end as data
        (filling gaps from committed objects where they hold them)."""
        for _ in range(FILL_ROUNDS):
            cursor = max(self.exposed, self.floor)
            while cursor < self.target_end:
                cached = self._holding(cursor)
                if cached is None:
                    break
                if cached.payload is None and not await self._retry_link(cached):
                    self.wants_commit = True  # a link that does not resolve yet
                    return
                cursor = cached.base + cached.count
            if cursor >= self.target_end:
                self.wants_commit = False
                self._expose(self.target_end)
                return
            gap_end = min(self._next_cached(cursor, self.target_end), self.target_end)
            if not await self._fill_from_objects(cursor, gap_end):
                break
        self.wants_commit = True  # the main's next commit lets the gap be filled

    def _holding(self, offset: int) -> _Cached | None:
        position = bisect.bisect_right(self._bases, offset) - 1
        if position < 0:
            return None
        cached = self._cache[self._bases[position]]
        return cached if offset < cached.base + cached.count else None

    def _expose(self, end: int) -> None:
        """``ApplySnapshot``: fetches may read below ``end``; waiting fetches wake."""
        if end <= self.exposed:
            return
        proxy = self._machine.proxy
        if proxy.target.partition_end > proxy.exposed_end:
            transition = cw.step(self._machine, cw.ApplySnapshot())
            if any(isinstance(effect, cw.Rejected) for effect in transition.effects):
                log.error("%s-%d: the machine refuses ApplySnapshot", self.topic, self.index)
                return
            self._step(cw.ApplySnapshot())
        self.exposed = end
        if end >= self.target_end:
            self.transactions.applied()
        self._appended.set()
        self._appended = asyncio.Event()
        self._rebase()

    def evict(self, keep_bytes: int) -> int:
        """Drop the oldest applied records until at most ``keep_bytes`` are cached; raise the
        floor past them (they are read from committed objects). Returns the bytes freed."""
        freed = 0
        while self._bases and self.cached_bytes > keep_bytes:
            cached = self._cache[self._bases[0]]
            if cached.base + cached.count > self.exposed or cached.payload is None:
                break
            del self._cache[cached.base]
            self._bases.pop(0)
            self.cached_bytes -= len(cached.payload)
            freed += len(cached.payload)
            self.floor = max(self.floor, cached.base + cached.count)
        if freed:
            self.wants_commit = True
            self._on_cache_change(-freed)
        return freed

    def close(self) -> None:
        self._on_cache_change(-self.cached_bytes)
        self.cached_bytes = 0
        self._appended.set()

    # ------------------------------------------------------------- what Fetch reads

    @property
    def high_watermark(self) -> int:
        return self.exposed

    @property
    def log_end_offset(self) -> int:
        return self.exposed

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    def fetch_bounds(self) -> tuple[int, int, int]:
        """(log start offset, high watermark, log end offset), as ``Partition.fetch_bounds``."""
        return self._log_start, self.exposed, self.exposed

    @property
    def last_stable_offset(self) -> int:
        return self.stable_offset(self.exposed)

    def stable_offset(self, high_watermark: int) -> int:
        """The main's LSO for the applied end (``high_watermark``, read just now)."""
        return self.transactions.stable_offset(high_watermark, self._log_start)

    def aborted_held(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]] | None:
        """:meth:`aborted_transactions`'s answer if the copy holds it (no await), else None."""
        return self.transactions.held(fetch_offset, upper_bound)

    async def aborted_transactions(
        self, fetch_offset: int, upper_bound: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the main's aborted transactions a read of
        ``[fetch_offset, upper_bound)`` may meet, as ``Partition.aborted_transactions``."""
        return await self.transactions.aborted(fetch_offset, upper_bound)

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers, from what the copy knows: the
        current epoch ends at the applied end. The copy has no epoch history; for an older
        epoch it answers that epoch with the applied end, which tells a client that nothing it
        read was truncated: true, since only durable records are ever served and none is taken
        back."""
        if leader_epoch >= self.epoch:
            return self.epoch, self.exposed
        return leader_epoch, self.exposed

    async def wait_for_data(self) -> None:
        await self._appended.wait()

    def wake_waiters(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    async def read(
        self, offset: int, max_bytes: int, min_one: bool = True, upper: int | None = None
    ) -> list[bytes | memoryview]:
        """Whole stored batches from the one holding ``offset`` up to the applied end (or
        ``upper`` below it, the LSO of a READ_COMMITTED Fetch), no more than ``max_bytes``
        together (the first even past it with ``min_one``): what the leader returns for the
        same offsets."""
        end = self.exposed if upper is None else min(upper, self.exposed)
        if offset >= end or (max_bytes <= 0 and not min_one):
            return []
        if offset < self._log_start:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.index}: {offset} is below {self._log_start}"
            )
        if not self.served:
            log.info(
                "snapshot read serves %s-%d from offset %d (applied end %d)",
                self.topic,
                self.index,
                offset,
                end,
            )
        self.served += 1
        payloads: list[bytes | memoryview] = []
        size = 0
        cursor = offset
        while cursor < end:
            cleaned = self.cleaned
            if cleaned is not None and cursor < cleaned[1]:
                # Below the cleaned end the leader reads the compacted stream: so does this.
                batches = await self._committed.read(
                    cleaned[0], cursor, min(cleaned[1], end), max(max_bytes - size, 1)
                )
                if not batches:
                    break
                chunk = [(batch.payload, batch.last_offset) for batch in batches]
                self.served_from_objects += len(chunk)
            elif cursor < self.floor or not self._covered(cursor):
                stop = self.floor if cursor < self.floor else self._next_cached(cursor, end)
                batches = await self._committed.read(
                    self.data_stream_id, cursor, min(stop, end), max(max_bytes - size, 1)
                )
                if not batches:
                    self.wants_commit = True  # not in committed objects yet: ask for an upload
                    break
                chunk = [(batch.payload, batch.last_offset) for batch in batches]
                self.served_from_objects += len(chunk)
            else:
                cached = self._holding(cursor)
                assert cached is not None and cached.payload is not None
                if cached.index >= 0 and cached.index < self._machine.proxy.exposed_end:
                    self._step(cw.ServeRead(cached.index))
                self.served_from_cache += 1
                chunk = [(cached.payload, cached.base + cached.count)]
            full = False
            for payload, last in chunk:
                size += len(payload)
                if size > max_bytes and (payloads or not min_one):
                    full = True
                    break
                payloads.append(payload)
                cursor = last
            if full:
                break
        if upper is not None and cursor > upper:
            # A stored record holds one append's batches: the last may hold some past upper.
            return cut_at(payloads, upper)
        return payloads

    def _covered(self, offset: int) -> bool:
        cached = self._holding(offset)
        return cached is not None and cached.payload is not None

    def _next_cached(self, offset: int, end: int) -> int:
        position = bisect.bisect_right(self._bases, offset)
        return self._bases[position] if position < len(self._bases) else end


def _data_stream(snapshot: PartitionSnapshot) -> int:
    metadata = snapshot.log_metadata
    if metadata is not None:
        for name, stream_id in metadata.stream_map:
            if name == LOG_STREAM:
                return stream_id
    if snapshot.stream_metadata:
        return snapshot.stream_metadata[0].stream_id
    raise StorageError(f"partition {snapshot.partition_index}: the snapshot names no data stream")


def _cleaned(snapshot: PartitionSnapshot) -> tuple[int, int] | None:
    """A compacted topic's cleaned stream and where it ends (None: no clean yet)."""
    metadata = snapshot.log_metadata
    if metadata is None:
        return None
    stream = dict(metadata.stream_map).get(LOG_STREAM + CLEANED_SUFFIX)
    if stream is None:
        return None
    for segment in metadata.segments:
        if segment.stream_suffix == CLEANED_SUFFIX:
            return stream, segment.log.end
    return None


def _offsets(snapshot: PartitionSnapshot) -> tuple[int, int]:
    end = snapshot.log_end_offset.message_offset if snapshot.log_end_offset else 0
    start = end
    metadata = snapshot.log_metadata
    if metadata is not None and metadata.segments:
        start = metadata.segments[0].base_offset
    return start, end


# ======================================================================= one main's session


TopicName = Callable[[uuid.UUID], str | None]


class MainSubscriber:
    """The session with one main and the snapshot-read partitions it feeds."""

    def __init__(
        self,
        main: int,
        *,
        address: Callable[[int], tuple[str, int] | None],
        topic_name: TopicName,
        committed: CommittedReader,
        resolver: LinkResolver | None,
        wal_store: Callable[[str], ObjectStore | None],
        namespace: str,
        sources: Callable[[], frozenset[int]],
        node_id: int,
        record_trace: bool = False,
        trace_dir: Path | None = None,
        on_cache_change: Callable[[int], None] = lambda delta: None,
        connect: Connect | None = None,
    ) -> None:
        self.main = main
        self._address = address
        # How to connect to the main (kafka/listeners.py: its inter-broker listener's TLS and
        # SASL); None: plain TCP.
        self._connect = connect
        self._topic_name = topic_name
        self._committed = committed
        self._resolver = resolver
        self._wal_store = wal_store
        self._namespace = namespace
        self._sources = sources
        self._node_id = node_id
        self._record_trace = record_trace
        self._trace_dir = trace_dir
        self._on_cache_change = on_cache_change
        self.partitions: dict[tuple[str, int], SnapshotPartition] = {}
        self._by_stream: dict[int, SnapshotPartition] = {}
        self._session_id = 0
        self._session_epoch = 0
        self._wal_end: int | None = None
        self._wal_config = ""
        self._task: asyncio.Task[None] | None = None
        self.answers = 0
        self.bytes_out = 0  # the polls' frames and the answers', size prefixes included
        self.bytes_in = 0
        self.wal_reads = 0
        self.delta_answers = 0
        self.queries = AbortedQueries(main, address, node_id, connect)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"snapshot read of node {self.main}"
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self.queries.close()
        for partition in self.partitions.values():
            partition.close()
        self.partitions.clear()
        self._by_stream.clear()

    async def _run(self) -> None:
        correlation = 0
        while True:
            address = self._address(self.main)
            if address is None:
                await asyncio.sleep(RECONNECT_S)
                continue
            writer: asyncio.StreamWriter | None = None
            try:
                reader, writer = await (
                    asyncio.open_connection(*address)
                    if self._connect is None
                    else self._connect(*address)
                )
                self._session_id, self._session_epoch = 0, 0
                while True:
                    correlation += 1
                    request = self.next_request()
                    frame = encode_request_frame(
                        request, MAX_VERSION, correlation, f"snapshot-read-{self._node_id}"
                    )
                    writer.write(_LENGTH.pack(len(frame)) + frame)
                    self.bytes_out += 4 + len(frame)
                    await writer.drain()
                    (size,) = _LENGTH.unpack(await reader.readexactly(4))
                    self.bytes_in += 4 + size
                    answered, response = decode_response_frame(
                        await reader.readexactly(size), MAX_VERSION
                    )
                    if answered != correlation:
                        raise ConnectionError(f"answer {answered} to request {correlation}")
                    await self.apply(response)
                    await asyncio.sleep(POLL_SPACING_S)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.info("snapshot read of node %d: %s; reconnecting", self.main, error)
                await asyncio.sleep(RECONNECT_S)
            finally:
                if writer is not None:
                    writer.close()

    def next_request(self) -> GetPartitionSnapshotRequest:
        """The next poll: this session's id and epoch; a commit asked for at a session's start
        and while a partition waits for committed objects."""
        wants = self._session_id == 0 or any(p.wants_commit for p in self.partitions.values())
        return GetPartitionSnapshotRequest(
            self._session_id, self._session_epoch, request_commit=wants
        )

    async def apply(self, response: GetPartitionSnapshotResponse) -> None:
        """One answer: partition changes, then the WAL records since the previous answer."""
        if response.error_code:
            raise ConnectionError(f"the main answered error {response.error_code}")
        self.answers += 1
        # A session's first answer has epoch 1 (a restarted main may reuse an id).
        first = response.session_id != self._session_id or response.session_epoch == 1
        self._session_id, self._session_epoch = response.session_id, response.session_epoch
        if response.confirm_wal_config:
            self._wal_config = response.confirm_wal_config
        end = RecordOffset.decode(response.confirm_wal_end_offset)
        records: list[StreamRecordBatch] = []
        if not first and self._wal_end is not None and end.offset > self._wal_end:
            if response.confirm_wal_delta_data is not None:
                self.delta_answers += 1
                records = decode_delta(response.confirm_wal_delta_data)
            else:
                records = await self._read_wal(end.epoch, self._wal_end, end.offset)
        self._wal_end = end.offset
        # Where each stream's records of this answer begin: a partition added by a later answer
        # (it opened on the main since the previous one) replays them rather than reading them
        # from objects the main may not have committed yet.
        first_base: dict[int, int] = {}
        for batch in records:
            first_base.setdefault(batch.stream_id, batch.base_offset)
        touched: set[tuple[str, int]] = set()
        for topic in response.topics:
            name = self._topic_name(topic.topic_id)
            if name is None:
                continue
            for snapshot in topic.partitions:
                touched.add((name, snapshot.partition_index))
                self._change(name, topic.topic_id, snapshot, None if first else first_base)
        by_partition: dict[tuple[str, int], list[StreamRecordBatch]] = {}
        for batch in records:
            partition = self._by_stream.get(batch.stream_id)
            if partition is not None:
                by_partition.setdefault((partition.topic, partition.index), []).append(batch)
        behind = {key for key, p in self.partitions.items() if p.exposed < p.target_end}
        for key in touched | set(by_partition) | behind:
            partition = self.partitions.get(key)
            if partition is not None:
                await partition.ingest(by_partition.get(key, []))

    def _change(
        self,
        name: str,
        topic_id: uuid.UUID,
        snapshot: PartitionSnapshot,
        first_base: Mapping[int, int] | None,
    ) -> None:
        key = (name, snapshot.partition_index)
        held = self.partitions.get(key)
        if snapshot.operation is SnapshotOperation.REMOVE:
            if held is not None:
                held.close()
                del self.partitions[key]
                self._by_stream.pop(held.data_stream_id, None)
            return
        if held is None or held.data_stream_id != _data_stream(snapshot):
            if held is not None:
                held.close()
                self._by_stream.pop(held.data_stream_id, None)
            held = SnapshotPartition(
                topic=name,
                index=snapshot.partition_index,
                topic_id=topic_id,
                snapshot=snapshot,
                sources=self._sources(),
                committed=self._committed,
                resolver=self._resolver,
                record_trace=self._record_trace,
                trace_path=(
                    None
                    if self._trace_dir is None
                    else self._trace_dir
                    / f"node{self._node_id}-main{self.main}-session{self._session_id}"
                    f"-{name}-{snapshot.partition_index}.ndjson"
                ),
                on_cache_change=self._on_cache_change,
                lookup=self.queries.lookup_for(topic_id, snapshot.partition_index),
            )
            if first_base is not None:
                held.start_at(first_base.get(held.data_stream_id, held.floor))
            self.partitions[key] = held
            self._by_stream[held.data_stream_id] = held
        else:
            held.update(snapshot)

    async def _read_wal(self, epoch: int, start: int, end: int) -> list[StreamRecordBatch]:
        """The main's WAL records in [start, end), read-only from its WAL objects; none when
        they cannot be read (the gap is then filled from committed objects)."""
        store = self._wal_store(self._wal_config)
        if store is None:
            return []
        try:
            if not self.wal_reads:
                log.info(
                    "snapshot read of node %d: reading its WAL objects from %d", self.main, start
                )
            self.wal_reads += 1
            return await read_wal_records(store, self._namespace, self.main, epoch, start, end)
        except WalUnreadableError as error:
            log.info("snapshot read of node %d: WAL unreadable: %s", self.main, error)
            return []


# ============================================================================ the node's part


class SnapshotReads:
    """Every snapshot-read partition of this broker, by main; the mains follow the mapping."""

    def __init__(
        self,
        *,
        node_id: int,
        mains: Callable[[], set[int]],
        subscriber: Callable[[int, Callable[[int], None]], MainSubscriber],
        recheck_s: float = 1.0,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self._node_id = node_id
        self._mains = mains
        self._subscriber = subscriber
        self._recheck_s = recheck_s
        self._cache_bytes = cache_bytes
        self.subscribers: dict[int, MainSubscriber] = {}
        self._task: asyncio.Task[None] | None = None
        self.cached_bytes = 0
        self._gone_bytes = (0, 0)  # out, in of the subscribers closed

    def traffic(self) -> tuple[int, int]:
        """Bytes the subscribers wrote to and read from their mains (in other zones), so far."""
        out, in_ = self._gone_bytes
        for subscriber in self.subscribers.values():
            out, in_ = out + subscriber.bytes_out, in_ + subscriber.bytes_in
        return out, in_

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="snapshot reads")

    async def _follow(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception as error:  # the next round tries again
                log.warning("snapshot reads: %s", error)
            await asyncio.sleep(self._recheck_s)

    async def reconcile(self) -> None:
        wanted = self._mains()
        for main in sorted(set(self.subscribers) - wanted):
            gone = self.subscribers.pop(main)
            out, in_ = self._gone_bytes
            self._gone_bytes = (out + gone.bytes_out, in_ + gone.bytes_in)
            await gone.close()
        for main in sorted(wanted - set(self.subscribers)):
            subscriber = self._subscriber(main, self._cache_changed)
            self.subscribers[main] = subscriber
            subscriber.start()

    def _cache_changed(self, delta: int) -> None:
        self.cached_bytes += delta
        if delta > 0 and self.cached_bytes > self._cache_bytes:
            for subscriber in self.subscribers.values():
                for partition in subscriber.partitions.values():
                    partition.evict(partition.cached_bytes // 2)

    def partition(self, main: int, topic: str, index: int) -> SnapshotPartition | None:
        subscriber = self.subscribers.get(main)
        return None if subscriber is None else subscriber.partitions.get((topic, index))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for subscriber in self.subscribers.values():
            await subscriber.close()
        self.subscribers.clear()


def mains_of(mapping_proxy: Callable[[], Mapping[int, int]], node_id: int) -> set[int]:
    """The mains this node proxies: those whose proxy in its zone is this node."""
    return {main for main, proxy in mapping_proxy().items() if proxy == node_id and main != node_id}
