"""RecordBatch v2 and its codecs: hand-built batches, every validation rule, patching, framing."""

from __future__ import annotations

import gzip
import struct

import crc32c
import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import codecs
from automq_ref.formats.codecs import CompressionType
from automq_ref.formats.errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    InvalidFieldError,
    TruncatedError,
    UnsupportedCodecError,
)
from automq_ref.formats.record_batch import (
    Record,
    RecordBatchView,
    RecordInput,
    TimestampType,
    build_record_batch,
    encode_varint,
    encode_varlong,
    iter_batches,
    read_varint,
    read_varlong,
)

HEADER_FORMAT = ">qiibIhiqqqhii"

# Two records encoded by hand, byte by byte (zigzag: 0 -> 00, -1 -> 01, 1 -> 02, 5 -> 0a).
# Record 0: attributes 0, timestampDelta 0, offsetDelta 0, key b"k", value b"hello",
# one header ("h", b"1"). Body = 16 bytes, so the length varint is zigzag(16) = 0x20.
RECORD_0 = bytes.fromhex("2000000002 6b0a 68656c6c6f0202 6802 31")
# Record 1: attributes 0, timestampDelta -1, offsetDelta 1, key null, value b"", no headers.
# Body = 6 bytes, length varint zigzag(6) = 0x0c.
RECORD_1 = bytes.fromhex("0c000102010000")


def make_batch(
    records_section: bytes,
    *,
    base_offset: int = 100,
    partition_leader_epoch: int = 3,
    magic: int = 2,
    attributes: int = 0,
    last_offset_delta: int = 1,
    base_timestamp: int = 1_700_000_000_000,
    max_timestamp: int = 1_700_000_000_000,
    producer_id: int = 42,
    producer_epoch: int = 1,
    base_sequence: int = 7,
    records_count: int = 2,
    batch_length: int | None = None,
    crc: int | None = None,
) -> bytes:
    """Lay a batch out field by field with struct; the CRC is computed unless given."""
    body_after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
        + records_section
    )
    if batch_length is None:
        batch_length = 4 + 1 + 4 + len(body_after_crc)  # epoch + magic + crc + the rest
    if crc is None:
        crc = crc32c.crc32c(body_after_crc)
    return (
        struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, magic, crc)
        + body_after_crc
    )


KNOWN_BATCH = make_batch(RECORD_0 + RECORD_1)


def set_field_and_fix_crc(batch: bytes, offset: int, fmt: str, value: int) -> bytes:
    patched = bytearray(batch)
    struct.pack_into(fmt, patched, offset, value)
    struct.pack_into(">I", patched, 17, crc32c.crc32c(bytes(patched[21:])))
    return bytes(patched)


# CRC-32C itself


def test_crc32c_is_castagnoli() -> None:
    # The standard check value of CRC-32C over "123456789"; CRC-32 (zlib) would give 0xCBF43926.
    assert crc32c.crc32c(b"123456789") == 0xE3069283


# The known batch


def test_known_batch_header_fields() -> None:
    view = RecordBatchView.parse(KNOWN_BATCH)
    assert view.base_offset == 100
    assert view.batch_length == len(KNOWN_BATCH) - 12
    assert view.partition_leader_epoch == 3
    assert view.magic == 2
    assert view.crc == crc32c.crc32c(KNOWN_BATCH[21:])
    assert view.crc == view.compute_crc()
    assert view.attributes == 0
    assert view.last_offset_delta == 1
    assert view.base_timestamp == 1_700_000_000_000
    assert view.max_timestamp == 1_700_000_000_000
    assert view.producer_id == 42
    assert view.producer_epoch == 1
    assert view.base_sequence == 7
    assert view.records_count == 2
    assert view.compression is CompressionType.NONE
    assert view.timestamp_type is TimestampType.CREATE_TIME
    assert not view.is_transactional
    assert not view.is_control
    assert view.last_offset == 101
    assert view.next_offset == 102
    assert view.size_bytes == len(KNOWN_BATCH) == 61 + len(RECORD_0) + len(RECORD_1)
    assert bytes(view) == KNOWN_BATCH
    assert view.header() == struct.unpack(HEADER_FORMAT, KNOWN_BATCH[:61])


