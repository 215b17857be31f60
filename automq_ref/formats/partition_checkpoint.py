"""The partition checkpoint: the value of a partition's ``CHECKPOINT`` MetaStream record.

A partition's open rebuilds two things from its log's batch headers: the batch index (for each
batch its base offset, end offset, max timestamp, size and whether compaction emptied it: what
ListOffsets by timestamp, retention and the cleaner read) and the producer state of idempotent
producers (per producer id its epoch and its last five batches' first sequence, last sequence
and base offset: what duplicate and sequence checks read). Reading the whole retained log for
that makes a partition's open, so a move's unavailability, grow with the partition. A partition
that closes cleanly writes both into its MetaStream with the offset they cover up to, and the
next open reads them back and scans only the log past that offset.

The value is a JSON object::

    {"version": 1,
     "data": <data stream id>, "cleaned": [<cleaned stream id>, <cleaned end>] | null,
     "end": <offset>,
     "batches": {"count": <n>, "crc": <crc32 of the columns>, "columns": <base64>},
     "producers": [[<producer id>, <epoch>, [[<first seq>, <last seq>, <base offset>], ...],
                    <last timestamp>], ...],
     "transactions": {"producers": [[<producer id>, <epoch>, <open txn first offset | -1>,
                                     <coordinator epoch>, <last timestamp>], ...],
                      "aborted": [[<producer id>, <first offset>, <last offset>], ...]}}

A producer's ``last timestamp`` is its last batch's max timestamp (what
``producer.id.expiration.ms`` counts from); a row of three, as every checkpoint before producer
expiry wrote, decodes with it unknown (-1). Like ``transactions`` below, it came as an addition
that a reader tells by its absence, so the version stays 1: a broker that predates it refuses
the row's length, ignores the checkpoint and scans the log, which is as correct (only slower).

``transactions`` (the partition's side of Kafka transactions: each transactional producer's
epoch and open transaction, and the aborted-transactions index in offset order) is written only
when there is one; a checkpoint without it (as every one before transactions) has none.

``data`` and ``cleaned`` name the streams holding the log when it was written (a clean since
then makes a new cleaned stream, so a checkpoint naming another one describes a log that is no
more); ``end`` is the offset it covers up to (exclusive; a stream record boundary).

``columns`` is the whole batch index, zlib-compressed: five columns of ``count`` little-endian
signed 64-bit integers, one after the other: the gap between each batch's base offset and the
previous batch's end (the first one's from 0), each batch's length in offsets, its max
timestamp, its size in bytes, and 1 for a batch compaction emptied (else 0). Gaps and lengths
are mostly 0 and 1, so the columns compress to about two bytes a batch; decoding them is a few
C-level passes, not a loop over the batches in Python. The index is kept whole (not sparse):
the reopened partition then answers every lookup exactly as the one that wrote it.
"""

from __future__ import annotations

import array
import base64
import binascii
import itertools
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.json_document import (
    Json,
    require_field,
    require_int,
    require_list,
    require_object,
    require_str,
)

CHECKPOINT_VERSION: Final = 1
COLUMNS: Final = 5  # gap, length, max timestamp, size, emptied

# (base offset, end offset, max timestamp, size in bytes, emptied by compaction)
IndexRow = tuple[int, int, int, int, bool]
# (first sequence, last sequence, base offset) of one of a producer's last batches
ProducerBatch = tuple[int, int, int]
# (producer id, first offset, last offset) of an aborted transaction
AbortedRow = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class TransactionRow:
    """One transactional producer's state at the partition."""

    producer_id: int
    epoch: int
    first_offset: int  # of its open transaction, -1 if none
    coordinator_epoch: int
    last_timestamp: int


NO_TIMESTAMP: Final = -1  # a producer's last timestamp in a checkpoint that predates it


@dataclass(frozen=True, slots=True)
class ProducerRow:
    producer_id: int
    epoch: int
    batches: tuple[ProducerBatch, ...]  # oldest first
    last_timestamp: int = NO_TIMESTAMP  # its last batch's max timestamp


