"""Properties of the object format: what is written is what is found, and bad bytes never pass.

Objects are generated as several streams, each a few runs of batches separated by offset gaps,
with payloads of 0..4 KiB and small block thresholds so that objects have many blocks.

Corruption is restricted to structural bytes: data block headers, SRB headers without their epoch
field, the index and the footer. AutoMQ's object format has no checksum over SRB payloads and
nothing constrains an SRB's epoch, so a flipped payload or epoch byte is undetectable by design
(see the module docstring of automq_ref.formats.object_file); we keep the format compatible
rather than extend it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import FormatError
from automq_ref.formats.object_file import (
    DataBlockIndex,
    ObjectFileReader,
    ObjectWriter,
    find,
    parse_data_block,
)
from automq_ref.formats.stream_record_batch import StreamRecordBatch

_BLOCK_HEADER_SIZE_BYTES = 10
_RECORD_HEADER_SIZE_BYTES = 33
_FOOTER_SIZE_BYTES = 48
_EPOCH_FIELD = range(9, 17)  # bytes of the SRB header holding the epoch


@dataclass(frozen=True)
class GeneratedObject:
    batches: tuple[StreamRecordBatch, ...]
    block_size_threshold_bytes: int
    data: bytes
    indexes: tuple[DataBlockIndex, ...]


@st.composite
def _stream_batches(draw: st.DrawFn, stream_id: int) -> list[StreamRecordBatch]:
    batches: list[StreamRecordBatch] = []
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 3))):  # runs
        offset += draw(st.sampled_from([1, 7, 1000]))  # the gap before each run
        for _ in range(draw(st.integers(1, 6))):
            count = draw(st.one_of(st.integers(1, 500), st.integers(-50, -1)))
            payload_size_bytes = draw(st.integers(0, 4096))
            payload = random.Random(draw(st.integers(0, 2**32))).randbytes(payload_size_bytes)
            batch = StreamRecordBatch(
                stream_id=stream_id,
                epoch=draw(st.integers(0, 5)),
                base_offset=offset,
                count=count,
                payload=payload,
            )
            batches.append(batch)
            offset = batch.last_offset
    return batches


@st.composite
def generated_objects(draw: st.DrawFn) -> GeneratedObject:
    stream_ids = sorted(draw(st.sets(st.integers(0, 2**50), min_size=1, max_size=4)))
    batches = [batch for stream_id in stream_ids for batch in draw(_stream_batches(stream_id))]
    threshold_bytes = draw(st.sampled_from([1, 64, 500, 2000, 6000, 512 * 1024]))
    writer = ObjectWriter(block_size_threshold_bytes=threshold_bytes)
    for batch in batches:
        writer.write(batch)
    written = writer.close()
    data = written.to_bytes()
    assert len(data) == written.size_bytes
    return GeneratedObject(tuple(batches), threshold_bytes, data, written.indexes)


def _covering(obj: GeneratedObject, stream_id: int, offset: int) -> StreamRecordBatch | None:
    for batch in obj.batches:
        if batch.stream_id == stream_id and batch.base_offset <= offset < batch.last_offset:
            return batch
    return None


@given(generated_objects(), st.data())
def test_every_written_batch_is_found_and_read_back_unchanged(
    obj: GeneratedObject, data: st.DataObject
) -> None:
    reader = ObjectFileReader(obj.data)
    assert reader.indexes == obj.indexes
    assert list(reader.iter_batches()) == list(obj.batches)
    for batch in obj.batches:
        offset = data.draw(st.integers(batch.base_offset, batch.last_offset - 1))
        blocks = find(reader.indexes, batch.stream_id, offset, offset + 1, 0)
        assert len(blocks) == 1
        view = memoryview(obj.data)[blocks[0].start_position : blocks[0].end_position]
        read = parse_data_block(view, blocks[0])
        assert batch in read
        found = next(b for b in read if b.base_offset == batch.base_offset)
        assert (found.stream_id, found.epoch, found.count) == (
            batch.stream_id,
            batch.epoch,
            batch.count,
        )
        assert bytes(found.payload) == batch.payload


@given(generated_objects())
def test_index_is_sorted_tiles_the_data_and_blocks_respect_the_threshold(
    obj: GeneratedObject,
) -> None:
    position = 0
    remaining = iter(obj.batches)
    for number, entry in enumerate(obj.indexes):
        assert entry.start_position == position
        position = entry.end_position
        if number:
            previous = obj.indexes[number - 1]
            assert (previous.stream_id, previous.end_offset) <= (
                entry.stream_id,
                entry.start_offset,
            )
        block = [next(remaining) for _ in range(entry.record_count)]
        assert {batch.stream_id for batch in block} == {entry.stream_id}
        assert block[0].base_offset == entry.start_offset
        assert block[-1].last_offset == entry.end_offset
        sizes = [batch.encoded_size_bytes for batch in block]
        assert entry.block_size_bytes == _BLOCK_HEADER_SIZE_BYTES + sum(sizes)
        # Soft limit: under the threshold until the last record was added.
        assert sum(sizes[:-1]) < obj.block_size_threshold_bytes
        following = obj.indexes[number + 1] if number + 1 < len(obj.indexes) else None
        if (
            following is not None
            and following.stream_id == entry.stream_id
            and following.start_offset == entry.end_offset
        ):
            # A block is only cut early by a gap or a new stream.
            assert sum(sizes) >= obj.block_size_threshold_bytes
    assert next(remaining, None) is None
    assert position == len(obj.data) - _FOOTER_SIZE_BYTES - 36 * len(obj.indexes)


def _model_find(
    indexes: tuple[DataBlockIndex, ...],
    stream_id: int,
    start_offset: int,
    end_offset: int | None,
    max_bytes: int,
) -> list[DataBlockIndex]:
    """A linear scan with the rules of AutoMQ's IndexBlock.find, to compare find() with."""
    if end_offset is not None and end_offset <= start_offset:
        return []
    found: list[DataBlockIndex] = []
    budget = max_bytes
    for entry in indexes:
        if not found:
            if (
                entry.stream_id == stream_id
                and entry.start_offset <= start_offset < entry.end_offset
            ):
                found.append(entry)
            continue
        done = (end_offset is not None and found[-1].end_offset >= end_offset) or budget <= 0
        if done or entry.stream_id != stream_id or entry.start_offset != found[-1].end_offset:
            break
        found.append(entry)
        budget -= entry.estimated_payload_size_bytes
    return found


