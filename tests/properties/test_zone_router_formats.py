"""The zone router's byte layouts (RecordOffset, ChannelOffset, LinkRecord, RouterRecordV2,
ZoneRouterPack): every value round-trips, and decoding anything else raises a FormatError,
never another error: arbitrary bytes, a valid encoding cut short or with a byte changed, and a
valid encoding with bytes added."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import (
    BadMagicError,
    FormatError,
    InvalidFieldError,
    TruncatedError,
)
from automq_ref.formats.zone_router import (
    CHANNEL_OFFSET_SIZE,
    LINK_RECORD_SIZE,
    RECORD_OFFSET_SIZE,
    ChannelOffset,
    LinkRecord,
    RecordOffset,
    RoutedProduceRequest,
    RouterRecordV2,
    ZoneRouterPack,
)

I16 = st.integers(-(2**15), 2**15 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
NON_NEGATIVE_I64 = st.integers(0, 2**63 - 1)

record_offsets = st.builds(
    RecordOffset, NON_NEGATIVE_I64, NON_NEGATIVE_I64, st.integers(0, 2**31 - 1)
)
channel_offsets = st.builds(ChannelOffset, I16, I16, I32, I32, record_offsets)
link_records = st.builds(LinkRecord, I64, I32, I64, I32, channel_offsets)
router_records = st.builds(RouterRecordV2, I32, st.lists(channel_offsets, max_size=5).map(tuple))
packs = st.builds(
    ZoneRouterPack,
    st.lists(st.builds(RoutedProduceRequest, I16, I16, st.binary(max_size=64)), max_size=5).map(
        tuple
    ),
)

Codec = Callable[[bytes], object]
CODECS: list[tuple[st.SearchStrategy[object], Codec]] = [
    (record_offsets, RecordOffset.decode),
    (channel_offsets, ChannelOffset.decode),
    (link_records, LinkRecord.decode),
    (router_records, RouterRecordV2.decode),
    (packs, ZoneRouterPack.decode),
]


def refuses_with_format_error_only(decode: Codec, payload: bytes) -> None:
    with contextlib.suppress(FormatError):
        decode(payload)


@given(value=record_offsets)
def test_record_offset_round_trip(value: RecordOffset) -> None:
    encoded = value.encode()
    assert len(encoded) == RECORD_OFFSET_SIZE == 21
    assert encoded[0] == 0xA8
    assert RecordOffset.decode(encoded) == value


@given(value=channel_offsets)
def test_channel_offset_round_trip(value: ChannelOffset) -> None:
    encoded = value.encode()
    assert len(encoded) == CHANNEL_OFFSET_SIZE == 34
    assert encoded[0] == 0x86
    assert ChannelOffset.decode(encoded) == value
    assert value.attributes == value.target_node_id


@given(value=link_records)
def test_link_record_round_trip(value: LinkRecord) -> None:
    encoded = value.encode()
    assert len(encoded) == LINK_RECORD_SIZE == 59
    assert encoded[0] == 0x00
    assert LinkRecord.decode(encoded) == value
    assert value.data_size == value.channel_offset.record_offset.size


@given(value=router_records)
def test_router_record_round_trip(value: RouterRecordV2) -> None:
    encoded = value.encode()
    assert encoded[0] == 0x02
    assert len(encoded) == 5 + len(value.channel_offsets) * (2 + CHANNEL_OFFSET_SIZE)
    assert RouterRecordV2.decode(encoded) == value


@given(value=packs)
def test_zone_router_pack_round_trip(value: ZoneRouterPack) -> None:
    encoded = value.encode()
    assert encoded[0] == 0x01
    assert len(encoded) == 1 + sum(8 + len(r.body) for r in value.requests)
    assert ZoneRouterPack.decode(encoded) == value


@pytest.mark.parametrize("index", range(len(CODECS)))
@given(data=st.data())
def test_decoding_anything_raises_only_format_errors(index: int, data: st.DataObject) -> None:
    values, decode = CODECS[index]
    encoded = data.draw(values).encode()  # type: ignore[attr-defined]
    refuses_with_format_error_only(decode, data.draw(st.binary(max_size=80)))
    cut = data.draw(st.integers(0, max(0, len(encoded) - 1)))
    try:
        decoded = decode(encoded[:cut])
    except FormatError:
        pass
    else:
        # Only a list cut at an entry boundary still decodes: to a prefix of the entries.
        value = decode(encoded)
        if isinstance(decoded, RouterRecordV2) and isinstance(value, RouterRecordV2):
            assert value.channel_offsets[: len(decoded.channel_offsets)] == decoded.channel_offsets
        elif isinstance(decoded, ZoneRouterPack) and isinstance(value, ZoneRouterPack):
            assert value.requests[: len(decoded.requests)] == decoded.requests
        else:
            raise AssertionError(f"{encoded[:cut]!r}, cut short, decoded as {decoded}")
    if encoded:
        position = data.draw(st.integers(0, len(encoded) - 1))
        flipped = bytearray(encoded)
        flipped[position] ^= data.draw(st.integers(1, 255))
        refuses_with_format_error_only(decode, bytes(flipped))
    refuses_with_format_error_only(decode, encoded + data.draw(st.binary(min_size=1, max_size=8)))


@given(value=channel_offsets, extra=st.binary(min_size=1, max_size=8))
def test_fixed_layouts_refuse_trailing_bytes(value: ChannelOffset, extra: bytes) -> None:
    for encoded, decode in (
        (value.record_offset.encode(), RecordOffset.decode),
        (value.encode(), ChannelOffset.decode),
        (LinkRecord(1, 0, 2, 3, value).encode(), LinkRecord.decode),
    ):
        with pytest.raises(InvalidFieldError, match="trailing"):
            decode(encoded + extra)


def test_errors_name_the_layout_and_the_field() -> None:
    offset = ChannelOffset(0, 1, 2, 3, RecordOffset(4, 5, 6))
    with pytest.raises(BadMagicError, match="ChannelOffset magic 0x87"):
        ChannelOffset.decode(b"\x87" + offset.encode()[1:])
    with pytest.raises(BadMagicError, match="RecordOffset magic"):
        ChannelOffset.decode(offset.encode()[:13] + b"\x00" + offset.encode()[14:])
    with pytest.raises(TruncatedError, match="LinkRecord"):
        LinkRecord.decode(b"\x00" * 10)
    with pytest.raises(InvalidFieldError, match="RecordOffset offset -1"):
        RecordOffset.decode(struct.pack(">Bqqi", 0xA8, 1, -1, 5))
    with pytest.raises(InvalidFieldError, match="entry 0 length -1"):
        RouterRecordV2.decode(struct.pack(">Bih", 2, 7, -1))
    with pytest.raises(TruncatedError, match="entry 1"):
        RouterRecordV2.decode(RouterRecordV2(7, (offset, offset)).encode()[:-1])
    with pytest.raises(InvalidFieldError, match="request 0 size -3"):
        ZoneRouterPack.decode(struct.pack(">Bhhi", 1, 9, 0, -3))
    with pytest.raises(TruncatedError, match="request 0 body"):
        ZoneRouterPack.decode(struct.pack(">Bhhi", 1, 9, 0, 4) + b"abc")
    with pytest.raises(InvalidFieldError, match="order_hint"):
        ChannelOffset(0, 2**15, 0, 0, RecordOffset(0, 0, 0))
    assert ZoneRouterPack.decode(b"\x01") == ZoneRouterPack(())
    assert RouterRecordV2.decode(struct.pack(">Bi", 2, 7)) == RouterRecordV2(7, ())


def test_malformed_bytes_answer_kafka_error_codes() -> None:
    """A client that sends such bytes gets CORRUPT_MESSAGE (bad magic, truncation) or
    INVALID_RECORD (a field out of range)."""
    from automq_ref.errors import KafkaErrorCode

    with pytest.raises(FormatError) as truncated:
        LinkRecord.decode(b"\x00")
    assert truncated.value.code is KafkaErrorCode.CORRUPT_MESSAGE
    with pytest.raises(FormatError) as invalid:
        ZoneRouterPack.decode(struct.pack(">Bhhi", 1, 9, 0, -3))
    assert invalid.value.code is KafkaErrorCode.INVALID_RECORD