@dataclass(frozen=True, slots=True)
class PartitionCheckpoint:
    data_stream_id: int
    cleaned: tuple[int, int] | None  # (cleaned stream id, cleaned end)
    end: int
    # The batch index as columns (decoding builds no tuple per batch).
    base_offsets: Sequence[int]
    end_offsets: Sequence[int]
    max_timestamps: Sequence[int]
    sizes: Sequence[int]
    emptied: Sequence[int]
    producers: tuple[ProducerRow, ...]
    transactions: tuple[TransactionRow, ...] = ()
    aborted: tuple[AbortedRow, ...] = ()

    def __len__(self) -> int:
        return len(self.base_offsets)


def _column_bytes(values: array.array[int]) -> bytes:
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def encode_checkpoint(
    data_stream_id: int,
    cleaned: tuple[int, int] | None,
    end: int,
    rows: Sequence[IndexRow],
    producers: Sequence[ProducerRow],
    transactions: Sequence[TransactionRow] = (),
    aborted: Sequence[AbortedRow] = (),
) -> Json:
    """The ``CHECKPOINT`` value for a log of ``rows`` (in offset order) up to ``end``."""
    columns = array.array("q")
    previous_ends = itertools.chain((0,), (row[1] for row in rows))
    columns.extend(row[0] - previous for row, previous in zip(rows, previous_ends, strict=False))
    columns.extend(row[1] - row[0] for row in rows)
    columns.extend(row[2] for row in rows)
    columns.extend(row[3] for row in rows)
    columns.extend(1 if row[4] else 0 for row in rows)
    raw = _column_bytes(columns)
    document: dict[str, Json] = {
        "version": CHECKPOINT_VERSION,
        "data": data_stream_id,
        "cleaned": None if cleaned is None else [cleaned[0], cleaned[1]],
        "end": end,
        "batches": {
            "count": len(rows),
            "crc": zlib.crc32(raw),
            "columns": base64.b64encode(zlib.compress(raw, 1)).decode("ascii"),
        },
        "producers": [
            [
                row.producer_id,
                row.epoch,
                [list(batch) for batch in row.batches],
                row.last_timestamp,
            ]
            for row in producers
        ],
    }
    if transactions or aborted:
        document["transactions"] = {
            "producers": [
                [
                    row.producer_id,
                    row.epoch,
                    row.first_offset,
                    row.coordinator_epoch,
                    row.last_timestamp,
                ]
                for row in transactions
            ],
            "aborted": [list(row) for row in aborted],
        }
    return document


def decode_checkpoint(value: Json) -> PartitionCheckpoint:
    """The checkpoint in a ``CHECKPOINT`` value; :class:`InvalidFieldError` if it is not one
    this version writes or does not hold together (the caller then scans the log instead)."""
    document = require_object(value, "CHECKPOINT value")
    version = require_int(require_field(document, "version", "CHECKPOINT"), "version")
    if version != CHECKPOINT_VERSION:
        raise InvalidFieldError(f"checkpoint version {version}, not {CHECKPOINT_VERSION}")
    data_stream_id = require_int(require_field(document, "data", "CHECKPOINT"), "data", minimum=0)
    raw_cleaned = require_field(document, "cleaned", "CHECKPOINT")
    cleaned: tuple[int, int] | None = None
    if raw_cleaned is not None:
        stream, cleaned_end = require_list(raw_cleaned, "CHECKPOINT cleaned", length=2)
        cleaned = (
            require_int(stream, "cleaned stream", minimum=0),
            require_int(cleaned_end, "cleaned end", minimum=0),
        )
    end = require_int(require_field(document, "end", "CHECKPOINT"), "end", minimum=0)
    bases, ends, timestamps, sizes, emptied = _decode_batches(
        require_object(require_field(document, "batches", "CHECKPOINT"), "CHECKPOINT batches")
    )
    if ends and ends[-1] > end:
        raise InvalidFieldError(f"checkpoint index reaches {ends[-1]}, past its end {end}")
    producers = tuple(
        _decode_producer(item)
        for item in require_list(require_field(document, "producers", "CHECKPOINT"), "producers")
    )
    transactions, aborted = _decode_transactions(document.get("transactions"))
    return PartitionCheckpoint(
        data_stream_id,
        cleaned,
        end,
        bases,
        ends,
        timestamps,
        sizes,
        emptied,
        producers,
        transactions,
        aborted,
    )


