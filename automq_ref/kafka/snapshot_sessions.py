"""The main's side of snapshot reads: incremental partition-snapshot sessions for its proxies.

With the zone router on, a proxy in another zone serves Fetch for the partitions its main leads
from read-only copies (:mod:`automq_ref.kafka.snapshot_read`). It keeps them up with
``AutomqGetPartitionSnapshot`` requests to the main, which this module answers.

Sessions. A request with session id 0 (or an id or epoch the main does not know: it expired, or
the main restarted) opens a new session; every answer names the session and the epoch the next
request must carry. Each session remembers what it last told its proxy of every partition led
here (leader epoch, log start and end offsets, the stream map), so each answer carries only the
changes: ``ADD`` for a partition it has not described yet, ``PATCH`` for one whose facts moved,
``REMOVE`` for one no longer led here. A session no request touched for
:data:`SESSION_EXPIRY_S` (60 s) is dropped.

The WAL end and the delta data. The storage calls :meth:`SnapshotSessions.on_append` for every
record its WAL made durable, in WAL completion order (after the stream's confirm offset moved),
so when an answer is built (synchronously, nothing else runs meanwhile) the partitions' end
offsets and the WAL end it reports describe the same durable prefix. Each session buffers the
records appended since its previous answer (:class:`WalDelta`, up to
:data:`MAX_DELTA_BYTES`, 32 KiB): while the buffer kept up, the answer carries them
(``confirm_wal_delta_data``, v2) and the proxy needs no read; once it overflowed, the answer
carries no data (null) and the WAL end only, and the proxy reads the WAL objects (or, past them,
committed objects); the buffer then syncs again from the next records.

Transactions. A partition's facts carry its last stable offset at the high watermark they
report (``first_unstable_offset``), so a proxy answers a READ_COMMITTED read what this broker
would. Its aborted-transactions index travels in pieces, never whole: an ADD says where the
newest entry ending below the end it reports ends (``aborted_below``), and each PATCH carries
the entries whose ABORT marker lies in the offsets it adds (from the end the session sent
before to the new one), which the records it describes hold anyway. What a proxy's copy does
not hold (entries ending below the end of the ADD it began with) it asks for when a read needs
it, with ``aborted_queries`` (:meth:`SnapshotSessions.query`): the entries one read's range
overlaps, answered at once from the index.

Long poll. An answer with nothing new waits up to :data:`LONG_POLL_S` (100 ms) and is sent as
soon as the WAL grows. ``request_commit`` makes the main upload its WAL: before the first answer
of a new session (the proxy reads everything below that answer's end from committed objects),
else lazily (a commit that waits up to :data:`LAZY_COMMIT_S` for an upload that happens anyway).
While snapshot reads are on, the node delays its WAL trims 30 s (``S3Storage.wal_trim_delay_s``)
so proxies can still read the objects of records just committed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.zone_router import RecordOffset
from automq_ref.io.clock import Clock
from automq_ref.kafka.partition_transactions import PartitionTransactions
from automq_ref.protocol.partition_snapshot import (
    QUERY_SESSION_ID,
    AbortedAnswer,
    AbortedQuery,
    AbortedRange,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
    LogMetadata,
    LogOffset,
    PartitionSnapshot,
    SegmentMetadata,
    SliceRange,
    SnapshotOperation,
    StreamEnd,
    TopicSnapshot,
)

log = logging.getLogger(__name__)

SESSION_EXPIRY_S: Final = 60.0
LONG_POLL_S: Final = 0.1
LAZY_COMMIT_S: Final = 1.0
MAX_DELTA_BYTES: Final = 32 * 1024
WAL_TRIM_DELAY_S: Final = 30.0
LOG_STREAM: Final = "log"  # the data stream's name in the stream map
CLEANED_SUFFIX: Final = ".cleaned"  # a compacted topic's cleaned stream: "log.cleaned"


class LedPartition(Protocol):
    """What a session reads of a partition led here (``automq_ref.kafka.partition.Partition``)."""

    topic_id: uuid.UUID
    index: int
    epoch: int
    data_stream_id: int
    transactions: PartitionTransactions

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    def stable_offset(self, high_watermark: int) -> int: ...


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What a proxy is told of one partition; a session sends it again when it changes."""

    leader_epoch: int
    log_start: int
    log_end: int  # the end of the durable prefix (the high watermark)
    stable: int  # the last stable offset at log_end
    data_stream_id: int
    # A compacted topic's cleaned stream and where it ends (the log below is read from it).
    cleaned_stream_id: int | None = None
    cleaned_end: int = 0

    def snapshot(
        self,
        index: int,
        operation: SnapshotOperation,
        aborted: tuple[AbortedRange, ...] = (),
        aborted_below: int | None = None,
    ) -> PartitionSnapshot:
        live_start = self.log_start
        segments = []
        stream_map = [(LOG_STREAM, self.data_stream_id)]
        stream_ends = [StreamEnd(self.data_stream_id, self.log_end)]
        if self.cleaned_stream_id is not None:
            live_start = max(self.log_start, self.cleaned_end)
            segments.append(
                SegmentMetadata(
                    base_offset=self.log_start,
                    stream_suffix=CLEANED_SUFFIX,
                    log=SliceRange(self.log_start, live_start),
                )
            )
            stream_map.append((LOG_STREAM + CLEANED_SUFFIX, self.cleaned_stream_id))
            stream_ends.append(StreamEnd(self.cleaned_stream_id, self.cleaned_end))
        segments.append(
            SegmentMetadata(base_offset=live_start, log=SliceRange(live_start, self.log_end))
        )
        return PartitionSnapshot(
            partition_index=index,
            leader_epoch=self.leader_epoch,
            operation=operation,
            log_metadata=LogMetadata(tuple(segments), tuple(stream_map)),
            first_unstable_offset=LogOffset(self.stable),
            log_end_offset=LogOffset(self.log_end),
            stream_metadata=tuple(stream_ends),
            aborted=aborted,
            aborted_below=aborted_below,
        )


