"""StreamRecordBatch: the 33-byte header layout, end offsets, the fake trim record, bad bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import (
    BadMagicError,
    FormatError,
    InvalidFieldError,
    TruncatedError,
)
from automq_ref.formats.stream_record_batch import (
    FAKE_TRIM_RECORD,
    HEADER_SIZE_BYTES,
    StreamRecordBatch,
    decode,
    iter_stream_record_batches,
)

_HEADER = struct.Struct(">Bqqqii")


def _encode_by_hand(
    stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes, magic: int = 0x22
) -> bytes:
    return _HEADER.pack(magic, stream_id, epoch, base_offset, count, len(payload)) + payload


def test_encode_matches_the_documented_layout() -> None:
    batch = StreamRecordBatch(stream_id=7, epoch=3, base_offset=1000, count=5, payload=b"kafka")
    assert batch.encode() == _encode_by_hand(7, 3, 1000, 5, b"kafka")
    assert len(batch.encode()) == HEADER_SIZE_BYTES + 5
    assert batch.encoded_size_bytes == 38
    assert batch.payload_size_bytes == 5


def test_decode_reads_a_hand_built_header() -> None:
    buffer = b"junk" + _encode_by_hand(2**40, -5, 2**50, 9, b"abc") + b"tail"
    batch, next_position = decode(buffer, 4)
    assert (batch.stream_id, batch.epoch, batch.base_offset, batch.count) == (2**40, -5, 2**50, 9)
    assert bytes(batch.payload) == b"abc"
    assert next_position == 4 + HEADER_SIZE_BYTES + 3
    assert buffer[next_position:] == b"tail"


def test_decoded_payload_is_a_view_of_the_buffer_not_a_copy() -> None:
    buffer = bytearray(_encode_by_hand(1, 0, 0, 1, b"before"))
    batch, _ = decode(buffer)
    assert isinstance(batch.payload, memoryview)
    buffer[HEADER_SIZE_BYTES : HEADER_SIZE_BYTES + 6] = b"after!"
    assert bytes(batch.payload) == b"after!"


def test_encoded_chunks_hand_back_the_payload_object_itself() -> None:
    payload = memoryview(bytearray(b"x" * 100))
    batch = StreamRecordBatch(stream_id=1, epoch=0, base_offset=0, count=1, payload=payload)
    header, payload_chunk = batch.encoded_chunks()
    assert payload_chunk is payload
    assert header + bytes(payload_chunk) == batch.encode()


def test_a_memoryview_of_wider_items_is_measured_in_bytes() -> None:
    wide = memoryview(bytearray(8)).cast("I")
    batch = StreamRecordBatch(stream_id=1, epoch=0, base_offset=0, count=1, payload=wide)
    assert batch.payload_size_bytes == 8
    assert len(batch.encode()) == HEADER_SIZE_BYTES + 8


def test_last_offset_of_an_ordinary_batch_is_base_plus_count() -> None:
    batch = StreamRecordBatch(stream_id=1, epoch=0, base_offset=40, count=10, payload=b"")
    assert batch.last_offset == 50
    assert not batch.is_link_record


def test_last_offset_of_a_link_record_is_base_minus_count() -> None:
    link = StreamRecordBatch(stream_id=1, epoch=0, base_offset=40, count=-10, payload=b"link")
    assert link.is_link_record
    assert link.last_offset == 50
    decoded, _ = decode(link.encode())
    assert decoded.count == -10
    assert decoded.last_offset == 50


def test_fake_trim_record_is_recognised_and_round_trips() -> None:
    assert FAKE_TRIM_RECORD.is_fake_trim_record
    assert (FAKE_TRIM_RECORD.stream_id, FAKE_TRIM_RECORD.epoch) == (-1, -1)
    assert FAKE_TRIM_RECORD.last_offset == FAKE_TRIM_RECORD.base_offset == 0
    decoded, _ = decode(_encode_by_hand(-1, -1, 0, 0, b""))
    assert decoded.is_fake_trim_record
    assert decoded == FAKE_TRIM_RECORD
    built = StreamRecordBatch(stream_id=-1, epoch=-1, base_offset=0, count=0, payload=b"")
    assert built.is_fake_trim_record


@pytest.mark.parametrize(
    ("stream_id", "epoch", "base_offset", "count", "payload"),
    [
        (1, 0, 0, 0, b""),  # count 0 outside the fake record
        (-1, -1, 0, 0, b"x"),  # fake shape with a payload
        (-1, -1, 5, 0, b""),  # fake shape at another base
        (-1, 0, 0, 0, b""),  # fake shape with another epoch
        (-1, -1, 0, 1, b""),  # negative stream id on an ordinary batch
        (1, 0, -1, 1, b""),  # negative base offset
        (1, 0, 2**63 - 2, 5, b""),  # end offset beyond i64
        (1, 0, 0, 2**31, b""),  # count beyond i32
    ],
)
def test_invalid_field_values_are_refused(
    stream_id: int, epoch: int, base_offset: int, count: int, payload: bytes
) -> None:
    with pytest.raises(InvalidFieldError):
        StreamRecordBatch(stream_id, epoch, base_offset, count, payload)


def test_decode_refuses_a_zero_count_that_is_not_the_fake_record() -> None:
    with pytest.raises(InvalidFieldError):
        decode(_encode_by_hand(4, 0, 10, 0, b""))


def test_decode_refuses_a_bad_magic() -> None:
    with pytest.raises(BadMagicError):
        decode(_encode_by_hand(1, 0, 0, 1, b"", magic=0x23))


def test_decode_refuses_a_negative_payload_length() -> None:
    buffer = _HEADER.pack(0x22, 1, 0, 0, 1, -1) + b"xxxx"
    with pytest.raises(InvalidFieldError):
        decode(buffer)


def test_decode_refuses_a_payload_running_past_the_buffer() -> None:
    encoded = _encode_by_hand(1, 0, 0, 1, b"12345")
    with pytest.raises(TruncatedError):
        decode(encoded[:-1])


def test_every_truncation_of_a_batch_raises() -> None:
    encoded = _encode_by_hand(1, 2, 3, 4, b"payload")
    for length in range(len(encoded)):
        with pytest.raises(TruncatedError):
            decode(encoded[:length])


def test_iterating_back_to_back_batches() -> None:
    batches = [
        StreamRecordBatch(stream_id=1, epoch=0, base_offset=0, count=2, payload=b"ab"),
        FAKE_TRIM_RECORD,
        StreamRecordBatch(stream_id=1, epoch=0, base_offset=2, count=-3, payload=b""),
    ]
    buffer = b"".join(batch.encode() for batch in batches)
    assert list(iter_stream_record_batches(buffer)) == batches
    with pytest.raises(TruncatedError):
        list(iter_stream_record_batches(buffer + b"\x22"))


def test_repr_of_a_small_batch_is_valid_python() -> None:
    batch = StreamRecordBatch(stream_id=1, epoch=2, base_offset=3, count=4, payload=b"\x00hi")
    decoded, _ = decode(batch.encode())
    assert eval(repr(decoded)) == batch


_batches = st.builds(
    StreamRecordBatch,
    stream_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(-(2**63), 2**63 - 1),
    base_offset=st.integers(0, 2**62),
    count=st.integers(-(2**31), 2**31 - 1).filter(bool),
    payload=st.binary(max_size=300),
)


@given(_batches)
def test_encode_then_decode_is_identity(batch: StreamRecordBatch) -> None:
    decoded, next_position = decode(batch.encode())
    assert decoded == batch
    assert next_position == batch.encoded_size_bytes


@given(st.one_of(st.binary(max_size=80), st.binary(max_size=80).map(lambda tail: b"\x22" + tail)))
def test_arbitrary_bytes_decode_to_a_valid_batch_or_raise_a_format_error(buffer: bytes) -> None:
    try:
        batch, next_position = decode(buffer)
    except FormatError:
        return
    assert next_position == HEADER_SIZE_BYTES + batch.payload_size_bytes <= len(buffer)
    assert batch.is_fake_trim_record or batch.last_offset > batch.base_offset >= 0


def test_encode_held_copies_the_payload_once_into_the_encoding_the_batch_views() -> None:
    source = bytearray(b"kafka record batch bytes" * 10)
    batch = StreamRecordBatch(7, 2, 100, 3, memoryview(source)[4:])
    encoded, held = batch.encode_held()
    assert encoded == batch.encode() == batch.encode_header() + bytes(source[4:])
    assert (held.stream_id, held.epoch, held.base_offset, held.count) == (7, 2, 100, 3)
    assert isinstance(held.payload, memoryview) and held.payload.obj is encoded
    source[4:8] = b"XXXX"  # the frame the payload came from, reused
    assert bytes(held.payload) == encoded[HEADER_SIZE_BYTES:] != bytes(source[4:])
