"""RecordBatch v2 (magic 2): a zero-copy checked view, in-place offset patching, framing.

The batch layout and its constants are in ``record_batch_layout.py``, the records inside a batch
in ``record_codec.py``, the column decoder in ``record_columns.py`` and the builder in
``record_batch_builder.py``; this module re-exports them, so ``record_batch`` stays the one name
to import from.

Why a zero-copy view: on the produce path a batch is checked, patched and stored as the client's
bytes (AutoMQ never recompresses), so the only work that must touch every byte is the CRC.
:class:`RecordBatchView` keeps a ``memoryview`` slice of exactly one batch, reads header fields
with ``struct.unpack_from`` when asked, and hands the ``crc32c`` extension a memoryview slice,
which it reads in place. Nothing in parsing or validation copies the batch.

Checked by default: the constructor, :meth:`RecordBatchView.parse` and :func:`iter_batches`
validate before returning (magic, framing, CRC, codec id, offset range, sequence). The one way to
get an unvalidated view is :meth:`RecordBatchView.unchecked`, meant for bytes this process already
validated; it still checks the framing, because the view's extent depends on it.

The offset-range rule has two forms. A batch a client produces holds one record per offset
(``recordsCount == lastOffsetDelta + 1``), the default. A batch read back from a log may have
been thinned by log compaction (:mod:`automq_ref.formats.compacted_batch`): it keeps its offsets,
so it holds from 0 to ``lastOffsetDelta + 1`` records; readers of stored batches pass
``compacted=True``.

Records are decoded only on request (:meth:`RecordBatchView.records`), decompressing first with
:func:`automq_ref.formats.codecs.decompress`; every length is checked against the bytes present.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c

from automq_ref.formats.codecs import (
    BytesLike,
    CompressionType,
    compression_type_from_id,
    decompress,
)
from automq_ref.formats.errors import (
    BadMagicError,
    ChecksumError,
    InvalidFieldError,
    TruncatedError,
)
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.formats.record_batch_layout import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    BATCH_LENGTH_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_COVERAGE_START,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_STRUCT,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    MIN_BATCH_LENGTH,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    RecordBatchHeader,
    TimestampType,
)
from automq_ref.formats.record_codec import (
    Record,
    RecordInput,
    RecordLike,
    decode_records,
    encode_varint,
    encode_varlong,
    read_varint,
    read_varlong,
    require_signed_range,
)
from automq_ref.formats.record_columns import RecordColumns, SlowPath, decode_columns

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
    "RecordColumns",
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

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")


class RecordBatchView:
    """A validated, zero-copy view of one RecordBatch v2 inside a larger buffer.

    ``RecordBatchView(buffer, position)`` (or :meth:`parse`) frames the batch that starts at
    ``position`` and validates it; trailing bytes after it are left alone (see
    :func:`iter_batches`). The view keeps a memoryview slice, so the buffer must outlive it, and a
    ``bytearray`` under it cannot be resized while the view exists.
    """

    __slots__ = ("_buffer",)

    _buffer: memoryview

    def __init__(
        self,
        buffer: BytesLike,
        position: int = 0,
        *,
        verify_crc: bool = True,
        compacted: bool = False,
    ) -> None:
        memory = _byte_memoryview(buffer)
        # Magic first: a v0/v1 message has its magic at the same byte but a shorter minimum
        # length, and "wrong magic" is the error that tells the sender what is wrong.
        _check_magic_if_present(memory, position)
        self._buffer = _slice_batch(memory, position)
        self.validate(verify_crc=verify_crc, compacted=compacted)

    @classmethod
    def parse(
        cls,
        buffer: BytesLike,
        position: int = 0,
        *,
        verify_crc: bool = True,
        compacted: bool = False,
    ) -> RecordBatchView:
        """Frame and validate the batch at ``position``; raise a FormatError subclass if invalid.

        ``verify_crc=False`` skips only the CRC, for bytes whose CRC was checked before;
        ``compacted=True`` accepts a batch log compaction thinned (fewer records than offsets).
        """
        return cls(buffer, position, verify_crc=verify_crc, compacted=compacted)

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

    def validate(self, *, verify_crc: bool = True, compacted: bool = False) -> None:
        """Check magic, framing, CRC, codec id, offset range and sequence, in that order.

        ``compacted``: the offset range may hold fewer records than offsets, even none (a batch
        as log compaction leaves it); otherwise exactly one record per offset."""
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
        if compacted:
            if header.last_offset_delta < 0 or not (
                0 <= header.records_count <= header.last_offset_delta + 1
            ):
                raise InvalidFieldError(
                    f"Inconsistent batch offset range: lastOffsetDelta={header.last_offset_delta}"
                    f", recordsCount={header.records_count} (need 0 <= recordsCount <= "
                    f"lastOffsetDelta + 1 in a compacted batch)"
                )
        elif header.records_count <= 0 or header.last_offset_delta + 1 != header.records_count:
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
        return RecordBatchHeader._make(HEADER_STRUCT.unpack_from(self._buffer))

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
        require_signed_range("base_offset", base_offset, 64)
        _INT64.pack_into(self._buffer, BASE_OFFSET_OFFSET, base_offset)

    def set_partition_leader_epoch(self, partition_leader_epoch: int) -> None:
        """Write partitionLeaderEpoch in place; bytes 12-15 are outside the CRC too."""
        self._require_writable("partitionLeaderEpoch")
        require_signed_range("partition_leader_epoch", partition_leader_epoch, 32)
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
        return decode_records(
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
            return decode_columns(
                bytes(payload),
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                log_append_time,
                include_headers,
            )
        except SlowPath:
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
    buffer: BytesLike,
    *,
    verify_crc: bool = True,
    allow_partial_tail: bool = False,
    compacted: bool = False,
) -> Iterator[RecordBatchView]:
    """Yield a validated view of each batch in ``buffer``, in order, without copying.

    A batch cut off at the end raises TruncatedError, unless ``allow_partial_tail``: then
    iteration stops there silently, as a Kafka consumer does with a fetch response that ends
    inside a batch. A tail whose length or magic is invalid is not "partial": it still raises.
    Errors surface when iteration reaches the bad batch. ``compacted`` as in
    :meth:`RecordBatchView.validate` (for batches read back from a log).
    """
    memory = _byte_memoryview(buffer)
    position = 0
    while position < len(memory):
        if allow_partial_tail and _is_partial_tail(memory, position):
            return
        view = RecordBatchView(memory, position, verify_crc=verify_crc, compacted=compacted)
        yield view
        position += view.size_bytes


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