def test_known_batch_records() -> None:
    assert RecordBatchView.parse(KNOWN_BATCH).records() == [
        Record(
            offset=100,
            timestamp=1_700_000_000_000,
            key=b"k",
            value=b"hello",
            headers=(("h", b"1"),),
            attributes=0,
            timestamp_delta=0,
            offset_delta=0,
        ),
        Record(
            offset=101,
            timestamp=1_699_999_999_999,
            key=None,
            value=b"",
            headers=(),
            attributes=0,
            timestamp_delta=-1,
            offset_delta=1,
        ),
    ]


def test_builder_reproduces_the_known_batch_byte_for_byte() -> None:
    built = build_record_batch(
        [
            RecordInput(
                key=b"k", value=b"hello", headers=[("h", b"1")], timestamp=1_700_000_000_000
            ),
            RecordInput(key=None, value=b"", timestamp=1_699_999_999_999),
        ],
        base_offset=100,
        partition_leader_epoch=3,
        producer_id=42,
        producer_epoch=1,
        base_sequence=7,
        base_timestamp=1_700_000_000_000,
    )
    assert built == KNOWN_BATCH


def test_parse_leaves_trailing_bytes_alone_and_does_not_copy() -> None:
    buffer = bytearray(b"\xaa" * 5 + KNOWN_BATCH + b"\xbb" * 7)
    view = RecordBatchView.parse(buffer, 5)
    assert view.size_bytes == len(KNOWN_BATCH)
    assert view.buffer.obj is buffer
    buffer[5] = 0x7F  # a write through the original buffer is seen by the view
    assert view.base_offset == 0x7F00_0000_0000_0064


# In-place patches


def test_patching_base_offset_and_epoch_keeps_the_crc() -> None:
    buffer = bytearray(KNOWN_BATCH)
    view = RecordBatchView.parse(buffer)
    crc_before = view.crc
    view.set_base_offset(9_000_000_000)
    view.set_partition_leader_epoch(17)
    view.validate()
    assert view.crc == crc_before == view.compute_crc()
    assert (view.base_offset, view.partition_leader_epoch) == (9_000_000_000, 17)
    assert [record.offset for record in view.records()] == [9_000_000_000, 9_000_000_001]
    changed = [index for index in range(len(buffer)) if buffer[index] != KNOWN_BATCH[index]]
    assert changed and all(index < 8 or 12 <= index < 16 for index in changed)
    reparsed = RecordBatchView.parse(bytes(buffer))
    assert (reparsed.base_offset, reparsed.partition_leader_epoch) == (9_000_000_000, 17)


@pytest.mark.parametrize(
    "readonly_buffer",
    [KNOWN_BATCH, memoryview(bytearray(KNOWN_BATCH)).toreadonly()],
    ids=["bytes", "readonly-memoryview"],
)
def test_patching_a_read_only_buffer_is_refused(readonly_buffer: bytes | memoryview) -> None:
    view = RecordBatchView.parse(readonly_buffer)
    with pytest.raises(TypeError, match="read-only"):
        view.set_base_offset(1)
    with pytest.raises(TypeError, match="read-only"):
        view.set_partition_leader_epoch(1)
    assert view.base_offset == 100


def test_patching_out_of_range_values_is_refused() -> None:
    view = RecordBatchView.parse(bytearray(KNOWN_BATCH))
    with pytest.raises(ValueError, match="base_offset"):
        view.set_base_offset(1 << 63)
    with pytest.raises(ValueError, match="partition_leader_epoch"):
        view.set_partition_leader_epoch(-(1 << 31) - 1)
    assert bytes(view) == KNOWN_BATCH


# Validation rules, one typed error each


