"""LogCache: durable WAL records in memory, cut into blocks, uploaded and committed in order.

Spec: none yet (the ordering rules below are checked by tests/properties/test_log_cache.py).

Theory of operation
-------------------
Every record the WAL made durable is inserted into the *active block* in WAL completion order,
with the WAL offset after it. A block is *sealed* when it reaches the upload threshold
(``s3.wal.upload.threshold``), when it is older than the upload interval
(``s3.wal.upload.interval.ms``), or when a stream is force-uploaded (close, shutdown). A sealed
block becomes objects in three stages:

1. **prepare**, serial, in block order: ``PrepareObjects(block, count)`` asks the controller for
   object ids, one per stream object plus one for the stream set object. Serial preparation
   makes object ids (and so the stream set objects' order ids) grow with block order.
2. **upload**, in parallel across blocks: ``UploadBlock`` carries the layout: streams whose run in
   the block reaches ``s3.stream.object.split.size`` get a stream object each; the rest share one
   stream set object; a block with a single stream becomes a single stream object.
3. **commit**, serial, in block order: ``CommitBlock(N)`` is emitted only after block N is
   uploaded *and* block N-1 is committed. The controller requires each stream's commit to start
   exactly at its end offset, so committing out of order would be refused (or, worse, leave a
   gap).

Only after block N is committed may the WAL be trimmed, to block N's last WAL offset
(``TrimWal``): everything before it is now in committed objects. Committed blocks stay readable
in memory and are evicted from the head of the FIFO only (the oldest first), when the cache holds
more than its capacity. The machine never evicts a block that is not committed: its data exists
nowhere else but the WAL.

A stream's records arrive contiguous while this broker holds it open. A stream it opens again
at a higher epoch (a partition moved away and back) continues where the other brokers left it:
``StreamReopened`` moves the stream's next offset there, which is accepted only once nothing of
the stream is uncommitted here (closing it uploaded and committed everything) and only forward.

Time arrives as events (``Tick``), I/O results as events (``ObjectsPrepared``,
``BlockUploaded``, ``BlockCommitted``); effects are data.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.state_machines.append_only import AppendOnly
from automq_ref.state_machines.transition import InvariantViolation as InvariantViolation
from automq_ref.state_machines.transition import Rejected as Rejected
from automq_ref.state_machines.transition import Transition as Transition

ALL_STREAMS: Final = -1


class BlockStage(enum.Enum):
    ACTIVE = "active"  # taking records
    SEALED = "sealed"  # waiting for object ids
    PREPARING = "preparing"  # PrepareObjects in flight
    UPLOADING = "uploading"  # UploadBlock in flight
    UPLOADED = "uploaded"  # waiting for its turn to commit
    COMMITTING = "committing"  # CommitBlock in flight
    COMMITTED = "committed"  # in objects; readable here until evicted


@dataclass(frozen=True, slots=True)
class CachedRecord:
    stream_id: int
    base_offset: int
    count: int
    payload: bytes
    wal_next_offset: int

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def size_bytes(self) -> int:
        return len(self.payload)


@dataclass(frozen=True, slots=True)
class StreamRun:
    """One stream's records in a block: contiguous offsets [start_offset, end_offset)."""

    stream_id: int
    start_offset: int
    end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class UploadLayout:
    stream_set_object_id: int  # -1 when every run has its own stream object
    stream_set_runs: tuple[StreamRun, ...]
    stream_objects: tuple[tuple[int, StreamRun], ...]  # (object id, run)


@dataclass(frozen=True, slots=True)
class CacheBlock:
    block_id: int
    created_ms: int
    stage: BlockStage = BlockStage.ACTIVE
    # In WAL completion order, and per stream (in offset order): both grow by one record per
    # append in O(1) (AppendOnly), and reads find a stream's records without a scan.
    records: AppendOnly[CachedRecord] = field(default_factory=AppendOnly)
    by_stream: Mapping[int, AppendOnly[CachedRecord]] = field(default_factory=dict)
    size_bytes: int = 0
    layout: UploadLayout | None = None

    @property
    def wal_end_offset(self) -> int:
        """The WAL offset after the block's last record (records arrive in WAL order)."""
        return self.records[-1].wal_next_offset if self.records else -1

    def runs(self) -> list[StreamRun]:
        """Per stream, in stream id order, the block's contiguous run of offsets."""
        return [
            StreamRun(
                stream_id,
                records[0].base_offset,
                records[-1].end_offset,
                sum(record.size_bytes for record in records),
            )
            for stream_id, records in sorted(self.by_stream.items())
        ]


