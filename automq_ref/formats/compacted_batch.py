"""Compacted record batches: what log compaction writes in place of a batch it thinned.

A compacted batch keeps everything that places it in the log: its baseOffset and its
lastOffsetDelta (so no offset moves and the next batch still starts after it), the producer id,
epoch and base sequence (an idempotent producer's state is rebuilt from them), the partition
leader epoch, the timestamp type and the transactional and control flags. Only records go, so
recordsCount may be smaller than lastOffsetDelta + 1 (the offsets between survivors are gaps)
and, for a batch kept only for its producer's sake, 0. Kafka's log cleaner writes the same two
shapes, so every Kafka client reads them; :func:`~automq_ref.formats.record_batch.iter_batches`
accepts them with ``compacted=True``.

The delete horizon (attribute bit 6): the first time compaction keeps a tombstone (a record with
a key and a null value) it stamps the batch with the time from which that tombstone may go:
``now + delete.retention.ms``. The stamp lives in the baseTimestamp field, as in Kafka; every
record's timestamp delta is taken from that base, so each record keeps its timestamp. A batch
stamped once keeps its horizon through later compactions.

Pure byte transformations; the decisions (which records survive, when a horizon is due) are in
:mod:`automq_ref.state_machines.compaction`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

from automq_ref.formats.codecs import compress
from automq_ref.formats.record_batch_layout import (
    COMPRESSION_CODEC_MASK,
    CRC_COVERAGE_START,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    RecordBatchHeader,
)
from automq_ref.formats.record_codec import Record, RecordInput, append_record

_UINT32 = struct.Struct(">I")


def delete_horizon(header: RecordBatchHeader) -> int | None:
    """The batch's delete horizon (ms), or None when compaction has not stamped one."""
    if header.attributes & DELETE_HORIZON_FLAG_MASK:
        return header.base_timestamp
    return None


def stored_timestamp(header: RecordBatchHeader, record: Record) -> int:
    """The timestamp the record itself stores (base + its delta), whatever the batch's
    timestamp type: what a rebuilt batch must store again."""
    return header.base_timestamp + record.timestamp_delta


def build_compacted_batch(
    header: RecordBatchHeader, records: Sequence[Record], *, delete_horizon_ms: int | None
) -> bytes:
    """The batch ``header`` describes with only ``records`` (some of its own, in offset order,
    at least one), stamped with ``delete_horizon_ms`` if not None; compressed with the batch's
    own codec, CRC-32C computed."""
    if not records:
        raise ValueError("a compacted batch with no record is built by build_empty_batch")
    timestamps = [stored_timestamp(header, record) for record in records]
    attributes = header.attributes & ~DELETE_HORIZON_FLAG_MASK
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
        attributes |= DELETE_HORIZON_FLAG_MASK
    else:
        base_timestamp = header.base_timestamp
    if header.attributes & TIMESTAMP_TYPE_MASK:
        max_timestamp = header.max_timestamp  # LogAppendTime: the broker's time, unchanged
    else:
        max_timestamp = max(timestamps)
    encoded = bytearray()
    base_offset = header.base_offset
    for record, timestamp in zip(records, timestamps, strict=True):
        delta = record.offset - base_offset
        if not 0 <= delta <= header.last_offset_delta:
            raise ValueError(f"record at offset {record.offset} is outside the batch")
        kept = RecordInput(record.key, record.value, record.headers)
        append_record(encoded, kept, timestamp - base_timestamp, delta)
    payload = compress(header.attributes & COMPRESSION_CODEC_MASK, encoded)
    return _assemble(header, attributes, base_timestamp, max_timestamp, len(records), payload)


def build_empty_batch(header: RecordBatchHeader) -> bytes:
    """The batch ``header`` describes with no record at all: its offsets, producer fields and
    max timestamp kept, uncompressed, no base timestamp (what Kafka writes for the last batch
    of a producer whose records all went)."""
    attributes = header.attributes & ~(COMPRESSION_CODEC_MASK | DELETE_HORIZON_FLAG_MASK)
    return _assemble(header, attributes, NO_TIMESTAMP, header.max_timestamp, 0, b"")


def _assemble(
    header: RecordBatchHeader,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    count: int,
    payload: bytes,
) -> bytes:
    batch = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    HEADER_STRUCT.pack_into(
        batch,
        0,
        header.base_offset,
        RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload),
        header.partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in once the bytes it covers are in place
        attributes,
        header.last_offset_delta,
        base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    batch[RECORDS_OFFSET:] = payload
    _UINT32.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[CRC_COVERAGE_START:]))
    return bytes(batch)
