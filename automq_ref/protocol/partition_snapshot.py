"""AutomqGetPartitionSnapshot (API key 516, versions 0-2): a proxy's incremental subscription to
the partitions its main leads (snapshot reads, the zone router's reads in the client's zone).

kio does not know AutoMQ's own APIs, so both messages are coded here by hand with the project's
primitives. Every version is flexible (compact strings and arrays, tagged fields after each
struct; unknown tagged fields are skipped on decode, none are written). The request header is
v2 (client id, then tagged fields), the response header v1 (tagged fields after the correlation
id).

Request: ``session_id`` i32, ``session_epoch`` i32; from v1 ``request_commit`` bool (ask the main
to upload its WAL so the proxy can read committed objects) and ``version`` i16 (the route
request version).

Response: ``error_code`` i16, ``throttle_time_ms`` i32, ``session_id`` i32, ``session_epoch`` i32
(the epoch the next request must carry), the topics (by id) with one :class:`PartitionSnapshot`
per changed partition (``operation`` ADD 0, PATCH 1, REMOVE 2; the leader epoch, the log
metadata: segments and the stream map, the first unstable offset, the log end offset, the
streams' end offsets, from v1 the last time-index entry); from v1 ``confirm_wal_end_offset``
(bytes: an encoded WAL record offset) and ``confirm_wal_config`` (the main's WAL, set in a
session's first answer), from v2 ``confirm_wal_delta_data`` (nullable bytes: the encoded stream
record batches the main's WAL made durable since the previous answer; null: read the WAL).

Transactions (this implementation's tagged fields, in every version; AutoMQ's proxies read a
partition's transaction index from its own stream, which this broker does not keep). A
partition's ``first_unstable_offset`` is its last stable offset at ``log_end_offset``. Tags of a
:class:`PartitionSnapshot`: 0, ``aborted`` (the entries of its aborted-transactions index whose
last offset, the ABORT marker's, lies in the range this answer adds to what the session
described: ``(producer id i64, first offset i64, last offset i64)`` each), written when there
is one; 1, ``aborted_below`` (i64, in an ADD: one past the last offset of the newest index entry
that ends below ``log_end_offset``, 0 for none). Tag 0 of the request, ``aborted_queries``
(``topic id, partition i32, start i64, upper i64, end i64`` each: the index entries with last
offset in ``[start, end)`` and first offset below ``upper``), is answered at once in tag 0 of
the response, ``aborted_answers`` (per query, in order: topic id, partition, error code i16,
the entries); a request with session id :data:`QUERY_SESSION_ID` asks only that, touching no
session.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
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

API_KEY: Final = 516
MIN_VERSION: Final = 0
MAX_VERSION: Final = 2
ROUTE_REQUEST_VERSION: Final = 1  # the request's Version field (AutoMQ's route request version)
QUERY_SESSION_ID: Final = -1  # a request that only asks its aborted_queries

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_NO_TAGS: Final = b"\x00"


class SnapshotOperation(enum.IntEnum):
    ADD = 0
    PATCH = 1
    REMOVE = 2


@dataclass(frozen=True, slots=True)
class AbortedRange:
    """One entry of a partition's aborted-transactions index."""

    producer_id: int
    first_offset: int
    last_offset: int  # the offset of the transaction's ABORT marker


@dataclass(frozen=True, slots=True)
class AbortedQuery:
    """The index entries of one partition with last offset in ``[start_offset, end_offset)``
    and first offset below ``upper_offset``."""

    topic_id: uuid.UUID
    partition_index: int
    start_offset: int
    upper_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class AbortedAnswer:
    """The answer to one :class:`AbortedQuery` (``error_code`` 0, or the partition is not led
    by the answering broker: ``NOT_LEADER_OR_FOLLOWER``)."""

    topic_id: uuid.UUID
    partition_index: int
    error_code: int
    aborted: tuple[AbortedRange, ...] = ()


@dataclass(frozen=True, slots=True)
class GetPartitionSnapshotRequest:
    session_id: int = 0
    session_epoch: int = 0
    request_commit: bool = False
    version: int = ROUTE_REQUEST_VERSION
    aborted_queries: tuple[AbortedQuery, ...] = ()  # tag 0