def _decode_transactions(
    value: Json,
) -> tuple[tuple[TransactionRow, ...], tuple[AbortedRow, ...]]:
    """The ``transactions`` field (absent or null: none)."""
    if value is None:
        return (), ()
    document = require_object(value, "CHECKPOINT transactions")
    rows = []
    for item in require_list(require_field(document, "producers", "transactions"), "producers"):
        producer_id, epoch, first, coordinator_epoch, timestamp = require_list(
            item, "transaction producer", length=5
        )
        rows.append(
            TransactionRow(
                require_int(producer_id, "producer id", minimum=0),
                require_int(epoch, "producer epoch"),
                require_int(first, "transaction first offset", minimum=-1),
                require_int(coordinator_epoch, "coordinator epoch"),
                require_int(timestamp, "last timestamp"),
            )
        )
    aborted: list[AbortedRow] = []
    for item in require_list(require_field(document, "aborted", "transactions"), "aborted"):
        producer_id, first, last = require_list(item, "aborted transaction", length=3)
        row = (
            require_int(producer_id, "producer id", minimum=0),
            require_int(first, "aborted first offset", minimum=0),
            require_int(last, "aborted last offset", minimum=0),
        )
        if row[2] < row[1] or (aborted and row[2] < aborted[-1][2]):
            raise InvalidFieldError("checkpoint aborted transactions out of order")
        aborted.append(row)
    return tuple(rows), tuple(aborted)


def _decode_batches(
    document: dict[str, Json],
) -> tuple[list[int], list[int], array.array[int], array.array[int], array.array[int]]:
    count = require_int(require_field(document, "count", "batches"), "count", minimum=0)
    crc = require_int(require_field(document, "crc", "batches"), "crc", minimum=0)
    text = require_str(require_field(document, "columns", "batches"), "columns")
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error, ValueError) as error:
        raise InvalidFieldError(f"checkpoint columns unreadable: {error}") from error
    if len(raw) != COLUMNS * 8 * count:
        raise InvalidFieldError(f"checkpoint columns hold {len(raw)} bytes for {count} batches")
    if zlib.crc32(raw) != crc:
        raise InvalidFieldError("checkpoint columns fail their CRC")
    columns = array.array("q")
    columns.frombytes(raw)
    if sys.byteorder != "little":
        columns.byteswap()
    gaps, lengths = columns[:count], columns[count : 2 * count]
    timestamps, sizes = columns[2 * count : 3 * count], columns[3 * count : 4 * count]
    emptied = columns[4 * count :]
    if count and (min(gaps) < 0 or min(lengths) < 1 or min(sizes) < 0):
        raise InvalidFieldError("checkpoint index out of order")
    if count and (min(emptied) < 0 or max(emptied) > 1):
        raise InvalidFieldError("checkpoint index: emptied flags must be 0 or 1")
    # base_i = end_(i-1) + gap_i and end_i = base_i + length_i: one running sum over the
    # interleaved gaps and lengths gives base, end, base, end, ...
    running = list(
        itertools.accumulate(itertools.chain.from_iterable(zip(gaps, lengths, strict=True)))
    )
    return running[0::2], running[1::2], timestamps, sizes, emptied


def _decode_producer(item: Json) -> ProducerRow:
    """One producer row: four fields, or the three of a checkpoint written before the last
    timestamp (then unknown)."""
    fields = require_list(item, "CHECKPOINT producer")
    if len(fields) not in (3, 4):
        raise InvalidFieldError(f"CHECKPOINT producer has {len(fields)} fields, not 3 or 4")
    producer_id, epoch, raw_batches = fields[:3]
    timestamp = NO_TIMESTAMP
    if len(fields) == 4:
        timestamp = require_int(fields[3], "producer last timestamp")
    batches: list[ProducerBatch] = []
    for raw in require_list(raw_batches, "producer batches"):
        first, last, base = require_list(raw, "producer batch", length=3)
        batches.append(
            (
                require_int(first, "first sequence"),
                require_int(last, "last sequence"),
                require_int(base, "batch base offset", minimum=0),
            )
        )
    return ProducerRow(
        require_int(producer_id, "producer id", minimum=0),
        require_int(epoch, "producer epoch"),
        tuple(batches),
        timestamp,
    )
