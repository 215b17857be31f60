"""Produce request decoder (API key 0, versions 3 through 12) and the request header before it.

Every version in that range has the same fields: ``transactional_id`` (nullable string), ``acks``
(int16), ``timeout_ms`` (int32) and ``topic_data``, a list of topics (``name``) each with a list of
``partition_data`` (``index`` int32, ``records``). Versions 9 and up are flexible: compact strings,
arrays and records, a tagged-field section after each structure, and request header v2. Version
12 only changed what the broker may answer (KIP-890), so its bytes are those of version 11;
version 13 names topics by id and is not implemented.

Each partition's ``records`` is a ``memoryview`` slice of the frame passed in: the record batches
are not copied, so the frame must stay alive and unchanged while they are in use. Tagged fields
are skipped whatever their tag (none is defined for these structures up to version 12).
A frame that does not match the schema raises a :class:`MalformedRequestError` subclass naming the
field, and bytes left over after the message are refused too.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from automq_ref.protocol.primitives import (
    MalformedRequestError,
    Reader,
    UnsupportedVersionError,
    as_byte_view,
)

PRODUCE_API_KEY: Final = 0
PRODUCE_MIN_VERSION: Final = 3
PRODUCE_MAX_VERSION: Final = 12
PRODUCE_FIRST_FLEXIBLE_VERSION: Final = 9

_INDEX: Final = struct.Struct(">i")
_INDEX_AND_LENGTH: Final = struct.Struct(">ii")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (non-flexible APIs) or v2 (flexible: adds a tagged-field section).

    ``client_id`` is a legacy nullable string in both versions.
    """

    request_api_key: int
    request_api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None
    """The partition's record batches, a slice of the request frame; None if sent as null."""


@dataclass(frozen=True, slots=True)
class TopicProduceData:
    name: str
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]


def decode_request_header(
    frame: bytes | bytearray | memoryview, *, flexible: bool
) -> tuple[RequestHeader, int]:
    """Read a request header (v2 if ``flexible`` else v1) at the start of ``frame`` (the bytes
    after the 4-byte size prefix); return it and the offset where the request body starts.

    Tagged fields in a v2 header are skipped, whatever their tags.
    """
    reader = Reader(as_byte_view(frame))
    api_key = reader.int16("request_api_key")
    api_version = reader.int16("request_api_version")
    correlation_id = reader.int32("correlation_id")
    client_id = reader.nullable_string(False, "client_id")
    if flexible:
        reader.skip_tagged_fields("request header")
    return RequestHeader(api_key, api_version, correlation_id, client_id), reader.position


def decode_produce_request(
    frame: bytes | bytearray | memoryview, version: int, offset: int = 0
) -> ProduceRequest:
    """Decode the body of a Produce request of ``version`` that starts at ``offset`` of ``frame``
    and runs to its end. Records are memoryview slices of ``frame``."""
    if not PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION:
        raise UnsupportedVersionError(
            f"Produce v{version} is not supported "
            f"(v{PRODUCE_MIN_VERSION}..v{PRODUCE_MAX_VERSION} are)"
        )
    flexible = version >= PRODUCE_FIRST_FLEXIBLE_VERSION
    reader = Reader(as_byte_view(frame), offset)
    transactional_id = reader.nullable_string(flexible, "transactional_id")
    acks = reader.int16("acks")
    timeout_ms = reader.int32("timeout_ms")
    topic_count = reader.array_length(flexible, "topic_data")
    topics = []
    for _ in range(topic_count):
        name = reader.string(flexible, "topic name")
        partition_count = reader.array_length(flexible, "partition_data")
        if flexible:
            partitions = _read_flexible_partitions(reader, partition_count)
            reader.skip_tagged_fields("topic_data")
        else:
            partitions = _read_legacy_partitions(reader, partition_count)
        topics.append(TopicProduceData(name, partitions))
    if flexible:
        reader.skip_tagged_fields("ProduceRequest")
    reader.expect_end(f"Produce v{version} request")
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))