@dataclass(frozen=True, slots=True)
class SliceRange:
    start: int = -1
    end: int = -1


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int = -1
    offset: int = -1


@dataclass(frozen=True, slots=True)
class SegmentMetadata:
    base_offset: int
    create_timestamp: int = 0
    last_modified_timestamp: int = 0
    stream_suffix: str = ""
    log_size: int = 0
    log: SliceRange = SliceRange()
    time: SliceRange = SliceRange()
    transaction: SliceRange = SliceRange()
    first_batch_timestamp: int = -1
    time_index_last_entry: TimestampOffset = TimestampOffset()


@dataclass(frozen=True, slots=True)
class LogMetadata:
    segments: tuple[SegmentMetadata, ...] = ()
    stream_map: tuple[tuple[str, int], ...] = ()  # (stream name, stream id)


@dataclass(frozen=True, slots=True)
class LogOffset:
    message_offset: int
    relative_position_in_segment: int = 0


@dataclass(frozen=True, slots=True)
class StreamEnd:
    stream_id: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    partition_index: int
    leader_epoch: int
    operation: SnapshotOperation
    log_metadata: LogMetadata | None = None
    first_unstable_offset: LogOffset | None = None
    log_end_offset: LogOffset | None = None
    stream_metadata: tuple[StreamEnd, ...] | None = None
    last_timestamp_offset: TimestampOffset | None = None  # v1+
    aborted: tuple[AbortedRange, ...] = ()  # tag 0
    aborted_below: int | None = None  # tag 1


@dataclass(frozen=True, slots=True)
class TopicSnapshot:
    topic_id: uuid.UUID
    partitions: tuple[PartitionSnapshot, ...]


@dataclass(frozen=True, slots=True)
class GetPartitionSnapshotResponse:
    error_code: int = 0
    throttle_time_ms: int = 0
    session_id: int = 0
    session_epoch: int = 0
    topics: tuple[TopicSnapshot, ...] = ()
    confirm_wal_end_offset: bytes = b""  # v1+
    confirm_wal_config: str = ""  # v1+
    confirm_wal_delta_data: bytes | None = field(default=None)  # v2+
    aborted_answers: tuple[AbortedAnswer, ...] = ()  # tag 0


# ================================================================================= encoding


def _check_version(version: int) -> None:
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise UnsupportedVersionError(
            f"AutomqGetPartitionSnapshot v{version}: this broker speaks v{MIN_VERSION}-"
            f"v{MAX_VERSION}"
        )


def _bytes(value: bytes | None) -> bytes:
    if value is None:
        return b"\x00"
    return encode_uvarint(len(value) + 1) + value


def encode_request(request: GetPartitionSnapshotRequest, version: int) -> bytes:
    """The request body (no header)."""
    _check_version(version)
    out = [_I32.pack(request.session_id), _I32.pack(request.session_epoch)]
    if version >= 1:
        out.append(_I8.pack(1 if request.request_commit else 0))
        out.append(_I16.pack(request.version))
    queries = request.aborted_queries
    out.append(_tags({0: _aborted_queries(queries)} if queries else {}))
    return b"".join(out)


def encode_request_frame(
    request: GetPartitionSnapshotRequest, version: int, correlation_id: int, client_id: str
) -> bytes:
    """Header v2 and body, without the frame's size prefix."""
    header = (
        _I16.pack(API_KEY)
        + _I16.pack(version)
        + _I32.pack(correlation_id)
        + encode_string(client_id, flexible=False)
        + _NO_TAGS
    )
    return header + encode_request(request, version)


def _tags(fields: dict[int, bytes]) -> bytes:
    """A tagged-field section holding ``fields`` (tag -> encoded value), in tag order."""
    out = [encode_uvarint(len(fields))]
    for tag in sorted(fields):
        out.append(encode_uvarint(tag) + encode_uvarint(len(fields[tag])) + fields[tag])
    return b"".join(out)