@dataclass(frozen=True, slots=True)
class LogCacheParams:
    upload_threshold_bytes: int = 500 * 1024 * 1024
    upload_interval_ms: int = 60_000  # -1: size-triggered only
    stream_object_split_bytes: int = 8 * 1024 * 1024
    capacity_bytes: int = 1024 * 1024 * 1024
    max_blocks: int = 64
    # At most this many stream objects per upload (the largest runs win); with the one stream
    # set object, an upload is never more than this + 1 PUTs. Not an AutoMQ setting: see
    # docs/machines/log_cache.md ("How many objects an upload writes").
    max_stream_objects_per_upload: int = 8


@dataclass(frozen=True, slots=True)
class LogCacheState:
    blocks: tuple[CacheBlock, ...] = ()
    next_block_id: int = 0
    # Per stream, the offset the next record must start at (records arrive contiguous).
    stream_ends: dict[int, int] = field(default_factory=dict)
    trimmed_wal_offset: int = -1


# ================================================================================== events


@dataclass(frozen=True, slots=True)
class RecordAppended:
    """The WAL made ``record`` durable (in WAL completion order)."""

    record: CachedRecord
    now_ms: int


@dataclass(frozen=True, slots=True)
class StreamReopened:
    """The stream was opened here at a new epoch, its next offset ``next_offset`` (other
    brokers may have appended to it since this one last did)."""

    stream_id: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class Tick:
    now_ms: int


@dataclass(frozen=True, slots=True)
class ForceUpload:
    stream_id: int  # ALL_STREAMS for everything (shutdown)
    now_ms: int


@dataclass(frozen=True, slots=True)
class ObjectsPrepared:
    block_id: int
    first_object_id: int


@dataclass(frozen=True, slots=True)
class BlockUploaded:
    block_id: int


@dataclass(frozen=True, slots=True)
class BlockCommitted:
    block_id: int


LogCacheEvent: TypeAlias = (
    RecordAppended
    | StreamReopened
    | Tick
    | ForceUpload
    | ObjectsPrepared
    | BlockUploaded
    | BlockCommitted
)

# ================================================================================= effects


@dataclass(frozen=True, slots=True)
class PrepareObjects:
    """Ask the controller for ``count`` object ids; answer with ObjectsPrepared."""

    block_id: int
    count: int


@dataclass(frozen=True, slots=True)
class UploadBlock:
    """Write the block's objects; answer with BlockUploaded once every PUT succeeded."""

    block_id: int
    layout: UploadLayout
    records: Sequence[CachedRecord]


@dataclass(frozen=True, slots=True)
class CommitBlock:
    """CommitStreamSetObject for the block; answer with BlockCommitted. Emitted only once every
    earlier block is committed."""

    block_id: int
    layout: UploadLayout


@dataclass(frozen=True, slots=True)
class TrimWal:
    """Every record up to ``wal_offset`` is in committed objects: the WAL may drop it."""

    wal_offset: int


class LogCacheError(enum.Enum):
    """Why an event is refused: the shell broke its side of the contract (records arrive whole
    and contiguous per stream; an answer names a block that asked for it)."""

    EMPTY_RECORD = "EMPTY_RECORD"  # a record covering no offsets
    DISCONTINUOUS_RECORD = "DISCONTINUOUS_RECORD"  # not at the stream's next offset
    UNKNOWN_BLOCK = "UNKNOWN_BLOCK"
    # A reopen while the stream still has uncommitted records here, or one that goes back.
    STREAM_NOT_SETTLED = "STREAM_NOT_SETTLED"
    WRONG_STAGE = "WRONG_STAGE"  # an answer for a request the block is not waiting on


LogCacheEffect: TypeAlias = (
    PrepareObjects | UploadBlock | CommitBlock | TrimWal | Rejected[LogCacheError]
)
LogCacheTransition: TypeAlias = Transition[LogCacheState, LogCacheEffect]


