"""The s3stream object: a hand-built object, writer rules, block cutting, find(), bad bytes."""

from __future__ import annotations

import struct

import pytest

from automq_ref.formats.errors import (
    BadMagicError,
    FormatError,
    InvalidFieldError,
    TruncatedError,
)
from automq_ref.formats.object_file import (
    DataBlockIndex,
    IndexLocation,
    ObjectFileReader,
    ObjectWriteOrderError,
    ObjectWriter,
    find,
    parse_data_block,
    parse_data_block_tail,
    parse_footer,
    parse_index,
    slice_index_from_tail,
    tail_read_size,
)
from automq_ref.formats.stream_record_batch import FAKE_TRIM_RECORD, StreamRecordBatch

_RECORD_HEADER = struct.Struct(">Bqqqii")
_BLOCK_HEADER = struct.Struct(">BBii")
_INDEX_ENTRY = struct.Struct(">qqiiqi")
_FOOTER_MAGIC = 0x88E241B785F4CFF7


def _record(stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes) -> bytes:
    return _RECORD_HEADER.pack(0x22, stream_id, epoch, base_offset, count, len(payload)) + payload


def _block(records: list[bytes]) -> bytes:
    data = b"".join(records)
    return _BLOCK_HEADER.pack(0x5A, 0x02, len(records), len(data)) + data


def _footer(index_start_position: int, index_length_bytes: int) -> bytes:
    return (
        struct.pack(">qi", index_start_position, index_length_bytes)
        + bytes(28)
        + struct.pack(">Q", _FOOTER_MAGIC)
    )


def _batch(
    stream_id: int, base_offset: int, count: int, payload: bytes = b"", epoch: int = 0
) -> StreamRecordBatch:
    return StreamRecordBatch(
        stream_id=stream_id, epoch=epoch, base_offset=base_offset, count=count, payload=payload
    )


def _write(batches: list[StreamRecordBatch], threshold_bytes: int = 512 * 1024) -> bytes:
    writer = ObjectWriter(block_size_threshold_bytes=threshold_bytes)
    for batch in batches:
        writer.write(batch)
    return writer.close().to_bytes()


# --- A known object, built by hand -------------------------------------------------------------

_HAND_BATCHES = [
    _batch(3, 100, 2, b"ab", epoch=7),
    _batch(3, 102, 3, b"", epoch=7),
    _batch(3, 110, -4, b"xyz", epoch=7),  # after a gap; a link record
    _batch(9, 0, 1, b"hello", epoch=1),
]


def _hand_built_object() -> tuple[bytes, list[DataBlockIndex]]:
    block_0 = _block([_record(3, 7, 100, 2, b"ab"), _record(3, 7, 102, 3, b"")])
    block_1 = _block([_record(3, 7, 110, -4, b"xyz")])
    block_2 = _block([_record(9, 1, 0, 1, b"hello")])
    entries = [
        DataBlockIndex(3, 100, 5, 2, 0, len(block_0)),
        DataBlockIndex(3, 110, 4, 1, len(block_0), len(block_1)),
        DataBlockIndex(9, 0, 1, 1, len(block_0) + len(block_1), len(block_2)),
    ]
    index = b"".join(
        _INDEX_ENTRY.pack(
            e.stream_id,
            e.start_offset,
            e.end_offset_delta,
            e.record_count,
            e.start_position,
            e.block_size_bytes,
        )
        for e in entries
    )
    data = block_0 + block_1 + block_2
    return data + index + _footer(len(data), len(index)), entries


def test_a_hand_built_object_is_parsed() -> None:
    data, entries = _hand_built_object()
    reader = ObjectFileReader(data)
    assert reader.indexes == tuple(entries)
    assert reader.index_location == IndexLocation(len(data) - 48 - 3 * 36, 3 * 36)
    assert list(reader.iter_batches()) == _HAND_BATCHES
    assert [e.end_offset for e in reader.indexes] == [105, 114, 1]


def test_the_writer_produces_the_hand_built_bytes() -> None:
    data, entries = _hand_built_object()
    writer = ObjectWriter()
    for batch in _HAND_BATCHES:
        writer.write(batch)
    written = writer.close()
    assert written.to_bytes() == data
    assert written.size_bytes == len(data)
    assert written.indexes == tuple(entries) == writer.indexes
    assert written.index_start_position == entries[-1].end_position


