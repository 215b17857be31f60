"""The s3stream "normal" object (type 0): data blocks, an index block and a footer.

Layout (big-endian)::

    [DataBlock]* [IndexBlock] [Footer]

    DataBlock   magic 0x5A u8, flag 0x02 u8, recordCount i32, dataLength i32 (= block size - 10),
                then the encoded StreamRecordBatches (SRBs) of ONE stream, offsets contiguous.
    IndexBlock  one 36-byte entry per data block, in write order: streamId i64, startOffset i64,
                endOffsetDelta i32, recordCount i32, startPosition i64, blockSize i32 (block size
                including its 10-byte header).
    Footer      48 bytes: indexStartPosition i64, indexLength i32, 28 reserved bytes (written as
                zeros), magic u64 0x88e241b785f4cff7.

Writer (:class:`ObjectWriter`). Streams come in non-decreasing stream id order; within a stream a
batch starts at or after the previous batch's end. A gap (start > previous end) is allowed, as in
AutoMQ, but a block must be offset-contiguous, so a gap closes the current block; so does a new
stream. Blocks are cut by a soft limit: once the encoded SRBs of the open block reach
``block_size_threshold_bytes`` the block is closed, so a block exceeds the threshold by at most
its last record. Two deliberate differences from AutoMQ's ObjectWriter, neither visible in the
format: the accumulator is the open block's own size, so it restarts with every block (AutoMQ
keeps one counter across streams, which cuts the next stream's first block early); and it counts
encoded bytes (33-byte header + payload) rather than payload bytes, so a run of empty payloads
still ends up in bounded blocks. A block is also closed before it would overflow the i32 fields
(offset span, record count, size). An object with no batches is valid: no data blocks, an empty
index at position 0 and the footer, 48 bytes in all; readers find nothing in it.

Reader helpers, pure, for an I/O shell that fetches ranges:
:func:`tail_read_size` (AutoMQ's first tail GET), :func:`parse_footer`,
:func:`slice_index_from_tail` (None when a second GET of the index is needed), :func:`parse_index`,
:func:`find` (the blocks to fetch for a read), :func:`parse_data_block` and
:func:`parse_data_block_tail` (the rest of a block from one of its records on, for a reader that
read the block's first records and no longer holds it). Reads return whole blocks, or a block's
rest; callers cut records to the range they want. :class:`ObjectFileReader` combines them for a
whole object held in memory.

What is checked, and what cannot be. :func:`parse_footer` checks the magic and that the index
lies exactly between the data region and the footer. :func:`parse_index` checks that entries are
sorted by (stream, start offset), that a stream's entries do not overlap, that the blocks tile the
data region from position 0 with no gap or overlap, and that counts, spans and sizes are
consistent (a block of ``n`` records is at least ``10 + 33 n`` bytes and spans at least ``n``
offsets). :func:`parse_data_block` checks the block header against its index entry and every SRB
header against the entry: same stream, offsets exactly covering [startOffset, endOffset) with no
gap, records filling the block exactly. The reserved footer bytes are not checked, as AutoMQ does
not check them, so a future writer may use them. The format has NO checksum over SRB payloads,
and nothing else in the object constrains an SRB's epoch field: a flipped payload or epoch byte
is returned as if it had been written so, exactly as in AutoMQ (object integrity rests on the
object store). We keep the format byte-compatible rather than add a checksum extension; the
corruption property test therefore flips only structural bytes (block headers, SRB headers other
than the epoch, index, footer), all of which are covered by the checks above.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from automq_ref.formats.errors import BadMagicError, InvalidFieldError, TruncatedError
from automq_ref.formats.stream_record_batch import (
    HEADER_SIZE_BYTES as RECORD_HEADER_SIZE_BYTES,
)
from automq_ref.formats.stream_record_batch import (
    BytesLike,
    StreamRecordBatch,
    decode,
)

DATA_BLOCK_MAGIC: Final = 0x5A
DATA_BLOCK_FLAG: Final = 0x02
DATA_BLOCK_HEADER_SIZE_BYTES: Final = 10
INDEX_ENTRY_SIZE_BYTES: Final = 36
FOOTER_SIZE_BYTES: Final = 48
FOOTER_MAGIC: Final = 0x88E241B785F4CFF7
DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES: Final = 512 * 1024

_DATA_BLOCK_HEADER: Final = struct.Struct(">BBii")
_INDEX_ENTRY: Final = struct.Struct(">qqiiqi")
# The magic does not fit a signed i64, so it is read unsigned; the 28 reserved bytes are skipped.
_FOOTER: Final = struct.Struct(">qi28xQ")
assert _DATA_BLOCK_HEADER.size == DATA_BLOCK_HEADER_SIZE_BYTES
assert _INDEX_ENTRY.size == INDEX_ENTRY_SIZE_BYTES
assert _FOOTER.size == FOOTER_SIZE_BYTES

_INT32_MAX: Final = (1 << 31) - 1
_INT64_MAX: Final = (1 << 63) - 1
_MIB: Final = 1024 * 1024
_TAIL_READ_BASE_BYTES: Final = 8192


class ObjectWriteOrderError(ValueError):
    """A batch handed to :class:`ObjectWriter` out of (stream id, offset) order."""


@dataclass(frozen=True, slots=True)
class DataBlockIndex:
    """One index entry: where a data block lies and which offsets of which stream it holds."""

    stream_id: int
    start_offset: int
    end_offset_delta: int
    record_count: int
    start_position: int
    block_size_bytes: int

    @property
    def end_offset(self) -> int:
        """Exclusive end offset of the block."""
        return self.start_offset + self.end_offset_delta

    @property
    def end_position(self) -> int:
        return self.start_position + self.block_size_bytes

    @property
    def estimated_payload_size_bytes(self) -> int:
        """AutoMQ's budget charge for a block: its size minus the block and SRB headers."""
        return (
            self.block_size_bytes
            - self.record_count * RECORD_HEADER_SIZE_BYTES
            - DATA_BLOCK_HEADER_SIZE_BYTES
        )

    def encode(self) -> bytes:
        return _INDEX_ENTRY.pack(
            self.stream_id,
            self.start_offset,
            self.end_offset_delta,
            self.record_count,
            self.start_position,
            self.block_size_bytes,
        )


