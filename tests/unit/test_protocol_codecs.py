"""The hand-written Fetch response encoder and Produce request decoder agree with kio byte for byte.

kio (generated from Kafka's message schemas) is the oracle: for every supported version,
hypothesis builds a message, kio serializes it, and the hand-written codec must produce the same
bytes (Fetch) or the same values (Produce). Malformed Produce frames must raise the codec's own
error, and unknown tagged fields in flexible Produce requests must be skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import struct
import sys
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import uvarint

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError, TruncatedError
from automq_ref.protocol import (
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    AbortedTransaction,
    Chunk,
    FetchableTopicResponse,
    FetchPartitionData,
    MalformedRequestError,
    ProduceRequest,
    RequestHeader,
    TruncatedRequestError,
    UnsupportedVersionError,
    decode_produce_frame,
    decode_produce_request,
    decode_request_header,
    encode_fetch_response,
)
from automq_ref.protocol.primitives import encode_uvarint

FETCH_VERSIONS = range(FETCH_MIN_VERSION, FETCH_MAX_VERSION + 1)
PRODUCE_VERSIONS = range(PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION + 1)
ERROR_CODES = sorted(ErrorCode, key=lambda code: code.value)

int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=12)
# Small payloads, and some whose compact length needs a two-byte varint.
payloads = st.binary(max_size=40) | st.binary(min_size=120, max_size=300)


class ChunkList(list[Any]):
    """A kio writer that keeps each written object (so zero-copy can be checked with ``is``)."""

    write = list.append


def kio_bytes(entity_class: type[Any], value: Any) -> bytes:
    out = ChunkList()
    writer: Any = entity_writer(entity_class)
    writer(out, value)
    return b"".join(out)


def build(entity_class: type[Any], **values: Any) -> Any:
    """Instantiate a kio class with the values its version has (others are dropped)."""
    known = {field.name for field in dataclasses.fields(entity_class)}
    return entity_class(**{key: value for key, value in values.items() if key in known})


# --- Fetch response -----------------------------------------------------------------------------


@st.composite
def fetch_partitions(draw: st.DrawFn) -> FetchPartitionData:
    aborted = draw(
        st.none() | st.lists(st.builds(AbortedTransaction, int64s, int64s), max_size=3).map(tuple)
    )
    records: tuple[Chunk, ...] | None = draw(st.none() | st.lists(payloads, max_size=3).map(tuple))
    return FetchPartitionData(
        partition_index=draw(int32s),
        error_code=draw(st.sampled_from(ERROR_CODES)).value,
        high_watermark=draw(int64s),
        last_stable_offset=draw(int64s),
        log_start_offset=draw(int64s),
        aborted_transactions=aborted,
        preferred_read_replica=draw(int32s),
        records=records,
    )


@st.composite
def fetch_responses(draw: st.DrawFn) -> dict[str, Any]:
    topics = draw(
        st.lists(
            st.builds(
                FetchableTopicResponse,
                partitions=st.lists(fetch_partitions(), max_size=4).map(tuple),
                topic=names,
                topic_id=st.uuids(),
            ),
            max_size=3,
        )
    )
    return {
        "version": draw(st.sampled_from(FETCH_VERSIONS)),
        "correlation_id": draw(int32s),
        "responses": tuple(topics),
        "throttle_time_ms": draw(int32s),
        "error_code": draw(st.sampled_from(ERROR_CODES)).value,
        "session_id": draw(int32s),
    }


def kio_fetch_frame(case: dict[str, Any]) -> bytes:
    """The same response built from kio's classes and serialized by kio, with its size prefix."""
    response_class = load_response_schema(1, case["version"])
    module = sys.modules[response_class.__module__]
    topics = []
    for topic in case["responses"]:
        partitions = []
        for partition in topic.partitions:
            aborted = partition.aborted_transactions
            records = partition.records
            partitions.append(
                build(
                    module.PartitionData,
                    partition_index=partition.partition_index,
                    error_code=ErrorCode(partition.error_code),
                    high_watermark=partition.high_watermark,
                    last_stable_offset=partition.last_stable_offset,
                    log_start_offset=partition.log_start_offset,
                    aborted_transactions=None
                    if aborted is None
                    else tuple(
                        module.AbortedTransaction(
                            producer_id=item.producer_id, first_offset=item.first_offset
                        )
                        for item in aborted
                    ),
                    preferred_read_replica=partition.preferred_read_replica,
                    records=None if records is None else b"".join(records),
                )
            )
        topics.append(
            build(
                module.FetchableTopicResponse,
                topic=topic.topic,
                topic_id=topic.topic_id,
                partitions=tuple(partitions),
            )
        )
    response = build(
        response_class,
        throttle_time=datetime.timedelta(milliseconds=case["throttle_time_ms"]),
        error_code=ErrorCode(case["error_code"]),
        session_id=case["session_id"],
        responses=tuple(topics),
    )
    header_class = response_class.__header_schema__
    body = kio_bytes(header_class, header_class(correlation_id=case["correlation_id"]))
    body += kio_bytes(response_class, response)
    return struct.pack(">i", len(body)) + body


