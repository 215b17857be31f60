"""WAL record: round trips, and every corrupted byte is refused with a typed error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import FormatError, TruncatedError
from automq_ref.formats.wal_record import (
    RECORD_MAGIC_PADDING,
    WAL_RECORD_HEADER_SIZE,
    decode_wal_record,
    decode_wal_record_header,
    encode_padding_header,
    encode_wal_record,
)

bodies = st.binary(min_size=0, max_size=2048)
offsets = st.integers(min_value=0, max_value=2**62)


@given(body=bodies, offset=offsets, prefix=st.binary(max_size=16))
def test_round_trip(body: bytes, offset: int, prefix: bytes) -> None:
    buffer = prefix + encode_wal_record(body, offset)
    header, decoded = decode_wal_record(buffer, len(prefix), offset)
    assert bytes(decoded) == body
    assert header.record_offset == offset
    assert header.next_record_offset == offset + WAL_RECORD_HEADER_SIZE + len(body)


@given(body=bodies, offset=offsets, data=st.data())
def test_any_corrupted_byte_is_refused(body: bytes, offset: int, data: st.DataObject) -> None:
    record = bytearray(encode_wal_record(body, offset))
    position = data.draw(st.integers(min_value=0, max_value=len(record) - 1))
    record[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(FormatError):
        decode_wal_record(bytes(record), 0, offset)


@given(body=bodies, offset=offsets, data=st.data())
def test_truncation_is_refused(body: bytes, offset: int, data: st.DataObject) -> None:
    record = encode_wal_record(body, offset)
    cut = data.draw(st.integers(min_value=0, max_value=len(record) - 1))
    with pytest.raises(TruncatedError):
        decode_wal_record(record[:cut], 0, offset)


@given(body=bodies, offset=offsets, shift=st.integers(min_value=1, max_value=2**40))
def test_a_record_read_at_another_offset_is_refused(body: bytes, offset: int, shift: int) -> None:
    """A stale record from an earlier lap of a ring is intact but sits at the wrong offset."""
    with pytest.raises(FormatError, match="stale or misplaced"):
        decode_wal_record(encode_wal_record(body, offset), 0, offset + shift)


def test_padding_header_decodes_with_its_length() -> None:
    header = decode_wal_record_header(encode_padding_header(4096, 1000), 0, 4096)
    assert header.magic == RECORD_MAGIC_PADDING
    assert header.next_record_offset == 4096 + WAL_RECORD_HEADER_SIZE + 1000
