"""Properties of RecordBatch v2: round trips, varints, corruption and truncation detection."""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from typing import Any

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats import codecs
from automq_ref.formats.codecs import CompressionType
from automq_ref.formats.errors import FormatError, TruncatedError
from automq_ref.formats.record_batch import (
    Record,
    RecordBatchView,
    RecordColumns,
    RecordInput,
    TimestampType,
    build_record_batch,
    encode_varint,
    encode_varlong,
    iter_batches,
    read_varint,
    read_varlong,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# Bounded so that every delta between two of them still fits a varlong.
timestamps = st.integers(min_value=-(2**61), max_value=2**61) | st.integers(
    min_value=1_600_000_000_000, max_value=1_800_000_000_000
)
optional_bytes = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3)
record_inputs = st.builds(
    RecordInput,
    key=optional_bytes,
    value=optional_bytes,
    headers=headers.map(tuple),
    timestamp=st.none() | timestamps,
)


@dataclass(frozen=True)
class BatchSpec:
    records: list[RecordInput]
    options: dict[str, Any]


@st.composite
def batch_specs(draw: st.DrawFn, max_records: int = 6) -> BatchSpec:
    records = draw(st.lists(record_inputs, min_size=1, max_size=max_records))
    producer_id = draw(st.sampled_from([-1, 0]) | st.integers(0, INT64_MAX))
    is_control = draw(st.booleans())
    sequence_floor = -1 if producer_id < 0 or is_control else 0
    options = {
        "base_offset": draw(st.integers(0, 2**62)),
        "partition_leader_epoch": draw(st.integers(INT32_MIN, INT32_MAX)),
        "compression": draw(st.sampled_from(list(CompressionType))),
        "producer_id": producer_id,
        "producer_epoch": draw(st.integers(-1, 2**15 - 1)),
        "base_sequence": draw(st.integers(sequence_floor, INT32_MAX)),
        "base_timestamp": draw(st.none() | timestamps),
        "is_transactional": draw(st.booleans()),
        "is_control": is_control,
        "timestamp_type": draw(st.sampled_from(list(TimestampType))),
    }
    return BatchSpec(records, options)


def expected_timestamps(spec: BatchSpec) -> tuple[int, list[int]]:
    """(base timestamp, per-record timestamps) as the builder's contract defines them."""
    base = spec.options["base_timestamp"]
    if base is None:
        given_timestamps = [r.timestamp for r in spec.records if r.timestamp is not None]
        base = given_timestamps[0] if given_timestamps else -1
    return base, [base if r.timestamp is None else r.timestamp for r in spec.records]


@given(batch_specs())
def test_build_parse_records_round_trip(spec: BatchSpec) -> None:
    batch = build_record_batch(spec.records, **spec.options)
    view = RecordBatchView.parse(batch)
    options = spec.options
    base_timestamp, record_timestamps = expected_timestamps(spec)
    assert view.size_bytes == len(batch) == 12 + view.batch_length
    assert view.base_offset == options["base_offset"]
    assert view.partition_leader_epoch == options["partition_leader_epoch"]
    assert view.compression is options["compression"]
    assert view.producer_id == options["producer_id"]
    assert view.producer_epoch == options["producer_epoch"]
    assert view.base_sequence == options["base_sequence"]
    assert view.is_transactional is options["is_transactional"]
    assert view.is_control is options["is_control"]
    assert view.timestamp_type is options["timestamp_type"]
    assert view.records_count == len(spec.records)
    assert view.last_offset == options["base_offset"] + len(spec.records) - 1
    assert view.base_timestamp == base_timestamp
    assert view.max_timestamp == max(record_timestamps)
    assert view.crc == crc32c.crc32c(batch[21:])

    log_append_time = options["timestamp_type"] is TimestampType.LOG_APPEND_TIME
    decoded = view.records()
    assert len(decoded) == len(spec.records)
    for index, (record, original) in enumerate(zip(decoded, spec.records, strict=True)):
        assert record.offset == options["base_offset"] + index
        assert record.offset_delta == index
        assert record.key == original.key
        assert record.value == original.value
        assert record.headers == tuple(original.headers)
        assert record.timestamp_delta == record_timestamps[index] - base_timestamp
        if log_append_time:
            assert record.timestamp == view.max_timestamp
        else:
            assert record.timestamp == record_timestamps[index]