def _aborted_ranges(ranges: tuple[AbortedRange, ...]) -> bytes:
    out = [encode_array_length(len(ranges), flexible=True)]
    for entry in ranges:
        out.append(
            _I64.pack(entry.producer_id)
            + _I64.pack(entry.first_offset)
            + _I64.pack(entry.last_offset)
            + _NO_TAGS
        )
    return b"".join(out)


def _aborted_queries(queries: tuple[AbortedQuery, ...]) -> bytes:
    out = [encode_array_length(len(queries), flexible=True)]
    for query in queries:
        out.append(
            query.topic_id.bytes
            + _I32.pack(query.partition_index)
            + _I64.pack(query.start_offset)
            + _I64.pack(query.upper_offset)
            + _I64.pack(query.end_offset)
            + _NO_TAGS
        )
    return b"".join(out)


def _aborted_answers(answers: tuple[AbortedAnswer, ...]) -> bytes:
    out = [encode_array_length(len(answers), flexible=True)]
    for answer in answers:
        out.append(
            answer.topic_id.bytes
            + _I32.pack(answer.partition_index)
            + _I16.pack(answer.error_code)
            + _aborted_ranges(answer.aborted)
            + _NO_TAGS
        )
    return b"".join(out)


def _slice(value: SliceRange) -> bytes:
    return _I64.pack(value.start) + _I64.pack(value.end) + _NO_TAGS


def _timestamp_offset(value: TimestampOffset) -> bytes:
    return _I64.pack(value.timestamp) + _I64.pack(value.offset) + _NO_TAGS


def _segment(segment: SegmentMetadata) -> bytes:
    return b"".join(
        (
            _I64.pack(segment.base_offset),
            _I64.pack(segment.create_timestamp),
            _I64.pack(segment.last_modified_timestamp),
            encode_string(segment.stream_suffix, flexible=True),
            _I32.pack(segment.log_size),
            _slice(segment.log),
            _slice(segment.time),
            _slice(segment.transaction),
            _I64.pack(segment.first_batch_timestamp),
            _timestamp_offset(segment.time_index_last_entry),
            _NO_TAGS,
        )
    )


def _log_metadata(value: LogMetadata) -> bytes:
    out = [encode_array_length(len(value.segments), flexible=True)]
    out.extend(_segment(segment) for segment in value.segments)
    out.append(encode_array_length(len(value.stream_map), flexible=True))
    for name, stream_id in value.stream_map:
        out.append(encode_string(name, flexible=True) + _I64.pack(stream_id) + _NO_TAGS)
    out.append(_NO_TAGS)
    return b"".join(out)


def _log_offset(value: LogOffset) -> bytes:
    return (
        _I64.pack(value.message_offset) + _I32.pack(value.relative_position_in_segment) + _NO_TAGS
    )


def _nullable(encoded: bytes | None) -> bytes:
    return b"\xff" if encoded is None else b"\x01" + encoded


def _partition(partition: PartitionSnapshot, version: int) -> bytes:
    out = [
        _I32.pack(partition.partition_index),
        _I32.pack(partition.leader_epoch),
        _I16.pack(int(partition.operation)),
        _nullable(
            None if partition.log_metadata is None else _log_metadata(partition.log_metadata)
        ),
        _nullable(
            None
            if partition.first_unstable_offset is None
            else _log_offset(partition.first_unstable_offset)
        ),
        _nullable(
            None if partition.log_end_offset is None else _log_offset(partition.log_end_offset)
        ),
    ]
    streams = partition.stream_metadata
    out.append(encode_array_length(None if streams is None else len(streams), flexible=True))
    for stream in streams or ():
        out.append(_I64.pack(stream.stream_id) + _I64.pack(stream.end_offset) + _NO_TAGS)
    if version >= 1:
        last = partition.last_timestamp_offset
        out.append(_nullable(None if last is None else _timestamp_offset(last)))
    tags = {}
    if partition.aborted:
        tags[0] = _aborted_ranges(partition.aborted)
    if partition.aborted_below is not None:
        tags[1] = _I64.pack(partition.aborted_below)
    out.append(_tags(tags))
    return b"".join(out)


