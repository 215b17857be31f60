"""RecordBatch v2 (magic 2): a zero-copy checked view, in-place offset patching, records, a builder.

Layout of one batch (KAFKA.md section 4, Kafka's ``DefaultRecordBatch``), all big-endian:

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

Each record: body length varint, attributes i8, timestampDelta varlong, offsetDelta varint, key
length varint (-1 = null) and key, value length varint and value, header count varint, then per
header a key length varint, a UTF-8 key, a value length varint (-1 = null) and the value. Every
varint and varlong is zigzag-encoded (Kafka's ``ByteUtils``), at most 5 and 10 bytes long.

Which bytes the CRC protects: attributes to the end of the batch, ``[21, 12 + batchLength)``.
baseOffset and partitionLeaderEpoch lie before it on purpose, so a broker assigns them by
patching 12 bytes and keeps the client's CRC (:meth:`RecordBatchView.set_base_offset`,
:meth:`RecordBatchView.set_partition_leader_epoch`). batchLength and magic lie outside it too;
they are checked structurally instead (the length must frame the buffer, the magic must be 2).

Why a zero-copy view: on the produce path a batch is checked, patched and stored as the client's
bytes (AutoMQ never recompresses), so the only work that must touch every byte is the CRC.
:class:`RecordBatchView` keeps a ``memoryview`` slice of exactly one batch, reads header fields
with ``struct.unpack_from`` when asked, and hands the ``crc32c`` extension a memoryview slice,
which it reads in place. Nothing in parsing or validation copies the batch.

Checked by default: the constructor, :meth:`RecordBatchView.parse` and :func:`iter_batches`
validate before returning (magic, framing, CRC, codec id, offset range, sequence). The one way to
get an unvalidated view is :meth:`RecordBatchView.unchecked`, meant for bytes this process already
validated; it still checks the framing, because the view's extent depends on it.

Records are decoded only on request (:meth:`RecordBatchView.records`), decompressing first with
:func:`automq_ref.formats.codecs.decompress`; every length is checked against the bytes present.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import crc32c

from automq_ref.formats.codecs import (
    BytesLike,
    CompressionType,
    compress,
    compression_type_from_id,
    decompress,
)
from automq_ref.formats.errors import (
    BadMagicError,
    ChecksumError,
    InvalidFieldError,
    TruncatedError,
)

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "BATCH_LENGTH_OFFSET",
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "CRC_COVERAGE_START",
    "CRC_OFFSET",
    "DELETE_HORIZON_FLAG_MASK",
    "LAST_OFFSET_DELTA_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAGIC_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "MIN_BATCH_LENGTH",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "RECORDS_OFFSET",
    "RECORD_BATCH_OVERHEAD",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "Record",
    "RecordBatchHeader",
    "RecordBatchView",
    "RecordInput",
    "RecordLike",
    "TimestampType",
    "build_record_batch",
    "encode_varint",
    "encode_varlong",
    "iter_batches",
    "read_varint",
    "read_varlong",
]

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

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == RECORD_BATCH_OVERHEAD
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")

_VARINT_MAX_BYTES = 5
_VARLONG_MAX_BYTES = 10


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


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record; ``offset`` and ``timestamp`` (ms) are resolved against the batch.

    In a LogAppendTime batch ``timestamp`` is the batch's maxTimestamp, as Kafka consumers see
    it; ``timestamp_delta`` keeps what the record itself stores.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    attributes: int
    timestamp_delta: int
    offset_delta: int


@dataclass(frozen=True, slots=True)
class RecordInput:
    """One record to encode; ``timestamp`` (ms) None means the batch's base timestamp."""

    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp: int | None = None


_Headers: TypeAlias = Sequence[tuple[str, bytes | None]]
RecordLike: TypeAlias = (
    RecordInput
    | tuple[bytes | None, bytes | None]
    | tuple[bytes | None, bytes | None, _Headers]
    | tuple[bytes | None, bytes | None, _Headers, int | None]
)


