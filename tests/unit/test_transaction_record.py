"""The ``__transaction_state`` key and value layouts (Kafka's TransactionLogKey/Value).

The exact-bytes tests build the expected bytes with :mod:`struct` straight from Kafka's schema,
independently of the codec; hypothesis round-trips values through both value versions.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import FormatError, InvalidFieldError, TruncatedError
from automq_ref.formats.transaction_record import (
    TRANSACTION_LOG_KEY_VERSION,
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partitions_of,
)

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TOPIC = st.text(max_size=20)


def _value(**changes: object) -> TransactionLogValue:
    fields: dict[str, object] = {
        "producer_id": 4000,
        "producer_epoch": 7,
        "timeout_ms": 60000,
        "status": 1,
        "partitions": (("orders", (0, 2)), ("payments", (5,))),
        "last_update_ms": 1_700_000_000_123,
        "start_ms": 1_700_000_000_000,
    }
    fields.update(changes)
    return TransactionLogValue(**fields)  # type: ignore[arg-type]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _v1_value_bytes(tagged: bytes, entry_tagged: bytes = b"\x00") -> bytes:
    """A version 1 value for producer 9, one partition ``t``/3, ending with ``tagged``."""
    return (
        struct.pack(">hqhib", 1, 9, 1, 1000, 1)
        + _uvarint(2)  # one partition entry
        + _uvarint(2)
        + b"t"
        + _uvarint(2)  # one partition id
        + struct.pack(">i", 3)
        + entry_tagged
        + struct.pack(">qq", 20, 10)
        + tagged
    )


@st.composite
def values(draw: st.DrawFn, version: int) -> TransactionLogValue:
    pairs = draw(st.lists(st.tuples(TOPIC, INT32), max_size=8))
    flexible = version == 1
    return TransactionLogValue(
        producer_id=draw(INT64),
        producer_epoch=draw(INT16),
        timeout_ms=draw(INT32),
        status=draw(st.integers(0, 7)),
        partitions=partitions_of(pairs),
        last_update_ms=draw(INT64),
        start_ms=draw(INT64),
        previous_producer_id=draw(INT64) if flexible else -1,
        next_producer_id=draw(INT64) if flexible else -1,
        client_transaction_version=draw(INT16) if flexible else 0,
    )


# --- keys -----------------------------------------------------------------------------------


def test_key_bytes_match_the_schema() -> None:
    expected = struct.pack(">hh", 0, 5) + b"txn-1"
    assert encode_key("txn-1") == expected
    assert decode_key(expected) == "txn-1"
    assert TRANSACTION_LOG_KEY_VERSION == 0


@given(st.text(max_size=200))
def test_key_round_trip(transactional_id: str) -> None:
    assert decode_key(encode_key(transactional_id)) == transactional_id


def test_key_of_another_version_is_skipped() -> None:
    assert decode_key(struct.pack(">hh", 1, 1) + b"x") is None


def test_key_errors() -> None:
    with pytest.raises(TruncatedError):
        decode_key(b"\x00")
    with pytest.raises(TruncatedError):
        decode_key(struct.pack(">hh", 0, 5) + b"txn")
    with pytest.raises(InvalidFieldError, match="left over"):
        decode_key(encode_key("a") + b"\x00")
    with pytest.raises(InvalidFieldError, match="null"):
        decode_key(struct.pack(">hh", 0, -1))
    with pytest.raises(InvalidFieldError, match="UTF-8"):
        decode_key(struct.pack(">hh", 0, 1) + b"\xff")
    with pytest.raises(InvalidFieldError):
        encode_key("x" * 32768)
    assert decode_key(encode_key("x" * 32767)) == "x" * 32767


# --- values ---------------------------------------------------------------------------------


def test_value_v0_bytes_match_the_schema() -> None:
    value = _value()
    expected = (
        struct.pack(">hqhib", 0, 4000, 7, 60000, 1)
        + struct.pack(">i", 2)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">h", 8)
        + b"payments"
        + struct.pack(">ii", 1, 5)
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
    )
    assert encode_value(value) == expected
    assert encode_value(value, version=0) == expected
    assert decode_value(expected) == value


def test_value_without_partitions_is_written_null() -> None:
    value = _value(status=4, partitions=())
    expected = struct.pack(
        ">hqhibiqq", 0, 4000, 7, 60000, 4, -1, 1_700_000_000_123, 1_700_000_000_000
    )
    assert encode_value(value) == expected
    assert decode_value(expected) == value
    flexible = encode_value(value, version=1)
    assert flexible == (
        struct.pack(">hqhib", 1, 4000, 7, 60000, 4)
        + b"\x00"  # null compact array
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
        + b"\x00"  # no tagged fields
    )
    assert decode_value(flexible) == value


def test_an_empty_partition_array_decodes_as_none() -> None:
    v0 = struct.pack(">hqhibiqq", 0, 1, 0, 10, 0, 0, 2, 3)
    assert decode_value(v0).partitions == ()
    v1 = struct.pack(">hqhib", 1, 1, 0, 10, 0) + _uvarint(1) + struct.pack(">qq", 2, 3) + b"\x00"
    assert decode_value(v1).partitions == ()


@given(st.data(), st.sampled_from([0, 1]))
def test_value_round_trip(data: st.DataObject, version: int) -> None:
    value = data.draw(values(version))
    encoded = encode_value(value, version)
    assert struct.unpack_from(">h", encoded)[0] == version
    assert decode_value(encoded) == value


def test_value_v1_tagged_fields_bytes_and_round_trip() -> None:
    value = TransactionLogValue(
        producer_id=9,
        producer_epoch=1,
        timeout_ms=1000,
        status=1,
        partitions=(("t", (3,)),),
        last_update_ms=20,
        start_ms=10,
        previous_producer_id=8,
        next_producer_id=11,
        client_transaction_version=2,
    )
    tagged = (
        _uvarint(3)
        + _uvarint(0)
        + _uvarint(8)
        + struct.pack(">q", 8)
        + _uvarint(1)
        + _uvarint(8)
        + struct.pack(">q", 11)
        + _uvarint(2)
        + _uvarint(2)
        + struct.pack(">h", 2)
    )
    expected = _v1_value_bytes(tagged)
    assert encode_value(value, version=1) == expected
    assert decode_value(expected) == value


def test_value_v1_writes_only_tags_that_are_not_defaults() -> None:
    value = TransactionLogValue(9, 1, 1000, 1, (("t", (3,)),), 20, 10, next_producer_id=11)
    tagged = _uvarint(1) + _uvarint(1) + _uvarint(8) + struct.pack(">q", 11)
    assert encode_value(value, version=1) == _v1_value_bytes(tagged)
    defaults = TransactionLogValue(9, 1, 1000, 1, (("t", (3,)),), 20, 10)
    assert encode_value(defaults, version=1) == _v1_value_bytes(b"\x00")


def test_value_v1_unknown_tags_are_skipped() -> None:
    tagged = (
        _uvarint(2)
        + _uvarint(0)
        + _uvarint(8)
        + struct.pack(">q", 8)
        + _uvarint(300)  # unknown, a two-byte varint tag
        + _uvarint(3)
        + b"abc"
    )
    entry_tagged = _uvarint(1) + _uvarint(5) + _uvarint(2) + b"zz"
    decoded = decode_value(_v1_value_bytes(tagged, entry_tagged))
    assert decoded == TransactionLogValue(
        9, 1, 1000, 1, (("t", (3,)),), 20, 10, previous_producer_id=8
    )


def test_value_v1_malformed_tags() -> None:
    wrong_size = _uvarint(1) + _uvarint(0) + _uvarint(4) + struct.pack(">i", 8)
    with pytest.raises(InvalidFieldError, match="tag 0"):
        decode_value(_v1_value_bytes(wrong_size))
    twice = _uvarint(2) + (_uvarint(7) + _uvarint(0)) * 2
    with pytest.raises(InvalidFieldError, match="twice"):
        decode_value(_v1_value_bytes(twice))
    with pytest.raises(TruncatedError):
        decode_value(_v1_value_bytes(_uvarint(1) + _uvarint(7) + _uvarint(4) + b"ab"))
    with pytest.raises(InvalidFieldError, match="varint"):
        decode_value(_v1_value_bytes(b"\xff" * 6))


def test_version_0_refuses_fields_it_cannot_carry() -> None:
    with pytest.raises(InvalidFieldError, match="version 1"):
        encode_value(_value(next_producer_id=5))
    encode_value(_value(next_producer_id=5), version=1)


@pytest.mark.parametrize("version", [-1, 2, 7])
def test_value_of_an_unknown_version(version: int) -> None:
    data = bytearray(encode_value(_value()))
    data[0:2] = struct.pack(">h", version)
    with pytest.raises(FormatError, match=f"version {version}"):
        decode_value(bytes(data))
    with pytest.raises(FormatError, match=f"version {version}"):
        encode_value(_value(), version=version)


@pytest.mark.parametrize("version", [0, 1])
def test_every_truncation_is_an_error(version: int) -> None:
    value = _value(previous_producer_id=3) if version else _value()
    encoded = encode_value(value, version)
    for end in range(len(encoded)):
        with pytest.raises(TruncatedError):
            decode_value(encoded[:end])


@pytest.mark.parametrize("version", [0, 1])
def test_trailing_bytes_are_an_error(version: int) -> None:
    with pytest.raises(InvalidFieldError, match="left over"):
        decode_value(encode_value(_value(), version) + b"\x00")


def test_malformed_values() -> None:
    good = encode_value(_value())
    status_at = 2 + 8 + 2 + 4
    bad_status = good[:status_at] + b"\x08" + good[status_at + 1 :]
    with pytest.raises(InvalidFieldError, match="status 8"):
        decode_value(bad_status)
    bad_array = good[: status_at + 1] + struct.pack(">i", -2) + good[status_at + 5 :]
    with pytest.raises(InvalidFieldError, match="array length"):
        decode_value(bad_array)
    null_ids = struct.pack(">hqhibih", 0, 1, 0, 10, 1, 1, 1) + b"t" + struct.pack(">iqq", -1, 2, 3)
    with pytest.raises(InvalidFieldError, match="null partition ids"):
        decode_value(null_ids)
    null_topic = struct.pack(">hqhib", 1, 1, 0, 10, 1) + _uvarint(2) + _uvarint(0)
    with pytest.raises(InvalidFieldError, match="null string"):
        decode_value(null_topic)


@pytest.mark.parametrize(
    "changes",
    [
        {"status": 8},
        {"status": -1},
        {"producer_epoch": 2**15},
        {"producer_id": 2**63},
        {"timeout_ms": 2**31},
        {"partitions": (("t", (2**31,)),)},
        {"partitions": (("x" * 32768, (0,)),)},
    ],
)
def test_encode_validates(changes: dict[str, object]) -> None:
    for version in (0, 1):
        with pytest.raises(InvalidFieldError):
            encode_value(_value(**changes), version)


def test_partitions_of_groups_and_sorts() -> None:
    pairs = {("b", 2), ("a", 9), ("b", 0), ("a", 1), ("b", 2)}
    assert partitions_of(pairs) == (("a", (1, 9)), ("b", (0, 2)))
    assert partitions_of([("t", 1), ("t", 1)]) == (("t", (1,)),)
    assert partitions_of([]) == ()