def step(state: LogCacheState, event: LogCacheEvent, params: LogCacheParams) -> LogCacheTransition:
    """One event. The effects ask for object ids, uploads, commits (only ever in block order)
    and WAL trims (only after the commit of every block up to there); they may run in any order
    but a commit, which the shell executes once the uploads before it are done. A refused event
    is a ``Rejected`` effect and leaves the state as it was."""
    match event:
        case RecordAppended():
            appended = _on_record_appended(state, event, params)
            if isinstance(appended, Rejected):
                return Transition(state, (appended,))
            state = appended
        case StreamReopened():
            reopened = _on_stream_reopened(state, event)
            if isinstance(reopened, Rejected):
                return Transition(state, (reopened,))
            state = reopened
        case Tick():
            state = _seal_active_if(state, lambda block: _is_due(block, event.now_ms, params))
        case ForceUpload():
            state = _seal_active_if(
                state,
                lambda block: event.stream_id == ALL_STREAMS or event.stream_id in block.by_stream,
            )
        case ObjectsPrepared():
            return _on_objects_prepared(state, event, params)
        case BlockUploaded():
            staged = _set_stage(state, event.block_id, BlockStage.UPLOADING, BlockStage.UPLOADED)
            if isinstance(staged, Rejected):
                return Transition(state, (staged,))
            state = staged
        case BlockCommitted():
            return _on_block_committed(state, event, params)
    return _advance(state, params)


def _on_record_appended(
    state: LogCacheState, event: RecordAppended, params: LogCacheParams
) -> LogCacheState | Rejected[LogCacheError]:
    record = event.record
    if record.count <= 0:
        return Rejected(
            LogCacheError.EMPTY_RECORD,
            f"record of stream {record.stream_id} covers {record.count} offsets",
        )
    expected = state.stream_ends.get(record.stream_id)
    if expected is not None and record.base_offset != expected:
        message = f"record starts at {record.base_offset}, expected {expected}"
        return Rejected(LogCacheError.DISCONTINUOUS_RECORD, f"stream {record.stream_id}: {message}")
    blocks = list(state.blocks)
    next_block_id = state.next_block_id
    if not blocks or blocks[-1].stage is not BlockStage.ACTIVE:
        blocks.append(CacheBlock(next_block_id, event.now_ms))
        next_block_id += 1
    active = blocks[-1]
    stream_records = active.by_stream.get(record.stream_id)
    stream_records = (stream_records or AppendOnly()).appended(record)
    active = replace(
        active,
        records=active.records.appended(record),
        by_stream={**active.by_stream, record.stream_id: stream_records},
        size_bytes=active.size_bytes + record.size_bytes,
    )
    if active.size_bytes >= params.upload_threshold_bytes:
        active = replace(active, stage=BlockStage.SEALED)
    blocks[-1] = active
    stream_ends = {**state.stream_ends, record.stream_id: record.end_offset}
    return replace(
        state, blocks=tuple(blocks), next_block_id=next_block_id, stream_ends=stream_ends
    )


def _on_stream_reopened(
    state: LogCacheState, event: StreamReopened
) -> LogCacheState | Rejected[LogCacheError]:
    stream_id = event.stream_id
    expected = state.stream_ends.get(stream_id)
    if expected is None:
        return state
    if event.next_offset < expected:
        message = f"stream {stream_id}: reopened at {event.next_offset}, below its end {expected}"
        return Rejected(LogCacheError.STREAM_NOT_SETTLED, message)
    if any(stream_id in block.by_stream for block in uncommitted_blocks(state)):
        message = f"stream {stream_id}: reopened with uncommitted records"
        return Rejected(LogCacheError.STREAM_NOT_SETTLED, message)
    return replace(state, stream_ends={**state.stream_ends, stream_id: event.next_offset})


def _is_due(block: CacheBlock, now_ms: int, params: LogCacheParams) -> bool:
    """post: implies(__return__, params.upload_interval_ms >= 0)"""
    return params.upload_interval_ms >= 0 and now_ms - block.created_ms >= params.upload_interval_ms