def test_bad_magic() -> None:
    batch = bytearray(KNOWN_BATCH)
    batch[16] = 1
    with pytest.raises(BadMagicError, match="magic is 1") as caught:
        RecordBatchView.parse(batch)
    assert caught.value.code is KafkaErrorCode.CORRUPT_MESSAGE


def test_bad_magic_wins_over_a_short_legacy_length() -> None:
    # A v1 message: offset, size=20, crc, magic=1 ... shorter than any v2 batch.
    legacy = struct.pack(">qiIb", 0, 20, 0, 1) + bytes(19)
    with pytest.raises(BadMagicError):
        RecordBatchView.parse(legacy)


def test_batch_length_below_minimum() -> None:
    with pytest.raises(InvalidFieldError, match="batchLength at byte 0 is 48"):
        RecordBatchView.parse(make_batch(b"", batch_length=48))


def test_batch_length_beyond_buffer() -> None:
    batch = make_batch(RECORD_0 + RECORD_1, batch_length=len(KNOWN_BATCH) - 12 + 1)
    with pytest.raises(TruncatedError, match="batchLength="):
        RecordBatchView.parse(batch)


@pytest.mark.parametrize("length", [0, 1, 11])
def test_buffer_shorter_than_the_length_field(length: int) -> None:
    with pytest.raises(TruncatedError):
        RecordBatchView.parse(KNOWN_BATCH[:length])


def test_crc_mismatch_and_verify_crc_false() -> None:
    batch = bytearray(KNOWN_BATCH)
    batch[-1] ^= 0x01
    with pytest.raises(ChecksumError, match="crc is 0x") as caught:
        RecordBatchView.parse(batch)
    assert caught.value.code is KafkaErrorCode.CORRUPT_MESSAGE
    view = RecordBatchView.parse(batch, verify_crc=False)
    assert view.compute_crc() != view.crc


def test_crc_mismatch_in_a_stored_crc_byte() -> None:
    batch = bytearray(KNOWN_BATCH)
    batch[17] ^= 0x80
    with pytest.raises(ChecksumError):
        RecordBatchView.parse(batch)


@pytest.mark.parametrize(
    ("last_offset_delta", "records_count"),
    [(0, 2), (2, 2), (-1, 0), (-2, -1)],
)
def test_inconsistent_offset_range(last_offset_delta: int, records_count: int) -> None:
    batch = make_batch(
        RECORD_0 + RECORD_1, last_offset_delta=last_offset_delta, records_count=records_count
    )
    with pytest.raises(InvalidFieldError, match="Inconsistent batch offset range") as caught:
        RecordBatchView.parse(batch)
    assert f"lastOffsetDelta={last_offset_delta}" in str(caught.value)
    assert f"recordsCount={records_count}" in str(caught.value)
    assert caught.value.code is KafkaErrorCode.INVALID_RECORD


def test_producer_id_without_sequence() -> None:
    batch = make_batch(RECORD_0 + RECORD_1, producer_id=5, base_sequence=-1)
    with pytest.raises(InvalidFieldError, match=r"baseSequence=-1.*producerId=5"):
        RecordBatchView.parse(batch)


def test_control_batch_with_producer_id_and_no_sequence_is_valid() -> None:
    # A transaction marker as the coordinator writes it: key = version 0, type 1 (COMMIT).
    marker = RecordInput(key=struct.pack(">hh", 0, 1), value=struct.pack(">hi", 0, 5))
    batch = build_record_batch(
        [marker], producer_id=5, producer_epoch=2, is_control=True, is_transactional=True
    )
    view = RecordBatchView.parse(batch)
    assert view.is_control and view.is_transactional
    assert view.records()[0].key == b"\x00\x00\x00\x01"