def facts_of(partition: LedPartition) -> PartitionFacts | None:
    """The partition's facts now (None: its streams closed meanwhile)."""
    try:
        high_watermark = partition.high_watermark
        return PartitionFacts(
            partition.epoch,
            partition.log_start_offset,
            high_watermark,
            partition.stable_offset(high_watermark),
            partition.data_stream_id,
            getattr(partition, "cleaned_stream_id", None),
            getattr(partition, "cleaned_end", 0),
        )
    except Exception:  # the storage no longer holds its streams (closing, moved)
        return None


PartitionKey = tuple[uuid.UUID, int]


def _ranges(rows: list[tuple[int, int, int]]) -> tuple[AbortedRange, ...]:
    return tuple(AbortedRange(producer_id, first, last) for producer_id, first, last in rows)


def partition_delta(
    sent: Mapping[PartitionKey, PartitionFacts], now: Mapping[PartitionKey, PartitionFacts]
) -> list[tuple[PartitionKey, SnapshotOperation, PartitionFacts]]:
    """The operations that bring a proxy told ``sent`` to ``now``, in key order."""
    changes = []
    for key in sorted(set(sent) | set(now)):
        before, after = sent.get(key), now.get(key)
        if after is None:
            assert before is not None
            changes.append((key, SnapshotOperation.REMOVE, before))
        elif before is None:
            changes.append((key, SnapshotOperation.ADD, after))
        elif before != after:
            changes.append((key, SnapshotOperation.PATCH, after))
    return changes


