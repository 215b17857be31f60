"""Kafka protocol primitives shared by the hand-written codecs: errors, varints, a bounds-checked
reader over a request frame.

The wire types are the ones of Kafka's message schemas: big-endian fixed-width integers; legacy
strings, bytes and arrays prefixed by an int16/int32 length (-1 = null); and, in flexible versions
(KIP-482), compact strings, bytes and arrays prefixed by an unsigned varint holding length + 1
(0 = null), plus a tagged-field section (a varint count, then per field a varint tag, a varint
size and that many bytes) at the end of every structure.

The reader never lets ``IndexError`` or ``struct.error`` escape: every read checks the bytes left
first and raises a :class:`MalformedRequestError` subclass that names the field it was reading.
"""

from __future__ import annotations

import struct
from typing import Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError, TruncatedError

Chunk = bytes | bytearray | memoryview
"""One piece of an encoded response: a bytes-like object of single bytes (``transport.writelines``
takes a list of these). Record chunks are passed through as given, never copied."""

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")

_VARINT_MAX_BYTES: Final = 5
INT32_MAX: Final = 2**31 - 1


class MalformedRequestError(FormatError):
    """A request whose bytes are not a valid instance of its API's schema at its version.

    Kafka answers such bytes by closing the connection (``InvalidRequestException``); the code is
    ``INVALID_REQUEST`` for logs and for brokers that prefer an error response.
    """

    code = KafkaErrorCode.INVALID_REQUEST


class TruncatedRequestError(MalformedRequestError, TruncatedError):
    """The frame ends before a field, or before the bytes a length prefix declares."""


class UnsupportedVersionError(MalformedRequestError):
    """An API version the hand-written codec does not implement."""

    code = KafkaErrorCode.UNSUPPORTED_VERSION


# --- encoding -----------------------------------------------------------------------------------

_SMALL_UVARINTS: Final = tuple(bytes((value,)) for value in range(128))
_TWO_BYTES: Final = struct.Struct("BB").pack
_THREE_BYTES: Final = struct.Struct("BBB").pack


def encode_uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (7 bits a byte, low group first) of a non-negative int."""
    if value < 0x80:
        if value < 0:
            raise ValueError(f"unsigned varint of a negative number: {value}")
        return _SMALL_UVARINTS[value]
    if value < 0x4000:  # records lengths below 2 MiB: the common cases, unrolled
        return _TWO_BYTES((value & 0x7F) | 0x80, value >> 7)
    if value < 0x200000:
        return _THREE_BYTES((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14)
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_string(value: str, flexible: bool) -> bytes:
    """A non-null STRING (int16 length) or COMPACT_STRING (varint length + 1)."""
    data = value.encode()
    if flexible:
        return encode_uvarint(len(data) + 1) + data
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes does not fit an int16 length")
    return _INT16.pack(len(data)) + data


def encode_array_length(count: int | None, flexible: bool) -> bytes:
    """The length prefix of an ARRAY (int32, -1 = null) or COMPACT_ARRAY (varint count + 1)."""
    if flexible:
        return _SMALL_UVARINTS[0] if count is None else encode_uvarint(count + 1)
    return _INT32.pack(-1 if count is None else count)


# --- decoding -----------------------------------------------------------------------------------


def as_byte_view(frame: bytes | bytearray | memoryview) -> memoryview:
    """A one-dimensional memoryview of single bytes over ``frame`` (no copy)."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise MalformedRequestError("request frame is not a contiguous buffer")
        view = view.cast("B")
    return view


