"""Building a RecordBatch v2: records in, one valid batch (CRC-32C included) out.

Used by clients, tests and tools; the broker itself never rebuilds a batch (it stores the
client's bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

from automq_ref.formats.codecs import CompressionType, compress, compression_type_from_id
from automq_ref.formats.record_batch_layout import (
    CONTROL_FLAG_MASK,
    CRC_COVERAGE_START,
    CRC_OFFSET,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    TimestampType,
)
from automq_ref.formats.record_codec import (
    RecordLike,
    append_record,
    as_record_input,
    require_signed_range,
)

_UINT32 = struct.Struct(">I")


def build_record_batch(
    records: Sequence[RecordLike],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: CompressionType | int = CompressionType.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    base_timestamp: int | None = None,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: TimestampType | int = TimestampType.CREATE_TIME,
) -> bytes:
    """Encode ``records`` as one valid v2 batch, CRC-32C included.

    Offsets are consecutive from ``base_offset``. ``base_timestamp`` defaults to the first
    record timestamp given, else NO_TIMESTAMP (-1); records without a timestamp get the base one.
    maxTimestamp is the largest record timestamp. Raises ValueError for an empty ``records``, a
    field out of its integer range, or a producer id without a sequence in a data batch (the
    batch would not pass :meth:`RecordBatchView.validate`).
    """
    inputs = [as_record_input(record) for record in records]
    if not inputs:
        raise ValueError("a batch needs at least one record (recordsCount > 0)")
    codec = compression_type_from_id(compression)
    timestamp_kind = TimestampType(timestamp_type)
    if producer_id >= 0 and base_sequence < 0 and not is_control:
        raise ValueError(f"producer_id={producer_id} needs base_sequence >= 0")
    if base_timestamp is None:
        base_timestamp = next(
            (record.timestamp for record in inputs if record.timestamp is not None), NO_TIMESTAMP
        )
    timestamps = [
        base_timestamp if record.timestamp is None else record.timestamp for record in inputs
    ]
    for name, value, bits in (
        ("base_offset", base_offset, 64),
        ("partition_leader_epoch", partition_leader_epoch, 32),
        ("producer_id", producer_id, 64),
        ("producer_epoch", producer_epoch, 16),
        ("base_sequence", base_sequence, 32),
        ("base_timestamp", base_timestamp, 64),
        ("last_offset_delta", len(inputs) - 1, 32),
    ):
        require_signed_range(name, value, bits)

    encoded_records = bytearray()
    for offset_delta, (record, timestamp) in enumerate(zip(inputs, timestamps, strict=True)):
        require_signed_range("record timestamp", timestamp, 64)
        require_signed_range("record timestamp delta", timestamp - base_timestamp, 64)
        append_record(encoded_records, record, timestamp - base_timestamp, offset_delta)
    payload = compress(codec, encoded_records)

    attributes = int(codec)
    attributes |= TIMESTAMP_TYPE_MASK if timestamp_kind is TimestampType.LOG_APPEND_TIME else 0
    attributes |= TRANSACTIONAL_FLAG_MASK if is_transactional else 0
    attributes |= CONTROL_FLAG_MASK if is_control else 0
    batch_length = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload)
    require_signed_range("batch_length", batch_length, 32)

    batch = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    HEADER_STRUCT.pack_into(
        batch,
        0,
        base_offset,
        batch_length,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in once the bytes it covers are in place
        attributes,
        len(inputs) - 1,
        base_timestamp,
        max(timestamps),
        producer_id,
        producer_epoch,
        base_sequence,
        len(inputs),
    )
    batch[RECORDS_OFFSET:] = payload
    _UINT32.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[CRC_COVERAGE_START:]))
    return bytes(batch)