def test_no_producer_id_allows_no_sequence() -> None:
    RecordBatchView.parse(make_batch(RECORD_0 + RECORD_1, producer_id=-1, base_sequence=-1))


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec(codec_id: int) -> None:
    batch = make_batch(RECORD_0 + RECORD_1, attributes=codec_id)
    with pytest.raises(UnsupportedCodecError, match=str(codec_id)) as caught:
        RecordBatchView.parse(batch)
    assert caught.value.code is KafkaErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_unchecked_skips_validation_until_asked() -> None:
    batch = bytearray(KNOWN_BATCH)
    batch[-1] ^= 0xFF
    view = RecordBatchView.unchecked(batch)
    assert view.base_offset == 100
    with pytest.raises(ChecksumError):
        view.validate()
    with pytest.raises(TruncatedError):
        RecordBatchView.unchecked(KNOWN_BATCH[:-1])


def test_validate_notices_a_batch_length_changed_after_parsing() -> None:
    buffer = bytearray(KNOWN_BATCH)
    view = RecordBatchView.parse(buffer)
    struct.pack_into(">i", buffer, 8, len(KNOWN_BATCH) - 12 - 1)
    with pytest.raises(InvalidFieldError, match="batchLength"):
        view.validate()


def test_position_outside_the_buffer() -> None:
    with pytest.raises(ValueError, match="position"):
        RecordBatchView.parse(KNOWN_BATCH, len(KNOWN_BATCH) + 1)


# Record decoding errors (the CRC is valid, the records are not)


@pytest.mark.parametrize(
    ("records_section", "records_count", "error", "message"),
    [
        (RECORD_0, 2, TruncatedError, "after 1 of recordsCount=2"),
        (RECORD_0 + RECORD_1 + b"\x00", 2, InvalidFieldError, "1 bytes remain"),
        # Length says 17 body bytes, the fields use 16 (the 17th is the next record's length).
        (b"\x22" + RECORD_0[1:] + RECORD_1, 2, InvalidFieldError, "declares 17 bytes"),
        # Length says 15, so the last header value runs past the record.
        (b"\x1e" + RECORD_0[1:] + RECORD_1, 2, TruncatedError, "header value"),
        (b"\x13", 1, InvalidFieldError, "length -10"),
        (b"\x40" + bytes(5), 1, TruncatedError, "declares 32 bytes"),
        # A varlong of eleven bytes where the timestamp delta should be.
        (b"\x18\x00" + b"\xff" * 10 + b"\x00", 1, InvalidFieldError, "longer than 10"),
        (b"\x0c\x00\x00\x00\x03\x00\x00", 1, InvalidFieldError, "key length at byte 4 is -2"),
        (b"\x0c\x00\x00\x00\x08\x00\x00", 1, TruncatedError, "key at byte 5 declares 4"),
        (b"\x0c\x00\x00\x00\x01\x00\x01", 1, InvalidFieldError, "header count -1"),
        (b"\x0e\x00\x00\x00\x01\x00\x02\x01", 1, InvalidFieldError, "header key length"),
        (b"\x0e\x00\x00\x80\x80\x80\x80\x10", 1, InvalidFieldError, "does not fit 32 bits"),
        (b"\x00", 1, TruncatedError, "ends before its attributes"),
    ],
)
def test_invalid_records(
    records_section: bytes, records_count: int, error: type[FormatError], message: str
) -> None:
    view = RecordBatchView.parse(
        make_batch(
            records_section, records_count=records_count, last_offset_delta=records_count - 1
        )
    )
    with pytest.raises(error, match=message):
        view.records()


def test_corrupt_compressed_records_with_a_valid_crc() -> None:
    compressed = bytearray(codecs.compress(CompressionType.ZSTD, RECORD_0 + RECORD_1))
    compressed[:4] = b"\x00\x00\x00\x00"  # destroy the zstd frame magic
    view = RecordBatchView.parse(make_batch(bytes(compressed), attributes=4))
    with pytest.raises(InvalidFieldError, match="ZSTD") as caught:
        view.records()
    assert caught.value.__cause__ is not None


