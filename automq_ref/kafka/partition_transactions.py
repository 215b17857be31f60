"""A partition's side of Kafka transactions (KIP-98, with KIP-890's verification): what a
:class:`~automq_ref.kafka.partition.Partition` keeps beside its producer state, and the rules it
applies, which are :mod:`automq_ref.state_machines.transaction_partition`'s.

Per transactional producer id one
:class:`~automq_ref.state_machines.transaction_partition.ProducerTransaction` (its epoch, the
first offset of its open transaction, its verification guard, the last coordinator epoch); the
aborted-transactions index, ``(producer id, first offset, last offset)`` in the order of the
markers that ended them (the last offset is the marker's); and what the last stable offset
(LSO) needs. The state changes only by batches that land in the log, in offset order
(:meth:`PartitionTransactions.add`, called with each transactional batch when the partition
assigns its offsets, and with each batch found when an open scans the log), so what a scan of
the log rebuilds is what the running partition had; a checkpoint carries it too
(:meth:`~PartitionTransactions.rows`, :meth:`~PartitionTransactions.restore`).

The LSO is Kafka's: the first offset of the oldest transaction not yet decided, where a
transaction whose marker is not yet durable (the high watermark has not passed the marker) still
counts as undecided (Kafka's ``unreplicatedTxns``), never above the high watermark, never below
the log start. A READ_COMMITTED Fetch reads up to it (:func:`~automq_ref.kafka.log_state.cut_at`
keeps a stored record holding several batches from handing out those past it).

Expiry (Kafka's ``producer.id.expiration.ms``): :meth:`PartitionTransactions.expire` forgets
every producer id, idempotent or transactional, whose last activity at the partition (its last
batch's or marker's max timestamp, or its last verification) is at least the expiration old,
unless it has a transaction open, as Kafka's ``ProducerStateManager.removeExpiredProducers``.

Guards (KIP-890): a number never handed out before by this partition, so one left for a
verification that lost a race with a marker is never taken for the next one; the partition's
leader epoch, which every open raises, is in its upper bits, so a guard left with an earlier
open of the partition never matches either. Guards are not in the checkpoint (a verification
in flight across a move is void; the producer retries).
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.partition_checkpoint import (
    NO_TIMESTAMP,
    AbortedRow,
    PartitionCheckpoint,
    TransactionRow,
)
from automq_ref.formats.record_batch import RecordBatchView
from automq_ref.kafka.log_state import ProduceResult, Producers
from automq_ref.state_machines import transaction_partition as rules
from automq_ref.state_machines.transaction_partition import (
    NO_EPOCH,
    CompletedTransaction,
    LogTransactions,
    ProducerTransaction,
)

_NONE = ProducerTransaction()


@dataclass(frozen=True, slots=True)
class ProducerDescription:
    """What DescribeProducers answers of one producer id at the partition."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int  # -1 if unknown
    coordinator_epoch: int
    current_txn_start_offset: int  # -1 if no transaction is open