class IndexLocation(NamedTuple):
    """Where the footer says the index block is."""

    start_position: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class WrittenObject:
    """A finished object as chunks to gather: one per data block, then the index and the
    footer."""

    chunks: tuple[bytes | memoryview, ...]
    size_bytes: int
    indexes: tuple[DataBlockIndex, ...]
    index_start_position: int

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks)


class ObjectWriter:
    """Builds one object from batches given in (stream id, offset) order.

    The writer keeps references to the batches' payloads while a block is open and copies each
    block into one chunk when it closes: an object of many small batches is then a few chunks,
    not two per batch. Every later step walks the chunk list on the event loop (sizing it,
    viewing it, handing it to ``writev``), and at two chunks per batch that walk took tens of
    milliseconds for an object of a producer's small batches (docs/benchmarks.md, "Catch-up
    reads beside producers"); the copy of a block is far cheaper and happens where the object
    is built (an upload builds it in a thread).
    """

    def __init__(
        self, block_size_threshold_bytes: int = DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES
    ) -> None:
        if not 1 <= block_size_threshold_bytes <= _INT32_MAX:
            raise ValueError(
                f"block_size_threshold_bytes must be in [1, {_INT32_MAX}], "
                f"got {block_size_threshold_bytes}"
            )
        self._block_size_threshold_bytes = block_size_threshold_bytes
        self._chunks: list[bytes | memoryview] = []
        self._indexes: list[DataBlockIndex] = []
        self._closed_blocks_size_bytes = 0
        # Order check state: the last batch written, across block boundaries.
        self._last_stream_id: int | None = None
        self._last_end_offset = 0
        # The open block (empty when _block_record_count == 0).
        self._block_chunks: list[bytes | memoryview] = []
        self._block_stream_id = 0
        self._block_start_offset = 0
        self._block_end_offset = 0
        self._block_record_count = 0
        self._block_data_length_bytes = 0
        self._closed = False

    @property
    def block_size_threshold_bytes(self) -> int:
        return self._block_size_threshold_bytes

    @property
    def indexes(self) -> tuple[DataBlockIndex, ...]:
        """Entries of the blocks closed so far (all blocks once :meth:`close` has run)."""
        return tuple(self._indexes)

    @property
    def size_bytes(self) -> int:
        """Bytes written so far: closed blocks plus the open block with its header."""
        open_block_size_bytes = (
            DATA_BLOCK_HEADER_SIZE_BYTES + self._block_data_length_bytes
            if self._block_record_count
            else 0
        )
        return self._closed_blocks_size_bytes + open_block_size_bytes

    def write(self, batch: StreamRecordBatch) -> None:
        if self._closed:
            raise RuntimeError("ObjectWriter.write after close")
        if batch.is_fake_trim_record:
            raise ValueError("the fake trim record belongs to the WAL, not to objects")
        if DATA_BLOCK_HEADER_SIZE_BYTES + batch.encoded_size_bytes > _INT32_MAX:
            raise ValueError(
                f"stream {batch.stream_id} base {batch.base_offset}: a batch of "
                f"{batch.encoded_size_bytes} bytes does not fit in one data block"
            )
        self._check_order(batch)
        if self._block_record_count and not self._fits_open_block(batch):
            self._close_block()
        if not self._block_record_count:
            self._block_stream_id = batch.stream_id
            self._block_start_offset = batch.base_offset
        header, payload = batch.encoded_chunks()
        self._block_chunks.append(header)
        if len(payload):
            self._block_chunks.append(payload)
        self._block_end_offset = batch.last_offset
        self._block_record_count += 1
        self._block_data_length_bytes += batch.encoded_size_bytes
        self._last_stream_id = batch.stream_id
        self._last_end_offset = batch.last_offset
        if self._block_data_length_bytes >= self._block_size_threshold_bytes:
            self._close_block()

    def close(self) -> WrittenObject:
        """Close the open block and append the index and the footer."""
        if self._closed:
            raise RuntimeError("ObjectWriter.close called twice")
        if self._block_record_count:
            self._close_block()
        self._closed = True
        index_start_position = self._closed_blocks_size_bytes
        index_bytes = b"".join(entry.encode() for entry in self._indexes)
        footer = _FOOTER.pack(index_start_position, len(index_bytes), FOOTER_MAGIC)
        self._chunks.append(index_bytes)
        self._chunks.append(footer)
        return WrittenObject(
            chunks=tuple(self._chunks),
            size_bytes=index_start_position + len(index_bytes) + len(footer),
            indexes=tuple(self._indexes),
            index_start_position=index_start_position,
        )

    def _check_order(self, batch: StreamRecordBatch) -> None:
        if self._last_stream_id is None:
            return
        if batch.stream_id < self._last_stream_id:
            raise ObjectWriteOrderError(
                f"stream {batch.stream_id} written after stream {self._last_stream_id}: "
                "streams must come in non-decreasing id order"
            )
        if batch.stream_id == self._last_stream_id and batch.base_offset < self._last_end_offset:
            raise ObjectWriteOrderError(
                f"stream {batch.stream_id}: batch at base offset {batch.base_offset} overlaps "
                f"the previous batch, which ends at offset {self._last_end_offset}"
            )

    def _fits_open_block(self, batch: StreamRecordBatch) -> bool:
        return (
            batch.stream_id == self._block_stream_id
            and batch.base_offset == self._block_end_offset
            and batch.last_offset - self._block_start_offset <= _INT32_MAX
            and self._block_record_count < _INT32_MAX
            and DATA_BLOCK_HEADER_SIZE_BYTES
            + self._block_data_length_bytes
            + batch.encoded_size_bytes
            <= _INT32_MAX
        )

    def _close_block(self) -> None:
        block_size_bytes = DATA_BLOCK_HEADER_SIZE_BYTES + self._block_data_length_bytes
        header = _DATA_BLOCK_HEADER.pack(
            DATA_BLOCK_MAGIC,
            DATA_BLOCK_FLAG,
            self._block_record_count,
            self._block_data_length_bytes,
        )
        self._chunks.append(b"".join((header, *self._block_chunks)))
        self._indexes.append(
            DataBlockIndex(
                stream_id=self._block_stream_id,
                start_offset=self._block_start_offset,
                end_offset_delta=self._block_end_offset - self._block_start_offset,
                record_count=self._block_record_count,
                start_position=self._closed_blocks_size_bytes,
                block_size_bytes=block_size_bytes,
            )
        )
        self._closed_blocks_size_bytes += block_size_bytes
        self._block_chunks = []
        self._block_record_count = 0
        self._block_data_length_bytes = 0


