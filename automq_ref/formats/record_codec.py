"""Kafka records inside a RecordBatch v2: zigzag varints, the record type, decoding and encoding.

Each record: body length varint, attributes i8, timestampDelta varlong, offsetDelta varint, key
length varint (-1 = null) and key, value length varint and value, header count varint, then per
header a key length varint, a UTF-8 key, a value length varint (-1 = null) and the value. Every
varint and varlong is zigzag-encoded (Kafka's ``ByteUtils``), at most 5 and 10 bytes long.

Decoding checks every length against the bytes present and bounds each record's field reads by
the record's own declared length, so a record that lies about its fields cannot borrow bytes
from the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from automq_ref.formats.errors import InvalidFieldError, TruncatedError

_VARINT_MAX_BYTES = 5
_VARLONG_MAX_BYTES = 10


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


# Varints (zigzag, as Kafka's ByteUtils.readVarint / readVarlong).


def encode_varint(value: int) -> bytes:
    """Zigzag varint of a signed 32-bit ``value`` (1 to 5 bytes)."""
    require_signed_range("varint", value, 32)
    return _encode_unsigned((value << 1) ^ (value >> 31))


def encode_varlong(value: int) -> bytes:
    """Zigzag varlong of a signed 64-bit ``value`` (1 to 10 bytes)."""
    require_signed_range("varlong", value, 64)
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


def decode_records(
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


# Record encoding.


def as_record_input(record: RecordLike) -> RecordInput:
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


def append_record(
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


def require_signed_range(name: str, value: int, bits: int) -> None:
    low = -(1 << (bits - 1))
    if not low <= value < -low:
        raise ValueError(f"{name}={value} does not fit a signed {bits}-bit integer")