# The partition loops run once per partition of every Produce request, so the common case is read
# with local variables; anything unusual (a varint of more than three bytes, tagged fields, bad
# bytes) goes through the Reader, which names the field in its errors. PartitionProduceData is
# built by setting its two slots directly: the frozen dataclass __init__ (object.__setattr__ per
# field) costs more than the rest of the loop.
_new_object = object.__new__
_set_index: Callable[[object, int], None] = vars(PartitionProduceData)["index"].__set__
_set_records: Callable[[object, memoryview | None], None] = vars(PartitionProduceData)[
    "records"
].__set__
assert [field.name for field in dataclasses.fields(PartitionProduceData)] == ["index", "records"]


def _read_legacy_partitions(reader: Reader, count: int) -> tuple[PartitionProduceData, ...]:
    view, position, end = reader.view, reader.position, reader.end
    unpack_from = _INDEX_AND_LENGTH.unpack_from
    partitions = []
    for _ in range(count):
        if end - position < 8:  # the Reader raises, naming the field that is cut short
            reader.position = position
            reader.int32("partition index")
            reader.int32("records")
        index, length = unpack_from(view, position)
        position += 8
        if 0 <= length <= end - position:
            records: memoryview | None = view[position : position + length]
            position += length
        else:
            reader.position = position - 4
            records = reader.bytes_view(False, "records", nullable=True)
            position = reader.position
        partition = _new_object(PartitionProduceData)
        _set_index(partition, index)
        _set_records(partition, records)
        partitions.append(partition)
    reader.position = position
    return tuple(partitions)


class _Unusual(Exception):
    """The fast path met something it leaves to the field-by-field Reader."""


def _read_flexible_partitions(reader: Reader, count: int) -> tuple[PartitionProduceData, ...]:
    view, position, end = reader.view, reader.position, reader.end
    unpack_from = _INDEX.unpack_from
    partitions = []
    for _ in range(count):
        try:  # index, compact records, an empty tagged-field section
            index = unpack_from(view, position)[0]
            size = view[position + 4]
            cursor = position + 5
            if size >= 0x80:  # a varint of two or three bytes (lengths below 2 MiB)
                byte = view[cursor]
                cursor += 1
                size = (size & 0x7F) | ((byte & 0x7F) << 7)
                if byte >= 0x80:
                    byte = view[cursor]
                    cursor += 1
                    if byte >= 0x80:
                        raise _Unusual
                    size |= byte << 14
            if size == 0:
                records: memoryview | None = None
            else:
                stop = cursor + size - 1
                if stop >= end:
                    raise _Unusual
                records = view[cursor:stop]
                cursor = stop
            if view[cursor] != 0:
                raise _Unusual
            position = cursor + 1
        except (IndexError, struct.error, _Unusual):
            reader.position = position
            index = reader.int32("partition index")
            records = reader.bytes_view(True, "records", nullable=True)
            reader.skip_tagged_fields("partition_data")
            position = reader.position
        partition = _new_object(PartitionProduceData)
        _set_index(partition, index)
        _set_records(partition, records)
        partitions.append(partition)
    reader.position = position
    return tuple(partitions)


def decode_produce_frame(
    frame: bytes | bytearray | memoryview,
) -> tuple[RequestHeader, ProduceRequest]:
    """Decode a whole Produce request frame (header and body, without the size prefix)."""
    view = as_byte_view(frame)
    if len(view) < 4:
        raise MalformedRequestError(f"request frame of {len(view)} bytes has no api key/version")
    api_key = int.from_bytes(view[0:2], "big", signed=True)
    version = int.from_bytes(view[2:4], "big", signed=True)
    if api_key != PRODUCE_API_KEY:
        raise MalformedRequestError(f"api key {api_key} is not Produce ({PRODUCE_API_KEY})")
    if not PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION:
        raise UnsupportedVersionError(f"Produce v{version} is not supported")
    header, body_offset = decode_request_header(
        view, flexible=version >= PRODUCE_FIRST_FLEXIBLE_VERSION
    )
    return header, decode_produce_request(view, version, body_offset)