@given(generated_objects(), st.data())
def test_find_agrees_with_a_linear_scan(obj: GeneratedObject, data: st.DataObject) -> None:
    stream_ids = sorted({batch.stream_id for batch in obj.batches})
    for _ in range(5):
        stream_id = data.draw(
            st.one_of(st.sampled_from(stream_ids), st.integers(0, 2**50)), label="stream"
        )
        anchor = data.draw(st.sampled_from(obj.batches)).base_offset
        start_offset = data.draw(st.integers(max(anchor - 2000, 0), anchor + 2000), label="start")
        end_offset = data.draw(
            st.none() | st.integers(start_offset - 1, start_offset + 5000), label="end"
        )
        max_bytes = data.draw(st.integers(0, 20_000), label="max_bytes")
        expected = _model_find(obj.indexes, stream_id, start_offset, end_offset, max_bytes)
        assert find(obj.indexes, stream_id, start_offset, end_offset, max_bytes) == expected
        if expected:
            # Reading the found blocks yields exactly the written batches they hold.
            reader = ObjectFileReader(obj.data)
            read = [batch for block in expected for batch in reader.read_block(block)]
            assert read[0].base_offset <= start_offset < read[-1].last_offset
            assert all(_covering(obj, b.stream_id, b.base_offset) == b for b in read)


def _structural_positions(obj: GeneratedObject) -> list[int]:
    """Positions of every byte that the format's checks cover (see the module docstring)."""
    positions = list(range(obj.indexes[-1].end_position if obj.indexes else 0, len(obj.data)))
    remaining = iter(obj.batches)
    for entry in obj.indexes:
        positions.extend(range(entry.start_position, entry.start_position + 10))
        position = entry.start_position + _BLOCK_HEADER_SIZE_BYTES
        for _ in range(entry.record_count):
            batch = next(remaining)
            positions.extend(
                position + header_byte
                for header_byte in range(_RECORD_HEADER_SIZE_BYTES)
                if header_byte not in _EPOCH_FIELD
            )
            position += batch.encoded_size_bytes
    return positions


def _read_through(data: bytes) -> list[StreamRecordBatch]:
    """Every block, whole, then find() + read from each block's first and last offset."""
    reader = ObjectFileReader(data)
    batches = list(reader.iter_batches())
    for entry in reader.indexes:
        batches.extend(reader.read(entry.stream_id, entry.start_offset, max_bytes=0))
        batches.extend(reader.read(entry.stream_id, entry.end_offset - 1, max_bytes=1))
    return batches


@given(generated_objects(), st.data())
def test_a_corrupted_structural_byte_is_detected_never_returned_as_data(
    obj: GeneratedObject, data: st.DataObject
) -> None:
    positions = _structural_positions(obj)
    position = data.draw(st.sampled_from(positions), label="position")
    mask = data.draw(st.integers(1, 255), label="mask")
    corrupted = bytearray(obj.data)
    corrupted[position] ^= mask
    written = {(batch.stream_id, batch.base_offset): batch for batch in obj.batches}
    try:
        batches = _read_through(bytes(corrupted))
    except FormatError:
        return
    # Undetected: the byte must have been harmless (a reserved footer byte); nothing read differs.
    assert len(obj.data) - 36 <= position < len(obj.data) - 8
    for batch in batches:
        assert written.get((batch.stream_id, batch.base_offset)) == batch


@given(generated_objects(), st.data())
def test_a_truncated_object_is_refused(obj: GeneratedObject, data: st.DataObject) -> None:
    length = data.draw(st.integers(0, len(obj.data) - 1), label="length")
    try:
        reader = ObjectFileReader(obj.data[:length])
        list(reader.iter_batches())
    except FormatError:
        return
    raise AssertionError(f"an object truncated to {length} of {len(obj.data)} bytes was accepted")