@given(st.lists(batch_specs(max_records=3), min_size=1, max_size=4))
def test_iter_batches_yields_each_concatenated_batch(specs: list[BatchSpec]) -> None:
    batches = [build_record_batch(spec.records, **spec.options) for spec in specs]
    views = list(iter_batches(b"".join(batches)))
    assert [bytes(view) for view in views] == batches


@given(st.integers(INT64_MIN, INT64_MAX), st.binary(max_size=3))
def test_varlong_round_trip(value: int, suffix: bytes) -> None:
    encoded = encode_varlong(value)
    assert 1 <= len(encoded) <= 10
    assert read_varlong(encoded + suffix) == (value, len(encoded))
    # Small magnitudes stay small: zigzag keeps |value| < 64 in one byte.
    assert (len(encoded) == 1) == (-64 <= value < 64)


@given(st.integers(INT32_MIN, INT32_MAX), st.binary(max_size=3))
def test_varint_round_trip(value: int, suffix: bytes) -> None:
    encoded = encode_varint(value)
    assert 1 <= len(encoded) <= 5
    assert encoded == encode_varlong(value)
    assert read_varint(encoded + suffix) == (value, len(encoded))
    assert read_varlong(encoded) == (value, len(encoded))


@given(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=20))
def test_varlongs_concatenate_without_ambiguity(values: list[int]) -> None:
    buffer = b"".join(encode_varlong(value) for value in values)
    position = 0
    decoded = []
    for _ in values:
        value, position = read_varlong(buffer, position)
        decoded.append(value)
    assert decoded == values and position == len(buffer)


@given(batch_specs(max_records=3), st.data())
def test_any_corrupted_byte_is_detected(spec: BatchSpec, data: st.DataObject) -> None:
    batch = build_record_batch(spec.records, **spec.options)
    original = RecordBatchView.parse(batch)
    index = data.draw(st.integers(0, len(batch) - 1), label="index")
    mask = data.draw(st.integers(1, 255), label="mask")
    corrupted = bytearray(batch)
    corrupted[index] ^= mask
    if index < 8 or 12 <= index < 16:
        # baseOffset and partitionLeaderEpoch are outside the CRC by design: the batch stays
        # valid and only that field changes.
        view = RecordBatchView.parse(corrupted)
        changed = [
            name
            for name, before, after in zip(
                original.header()._fields, original.header(), view.header(), strict=True
            )
            if before != after
        ]
        assert changed == ["base_offset" if index < 8 else "partition_leader_epoch"]
        assert [(r.key, r.value, r.headers) for r in view.records()] == [
            (r.key, r.value, r.headers) for r in original.records()
        ]
    else:
        try:
            RecordBatchView.parse(corrupted)
        except FormatError:
            return
        raise AssertionError(f"byte {index} ^ 0x{mask:02x} went undetected")


@given(batch_specs(max_records=3), st.data())
def test_truncation_at_any_length_is_detected(spec: BatchSpec, data: st.DataObject) -> None:
    batch = build_record_batch(spec.records, **spec.options)
    cut = data.draw(st.integers(0, len(batch) - 1), label="cut")
    truncated = batch[:cut]
    try:
        RecordBatchView.parse(truncated)
    except TruncatedError:
        pass
    else:
        raise AssertionError(f"a batch cut to {cut} of {len(batch)} bytes parsed")
    if cut == 0:
        return  # an empty tail is no batch at all, not a partial one
    try:
        list(iter_batches(batch + truncated))
    except TruncatedError:
        pass
    else:
        raise AssertionError("iter_batches accepted a partial tail")
    assert [bytes(view) for view in iter_batches(batch + truncated, allow_partial_tail=True)] == [
        batch
    ]


