"""Log compaction's decisions, pure: when a partition is due a clean, how far a clean may reach,
and what each batch becomes.

A topic with ``cleanup.policy=compact`` keeps, for every key, at least its last record. A clean
rewrites the partition's log from its start to a *clean end* (Kafka's first uncleanable offset):
for every key only the record with the highest offset in that range stays; records without a key
go (produce refuses them on a compacted topic, but a topic may have been made compacted later);
a tombstone (a key with a null value) stays at least ``delete.retention.ms`` after the clean
that first kept it, then goes. Offsets never change: a batch keeps its base offset and
lastOffsetDelta however few records it keeps (:mod:`automq_ref.formats.compacted_batch`), and a
batch that keeps none is dropped, unless it is the last batch of an idempotent producer: then an
empty batch stays, so the producer's last sequence and epoch survive a restart (as Kafka's
cleaner does). Transactions: a clean never reaches past the last stable offset (the shell
passes it as the end), so every transaction it meets is decided; the records of an aborted one
never survive (:func:`in_aborted`; Kafka's cleaner discards aborted data) and do not count as a
key's latest record. Control batches (transaction markers) are all kept as they are, however
old (Kafka's cleaner drops a marker once its transaction's data is gone and its horizon passed;
keeping it is safe, only larger).

When a clean is due (:func:`plan_clean`), as in Kafka's cleaner manager:

* the *dirty* part is the log from the end of the last clean (the cleaned end) on; the part of it
  a clean may reach ends at the high watermark or, with ``min.compaction.lag.ms > 0``, at the
  first batch whose max timestamp is younger than that lag, whichever comes first. There are no
  segments here, so no active segment is held back: a batch may be compacted as soon as it is
  durable (with a lag of 0);
* a clean is due when the cleanable dirty bytes are a larger share of the clean and cleanable
  bytes than ``min.cleanable.dirty.ratio``, or when some cleanable dirty batch is older than
  ``max.compaction.lag.ms`` (by its max timestamp; Kafka takes each dirty segment's first batch).

Which records survive (:func:`compact_batch`) needs the key -> highest offset map of the range
(:class:`KeyIndex`, built over every batch of the range first: the cleaned part holds each key at
most once, so this is Kafka's map of the dirty part, plus keys only the cleaned part holds, which
map to themselves). A tombstone goes once ``now`` is *past* its batch's horizon (``now >
horizon``, where Kafka says ``>=``): both keep it at least ``delete.retention.ms``, and this way
compacting twice at the same instant gives the same log as compacting once, even with a
retention of 0.

Nothing here reads a clock or storage: time, the batches and the producers' last batches come in
as arguments. The shell is :mod:`automq_ref.kafka.compaction`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.compacted_batch import (
    build_compacted_batch,
    build_empty_batch,
    delete_horizon,
)
from automq_ref.formats.record_batch import Record, RecordBatchView

LONG_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """A topic's compaction configs, Kafka's defaults."""

    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """What the partition's batch index knows of one batch."""

    base_offset: int
    end_offset: int  # exclusive
    max_timestamp: int
    size_bytes: int


def cleanable_end(
    dirty: Sequence[BatchSpan], high_watermark: int, now_ms: int, config: CleanerConfig
) -> int:
    """Where a clean must stop: the high watermark, or the first dirty batch younger than
    ``min.compaction.lag.ms``."""
    lag = max(config.min_compaction_lag_ms, 0)
    if lag > 0:
        for span in dirty:
            if span.max_timestamp > now_ms - lag:
                return min(span.base_offset, high_watermark)
    return high_watermark


def plan_clean(
    batches: Sequence[BatchSpan],
    log_start: int,
    cleaned_end: int,
    high_watermark: int,
    now_ms: int,
    config: CleanerConfig,
) -> int | None:
    """The offset a clean should reach now, or None when none is due. ``batches`` is the
    partition's index in offset order, ``cleaned_end`` where the last clean stopped (the log
    start if none ran)."""
    dirty_start = max(cleaned_end, log_start)
    clean_bytes = sum(
        span.size_bytes
        for span in batches
        if span.end_offset > log_start and span.base_offset < dirty_start
    )
    dirty = [span for span in batches if span.base_offset >= dirty_start]
    end = cleanable_end(dirty, high_watermark, now_ms, config)
    cleanable = [span for span in dirty if span.end_offset <= end]
    cleanable_bytes = sum(span.size_bytes for span in cleanable)
    if cleanable_bytes == 0:
        return None
    ratio = cleanable_bytes / (clean_bytes + cleanable_bytes)
    max_lag = max(config.max_compaction_lag_ms, 0)
    stamped = [span.max_timestamp for span in cleanable if span.max_timestamp > 0]
    overdue = bool(stamped) and min(stamped) < now_ms - max_lag
    if overdue or ratio > config.min_cleanable_dirty_ratio:
        return end
    return None