def encode_case(case: dict[str, Any]) -> list[Chunk]:
    return encode_fetch_response(
        case["version"],
        case["correlation_id"],
        case["responses"],
        throttle_time_ms=case["throttle_time_ms"],
        error_code=case["error_code"],
        session_id=case["session_id"],
    )


@given(fetch_responses())
def test_fetch_response_matches_kio(case: dict[str, Any]) -> None:
    chunks = encode_case(case)
    assert b"".join(chunks) == kio_fetch_frame(case)
    # Every non-empty record chunk is passed through as the very object given.
    given_chunks = [
        chunk
        for topic in case["responses"]
        for partition in topic.partitions
        for chunk in partition.records or ()
        if chunk
    ]
    passed_through = {id(chunk) for chunk in chunks}
    assert all(id(chunk) in passed_through for chunk in given_chunks)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_every_version_with_records_and_empty_partitions(version: int) -> None:
    batch = bytes(range(256)) * 64
    view = memoryview(bytearray(batch))[100:9000]
    topic_id = uuid.UUID("6a1f1a3c-0d2b-4c7e-9f00-3b5a7d9e2c11")
    partitions = (
        FetchPartitionData(partition_index=0, high_watermark=10, records=(batch, view)),
        FetchPartitionData(partition_index=1, error_code=KafkaErrorCode.NOT_LEADER_OR_FOLLOWER),
        FetchPartitionData(
            partition_index=2,
            high_watermark=5,
            aborted_transactions=(AbortedTransaction(7, 3),),
            records=(batch,),
        ),
    )
    case = {
        "version": version,
        "correlation_id": 99,
        "responses": (
            FetchableTopicResponse(partitions=partitions, topic="orders", topic_id=topic_id),
        ),
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 12,
    }
    chunks = encode_case(case)
    assert b"".join(chunks) == kio_fetch_frame(case)
    assert sum(chunk is batch for chunk in chunks) == 2
    assert any(chunk is view for chunk in chunks)
    assert struct.unpack_from(">i", chunks[0])[0] == sum(map(len, chunks)) - 4


class ReadResult(NamedTuple):
    """A broker's own read result, handed to the encoder as is (it only reads attributes)."""

    partition_index: int
    records: tuple[Chunk, ...]
    error_code: int = 0
    high_watermark: int = 40
    last_stable_offset: int = 40
    log_start_offset: int = 0
    aborted_transactions: tuple[AbortedTransaction, ...] | None = None
    preferred_read_replica: int = -1


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_encoder_takes_any_object_with_the_attributes(version: int) -> None:
    own = ReadResult(3, (b"abc", b"de"))
    data = FetchPartitionData(
        partition_index=3,
        high_watermark=40,
        last_stable_offset=40,
        log_start_offset=0,
        records=(b"abc", b"de"),
    )
    topics_own = (FetchableTopicResponse(partitions=(own,), topic="t"),)
    topics_data = (FetchableTopicResponse(partitions=(data,), topic="t"),)
    assert b"".join(encode_fetch_response(version, 1, topics_own)) == b"".join(
        encode_fetch_response(version, 1, topics_data)
    )