class PartitionTransactions(LogTransactions):
    """The transaction state of one partition (see the module docstring): the log's
    transactions (:class:`~automq_ref.state_machines.transaction_partition.LogTransactions`),
    the guards, each producer's last timestamp and what the LSO needs of recent markers."""

    __slots__ = ("_completing", "_guards", "_timestamps", "_verified_at")

    def __init__(self, leader_epoch: int) -> None:
        super().__init__()
        # (marker offset, first offset) of transactions whose marker may not be durable yet
        self._completing: collections.deque[tuple[int, int]] = collections.deque()
        self._timestamps: dict[int, int] = {}  # producer id -> its last batch's max timestamp
        # producer id -> when its last verification began (what keeps a producer id only
        # verified, no batch landed yet, from expiry, as Kafka's verification state entries)
        self._verified_at: dict[int, int] = {}
        self._guards = itertools.count((max(leader_epoch, 0) << 32) + 1)

    @property
    def unstable(self) -> bool:
        """Whether some transaction holds the LSO below the high watermark (cheap)."""
        return bool(self.open or self._completing)

    # ----------------------------------------------------------------------- verification

    def needs_verification(self, producer_id: int, epoch: int) -> bool:
        return rules.needs_verification(self.entries.get(producer_id, _NONE), epoch)

    def begin_verification(self, producer_id: int, epoch: int, now_ms: int = NO_TIMESTAMP) -> int:
        """The guard a verification of the producer's batch at ``epoch`` leaves (reused while
        no batch of the producer has landed since one was left for that epoch), begun at
        ``now_ms`` (the partition's clock; unknown: the producer id's last activity stays
        what it was)."""
        entry = self.entries.get(producer_id, _NONE)
        after = rules.begin_verification(entry, epoch, next(self._guards))
        self.entries[producer_id] = after
        if now_ms != NO_TIMESTAMP:
            self._verified_at[producer_id] = now_ms
        return after.guard

    # ------------------------------------------------------------------------- appending

    def check(self, views: Sequence[RecordBatchView], guard: int) -> ProduceResult | None:
        """Whether the data batches of one append may land (None) or the refusal: a
        transactional batch by :func:`~automq_ref.state_machines.transaction_partition.
        check_data`; a non-transactional one of a transactional producer id at an older epoch
        than the producer's (``INVALID_PRODUCER_EPOCH``) or while its transaction is open
        (``INVALID_TXN_STATE``, as Kafka)."""
        for view in views:
            producer_id = view.producer_id
            if producer_id < 0:
                continue
            entry = self.entries.get(producer_id)
            epoch = view.producer_epoch
            if view.is_transactional:
                error = rules.check_data(entry or _NONE, epoch, guard)
                if error is not KafkaErrorCode.NONE:
                    return ProduceResult(error, message=_refusal(error, producer_id, epoch, entry))
            elif entry is not None and epoch < entry.epoch:
                return ProduceResult(
                    KafkaErrorCode.INVALID_PRODUCER_EPOCH,
                    message=f"producer {producer_id}: epoch {epoch} < {entry.epoch}",
                )
            elif entry is not None and entry.open:
                return ProduceResult(
                    KafkaErrorCode.INVALID_TXN_STATE,
                    message=f"producer {producer_id}: a non-transactional batch while its "
                    "transaction is open",
                )
        return None

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> KafkaErrorCode:
        entry = self.entries.get(producer_id, _NONE)
        return rules.check_marker(entry, epoch, coordinator_epoch)

    def add(self, view: RecordBatchView) -> CompletedTransaction | None:
        """A transactional batch (data or marker) landed at its base offset (assigned)."""
        completed = super().add(view)
        if view.is_transactional and view.producer_id >= 0:
            self._timestamps[view.producer_id] = view.max_timestamp
            self._verified_at.pop(view.producer_id, None)  # the guard went
        if completed is not None:
            self._completing.append((completed.last_offset, completed.first_offset))
        return completed

    # --------------------------------------------------------------------------- reading

    def stable_offset(self, high_watermark: int, log_start: int) -> int:
        """The LSO for a log whose high watermark is ``high_watermark``."""
        completing = self._completing
        while completing and completing[0][0] < high_watermark:
            completing.popleft()  # its marker is durable
        firsts = itertools.chain(self.open.values(), (first for _, first in completing))
        return max(log_start, min(firsts, default=high_watermark), 0)

    def aborted_between(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of each aborted transaction a read of
        ``[fetch_offset, upper_bound)`` may meet: last offset >= ``fetch_offset``, first
        offset < ``upper_bound`` (Kafka's rule)."""
        return [
            (producer_id, first)
            for producer_id, first, _ in self.aborted_rows(fetch_offset)
            if first < upper_bound
        ]

    def aborted_rows(
        self, start: int, upper_bound: int | None = None, end: int | None = None
    ) -> list[AbortedRow]:
        """The index entries, in index order, with last offset in ``[start, end)`` (no end:
        from ``start`` on) and first offset below ``upper_bound`` (no bound: any): what a
        snapshot-read copy of the partition is sent (:mod:`automq_ref.kafka.snapshot_sessions`)."""
        aborted = self.aborted
        position = bisect.bisect_left(aborted, start, key=_last_offset)
        stop = len(aborted) if end is None else bisect.bisect_left(aborted, end, key=_last_offset)
        rows = aborted[position:stop]
        if upper_bound is None:
            return rows
        return [row for row in rows if row[1] < upper_bound]

    def aborted_end_below(self, end: int) -> int:
        """One past the last offset of the newest index entry that ends below ``end``; 0 when
        none does."""
        position = bisect.bisect_left(self.aborted, end, key=_last_offset)
        return 0 if position == 0 else self.aborted[position - 1][2] + 1

    def cleaned(self, end: int, aborted: Sequence[AbortedRow]) -> None:
        """A clean of the log below ``end`` committed: its aborted-transactions index
        (:attr:`automq_ref.state_machines.compaction.CleanedTransactions.aborted`, what a scan
        of the cleaned log finds) replaces the entries whose marker is below ``end``."""
        position = bisect.bisect_left(self.aborted, end, key=_last_offset)
        self.aborted = [*aborted, *self.aborted[position:]]

    def trim(self, log_start: int) -> None:
        """The log now starts at ``log_start``: index entries wholly below it go."""
        del self.aborted[: bisect.bisect_left(self.aborted, log_start, key=_last_offset)]

    def describe(self, producers: Producers) -> list[ProducerDescription]:
        """Every producer id the partition knows, idempotent or transactional (an expired one
        is known no more: :meth:`expire`)."""
        described = []
        for producer_id in sorted(producers.keys() | self._known()):
            state = producers.get(producer_id)
            entry = self.entries.get(producer_id, _NONE)
            described.append(
                ProducerDescription(
                    producer_id,
                    max(entry.epoch, NO_EPOCH if state is None else state.epoch),
                    -1 if state is None else state.last_sequence,
                    max(
                        self._timestamps.get(producer_id, NO_TIMESTAMP),
                        NO_TIMESTAMP if state is None else state.last_timestamp,
                    ),
                    entry.coordinator_epoch,
                    entry.first_offset,
                )
            )
        return described

    def expire(self, producers: Producers, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget, from ``producers`` (the idempotent producer state) and from the transaction
        state, every producer id last active ``expiration_ms`` or more before ``now_ms`` and
        with no transaction open (Kafka's ``isProducerExpired``: ``currentTimeMs -
        lastTimestamp >= producerIdExpirationMs`` and no ``currentTxnFirstOffset``); the ids
        forgotten, in order. An id's last activity is the latest of its last batch's max
        timestamp (data or marker) and its last verification's time; an id with none known is
        kept (:func:`~automq_ref.kafka.log_state.restore` gives one to every producer a
        checkpoint loads). A producer whose transaction is open is kept however idle: its
        marker, which the coordinator writes however late, must still find the transaction
        (the coordinator aborts it after its timeout); once the marker lands it may go."""
        last: dict[int, int] = {pid: state.last_timestamp for pid, state in producers.items()}
        for times in (self._timestamps, self._verified_at):
            for producer_id, timestamp in times.items():
                last[producer_id] = max(last.get(producer_id, NO_TIMESTAMP), timestamp)
        expired = sorted(
            producer_id
            for producer_id, timestamp in last.items()
            if timestamp != NO_TIMESTAMP
            and now_ms - timestamp >= expiration_ms
            and not self.entries.get(producer_id, _NONE).open
        )
        for producer_id in expired:
            producers.pop(producer_id, None)
            self.entries.pop(producer_id, None)
            self._timestamps.pop(producer_id, None)
            self._verified_at.pop(producer_id, None)
        return expired

    def _known(self) -> set[int]:
        return {producer_id for producer_id, entry in self.entries.items() if entry.epoch >= 0}

    # ------------------------------------------------------------------------ checkpoint

    def rows(self) -> tuple[tuple[TransactionRow, ...], tuple[AbortedRow, ...]]:
        """The state as checkpoint rows (taken when every append is durable: no marker is
        pending then). A producer id only verified, never landed, is left out."""
        transactions = tuple(
            TransactionRow(
                producer_id,
                self.entries[producer_id].epoch,
                self.entries[producer_id].first_offset,
                self.entries[producer_id].coordinator_epoch,
                self._timestamps.get(producer_id, -1),
            )
            for producer_id in sorted(self._known())
        )
        return transactions, tuple(self.aborted)

    def restore_at(self, checkpoint: PartitionCheckpoint, log_start: int, now_ms: int) -> None:
        """Take the state a checkpoint holds, for a log starting at ``log_start``, opened at
        ``now_ms`` (a producer's last timestamp the checkpoint does not hold is taken as that,
        as :func:`~automq_ref.kafka.log_state.restore` does for the idempotent state)."""
        self.restore(checkpoint)
        self._timestamps = {
            row.producer_id: now_ms if row.last_timestamp == NO_TIMESTAMP else row.last_timestamp
            for row in checkpoint.transactions
        }
        self._verified_at.clear()
        self._completing.clear()
        self.trim(log_start)


def _last_offset(row: AbortedRow) -> int:
    return row[2]


def _refusal(
    error: KafkaErrorCode, producer_id: int, epoch: int, entry: ProducerTransaction | None
) -> str:
    if error is KafkaErrorCode.INVALID_PRODUCER_EPOCH and entry is not None:
        return f"producer {producer_id}: epoch {epoch} < {entry.epoch}"
    return (
        f"producer {producer_id}: the transaction at epoch {epoch} is not verified at this "
        "partition (or its verification was overtaken)"
    )