class RecordBatchView:
    """A validated, zero-copy view of one RecordBatch v2 inside a larger buffer.

    ``RecordBatchView(buffer, position)`` (or :meth:`parse`) frames the batch that starts at
    ``position`` and validates it; trailing bytes after it are left alone (see
    :func:`iter_batches`). The view keeps a memoryview slice, so the buffer must outlive it, and a
    ``bytearray`` under it cannot be resized while the view exists.
    """

    __slots__ = ("_buffer",)

    _buffer: memoryview

    def __init__(self, buffer: BytesLike, position: int = 0, *, verify_crc: bool = True) -> None:
        memory = _byte_memoryview(buffer)
        # Magic first: a v0/v1 message has its magic at the same byte but a shorter minimum
        # length, and "wrong magic" is the error that tells the sender what is wrong.
        _check_magic_if_present(memory, position)
        self._buffer = _slice_batch(memory, position)
        self.validate(verify_crc=verify_crc)

    @classmethod
    def parse(
        cls, buffer: BytesLike, position: int = 0, *, verify_crc: bool = True
    ) -> RecordBatchView:
        """Frame and validate the batch at ``position``; raise a FormatError subclass if invalid.

        ``verify_crc=False`` skips only the CRC, for bytes whose CRC was checked before.
        """
        return cls(buffer, position, verify_crc=verify_crc)

    @classmethod
    def unchecked(cls, buffer: BytesLike, position: int = 0) -> RecordBatchView:
        """Frame the batch at ``position`` without validating it (no magic, CRC or field rules).

        Only for bytes this process validated earlier, where a second CRC pass would be wasted
        work. The framing is still checked (TruncatedError/InvalidFieldError): without it the
        view's extent would be undefined. Call :meth:`validate` to check the rest later.
        """
        view = cls.__new__(cls)
        view._buffer = _slice_batch(_byte_memoryview(buffer), position)
        return view

    def validate(self, *, verify_crc: bool = True) -> None:
        """Check magic, framing, CRC, codec id, offset range and sequence, in that order."""
        header = self.header()
        if header.magic != MAGIC:
            raise BadMagicError(f"magic is {header.magic}, expected {MAGIC}")
        if LOG_OVERHEAD + header.batch_length != len(self._buffer):
            raise InvalidFieldError(
                f"batchLength is {header.batch_length}, but the view holds "
                f"{len(self._buffer) - LOG_OVERHEAD} bytes after it"
            )
        if verify_crc:
            computed_crc = self.compute_crc()
            if computed_crc != header.crc:
                raise ChecksumError(
                    f"crc is 0x{header.crc:08x}, computed 0x{computed_crc:08x} over bytes "
                    f"[{CRC_COVERAGE_START}, {len(self._buffer)})"
                )
        compression_type_from_id(header.attributes & COMPRESSION_CODEC_MASK)
        if header.records_count <= 0 or header.last_offset_delta + 1 != header.records_count:
            raise InvalidFieldError(
                f"Inconsistent batch offset range: lastOffsetDelta={header.last_offset_delta}, "
                f"recordsCount={header.records_count} (need lastOffsetDelta + 1 == "
                f"recordsCount > 0)"
            )
        is_control = bool(header.attributes & CONTROL_FLAG_MASK)
        # Control batches (transaction markers) are written by the coordinator with the
        # producer's id and NO_SEQUENCE, so the rule is for data batches only, as in Kafka's
        # LogValidator, which applies it to client batches.
        if header.producer_id >= 0 and header.base_sequence < 0 and not is_control:
            raise InvalidFieldError(
                f"Invalid sequence number: baseSequence={header.base_sequence} in a batch with "
                f"producerId={header.producer_id}"
            )

    def header(self) -> RecordBatchHeader:
        """All header fields at once (one ``struct`` call; use it when reading several)."""
        return RecordBatchHeader._make(_HEADER.unpack_from(self._buffer))

    def compute_crc(self) -> int:
        """CRC-32C of bytes [21, end), computed in place (the stored one is :attr:`crc`)."""
        crc: int = crc32c.crc32c(self._buffer[CRC_COVERAGE_START:])
        return crc

    # Header fields.

    @property
    def base_offset(self) -> int:
        value: int = _INT64.unpack_from(self._buffer, BASE_OFFSET_OFFSET)[0]
        return value

    @property
    def batch_length(self) -> int:
        value: int = _INT32.unpack_from(self._buffer, BATCH_LENGTH_OFFSET)[0]
        return value

    @property
    def partition_leader_epoch(self) -> int:
        value: int = _INT32.unpack_from(self._buffer, PARTITION_LEADER_EPOCH_OFFSET)[0]
        return value

    @property
    def magic(self) -> int:
        value: int = self._buffer[MAGIC_OFFSET]
        return value - 256 if value > 127 else value

    @property
    def crc(self) -> int:
        value: int = _UINT32.unpack_from(self._buffer, CRC_OFFSET)[0]
        return value

    @property
    def attributes(self) -> int:
        value: int = _INT16.unpack_from(self._buffer, ATTRIBUTES_OFFSET)[0]
        return value

    @property
    def last_offset_delta(self) -> int:
        value: int = _INT32.unpack_from(self._buffer, LAST_OFFSET_DELTA_OFFSET)[0]
        return value

    @property
    def base_timestamp(self) -> int:
        """Milliseconds since the epoch."""
        value: int = _INT64.unpack_from(self._buffer, BASE_TIMESTAMP_OFFSET)[0]
        return value

    @property
    def max_timestamp(self) -> int:
        """Milliseconds since the epoch."""
        value: int = _INT64.unpack_from(self._buffer, MAX_TIMESTAMP_OFFSET)[0]
        return value

    @property
    def producer_id(self) -> int:
        value: int = _INT64.unpack_from(self._buffer, PRODUCER_ID_OFFSET)[0]
        return value

    @property
    def producer_epoch(self) -> int:
        value: int = _INT16.unpack_from(self._buffer, PRODUCER_EPOCH_OFFSET)[0]
        return value

    @property
    def base_sequence(self) -> int:
        value: int = _INT32.unpack_from(self._buffer, BASE_SEQUENCE_OFFSET)[0]
        return value

    @property
    def records_count(self) -> int:
        value: int = _INT32.unpack_from(self._buffer, RECORDS_COUNT_OFFSET)[0]
        return value

    # Derived fields.

    @property
    def compression(self) -> CompressionType:
        return compression_type_from_id(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole batch, 12 + batchLength."""
        return len(self._buffer)

    @property
    def buffer(self) -> memoryview:
        """The batch's own bytes, not copied: hand this to a transport or a storage write."""
        return self._buffer

    # In-place patches of the two fields the CRC leaves out on purpose.

    def set_base_offset(self, base_offset: int) -> None:
        """Write baseOffset in place; the CRC stays valid because byte 0-7 are outside it."""
        self._require_writable("baseOffset")
        _require_signed_range("base_offset", base_offset, 64)
        _INT64.pack_into(self._buffer, BASE_OFFSET_OFFSET, base_offset)

    def set_partition_leader_epoch(self, partition_leader_epoch: int) -> None:
        """Write partitionLeaderEpoch in place; bytes 12-15 are outside the CRC too."""
        self._require_writable("partitionLeaderEpoch")
        _require_signed_range("partition_leader_epoch", partition_leader_epoch, 32)
        _INT32.pack_into(self._buffer, PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)

    def _require_writable(self, field_name: str) -> None:
        if self._buffer.readonly:
            raise TypeError(
                f"cannot set {field_name}: the batch lies in a read-only buffer "
                "(parse a bytearray or a writable memoryview to patch in place)"
            )

    # Records.

    def records(self, *, max_decompressed_bytes: int | None = None) -> list[Record]:
        """Decode every record, decompressing first when the codec is not NONE.

        ``max_decompressed_bytes`` bounds the decompressed size (InvalidFieldError beyond it).
        The whole batch is decoded and checked before anything is returned: the record count
        must match recordsCount, each record its declared length, with no bytes left over.
        """
        header, payload, log_append_time = self._records_section(max_decompressed_bytes)
        return _decode_records(
            payload,
            header.records_count,
            base_offset=header.base_offset,
            base_timestamp=header.base_timestamp,
            log_append_time=log_append_time,
        )

    def record_columns(
        self, *, include_headers: bool = True, max_decompressed_bytes: int | None = None
    ) -> RecordColumns:
        """The records as columns (what a columnar reader such as Spark wants), decoded in one
        tight loop without a :class:`Record` per record; the same checks as :meth:`records`."""
        header, payload, log_append_time = self._records_section(max_decompressed_bytes)
        try:
            return _decode_columns(
                bytes(payload),
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                log_append_time,
                include_headers,
            )
        except _SlowPath:
            # Something unusual (a long varint, a bad length): the careful decoder gives the
            # same records, or the precise error.
            records = self.records(max_decompressed_bytes=max_decompressed_bytes)
            return RecordColumns(
                [r.offset for r in records],
                [r.timestamp for r in records],
                [r.key for r in records],
                [r.value for r in records],
                [r.headers for r in records] if include_headers else [],
            )

    def _records_section(
        self, max_decompressed_bytes: int | None
    ) -> tuple[RecordBatchHeader, bytes | memoryview, int | None]:
        """The header, the records' bytes (decompressed) and the LogAppendTime, if that is the
        batch's timestamp type."""
        header = self.header()
        codec = compression_type_from_id(header.attributes & COMPRESSION_CODEC_MASK)
        payload: bytes | memoryview = self._buffer[RECORDS_OFFSET:]
        if codec is not CompressionType.NONE:
            payload = decompress(codec, payload, max_output_bytes=max_decompressed_bytes)
        log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
        return header, payload, log_append_time

    def __bytes__(self) -> bytes:
        return bytes(self._buffer)

    def __repr__(self) -> str:
        header = self.header()
        return (
            f"RecordBatchView(base_offset={header.base_offset}, "
            f"last_offset_delta={header.last_offset_delta}, "
            f"records_count={header.records_count}, "
            f"codec={header.attributes & COMPRESSION_CODEC_MASK}, "
            f"size_bytes={len(self._buffer)})"
        )


def iter_batches(
    buffer: BytesLike, *, verify_crc: bool = True, allow_partial_tail: bool = False
) -> Iterator[RecordBatchView]:
    """Yield a validated view of each batch in ``buffer``, in order, without copying.

    A batch cut off at the end raises TruncatedError, unless ``allow_partial_tail``: then
    iteration stops there silently, as a Kafka consumer does with a fetch response that ends
    inside a batch. A tail whose length or magic is invalid is not "partial": it still raises.
    Errors surface when iteration reaches the bad batch.
    """
    memory = _byte_memoryview(buffer)
    position = 0
    while position < len(memory):
        if allow_partial_tail and _is_partial_tail(memory, position):
            return
        view = RecordBatchView(memory, position, verify_crc=verify_crc)
        yield view
        position += view.size_bytes


# Varints (zigzag, as Kafka's ByteUtils.readVarint / readVarlong).


def encode_varint(value: int) -> bytes:
    """Zigzag varint of a signed 32-bit ``value`` (1 to 5 bytes)."""
    _require_signed_range("varint", value, 32)
    return _encode_unsigned((value << 1) ^ (value >> 31))


def encode_varlong(value: int) -> bytes:
    """Zigzag varlong of a signed 64-bit ``value`` (1 to 10 bytes)."""
    _require_signed_range("varlong", value, 64)
    return _encode_unsigned((value << 1) ^ (value >> 63))


def read_varint(
    buffer: bytes | bytearray | memoryview, position: int = 0, limit: int | None = None
) -> tuple[int, int]:
    """Decode a zigzag varint at ``position``; return (value, position after it).

    Reads no further than ``limit`` (default and at most: the end of ``buffer``). Raises
    TruncatedError if the varint runs past it, InvalidFieldError if it is longer than 5 bytes or
    does not fit 32 bits (Java would silently drop the extra bits; such bytes are not Kafka's).
    """
    end = _read_limit(buffer, position, limit)
    # Most lengths and deltas in a batch are small: one byte, no loop.
    if position < end and buffer[position] < 0x80:
        raw = buffer[position]
        return (raw >> 1) ^ -(raw & 1), position + 1
    raw, next_position = _read_unsigned(buffer, position, end, _VARINT_MAX_BYTES, "varint")
    if raw > 0xFFFF_FFFF:
        raise InvalidFieldError(f"varint at byte {position} does not fit 32 bits: {raw}")
    return (raw >> 1) ^ -(raw & 1), next_position


def read_varlong(
    buffer: bytes | bytearray | memoryview, position: int = 0, limit: int | None = None
) -> tuple[int, int]:
    """Decode a zigzag varlong at ``position``; like :func:`read_varint` with 10 bytes, 64 bits."""
    end = _read_limit(buffer, position, limit)
    if position < end and buffer[position] < 0x80:
        raw = buffer[position]
        return (raw >> 1) ^ -(raw & 1), position + 1
    raw, next_position = _read_unsigned(buffer, position, end, _VARLONG_MAX_BYTES, "varlong")
    if raw > 0xFFFF_FFFF_FFFF_FFFF:
        raise InvalidFieldError(f"varlong at byte {position} does not fit 64 bits: {raw}")
    return (raw >> 1) ^ -(raw & 1), next_position


def _read_limit(buffer: bytes | bytearray | memoryview, position: int, limit: int | None) -> int:
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    if limit is None or limit > len(buffer):
        return len(buffer)
    return limit


def _encode_unsigned(raw: int) -> bytes:
    output = bytearray()
    while raw > 0x7F:
        output.append((raw & 0x7F) | 0x80)
        raw >>= 7
    output.append(raw)
    return bytes(output)


def _read_unsigned(
    buffer: bytes | bytearray | memoryview, position: int, limit: int, max_bytes: int, kind: str
) -> tuple[int, int]:
    raw = 0
    shift = 0
    for index in range(position, min(limit, position + max_bytes)):
        byte = buffer[index]
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return raw, index + 1
        shift += 7
    if position + max_bytes <= limit:
        raise InvalidFieldError(f"{kind} at byte {position} is longer than {max_bytes} bytes")
    raise TruncatedError(f"{kind} at byte {position} runs past the end at byte {limit}")


# Record decoding.


def _decode_records(
    payload: bytes | memoryview,
    records_count: int,
    *,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> list[Record]:
    records: list[Record] = []
    position = 0
    end = len(payload)
    for index in range(records_count):
        if position >= end:
            raise TruncatedError(
                f"records end after {index} of recordsCount={records_count} records ({end} bytes)"
            )
        record, position = _decode_record(
            payload, position, base_offset, base_timestamp, log_append_time
        )
        records.append(record)
    if position != end:
        raise InvalidFieldError(
            f"{end - position} bytes remain after the recordsCount={records_count} records "
            f"({position} of {end} bytes used)"
        )
    return records


def _decode_record(
    data: bytes | memoryview,
    position: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> tuple[Record, int]:
    record_start = position
    body_length, position = read_varint(data, position)
    if body_length < 0:
        raise InvalidFieldError(f"record at byte {record_start} has length {body_length}")
    body_start = position
    body_end = body_start + body_length
    if body_end > len(data):
        raise TruncatedError(
            f"record at byte {record_start} declares {body_length} bytes, "
            f"only {len(data) - position} remain"
        )
    # Every read below is bounded by body_end, so a record that lies about its fields cannot
    # borrow bytes from the next record.
    if position >= body_end:
        raise TruncatedError(f"record at byte {record_start} ends before its attributes")
    attributes = data[position]
    attributes = attributes - 256 if attributes > 127 else attributes
    timestamp_delta, position = read_varlong(data, position + 1, body_end)
    offset_delta, position = read_varint(data, position, body_end)
    key, position = _read_nullable_bytes(data, position, body_end, "key")
    value, position = _read_nullable_bytes(data, position, body_end, "value")
    header_count, position = read_varint(data, position, body_end)
    if header_count < 0:
        raise InvalidFieldError(f"record at byte {record_start} has header count {header_count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(header_count):
        header_key, position = _read_header_key(data, position, body_end)
        header_value, position = _read_nullable_bytes(data, position, body_end, "header value")
        headers.append((header_key, header_value))
    if position != body_end:
        raise InvalidFieldError(
            f"record at byte {record_start} declares {body_length} bytes after its length, "
            f"its fields use {position - body_start}"
        )
    timestamp = base_timestamp + timestamp_delta if log_append_time is None else log_append_time
    record = Record(
        offset=base_offset + offset_delta,
        timestamp=timestamp,
        key=key,
        value=value,
        headers=tuple(headers),
        attributes=attributes,
        timestamp_delta=timestamp_delta,
        offset_delta=offset_delta,
    )
    return record, position


class RecordColumns(NamedTuple):
    """A batch's records column by column (``headers`` empty unless asked for)."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[tuple[str, bytes | None], ...]]


class _SlowPath(Exception):
    """The fast column decoder met something it leaves to the careful one."""


def _decode_columns(
    data: bytes,
    records_count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    include_headers: bool,
) -> RecordColumns:
    """Every field read inline; anything unusual (a timestamp delta that needs a varlong, a
    length that does not add up) raises _SlowPath."""
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[tuple[tuple[str, bytes | None], ...]] = []
    end = len(data)
    position = 0

    def varint(position: int) -> tuple[int, int]:
        if position >= end:
            raise _SlowPath
        raw = data[position]
        if raw < 0x80:
            return (raw >> 1) ^ -(raw & 1), position + 1
        result = raw & 0x7F
        for shift in (7, 14, 21, 28):
            position += 1
            if position >= end:
                raise _SlowPath
            raw = data[position]
            result |= (raw & 0x7F) << shift
            if raw < 0x80:
                if result > 0xFFFF_FFFF:
                    raise _SlowPath
                return (result >> 1) ^ -(result & 1), position + 1
        raise _SlowPath

    for _ in range(records_count):
        length, position = varint(position)
        body_end = position + length
        if length <= 0 or body_end > end:
            raise _SlowPath
        timestamp_delta, position = varint(position + 1)  # past the attributes byte
        offset_delta, position = varint(position)
        key_length, position = varint(position)
        if key_length < 0:
            key = None
        else:
            key = data[position : position + key_length]
            position += key_length
        value_length, position = varint(position)
        if value_length < 0:
            value = None
        else:
            value = data[position : position + value_length]
            position += value_length
        header_count, position = varint(position)
        if key_length < -1 or value_length < -1 or header_count < 0 or position > body_end:
            raise _SlowPath
        if header_count:
            pairs = []
            for _ in range(header_count):
                header_key_length, position = varint(position)
                if header_key_length < 0 or position + header_key_length > body_end:
                    raise _SlowPath
                header_key = str(
                    data[position : position + header_key_length], "utf-8", "surrogateescape"
                )
                position += header_key_length
                header_value_length, position = varint(position)
                if header_value_length < -1:
                    raise _SlowPath
                header_value = None
                if header_value_length >= 0:
                    header_value = data[position : position + header_value_length]
                    position += header_value_length
                pairs.append((header_key, header_value))
            if include_headers:
                headers.append(tuple(pairs))
        elif include_headers:
            headers.append(())
        if position != body_end:
            raise _SlowPath
        offsets.append(base_offset + offset_delta)
        timestamps.append(
            base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        )
        keys.append(key)
        values.append(value)
    if position != end:
        raise _SlowPath
    return RecordColumns(offsets, timestamps, keys, values, headers)


def _read_nullable_bytes(
    data: bytes | memoryview, position: int, limit: int, field_name: str
) -> tuple[bytes | None, int]:
    length, start = read_varint(data, position, limit)
    if length == -1:
        return None, start
    if length < 0:
        raise InvalidFieldError(f"{field_name} length at byte {position} is {length}")
    end = start + length
    if end > limit:
        raise TruncatedError(
            f"{field_name} at byte {start} declares {length} bytes, only {limit - start} remain"
        )
    return bytes(data[start:end]), end


def _read_header_key(data: bytes | memoryview, position: int, limit: int) -> tuple[str, int]:
    length, start = read_varint(data, position, limit)
    if length < 0:
        raise InvalidFieldError(f"header key length at byte {position} is {length}")
    end = start + length
    if end > limit:
        raise TruncatedError(
            f"header key at byte {start} declares {length} bytes, only {limit - start} remain"
        )
    # surrogateescape never fails and gives the exact bytes back on encoding: Kafka's Java
    # decoder accepts any bytes here (replacing bad UTF-8), so rejecting would refuse batches
    # Kafka stores, and replacing would lose them.
    return str(data[start:end], "utf-8", "surrogateescape"), end


# Framing.


def _byte_memoryview(buffer: BytesLike) -> memoryview:
    memory = memoryview(buffer)
    if not memory.c_contiguous:
        raise ValueError("a record batch must lie in contiguous memory")
    if memory.format != "B" or memory.ndim != 1:
        memory = memory.cast("B")  # zero-copy: same bytes, seen as unsigned chars
    return memory


def _check_magic_if_present(memory: memoryview, position: int) -> None:
    if position >= 0 and len(memory) - position > MAGIC_OFFSET:
        magic = memory[position + MAGIC_OFFSET]
        if magic != MAGIC:
            magic = magic - 256 if magic > 127 else magic
            raise BadMagicError(f"magic is {magic}, expected {MAGIC}")


def _slice_batch(memory: memoryview, position: int) -> memoryview:
    if not 0 <= position <= len(memory):
        raise ValueError(f"position {position} is outside the buffer of {len(memory)} bytes")
    available_bytes = len(memory) - position
    if available_bytes < LOG_OVERHEAD:
        raise TruncatedError(
            f"batch at byte {position} needs {LOG_OVERHEAD} bytes to read batchLength, "
            f"got {available_bytes}"
        )
    (batch_length,) = _INT32.unpack_from(memory, position + BATCH_LENGTH_OFFSET)
    if batch_length < MIN_BATCH_LENGTH:
        raise InvalidFieldError(
            f"batchLength at byte {position} is {batch_length}, below the minimum "
            f"{MIN_BATCH_LENGTH}"
        )
    size_bytes = LOG_OVERHEAD + batch_length
    if size_bytes > available_bytes:
        raise TruncatedError(
            f"batch at byte {position} declares batchLength={batch_length} "
            f"({size_bytes} bytes), only {available_bytes} remain"
        )
    return memory[position : position + size_bytes]


def _is_partial_tail(memory: memoryview, position: int) -> bool:
    available_bytes = len(memory) - position
    if available_bytes < LOG_OVERHEAD:
        return True
    batch_length: int = _INT32.unpack_from(memory, position + BATCH_LENGTH_OFFSET)[0]
    if batch_length < MIN_BATCH_LENGTH:
        return False
    if available_bytes > MAGIC_OFFSET and memory[position + MAGIC_OFFSET] != MAGIC:
        return False
    return LOG_OVERHEAD + batch_length > available_bytes


# Building.


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
    inputs = [_as_record_input(record) for record in records]
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
        _require_signed_range(name, value, bits)

    encoded_records = bytearray()
    for offset_delta, (record, timestamp) in enumerate(zip(inputs, timestamps, strict=True)):
        _require_signed_range("record timestamp", timestamp, 64)
        _require_signed_range("record timestamp delta", timestamp - base_timestamp, 64)
        _append_record(encoded_records, record, timestamp - base_timestamp, offset_delta)
    payload = compress(codec, encoded_records)

    attributes = int(codec)
    attributes |= TIMESTAMP_TYPE_MASK if timestamp_kind is TimestampType.LOG_APPEND_TIME else 0
    attributes |= TRANSACTIONAL_FLAG_MASK if is_transactional else 0
    attributes |= CONTROL_FLAG_MASK if is_control else 0
    batch_length = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload)
    _require_signed_range("batch_length", batch_length, 32)

    batch = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    _HEADER.pack_into(
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


def _as_record_input(record: RecordLike) -> RecordInput:
    if isinstance(record, RecordInput):
        return record
    if len(record) == 2:
        return RecordInput(key=record[0], value=record[1])
    if len(record) == 3:
        return RecordInput(key=record[0], value=record[1], headers=record[2])
    if len(record) == 4:
        return RecordInput(key=record[0], value=record[1], headers=record[2], timestamp=record[3])
    raise ValueError(
        f"a record tuple has 2 to 4 items (key, value, headers, timestamp): {record!r}"
    )


def _append_record(
    output: bytearray, record: RecordInput, timestamp_delta: int, offset_delta: int
) -> None:
    body = bytearray(b"\x00")  # record attributes: unused in v2, always 0
    body += encode_varlong(timestamp_delta)
    body += encode_varint(offset_delta)
    _append_nullable_bytes(body, record.key)
    _append_nullable_bytes(body, record.value)
    body += encode_varint(len(record.headers))
    for header_key, header_value in record.headers:
        _append_nullable_bytes(body, header_key.encode("utf-8", "surrogateescape"))
        _append_nullable_bytes(body, header_value)
    output += encode_varint(len(body))
    output += body


def _append_nullable_bytes(output: bytearray, data: bytes | None) -> None:
    if data is None:
        output += encode_varint(-1)
        return
    output += encode_varint(len(data))
    output += data


def _require_signed_range(name: str, value: int, bits: int) -> None:
    low = -(1 << (bits - 1))
    if not low <= value < -low:
        raise ValueError(f"{name}={value} does not fit a signed {bits}-bit integer")
