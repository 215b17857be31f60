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
never survive (:meth:`CleanedTransactions.is_aborted`; Kafka's cleaner discards aborted data)
and do not count as a key's latest record.

Transaction markers (control batches) follow Kafka's cleaner (``LogCleaner.scala``'s
``CleanedTransactionMetadata`` and ``cleanInto``, with KIP-534's delete horizon), decided by
:class:`CleanedTransactions` and :func:`compact_marker`:

* a marker stays as it is while some batch of its transaction stays in the cleaned log (with
  records, or kept empty as its producer's last batch): Kafka never deletes a marker before
  every batch of its transaction is gone;
* the first clean that finds none of its transaction's batches left stamps the marker's batch
  with a delete horizon, ``now + delete.retention.ms`` (Kafka's ``containsMarkerForEmptyTxn``
  reuses the tombstone's horizon); a clean past the horizon (``now > horizon``, as for
  tombstones) removes it. One difference from Kafka: Kafka counts a data batch as left when
  the clean merely *reads* it, so the clean that removes a transaction's last batch keeps its
  marker unstamped and only the next clean stamps it; here a clean knows which batches it
  keeps (the key index is built first), so it stamps in the same clean. Either way the marker
  outlives its data by at least ``delete.retention.ms``, and cleaning twice at the same
  instant gives the same log as cleaning once;
* the marker that is the last batch of a producer the partition still knows is never removed
  (Kafka keeps an active producer's last marker, emptied once past its horizon, when no data
  batch of the producer's latest epoch is left: ``cleanInto``'s ``isBatchLastRecordOfProducer``
  over ``lastRecordsOfActiveProducers``; here whole and whatever its epoch, so a rebuild of
  the producer's state from the cleaned log finds its last epoch and coordinator epoch again);
* the aborted-transactions index of the cleaned range is rebuilt by the clean
  (:attr:`CleanedTransactions.aborted`): an aborted transaction keeps its entry while one of
  its batches is left and loses it in the clean that finds none left, before its marker goes
  (Kafka's cleaned transaction index takes an aborted transaction only when the clean met one
  of its batches). The entry then runs from the first batch left (Kafka keeps the original
  first offset), since that is what a scan of the cleaned log rebuilds
  (:class:`~automq_ref.state_machines.transaction_partition.LogTransactions`).

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
map to themselves; it notes each producer's last batch too, for the markers). A tombstone
goes once ``now`` is *past* its batch's horizon (``now > horizon``, where Kafka says ``>=``):
both keep it at least ``delete.retention.ms``, and this way compacting twice at the same instant
gives the same log as compacting once, even with a retention of 0.

Nothing here reads a clock or storage: time, the batches, the producers' last batches and the
aborted-transactions index come in as arguments. The shell is
:mod:`automq_ref.kafka.compaction`.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from automq_ref.formats.compacted_batch import (
    build_compacted_batch,
    build_empty_batch,
    delete_horizon,
)
from automq_ref.formats.control_batch import batch_marker
from automq_ref.formats.partition_checkpoint import AbortedRow
from automq_ref.formats.record_batch import Record, RecordBatchView

LONG_MAX: Final = 2**63 - 1
NO_OFFSET: Final = -1


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
    offset map, exact here: keys are kept whole, not hashed), and each producer id's last
    batch among them."""

    __slots__ = ("_last_of_producer", "_latest")

    def __init__(self) -> None:
        self._latest: dict[bytes, int] = {}
        # producer id -> (base offset, is a control batch) of its last batch
        self._last_of_producer: dict[int, tuple[int, bool]] = {}

    def add(self, view: RecordBatchView, *, aborted: bool = False) -> None:
        """The next batch of the range, in offset order; ``aborted``: one of an aborted
        transaction (its keys supersede nothing)."""
        if view.producer_id >= 0:
            self._last_of_producer[view.producer_id] = (view.base_offset, view.is_control)
        if view.is_control or aborted:
            return
        for record in view.records():
            if record.key is not None:
                self._latest[record.key] = record.offset  # batches come in offset order

    def latest(self) -> Mapping[bytes, int]:
        return self._latest

    def last_markers(self, known: Collection[int] | None = None) -> frozenset[int]:
        """Base offsets of the markers that are their producer's last batch in the range, for
        the producers in ``known`` (None: all): a clean keeps them (:func:`compact_marker`)."""
        return frozenset(
            offset
            for producer_id, (offset, control) in self._last_of_producer.items()
            if control and (known is None or producer_id in known)
        )


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
    ``aborted``: a batch of an aborted transaction, none of whose records survive. A control
    batch is :func:`compact_marker`'s."""
    if view.is_control:
        raise ValueError("a control batch is compacted by compact_marker")
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


def compact_marker(
    view: RecordBatchView,
    *,
    data_left: bool,
    now_ms: int,
    delete_retention_ms: int,
    keep: bool,
) -> bytes | None:
    """A control batch as the cleaned log holds it (the module docstring's marker rules):
    its own bytes while ``data_left`` (a batch of its transaction stays); with none left,
    stamped with the horizon ``now + delete.retention.ms`` if it has none, dropped once ``now``
    is past its horizon, unless ``keep`` (its producer's last batch). A control batch with no
    record (no marker in it) goes unless ``keep``."""
    if not view.records_count:
        return bytes(view.buffer) if keep else None
    if data_left:
        return bytes(view.buffer)
    header = view.header()
    horizon = delete_horizon(header)
    if horizon is None:
        stamp = now_ms + max(delete_retention_ms, 0)
        return build_compacted_batch(header, view.records(), delete_horizon_ms=stamp)
    if now_ms > horizon and not keep:
        return None
    return bytes(view.buffer)


class CleanedTransactions:
    """What one clean learns of the transactions it rewrites, batch by batch in offset order
    (Kafka's ``CleanedTransactionMetadata``): which data batches are of aborted transactions
    (by the partition's aborted-transactions index), for each producer id whether its
    transaction met so far kept a batch, and the aborted-transactions index of the cleaned
    range (:attr:`aborted`, rows ``(producer id, first offset, marker offset)`` in marker
    order)."""

    __slots__ = ("_open", "_ranges", "aborted")

    def __init__(self, aborted: Iterable[AbortedRow] = ()) -> None:
        self._ranges = aborted_ranges(aborted)
        # producer id -> the first batch its current transaction kept (NO_OFFSET: none yet)
        self._open: dict[int, int] = {}
        self.aborted: list[AbortedRow] = []

    def is_aborted(self, view: RecordBatchView) -> bool:
        """Whether ``view`` is a data batch of an aborted transaction."""
        return in_aborted(view, self._ranges)

    def data(self, view: RecordBatchView, kept: bool) -> None:
        """A data batch went through the clean, ``kept`` in the cleaned log or not."""
        if not view.is_transactional or view.producer_id < 0:
            return
        first = self._open.get(view.producer_id, NO_OFFSET)
        if first == NO_OFFSET and kept:
            first = view.base_offset
        self._open[view.producer_id] = first

    def marker(self, view: RecordBatchView) -> bool:
        """A control batch reached the clean: whether a batch of the transaction it ends was
        kept (then an ABORT keeps its index entry, from the first batch kept)."""
        first = self._open.pop(view.producer_id, NO_OFFSET)
        if first == NO_OFFSET:
            return False
        marker = batch_marker(view)
        if marker is not None and not marker.commit:
            self.aborted.append((view.producer_id, first, view.base_offset))
        return True


def clean_batch(
    view: RecordBatchView,
    latest: Mapping[bytes, int],
    transactions: CleanedTransactions,
    *,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_batches: frozenset[int],
    last_markers: frozenset[int],
) -> bytes | None:
    """The next batch of a clean (in offset order) as the cleaned log holds it, or None
    (dropped): a data batch by :func:`compact_batch`, a control batch by
    :func:`compact_marker`; ``transactions`` follows along."""
    if view.is_control:
        return compact_marker(
            view,
            data_left=transactions.marker(view),
            now_ms=now_ms,
            delete_retention_ms=delete_retention_ms,
            keep=view.base_offset in last_markers,
        )
    out = compact_batch(
        view,
        latest,
        now_ms=now_ms,
        delete_retention_ms=delete_retention_ms,
        keep_if_empty=producer_keeps(view, producer_last_batches),
        aborted=transactions.is_aborted(view),
    )
    transactions.data(view, out is not None)
    return out


@dataclass(frozen=True, slots=True)
class CleanedRange:
    """What one clean of a range leaves: its batches and its aborted-transactions index."""

    batches: list[bytes]
    aborted: list[AbortedRow] = field(default_factory=list)


def clean_range(
    batches: Iterable[RecordBatchView],
    *,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_batches: frozenset[int] = frozenset(),
    aborted: Iterable[AbortedRow] = (),
    known_producers: Collection[int] | None = None,
) -> CleanedRange:
    """One clean of a whole range of batches (in offset order), the range's aborted index
    ``aborted`` and the producer ids the partition knows (None: all, for the markers kept as
    a producer's last batch)."""
    views = list(batches)
    transactions = CleanedTransactions(aborted)
    index = KeyIndex()
    for view in views:
        index.add(view, aborted=transactions.is_aborted(view))
    latest = index.latest()
    last_markers = index.last_markers(known_producers)
    cleaned: list[bytes] = []
    for view in views:
        out = clean_batch(
            view,
            latest,
            transactions,
            now_ms=now_ms,
            delete_retention_ms=delete_retention_ms,
            producer_last_batches=producer_last_batches,
            last_markers=last_markers,
        )
        if out is not None:
            cleaned.append(out)
    return CleanedRange(cleaned, transactions.aborted)


def compact(
    batches: Iterable[RecordBatchView],
    *,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_batches: frozenset[int] = frozenset(),
) -> list[bytes]:
    """One clean of a whole range of batches (in offset order) without aborted transactions:
    the batches the cleaned log holds in their place, in the same order."""
    return clean_range(
        batches,
        now_ms=now_ms,
        delete_retention_ms=delete_retention_ms,
        producer_last_batches=producer_last_batches,
    ).batches
