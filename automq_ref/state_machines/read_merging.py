"""Which ranged reads of objects share one GET: the merge planning of object-store request shaping.

Ranged reads from many callers (stream readers, their readahead, index loads) wait a few
milliseconds in a list; the shell (:mod:`automq_ref.io.storage.shaped_store`) then hands the list
to :func:`plan_merged_reads`, issues one GET per :class:`MergedRead` and gives each caller its own
slice of the answer (:func:`member_slice`). AutoMQ's object storage layer plans its waiting read
tasks the same way.

Theory of operation
-------------------

The reads are taken in (key, start, end) order. Per key, a merged read starts at the first read
and takes each next one while two limits hold for the merged span:

- its length stays at most ``max_merged_bytes`` (AutoMQ: 4 MiB); a read that lies inside the
  span already adds nothing to the GET and always joins, so a single read longer than the limit
  still serves the reads it contains;
- its sparsity, ``1 - unique_bytes / span`` where ``unique_bytes`` is the length of the union of
  the merged reads, stays at most ``max_sparsity`` (AutoMQ: 0.5): a GET may fetch bytes no caller
  asked for (the gap between two reads), but never more of them than of asked-for bytes.

The first read that would break a limit starts the next merged read. Overlapping and duplicate
reads are fine: each caller's range lies inside its merged read's span, so its slice is exactly
the bytes a direct ranged GET of it returns. Every read is in exactly one merged read.

Nothing here does I/O or reads a clock; reads come in as values, merged reads go out as values.
Properties: ``tests/properties/test_read_merging.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024

# AutoMQ's defaults for merged reads.
MAX_MERGED_READ_BYTES: Final = 4 * MIB
MAX_MERGED_READ_SPARSITY: Final = 0.5


@dataclass(frozen=True, slots=True)
class RangeRead:
    """One caller's ranged read: bytes ``[start, end_exclusive)`` of the object ``key``."""

    key: str
    start: int
    end_exclusive: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end_exclusive:
            raise ValueError(
                f"a read needs 0 <= start < end, not [{self.start}, {self.end_exclusive})"
            )


@dataclass(frozen=True, slots=True)
class MergedRead:
    """One GET of ``[start, end_exclusive)`` of ``key``, serving the reads at ``members`` (their
    positions in the planned list, in (start, end) order)."""

    key: str
    start: int
    end_exclusive: int
    members: tuple[int, ...]
    unique_bytes: int

    @property
    def span_bytes(self) -> int:
        return self.end_exclusive - self.start

    @property
    def sparsity(self) -> float:
        return 1 - self.unique_bytes / self.span_bytes


def plan_merged_reads(
    reads: Sequence[RangeRead],
    *,
    max_merged_bytes: int = MAX_MERGED_READ_BYTES,
    max_sparsity: float = MAX_MERGED_READ_SPARSITY,
) -> tuple[MergedRead, ...]:
    """The GETs that serve ``reads``, merged as the module docstring says, in (key, start)
    order."""
    if max_merged_bytes < 1:
        raise ValueError(f"max_merged_bytes must be positive, not {max_merged_bytes}")
    if not 0 <= max_sparsity <= 1:
        raise ValueError(f"max_sparsity must be in [0, 1], not {max_sparsity}")
    order = sorted(
        range(len(reads)), key=lambda i: (reads[i].key, reads[i].start, reads[i].end_exclusive)
    )
    merged: list[MergedRead] = []
    current: MergedRead | None = None
    for index in order:
        read = reads[index]
        if current is not None and can_join(
            current, read, max_merged_bytes=max_merged_bytes, max_sparsity=max_sparsity
        ):
            current = _joined(current, index, read)
            continue
        if current is not None:
            merged.append(current)
        current = MergedRead(read.key, read.start, read.end_exclusive, (index,), _length(read))
    if current is not None:
        merged.append(current)
    return tuple(merged)


def can_join(
    merged: MergedRead,
    read: RangeRead,
    *,
    max_merged_bytes: int = MAX_MERGED_READ_BYTES,
    max_sparsity: float = MAX_MERGED_READ_SPARSITY,
) -> bool:
    """Whether ``read`` (of ``merged``'s object, starting at or after its start) may join
    ``merged``: the grown span within both limits, or ``read`` inside the span already."""
    if read.key != merged.key:
        return False
    grown = _joined(merged, -1, read)
    if grown.end_exclusive > merged.end_exclusive and grown.span_bytes > max_merged_bytes:
        return False
    unasked_bytes = grown.span_bytes - grown.unique_bytes
    return unasked_bytes <= max_sparsity * grown.span_bytes


def member_slice(merged: MergedRead, read: RangeRead) -> slice:
    """Where ``read``'s bytes lie in the answer to ``merged``'s GET."""
    if (
        read.key != merged.key
        or read.start < merged.start
        or read.end_exclusive > merged.end_exclusive
    ):
        raise ValueError(f"{read} is not inside {merged}")
    return slice(read.start - merged.start, read.end_exclusive - merged.start)


def _length(read: RangeRead) -> int:
    return read.end_exclusive - read.start


def _joined(merged: MergedRead, index: int, read: RangeRead) -> MergedRead:
    """``merged`` with ``read`` (at position ``index``) added; the limits are not checked."""
    if read.start < merged.start:
        raise ValueError(f"{read} starts before {merged}: reads join in start order")
    end = max(merged.end_exclusive, read.end_exclusive)
    added = max(0, read.end_exclusive - max(read.start, merged.end_exclusive))
    members = (*merged.members, index)
    return MergedRead(merged.key, merged.start, end, members, merged.unique_bytes + added)