def encode_response(response: GetPartitionSnapshotResponse, version: int) -> bytes:
    """The response body (no header)."""
    _check_version(version)
    out = [
        _I16.pack(response.error_code),
        _I32.pack(response.throttle_time_ms),
        _I32.pack(response.session_id),
        _I32.pack(response.session_epoch),
        encode_array_length(len(response.topics), flexible=True),
    ]
    for topic in response.topics:
        out.append(topic.topic_id.bytes)
        out.append(encode_array_length(len(topic.partitions), flexible=True))
        out.extend(_partition(partition, version) for partition in topic.partitions)
        out.append(_NO_TAGS)
    if version >= 1:
        out.append(_bytes(response.confirm_wal_end_offset))
        out.append(encode_string(response.confirm_wal_config, flexible=True))
    if version >= 2:
        out.append(_bytes(response.confirm_wal_delta_data))
    answers = response.aborted_answers
    out.append(_tags({0: _aborted_answers(answers)} if answers else {}))
    return b"".join(out)


def encode_response_frame(
    response: GetPartitionSnapshotResponse, version: int, correlation_id: int
) -> bytes:
    """Header v1 and body, without the frame's size prefix."""
    return _I32.pack(correlation_id) + _NO_TAGS + encode_response(response, version)


# ================================================================================= decoding


def _skip_tags(reader: Reader, what: str) -> None:
    for _ in range(reader.uvarint(f"{what} tagged fields")):
        reader.uvarint(f"{what} tag")
        size = reader.uvarint(f"{what} tagged field size")
        reader._take(size, f"{what} tagged field")


def _read_tags(
    reader: Reader, what: str, known: dict[int, Callable[[Reader], object]]
) -> dict[int, object]:
    """A tagged-field section: the fields of ``known`` tags decoded (each must fill its size
    exactly), the others skipped."""
    found: dict[int, object] = {}
    for _ in range(reader.uvarint(f"{what} tagged fields")):
        tag = reader.uvarint(f"{what} tag")
        size = reader.uvarint(f"{what} tagged field size")
        start = reader._take(size, f"{what} tagged field")
        decode = known.get(tag)
        if decode is not None:
            inner = Reader(reader.view[start : start + size])
            found[tag] = decode(inner)
            _no_trailing(inner, f"{what} tag {tag}")
    return found


def _decode_aborted_ranges(reader: Reader) -> tuple[AbortedRange, ...]:
    ranges = []
    for _ in range(_count(reader, "Aborted") or 0):
        entry = AbortedRange(
            reader.int64("ProducerId"), reader.int64("FirstOffset"), reader.int64("LastOffset")
        )
        _skip_tags(reader, "AbortedRange")
        ranges.append(entry)
    return tuple(ranges)


def _decode_uuid(reader: Reader, what: str) -> uuid.UUID:
    start = reader._take(16, what)
    return uuid.UUID(bytes=bytes(reader.view[start : start + 16]))


def _decode_aborted_queries(reader: Reader) -> tuple[AbortedQuery, ...]:
    queries = []
    for _ in range(_count(reader, "AbortedQueries") or 0):
        query = AbortedQuery(
            _decode_uuid(reader, "TopicId"),
            reader.int32("PartitionIndex"),
            reader.int64("StartOffset"),
            reader.int64("UpperOffset"),
            reader.int64("EndOffset"),
        )
        _skip_tags(reader, "AbortedQuery")
        queries.append(query)
    return tuple(queries)


def _decode_aborted_answers(reader: Reader) -> tuple[AbortedAnswer, ...]:
    answers = []
    for _ in range(_count(reader, "AbortedAnswers") or 0):
        answer = AbortedAnswer(
            _decode_uuid(reader, "TopicId"),
            reader.int32("PartitionIndex"),
            reader.int16("ErrorCode"),
            _decode_aborted_ranges(reader),
        )
        _skip_tags(reader, "AbortedAnswer")
        answers.append(answer)
    return tuple(answers)


def _bool(reader: Reader, what: str) -> bool:
    value = reader.view[reader._take(1, what)]
    if value not in (0, 1):
        raise MalformedRequestError(f"{what}: a boolean byte must be 0 or 1, not {value}")
    return value == 1


