"""The zone router's wire messages: AutomqZoneRouterRequest/Response (API key 515), the encoded
ProduceResponse each routed entry is answered with, and the Produce request body a proxy packs
into its RouterChannel.

AutomqZoneRouter is a broker-to-broker API: a proxy tells a partition's leader (the *main*)
where in its RouterChannel the produce data lies; the main answers each entry with the
ProduceResponse its append produced. Versions 0 and 1, flexible from 0 (compact lengths, a
tagged-field section after every structure, request header v2, response header v1)::

    AutomqZoneRouterRequest
      metadata      COMPACT_BYTES  v0+  the router record (v1: a RouterRecordV2)
      route_epoch   INT64          v1+  the route epoch the proxy tagged the entries with
      version       INT16          v1+  the router record's version (1)
      <tagged fields>

    AutomqZoneRouterResponse
      error_code        INT16      v0+  the whole request's error (0: see the responses)
      throttle_time_ms  INT32      v0+
      responses         COMPACT_ARRAY of
        data            COMPACT_BYTES   one entry's answer, in the request's entry order
        <tagged fields>
      <tagged fields>

An entry's answer (:func:`encode_produce_answer`) is a *produce response block*: magic ``0x01``,
the ProduceResponse version (INT16, 11), then a ProduceResponse body of that version (no header)
holding the one partition the entry was for.

The routed data a proxy appends to its channel is a ZoneRouterPack data block
(:mod:`automq_ref.formats.zone_router`) holding a Produce request *body* of the client's version
with only the partition routed (:func:`encode_produce_request_body`); the main decodes it with
the broker's own Produce decoder.

Decoding raises :class:`~automq_ref.protocol.primitives.MalformedRequestError` (naming the
field) on bytes that do not match.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from automq_ref.protocol.primitives import (
    MalformedRequestError,
    Reader,
    UnsupportedVersionError,
    as_byte_view,
    encode_array_length,
    encode_string,
    encode_uvarint,
)
from automq_ref.protocol.produce import (
    PRODUCE_FIRST_FLEXIBLE_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    decode_request_header,
)
from automq_ref.protocol.produce_response import ProducePartitionAnswer, encode_produce_response

ZONE_ROUTER_API_KEY: Final = 515
ZONE_ROUTER_MIN_VERSION: Final = 0
ZONE_ROUTER_MAX_VERSION: Final = 1
ROUTER_RECORD_VERSION: Final = 1  # the request's ``version`` field for a RouterRecordV2

PRODUCE_ANSWER_MAGIC: Final = 0x01
PRODUCE_ANSWER_VERSION: Final = 11

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")
_HEADER: Final = struct.Struct(">hhi")
_NO_TAGS: Final = b"\x00"


@dataclass(frozen=True, slots=True)
class ZoneRouterRequest:
    metadata: bytes
    route_epoch: int = 0  # v1+
    version: int = ROUTER_RECORD_VERSION  # v1+


@dataclass(frozen=True, slots=True)
class ZoneRouterResponse:
    error_code: int
    responses: tuple[bytes, ...] = ()
    throttle_time_ms: int = 0


def _check_version(version: int) -> None:
    if not ZONE_ROUTER_MIN_VERSION <= version <= ZONE_ROUTER_MAX_VERSION:
        raise UnsupportedVersionError(
            f"AutomqZoneRouter v{version} is not supported "
            f"(v{ZONE_ROUTER_MIN_VERSION}..v{ZONE_ROUTER_MAX_VERSION} are)"
        )


def _compact_bytes(data: bytes | bytearray | memoryview) -> bytes:
    return encode_uvarint(len(data) + 1) + bytes(data)


def encode_zone_router_request(
    version: int, correlation_id: int, client_id: str | None, request: ZoneRouterRequest
) -> bytes:
    """A whole request frame (request header v2 and body, no size prefix)."""
    _check_version(version)
    parts = [_HEADER.pack(ZONE_ROUTER_API_KEY, version, correlation_id)]
    if client_id is None:
        parts.append(b"\xff\xff")
    else:
        encoded = client_id.encode()
        parts.append(_INT16.pack(len(encoded)) + encoded)
    parts.append(_NO_TAGS)  # request header v2's tagged fields
    parts.append(_compact_bytes(request.metadata))
    if version >= 1:
        parts.append(_INT64.pack(request.route_epoch))
        parts.append(_INT16.pack(request.version))
    parts.append(_NO_TAGS)
    return b"".join(parts)


def decode_zone_router_request(
    frame: bytes | bytearray | memoryview,
) -> tuple[int, int, str | None, ZoneRouterRequest]:
    """(version, correlation id, client id, request) of a whole request frame."""
    view = as_byte_view(frame)
    header, offset = decode_request_header(view, flexible=True)
    if header.request_api_key != ZONE_ROUTER_API_KEY:
        raise MalformedRequestError(
            f"api key {header.request_api_key} is not AutomqZoneRouter ({ZONE_ROUTER_API_KEY})"
        )
    version = header.request_api_version
    _check_version(version)
    reader = Reader(view, offset)
    metadata = reader.bytes_view(True, "metadata", nullable=False)
    assert metadata is not None
    route_epoch, router_version = 0, 0
    if version >= 1:
        route_epoch = reader.int64("route_epoch")
        router_version = reader.int16("version")
    reader.skip_tagged_fields("AutomqZoneRouterRequest")
    reader.expect_end(f"AutomqZoneRouter v{version} request")
    request = ZoneRouterRequest(bytes(metadata), route_epoch, router_version)
    return version, header.correlation_id, header.client_id, request


def encode_zone_router_response(
    version: int, correlation_id: int, response: ZoneRouterResponse
) -> bytes:
    """Response header v1 and body (no size prefix)."""
    _check_version(version)
    parts = [_INT32.pack(correlation_id), _NO_TAGS]
    parts.append(_INT16.pack(response.error_code))
    parts.append(_INT32.pack(response.throttle_time_ms))
    parts.append(encode_array_length(len(response.responses), True))
    for data in response.responses:
        parts.append(_compact_bytes(data))
        parts.append(_NO_TAGS)
    parts.append(_NO_TAGS)
    return b"".join(parts)


def decode_zone_router_response(
    frame: bytes | bytearray | memoryview, version: int
) -> tuple[int, ZoneRouterResponse]:
    """(correlation id, response) of a response frame (header v1 and body)."""
    _check_version(version)
    reader = Reader(as_byte_view(frame))
    correlation_id = reader.int32("correlation_id")
    reader.skip_tagged_fields("response header")
    error_code = reader.int16("error_code")
    throttle = reader.int32("throttle_time_ms")
    count = reader.array_length(True, "responses")
    responses = []
    for _ in range(count):
        data = reader.bytes_view(True, "data", nullable=False)
        assert data is not None
        responses.append(bytes(data))
        reader.skip_tagged_fields("Response")
    reader.skip_tagged_fields("AutomqZoneRouterResponse")
    reader.expect_end(f"AutomqZoneRouter v{version} response")
    return correlation_id, ZoneRouterResponse(error_code, tuple(responses), throttle)


# --------------------------------------------------------------- one entry's produce answer


def encode_produce_answer(topic: str, answer: ProducePartitionAnswer) -> bytes:
    """The produce response block of one routed entry: magic, version 11, the ProduceResponse
    body (one topic, one partition)."""
    whole = encode_produce_response(PRODUCE_ANSWER_VERSION, 0, [(topic, [answer])])
    body = whole[5:]  # without the response header v1 (correlation id, empty tagged fields)
    return bytes([PRODUCE_ANSWER_MAGIC]) + _INT16.pack(PRODUCE_ANSWER_VERSION) + body


def decode_produce_answer(data: bytes | bytearray | memoryview) -> ProducePartitionAnswer:
    """The (first) partition answer a produce response block holds."""
    view = as_byte_view(data)
    reader = Reader(view)
    if len(view) < 3 or view[0] != PRODUCE_ANSWER_MAGIC:
        raise MalformedRequestError(
            f"produce response block: magic {view[0] if len(view) else None}, "
            f"expected {PRODUCE_ANSWER_MAGIC}"
        )
    reader.position = 1
    version = reader.int16("produce response version")
    if not 3 <= version <= PRODUCE_MAX_VERSION:
        raise UnsupportedVersionError(f"produce response block v{version}")
    flexible = version >= PRODUCE_FIRST_FLEXIBLE_VERSION
    answers: list[ProducePartitionAnswer] = []
    for _ in range(reader.array_length(flexible, "responses")):
        reader.string(flexible, "topic name")
        for _ in range(reader.array_length(flexible, "partition_responses")):
            index = reader.int32("index")
            error_code = reader.int16("error_code")
            base_offset = reader.int64("base_offset")
            log_append_time = reader.int64("log_append_time_ms")
            log_start = reader.int64("log_start_offset") if version >= 5 else -1
            message = None
            if version >= 8:
                for _ in range(reader.array_length(flexible, "record_errors")):
                    reader.int32("batch_index")
                    reader.nullable_string(flexible, "batch_index_error_message")
                    if flexible:
                        reader.skip_tagged_fields("record_errors")
                message = reader.nullable_string(flexible, "error_message")
            if flexible:
                reader.skip_tagged_fields("partition_responses")
            answers.append(
                ProducePartitionAnswer(
                    index, error_code, base_offset, log_append_time, log_start, message
                )
            )
        if flexible:
            reader.skip_tagged_fields("responses")
    reader.int32("throttle_time_ms")
    if flexible:
        reader.skip_tagged_fields("ProduceResponse")
    reader.expect_end(f"produce response block v{version}")
    if not answers:
        raise MalformedRequestError("produce response block: no partition answer")
    return answers[0]


# ------------------------------------------------------------- a routed Produce request


def encode_produce_request_body(
    version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, bytes | memoryview | None]]]],
) -> bytes:
    """A Produce request body (no header) of ``version`` (3-12): what the broker's Produce
    decoder reads back."""
    if not PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION:
        raise UnsupportedVersionError(f"Produce v{version} is not supported")
    flexible = version >= PRODUCE_FIRST_FLEXIBLE_VERSION
    parts: list[bytes] = []
    if transactional_id is None:
        parts.append(b"\x00" if flexible else b"\xff\xff")
    else:
        parts.append(encode_string(transactional_id, flexible))
    parts.append(_INT16.pack(acks))
    parts.append(_INT32.pack(timeout_ms))
    parts.append(encode_array_length(len(topics), flexible))
    for name, partitions in topics:
        parts.append(encode_string(name, flexible))
        parts.append(encode_array_length(len(partitions), flexible))
        for index, records in partitions:
            parts.append(_INT32.pack(index))
            if records is None:
                parts.append(b"\x00" if flexible else _INT32.pack(-1))
            elif flexible:
                parts.append(_compact_bytes(records))
            else:
                parts.append(_INT32.pack(len(records)) + bytes(records))
            if flexible:
                parts.append(_NO_TAGS)
        if flexible:
            parts.append(_NO_TAGS)
    if flexible:
        parts.append(_NO_TAGS)
    return b"".join(parts)