def test_fetch_partition_without_data_sends_empty_records() -> None:
    # Kafka answers a partition with no data (or an error) with MemoryRecords.EMPTY: length 0.
    partition = FetchPartitionData(partition_index=0)
    topics = (FetchableTopicResponse(partitions=(partition,), topic="t"),)
    legacy = b"".join(encode_fetch_response(11, 1, topics))
    assert legacy.endswith(b"\xff\xff\xff\xff" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00")
    # (null aborted_transactions, preferred_read_replica -1, records length 0)
    flexible = b"".join(encode_fetch_response(12, 1, topics))
    assert flexible.endswith(b"\xff\xff\xff\xff" + b"\x01" + b"\x00\x00\x00")
    # (preferred_read_replica -1, compact records length 0 + 1, then three empty tag sections)


@pytest.mark.parametrize("version", [FETCH_MIN_VERSION - 1, FETCH_MAX_VERSION + 1])
def test_fetch_unsupported_version(version: int) -> None:
    with pytest.raises(UnsupportedVersionError, match=f"Fetch v{version}"):
        encode_fetch_response(version, 1, ())


# --- Produce request ----------------------------------------------------------------------------


@st.composite
def produce_cases(draw: st.DrawFn) -> tuple[int, Any, Any]:
    """(version, kio RequestHeader, kio ProduceRequest)."""
    version = draw(st.sampled_from(PRODUCE_VERSIONS))
    request_class: Any = load_request_schema(0, version)
    module = sys.modules[request_class.__module__]
    topics = draw(
        st.lists(
            st.builds(
                module.TopicProduceData,
                name=names,
                partition_data=st.lists(
                    st.builds(
                        module.PartitionProduceData,
                        index=int32s,
                        records=st.none() | payloads,
                    ),
                    max_size=3,
                ).map(tuple),
            ),
            max_size=3,
        ).map(tuple)
    )
    request = request_class(
        transactional_id=draw(st.none() | names),
        acks=draw(int16s),
        timeout=datetime.timedelta(milliseconds=draw(int32s)),
        topic_data=topics,
    )
    header = request_class.__header_schema__(
        request_api_key=0,
        request_api_version=version,
        correlation_id=draw(int32s),
        client_id=draw(st.none() | names),
    )
    return version, header, request


def kio_produce_frame(header: Any, request: Any) -> bytes:
    return kio_bytes(type(header), header) + kio_bytes(type(request), request)


def plain_kio(request: Any) -> tuple[Any, ...]:
    return (
        request.transactional_id,
        request.acks,
        request.timeout // datetime.timedelta(milliseconds=1),
        [
            (topic.name, [(p.index, p.records) for p in topic.partition_data])
            for topic in request.topic_data
        ],
    )


def plain_ours(request: ProduceRequest) -> tuple[Any, ...]:
    return (
        request.transactional_id,
        request.acks,
        request.timeout_ms,
        [
            (
                topic.name,
                [
                    (p.index, None if p.records is None else bytes(p.records))
                    for p in topic.partition_data
                ],
            )
            for topic in request.topic_data
        ],
    )


@given(produce_cases())
def test_produce_request_matches_kio(case: tuple[int, Any, Any]) -> None:
    version, header, request = case
    frame = kio_produce_frame(header, request)
    kio_header, offset = entity_reader(type(header))(frame, 0)
    kio_request, _ = entity_reader(type(request))(frame, offset)

    our_header, ours = decode_produce_frame(frame)
    assert our_header == RequestHeader(
        kio_header.request_api_key,
        kio_header.request_api_version,
        kio_header.correlation_id,
        kio_header.client_id,
    )
    assert plain_ours(ours) == plain_kio(kio_request)
    # Records are views into the frame, not copies.
    for topic in ours.topic_data:
        for partition in topic.partition_data:
            assert partition.records is None or partition.records.obj is frame
    # The body decoder alone, given the header's length, agrees.
    assert decode_produce_request(memoryview(frame), version, offset) == ours


@given(produce_cases(), st.data())
def test_produce_truncated_frames_raise(case: tuple[int, Any, Any], data: st.DataObject) -> None:
    _, header, request = case
    frame = kio_produce_frame(header, request)
    cut = data.draw(st.integers(0, len(frame) - 1), label="cut")
    with pytest.raises(MalformedRequestError):
        decode_produce_frame(frame[:cut])


@pytest.mark.parametrize("fill", ["ramp", "zeros"])
@pytest.mark.parametrize("records_size", [5, 126, 127, 16_383, 20_000, 2_100_000])
def test_produce_every_prefix_of_a_frame_raises_truncated(records_size: int, fill: str) -> None:
    # Zero-filled records make a misread length land on a zero "tag count" byte, so a wrong
    # length is not rescued by the careful path; a ramp makes it land on a non-zero byte.
    if fill == "zeros":
        batch = bytes(records_size)
    else:
        batch = bytes(range(256)) * (records_size // 256) + bytes(records_size % 256)
    for version in PRODUCE_VERSIONS:
        request_class: Any = load_request_schema(0, version)
        module = sys.modules[request_class.__module__]
        request = request_class(
            transactional_id="tx",
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(
                module.TopicProduceData(
                    name="orders",
                    partition_data=(
                        module.PartitionProduceData(index=0, records=batch),
                        module.PartitionProduceData(index=1, records=None),
                    ),
                ),
            ),
        )
        header = request_class.__header_schema__(
            request_api_key=0, request_api_version=version, correlation_id=5, client_id="c"
        )
        frame = kio_produce_frame(header, request)
        _, decoded = decode_produce_frame(frame)
        records = decoded.topic_data[0].partition_data[0].records
        assert records is not None and bytes(records) == batch
        assert decoded.topic_data[0].partition_data[1].records is None
        cuts = range(4, len(frame)) if len(frame) < 1000 else [*range(4, 80), len(frame) - 9]
        for cut in [*cuts, len(frame) - 1]:
            with pytest.raises(TruncatedRequestError) as raised:
                decode_produce_frame(frame[:cut])
            assert isinstance(raised.value, TruncatedError)
            assert raised.value.code == KafkaErrorCode.INVALID_REQUEST
        with pytest.raises(MalformedRequestError, match="1 unexpected bytes"):
            decode_produce_frame(frame + b"\x00")


@given(
    st.sampled_from(PRODUCE_VERSIONS),
    st.binary(max_size=200),
)
def test_produce_garbage_raises_format_error_only(version: int, garbage: bytes) -> None:
    frame = struct.pack(">hhi", 0, version, 1) + garbage
    try:
        decode_produce_frame(frame)
    except FormatError as error:
        assert isinstance(error, ValueError)
        assert str(error)


@given(produce_cases(), st.data())
def test_produce_corrupted_frames_raise_format_error_only(
    case: tuple[int, Any, Any], data: st.DataObject
) -> None:
    _, header, request = case
    frame = bytearray(kio_produce_frame(header, request))
    position = data.draw(st.integers(4, len(frame) - 1), label="position")
    frame[position] = data.draw(st.integers(0, 255), label="byte")
    with contextlib.suppress(FormatError):
        decode_produce_frame(bytes(frame))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe", "transactional_id: invalid length -2"),
        (b"\xff\xff\x00\x01\x00\x00\x00\x01\xff\xff\xff\xfe", "topic_data: invalid length -2"),
        (b"\xff\xff\x00\x01\x00\x00\x00\x01\x00\x00\x00\x09", "topic_data: 9 elements cannot fit"),
        (
            b"\xff\xff\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x02\xc3\x28",
            "topic name: not valid UTF-8",
        ),
        (
            b"\xff\xff\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01"
            b"\x00\x00\x00\x00\x00\x00\x00\x08abc",
            "records: needs 8 bytes",
        ),
    ],
)
def test_produce_errors_name_the_field(body: bytes, message: str) -> None:
    with pytest.raises(MalformedRequestError, match=message):
        decode_produce_request(body, 3)