def test_an_object_of_many_small_batches_is_one_chunk_per_block() -> None:
    """Later steps walk the chunk list on the event loop: it grows with blocks, not batches."""
    writer = ObjectWriter(block_size_threshold_bytes=4096)
    for offset in range(1000):
        writer.write(StreamRecordBatch(7, 0, offset, 1, bytes([offset % 256]) * 100))
    written = writer.close()
    assert len(written.indexes) > 1
    assert len(written.chunks) == len(written.indexes) + 2  # the blocks, the index, the footer
    batches = [
        batch
        for entry in written.indexes
        for batch in parse_data_block(
            written.to_bytes()[entry.start_position : entry.end_position], entry
        )
    ]
    assert [batch.base_offset for batch in batches] == list(range(1000))


def test_reader_payloads_are_views_of_the_object() -> None:
    data, _ = _hand_built_object()
    batches = list(ObjectFileReader(data).iter_batches())
    assert all(isinstance(batch.payload, memoryview) for batch in batches)


def test_an_empty_object_is_a_bare_footer_and_holds_nothing() -> None:
    written = ObjectWriter().close()
    assert written.to_bytes() == _footer(0, 0)
    reader = ObjectFileReader(written.to_bytes())
    assert reader.indexes == ()
    assert reader.find(1, 0) == []
    assert list(reader.iter_batches()) == []


def test_tail_read_size_follows_automq() -> None:
    assert tail_read_size(0) == 0
    assert tail_read_size(5000) == 5000
    assert tail_read_size(1024 * 1024 - 1) == 8192
    assert tail_read_size(10 * 1024 * 1024) == 8192 + 10 * 36
    assert tail_read_size(10 * 1024 * 1024 + 5) == 8192 + 10 * 36


def test_a_tail_without_the_whole_index_asks_for_a_second_read() -> None:
    # 300 one-record blocks make an index of 10,800 bytes, more than the 8,192-byte tail read.
    data = _write([_batch(1, offset, 1, b"p") for offset in range(300)], threshold_bytes=1)
    tail = data[-tail_read_size(len(data)) :]
    location = parse_footer(tail, len(data))
    assert location.length_bytes == 300 * 36
    assert slice_index_from_tail(tail, len(data), location) is None
    index_bytes = data[location.start_position : location.start_position + location.length_bytes]
    indexes = parse_index(index_bytes, index_start_position=location.start_position)
    assert len(indexes) == 300
    whole_tail = data[location.start_position - 7 :]
    sliced = slice_index_from_tail(whole_tail, len(data), location)
    assert sliced is not None
    assert bytes(sliced) == index_bytes


# --- Writer rules ------------------------------------------------------------------------------


def test_streams_out_of_order_are_refused() -> None:
    writer = ObjectWriter()
    writer.write(_batch(5, 0, 1))
    with pytest.raises(ObjectWriteOrderError, match=r"stream 4 written after stream 5"):
        writer.write(_batch(4, 0, 1))


def test_overlapping_offsets_are_refused() -> None:
    writer = ObjectWriter()
    writer.write(_batch(5, 10, 5))
    with pytest.raises(ObjectWriteOrderError, match=r"stream 5.*base offset 14.*ends at offset 15"):
        writer.write(_batch(5, 14, 1))


def test_overlap_is_checked_across_block_boundaries() -> None:
    writer = ObjectWriter(block_size_threshold_bytes=1)
    writer.write(_batch(5, 10, 5))
    assert len(writer.indexes) == 1
    with pytest.raises(ObjectWriteOrderError):
        writer.write(_batch(5, 12, 1))


def test_a_gap_within_a_stream_is_allowed_and_closes_the_block() -> None:
    writer = ObjectWriter()
    writer.write(_batch(5, 10, 5))
    writer.write(_batch(5, 20, 5))
    indexes = writer.close().indexes
    assert [(e.start_offset, e.end_offset) for e in indexes] == [(10, 15), (20, 25)]


def test_the_fake_trim_record_is_refused() -> None:
    with pytest.raises(ValueError, match="fake trim record"):
        ObjectWriter().write(FAKE_TRIM_RECORD)