def _count(reader: Reader, what: str, *, nullable: bool = False) -> int | None:
    count = reader.uvarint(what) - 1
    if count == -1:
        if not nullable:
            raise MalformedRequestError(f"{what}: null array")
        return None
    if count > reader.remaining():
        raise MalformedRequestError(f"{what}: {count} elements, {reader.remaining()} bytes left")
    return count


def _present(reader: Reader, what: str) -> bool:
    marker: int = _I8.unpack_from(reader.view, reader._take(1, what))[0]
    if marker not in (-1, 1):
        raise MalformedRequestError(f"{what}: a nullable struct marker must be -1 or 1")
    return marker == 1


def decode_request(
    body: bytes | bytearray | memoryview, version: int
) -> GetPartitionSnapshotRequest:
    """The request body (after its header)."""
    _check_version(version)
    reader = Reader(as_byte_view(body))
    session_id = reader.int32("SessionId")
    session_epoch = reader.int32("SessionEpoch")
    request_commit = False
    route_version = 0
    if version >= 1:
        request_commit = _bool(reader, "RequestCommit")
        route_version = reader.int16("Version")
    tags = _read_tags(reader, "request", {0: _decode_aborted_queries})
    _no_trailing(reader, "request")
    queries = tags.get(0, ())
    assert isinstance(queries, tuple)
    return GetPartitionSnapshotRequest(
        session_id, session_epoch, request_commit, route_version, queries
    )


def decode_request_frame(
    frame: bytes | bytearray | memoryview,
) -> tuple[int, int, str | None, GetPartitionSnapshotRequest]:
    """(version, correlation id, client id, request) of a frame without its size prefix."""
    reader = Reader(as_byte_view(frame))
    api_key = reader.int16("ApiKey")
    if api_key != API_KEY:
        raise MalformedRequestError(f"API key {api_key}, not {API_KEY}")
    version = reader.int16("ApiVersion")
    correlation_id = reader.int32("CorrelationId")
    client_id = reader.nullable_string(False, "ClientId")
    _skip_tags(reader, "request header")
    return (
        version,
        correlation_id,
        client_id,
        decode_request(reader.view[reader.position :], version),
    )


def _decode_slice(reader: Reader, what: str) -> SliceRange:
    value = SliceRange(reader.int64(f"{what}.start"), reader.int64(f"{what}.end"))
    _skip_tags(reader, what)
    return value


def _decode_timestamp_offset(reader: Reader, what: str) -> TimestampOffset:
    value = TimestampOffset(reader.int64(f"{what}.timestamp"), reader.int64(f"{what}.offset"))
    _skip_tags(reader, what)
    return value


def _decode_segment(reader: Reader) -> SegmentMetadata:
    segment = SegmentMetadata(
        base_offset=reader.int64("baseOffset"),
        create_timestamp=reader.int64("createTimestamp"),
        last_modified_timestamp=reader.int64("lastModifiedTimestamp"),
        stream_suffix=reader.string(True, "streamSuffix"),
        log_size=reader.int32("logSize"),
        log=_decode_slice(reader, "log"),
        time=_decode_slice(reader, "time"),
        transaction=_decode_slice(reader, "transaction"),
        first_batch_timestamp=reader.int64("firstBatchTimestamp"),
        time_index_last_entry=_decode_timestamp_offset(reader, "timeIndexLastEntry"),
    )
    _skip_tags(reader, "SegmentMetadata")
    return segment


def _decode_log_metadata(reader: Reader) -> LogMetadata:
    segments = tuple(_decode_segment(reader) for _ in range(_count(reader, "segments") or 0))
    stream_map = []
    for _ in range(_count(reader, "streamMap") or 0):
        name = reader.string(True, "streamMap.name")
        stream_id = reader.int64("streamMap.streamId")
        _skip_tags(reader, "StreamMapping")
        stream_map.append((name, stream_id))
    _skip_tags(reader, "LogMetadata")
    return LogMetadata(segments, tuple(stream_map))


def _decode_log_offset(reader: Reader, what: str) -> LogOffset:
    value = LogOffset(reader.int64(f"{what}.messageOffset"), reader.int32(f"{what}.relative"))
    _skip_tags(reader, what)
    return value