class Reader:
    """A cursor over a request frame; each method reads one wire field named ``what``."""

    __slots__ = ("end", "position", "view")

    def __init__(self, view: memoryview, position: int = 0) -> None:
        self.view = view
        self.position = position
        self.end = len(view)
        if not 0 <= position <= self.end:
            raise TruncatedRequestError(f"offset {position} is outside a frame of {self.end} bytes")

    def remaining(self) -> int:
        return self.end - self.position

    def _take(self, size: int, what: str) -> int:
        start = self.position
        if size > self.end - start:
            raise TruncatedRequestError(
                f"{what}: needs {size} bytes at offset {start}, frame has {self.end - start} left"
            )
        self.position = start + size
        return start

    def int16(self, what: str) -> int:
        value: int = _INT16.unpack_from(self.view, self._take(2, what))[0]
        return value

    def int32(self, what: str) -> int:
        value: int = _INT32.unpack_from(self.view, self._take(4, what))[0]
        return value

    def int64(self, what: str) -> int:
        value: int = _INT64.unpack_from(self.view, self._take(8, what))[0]
        return value

    def uvarint(self, what: str) -> int:
        """An unsigned varint of at most 5 bytes holding a value below 2**32 (Kafka's limit)."""
        view, position, end = self.view, self.position, self.end
        value = 0
        for index in range(_VARINT_MAX_BYTES):
            if position >= end:
                raise TruncatedRequestError(f"{what}: frame ends inside an unsigned varint")
            byte = view[position]
            position += 1
            value |= (byte & 0x7F) << (7 * index)
            if byte < 0x80:
                if value >= 2**32:
                    raise MalformedRequestError(f"{what}: unsigned varint {value} exceeds 32 bits")
                self.position = position
                return value
        raise MalformedRequestError(
            f"{what}: unsigned varint longer than {_VARINT_MAX_BYTES} bytes"
        )

    def _length(self, flexible: bool, what: str, *, nullable: bool, legacy_int16: bool) -> int:
        """A byte or element count; -1 stands for null (refused unless ``nullable``)."""
        if flexible:
            length = self.uvarint(what) - 1
            if length > INT32_MAX:
                raise MalformedRequestError(f"{what}: length {length} exceeds an int32")
        elif legacy_int16:
            length = self.int16(what)
        else:
            length = self.int32(what)
        if length < -1 or (length == -1 and not nullable):
            raise MalformedRequestError(f"{what}: invalid length {length}")
        return length

    def nullable_string(self, flexible: bool, what: str) -> str | None:
        """A nullable STRING/COMPACT_STRING (UTF-8)."""
        length = self._length(flexible, what, nullable=True, legacy_int16=True)
        return None if length == -1 else self._utf8(length, what)

    def string(self, flexible: bool, what: str) -> str:
        """A non-null STRING/COMPACT_STRING (UTF-8)."""
        return self._utf8(self._length(flexible, what, nullable=False, legacy_int16=True), what)

    def _utf8(self, length: int, what: str) -> str:
        start = self._take(length, what)
        try:
            return str(self.view[start : start + length], "utf-8")
        except UnicodeDecodeError as error:
            raise MalformedRequestError(f"{what}: not valid UTF-8 ({error.reason})") from None

    def bytes_view(self, flexible: bool, what: str, *, nullable: bool) -> memoryview | None:
        """BYTES/RECORDS (int32 or compact length) as a slice of the frame, no copy."""
        length = self._length(flexible, what, nullable=nullable, legacy_int16=False)
        if length == -1:
            return None
        start = self._take(length, what)
        return self.view[start : start + length]

    def array_length(self, flexible: bool, what: str, *, nullable: bool = False) -> int:
        """An element count, checked against the bytes left (each element takes at least one)."""
        count = self._length(flexible, what, nullable=nullable, legacy_int16=False)
        if count > self.end - self.position:
            raise TruncatedRequestError(
                f"{what}: {count} elements cannot fit in the {self.end - self.position} bytes left"
            )
        return count

    def skip_tagged_fields(self, what: str) -> None:
        """Skip a tagged-field section whole: no tag is known to the codecs, so all are ignored
        (KIP-482: a reader must ignore the tags it does not know)."""
        if self.position < self.end and self.view[self.position] == 0:
            self.position += 1  # the usual case: no tagged fields
            return
        count = self.uvarint(f"{what} tagged field count")
        for _ in range(count):
            self.uvarint(f"{what} tag")
            size = self.uvarint(f"{what} tagged field size")
            self._take(size, f"{what} tagged field")

    def expect_end(self, what: str) -> None:
        if self.position != self.end:
            raise MalformedRequestError(
                f"{what}: {self.end - self.position} unexpected bytes after the message"
            )