def _seal_active_if(state: LogCacheState, predicate: Callable[[CacheBlock], bool]) -> LogCacheState:
    if not state.blocks or state.blocks[-1].stage is not BlockStage.ACTIVE:
        return state
    active = state.blocks[-1]
    if not active.records or not predicate(active):
        return state
    return replace(state, blocks=(*state.blocks[:-1], replace(active, stage=BlockStage.SEALED)))


def _set_stage(
    state: LogCacheState, block_id: int, expected: BlockStage, stage: BlockStage
) -> LogCacheState | Rejected[LogCacheError]:
    blocks = list(state.blocks)
    for index, block in enumerate(blocks):
        if block.block_id == block_id:
            if block.stage is not expected:
                return Rejected(
                    LogCacheError.WRONG_STAGE,
                    f"block {block_id} is {block.stage.value}, not {expected.value}",
                )
            blocks[index] = replace(block, stage=stage)
            return replace(state, blocks=tuple(blocks))
    return Rejected(LogCacheError.UNKNOWN_BLOCK, f"no block {block_id}")


def plan_layout(block: CacheBlock, first_object_id: int, params: LogCacheParams) -> UploadLayout:
    """AutoMQ's split, capped: one stream alone -> a stream object; otherwise runs of at least
    the split size get their own stream object, but only the ``max_stream_objects_per_upload``
    largest of them (ties: lower stream id first); every other run goes into the one stream set
    object, which takes the first id (stream objects follow in stream id order)."""
    runs = block.runs()
    if len(runs) == 1:
        return UploadLayout(-1, (), ((first_object_id, runs[0]),))
    candidates = [run for run in runs if run.size_bytes >= params.stream_object_split_bytes]
    candidates.sort(key=lambda run: (-run.size_bytes, run.stream_id))
    chosen = {run.stream_id for run in candidates[: params.max_stream_objects_per_upload]}
    own = [run for run in runs if run.stream_id in chosen]
    shared = tuple(run for run in runs if run.stream_id not in chosen)
    next_id = first_object_id + (1 if shared else 0)
    stream_objects = tuple((next_id + index, run) for index, run in enumerate(own))
    return UploadLayout(first_object_id if shared else -1, shared, stream_objects)


def object_count(block: CacheBlock, params: LogCacheParams) -> int:
    layout = plan_layout(block, 0, params)
    return len(layout.stream_objects) + (1 if layout.stream_set_runs else 0)


def _on_objects_prepared(
    state: LogCacheState, event: ObjectsPrepared, params: LogCacheParams
) -> LogCacheTransition:
    blocks = list(state.blocks)
    for index, block in enumerate(blocks):
        if block.block_id == event.block_id:
            if block.stage is not BlockStage.PREPARING:
                message = f"block {block.block_id} did not ask for object ids"
                return Transition(state, (Rejected(LogCacheError.WRONG_STAGE, message),))
            layout = plan_layout(block, event.first_object_id, params)
            blocks[index] = replace(block, stage=BlockStage.UPLOADING, layout=layout)
            upload = UploadBlock(block.block_id, layout, block.records)
            advanced = _advance(replace(state, blocks=tuple(blocks)), params)
            return Transition(advanced.state, (upload, *advanced.effects))
    refused = Rejected(LogCacheError.UNKNOWN_BLOCK, f"no block {event.block_id}")
    return Transition(state, (refused,))


def _on_block_committed(
    state: LogCacheState, event: BlockCommitted, params: LogCacheParams
) -> LogCacheTransition:
    staged = _set_stage(state, event.block_id, BlockStage.COMMITTING, BlockStage.COMMITTED)
    if isinstance(staged, Rejected):
        return Transition(state, (staged,))
    state = staged
    # Commits are serial and in order, so every block up to this one is committed: the WAL up
    # to its last record is no longer needed.
    block = next(b for b in state.blocks if b.block_id == event.block_id)
    trims: tuple[LogCacheEffect, ...] = ()
    if block.wal_end_offset > state.trimmed_wal_offset:
        trims = (TrimWal(block.wal_end_offset),)
        state = replace(state, trimmed_wal_offset=block.wal_end_offset)
    state = _evict(state, params)
    advanced = _advance(state, params)
    return Transition(advanced.state, trims + advanced.effects)