def test_writing_after_close_is_refused() -> None:
    writer = ObjectWriter()
    writer.close()
    with pytest.raises(RuntimeError):
        writer.write(_batch(1, 0, 1))
    with pytest.raises(RuntimeError):
        writer.close()


@pytest.mark.parametrize("threshold_bytes", [0, -1, 2**31])
def test_an_invalid_threshold_is_refused(threshold_bytes: int) -> None:
    with pytest.raises(ValueError):
        ObjectWriter(block_size_threshold_bytes=threshold_bytes)


def test_size_bytes_counts_the_open_block() -> None:
    writer = ObjectWriter()
    assert writer.size_bytes == 0
    writer.write(_batch(1, 0, 1, b"abc"))
    assert writer.size_bytes == 10 + 33 + 3
    assert writer.indexes == ()


# --- Soft block limit ---------------------------------------------------------------------------


def _block_record_sizes(
    batches: list[StreamRecordBatch], indexes: tuple[DataBlockIndex, ...]
) -> list[list[int]]:
    sizes: list[list[int]] = []
    remaining = iter(batches)
    for entry in indexes:
        sizes.append([next(remaining).encoded_size_bytes for _ in range(entry.record_count)])
    return sizes


def test_a_block_exceeds_the_threshold_by_at_most_its_last_record() -> None:
    threshold_bytes = 1000
    payload_sizes = [100, 700, 50, 2000, 10, 10, 900, 300, 1, 1, 1, 999, 5]
    batches = [_batch(1, offset, 1, bytes(size)) for offset, size in enumerate(payload_sizes)]
    writer = ObjectWriter(block_size_threshold_bytes=threshold_bytes)
    for batch in batches:
        writer.write(batch)
    indexes = writer.close().indexes
    per_block = _block_record_sizes(batches, indexes)
    assert sum(map(len, per_block)) == len(batches)
    for number, sizes in enumerate(per_block):
        assert sum(sizes[:-1]) < threshold_bytes
        if number < len(per_block) - 1:
            assert sum(sizes) >= threshold_bytes
        assert indexes[number].block_size_bytes == 10 + sum(sizes)
    # The 2000-byte payload overshoots the block it closes; it does not open a block of its own.
    assert any(len(sizes) > 1 and sizes[-1] == 33 + 2000 for sizes in per_block)


def test_the_block_size_accumulator_restarts_with_each_stream() -> None:
    threshold_bytes = 500
    stream_b = [_batch(2, offset, 1, bytes(100)) for offset in range(12)]
    alone = ObjectWriter(block_size_threshold_bytes=threshold_bytes)
    for batch in stream_b:
        alone.write(batch)
    expected_counts = [e.record_count for e in alone.close().indexes]

    # Stream 1 leaves 399 bytes in its open block; a carried-over counter would cut stream 2's
    # first block after one record.
    writer = ObjectWriter(block_size_threshold_bytes=threshold_bytes)
    for offset in range(3):
        writer.write(_batch(1, offset, 1, bytes(100)))
    for batch in stream_b:
        writer.write(batch)
    indexes = writer.close().indexes
    assert [e.record_count for e in indexes if e.stream_id == 2] == expected_counts
    assert expected_counts[0] == 4


def test_a_block_never_spans_more_offsets_than_an_i32() -> None:
    writer = ObjectWriter()
    writer.write(_batch(1, 0, 2**31 - 1))
    writer.write(_batch(1, 2**31 - 1, 1))
    indexes = writer.close().indexes
    assert [e.end_offset_delta for e in indexes] == [2**31 - 1, 1]


# --- find() -------------------------------------------------------------------------------------

# Stream 1: blocks [0,10) [10,20) [20,30), a gap, [40,50); stream 2: [0,5); stream 4: [100,101).
# Every block holds 10 records of 100-byte payloads except stream 2's and stream 4's.
_FIND_BATCHES = (
    [_batch(1, offset, 1, bytes(100)) for offset in range(30)]
    + [_batch(1, offset, 1, bytes(100)) for offset in range(40, 50)]
    + [_batch(2, 0, 5, b"five")]
    + [_batch(4, 100, 1, b"")]
)


