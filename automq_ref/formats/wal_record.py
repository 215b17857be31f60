"""The WAL record: a 24-byte self-describing header in front of one body.

Layout (big-endian)::

    offset size field
         0    4 magic        0x87654321 data record, 0x76543210 padding record
         4    4 body_length  bytes of body that follow the header
         8    8 body_offset  logical WAL offset of the body = record offset + 24
        16    4 body_crc     CRC-32C of the body
        20    4 header_crc   CRC-32C of bytes [0, 20)

The header checks itself (header_crc) before any of its fields is trusted, so a torn or stale
header is refused before its body length is used to read anything. ``body_offset`` ties a record to
the logical position it was written at: a WAL that reuses space (a ring) can hold a perfectly
valid record from an earlier lap at the same physical place, and only this field tells it apart.

AutoMQ checksums with CRC-32 (zlib polynomial, masked to 31 bits). This project uses CRC-32C,
which the machine computes in hardware roughly ten times faster; the layout is otherwise the same.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

from crc32c import crc32c

from automq_ref.formats.errors import (
    BadMagicError,
    ChecksumError,
    InvalidFieldError,
    TruncatedError,
)

WAL_RECORD_HEADER_SIZE: Final = 24
RECORD_MAGIC_DATA: Final = 0x87654321
RECORD_MAGIC_PADDING: Final = 0x76543210
# One record must fit in a signed 32-bit length, as in AutoMQ; the WAL enforces a smaller cap.
MAX_BODY_LENGTH: Final = (1 << 31) - 1

_HEADER_WITHOUT_CRC = struct.Struct(">IIqI")
_HEADER = struct.Struct(">IIqII")
_UINT32 = struct.Struct(">I")

Buffer: TypeAlias = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class WalRecordHeader:
    magic: int
    body_length: int
    body_offset: int
    body_crc: int

    @property
    def record_offset(self) -> int:
        return self.body_offset - WAL_RECORD_HEADER_SIZE

    @property
    def next_record_offset(self) -> int:
        return self.body_offset + self.body_length

    @property
    def is_padding(self) -> bool:
        return self.magic == RECORD_MAGIC_PADDING


def encode_wal_record_header(body: Buffer, record_offset: int) -> bytes:
    """The 24 header bytes of a data record carrying ``body`` at logical ``record_offset``."""
    return _encode_header(RECORD_MAGIC_DATA, len(body), record_offset, crc32c(body))


def encode_padding_header(record_offset: int, body_length: int) -> bytes:
    """The header of a padding record: it only says how many bytes to skip.

    A padding body is never written nor read, so its CRC field is zero and is not checked.
    """
    return _encode_header(RECORD_MAGIC_PADDING, body_length, record_offset, 0)


def _encode_header(magic: int, body_length: int, record_offset: int, body_crc: int) -> bytes:
    if not 0 <= body_length <= MAX_BODY_LENGTH:
        raise ValueError(f"WAL record body length {body_length} outside [0, {MAX_BODY_LENGTH}]")
    if record_offset < 0:
        raise ValueError(f"negative WAL record offset {record_offset}")
    prefix = _HEADER_WITHOUT_CRC.pack(
        magic, body_length, record_offset + WAL_RECORD_HEADER_SIZE, body_crc
    )
    return prefix + _UINT32.pack(crc32c(prefix))


def encode_wal_record(body: Buffer, record_offset: int) -> bytes:
    """Header and body in one ``bytes`` (tests and tools; the WAL writes the two as an iovec)."""
    return encode_wal_record_header(body, record_offset) + bytes(body)


def decode_wal_record_header(
    buffer: Buffer, position: int, record_offset: int | None
) -> WalRecordHeader:
    """Check and decode the header at ``buffer[position:]``, expected at logical ``record_offset``.

    Raises a :class:`~automq_ref.formats.errors.FormatError` subclass when the bytes are not a
    header written at that offset: too short, bad header CRC, unknown magic, or a body offset
    that belongs to another position (stale data from an earlier lap of a ring). With
    ``record_offset=None`` the header is checked on its own and may claim any offset.
    """
    if position < 0 or len(buffer) - position < WAL_RECORD_HEADER_SIZE:
        raise TruncatedError(
            f"WAL record header needs {WAL_RECORD_HEADER_SIZE} bytes at position {position}, "
            f"buffer holds {max(0, len(buffer) - position)}"
        )
    magic, body_length, body_offset, body_crc, header_crc = _HEADER.unpack_from(buffer, position)
    actual_header_crc = crc32c(memoryview(buffer)[position : position + 20])
    if actual_header_crc != header_crc:
        raise ChecksumError(
            f"WAL record header CRC mismatch at offset {record_offset}: "
            f"stored {header_crc:#010x}, computed {actual_header_crc:#010x}"
        )
    if magic not in (RECORD_MAGIC_DATA, RECORD_MAGIC_PADDING):
        raise BadMagicError(f"WAL record magic {magic:#010x} at offset {record_offset}")
    if record_offset is None:
        record_offset = body_offset - WAL_RECORD_HEADER_SIZE
    expected_body_offset = record_offset + WAL_RECORD_HEADER_SIZE
    if body_offset != expected_body_offset or body_offset < WAL_RECORD_HEADER_SIZE:
        raise InvalidFieldError(
            f"WAL record at offset {record_offset} claims body offset {body_offset}, "
            f"expected {expected_body_offset} (stale or misplaced record)"
        )
    if body_length > MAX_BODY_LENGTH:
        raise InvalidFieldError(f"WAL record body length {body_length} exceeds {MAX_BODY_LENGTH}")
    return WalRecordHeader(magic, body_length, body_offset, body_crc)


def check_wal_record_body(header: WalRecordHeader, body: Buffer) -> None:
    """Raise unless ``body`` is exactly the body ``header`` describes (data records only)."""
    if len(body) != header.body_length:
        raise TruncatedError(
            f"WAL record at offset {header.record_offset} needs {header.body_length} body bytes, "
            f"got {len(body)}"
        )
    actual_crc = crc32c(body)
    if actual_crc != header.body_crc:
        raise ChecksumError(
            f"WAL record body CRC mismatch at offset {header.record_offset}: "
            f"stored {header.body_crc:#010x}, computed {actual_crc:#010x}"
        )


def decode_wal_record(
    buffer: Buffer, position: int, record_offset: int
) -> tuple[WalRecordHeader, memoryview]:
    """Check and decode one whole record; the body is returned as a view into ``buffer``."""
    header = decode_wal_record_header(buffer, position, record_offset)
    body_start = position + WAL_RECORD_HEADER_SIZE
    body = memoryview(buffer)[body_start : body_start + header.body_length]
    check_wal_record_body(header, body)
    return header, body