class WalDelta:
    """A session's records appended since its previous answer, while they fit in
    :data:`MAX_DELTA_BYTES` (*syncing*); once they overflow, the buffer is dropped (*not
    syncing*: the answer carries only the WAL end, the proxy reads the WAL) until the next
    answer, which syncs again from the records appended after it."""

    def __init__(self, *, syncing: bool = False) -> None:
        self.records: collections.deque[tuple[bytes, int, int]] = collections.deque()
        self.size = 0
        self.syncing = syncing
        self.last_end: int | None = None  # the WAL end of the previous answer
        self.latest_end: int | None = None  # the end of the newest record appended

    def on_append(self, encoded: bytes, record_offset: int, next_offset: int) -> None:
        self.latest_end = next_offset
        self.records.append((encoded, record_offset, next_offset))
        self.size += len(encoded)
        if self.size > MAX_DELTA_BYTES:
            self.syncing = False
            self.records.clear()
            self.size = 0

    def has_news(self) -> bool:
        return self.latest_end is not None and (
            self.last_end is None or self.latest_end > self.last_end
        )

    def take(self, wal_end: int) -> tuple[int, bytes | None]:
        """(the WAL end to report, the delta data or None: read the WAL). ``wal_end`` is the
        main's confirmed WAL end now, reported when nothing was buffered."""
        drained = list(self.records)
        self.records.clear()
        self.size = 0
        data: bytes | None = None
        end: int | None = None
        if self.syncing:
            data = b"".join(encoded for encoded, _, _ in drained)
            end = drained[-1][2] if drained else self.last_end
        elif drained:
            # Records arrived since the overflow (or since the session began): from the next
            # answer on, what follows them is sent as data.
            end = drained[-1][2]
            self.syncing = True
        if end is None:
            end = wal_end
        self.last_end = end
        return end, data


@dataclass(slots=True)
class _Session:
    session_id: int
    epoch: int  # the epoch the next request must carry
    last_used_s: float
    sent: dict[PartitionKey, PartitionFacts] = field(default_factory=dict)
    # Syncing from the start: the session and its first answer are made together, so every
    # record after that answer's WAL end is buffered (AutoMQ starts a session not syncing).
    delta: WalDelta = field(default_factory=lambda: WalDelta(syncing=True))
    answers: int = 0