def batch_around(records_section: bytes, attributes: int, records_count: int) -> bytes:
    """A header with a valid CRC around arbitrary records bytes."""
    after_crc = (
        struct.pack(">hiqqqhii", attributes, records_count - 1, 0, 0, -1, -1, -1, records_count)
        + records_section
    )
    return struct.pack(">qiibI", 0, 49 + len(records_section), 0, 2, crc32c.crc32c(after_crc)) + (
        after_crc
    )


@given(
    st.binary(max_size=80),
    st.integers(0, 7),
    st.integers(1, 4),
    st.none() | st.integers(0, 200),
)
def test_arbitrary_records_bytes_raise_only_format_errors(
    records_section: bytes, codec_id: int, records_count: int, max_decompressed_bytes: int | None
) -> None:
    batch = batch_around(records_section, codec_id, records_count)
    try:
        view = RecordBatchView.parse(batch)
        records = view.records(max_decompressed_bytes=max_decompressed_bytes)
    except FormatError:
        return
    assert len(records) == records_count


@given(st.lists(batch_specs(max_records=2), min_size=1, max_size=2), st.data())
def test_arbitrary_byte_edits_raise_only_format_errors(
    specs: list[BatchSpec], data: st.DataObject
) -> None:
    buffer = bytearray(b"".join(build_record_batch(s.records, **s.options) for s in specs))
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        index = data.draw(st.integers(0, len(buffer) - 1), label="index")
        buffer[index] = data.draw(st.integers(0, 255), label="byte")
    try:
        for view in iter_batches(buffer, verify_crc=False, allow_partial_tail=True):
            view.records()
    except FormatError:
        pass


@given(st.sampled_from(list(CompressionType)), st.binary(max_size=2000))
def test_codec_round_trip(codec: CompressionType, payload: bytes) -> None:
    compressed = codecs.compress(codec, payload)
    assert codecs.decompress(codec, compressed) == payload
    assert codecs.decompress(codec, compressed, max_output_bytes=len(payload)) == payload


@given(st.lists(st.binary(max_size=300), max_size=5))
def test_xerial_snappy_blocks_decode_to_their_concatenation(blocks: list[bytes]) -> None:
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        raw = codecs.compress(CompressionType.SNAPPY, block)
        framed += struct.pack(">i", len(raw)) + raw
    assert codecs.decompress(CompressionType.SNAPPY, framed) == b"".join(blocks)


@given(st.integers(1, 4), st.binary(max_size=100), st.none() | st.integers(0, 1000))
def test_decompressing_garbage_raises_only_format_errors(
    codec: int, garbage: bytes, max_output_bytes: int | None
) -> None:
    with contextlib.suppress(FormatError):
        codecs.decompress(codec, garbage, max_output_bytes=max_output_bytes)


def columns_of(records: list[Record]) -> RecordColumns:
    return RecordColumns(
        [r.offset for r in records],
        [r.timestamp for r in records],
        [r.key for r in records],
        [r.value for r in records],
        [r.headers for r in records],
    )


@given(batch_specs(max_records=8))
def test_record_columns_equal_the_records(spec: BatchSpec) -> None:
    view = RecordBatchView.parse(build_record_batch(spec.records, **spec.options))
    assert view.record_columns() == columns_of(view.records())
    assert view.record_columns(include_headers=False).headers == []


@given(
    st.binary(max_size=80),
    st.integers(0, 7),
    st.integers(1, 4),
)
def test_record_columns_accept_and_refuse_what_records_do(
    records_section: bytes, codec_id: int, records_count: int
) -> None:
    """On arbitrary bytes the fast column decoder agrees with the careful one: the same
    records, or a FormatError from both."""
    view = RecordBatchView.unchecked(batch_around(records_section, codec_id, records_count))
    try:
        expected = columns_of(view.records())
    except FormatError:
        expected = None
    try:
        got = view.record_columns()
    except FormatError:
        got = None
    assert got == expected