def test_produce_varint_limits() -> None:
    # A flexible transactional_id whose length varint runs past 5 bytes, or past 32 bits.
    with pytest.raises(MalformedRequestError, match="longer than 5 bytes"):
        decode_produce_request(b"\x80\x80\x80\x80\x80\x01", 9)
    with pytest.raises(MalformedRequestError, match="exceeds 32 bits"):
        decode_produce_request(b"\xff\xff\xff\xff\x7f", 9)
    with pytest.raises(TruncatedRequestError, match="inside an unsigned varint"):
        decode_produce_request(b"\x80", 9)


@pytest.mark.parametrize("version", [PRODUCE_MIN_VERSION - 1, PRODUCE_MAX_VERSION + 1])
def test_produce_unsupported_version(version: int) -> None:
    with pytest.raises(UnsupportedVersionError) as raised:
        decode_produce_request(b"", version)
    assert raised.value.code == KafkaErrorCode.UNSUPPORTED_VERSION
    frame = struct.pack(">hhi", 0, version, 1) + b"\xff\xff"
    with pytest.raises(UnsupportedVersionError):
        decode_produce_frame(frame)


def test_produce_frame_of_another_api_is_refused() -> None:
    with pytest.raises(MalformedRequestError, match="api key 1 is not Produce"):
        decode_produce_frame(struct.pack(">hhi", 1, 12, 1) + b"\xff\xff\x00")
    with pytest.raises(MalformedRequestError, match="no api key"):
        decode_produce_frame(b"\x00\x00")


