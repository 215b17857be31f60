"""What a partition keeps beside its log: the batch index and the producer state, and their
checkpoint.

The batch index holds, per stored batch, its base offset, end offset, max timestamp, size and
whether compaction emptied it (ListOffsets by timestamp, retention and the cleaner read it, and
Fetch, to ask storage for the batches that fit its byte limit: :func:`read_budget`). The
producer state holds, per idempotent producer id, its epoch, its last five batches' first
sequence, last sequence and base offset and its last batch's max timestamp (Kafka's
ProducerStateEntry; an idle one is forgotten after ``producer.id.expiration.ms``:
:mod:`automq_ref.kafka.producer_expiry`), against which Produce checks duplicates and sequence
order (:func:`check_sequences`); a duplicate is answered with its original's offset once the
original append is durable (:func:`answer_duplicate`), never before, so that a retry cannot
confirm records a failed WAL write lost. Both grow with every append
(:func:`remember_batch`) and are rebuilt at open from the log's batch headers, or loaded from
the partition's last checkpoint (:func:`restore`) when that describes the log found
(:func:`mismatch`); :func:`checkpoint_value` writes one. The partition
(:mod:`automq_ref.kafka.partition`) owns the structures and the I/O; this module holds the rules,
which need no stream.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.json_document import Json
from automq_ref.formats.partition_checkpoint import (
    NO_TIMESTAMP,
    AbortedRow,
    PartitionCheckpoint,
    ProducerRow,
    TransactionRow,
    encode_checkpoint,
)
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.storage.s3stream import StorageError

PRODUCER_BATCHES_RETAINED = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchEntry:
    base_offset: int
    end_offset: int  # exclusive
    max_timestamp: int
    size_bytes: int
    empty: bool = False  # a compacted batch kept for its producer's sake: no record in it


def index_entry(view: RecordBatchView) -> BatchEntry:
    """The batch index's entry for one stored batch."""
    header = view.header()
    return BatchEntry(
        header.base_offset,
        header.base_offset + header.last_offset_delta + 1,
        header.max_timestamp,
        view.size_bytes,
        header.records_count == 0,
    )


def read_budget(batches: Sequence[BatchEntry], offset: int, max_bytes: int, min_one: bool) -> int:
    """The bytes a read from ``offset`` returning whole batches within ``max_bytes`` should ask
    storage for, by the index: the size of the batches that fit (with ``min_one`` the first even
    if it does not), 0 when none may come, ``max_bytes`` where the index stops short.

    Storage stops once its budget is spent, after the batch that spends it: asked for
    ``max_bytes`` it would read the batch that crosses the limit, which the read then leaves
    out. That batch costs its block's GET, and leaves the stream's reader past the offset the
    consumer fetches from next (a new reader, a new window, the block fetched again). Asked for
    exactly the batches that fit, storage stops where the consumer goes on."""
    position = bisect.bisect_right(batches, offset, key=lambda entry: entry.end_offset)
    size = 0
    for entry in itertools.islice(batches, position, None):
        if size + entry.size_bytes > max_bytes and (size or not min_one):
            return size
        size += entry.size_bytes
        if size >= max_bytes:
            return size
    return max_bytes


def end_offset_for_epoch(
    leader_epochs: Sequence[tuple[int, int]], leader_epoch: int, log_end: int
) -> tuple[int, int]:
    """(epoch, end offset) as OffsetForLeaderEpoch answers: the largest epoch <= the one
    asked, and the start offset of the epoch after it (or the log end)."""
    chosen: tuple[int, int] | None = None
    for position, (epoch, _) in enumerate(leader_epochs):
        if epoch <= leader_epoch:
            chosen = (epoch, position)
    if chosen is None:
        return -1, -1
    epoch, position = chosen
    if position + 1 < len(leader_epochs):
        return epoch, leader_epochs[position + 1][1]
    return epoch, log_end