class KeyIndex:
    """Key -> the highest offset holding it, over the batches :meth:`add` was given (Kafka's
    offset map, exact here: keys are kept whole, not hashed)."""

    __slots__ = ("_latest",)

    def __init__(self) -> None:
        self._latest: dict[bytes, int] = {}

    def add(self, view: RecordBatchView) -> None:
        if view.is_control:
            return
        for record in view.records():
            if record.key is not None:
                self._latest[record.key] = record.offset  # batches come in offset order

    def latest(self) -> Mapping[bytes, int]:
        return self._latest


# producer id -> (first offset, last offset) of its aborted transactions, in offset order
AbortedRanges = Mapping[int, Sequence[tuple[int, int]]]


def aborted_ranges(aborted: Iterable[tuple[int, int, int]]) -> dict[int, list[tuple[int, int]]]:
    """The aborted-transactions index ``(producer id, first offset, last offset)``, in offset
    order, by producer id."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in aborted:
        ranges.setdefault(producer_id, []).append((first, last))
    return ranges


def in_aborted(view: RecordBatchView, aborted: AbortedRanges) -> bool:
    """Whether ``view`` is a data batch of an aborted transaction."""
    if not view.is_transactional or view.is_control:
        return False
    ranges = aborted.get(view.producer_id)
    if not ranges:
        return False
    offset = view.base_offset
    position = bisect.bisect_right(ranges, offset, key=lambda span: span[0]) - 1
    return position >= 0 and ranges[position][1] >= offset


def survives(record: Record, latest: Mapping[bytes, int], horizon: int | None, now_ms: int) -> bool:
    """Whether a clean keeps ``record``: it has a key, no later record has that key, and it is
    not a tombstone whose batch's horizon has passed."""
    if record.key is None:
        return False
    if latest.get(record.key, record.offset) > record.offset:
        return False
    return not (record.value is None and horizon is not None and now_ms > horizon)


def compact_batch(
    view: RecordBatchView,
    latest: Mapping[bytes, int],
    *,
    now_ms: int,
    delete_retention_ms: int,
    keep_if_empty: bool,
    aborted: bool = False,
) -> bytes | None:
    """The batch as the cleaned log holds it: its own bytes when every record stays and no
    tombstone needs a horizon; rebuilt with the survivors (a tombstone among them stamps the
    batch's horizon, ``now + delete.retention.ms``, unless it has one); an empty batch when
    none survives but ``keep_if_empty`` (its producer's last batch); else None (dropped).
    ``aborted``: a batch of an aborted transaction, none of whose records survive."""
    if view.is_control:
        return bytes(view.buffer)
    header = view.header()
    horizon = delete_horizon(header)
    records = view.records()
    kept = (
        []
        if aborted
        else [record for record in records if survives(record, latest, horizon, now_ms)]
    )
    if not kept:
        if not keep_if_empty:
            return None
        if not records:
            return bytes(view.buffer)  # already the empty batch
        return build_empty_batch(header)
    stamp = horizon
    if stamp is None and any(record.value is None for record in kept):
        stamp = now_ms + max(delete_retention_ms, 0)
    if len(kept) == len(records) and stamp == horizon:
        return bytes(view.buffer)
    return build_compacted_batch(header, kept, delete_horizon_ms=stamp)


def producer_keeps(view: RecordBatchView, producer_last_batches: frozenset[int]) -> bool:
    """Whether the batch is some idempotent producer's last (by base offset): its header must
    stay even when its records go."""
    return view.producer_id >= 0 and view.base_offset in producer_last_batches


def compact(
    batches: Iterable[RecordBatchView],
    *,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_batches: frozenset[int] = frozenset(),
) -> list[bytes]:
    """One clean of a whole range of batches (in offset order): the batches the cleaned log
    holds in their place, in the same order."""
    views = list(batches)
    index = KeyIndex()
    for view in views:
        index.add(view)
    latest = index.latest()
    cleaned: list[bytes] = []
    for view in views:
        out = compact_batch(
            view,
            latest,
            now_ms=now_ms,
            delete_retention_ms=delete_retention_ms,
            keep_if_empty=producer_keeps(view, producer_last_batches),
        )
        if out is not None:
            cleaned.append(out)
    return cleaned
