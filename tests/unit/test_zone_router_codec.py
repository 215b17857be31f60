"""The AutomqZoneRouter codec (API key 515, v0-1, flexible from v0), the produce answer block
each routed entry is answered with, and the routed Produce request body.

The request and response are checked against the field layout of AutoMQ's message schema,
written out here byte by byte (request header v2, ``metadata`` compact bytes, then from v1
``RouteEpoch`` int64 and ``Version`` int16, tagged fields; response header v1, ``ErrorCode``
int16, ``ThrottleTimeMs`` int32, ``Responses`` a compact array of ``Data`` compact bytes), and
round-tripped with hypothesis. The produce answer block's body is kio's ProduceResponse v11;
the routed Produce body is what the broker's own Produce decoder and kio read back.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from automq_ref.protocol import decode_produce_request
from automq_ref.protocol.primitives import MalformedRequestError, UnsupportedVersionError
from automq_ref.protocol.produce_response import ProducePartitionAnswer
from automq_ref.protocol.zone_router import (
    PRODUCE_ANSWER_MAGIC,
    ZONE_ROUTER_API_KEY,
    ZoneRouterRequest,
    ZoneRouterResponse,
    decode_produce_answer,
    decode_zone_router_request,
    decode_zone_router_response,
    encode_produce_answer,
    encode_produce_request_body,
    encode_zone_router_request,
    encode_zone_router_response,
)

int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
blobs = st.binary(max_size=40) | st.binary(min_size=130, max_size=300)


def test_a_v1_request_has_automq_s_field_layout() -> None:
    frame = encode_zone_router_request(1, 7, "proxy", ZoneRouterRequest(b"\x02abc", 42, 1))
    expected = (
        struct.pack(">hhi", 515, 1, 7)
        + struct.pack(">h", 5)
        + b"proxy"
        + b"\x00"  # request header v2: tagged fields
        + bytes([4 + 1])  # metadata: compact bytes, length + 1
        + b"\x02abc"
        + struct.pack(">q", 42)  # RouteEpoch
        + struct.pack(">h", 1)  # Version
        + b"\x00"
    )
    assert frame == expected
    assert decode_zone_router_request(frame) == (
        1,
        7,
        "proxy",
        ZoneRouterRequest(b"\x02abc", 42, 1),
    )


def test_a_v0_request_has_only_the_metadata() -> None:
    frame = encode_zone_router_request(0, 1, None, ZoneRouterRequest(b"xy", 9, 1))
    assert frame == struct.pack(">hhih", 515, 0, 1, -1) + b"\x00" + b"\x03xy" + b"\x00"
    assert decode_zone_router_request(frame)[3] == ZoneRouterRequest(b"xy", 0, 0)


def test_a_response_has_automq_s_field_layout() -> None:
    encoded = encode_zone_router_response(1, 5, ZoneRouterResponse(0, (b"a", b"bc"), 3))
    expected = (
        struct.pack(">i", 5)
        + b"\x00"  # response header v1
        + struct.pack(">hi", 0, 3)
        + bytes([2 + 1])
        + b"\x02a\x00"
        + b"\x03bc\x00"
        + b"\x00"
    )
    assert encoded == expected
    assert decode_zone_router_response(encoded, 1) == (5, ZoneRouterResponse(0, (b"a", b"bc"), 3))


@given(
    version=st.sampled_from([0, 1]),
    correlation=int32s,
    client=st.none() | st.text(max_size=10),
    metadata=blobs,
    epoch=int64s,
    router_version=int16s,
)
def test_requests_round_trip(
    version: int,
    correlation: int,
    client: str | None,
    metadata: bytes,
    epoch: int,
    router_version: int,
) -> None:
    request = ZoneRouterRequest(metadata, epoch, router_version)
    decoded = decode_zone_router_request(
        encode_zone_router_request(version, correlation, client, request)
    )
    expected = request if version == 1 else ZoneRouterRequest(metadata, 0, 0)
    assert decoded == (version, correlation, client, expected)


@given(
    version=st.sampled_from([0, 1]),
    correlation=int32s,
    error=int16s,
    throttle=int32s,
    data=st.lists(blobs, max_size=5),
)
def test_responses_round_trip(
    version: int, correlation: int, error: int, throttle: int, data: list[bytes]
) -> None:
    response = ZoneRouterResponse(error, tuple(data), throttle)
    encoded = encode_zone_router_response(version, correlation, response)
    assert decode_zone_router_response(encoded, version) == (correlation, response)


def test_bad_frames_are_refused() -> None:
    frame = encode_zone_router_request(1, 1, "c", ZoneRouterRequest(b"m", 1, 1))
    with pytest.raises(MalformedRequestError):
        decode_zone_router_request(frame[:-3])
    with pytest.raises(MalformedRequestError):
        decode_zone_router_request(frame + b"\x00")
    with pytest.raises(UnsupportedVersionError):
        decode_zone_router_request(struct.pack(">hhi", ZONE_ROUTER_API_KEY, 2, 1) + frame[8:])
    with pytest.raises(MalformedRequestError):
        decode_zone_router_request(struct.pack(">hhi", 0, 1, 1) + frame[8:])


@given(
    index=int32s,
    error=st.sampled_from(sorted(code.value for code in ErrorCode)),
    base=int64s,
    log_start=int64s,
    message=st.none() | st.text(max_size=20),
)
def test_produce_answers_are_a_v11_produce_response(
    index: int, error: int, base: int, log_start: int, message: str | None
) -> None:
    answer = ProducePartitionAnswer(index, error, base, -1, log_start, message)
    block = encode_produce_answer("topic", answer)
    assert block[0] == PRODUCE_ANSWER_MAGIC and struct.unpack_from(">h", block, 1) == (11,)
    kio_response: Any
    kio_response, end = entity_reader(load_response_schema(0, 11))(block[3:], 0)
    assert end == len(block) - 3
    (topic,) = kio_response.responses
    (partition,) = topic.partition_responses
    assert (topic.name, partition.index, partition.error_code.value) == ("topic", index, error)
    assert (partition.base_offset, partition.log_start_offset) == (base, log_start)
    assert partition.error_message == message
    assert decode_produce_answer(block) == answer


def test_a_produce_answer_block_with_another_magic_is_refused() -> None:
    block = encode_produce_answer("t", ProducePartitionAnswer(0, 0, 1))
    with pytest.raises(MalformedRequestError):
        decode_produce_answer(b"\x02" + block[1:])


@given(
    version=st.integers(3, 12),
    transactional=st.none() | st.text(max_size=8),
    acks=st.sampled_from([-1, 0, 1]),
    timeout=int32s,
    records=st.none() | blobs,
    index=int32s,
)
def test_routed_produce_bodies_read_back(
    version: int,
    transactional: str | None,
    acks: int,
    timeout: int,
    records: bytes | None,
    index: int,
) -> None:
    body = encode_produce_request_body(
        version, transactional, acks, timeout, [("topic", [(index, records)])]
    )
    decoded = decode_produce_request(body, version)
    assert (decoded.transactional_id, decoded.acks, decoded.timeout_ms) == (
        transactional,
        acks,
        timeout,
    )
    (topic,) = decoded.topic_data
    (partition,) = topic.partition_data
    assert topic.name == "topic" and partition.index == index
    assert (None if partition.records is None else bytes(partition.records)) == records
    kio_request: Any
    kio_request, end = entity_reader(load_request_schema(0, version))(body, 0)
    assert end == len(body) and kio_request.acks == acks