def offset_for_timestamp(
    batches: Sequence[BatchEntry], start: int, timestamp: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first batch whose max timestamp reaches ``timestamp`` in a log
    starting at ``start``: the broker then finds the record inside it."""
    for entry in batches:
        if entry.end_offset > start and entry.max_timestamp >= timestamp and not entry.empty:
            return max(entry.base_offset, start), entry.max_timestamp
    return None


def max_timestamp_offset(batches: Sequence[BatchEntry], start: int) -> tuple[int, int] | None:
    best: BatchEntry | None = None
    for entry in batches:
        if (
            entry.end_offset > start
            and not entry.empty
            and (best is None or entry.max_timestamp > best.max_timestamp)
        ):
            best = entry
    if best is None:
        return None
    return best.end_offset - 1, best.max_timestamp


def retention_trim_point(
    batches: Sequence[BatchEntry],
    start: int,
    high_watermark: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> int:
    """The new log start retention allows (``start``, the current one, if nothing expires).
    Only whole batches below the high watermark go, and never the last one."""
    live = [entry for entry in batches if entry.end_offset > start]
    keep_from = 0
    if retention_ms >= 0:
        while keep_from < len(live) - 1 and live[keep_from].max_timestamp < now_ms - retention_ms:
            keep_from += 1
    if retention_bytes >= 0:
        total = sum(entry.size_bytes for entry in live[keep_from:])
        while keep_from < len(live) - 1 and total > retention_bytes:
            total -= live[keep_from].size_bytes
            keep_from += 1
    if keep_from == 0:
        return start
    return min(live[keep_from].base_offset, high_watermark)


def stored_payloads(
    found: Sequence[StreamRecordBatch], max_bytes: int, min_one: bool, upper: int | None = None
) -> list[bytes | memoryview]:
    """The payloads of ``found`` within ``max_bytes`` (the first past it with ``min_one``) and
    below ``upper`` (:func:`cut_at`). Storage stops once the budget is spent, so its last batch
    may overshoot it (where the index did not know the batches, or a stored payload holds
    several)."""
    payloads: list[bytes | memoryview] = []
    size = 0
    for batch in found:
        size += len(batch.payload)
        if size > max_bytes and (payloads or not min_one):
            break
        payloads.append(batch.payload)
    if upper is not None and found and found[-1].last_offset > upper:
        return cut_at(payloads, upper)
    return payloads


def cut_at(payloads: list[bytes | memoryview], upper: int) -> list[bytes | memoryview]:
    """``payloads`` (stored records read in offset order) without the batches at or past
    ``upper`` (the LSO of a READ_COMMITTED read): a stored record holds one append's batches,
    so the one holding ``upper - 1`` may hold batches from ``upper`` on too."""
    while payloads:
        last = payloads[-1]
        kept = 0
        for view in iter_batches(last, verify_crc=False, compacted=True):
            if view.base_offset >= upper:
                break
            kept += view.size_bytes
        if kept == len(last):
            return payloads
        payloads = payloads[:-1]
        if kept:
            return [*payloads, memoryview(last)[:kept]]
    return payloads


def keyless_record(view: RecordBatchView, partition: str) -> ProduceResult | None:
    """Kafka's rule for compacted topics: every record needs a key (a clean would drop a
    keyless one)."""
    try:
        records = view.records()
    except FormatError as error:
        return ProduceResult(error.code, message=str(error))
    if all(record.key is not None for record in records):
        return None
    return ProduceResult(
        KafkaErrorCode.INVALID_RECORD,
        message="Compacted topic cannot accept message without key in topic partition "
        f"{partition}.",
    )


@dataclass(slots=True)
class ProducerState:
    epoch: int
    # (first sequence, last sequence, base offset) of the last few batches, oldest first.
    batches: collections.deque[tuple[int, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=PRODUCER_BATCHES_RETAINED)
    )
    # The last batch's max timestamp (Kafka's ProducerStateEntry.lastTimestamp): what
    # producer.id.expiration.ms counts from (automq_ref/kafka/partition_transactions.py,
    # PartitionTransactions.expire); NO_TIMESTAMP: unknown.
    last_timestamp: int = NO_TIMESTAMP

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1] if self.batches else -1


Producers = dict[int, ProducerState]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error: KafkaErrorCode
    base_offset: int = -1
    durable: asyncio.Future[None] | None = None
    message: str | None = None


def remember_batch(batches: list[BatchEntry], producers: Producers, view: RecordBatchView) -> None:
    """Index one stored batch, and note it as its producer's latest (an idempotent data batch)."""
    header = view.header()
    batches.append(index_entry(view))
    if header.producer_id >= 0 and not view.is_control:
        remember_producer(
            producers,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.base_sequence + header.last_offset_delta,
            header.base_offset,
            header.max_timestamp,
        )