def _find_indexes() -> tuple[DataBlockIndex, ...]:
    # 10 records of 133 encoded bytes reach the 1330-byte threshold exactly.
    writer = ObjectWriter(block_size_threshold_bytes=1330)
    for batch in _FIND_BATCHES:
        writer.write(batch)
    return writer.close().indexes


def _ranges(blocks: list[DataBlockIndex]) -> list[tuple[int, int, int]]:
    return [(block.stream_id, block.start_offset, block.end_offset) for block in blocks]


def test_find_layout_is_as_intended() -> None:
    assert _ranges(list(_find_indexes())) == [
        (1, 0, 10),
        (1, 10, 20),
        (1, 20, 30),
        (1, 40, 50),
        (2, 0, 5),
        (4, 100, 101),
    ]
    assert _find_indexes()[0].estimated_payload_size_bytes == 1000


def test_find_from_an_exact_block_start() -> None:
    found = find(_find_indexes(), 1, 10, None, 1 << 30)
    assert _ranges(found) == [(1, 10, 20), (1, 20, 30)]


def test_find_from_the_middle_of_a_block_returns_the_whole_block() -> None:
    found = find(_find_indexes(), 1, 15, 25, 1 << 30)
    assert _ranges(found) == [(1, 10, 20), (1, 20, 30)]


def test_find_stops_at_the_end_offset() -> None:
    assert _ranges(find(_find_indexes(), 1, 0, 10, 1 << 30)) == [(1, 0, 10)]
    assert _ranges(find(_find_indexes(), 1, 0, 11, 1 << 30)) == [(1, 0, 10), (1, 10, 20)]


def test_find_beyond_the_end_of_a_stream_finds_nothing() -> None:
    assert find(_find_indexes(), 1, 50, None, 1 << 30) == []
    assert find(_find_indexes(), 4, 101, None, 1 << 30) == []


def test_find_before_the_first_block_or_inside_a_gap_finds_nothing() -> None:
    assert find(_find_indexes(), 4, 99, None, 1 << 30) == []
    assert find(_find_indexes(), 1, 35, None, 1 << 30) == []


def test_find_of_an_absent_stream_finds_nothing() -> None:
    assert find(_find_indexes(), 3, 0, None, 1 << 30) == []
    assert find(_find_indexes(), 0, 0, None, 1 << 30) == []
    assert find(_find_indexes(), 99, 0, None, 1 << 30) == []
    assert find((), 1, 0, None, 1 << 30) == []


def test_find_does_not_walk_across_a_gap_in_a_stream() -> None:
    found = find(_find_indexes(), 1, 0, None, 1 << 30)
    assert _ranges(found) == [(1, 0, 10), (1, 10, 20), (1, 20, 30)]


def test_find_does_not_walk_into_the_next_stream() -> None:
    assert _ranges(find(_find_indexes(), 1, 45, None, 1 << 30)) == [(1, 40, 50)]


def test_find_charges_every_block_but_the_first_against_the_budget() -> None:
    indexes = _find_indexes()
    # Budget 0 or tiny: the first block is free, so it is still returned, alone.
    assert _ranges(find(indexes, 1, 0, None, 0)) == [(1, 0, 10)]
    assert _ranges(find(indexes, 1, 0, None, 1)) == [(1, 0, 10), (1, 10, 20)]
    # 1000 spends exactly one further block's estimated payload.
    assert _ranges(find(indexes, 1, 0, None, 1000)) == [(1, 0, 10), (1, 10, 20)]
    assert _ranges(find(indexes, 1, 0, None, 1001)) == [(1, 0, 10), (1, 10, 20), (1, 20, 30)]


def test_find_of_an_empty_range_finds_nothing() -> None:
    assert find(_find_indexes(), 1, 5, 5, 1 << 30) == []


def test_reader_read_returns_whole_blocks() -> None:
    reader = ObjectFileReader(_write(_FIND_BATCHES, threshold_bytes=1330))
    batches = reader.read(1, 15, 25)
    assert [batch.base_offset for batch in batches] == list(range(10, 30))
    assert reader.read(2, 3) == [_FIND_BATCHES[-2]]


# --- Bad bytes ----------------------------------------------------------------------------------