def test_compressed_records_bounded_by_max_decompressed_bytes() -> None:
    records_section = RECORD_0 + RECORD_1
    for codec in list(CompressionType)[1:]:
        batch = make_batch(codecs.compress(codec, records_section), attributes=codec)
        view = RecordBatchView.parse(batch)
        assert len(view.records(max_decompressed_bytes=len(records_section))) == 2
        with pytest.raises(InvalidFieldError, match="max_output_bytes"):
            view.records(max_decompressed_bytes=len(records_section) - 1)


def test_log_append_time_records_take_the_max_timestamp() -> None:
    batch = build_record_batch(
        [(b"a", b"1", (), 10), (b"b", b"2", (), 30), (b"c", b"3", (), 20)],
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    view = RecordBatchView.parse(batch)
    assert view.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert view.max_timestamp == 30
    assert [record.timestamp for record in view.records()] == [30, 30, 30]
    assert [record.timestamp_delta for record in view.records()] == [0, 20, 10]


def test_header_keys_that_are_not_utf8_round_trip() -> None:
    records_section = b"\x12\x00\x00\x00\x01\x00\x02\x02\xff\x01"
    view = RecordBatchView.parse(make_batch(records_section, records_count=1, last_offset_delta=0))
    (record,) = view.records()
    ((header_key, header_value),) = record.headers
    assert header_value is None
    assert header_key.encode("utf-8", "surrogateescape") == b"\xff"
    rebuilt = build_record_batch([RecordInput(headers=record.headers, timestamp=0)])
    assert RecordBatchView.parse(rebuilt).records()[0].headers == record.headers


# Builder


def test_builder_defaults() -> None:
    view = RecordBatchView.parse(build_record_batch([(b"k", b"v")]))
    assert (view.base_offset, view.partition_leader_epoch) == (0, -1)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (-1, -1, -1)
    assert (view.base_timestamp, view.max_timestamp) == (-1, -1)
    assert view.records()[0].timestamp == -1


def test_builder_base_timestamp_comes_from_the_first_timestamped_record() -> None:
    view = RecordBatchView.parse(build_record_batch([(b"a", None), (b"b", None, (), 500)]))
    assert view.base_timestamp == 500
    assert [record.timestamp for record in view.records()] == [500, 500]


@pytest.mark.parametrize(
    ("records", "options", "message"),
    [
        ([], {}, "at least one record"),
        ([(b"k", b"v")], {"producer_id": 1}, "base_sequence"),
        ([(b"k", b"v")], {"producer_epoch": 1 << 15}, "producer_epoch"),
        ([(b"k", b"v")], {"base_offset": -(1 << 63) - 1}, "base_offset"),
        ([(b"k", b"v", (), -(1 << 63)), (b"k", b"v", (), 1 << 62)], {}, "timestamp delta"),
        ([(b"k",)], {}, "2 to 4 items"),
    ],
)
def test_builder_refuses_batches_that_would_not_validate(
    records: list[tuple[object, ...]], options: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_record_batch(records, **options)  # type: ignore[arg-type]


def test_builder_refuses_unknown_codec() -> None:
    with pytest.raises(UnsupportedCodecError):
        build_record_batch([(b"k", b"v")], compression=5)


@pytest.mark.parametrize("codec", list(CompressionType))
def test_builder_every_codec(codec: CompressionType) -> None:
    records = [
        (b"key-%d" % index, b"value " * index, [("n", b"%d" % index)]) for index in range(50)
    ]
    view = RecordBatchView.parse(build_record_batch(records, compression=codec, base_offset=7))
    assert view.compression is codec
    assert view.attributes & 0x07 == codec
    decoded = view.records()
    assert [(record.key, record.value, list(record.headers)) for record in decoded] == records
    assert [record.offset for record in decoded] == list(range(7, 57))


# iter_batches


def three_batches() -> list[bytes]:
    return [
        build_record_batch([(b"a", b"1")], base_offset=0),
        build_record_batch([(b"b", b"2"), (b"c", b"3")], base_offset=1, compression=1),
        build_record_batch([(b"d", b"4")] * 3, base_offset=3, compression=4),
    ]


def test_iter_batches_over_three_batches() -> None:
    batches = three_batches()
    views = list(iter_batches(b"".join(batches)))
    assert [bytes(view) for view in views] == batches
    assert [(view.base_offset, view.next_offset) for view in views] == [(0, 1), (1, 3), (3, 6)]
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("tail_bytes", [1, 11, 12, 16, 17, 60, -1])
def test_iter_batches_partial_tail(tail_bytes: int) -> None:
    batches = three_batches()
    buffer = b"".join(batches[:2]) + batches[2][:tail_bytes]
    with pytest.raises(TruncatedError):
        list(iter_batches(buffer))
    views = list(iter_batches(buffer, allow_partial_tail=True))
    assert [bytes(view) for view in views] == batches[:2]


def test_iter_batches_tail_with_invalid_length_still_raises() -> None:
    batches = three_batches()
    tail = bytearray(batches[2][:30])
    struct.pack_into(">i", tail, 8, 10)
    with pytest.raises(InvalidFieldError):
        list(iter_batches(batches[0] + bytes(tail), allow_partial_tail=True))
    tail = bytearray(batches[2][:30])
    tail[16] = 1
    with pytest.raises(BadMagicError):
        list(iter_batches(batches[0] + bytes(tail), allow_partial_tail=True))


def test_iter_batches_stops_at_a_corrupt_batch() -> None:
    batches = three_batches()
    corrupt = bytearray(batches[1])
    corrupt[-1] ^= 0x10
    iterator = iter_batches(batches[0] + bytes(corrupt) + batches[2])
    assert next(iterator).base_offset == 0
    with pytest.raises(ChecksumError):
        next(iterator)


# Varints


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (-64, "7f"),
        (64, "8001"),
        (2**31 - 1, "feffffff0f"),
        (-(2**31), "ffffffff0f"),
    ],
)
def test_varint_known_encodings(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert encode_varlong(value).hex() == encoded
    assert read_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


def test_varlong_extremes() -> None:
    assert encode_varlong(2**63 - 1).hex() == "fe" + "ff" * 8 + "01"
    assert encode_varlong(-(2**63)).hex() == "ff" * 9 + "01"
    assert read_varlong(bytes.fromhex("ff" * 9 + "01")) == (-(2**63), 10)


@pytest.mark.parametrize(
    ("reader", "data", "error"),
    [
        (read_varint, b"\x80\x80\x80\x80\x80\x00", InvalidFieldError),
        (read_varint, b"\xff\xff\xff\xff\x1f", InvalidFieldError),
        (read_varint, b"\x80\x80", TruncatedError),
        (read_varint, b"", TruncatedError),
        (read_varlong, b"\x80" * 10 + b"\x00", InvalidFieldError),
        (read_varlong, b"\xff" * 9 + b"\x03", InvalidFieldError),
        (read_varlong, b"\xff" * 9, TruncatedError),
    ],
)
def test_varint_errors(reader: object, data: bytes, error: type[FormatError]) -> None:
    with pytest.raises(error):
        reader(data)  # type: ignore[operator]


def test_varint_respects_limit() -> None:
    with pytest.raises(TruncatedError):
        read_varint(b"\x80\x01", 0, 1)
    assert read_varint(b"\x80\x01", 0, 99) == (64, 2)
    with pytest.raises(ValueError):
        encode_varint(2**31)
    with pytest.raises(ValueError):
        encode_varlong(-(2**63) - 1)


# Codecs

HELLO_RAW_SNAPPY = bytes.fromhex("051068656c6c6f")  # length 5, literal tag (5-1)<<2, "hello"
WORLD_RAW_SNAPPY = bytes.fromhex("061420776f726c64")  # length 6, literal, " world"
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def test_raw_snappy_decodes() -> None:
    assert codecs.decompress(CompressionType.SNAPPY, HELLO_RAW_SNAPPY) == b"hello"


def test_xerial_snappy_decodes() -> None:
    framed = (
        XERIAL_HEADER
        + struct.pack(">i", len(HELLO_RAW_SNAPPY))
        + HELLO_RAW_SNAPPY
        + struct.pack(">i", len(WORLD_RAW_SNAPPY))
        + WORLD_RAW_SNAPPY
    )
    assert codecs.decompress(CompressionType.SNAPPY, framed) == b"hello world"
    assert codecs.decompress(CompressionType.SNAPPY, XERIAL_HEADER) == b""
    assert codecs.decompress(CompressionType.SNAPPY, framed, max_output_bytes=11) == b"hello world"
    with pytest.raises(InvalidFieldError, match="max_output_bytes=10"):
        codecs.decompress(CompressionType.SNAPPY, framed, max_output_bytes=10)


@pytest.mark.parametrize(
    ("framed", "error"),
    [
        (XERIAL_HEADER[:12], TruncatedError),
        (XERIAL_HEADER + b"\x00\x00", TruncatedError),
        (XERIAL_HEADER + struct.pack(">i", 8) + HELLO_RAW_SNAPPY, TruncatedError),
        (XERIAL_HEADER + struct.pack(">i", -1), InvalidFieldError),
        (XERIAL_HEADER + struct.pack(">i", 3) + b"\x05\x10h", InvalidFieldError),
    ],
)
def test_xerial_snappy_errors(framed: bytes, error: type[FormatError]) -> None:
    with pytest.raises(error):
        codecs.decompress(CompressionType.SNAPPY, framed)


def test_snappy_encodes_raw() -> None:
    assert codecs.compress(CompressionType.SNAPPY, b"hello") == HELLO_RAW_SNAPPY


@pytest.mark.parametrize("codec", list(CompressionType))
@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256)) * 600], ids=["empty", "1", "150k"])
def test_codec_round_trip(codec: CompressionType, data: bytes) -> None:
    compressed = codecs.compress(codec, data)
    assert codecs.decompress(codec, compressed) == data
    assert codecs.decompress(codec, bytearray(compressed)) == data
    assert codecs.decompress(codec, memoryview(b"??" + compressed)[2:]) == data
    assert codecs.decompress(codec, compressed, max_output_bytes=len(data)) == data
    if data:
        with pytest.raises(InvalidFieldError, match="max_output_bytes"):
            codecs.decompress(codec, compressed, max_output_bytes=len(data) - 1)