def remember_producer(
    producers: Producers,
    producer_id: int,
    epoch: int,
    first: int,
    last: int,
    base_offset: int,
    timestamp: int,
) -> None:
    state = producers.get(producer_id)
    if state is None or epoch > state.epoch:
        state = producers[producer_id] = ProducerState(epoch)
    state.batches.append((first, last, base_offset))
    state.last_timestamp = timestamp


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of one of its producer's last five batches: not appended again, answered with
    the original's offset (:func:`answer_duplicate`)."""

    base_offset: int


def check_sequences(
    producers: Producers, views: list[RecordBatchView]
) -> ProduceResult | Duplicate | None:
    """Kafka's idempotence rules (ProducerAppendInfo): a duplicate of one of the last five
    batches, sent alone, is a :class:`Duplicate`; an error is a :class:`ProduceResult`; None
    lets the batches be appended."""
    for position, view in enumerate(views):
        header = view.header()
        if header.producer_id < 0:
            continue
        first = header.base_sequence
        last = first + header.last_offset_delta
        state = producers.get(header.producer_id)
        if state is None:
            # An unknown producer (new, or its state expired after producer.id.expiration.ms):
            # any sequence is accepted and its batch starts the state afresh. Kafka's rule
            # since 2.5 (ProducerAppendInfo.checkSequence: a first sequence other than 0 is
            # refused only when the entry has an epoch; brokers before it answered
            # UNKNOWN_PRODUCER_ID), and what docs/broker.md and the tests have said so far:
            # an idle producer's next batch lands, it is not failed for having been idle.
            continue
        if header.producer_epoch < state.epoch:
            return ProduceResult(
                KafkaErrorCode.INVALID_PRODUCER_EPOCH,
                message=f"epoch {header.producer_epoch} < {state.epoch}",
            )
        if header.producer_epoch > state.epoch:
            if first != 0:
                return ProduceResult(
                    KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    message=f"new epoch {header.producer_epoch} starts at sequence {first}",
                )
            continue
        for old_first, old_last, old_base in state.batches:
            if (old_first, old_last) == (first, last):
                if position == 0 and len(views) == 1:
                    return Duplicate(old_base)
                return ProduceResult(
                    KafkaErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                    message="a duplicate batch among others",
                )
        expected = state.last_sequence + 1
        wrapped = first == 0 and state.last_sequence == INT32_MAX
        if first != expected and not wrapped:
            return ProduceResult(
                KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                message=f"sequence {first}, expected {expected}",
            )
    return None


def answer_of(
    durable: asyncio.Future[None], retried_offset: int | None = None
) -> asyncio.Future[None]:
    """The future a Produce answer awaits for an append whose durability in the storage is
    ``durable``: one of its own, so that the answer's task, cancelled when its connection
    closes, leaves ``durable`` alone (the partition keeps it for a retry to wait on). A failed
    append fails it with its error; for a retry (``retried_offset``, the original's offset)
    with a ``StorageError`` saying the retried batch was lost."""
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def follow(done: asyncio.Future[None]) -> None:
        if answer.done():  # its task was cancelled
            return
        error = StorageError("the append was cancelled") if done.cancelled() else done.exception()
        if error is None:
            answer.set_result(None)
            return
        if retried_offset is not None:
            lost = StorageError(f"the retried batch at offset {retried_offset} was lost")
            lost.__cause__ = error
            error = lost
        answer.set_exception(error)
        answer.exception()  # retrieved: with acks=0 nothing awaits the answer

    if durable.done():
        follow(durable)
    else:
        durable.add_done_callback(follow)
    return answer