def _decode_partition(reader: Reader, version: int) -> PartitionSnapshot:
    index = reader.int32("PartitionIndex")
    leader_epoch = reader.int32("LeaderEpoch")
    raw_operation = reader.int16("Operation")
    try:
        operation = SnapshotOperation(raw_operation)
    except ValueError:
        raise MalformedRequestError(f"Operation: unknown {raw_operation}") from None
    log_metadata = _decode_log_metadata(reader) if _present(reader, "LogMetadata") else None
    unstable = (
        _decode_log_offset(reader, "FirstUnstableOffset")
        if _present(reader, "FirstUnstableOffset")
        else None
    )
    end = _decode_log_offset(reader, "LogEndOffset") if _present(reader, "LogEndOffset") else None
    count = _count(reader, "StreamMetadata", nullable=True)
    streams: tuple[StreamEnd, ...] | None = None
    if count is not None:
        found = []
        for _ in range(count):
            stream = StreamEnd(reader.int64("StreamId"), reader.int64("EndOffset"))
            _skip_tags(reader, "StreamMetadata")
            found.append(stream)
        streams = tuple(found)
    last = None
    if version >= 1 and _present(reader, "LastTimestampOffset"):
        last = _decode_timestamp_offset(reader, "LastTimestampOffset")
    tags = _read_tags(
        reader,
        "PartitionSnapshot",
        {0: _decode_aborted_ranges, 1: lambda inner: inner.int64("AbortedBelow")},
    )
    aborted = tags.get(0, ())
    below = tags.get(1)
    assert isinstance(aborted, tuple) and (below is None or isinstance(below, int))
    return PartitionSnapshot(
        index, leader_epoch, operation, log_metadata, unstable, end, streams, last, aborted, below
    )


def _decode_bytes(reader: Reader, what: str, *, nullable: bool) -> bytes | None:
    view = reader.bytes_view(True, what, nullable=nullable)
    return None if view is None else bytes(view)


def decode_response(
    body: bytes | bytearray | memoryview, version: int
) -> GetPartitionSnapshotResponse:
    """The response body (after its header)."""
    _check_version(version)
    reader = Reader(as_byte_view(body))
    error_code = reader.int16("ErrorCode")
    throttle = reader.int32("ThrottleTimeMs")
    session_id = reader.int32("SessionId")
    session_epoch = reader.int32("SessionEpoch")
    topics = []
    for _ in range(_count(reader, "Topics") or 0):
        topic_id = _decode_uuid(reader, "TopicId")
        partitions = tuple(
            _decode_partition(reader, version) for _ in range(_count(reader, "Partitions") or 0)
        )
        _skip_tags(reader, "Topic")
        topics.append(TopicSnapshot(topic_id, partitions))
    end_offset, config, delta = b"", "", None
    if version >= 1:
        end_offset = _decode_bytes(reader, "ConfirmWalEndOffset", nullable=False) or b""
        config = reader.string(True, "ConfirmWalConfig")
    if version >= 2:
        delta = _decode_bytes(reader, "ConfirmWalDeltaData", nullable=True)
    tags = _read_tags(reader, "response", {0: _decode_aborted_answers})
    _no_trailing(reader, "response")
    answers = tags.get(0, ())
    assert isinstance(answers, tuple)
    return GetPartitionSnapshotResponse(
        error_code,
        throttle,
        session_id,
        session_epoch,
        tuple(topics),
        end_offset,
        config,
        delta,
        answers,
    )


def decode_response_frame(
    frame: bytes | bytearray | memoryview, version: int
) -> tuple[int, GetPartitionSnapshotResponse]:
    """(correlation id, response) of a response frame without its size prefix."""
    reader = Reader(as_byte_view(frame))
    correlation_id = reader.int32("CorrelationId")
    _skip_tags(reader, "response header")
    return correlation_id, decode_response(reader.view[reader.position :], version)


def _no_trailing(reader: Reader, what: str) -> None:
    if reader.remaining():
        raise MalformedRequestError(f"{what}: {reader.remaining()} bytes after the last field")