def test_codec_wire_formats() -> None:
    data = b"abcdefgh" * 20_000
    assert codecs.compress(CompressionType.GZIP, data)[:2] == b"\x1f\x8b"
    assert codecs.compress(CompressionType.ZSTD, data)[:4] == b"\x28\xb5\x2f\xfd"
    lz4_frame = codecs.compress(CompressionType.LZ4, data)
    assert lz4_frame[:4] == b"\x04\x22\x4d\x18"
    assert lz4_frame[4] & 0x20, "LZ4 blocks must be independent for Java's KafkaLZ4BlockInputStream"


def test_gzip_interoperates_with_the_standard_library() -> None:
    data = b"interop " * 1000
    assert codecs.decompress(CompressionType.GZIP, gzip.compress(data)) == data
    assert gzip.decompress(codecs.compress(CompressionType.GZIP, data)) == data
    # Two gzip members, as some writers flush: one stream.
    two_members = gzip.compress(b"first ") + gzip.compress(b"second")
    assert codecs.decompress(CompressionType.GZIP, two_members) == b"first second"


def test_decompression_bomb_is_stopped() -> None:
    bomb = codecs.compress(CompressionType.ZSTD, bytes(64 << 20))
    assert len(bomb) < 10_000
    with pytest.raises(InvalidFieldError, match="more than max_output_bytes=1048576"):
        codecs.decompress(CompressionType.ZSTD, bomb, max_output_bytes=1 << 20)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_corrupt_data_raises_a_chained_format_error(codec: int) -> None:
    compressed = bytearray(codecs.compress(codec, b"some payload " * 100))
    compressed[0] ^= 0xFF
    with pytest.raises(InvalidFieldError) as caught:
        codecs.decompress(codec, compressed)
    assert caught.value.__cause__ is not None
    with pytest.raises(InvalidFieldError):
        codecs.decompress(codec, compressed, max_output_bytes=1 << 20)