def answer_duplicate(duplicate: Duplicate, original: asyncio.Future[None] | None) -> ProduceResult:
    """The answer to a retried batch whose original append's durability is ``original`` (None:
    durable long since). As Kafka answers a duplicate only once the original's offsets are
    committed, the answer waits for the original append, and fails (``StorageError``: the
    client retries, to wherever the partition then is) if that append's WAL write failed:
    acknowledging it would confirm records the log does not hold, and the producer's next
    sequence would then meet OUT_OF_ORDER_SEQUENCE_NUMBER there."""
    if original is None:
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        durable.set_result(None)
    else:
        durable = answer_of(original, duplicate.base_offset)
    return ProduceResult(KafkaErrorCode.NONE, duplicate.base_offset, durable)


# --------------------------------------------------------------------------------- checkpoint


def checkpoint_value(
    data_stream_id: int,
    cleaned: tuple[int, int] | None,
    end: int,
    batches: Sequence[BatchEntry],
    producers: Producers,
    transactions: tuple[Sequence[TransactionRow], Sequence[AbortedRow]] = ((), ()),
) -> Json:
    """The ``CHECKPOINT`` value of an index and producer state describing the log up to
    ``end``, held by ``data_stream_id`` and the (cleaned stream, cleaned end) ``cleaned``;
    ``transactions``: the transaction state's rows
    (:meth:`~automq_ref.kafka.partition_transactions.PartitionTransactions.rows`)."""
    rows = [
        (entry.base_offset, entry.end_offset, entry.max_timestamp, entry.size_bytes, entry.empty)
        for entry in batches
    ]
    producer_rows = [
        ProducerRow(producer_id, state.epoch, tuple(state.batches), state.last_timestamp)
        for producer_id, state in producers.items()
    ]
    return encode_checkpoint(data_stream_id, cleaned, end, rows, producer_rows, *transactions)


def mismatch(
    checkpoint: PartitionCheckpoint,
    data_stream_id: int,
    cleaned: tuple[int, int] | None,
    log_start: int,
    high_watermark: int,
) -> str | None:
    """Why ``checkpoint`` does not describe the log an open finds (None: it does). A clean
    since it was written made a new cleaned stream; a trim past its end took what it covers;
    an end past the log's means offsets it describes never became durable."""
    if checkpoint.data_stream_id != data_stream_id:
        return f"written for data stream {checkpoint.data_stream_id}, not {data_stream_id}"
    if checkpoint.cleaned != cleaned:
        return f"written for cleaned stream and end {checkpoint.cleaned}, not {cleaned}"
    if checkpoint.end > high_watermark:
        return f"covers up to {checkpoint.end}, past the log end {high_watermark}"
    if checkpoint.end < log_start:
        return f"covers up to {checkpoint.end}, below the log start {log_start}"
    return None


def restore(
    checkpoint: PartitionCheckpoint, log_start: int, now_ms: int
) -> tuple[list[BatchEntry], Producers]:
    """The index and producer state in ``checkpoint``, for a log starting at ``log_start``,
    opened at ``now_ms``. Index entries wholly below the log start go, as a trim drops them
    from the live index; producers stay, as in the partition that wrote the checkpoint (a trim
    keeps them).

    A producer whose last timestamp the checkpoint does not hold (written before it had one)
    is taken as last active at ``now_ms``, the open's time. Not kept until its next batch: one
    that never comes back would then stay for good, carried from checkpoint to checkpoint.
    Not the checkpoint's time: the older form does not record one. The open comes after every
    batch the checkpoint knows of, so such a producer is never forgotten by mistake: it goes
    only once idle for ``producer.id.expiration.ms`` after the open (its next batch sets its
    real timestamp)."""
    first = bisect.bisect_right(checkpoint.end_offsets, log_start)
    batches = list(
        map(
            BatchEntry,
            checkpoint.base_offsets[first:],
            checkpoint.end_offsets[first:],
            checkpoint.max_timestamps[first:],
            checkpoint.sizes[first:],
            map(bool, checkpoint.emptied[first:]),
        )
    )
    producers = {
        row.producer_id: ProducerState(
            row.epoch,
            collections.deque(row.batches, maxlen=PRODUCER_BATCHES_RETAINED),
            now_ms if row.last_timestamp == NO_TIMESTAMP else row.last_timestamp,
        )
        for row in checkpoint.producers
    }
    return batches, producers
