"""``kafka.isolation.level`` for both Spark sources: the option, and what ``read_committed`` hides.

Spark's Kafka source hands ``kafka.isolation.level`` to its Kafka consumers and sets none of its
own, so the Kafka consumer's default holds: ``read_uncommitted``. The sources here take the same
option, with the same two values and the same default:

``read_uncommitted``
    Every data record up to the end of the partition (the high watermark over Kafka, the end of
    what is committed to objects for ``automq-objects``): the records of aborted transactions
    and of transactions still open included.
``read_committed``
    Non-transactional records and the records of committed transactions, below the partition's
    last stable offset (LSO: the first offset of its oldest undecided transaction), so nothing
    an open transaction may still abort, and nothing after it, is read.

Control batches (the COMMIT and ABORT markers) are never rows, at either level.

What ``read_committed`` drops is found two ways:

* Over Kafka (:func:`drop_aborted`, the ``automq`` source): a READ_COMMITTED Fetch answers
  records only up to the LSO, with the aborted transactions (producer id, first offset) those
  records may meet. A transactional data batch is aborted when its producer has an aborted
  transaction whose first offset is at or below the batch's last offset and whose ABORT marker
  has not been passed yet: the rule of Kafka's consumers.
* From objects (:class:`TransactionReplay`, the ``automq-objects`` source): the partition's
  transaction state is rebuilt as the partition itself rebuilds it when it opens: its last
  checkpoint in the MetaStream (each transactional producer's open transaction and the
  aborted-transactions index, :mod:`automq_ref.formats.partition_checkpoint`) when it describes
  the log the objects hold, then every transactional batch after it, in offset order, through
  the same rules (:mod:`automq_ref.state_machines.transaction_partition`). The result is the
  LSO of the committed objects (a transaction whose marker is not committed to objects yet
  counts as open) and the aborted ranges ``(producer id, first offset, marker offset)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from automq_ref.formats.control_batch import batch_marker
from automq_ref.formats.partition_checkpoint import AbortedRow, PartitionCheckpoint
from automq_ref.formats.record_batch import RecordBatchView
from automq_ref.state_machines.transaction_partition import LogTransactions

__all__ = [
    "ISOLATION_OPTION",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "TransactionReplay",
    "aborted_within",
    "checkpoint_mismatch",
    "drop_aborted",
    "parse_isolation_level",
]

ISOLATION_OPTION: Final = "kafka.isolation.level"
READ_UNCOMMITTED: Final = "read_uncommitted"
READ_COMMITTED: Final = "read_committed"


def parse_isolation_level(value: str | None, error: type[ValueError]) -> bool:
    """Whether the option asks for ``read_committed`` (None: not given, the default
    ``read_uncommitted``). Kafka's consumer takes exactly these two words (surrounding spaces
    trimmed); anything else raises ``error`` naming the option and both values."""
    if value is None:
        return False
    word = value.strip()
    if word not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise error(
            f"option {ISOLATION_OPTION} must be {READ_UNCOMMITTED} (the default) or "
            f"{READ_COMMITTED}, not {value!r}"
        )
    return word == READ_COMMITTED


# ------------------------------------------------------------------------ over Kafka


def drop_aborted(
    views: Iterable[RecordBatchView], aborted: Iterable[tuple[int, int]]
) -> Iterator[RecordBatchView]:
    """The batches of one READ_COMMITTED Fetch answer (in offset order) without the data
    batches of aborted transactions; ``aborted`` is the answer's (producer id, first offset)
    list. Control batches pass (rows never include them)."""
    pending = [(first, producer_id) for producer_id, first in aborted]
    heapq.heapify(pending)
    aborting: set[int] = set()
    for view in views:
        if view.producer_id < 0:
            yield view  # not written by a producer with an id: never transactional
            continue
        last = view.last_offset
        while pending and pending[0][0] <= last:
            aborting.add(heapq.heappop(pending)[1])
        if view.is_control:
            marker = batch_marker(view)
            if marker is not None and not marker.commit:
                aborting.discard(view.producer_id)  # that aborted transaction ends here
            yield view
        elif not (view.is_transactional and view.producer_id in aborting):
            yield view


# ----------------------------------------------------------------------- from objects


def checkpoint_mismatch(
    checkpoint: PartitionCheckpoint,
    data_stream_id: int,
    cleaned: tuple[int, int] | None,
    log_start: int,
    end: int,
) -> str | None:
    """Why ``checkpoint`` does not describe the log ``[log_start, end)`` of the data stream
    ``data_stream_id`` (None: it does): the partition's own conditions for using one, with the
    end of what the objects hold in place of the high watermark."""
    if checkpoint.data_stream_id != data_stream_id:
        return f"written for data stream {checkpoint.data_stream_id}, not {data_stream_id}"
    if checkpoint.cleaned != cleaned:
        return f"written for cleaned stream and end {checkpoint.cleaned}, not {cleaned}"
    if checkpoint.end > end:
        return f"covers up to {checkpoint.end}, past the committed end {end}"
    if checkpoint.end < log_start:
        return f"covers up to {checkpoint.end}, below the log start {log_start}"
    return None


class TransactionReplay(LogTransactions):
    """A partition's transaction state rebuilt from its log, as the partition rebuilds it
    (:meth:`restore` a checkpoint, then :meth:`add` each batch after it, in offset order)."""

    __slots__ = ()

    def stable_offset(self, log_start: int, end: int) -> int:
        """The LSO of the log ``[log_start, end)`` replayed: the first offset of its oldest
        open transaction, else ``end``; never below the log start."""
        return max(log_start, min(self.open.values(), default=end), 0)

    def aborted_from(self, log_start: int) -> tuple[AbortedRow, ...]:
        """The aborted transactions that end at or after ``log_start``, in marker order."""
        return tuple(row for row in self.aborted if row[2] >= log_start)


def aborted_within(aborted: Sequence[AbortedRow], start: int, end: int) -> tuple[AbortedRow, ...]:
    """The aborted transactions a read of ``[start, end)`` may meet: their marker at or after
    ``start``, their first offset before ``end``."""
    return tuple(row for row in aborted if row[2] >= start and row[1] < end)