def test_every_truncation_of_an_object_raises() -> None:
    data, _ = _hand_built_object()
    for length in range(len(data)):
        with pytest.raises(FormatError):
            ObjectFileReader(data[:length])


def _structural_positions(data: bytes) -> list[int]:
    """Every byte but payloads and SRB epochs, which the format does not protect."""
    reader = ObjectFileReader(data)
    positions = list(range(reader.index_location.start_position, len(data)))
    for entry in reader.indexes:
        positions.extend(range(entry.start_position, entry.start_position + 10))
        position = entry.start_position + 10
        for batch in reader.read_block(entry):
            positions.extend(range(position, position + 9))
            positions.extend(range(position + 17, position + 33))
            position += batch.encoded_size_bytes
    return sorted(positions)


def _read_everything(data: bytes) -> list[StreamRecordBatch]:
    reader = ObjectFileReader(data)
    batches = list(reader.iter_batches())
    for stream_id in {entry.stream_id for entry in reader.indexes}:
        for entry in reader.indexes:
            batches.extend(reader.read(stream_id, entry.start_offset))
    return batches


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_structural_byte_flip_is_detected_or_harmless(mask: int) -> None:
    data, _ = _hand_built_object()
    written = {(batch.stream_id, batch.base_offset): batch for batch in _HAND_BATCHES}
    detected = 0
    for position in _structural_positions(data):
        corrupted = bytearray(data)
        corrupted[position] ^= mask
        try:
            batches = _read_everything(bytes(corrupted))
        except FormatError:
            detected += 1
            continue
        for batch in batches:
            assert written.get((batch.stream_id, batch.base_offset)) == batch, position
    # Only the 28 reserved footer bytes may be flipped harmlessly.
    assert detected == len(_structural_positions(data)) - 28


def test_footer_with_a_bad_magic_is_refused() -> None:
    data = bytearray(_hand_built_object()[0])
    data[-1] ^= 0x10
    with pytest.raises(BadMagicError):
        parse_footer(data, len(data))


def test_footer_whose_index_does_not_end_at_the_footer_is_refused() -> None:
    data, _ = _hand_built_object()
    location = parse_footer(data, len(data))
    moved = data[:-48] + _footer(location.start_position - 1, location.length_bytes)
    with pytest.raises(InvalidFieldError):
        parse_footer(moved, len(moved))
    with pytest.raises(TruncatedError):
        parse_footer(data[-47:], len(data))


def _pack_index(entries: list[DataBlockIndex]) -> bytes:
    return b"".join(entry.encode() for entry in entries)


@pytest.mark.parametrize(
    "entries",
    [
        # streams out of order
        [DataBlockIndex(2, 0, 1, 1, 0, 43), DataBlockIndex(1, 0, 1, 1, 43, 43)],
        # overlapping offsets within a stream
        [DataBlockIndex(1, 0, 5, 1, 0, 43), DataBlockIndex(1, 4, 1, 1, 43, 43)],
        # a hole between blocks
        [DataBlockIndex(1, 0, 1, 1, 0, 43), DataBlockIndex(1, 1, 1, 1, 44, 42)],
        # the first block not at position 0
        [DataBlockIndex(1, 0, 1, 1, 1, 85)],
        # fewer offsets than records
        [DataBlockIndex(1, 0, 1, 2, 0, 86)],
        # a negative span
        [DataBlockIndex(1, 0, -1, 1, 0, 86)],
        # a block too small for its records
        [DataBlockIndex(1, 0, 2, 2, 0, 75)],
        # no records
        [DataBlockIndex(1, 0, 1, 0, 0, 86)],
        # a negative stream id
        [DataBlockIndex(-1, 0, 1, 1, 0, 86)],
    ],
)
def test_inconsistent_indexes_are_refused(entries: list[DataBlockIndex]) -> None:
    with pytest.raises(InvalidFieldError):
        parse_index(_pack_index(entries), index_start_position=86)


def test_an_index_whose_blocks_do_not_reach_the_index_is_refused() -> None:
    entries = [DataBlockIndex(1, 0, 1, 1, 0, 43)]
    assert parse_index(_pack_index(entries), index_start_position=43) == tuple(entries)
    with pytest.raises(InvalidFieldError):
        parse_index(_pack_index(entries), index_start_position=44)


