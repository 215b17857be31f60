"""Object compaction's decisions, pure: which stream objects to drop or merge, and what a pass
over a node's stream set objects makes of them.

Uploads only ever add objects: every LogCache block becomes a stream set object (SSO, many
streams' runs) and stream objects (SO, one stream's run each). Compaction keeps their number
bounded without changing what any offset of any stream reads.

Stream objects of one stream (:func:`cleanup_batches`, :func:`plan_stream_object_groups`):

* CLEANUP: objects wholly below the stream's start (``end <= start``) go, in batches of
  ``CLEANUP_BATCH`` (nothing replaces them).
* MINOR / MAJOR merge: offset-contiguous objects are grouped, in offset order, while the group's
  bytes stay within the kind's threshold (a hard limit: the object that would cross it starts
  the next group), its objects within ``MAX_OBJECTS_PER_GROUP``, its multipart parts within
  ``MAX_PARTS`` and its offset span within ``MAX_OFFSET_SPAN``; a group of one object is left
  alone. After a pass two neighbouring groups together exceed the threshold, so a stream keeps
  at most ``2 * live_bytes / threshold + 1`` stream objects of its compacted prefix.

Stream set objects of one node (:func:`plan_stream_set_compaction`): each object's blocks are
filtered (:func:`live_blocks`: blocks of deleted streams and blocks wholly below their stream's
start go). Objects older than the force-split age are *force split*: each stream's contiguous
runs become stream objects (:func:`split_runs`). The rest, newest first and at most
``max_objects`` (and ``cache_bytes`` of live blocks) of them, keeping only objects that share a
stream with another one, are *compacted*: per stream, their blocks in offset order either go
into the one new SSO (COMPACT: one contiguous run within the split size) or each contiguous run
becomes its own stream object (SPLIT: a run larger than the split size, or a stream whose runs
are not contiguous). Objects are dropped from the pass (oldest first) while the new SSO would hold
more than ``MAX_STREAMS_PER_STREAM_SET_OBJECT`` streams or the commit more than
``MAX_STREAM_OBJECTS_PER_COMMIT`` stream objects.

Nothing here reads storage or a clock: objects, their blocks and ``now`` come in as arguments.
The shell is :mod:`automq_ref.io.storage.compaction`.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024

# Stream objects (AutoMQ's StreamObjectCompactor).
CLEANUP_BATCH: Final = 1000
MINOR_GROUP_BYTES: Final = 128 * MIB
MAX_OBJECTS_PER_GROUP: Final = min(5000, 10_000 // 2)
MAX_PARTS: Final = 10_000
PART_BYTES: Final = 16 * MIB
MAX_OFFSET_SPAN: Final = 2**31 - 1

# Stream set objects (AutoMQ's CompactionManager and its broker defaults).
STREAM_SET_MAX_OBJECTS: Final = 500
STREAM_SET_SPLIT_BYTES: Final = 8 * MIB
STREAM_SET_CACHE_BYTES: Final = 200 * MIB
FORCE_SPLIT_MS: Final = 120 * 60_000
MAX_STREAMS_PER_STREAM_SET_OBJECT: Final = 20_000
MAX_STREAM_OBJECTS_PER_COMMIT: Final = 10_000


class StreamObjectCompactionKind(enum.Enum):
    """What a stream-object pass does: CLEANUP only, or CLEANUP then a merge."""

    CLEANUP = "CLEANUP"
    MINOR = "MINOR"
    MAJOR = "MAJOR"


@dataclass(frozen=True, slots=True)
class StreamObjectInfo:
    """A stream object as the image knows it: its offsets and its size in bytes."""

    object_id: int
    start_offset: int
    end_offset: int  # exclusive
    size_bytes: int


def cleanup_batches(
    objects: Iterable[StreamObjectInfo], stream_start: int, batch: int = CLEANUP_BATCH
) -> list[list[int]]:
    """Ids of the objects wholly below ``stream_start``, in offset order, in batches."""
    below = sorted(
        (o for o in objects if o.end_offset <= stream_start), key=lambda o: o.start_offset
    )
    ids = [o.object_id for o in below]
    return [ids[i : i + batch] for i in range(0, len(ids), batch)]


def parts(size_bytes: int, part_bytes: int = PART_BYTES) -> int:
    """Multipart parts an object of ``size_bytes`` counts for in a group."""
    return max(1, math.ceil(size_bytes / part_bytes))


def plan_stream_object_groups(
    objects: Iterable[StreamObjectInfo],
    stream_start: int,
    max_group_bytes: int,
    *,
    max_objects: int = MAX_OBJECTS_PER_GROUP,
    max_parts: int = MAX_PARTS,
    max_span: int = MAX_OFFSET_SPAN,
) -> list[tuple[StreamObjectInfo, ...]]:
    """Groups of two or more offset-contiguous objects above ``stream_start``, each within the
    limits, to be merged into one object each."""
    live = sorted((o for o in objects if o.end_offset > stream_start), key=lambda o: o.start_offset)
    groups: list[tuple[StreamObjectInfo, ...]] = []
    group: list[StreamObjectInfo] = []
    group_bytes = group_parts = 0

    def close() -> None:
        if len(group) > 1:
            groups.append(tuple(group))
        group.clear()

    for info in live:
        size_parts = parts(info.size_bytes)
        fits = (
            group
            and group[-1].end_offset == info.start_offset
            and group_bytes + info.size_bytes <= max_group_bytes
            and len(group) < max_objects
            and group_parts + size_parts <= max_parts
            and info.end_offset - group[0].start_offset <= max_span
        )
        if not fits:
            close()
            group_bytes = group_parts = 0
            if info.size_bytes > max_group_bytes or size_parts > max_parts:
                continue  # too large to merge with anything
        group.append(info)
        group_bytes += info.size_bytes
        group_parts += size_parts
    close()
    return groups


# ------------------------------------------------------------------- stream set objects


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One data block of an object: which stream and offsets it holds, where it lies."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int  # exclusive
    position: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class SetObjectInfo:
    """A committed stream set object of the node, with the blocks it holds."""

    object_id: int
    data_time_ms: int
    blocks: tuple[BlockRef, ...]

    @property
    def streams(self) -> frozenset[int]:
        return frozenset(block.stream_id for block in self.blocks)

    @property
    def size_bytes(self) -> int:
        return sum(block.size_bytes for block in self.blocks)


@dataclass(frozen=True, slots=True)
class Run:
    """Offset-contiguous blocks of one stream, in offset order (possibly from several objects)."""

    stream_id: int
    blocks: tuple[BlockRef, ...]

    @property
    def start_offset(self) -> int:
        return self.blocks[0].start_offset

    @property
    def end_offset(self) -> int:
        return self.blocks[-1].end_offset

    @property
    def size_bytes(self) -> int:
        return sum(block.size_bytes for block in self.blocks)


@dataclass(frozen=True, slots=True)
class CompactPlan:
    """One merge: ``sources`` become one SSO of the ``compact`` runs (none: no SSO) and one
    stream object per ``split`` run."""

    sources: tuple[int, ...]
    compact: tuple[Run, ...]
    split: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class StreamSetPlan:
    """A pass: objects to force split (each on its own), one merge, and whether objects were
    left for another pass (a limit was hit)."""

    force_split: tuple[SetObjectInfo, ...]
    compact: CompactPlan | None
    remaining: bool


def live_blocks(
    blocks: Iterable[BlockRef], stream_starts: Mapping[int, int]
) -> tuple[BlockRef, ...]:
    """The blocks still readable: their stream exists (``stream_starts`` maps each existing
    stream to its start) and they end above its start."""
    return tuple(
        block
        for block in blocks
        if block.stream_id in stream_starts and block.end_offset > stream_starts[block.stream_id]
    )


def split_runs(blocks: Iterable[BlockRef]) -> list[Run]:
    """``blocks`` sorted by (stream, offset) and cut into offset-contiguous runs per stream."""
    ordered = sorted(blocks, key=lambda b: (b.stream_id, b.start_offset))
    runs: list[Run] = []
    current: list[BlockRef] = []
    for block in ordered:
        if current and (
            current[-1].stream_id != block.stream_id or current[-1].end_offset != block.start_offset
        ):
            runs.append(Run(current[0].stream_id, tuple(current)))
            current = []
        current.append(block)
    if current:
        runs.append(Run(current[0].stream_id, tuple(current)))
    return runs


def plan_merge(objects: Sequence[SetObjectInfo], split_bytes: int) -> CompactPlan:
    """What merging ``objects`` makes: per stream, one run within ``split_bytes`` goes into the
    new SSO (COMPACT); otherwise every run of the stream becomes a stream object (SPLIT)."""
    compact: list[Run] = []
    split: list[Run] = []
    runs = split_runs(block for o in objects for block in o.blocks)
    for _, grouped in itertools.groupby(runs, key=lambda r: r.stream_id):
        stream_runs = list(grouped)
        if len(stream_runs) == 1 and stream_runs[0].size_bytes <= split_bytes:
            compact.extend(stream_runs)
        else:
            split.extend(stream_runs)
    return CompactPlan(tuple(o.object_id for o in objects), tuple(compact), tuple(split))


def plan_stream_set_compaction(
    objects: Sequence[SetObjectInfo],
    now_ms: int,
    *,
    force_split_ms: int = FORCE_SPLIT_MS,
    split_bytes: int = STREAM_SET_SPLIT_BYTES,
    max_objects: int = STREAM_SET_MAX_OBJECTS,
    cache_bytes: int = STREAM_SET_CACHE_BYTES,
    max_streams: int = MAX_STREAMS_PER_STREAM_SET_OBJECT,
    max_stream_objects: int = MAX_STREAM_OBJECTS_PER_COMMIT,
) -> StreamSetPlan:
    """A pass over a node's committed SSOs (their blocks already :func:`live_blocks`)."""
    old = tuple(o for o in objects if o.data_time_ms < now_ms - force_split_ms)
    young = sorted(
        (o for o in objects if o.data_time_ms >= now_ms - force_split_ms),
        key=lambda o: (-o.data_time_ms, -o.object_id),
    )
    remaining = False
    chosen: list[SetObjectInfo] = []
    total = 0
    for info in young:
        if len(chosen) >= max_objects or (chosen and total + info.size_bytes > cache_bytes):
            remaining = True
            break
        chosen.append(info)
        total += info.size_bytes
    # Only objects sharing a stream with another candidate gain anything from a merge.
    shared = [
        o
        for o in chosen
        if any(o.streams & other.streams for other in chosen if other is not o)
        or not o.blocks  # nothing live: dropping it is the gain
    ]
    plan: CompactPlan | None = None
    while len(shared) > 1 or (shared and not shared[0].blocks):
        plan = plan_merge(shared, split_bytes)
        if len(plan.compact) <= max_streams and len(plan.split) <= max_stream_objects:
            break
        shared = shared[:-1]  # the oldest goes to a later pass
        remaining = True
        plan = None
    return StreamSetPlan(old, plan, remaining)