@pytest.mark.parametrize("codec_id", [-1, 5, 7, 8])
def test_unknown_codec_id(codec_id: int) -> None:
    with pytest.raises(UnsupportedCodecError):
        codecs.compress(codec_id, b"x")
    with pytest.raises(UnsupportedCodecError):
        codecs.decompress(codec_id, b"x")


# Cross-check against kio's pure-Python RecordBatch v2 reader and writer (a project dependency).


def test_kio_reads_our_batches() -> None:
    readers = pytest.importorskip("kio.records.readers")
    batch = build_record_batch(
        [
            RecordInput(key=b"k", value=b"v", headers=[("h", b"x")], timestamp=1_700_000_000_000),
            RecordInput(key=None, value=None, timestamp=1_700_000_001_000),
        ],
        base_offset=50,
        partition_leader_epoch=4,
        producer_id=9,
        producer_epoch=2,
        base_sequence=11,
    )
    kio_batch, size = readers.read_batch(batch, 0)
    view = RecordBatchView.parse(batch)
    assert size == view.size_bytes
    assert (kio_batch.base_offset, kio_batch.crc, kio_batch.attributes) == (
        view.base_offset,
        view.crc,
        view.attributes,
    )
    assert (kio_batch.producer_id, kio_batch.producer_epoch, kio_batch.base_sequence) == (9, 2, 11)
    assert [(r.offset, r.key, r.value) for r in kio_batch.records] == [
        (r.offset, r.key, r.value) for r in view.records()
    ]
    assert [[(h.key, h.value) for h in r.headers] for r in kio_batch.records] == [
        [(key.encode(), value) for key, value in r.headers] for r in view.records()
    ]