def test_an_index_of_a_partial_entry_is_refused() -> None:
    with pytest.raises(InvalidFieldError):
        parse_index(bytes(35), index_start_position=0)


def _one_block() -> tuple[bytes, DataBlockIndex]:
    block = _block([_record(1, 0, 10, 2, b"ab"), _record(1, 0, 12, 1, b"")])
    return block, DataBlockIndex(1, 10, 3, 2, 0, len(block))


def test_a_data_block_is_checked_against_its_index_entry() -> None:
    block, entry = _one_block()
    assert [b.base_offset for b in parse_data_block(block, entry)] == [10, 12]
    with pytest.raises(TruncatedError):
        parse_data_block(block[:-1], entry)
    with pytest.raises(InvalidFieldError):
        parse_data_block(block + b"\x00", entry)


def test_the_rest_of_a_data_block_is_read_from_one_of_its_records() -> None:
    """A reader that read a block's first records GETs only the rest: the records from the
    position it stopped at, checked against the entry's stream and end offset."""
    block, entry = _one_block()
    second = 10 + 33 + 2  # block header, then the first record (2 payload bytes)
    (rest,) = parse_data_block_tail(block[second:], entry, second, 12)
    assert (rest.base_offset, rest.count) == (12, 1)
    assert parse_data_block_tail(block[10:], entry, 10, 10) == parse_data_block(block, entry)
    with pytest.raises(TruncatedError):
        parse_data_block_tail(block[second:-1], entry, second, 12)
    with pytest.raises(InvalidFieldError):
        parse_data_block_tail(block[second:] + bytes(1), entry, second, 12)
    with pytest.raises(InvalidFieldError, match="base 12, expected stream 1 base 11"):
        parse_data_block_tail(block[second:], entry, second, 11)  # not where that record is
    with pytest.raises(ValueError, match="not in the block"):
        parse_data_block_tail(block[second:], entry, second, 13)
    with pytest.raises(ValueError, match="not inside the block"):
        parse_data_block_tail(block, entry, 0, 10)


@pytest.mark.parametrize(
    ("entry_changes", "error"),
    [
        ({"stream_id": 2}, InvalidFieldError),
        ({"start_offset": 11, "end_offset_delta": 2}, InvalidFieldError),
        ({"end_offset_delta": 4}, InvalidFieldError),
        ({"record_count": 1}, InvalidFieldError),
    ],
)
def test_a_data_block_not_matching_its_entry_is_refused(
    entry_changes: dict[str, int], error: type[FormatError]
) -> None:
    block, entry = _one_block()
    fields = {
        "stream_id": entry.stream_id,
        "start_offset": entry.start_offset,
        "end_offset_delta": entry.end_offset_delta,
        "record_count": entry.record_count,
        "start_position": entry.start_position,
        "block_size_bytes": entry.block_size_bytes,
    } | entry_changes
    with pytest.raises(error):
        parse_data_block(block, DataBlockIndex(**fields))


@pytest.mark.parametrize(
    ("position", "value", "error"),
    [
        (0, 0x5B, BadMagicError),
        (1, 0x03, BadMagicError),
        (5, 3, InvalidFieldError),  # recordCount low byte
        (9, 0, InvalidFieldError),  # dataLength low byte
    ],
)
def test_a_data_block_with_a_bad_header_is_refused(
    position: int, value: int, error: type[FormatError]
) -> None:
    block, entry = _one_block()
    corrupted = bytearray(block)
    corrupted[position] = value
    with pytest.raises(error):
        parse_data_block(corrupted, entry)


def test_a_data_block_with_records_of_another_stream_is_refused() -> None:
    block = _block([_record(1, 0, 10, 2, b"ab"), _record(2, 0, 12, 1, b"")])
    with pytest.raises(InvalidFieldError, match="stream 2"):
        parse_data_block(block, DataBlockIndex(1, 10, 3, 2, 0, len(block)))


def test_a_data_block_with_an_offset_gap_is_refused() -> None:
    block = _block([_record(1, 0, 10, 2, b"ab"), _record(1, 0, 13, 1, b"")])
    with pytest.raises(InvalidFieldError):
        parse_data_block(block, DataBlockIndex(1, 10, 4, 2, 0, len(block)))
