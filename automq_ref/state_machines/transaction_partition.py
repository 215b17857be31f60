"""A partition's side of transactions: per producer id, the epoch it last accepted, the
transaction open at the partition, and the verification guard (KIP-890 part 1). Pure; the
partition's transaction state (:mod:`automq_ref.kafka.partition_transactions`) keeps one
:class:`ProducerTransaction` per producer id. Spec: ``specs/Transaction.tla`` (the variables
``partitionEpoch``, ``openTxn`` and ``verified``; the actions ``AddPartitionsToTxnVerify``,
``Produce`` and ``MarkerWritten``).

- A transactional batch with an older epoch than the producer's is refused
  (``INVALID_PRODUCER_EPOCH``).
- The first transactional batch of a transaction at the partition (none is open) must be
  verified: the partition leaves a guard (:func:`begin_verification`) and asks the
  coordinator whether the partition is in the producer's ongoing transaction at that epoch
  (AddPartitionsToTxn, verify only); the batch lands only if the guard is still the one it
  left (:func:`check_data`), else ``INVALID_TXN_STATE``. Any batch of the producer that lands
  (data or marker) clears the guard, so a verification that raced a marker is void.
- A marker (control batch) ends the open transaction, at an epoch no older than the
  producer's (``INVALID_PRODUCER_EPOCH``) and from a coordinator epoch no older than the last
  one seen (``TRANSACTION_COORDINATOR_FENCED``); an abort of a transaction with data yields
  the aborted-transaction index entry's offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.control_batch import batch_marker
from automq_ref.formats.partition_checkpoint import AbortedRow, PartitionCheckpoint
from automq_ref.formats.record_batch import RecordBatchView

NO_EPOCH: Final = -1
NO_OFFSET: Final = -1
NO_GUARD: Final = 0


@dataclass(frozen=True, slots=True)
class ProducerTransaction:
    """One producer id's transaction state at one partition."""

    epoch: int = NO_EPOCH  # the epoch last accepted (the spec's partitionEpoch)
    first_offset: int = NO_OFFSET  # the open transaction's first offset (the spec's openTxn)
    guard: int = NO_GUARD  # the verification guard left (the spec's verified, with ...)
    guard_epoch: int = NO_EPOCH  # ... the epoch it was left for
    coordinator_epoch: int = -1

    @property
    def open(self) -> bool:
        return self.first_offset != NO_OFFSET


@dataclass(frozen=True, slots=True)
class CompletedTransaction:
    """A transaction a marker ended at the partition: ``[first_offset, last_offset]``, the
    last being the marker's offset."""

    first_offset: int
    last_offset: int
    aborted: bool


def needs_verification(entry: ProducerTransaction, epoch: int) -> bool:
    """Whether a transactional batch at ``epoch`` must be verified before it lands: it would
    begin a transaction here (none is open) and its epoch is not refused outright."""
    return not entry.open and epoch >= entry.epoch


def begin_verification(entry: ProducerTransaction, epoch: int, guard: int) -> ProducerTransaction:
    """A guard left for a batch at ``epoch``, before the coordinator is asked: the one already
    left for that epoch, which no batch has cleared since (verifications of one transaction's
    first writes share it, as Kafka's share its verification state entry), else ``guard`` (a
    number the partition never used before)."""
    if guard == NO_GUARD:
        raise ValueError("a guard is a number other than 0")
    if entry.guard != NO_GUARD and entry.guard_epoch == epoch:
        return entry
    return replace(entry, guard=guard, guard_epoch=epoch)


def check_data(
    entry: ProducerTransaction, epoch: int, guard: int, verify: bool = True
) -> KafkaErrorCode:
    """Whether a transactional data batch at ``epoch``, verified under ``guard`` (NO_GUARD:
    not verified), may land. ``verify=False`` is the spec's NoVerify mutation (tests only)."""
    if epoch < entry.epoch:
        return KafkaErrorCode.INVALID_PRODUCER_EPOCH
    if entry.open or not verify:
        return KafkaErrorCode.NONE
    if guard == NO_GUARD or guard != entry.guard or entry.guard_epoch != epoch:
        return KafkaErrorCode.INVALID_TXN_STATE
    return KafkaErrorCode.NONE


def append_data(entry: ProducerTransaction, epoch: int, base_offset: int) -> ProducerTransaction:
    """A transactional data batch landed at ``base_offset``: it opens a transaction if none is
    open; the guard goes."""
    if entry.open:
        return replace(entry, epoch=epoch, guard=NO_GUARD, guard_epoch=NO_EPOCH)
    return ProducerTransaction(epoch, base_offset, coordinator_epoch=entry.coordinator_epoch)