def _evict(state: LogCacheState, params: LogCacheParams) -> LogCacheState:
    blocks = list(state.blocks)
    while (
        blocks
        and blocks[0].stage is BlockStage.COMMITTED
        and (
            sum(block.size_bytes for block in blocks) > params.capacity_bytes
            or len(blocks) > params.max_blocks
        )
    ):
        blocks.pop(0)
    return replace(state, blocks=tuple(blocks))


def _advance(state: LogCacheState, params: LogCacheParams) -> LogCacheTransition:
    """Start whatever may start now: one prepare at a time, in block order; the next commit."""
    blocks = list(state.blocks)
    effects: list[LogCacheEffect] = []
    if not any(block.stage is BlockStage.PREPARING for block in blocks):
        for index, block in enumerate(blocks):
            if block.stage is BlockStage.SEALED:
                blocks[index] = replace(block, stage=BlockStage.PREPARING)
                effects.append(PrepareObjects(block.block_id, object_count(block, params)))
                break
    if not any(block.stage is BlockStage.COMMITTING for block in blocks):
        for index, block in enumerate(blocks):
            if block.stage is BlockStage.COMMITTED:
                continue
            if block.stage is BlockStage.UPLOADED:
                assert block.layout is not None
                blocks[index] = replace(block, stage=BlockStage.COMMITTING)
                effects.append(CommitBlock(block.block_id, block.layout))
            break  # the oldest uncommitted block decides: commits go in block order
    return Transition(replace(state, blocks=tuple(blocks)), tuple(effects))


# ================================================================================== queries


def read(
    state: LogCacheState, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
) -> list[CachedRecord]:
    """Cached records of ``stream_id`` from ``start_offset``: contiguous, whole records, until
    ``end_offset`` or until ``max_bytes`` is spent (the first record always counts). Empty when
    the cache does not hold ``start_offset``: the caller reads that part from objects."""
    found: list[CachedRecord] = []
    cursor = start_offset
    budget = max_bytes
    for block in state.blocks:
        records = block.by_stream.get(stream_id)
        if not records or records[-1].end_offset <= cursor:
            continue
        first = bisect.bisect_right(records, cursor, key=lambda record: record.end_offset)
        for position in range(first, len(records)):
            record = records[position]
            if record.base_offset > cursor or cursor >= end_offset or (found and budget <= 0):
                return _contiguous_from(found, start_offset)
            found.append(record)
            budget -= record.size_bytes
            cursor = record.end_offset
    return _contiguous_from(found, start_offset)


def _contiguous_from(found: list[CachedRecord], start_offset: int) -> list[CachedRecord]:
    """post: not __return__ or __return__[0].base_offset <= start_offset"""
    if found and found[0].base_offset > start_offset:
        return []
    return found


def first_cached_offset(state: LogCacheState, stream_id: int) -> int | None:
    for block in state.blocks:
        records = block.by_stream.get(stream_id)
        if records:
            return records[0].base_offset
    return None


def uncommitted_blocks(state: LogCacheState) -> Sequence[CacheBlock]:
    return [block for block in state.blocks if block.stage is not BlockStage.COMMITTED]


# =============================================================================== invariants


def inv_only_committed_blocks_evicted(state: LogCacheState, wal_durable: Sequence[int]) -> None:
    """Every record the WAL holds past the trim point is still in the cache."""
    cached = {record.wal_next_offset for block in state.blocks for record in block.records}
    for wal_offset in wal_durable:
        if wal_offset > state.trimmed_wal_offset and wal_offset not in cached:
            raise InvariantViolation(f"WAL record ending at {wal_offset} left the cache untrimmed")


def inv_commits_in_block_order(state: LogCacheState) -> None:
    """No block is committed (or committing) while an older one is not committed."""
    seen_uncommitted = False
    for block in state.blocks:
        if block.stage in (BlockStage.COMMITTED, BlockStage.COMMITTING) and seen_uncommitted:
            raise InvariantViolation(f"block {block.block_id} committed out of order")
        if block.stage is not BlockStage.COMMITTED:
            seen_uncommitted = True


def inv_one_prepare_in_flight(state: LogCacheState) -> None:
    preparing = [b.block_id for b in state.blocks if b.stage is BlockStage.PREPARING]
    if len(preparing) > 1:
        raise InvariantViolation(f"several prepares in flight: {preparing}")