def test_we_read_kio_batches() -> None:
    pytest.importorskip("kio.records.writers")
    import datetime
    import io

    from kio.records.schema import NewRecordBatch, RecordHeader
    from kio.records.schema import Record as KioRecord
    from kio.records.writers import write_new_batch
    from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

    moment = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    kio_records = tuple(
        KioRecord(
            attributes=i8(0),
            timestamp=TZAwareMicros.parse(moment + datetime.timedelta(seconds=index)),
            offset=i64(index),
            key=b"key-%d" % index,
            value=None if index == 1 else b"value",
            headers=(RecordHeader(key=b"h", value=b"%d" % index),),
        )
        for index in range(3)
    )
    output = io.BytesIO()
    write_new_batch(
        output,
        NewRecordBatch(
            producer_id=i64(3),
            producer_epoch=i16(0),
            partition_leader_epoch=i32(6),
            base_sequence=i32(0),
            records=kio_records,
            attributes=i16(0),
        ),
    )
    view = RecordBatchView.parse(output.getvalue())
    assert (view.producer_id, view.partition_leader_epoch, view.records_count) == (3, 6, 3)
    base_millis = int(moment.timestamp() * 1000)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in view.records()] == [
        (
            index,
            base_millis + 1000 * index,
            b"key-%d" % index,
            None if index == 1 else b"value",
            (("h", b"%d" % index),),
        )
        for index in range(3)
    ]


def test_buffers_of_other_formats_are_seen_as_bytes() -> None:
    import array

    words = array.array("I")
    words.frombytes(KNOWN_BATCH + bytes(-len(KNOWN_BATCH) % 4))
    assert bytes(RecordBatchView.parse(memoryview(words))) == KNOWN_BATCH
    with pytest.raises(ValueError, match="contiguous"):
        RecordBatchView.parse(memoryview(KNOWN_BATCH + KNOWN_BATCH)[::2])