def check_marker(entry: ProducerTransaction, epoch: int, coordinator_epoch: int) -> KafkaErrorCode:
    if coordinator_epoch < entry.coordinator_epoch:
        return KafkaErrorCode.TRANSACTION_COORDINATOR_FENCED
    if epoch < entry.epoch:
        return KafkaErrorCode.INVALID_PRODUCER_EPOCH
    return KafkaErrorCode.NONE


def append_marker(
    entry: ProducerTransaction, epoch: int, coordinator_epoch: int, offset: int, commit: bool
) -> tuple[ProducerTransaction, CompletedTransaction | None]:
    """A marker landed at ``offset`` (check it with :func:`check_marker` first): the open
    transaction, if any, ends; the producer's epoch is the marker's; the guard goes."""
    completed = CompletedTransaction(entry.first_offset, offset, not commit) if entry.open else None
    after = ProducerTransaction(max(entry.epoch, epoch), coordinator_epoch=coordinator_epoch)
    return after, completed


# ------------------------------------------------------------------------- a log replayed


class LogTransactions:
    """What a partition's log says of its transactions, taken batch by batch in offset order
    through the rules above: per producer id its :class:`ProducerTransaction`, the first offset
    of each open transaction, and the aborted-transactions index ``(producer id, first offset,
    marker offset)`` in marker order. The running partition keeps one (with what only it needs:
    :class:`automq_ref.kafka.partition_transactions.PartitionTransactions`), and so does the
    ``automq-objects`` Spark source, which rebuilds a partition's state from its objects as the
    partition does when it opens: from its last checkpoint, then every batch after it."""

    __slots__ = ("aborted", "entries", "open")

    def __init__(self) -> None:
        self.entries: dict[int, ProducerTransaction] = {}
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedRow] = []

    def restore(self, checkpoint: PartitionCheckpoint) -> None:
        """Start from what ``checkpoint`` holds (the batches after its end are added next)."""
        self.entries = {
            row.producer_id: ProducerTransaction(
                row.epoch, row.first_offset, coordinator_epoch=row.coordinator_epoch
            )
            for row in checkpoint.transactions
        }
        self.open = {
            row.producer_id: row.first_offset
            for row in checkpoint.transactions
            if row.first_offset >= 0
        }
        self.aborted = list(checkpoint.aborted)

    def add(self, view: RecordBatchView) -> CompletedTransaction | None:
        """The next batch of the log (one that is not transactional changes nothing): the
        transaction a marker ended, if any. A control batch without a marker changes nothing;
        a marker that cannot be decoded raises :class:`~automq_ref.formats.errors.FormatError`."""
        if not view.is_transactional or view.producer_id < 0:
            return None
        header = view.header()
        producer_id = header.producer_id
        entry = self.entries.get(producer_id, _NO_TRANSACTION)
        if not view.is_control:
            if not entry.open:
                self.open[producer_id] = header.base_offset
            self.entries[producer_id] = append_data(
                entry, header.producer_epoch, header.base_offset
            )
            return None
        marker = batch_marker(view)
        if marker is None:
            return None
        after, completed = append_marker(
            entry,
            header.producer_epoch,
            marker.coordinator_epoch,
            header.base_offset,
            marker.commit,
        )
        self.entries[producer_id] = after
        if completed is None:
            return None
        self.open.pop(producer_id, None)
        if completed.aborted:
            self.aborted.append((producer_id, completed.first_offset, completed.last_offset))
        return completed


_NO_TRANSACTION: Final = ProducerTransaction()


# --------------------------------------------------------------------------- trace validation


def tla_partition(partition: tuple[str, int]) -> str:
    """A partition as specs/Transaction.tla's trace names it: ``"<topic>-<index>"``."""
    topic, index = partition
    return f"{topic}-{index}"


def tla_state(entries: Mapping[tuple[str, int], ProducerTransaction]) -> dict[str, object]:
    """The partitions' variables of specs/Transaction.tla (docs/trace_validation.md), for one
    producer id's entry at each partition: ``partitionEpoch`` (the epoch last accepted) and
    ``openTxn`` (the epoch of the open transaction: the epoch last accepted while one is open,
    since a later batch of an open transaction never lowers it). The spec's ``verified`` is a
    guard the coordinator vouched for; the partition leaves its guard before it asks and keeps
    it on a refusal, so it cannot tell, and ``verified`` is not traced (TLC computes it)."""
    ordered = sorted(entries.items())
    return {
        "partitionEpoch": {"fn": [[tla_partition(p), e.epoch] for p, e in ordered]},
        "openTxn": {
            "fn": [[tla_partition(p), e.epoch if e.open else NO_EPOCH] for p, e in ordered]
        },
    }