def tail_read_size(object_size: int) -> int:
    """Bytes of the first tail GET, as AutoMQ's reader sizes it: likely to hold the index."""
    if object_size < 0:
        raise ValueError(f"object size {object_size} is negative")
    return min(object_size, _TAIL_READ_BASE_BYTES + (object_size // _MIB) * INDEX_ENTRY_SIZE_BYTES)


def parse_footer(tail: BytesLike, object_size: int) -> IndexLocation:
    """Read the footer from the last ``len(tail)`` bytes of an object of ``object_size`` bytes."""
    view = memoryview(tail).cast("B")
    if len(view) > object_size:
        raise ValueError(f"tail of {len(view)} bytes is longer than the object ({object_size})")
    if len(view) < FOOTER_SIZE_BYTES:
        raise TruncatedError(
            f"object tail of {len(view)} bytes is shorter than the {FOOTER_SIZE_BYTES}-byte footer"
        )
    index_start_position, index_length_bytes, magic = _FOOTER.unpack_from(
        view, len(view) - FOOTER_SIZE_BYTES
    )
    if magic != FOOTER_MAGIC:
        raise BadMagicError(f"object footer magic {magic:#018x}, expected {FOOTER_MAGIC:#018x}")
    if index_start_position < 0 or index_length_bytes < 0:
        raise InvalidFieldError(
            f"object footer: index at {index_start_position}, length {index_length_bytes}"
        )
    if index_start_position + index_length_bytes != object_size - FOOTER_SIZE_BYTES:
        raise InvalidFieldError(
            f"object footer: index [{index_start_position}, "
            f"{index_start_position + index_length_bytes}) does not end where the footer "
            f"starts ({object_size - FOOTER_SIZE_BYTES})"
        )
    return IndexLocation(index_start_position, index_length_bytes)


def slice_index_from_tail(
    tail: BytesLike, object_size: int, location: IndexLocation
) -> memoryview | None:
    """The index bytes if the tail already holds them, else None (GET the index range then)."""
    view = memoryview(tail).cast("B")
    tail_start_position = object_size - len(view)
    if location.start_position < tail_start_position:
        return None
    relative_start = location.start_position - tail_start_position
    return view[relative_start : relative_start + location.length_bytes]


def parse_index(index_bytes: BytesLike, *, index_start_position: int) -> tuple[DataBlockIndex, ...]:
    """Parse and validate the index block; ``index_start_position`` is where the data region ends.

    Entries must tile the data region [0, index_start_position) in order, be sorted by
    (stream id, start offset), and not overlap within a stream.
    """
    view = memoryview(index_bytes).cast("B")
    if len(view) % INDEX_ENTRY_SIZE_BYTES:
        raise InvalidFieldError(
            f"index of {len(view)} bytes is not a multiple of {INDEX_ENTRY_SIZE_BYTES}"
        )
    entries: list[DataBlockIndex] = []
    expected_position = 0
    previous: DataBlockIndex | None = None
    for position in range(0, len(view), INDEX_ENTRY_SIZE_BYTES):
        entry = DataBlockIndex(*_INDEX_ENTRY.unpack_from(view, position))
        number = len(entries)
        _check_index_entry_fields(entry, number)
        if entry.start_position != expected_position:
            raise InvalidFieldError(
                f"index entry {number}: block at position {entry.start_position}, "
                f"expected {expected_position} (blocks must tile the data region)"
            )
        if previous is not None:
            _check_index_entry_order(previous, entry, number)
        expected_position = entry.end_position
        previous = entry
        entries.append(entry)
    if expected_position != index_start_position:
        raise InvalidFieldError(
            f"index: data blocks end at {expected_position}, index starts at {index_start_position}"
        )
    return tuple(entries)


def _check_index_entry_fields(entry: DataBlockIndex, number: int) -> None:
    if entry.stream_id < 0 or entry.start_offset < 0:
        raise InvalidFieldError(
            f"index entry {number}: stream {entry.stream_id}, start offset {entry.start_offset}"
        )
    if entry.record_count < 1 or entry.end_offset_delta < entry.record_count:
        # Every stored SRB covers at least one offset, so a block spans >= record_count offsets.
        raise InvalidFieldError(
            f"index entry {number}: {entry.record_count} records spanning "
            f"{entry.end_offset_delta} offsets"
        )
    if entry.end_offset > _INT64_MAX:
        raise InvalidFieldError(f"index entry {number}: end offset overflows an i64")
    minimum_size_bytes = (
        DATA_BLOCK_HEADER_SIZE_BYTES + entry.record_count * RECORD_HEADER_SIZE_BYTES
    )
    if entry.block_size_bytes < minimum_size_bytes:
        raise InvalidFieldError(
            f"index entry {number}: block of {entry.block_size_bytes} bytes cannot hold "
            f"{entry.record_count} records"
        )


def _check_index_entry_order(previous: DataBlockIndex, entry: DataBlockIndex, number: int) -> None:
    if entry.stream_id < previous.stream_id:
        raise InvalidFieldError(
            f"index entry {number}: stream {entry.stream_id} after stream {previous.stream_id}"
        )
    if entry.stream_id == previous.stream_id and entry.start_offset < previous.end_offset:
        raise InvalidFieldError(
            f"index entry {number}: stream {entry.stream_id} block starts at "
            f"{entry.start_offset}, before the previous block's end {previous.end_offset}"
        )


def _stream_and_end_offset(entry: DataBlockIndex) -> tuple[int, int]:
    return entry.stream_id, entry.end_offset


def find(
    indexes: Sequence[DataBlockIndex],
    stream_id: int,
    start_offset: int,
    end_offset: int | None,
    max_bytes: int,
) -> list[DataBlockIndex]:
    """Blocks to read for ``stream_id`` from ``start_offset``, as AutoMQ's ``IndexBlock.find``.

    Starts at the block covering ``start_offset`` (none covering it: nothing found), then walks
    forward while the next block is of the same stream and starts where the previous ended.
    Stops once ``end_offset`` (exclusive; None for unbounded) is reached or ``max_bytes`` is
    spent. The first block is not charged, since only part of it may be wanted, so at least one
    block is returned whenever one covers ``start_offset``; each further block is charged its
    estimated payload and the block that spends the budget is still returned (a negative budget
    counts as 0). An empty range finds nothing. ``indexes`` must be sorted as :func:`parse_index`
    guarantees.
    """
    if end_offset is not None and end_offset <= start_offset:
        return []
    position = bisect.bisect_right(indexes, (stream_id, start_offset), key=_stream_and_end_offset)
    if position == len(indexes):
        return []
    first = indexes[position]
    if first.stream_id != stream_id or first.start_offset > start_offset:
        return []
    found = [first]
    remaining_bytes = max(max_bytes, 0)
    next_offset = first.end_offset
    for entry in itertools.islice(indexes, position + 1, None):
        if end_offset is not None and next_offset >= end_offset:
            break
        if remaining_bytes == 0:
            break
        if entry.stream_id != stream_id or entry.start_offset != next_offset:
            break
        found.append(entry)
        remaining_bytes -= min(remaining_bytes, entry.estimated_payload_size_bytes)
        next_offset = entry.end_offset
    return found


def parse_data_block(block_bytes: BytesLike, expected: DataBlockIndex) -> list[StreamRecordBatch]:
    """Decode a whole data block and check it against its index entry.

    Payloads are ``memoryview`` slices of ``block_bytes``.
    """
    view = memoryview(block_bytes).cast("B")
    where = f"data block of stream {expected.stream_id} at {expected.start_position}"
    if len(view) < expected.block_size_bytes:
        raise TruncatedError(f"{where}: {len(view)} bytes, index says {expected.block_size_bytes}")
    if len(view) > expected.block_size_bytes:
        raise InvalidFieldError(
            f"{where}: {len(view)} bytes, index says {expected.block_size_bytes}"
        )
    magic, flag, record_count, data_length_bytes = _DATA_BLOCK_HEADER.unpack_from(view, 0)
    if magic != DATA_BLOCK_MAGIC:
        raise BadMagicError(f"{where}: magic {magic:#04x}, expected {DATA_BLOCK_MAGIC:#04x}")
    if flag != DATA_BLOCK_FLAG:
        # The flag's upper bits are reserved for compression, which no writer uses yet.
        raise BadMagicError(f"{where}: flag {flag:#04x}, expected {DATA_BLOCK_FLAG:#04x}")
    if record_count != expected.record_count:
        raise InvalidFieldError(
            f"{where}: header says {record_count} records, index says {expected.record_count}"
        )
    if data_length_bytes != expected.block_size_bytes - DATA_BLOCK_HEADER_SIZE_BYTES:
        raise InvalidFieldError(
            f"{where}: header data length {data_length_bytes}, index block size "
            f"{expected.block_size_bytes}"
        )
    batches, position, next_offset = _records(
        view, DATA_BLOCK_HEADER_SIZE_BYTES, expected, expected.start_offset, where, record_count
    )
    if position != len(view):
        raise InvalidFieldError(
            f"{where}: {record_count} records end at {position}, block is {len(view)} bytes"
        )
    _check_end(next_offset, expected, where)
    return batches


def _records(
    view: memoryview,
    position: int,
    expected: DataBlockIndex,
    next_offset: int,
    where: str,
    count: int | None,
) -> tuple[list[StreamRecordBatch], int, int]:
    """``count`` records of ``expected``'s stream from ``position`` of ``view`` (with None, up
    to its end), contiguous from ``next_offset``; the position and offset after them."""
    batches: list[StreamRecordBatch] = []
    while (position < len(view)) if count is None else (len(batches) < count):
        batch, position = decode(view, position)
        if batch.stream_id != expected.stream_id or batch.base_offset != next_offset:
            raise InvalidFieldError(
                f"{where}: record {len(batches)} is stream {batch.stream_id} base "
                f"{batch.base_offset}, expected stream {expected.stream_id} base {next_offset}"
            )
        next_offset = batch.last_offset
        batches.append(batch)
    return batches, position, next_offset


def _check_end(next_offset: int, expected: DataBlockIndex, where: str) -> None:
    if next_offset != expected.end_offset:
        raise InvalidFieldError(
            f"{where}: records end at offset {next_offset}, index says {expected.end_offset}"
        )


def parse_data_block_tail(
    tail_bytes: BytesLike, expected: DataBlockIndex, from_position: int, from_offset: int
) -> list[StreamRecordBatch]:
    """Decode the rest of a data block: the bytes from ``from_position`` (relative to the block's
    start, where a record of offset ``from_offset`` begins) to the block's end, checked as
    :func:`parse_data_block` checks a whole block, less its header: every record of the entry's
    stream, contiguous from ``from_offset`` to the entry's end offset, filling the bytes exactly.

    Payloads are ``memoryview`` slices of ``tail_bytes``."""
    view = memoryview(tail_bytes).cast("B")
    where = (
        f"data block of stream {expected.stream_id} at {expected.start_position}, "
        f"from {from_position}"
    )
    if not DATA_BLOCK_HEADER_SIZE_BYTES <= from_position < expected.block_size_bytes:
        raise ValueError(f"{where}: the position is not inside the block's records")
    if not expected.start_offset <= from_offset < expected.end_offset:
        raise ValueError(f"{where}: offset {from_offset} is not in the block")
    rest = expected.block_size_bytes - from_position
    if len(view) != rest:
        error = TruncatedError if len(view) < rest else InvalidFieldError
        raise error(f"{where}: {len(view)} bytes, the index says {rest}")
    batches, _, next_offset = _records(view, 0, expected, from_offset, where, None)
    _check_end(next_offset, expected, where)
    return batches


class ObjectFileReader:
    """A whole object in memory, parsed and validated up front (tests, tools, compaction)."""

    def __init__(self, data: BytesLike) -> None:
        self._view = memoryview(data).cast("B")
        self._location = parse_footer(self._view, len(self._view))
        index_bytes = self._view[
            self._location.start_position : self._location.start_position
            + self._location.length_bytes
        ]
        self._indexes = parse_index(index_bytes, index_start_position=self._location.start_position)

    @property
    def size_bytes(self) -> int:
        return len(self._view)

    @property
    def index_location(self) -> IndexLocation:
        return self._location

    @property
    def indexes(self) -> tuple[DataBlockIndex, ...]:
        return self._indexes

    def find(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        max_bytes: int = _INT32_MAX,
    ) -> list[DataBlockIndex]:
        return find(self._indexes, stream_id, start_offset, end_offset, max_bytes)

    def read_block(self, entry: DataBlockIndex) -> list[StreamRecordBatch]:
        if entry.end_position > self._location.start_position or entry.start_position < 0:
            raise ValueError(f"block {entry} lies outside this object's data region")
        return parse_data_block(self._view[entry.start_position : entry.end_position], entry)

    def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        max_bytes: int = _INT32_MAX,
    ) -> list[StreamRecordBatch]:
        """Whole blocks' batches, as :meth:`find` selects them; the first may start earlier."""
        return [
            batch
            for entry in self.find(stream_id, start_offset, end_offset, max_bytes)
            for batch in self.read_block(entry)
        ]

    def iter_batches(self) -> Iterator[StreamRecordBatch]:
        for entry in self._indexes:
            yield from self.read_block(entry)