# --- unknown tagged fields ----------------------------------------------------------------------

Tags = list[tuple[int, bytes]]


def tag_section(tags: Tags) -> bytes:
    out = encode_uvarint(len(tags))
    for tag, value in tags:
        out += encode_uvarint(tag) + encode_uvarint(len(value)) + value
    return out


def compact_string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode()
    return encode_uvarint(len(data) + 1) + data


def flexible_produce_frame(header: Any, request: Any, tags: Callable[[str], Tags]) -> bytes:
    """A flexible Produce frame written independently of kio, with ``tags(where)`` as the tagged
    fields of each structure (``where`` in header/request/topic/partition)."""
    client_id = header.client_id
    out = struct.pack(">hhi", 0, header.request_api_version, header.correlation_id)
    if client_id is None:
        out += b"\xff\xff"
    else:
        out += struct.pack(">h", len(client_id.encode())) + client_id.encode()
    out += tag_section(tags("header"))
    out += compact_string(request.transactional_id)
    out += struct.pack(">hi", request.acks, request.timeout // datetime.timedelta(milliseconds=1))
    out += encode_uvarint(len(request.topic_data) + 1)
    for topic in request.topic_data:
        out += compact_string(topic.name) + encode_uvarint(len(topic.partition_data) + 1)
        for partition in topic.partition_data:
            out += struct.pack(">i", partition.index)
            records = partition.records
            out += b"\x00" if records is None else encode_uvarint(len(records) + 1) + records
            out += tag_section(tags("partition"))
        out += tag_section(tags("topic"))
    out += tag_section(tags("request"))
    return out


@given(
    produce_cases().filter(lambda case: case[0] >= 9),
    st.lists(
        st.tuples(st.integers(0, 2**31), st.binary(max_size=300)),
        min_size=1,
        max_size=3,
    ),
)
def test_produce_unknown_tagged_fields_are_skipped(case: tuple[int, Any, Any], tags: Tags) -> None:
    _, header, request = case
    plain = kio_produce_frame(header, request)
    assert flexible_produce_frame(header, request, lambda where: []) == plain
    expected = decode_produce_frame(plain)
    tagged = flexible_produce_frame(header, request, lambda where: tags)
    header_ours, request_ours = decode_produce_frame(tagged)
    assert (header_ours, plain_ours(request_ours)) == (expected[0], plain_ours(expected[1]))


def test_request_header_skips_unknown_tags() -> None:
    frame = struct.pack(">hhih", 3, 12, 77, 1) + b"c" + tag_section([(5, b"xyz"), (300, b"")])
    header, offset = decode_request_header(frame + b"body", flexible=True)
    assert header == RequestHeader(3, 12, 77, "c")
    assert frame[offset:] == b"" and offset == len(frame)
    header, offset = decode_request_header(frame, flexible=False)
    assert offset == 11


@settings(max_examples=20)
@given(st.sampled_from([v for v in PRODUCE_VERSIONS if v >= 9]))
def test_produce_truncated_tag_raises(version: int) -> None:
    frame = struct.pack(">hhih", 0, version, 1, -1) + tag_section([(9, b"abcdef")])
    with pytest.raises(TruncatedRequestError, match="request header tagged field"):
        decode_produce_frame(frame[:-2])


@given(st.integers(0, 2**35 - 1) | st.integers(0, 2**15))
def test_encode_uvarint_matches_kio(value: int) -> None:
    out = ChunkList()
    write_unsigned_varint(cast(Any, out), uvarint(value))
    assert encode_uvarint(value) == b"".join(out)
