"""RecordBatch v2 (magic 2): the layout of a batch, its field offsets and flags, the header type.

Layout of one batch as Kafka's ``DefaultRecordBatch`` writes it (the magic 2 format of KIP-98),
all big-endian:

======  ====  =====================  ====================================================
offset  size  field                  notes
======  ====  =====================  ====================================================
0       8     baseOffset             i64, assigned by the broker
8       4     batchLength            i32, bytes *after* this field (total = 12 + batchLength)
12      4     partitionLeaderEpoch   i32, assigned by the broker
16      1     magic                  i8, always 2 here
17      4     crc                    u32, CRC-32C (Castagnoli) of bytes [21, 12 + batchLength)
21      2     attributes             i16: bits 0-2 codec, 3 timestamp type, 4 transactional,
                                     5 control, 6 delete horizon
23      4     lastOffsetDelta        i32
27      8     baseTimestamp          i64, milliseconds since the epoch
35      8     maxTimestamp           i64, milliseconds since the epoch
43      8     producerId             i64, -1 when not idempotent
51      2     producerEpoch          i16
53      4     baseSequence           i32
57      4     recordsCount           i32
61      ...   records                one block, compressed as a whole when the codec is not 0
======  ====  =====================  ====================================================

Which bytes the CRC protects: attributes to the end of the batch, ``[21, 12 + batchLength)``.
baseOffset and partitionLeaderEpoch lie before it on purpose, so a broker assigns them by
patching 12 bytes and keeps the client's CRC (:meth:`RecordBatchView.set_base_offset`,
:meth:`RecordBatchView.set_partition_leader_epoch`). batchLength and magic lie outside it too;
they are checked structurally instead (the length must frame the buffer, the magic must be 2).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

# Field offsets, named as in Kafka's DefaultRecordBatch so the two read side by side.
BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORDS_OFFSET = 61

RECORD_BATCH_OVERHEAD = RECORDS_OFFSET
# baseOffset + batchLength: the bytes batchLength does not count (Kafka's Records.LOG_OVERHEAD).
LOG_OVERHEAD = 12
MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD
CRC_COVERAGE_START = ATTRIBUTES_OFFSET
MAGIC = 2

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

# All 13 header fields in one struct call.
HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
assert HEADER_STRUCT.size == RECORD_BATCH_OVERHEAD


class TimestampType(enum.IntEnum):
    """Bit 3 of the attributes: who set the timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class RecordBatchHeader(NamedTuple):
    """All 13 header fields, read with one ``struct`` call."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
