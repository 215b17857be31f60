"""StreamRecordBatch (SRB): the unit AutoMQ stores in its WAL, its caches and its objects.

Layout (big-endian), a 33-byte header followed by the payload::

    offset size field
    0      1    magic          0x22 (MAGIC_V0); anything else is refused
    1      8    streamId       i64
    9      8    epoch          i64, stream epoch of the writer
    17     8    baseOffset     i64
    25     4    count          i32, offsets covered; negative marks a link record
    29     4    payloadLength  i32
    33     n    payload        opaque (for a Kafka data stream: one raw Kafka RecordBatch)

The exclusive end offset is ``base + count`` for an ordinary batch and ``base - count`` for a link
record (``count < 0``), so every batch covers at least one offset. The one exception is the "fake"
trim record the S3 WAL writes to persist a trim point: streamId -1, epoch -1, base 0, count 0 and
an empty payload (:data:`FAKE_TRIM_RECORD`). It is the only batch allowed to cover no offsets and
the only one allowed a negative stream id.

The header carries no checksum of its own: integrity comes from the container (the WAL record CRC,
or, for objects, the fact that we write them once and validate every header against the object's
index when reading). :func:`decode` therefore checks everything that can be checked structurally:
the magic, a non-negative payload length that fits the buffer, and field values that make sense
(non-negative offsets, an end offset that fits in an i64, a non-zero count).

Payloads are copied by this module only into an encoding: :func:`decode` returns a ``memoryview``
slice of the buffer it was given, :meth:`StreamRecordBatch.encoded_chunks` hands back the header
and the payload object itself so writers can gather them (``transport.writelines``, multipart
uploads), and :meth:`StreamRecordBatch.encode_held` copies the payload once into an encoding that
the batch it returns then views.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import BadMagicError, InvalidFieldError, TruncatedError

BytesLike = bytes | bytearray | memoryview
"""Buffers the parsers accept; payloads come back as ``memoryview`` slices of them."""

MAGIC_V0: Final = 0x22
HEADER_SIZE_BYTES: Final = 33

_HEADER: Final = struct.Struct(">Bqqqii")
assert _HEADER.size == HEADER_SIZE_BYTES

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1

FAKE_TRIM_STREAM_ID: Final = -1
FAKE_TRIM_EPOCH: Final = -1

# repr shows payloads up to this size in full, so small test cases print as valid Python.
_REPR_PAYLOAD_LIMIT_BYTES: Final = 64


def _as_byte_view(buffer: BytesLike) -> memoryview:
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        # A view of another item type would make len() and slicing count items, not bytes.
        view = view.cast("B")
    return view


@dataclass(frozen=True, slots=True, repr=False)
class StreamRecordBatch:
    """One SRB. Ordering in streams and objects is by (stream_id, base_offset).

    Constructing an invalid batch raises :class:`InvalidFieldError` (a ``ValueError``), so the
    same checks guard both decoded bytes and batches built in code.
    """

    stream_id: int
    epoch: int
    base_offset: int
    count: int
    payload: bytes | memoryview

    def __post_init__(self) -> None:
        if isinstance(self.payload, memoryview) and (
            self.payload.format != "B" or self.payload.ndim != 1
        ):
            object.__setattr__(self, "payload", self.payload.cast("B"))
        if not _INT64_MIN <= self.epoch <= _INT64_MAX:
            raise InvalidFieldError(f"SRB epoch {self.epoch} does not fit in an i64")
        if not _INT32_MIN <= self.count <= _INT32_MAX:
            raise InvalidFieldError(f"SRB count {self.count} does not fit in an i32")
        if len(self.payload) > _INT32_MAX:
            raise InvalidFieldError(f"SRB payload of {len(self.payload)} bytes exceeds i32")
        if self.count == 0 or self.stream_id < 0:
            if not self.is_fake_trim_record:
                raise InvalidFieldError(
                    f"SRB stream {self.stream_id} base {self.base_offset} count {self.count}: "
                    "only the fake trim record may have count 0 or a negative stream id"
                )
            return
        if self.stream_id > _INT64_MAX:
            raise InvalidFieldError(f"SRB stream id {self.stream_id} does not fit in an i64")
        if not 0 <= self.base_offset <= _INT64_MAX:
            raise InvalidFieldError(f"SRB base offset {self.base_offset} is not a valid offset")
        if self.last_offset > _INT64_MAX:
            raise InvalidFieldError(
                f"SRB stream {self.stream_id} base {self.base_offset} count {self.count}: "
                "end offset does not fit in an i64"
            )

    @property
    def last_offset(self) -> int:
        """Exclusive end offset (AutoMQ's ``getLastOffset``)."""
        if self.count < 0:
            return self.base_offset - self.count
        return self.base_offset + self.count

    @property
    def is_link_record(self) -> bool:
        return self.count < 0

    @property
    def is_fake_trim_record(self) -> bool:
        return (
            self.stream_id == FAKE_TRIM_STREAM_ID
            and self.epoch == FAKE_TRIM_EPOCH
            and self.base_offset == 0
            and self.count == 0
            and len(self.payload) == 0
        )

    @property
    def payload_size_bytes(self) -> int:
        """AutoMQ's ``size()``: the payload only, without the 33-byte header."""
        return len(self.payload)

    @property
    def encoded_size_bytes(self) -> int:
        return HEADER_SIZE_BYTES + len(self.payload)

    def encode_header(self) -> bytes:
        return _HEADER.pack(
            MAGIC_V0, self.stream_id, self.epoch, self.base_offset, self.count, len(self.payload)
        )

    def encoded_chunks(self) -> tuple[bytes, bytes | memoryview]:
        """Header and payload as separate chunks, so a writer can gather them without a copy."""
        return self.encode_header(), self.payload

    def encode(self) -> bytes:
        """Header and payload in one ``bytes``: the payload copied once (a ``memoryview``
        too)."""
        return b"".join((self.encode_header(), self.payload))

    def encode_held(self) -> tuple[bytes, StreamRecordBatch]:
        """The encoding, and this batch with its payload a ``memoryview`` of that encoding's
        payload bytes: a writer that needs both the encoded record and the batch (the WAL body
        and the LogCache entry) pays one copy of the payload, and holds no view of the buffer
        the payload came from (a request frame) once this returns."""
        encoded = self.encode()
        held = memoryview(encoded)[HEADER_SIZE_BYTES:]
        return encoded, StreamRecordBatch(
            self.stream_id, self.epoch, self.base_offset, self.count, held
        )

    def __repr__(self) -> str:
        if len(self.payload) <= _REPR_PAYLOAD_LIMIT_BYTES:
            payload_text = repr(bytes(self.payload))
        else:
            payload_text = f"<{len(self.payload)} bytes>"
        return (
            f"StreamRecordBatch(stream_id={self.stream_id}, epoch={self.epoch}, "
            f"base_offset={self.base_offset}, count={self.count}, payload={payload_text})"
        )


FAKE_TRIM_RECORD: Final = StreamRecordBatch(
    stream_id=FAKE_TRIM_STREAM_ID, epoch=FAKE_TRIM_EPOCH, base_offset=0, count=0, payload=b""
)
"""The record the S3 WAL writes to persist a trim point; it covers no offsets."""


def decode(buffer: BytesLike, position: int = 0) -> tuple[StreamRecordBatch, int]:
    """Decode one SRB at ``position``; return it and the position just after it.

    The payload is a ``memoryview`` slice of ``buffer`` (no copy): keep ``buffer`` alive and
    unchanged for as long as the batch is used.
    """
    view = _as_byte_view(buffer)
    if position < 0:
        raise ValueError(f"position {position} is negative")
    if len(view) - position < HEADER_SIZE_BYTES:
        raise TruncatedError(
            f"SRB header at {position} needs {HEADER_SIZE_BYTES} bytes, "
            f"{max(len(view) - position, 0)} remain"
        )
    magic, stream_id, epoch, base_offset, count, payload_length = _HEADER.unpack_from(
        view, position
    )
    if magic != MAGIC_V0:
        raise BadMagicError(f"SRB at {position}: magic {magic:#04x}, expected {MAGIC_V0:#04x}")
    if payload_length < 0:
        raise InvalidFieldError(f"SRB at {position}: negative payload length {payload_length}")
    payload_start = position + HEADER_SIZE_BYTES
    payload_end = payload_start + payload_length
    if payload_end > len(view):
        raise TruncatedError(
            f"SRB at {position}: payload of {payload_length} bytes, "
            f"{len(view) - payload_start} remain"
        )
    batch = StreamRecordBatch(
        stream_id=stream_id,
        epoch=epoch,
        base_offset=base_offset,
        count=count,
        payload=view[payload_start:payload_end],
    )
    return batch, payload_end


def iter_stream_record_batches(buffer: BytesLike) -> Iterator[StreamRecordBatch]:
    """Decode back-to-back SRBs filling ``buffer`` exactly; a partial trailing SRB raises."""
    view = _as_byte_view(buffer)
    position = 0
    while position < len(view):
        batch, position = decode(view, position)
        yield batch