class SnapshotSessions:
    """The main's sessions (one object per broker, with the zone router on).

    ``partitions`` gives the partitions led here now; ``commit`` uploads every record appended
    so far (``S3Storage.commit_appended``, its argument the linger); ``wal_epoch`` and
    ``wal_config`` name this broker's WAL (its node epoch and ``s3.wal.path``) for proxies
    that read its objects."""

    def __init__(
        self,
        *,
        partitions: Callable[[], list[LedPartition]],
        commit: Callable[[float], Awaitable[None]],
        wal_epoch: Callable[[], int],
        wal_config: str,
        clock: Clock,
    ) -> None:
        self._partitions = partitions
        self._commit = commit
        self._wal_epoch = wal_epoch
        self._wal_config = wal_config
        self._clock = clock
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count(1)
        self._wal_end = 0  # the end of the newest durable WAL record seen
        self._changed = asyncio.Event()
        self._lazy_commit: asyncio.Task[None] | None = None
        self.commits_requested = 0
        # AutomqGetPartitionSnapshot frames taken and answered (size prefixes included), the
        # polls of proxies in other zones and the answers (counted by the dispatcher, the handler).
        self.bytes_in = 0
        self.bytes_out = 0

    async def close(self) -> None:
        """Stop answering: sessions dropped, a lazy commit in flight cancelled."""
        self._sessions.clear()
        task, self._lazy_commit = self._lazy_commit, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    # ---------------------------------------------------------------- the storage's listener

    def on_append(self, encoded: bytes, record_offset: int, next_offset: int) -> None:
        self._wal_end = max(self._wal_end, next_offset)
        for session in self._sessions.values():
            session.delta.on_append(encoded, record_offset, next_offset)
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------------- answering

    @property
    def sessions(self) -> Mapping[int, _Session]:
        return self._sessions

    def _expire(self, now_s: float) -> None:
        for session_id in [
            s.session_id
            for s in self._sessions.values()
            if now_s - s.last_used_s > SESSION_EXPIRY_S
        ]:
            log.info("snapshot session %d expired", session_id)
            del self._sessions[session_id]

    def _current(
        self, led: dict[PartitionKey, LedPartition] | None = None
    ) -> dict[PartitionKey, PartitionFacts]:
        """The facts of every partition led here now (``led`` learns the partitions)."""
        now = {}
        for partition in self._partitions():
            key = (partition.topic_id, partition.index)
            facts = facts_of(partition)
            if facts is not None:
                now[key] = facts
                if led is not None:
                    led[key] = partition
        return now

    def query(self, queries: tuple[AbortedQuery, ...]) -> tuple[AbortedAnswer, ...]:
        """Each query's entries of the aborted-transactions index, from the partition's index
        now (only entries below its high watermark: their markers are durable)."""
        led = {(p.topic_id, p.index): p for p in self._partitions()}
        answers = []
        for query in queries:
            partition = led.get((query.topic_id, query.partition_index))
            if partition is None:
                code = KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value
                answers.append(AbortedAnswer(query.topic_id, query.partition_index, code))
                continue
            rows = partition.transactions.aborted_rows(
                query.start_offset,
                query.upper_offset,
                min(query.end_offset, partition.high_watermark),
            )
            answers.append(AbortedAnswer(query.topic_id, query.partition_index, 0, _ranges(rows)))
        return tuple(answers)

    async def handle(
        self, request: GetPartitionSnapshotRequest, version: int
    ) -> GetPartitionSnapshotResponse:
        if request.session_id == QUERY_SESSION_ID:  # a query alone: no session, no wait
            return GetPartitionSnapshotResponse(
                session_id=QUERY_SESSION_ID, aborted_answers=self.query(request.aborted_queries)
            )
        now_s = self._clock.monotonic_s()
        self._expire(now_s)
        session = self._sessions.get(request.session_id)
        new = session is None or session.epoch != request.session_epoch
        if session is None or new:
            session = _Session(next(self._ids), 0, now_s)
            self._sessions[session.session_id] = session
        session.last_used_s = now_s
        if not new:
            deadline = now_s + LONG_POLL_S
            while not (session.delta.has_news() or partition_delta(session.sent, self._current())):
                remaining = deadline - self._clock.monotonic_s()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    break
                if session.session_id not in self._sessions:
                    break
        response = self._answer(session, version, first=new)
        if request.aborted_queries:
            response = dataclasses.replace(
                response, aborted_answers=self.query(request.aborted_queries)
            )
        if request.request_commit:
            self.commits_requested += 1
            if new:
                # Everything below this answer's end goes to objects before it is sent: the
                # proxy reads what it has not seen from committed objects.
                await self._run_commit(0.0)
            elif self._lazy_commit is None or self._lazy_commit.done():
                self._lazy_commit = asyncio.get_running_loop().create_task(
                    self._run_commit(LAZY_COMMIT_S)
                )
        return response

    async def _run_commit(self, linger_s: float) -> None:
        try:
            await self._commit(linger_s)
        except Exception as error:  # the proxy asks again; the storage reports its failure
            log.warning("snapshot read commit failed: %s", error)

    def _answer(
        self, session: _Session, version: int, *, first: bool
    ) -> GetPartitionSnapshotResponse:
        """Built without awaiting: the offsets and the WAL end describe one durable prefix."""
        led: dict[PartitionKey, LedPartition] = {}
        current = self._current(led)
        topics: dict[uuid.UUID, list[PartitionSnapshot]] = {}
        for key, operation, facts in partition_delta(session.sent, current):
            topic_id, index = key
            aborted: tuple[AbortedRange, ...] = ()
            below = None
            if operation is SnapshotOperation.ADD:
                below = led[key].transactions.aborted_end_below(facts.log_end)
            elif operation is SnapshotOperation.PATCH:
                # The entries whose markers lie in the offsets this answer adds.
                rows = led[key].transactions.aborted_rows(
                    session.sent[key].log_end, end=facts.log_end
                )
                aborted = _ranges(rows)
            topics.setdefault(topic_id, []).append(facts.snapshot(index, operation, aborted, below))
        session.sent = current
        wal_end, data = session.delta.take(self._wal_end)
        session.epoch += 1
        session.answers += 1
        return GetPartitionSnapshotResponse(
            session_id=session.session_id,
            session_epoch=session.epoch,
            topics=tuple(
                TopicSnapshot(topic_id, tuple(partitions))
                for topic_id, partitions in sorted(topics.items())
            ),
            confirm_wal_end_offset=RecordOffset(self._wal_epoch(), wal_end, 0).encode(),
            confirm_wal_config=self._wal_config if first else "",
            confirm_wal_delta_data=data if version >= 2 else None,
        )
