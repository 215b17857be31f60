"""Stream metadata: the controller's machine for streams, ranges, objects, nodes and the KV store.

Spec: specs/StreamMetadata.tla. Properties: tests/properties/test_stream_metadata.py.

Theory of operation
-------------------
A *stream* is an append-only sequence of offsets (a Kafka partition is a few of them). The
controller decides who may write each stream and which objects hold which offsets; the data
itself never passes through it. Every request is handled in two halves:

1. a handler reads the current image and decides: it either rejects the request with an error
   code (AutoMQ's names: ``STREAM_FENCED``, ``OFFSET_NOT_MATCHED``, ...) and produces no records,
   or accepts it and produces *metadata records* (AutoMQ's record types: ``S3StreamRecord``,
   ``RangeRecord``, ``S3ObjectRecord``, ...);
2. the records are appended to the metadata log and *replayed* into the image.

The image is nothing but the replay of the log, so any broker that replays the same log has the
same image and answers lookups (``get_objects``) locally. Replay of offsets uses max semantics,
as AutoMQ's does: a stream's end offset is the maximum of every fact that mentions it, its start
offset only grows, so replaying records in another order cannot move an offset backwards.

Fencing. Each stream has an *epoch* (the partition leader epoch of its opener) and a list of
*ranges*: ``[start, end)`` intervals each owned by one node at one epoch. Opening a stream with a
higher epoch seals the current range at the stream's end offset and starts a new one at that
offset, owned by the opener; it is refused while the stream is OPENED (``STREAM_NOT_CLOSED``), so
the new owner waits for the old one to close. A commit must come from the owner of the current
range (and, when it says, at the current epoch), and must start exactly at the stream's end offset;
so data an old owner uploads after losing the stream is never made visible. Nodes have epochs too
(their start time): a request from an older incarnation gets ``NODE_EPOCH_EXPIRED``, and a node
taken over by failover gets ``NODE_FENCED``.

Objects. ``PrepareObject`` hands out ids (PREPARED, with a deadline); a commit turns them
COMMITTED; a prepared object whose deadline passes is MARK_DESTROYED by ``ExpireObject`` and can
never be committed any more; compaction marks its inputs MARK_DESTROYED; ``RemoveObject`` forgets
a destroyed object once the shell has deleted it and the retention has passed. Committing an
object that is already COMMITTED is ``REDUNDANT_OPERATION``, answered as success: a retried commit
is idempotent.

Not modelled (yet): fast close and historical WAL responsibilities (``NodeWALUncommittedOffsets``),
"huge cluster" mode (ranges read from object indexes), locked nodes, object attributes beyond a
plain integer.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.vocabulary.metadata_records import (
    AssignedS3ObjectIdRecord,
    AssignedStreamIdRecord,
    KVRecord,
    MetadataRecord,
    NodeWALMetadataRecord,
    RangeRecord,
    RemoveKVRecord,
    RemoveRangeRecord,
    RemoveS3ObjectRecord,
    RemoveS3StreamObjectRecord,
    RemoveS3StreamRecord,
    RemoveStreamSetObjectRecord,
    S3ObjectRecord,
    S3ObjectState,
    S3StreamEndOffsetsRecord,
    S3StreamObjectRecord,
    S3StreamRecord,
    S3StreamSetObjectRecord,
    StreamOffsetRange,
    StreamState,
)

# The record types are the vocabulary's; they are re-exported for the machine's callers.
__all__ = [
    "ANY_STREAM_EPOCH",
    "DEFAULT_PARAMS",
    "EMPTY_IMAGE",
    "INVARIANTS",
    "NO_EPOCH",
    "NO_OBJECT",
    "AssignedS3ObjectIdRecord",
    "AssignedStreamIdRecord",
    "CloseStream",
    "CommitRange",
    "CommitStreamObject",
    "CommitStreamObjectEntry",
    "CommitStreamSetObject",
    "CreateStream",
    "DeleteKV",
    "DeleteStream",
    "ExpireObject",
    "FenceNode",
    "InvariantViolation",
    "KVRecord",
    "MetadataRecord",
    "NodeMetadata",
    "NodeWALMetadataRecord",
    "ObjectSlice",
    "OpenStream",
    "OpeningStream",
    "PrepareObject",
    "PutKV",
    "RangeRecord",
    "RegisterNode",
    "RemoveKVRecord",
    "RemoveObject",
    "RemoveRangeRecord",
    "RemoveS3ObjectRecord",
    "RemoveS3StreamObjectRecord",
    "RemoveS3StreamRecord",
    "RemoveStreamSetObjectRecord",
    "Response",
    "S3Object",
    "S3ObjectRecord",
    "S3ObjectState",
    "S3StreamEndOffsetsRecord",
    "S3StreamObjectRecord",
    "S3StreamRecord",
    "S3StreamSetObjectRecord",
    "StreamErrorCode",
    "StreamMetadata",
    "StreamMetadataEvent",
    "StreamMetadataImage",
    "StreamMetadataParams",
    "StreamOffsetRange",
    "StreamRange",
    "StreamSetObject",
    "StreamState",
    "Transition",
    "TrimStream",
    "check_invariants",
    "expired_objects",
    "get_objects",
    "image_records",
    "inv_no_fenced_commit_visible",
    "inv_nothing_referenced_is_destroyed",
    "inv_objects_cover_stream",
    "inv_ranges_contiguous",
    "inv_single_writer",
    "opening_streams",
    "removable_objects",
    "replay",
    "replay_all",
    "step",
    "stream_object_slices",
    "tla_action",
    "tla_node",
    "tla_state",
]

NO_OBJECT: Final = -1
NO_EPOCH: Final = -1
ANY_STREAM_EPOCH: Final = -1  # a commit range that does not claim an epoch (AutoMQ sends -1)


class StreamErrorCode(enum.Enum):
    """Outcomes of controller requests, with AutoMQ's names."""

    NONE = "NONE"
    STREAM_NOT_EXIST = "STREAM_NOT_EXIST"
    STREAM_FENCED = "STREAM_FENCED"
    STREAM_NOT_OPENED = "STREAM_NOT_OPENED"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAM_INNER_ERROR = "STREAM_INNER_ERROR"
    OFFSET_NOT_MATCHED = "OFFSET_NOT_MATCHED"
    REDUNDANT_OPERATION = "REDUNDANT_OPERATION"
    OBJECT_NOT_EXIST = "OBJECT_NOT_EXIST"
    OBJECT_NOT_COMMITTED = "OBJECT_NOT_COMMITTED"
    COMPACTED_OBJECTS_NOT_FOUND = "COMPACTED_OBJECTS_NOT_FOUND"
    NODE_EPOCH_NOT_EXIST = "NODE_EPOCH_NOT_EXIST"
    NODE_EPOCH_EXPIRED = "NODE_EPOCH_EXPIRED"
    NODE_FENCED = "NODE_FENCED"
    KEY_EXIST = "KEY_EXIST"
    INVALID_REQUEST = "INVALID_REQUEST"


# ======================================================================================= image


@dataclass(frozen=True, slots=True)
class StreamRange:
    epoch: int
    start_offset: int
    end_offset: int  # for the current range, the stream's end offset is authoritative
    node_id: int


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    stream_id: int
    epoch: int = NO_EPOCH
    range_index: int = -1
    start_offset: int = 0
    end_offset: int = 0
    state: StreamState = StreamState.CLOSED
    ranges: Mapping[int, StreamRange] = field(default_factory=dict)
    stream_objects: Mapping[int, StreamOffsetRange] = field(default_factory=dict)

    @property
    def current_range(self) -> StreamRange | None:
        return self.ranges.get(self.range_index)

    def range_end(self, range_index: int) -> int:
        """A range's end; the current range ends wherever the stream ends."""
        if range_index == self.range_index:
            return self.end_offset
        return self.ranges[range_index].end_offset


@dataclass(frozen=True, slots=True)
class StreamSetObject:
    object_id: int
    node_id: int
    order_id: int
    ranges: tuple[StreamOffsetRange, ...]
    data_time_ms: int


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    node_id: int
    node_epoch: int
    failover_mode: bool = False
    stream_set_objects: Mapping[int, StreamSetObject] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class S3Object:
    object_id: int
    object_size: int
    state: S3ObjectState
    timestamp_ms: int
    attributes: int = 0


@dataclass(frozen=True, slots=True)
class StreamMetadataImage:
    """The replay of the metadata log. Its maps are never mutated: replay builds new ones."""

    streams: Mapping[int, StreamMetadata] = field(default_factory=dict)
    nodes: Mapping[int, NodeMetadata] = field(default_factory=dict)
    objects: Mapping[int, S3Object] = field(default_factory=dict)
    kv: Mapping[str, bytes] = field(default_factory=dict)
    next_stream_id: int = 0
    next_object_id: int = 0


EMPTY_IMAGE: Final = StreamMetadataImage()


def replay(image: StreamMetadataImage, record: MetadataRecord) -> StreamMetadataImage:
    """Apply one record. Offsets use max semantics, so replay order cannot move them back."""
    stream: StreamMetadata | None
    node: NodeMetadata | None
    match record:
        case S3StreamRecord():
            stream = image.streams.get(record.stream_id) or StreamMetadata(record.stream_id)
            start = max(stream.start_offset, record.start_offset)
            stream = replace(
                stream,
                epoch=record.epoch,
                range_index=record.range_index,
                start_offset=start,
                end_offset=max(stream.end_offset, start),
                state=record.state,
            )
            return replace(image, streams={**image.streams, record.stream_id: stream})
        case RemoveS3StreamRecord():
            streams = dict(image.streams)
            streams.pop(record.stream_id, None)
            return replace(image, streams=streams)
        case RangeRecord():
            stream = image.streams.get(record.stream_id)
            if stream is None:
                return image
            ranges = dict(stream.ranges)
            ranges[record.range_index] = StreamRange(
                record.epoch, record.start_offset, record.end_offset, record.node_id
            )
            stream = replace(
                stream, ranges=ranges, end_offset=max(stream.end_offset, record.end_offset)
            )
            return replace(image, streams={**image.streams, record.stream_id: stream})
        case RemoveRangeRecord():
            stream = image.streams.get(record.stream_id)
            if stream is None:
                return image
            ranges = dict(stream.ranges)
            ranges.pop(record.range_index, None)
            return replace(
                image, streams={**image.streams, record.stream_id: replace(stream, ranges=ranges)}
            )
        case S3StreamObjectRecord():
            stream = image.streams.get(record.stream_id)
            if stream is None:
                return image
            objects = dict(stream.stream_objects)
            objects[record.object_id] = StreamOffsetRange(
                record.stream_id, record.start_offset, record.end_offset
            )
            stream = replace(
                stream,
                stream_objects=objects,
                end_offset=max(stream.end_offset, record.end_offset),
            )
            return replace(image, streams={**image.streams, record.stream_id: stream})
        case RemoveS3StreamObjectRecord():
            stream = image.streams.get(record.stream_id)
            if stream is None:
                return image
            objects = dict(stream.stream_objects)
            objects.pop(record.object_id, None)
            stream = replace(stream, stream_objects=objects)
            return replace(image, streams={**image.streams, record.stream_id: stream})
        case S3StreamSetObjectRecord():
            node = image.nodes.get(record.node_id) or NodeMetadata(record.node_id, NO_EPOCH)
            stream_set_object = StreamSetObject(
                record.object_id,
                record.node_id,
                record.order_id,
                record.ranges,
                record.data_time_ms,
            )
            node = replace(
                node,
                stream_set_objects={**node.stream_set_objects, record.object_id: stream_set_object},
            )
            streams = dict(image.streams)
            for offset_range in record.ranges:
                stream = streams.get(offset_range.stream_id)
                if stream is not None and offset_range.end_offset > stream.end_offset:
                    streams[stream.stream_id] = replace(stream, end_offset=offset_range.end_offset)
            return replace(image, nodes={**image.nodes, record.node_id: node}, streams=streams)
        case RemoveStreamSetObjectRecord():
            node = image.nodes.get(record.node_id)
            if node is None:
                return image
            stream_set_objects = dict(node.stream_set_objects)
            stream_set_objects.pop(record.object_id, None)
            node = replace(node, stream_set_objects=stream_set_objects)
            return replace(image, nodes={**image.nodes, record.node_id: node})
        case S3ObjectRecord():
            s3_object = S3Object(
                record.object_id,
                record.object_size,
                record.state,
                record.timestamp_ms,
                record.attributes,
            )
            return replace(image, objects={**image.objects, record.object_id: s3_object})
        case RemoveS3ObjectRecord():
            s3_objects = dict(image.objects)
            s3_objects.pop(record.object_id, None)
            return replace(image, objects=s3_objects)
        case AssignedStreamIdRecord():
            next_stream_id = max(image.next_stream_id, record.assigned_stream_id + 1)
            return replace(image, next_stream_id=next_stream_id)
        case AssignedS3ObjectIdRecord():
            next_object_id = max(image.next_object_id, record.assigned_object_id + 1)
            return replace(image, next_object_id=next_object_id)
        case NodeWALMetadataRecord():
            node = image.nodes.get(record.node_id) or NodeMetadata(record.node_id, NO_EPOCH)
            node = replace(node, node_epoch=record.node_epoch, failover_mode=record.failover_mode)
            return replace(image, nodes={**image.nodes, record.node_id: node})
        case S3StreamEndOffsetsRecord():
            stream = image.streams.get(record.stream_id)
            if stream is None or stream.end_offset >= record.end_offset:
                return image
            stream = replace(stream, end_offset=record.end_offset)
            return replace(image, streams={**image.streams, record.stream_id: stream})
        case KVRecord():
            return replace(image, kv={**image.kv, record.key: record.value})
        case RemoveKVRecord():
            kv = dict(image.kv)
            kv.pop(record.key, None)
            return replace(image, kv=kv)


def replay_all(
    image: StreamMetadataImage, records: Iterable[MetadataRecord]
) -> StreamMetadataImage:
    for record in records:
        image = replay(image, record)
    return image


# ============================================================================ events (actions)


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """getOpeningStreams: a node (re)starts at ``node_epoch`` and asks for its open streams."""

    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class FenceNode:
    """Failover: a survivor acts for a failed node's epoch; the failed node is NODE_FENCED."""

    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class CreateStream:
    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class OpenStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class TrimStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    new_start_offset: int


@dataclass(frozen=True, slots=True)
class DeleteStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PrepareObject:
    node_id: int
    node_epoch: int
    count: int
    ttl_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitRange:
    """One stream's offsets inside a stream set object."""

    stream_id: int
    stream_epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class CommitStreamObjectEntry:
    """A stream object uploaded beside a stream set object (one stream, contiguous)."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    object_size: int


@dataclass(frozen=True, slots=True)
class CommitStreamSetObject:
    node_id: int
    node_epoch: int
    object_id: int  # NO_OBJECT when the upload produced stream objects only
    order_id: int  # NO_OBJECT: the smallest order id of the compacted objects
    object_size: int
    stream_ranges: tuple[CommitRange, ...]
    stream_objects: tuple[CommitStreamObjectEntry, ...]
    compacted_object_ids: tuple[int, ...]
    failover_mode: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitStreamObject:
    """Stream object compaction: ``source_object_ids`` of one stream merged into one object."""

    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int  # ANY_STREAM_EPOCH skips the ownership check, as in AutoMQ
    object_id: int
    start_offset: int
    end_offset: int
    object_size: int
    source_object_ids: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class ExpireObject:
    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class RemoveObject:
    """The shell deleted a destroyed object from storage; forget it."""

    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PutKV:
    key: str
    value: bytes
    overwrite: bool


@dataclass(frozen=True, slots=True)
class DeleteKV:
    key: str


StreamMetadataEvent: TypeAlias = (
    RegisterNode
    | FenceNode
    | CreateStream
    | OpenStream
    | CloseStream
    | TrimStream
    | DeleteStream
    | PrepareObject
    | CommitStreamSetObject
    | CommitStreamObject
    | ExpireObject
    | RemoveObject
    | PutKV
    | DeleteKV
)


@dataclass(frozen=True, slots=True)
class OpeningStream:
    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Response:
    error: StreamErrorCode = StreamErrorCode.NONE
    message: str = ""
    stream_id: int | None = None
    start_offset: int | None = None
    next_offset: int | None = None
    first_object_id: int | None = None
    opening_streams: tuple[OpeningStream, ...] = ()
    value: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.error in (StreamErrorCode.NONE, StreamErrorCode.REDUNDANT_OPERATION)


@dataclass(frozen=True, slots=True)
class Transition:
    image: StreamMetadataImage
    records: tuple[MetadataRecord, ...]
    response: Response


@dataclass(frozen=True, slots=True)
class StreamMetadataParams:
    object_retention_ms: int = 60_000


DEFAULT_PARAMS: Final = StreamMetadataParams()


def step(
    image: StreamMetadataImage,
    event: StreamMetadataEvent,
    params: StreamMetadataParams = DEFAULT_PARAMS,
) -> Transition:
    """Handle one request: decide, produce records, and replay them into the next image."""
    match event:
        case RegisterNode():
            records, response = _on_register_node(image, event)
        case FenceNode():
            records, response = _on_fence_node(image, event)
        case CreateStream():
            records, response = _on_create_stream(image, event)
        case OpenStream():
            records, response = _on_open_stream(image, event)
        case CloseStream():
            records, response = _on_close_stream(image, event)
        case TrimStream():
            records, response = _on_trim_stream(image, event)
        case DeleteStream():
            records, response = _on_delete_stream(image, event)
        case PrepareObject():
            records, response = _on_prepare_object(image, event)
        case CommitStreamSetObject():
            records, response = _on_commit_stream_set_object(image, event)
        case CommitStreamObject():
            records, response = _on_commit_stream_object(image, event)
        case ExpireObject():
            records, response = _on_expire_object(image, event)
        case RemoveObject():
            records, response = _on_remove_object(image, event, params)
        case PutKV():
            records, response = _on_put_kv(image, event)
        case DeleteKV():
            records, response = _on_delete_kv(image, event)
    return Transition(replay_all(image, records), tuple(records), response)


_Outcome: TypeAlias = tuple[list[MetadataRecord], Response]


def _reject(error: StreamErrorCode, message: str) -> _Outcome:
    return [], Response(error=error, message=message)


def _accept(records: list[MetadataRecord], **fields: object) -> _Outcome:
    return records, Response(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- node checks


def _ignore_node(
    image: StreamMetadataImage, node_id: int, node_epoch: int, *, check_failover: bool = True
) -> _Outcome | None:
    """The node-epoch check applied to most requests (AUTOMQ.md 4.3)."""
    node = image.nodes.get(node_id)
    if node is None:
        return _reject(StreamErrorCode.NODE_EPOCH_NOT_EXIST, f"node {node_id} is not registered")
    if node.node_epoch > node_epoch:
        return _reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"node {node_id} epoch {node_epoch} is older than {node.node_epoch}",
        )
    if check_failover and node.failover_mode:
        return _reject(StreamErrorCode.NODE_FENCED, f"node {node_id} was taken over by failover")
    return None


def opening_streams(image: StreamMetadataImage, node_id: int) -> tuple[OpeningStream, ...]:
    """Streams OPENED whose current range is owned by ``node_id``."""
    found = []
    for stream in image.streams.values():
        current = stream.current_range
        if stream.state is StreamState.OPENED and current and current.node_id == node_id:
            found.append(
                OpeningStream(
                    stream.stream_id,
                    stream.epoch,
                    stream.start_offset,
                    max(stream.end_offset, stream.start_offset),
                )
            )
    return tuple(sorted(found, key=lambda opening: opening.stream_id))


def _on_register_node(image: StreamMetadataImage, event: RegisterNode) -> _Outcome:
    node = image.nodes.get(event.node_id)
    if node is not None and node.node_epoch > event.node_epoch:
        return _reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"node {event.node_id} epoch {event.node_epoch} is older than {node.node_epoch}",
        )
    records: list[MetadataRecord] = [NodeWALMetadataRecord(event.node_id, event.node_epoch, False)]
    return _accept(records, opening_streams=opening_streams(image, event.node_id))


def _on_fence_node(image: StreamMetadataImage, event: FenceNode) -> _Outcome:
    node = image.nodes.get(event.node_id)
    if node is None:
        return _reject(StreamErrorCode.NODE_EPOCH_NOT_EXIST, f"node {event.node_id} unknown")
    if node.node_epoch > event.node_epoch:
        # The node restarted meanwhile: it recovers by itself, there is nothing to take over.
        return _reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"node {event.node_id} epoch {event.node_epoch} is older than {node.node_epoch}",
        )
    records: list[MetadataRecord] = [NodeWALMetadataRecord(event.node_id, event.node_epoch, True)]
    return _accept(records, opening_streams=opening_streams(image, event.node_id))


# ---------------------------------------------------------------------------------- streams


def _on_create_stream(image: StreamMetadataImage, event: CreateStream) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream_id = image.next_stream_id
    records: list[MetadataRecord] = [
        AssignedStreamIdRecord(stream_id),
        S3StreamRecord(stream_id, NO_EPOCH, -1, 0, StreamState.CLOSED),
    ]
    return _accept(records, stream_id=stream_id)


def _on_open_stream(image: StreamMetadataImage, event: OpenStream) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return _reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {event.stream_id} not found")
    if stream.epoch > event.stream_epoch:
        return _reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {event.stream_id} epoch {event.stream_epoch} < current {stream.epoch}",
        )
    if stream.epoch == event.stream_epoch:
        # A retried open: fine for the owner of the current range, at the same range.
        current = stream.current_range
        if current is None:
            return _reject(StreamErrorCode.STREAM_INNER_ERROR, "stream has no current range")
        if current.node_id != event.node_id:
            return _reject(
                StreamErrorCode.STREAM_FENCED,
                f"stream {event.stream_id} epoch {stream.epoch} is owned by node {current.node_id}",
            )
        records: list[MetadataRecord] = []
        if stream.state is StreamState.CLOSED:
            records.append(
                S3StreamRecord(
                    stream.stream_id,
                    stream.epoch,
                    stream.range_index,
                    stream.start_offset,
                    StreamState.OPENED,
                )
            )
        return _accept(records, start_offset=stream.start_offset, next_offset=stream.end_offset)
    if stream.state is StreamState.OPENED:
        return _reject(
            StreamErrorCode.STREAM_NOT_CLOSED,
            f"stream {event.stream_id} is still open at epoch {stream.epoch}",
        )
    end = stream.end_offset
    new_index = stream.range_index + 1
    records = [
        S3StreamRecord(
            stream.stream_id, event.stream_epoch, new_index, stream.start_offset, StreamState.OPENED
        )
    ]
    current = stream.current_range
    if current is not None:
        records.append(
            RangeRecord(
                stream.stream_id,
                current.epoch,
                stream.range_index,
                current.start_offset,
                end,
                current.node_id,
            )
        )
    records.append(
        RangeRecord(stream.stream_id, event.stream_epoch, new_index, end, end, event.node_id)
    )
    records.extend(_removable_ranges(stream, sealed_end=end))
    return _accept(records, start_offset=stream.start_offset, next_offset=end)


def _removable_ranges(stream: StreamMetadata, *, sealed_end: int) -> list[MetadataRecord]:
    """Sealed ranges no lookup needs: empty ones in the middle, and those under the prefix of
    stream objects that is contiguous from the stream's start."""
    covered = stream.start_offset
    for object_range in sorted(stream.stream_objects.values(), key=lambda r: r.start_offset):
        if object_range.start_offset <= covered < object_range.end_offset:
            covered = object_range.end_offset
    removable: list[MetadataRecord] = []
    for index, stream_range in stream.ranges.items():
        end = sealed_end if index == stream.range_index else stream_range.end_offset
        empty = stream_range.start_offset == end
        if empty or end <= covered:
            removable.append(RemoveRangeRecord(stream.stream_id, index))
    return removable


def _ignore_owner(
    stream: StreamMetadata | None, stream_id: int, node_id: int, stream_epoch: int
) -> _Outcome | None:
    """The ownership check of close, trim and delete (AUTOMQ.md 4.4)."""
    if stream is None:
        return _reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {stream_id} not found")
    if stream.epoch > stream_epoch:
        return _reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {stream_id} epoch {stream_epoch} < current {stream.epoch}",
        )
    if stream.epoch < stream_epoch:
        return _reject(
            StreamErrorCode.STREAM_INNER_ERROR,
            f"stream {stream_id} epoch {stream_epoch} > current {stream.epoch}",
        )
    current = stream.current_range
    if current is None or current.node_id != node_id:
        return _reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {stream_id} is not owned by node {node_id}",
        )
    return None


def _on_close_stream(image: StreamMetadataImage, event: CloseStream) -> _Outcome:
    # Close skips the failover check: a survivor closes a failed node's streams as that node.
    ignored = _ignore_node(image, event.node_id, event.node_epoch, check_failover=False)
    if ignored is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if ignored := _ignore_owner(stream, event.stream_id, event.node_id, event.stream_epoch):
        return ignored
    assert stream is not None
    if stream.state is StreamState.CLOSED:
        return _accept([])
    records: list[MetadataRecord] = [
        S3StreamRecord(
            stream.stream_id,
            stream.epoch,
            stream.range_index,
            stream.start_offset,
            StreamState.CLOSED,
        )
    ]
    return _accept(records)


def _on_trim_stream(image: StreamMetadataImage, event: TrimStream) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if ignored := _ignore_owner(stream, event.stream_id, event.node_id, event.stream_epoch):
        return ignored
    assert stream is not None
    if stream.state is StreamState.CLOSED:
        return _reject(StreamErrorCode.STREAM_NOT_OPENED, f"stream {event.stream_id} is closed")
    new_start = event.new_start_offset
    if new_start < stream.start_offset:
        return _reject(
            StreamErrorCode.OFFSET_NOT_MATCHED,
            f"trim to {new_start} is below the stream start {stream.start_offset}",
        )
    if new_start == stream.start_offset:
        return _accept([])
    records: list[MetadataRecord] = [
        S3StreamRecord(stream.stream_id, stream.epoch, stream.range_index, new_start, stream.state)
    ]
    for index, stream_range in sorted(stream.ranges.items()):
        end = stream.range_end(index)
        if index == stream.range_index:
            # Trimming past the end is allowed: the current range (and the stream) end there.
            if new_start > stream_range.start_offset:
                records.append(
                    RangeRecord(
                        stream.stream_id,
                        stream_range.epoch,
                        index,
                        new_start,
                        max(new_start, end),
                        stream_range.node_id,
                    )
                )
        elif end <= new_start:
            records.append(RemoveRangeRecord(stream.stream_id, index))
        elif stream_range.start_offset < new_start:
            records.append(
                RangeRecord(
                    stream.stream_id,
                    stream_range.epoch,
                    index,
                    new_start,
                    end,
                    stream_range.node_id,
                )
            )
    return _accept(records)


def _on_delete_stream(image: StreamMetadataImage, event: DeleteStream) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return _accept([])
    if stream.state is not StreamState.CLOSED:
        return _reject(StreamErrorCode.STREAM_NOT_CLOSED, f"stream {event.stream_id} is open")
    if stream.epoch > event.stream_epoch:
        return _reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {event.stream_id} epoch {event.stream_epoch} < current {stream.epoch}",
        )
    records: list[MetadataRecord] = [RemoveS3StreamRecord(stream.stream_id)]
    for object_id in sorted(stream.stream_objects):
        records.append(_mark_destroyed(image.objects[object_id], event.now_ms))
    return _accept(records)


# ---------------------------------------------------------------------------------- objects


def _mark_destroyed(s3_object: S3Object, now_ms: int) -> S3ObjectRecord:
    return S3ObjectRecord(
        s3_object.object_id,
        s3_object.object_size,
        S3ObjectState.MARK_DESTROYED,
        now_ms,
        s3_object.attributes,
    )


def _on_prepare_object(image: StreamMetadataImage, event: PrepareObject) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    if event.count < 1 or event.ttl_ms < 0:
        return _reject(
            StreamErrorCode.INVALID_REQUEST,
            f"prepare needs count >= 1 and ttl >= 0, got {event.count} and {event.ttl_ms}",
        )
    first = image.next_object_id
    records: list[MetadataRecord] = [AssignedS3ObjectIdRecord(first + event.count - 1)]
    deadline = event.now_ms + event.ttl_ms
    for object_id in range(first, first + event.count):
        records.append(S3ObjectRecord(object_id, 0, S3ObjectState.PREPARED, deadline))
    return _accept(records, first_object_id=first)


def _commit_object(
    image: StreamMetadataImage, object_id: int, object_size: int, now_ms: int
) -> tuple[StreamErrorCode, S3ObjectRecord | None]:
    s3_object = image.objects.get(object_id)
    if s3_object is None or s3_object.state is S3ObjectState.MARK_DESTROYED:
        return StreamErrorCode.OBJECT_NOT_EXIST, None
    if s3_object.state is S3ObjectState.COMMITTED:
        return StreamErrorCode.REDUNDANT_OPERATION, None
    if now_ms > s3_object.timestamp_ms:
        # Past its deadline: ExpireObject may run any moment; refusing now keeps "an expired
        # prepared object never becomes committed" independent of when expiry runs.
        return StreamErrorCode.OBJECT_NOT_EXIST, None
    record = S3ObjectRecord(
        object_id, object_size, S3ObjectState.COMMITTED, now_ms, s3_object.attributes
    )
    return StreamErrorCode.NONE, record


def _check_continuity(
    image: StreamMetadataImage,
    node_id: int,
    entries: list[tuple[int, int, int, int]],
) -> _Outcome | None:
    """Every (stream, epoch, start, end) must extend its stream exactly at its end offset."""
    expected_end: dict[int, int] = {}
    for stream_id, stream_epoch, start, end in sorted(entries, key=lambda e: (e[0], e[2])):
        if start >= end:
            return _reject(
                StreamErrorCode.INVALID_REQUEST,
                f"stream {stream_id}: empty or inverted range [{start}, {end})",
            )
        stream = image.streams.get(stream_id)
        if stream is None:
            continue  # deleted meanwhile: its data is dropped later by compaction
        if end <= stream.start_offset:
            continue  # wholly trimmed: accepted, moves nothing
        if stream.state is not StreamState.OPENED:
            return _reject(StreamErrorCode.STREAM_NOT_OPENED, f"stream {stream_id} is closed")
        current = stream.current_range
        if current is None:
            return _reject(StreamErrorCode.STREAM_INNER_ERROR, f"stream {stream_id} has no range")
        if current.node_id != node_id or (
            stream_epoch != ANY_STREAM_EPOCH and stream_epoch != stream.epoch
        ):
            return _reject(
                StreamErrorCode.STREAM_FENCED,
                f"stream {stream_id} is owned by node {current.node_id} at epoch "
                f"{stream.epoch}, not node {node_id} at epoch {stream_epoch}",
            )
        stream_end = expected_end.get(stream_id, stream.end_offset)
        if stream_end > stream.start_offset:
            matched = start == stream_end
        else:
            # The stream is trimmed up to its end: anything from at or below the start fits.
            matched = start <= stream.start_offset
        if not matched:
            return _reject(
                StreamErrorCode.OFFSET_NOT_MATCHED,
                f"stream {stream_id}: commit starts at {start}, stream ends at {stream_end}",
            )
        expected_end[stream_id] = end
    return None


def _redundant_stream_set_object(
    image: StreamMetadataImage, event: CommitStreamSetObject
) -> _Outcome | None:
    """A retried commit of a stream set object that is already in: success, nothing to do."""
    s3_object = image.objects.get(event.object_id)
    if s3_object is None or s3_object.state is not S3ObjectState.COMMITTED:
        return None
    node = image.nodes.get(event.node_id)
    existing = node.stream_set_objects.get(event.object_id) if node is not None else None
    if existing is not None and existing.ranges == _offset_ranges(event.stream_ranges):
        return _accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    return _reject(
        StreamErrorCode.INVALID_REQUEST,
        f"object {event.object_id} is already committed with other contents",
    )


def _offset_ranges(ranges: Iterable[CommitRange]) -> tuple[StreamOffsetRange, ...]:
    return tuple(
        StreamOffsetRange(r.stream_id, r.start_offset, r.end_offset)
        for r in sorted(ranges, key=lambda r: (r.stream_id, r.start_offset))
    )


def _split_redundant_stream_objects(
    image: StreamMetadataImage, entries: Iterable[CommitStreamObjectEntry]
) -> tuple[list[CommitStreamObjectEntry], _Outcome | None]:
    """Stream objects not committed yet; those committed by an earlier try are left out."""
    fresh: list[CommitStreamObjectEntry] = []
    for entry in entries:
        s3_object = image.objects.get(entry.object_id)
        if s3_object is None or s3_object.state is not S3ObjectState.COMMITTED:
            fresh.append(entry)
            continue
        stream = image.streams.get(entry.stream_id)
        recorded = stream.stream_objects.get(entry.object_id) if stream is not None else None
        if recorded != StreamOffsetRange(entry.stream_id, entry.start_offset, entry.end_offset):
            return [], _reject(
                StreamErrorCode.INVALID_REQUEST,
                f"stream object {entry.object_id} is already committed with other contents",
            )
    return fresh, None


def _clip(image: StreamMetadataImage, offset_range: StreamOffsetRange) -> list[tuple[int, int]]:
    """The part of ``offset_range`` still live: its stream exists and it lies above the start.

    post: len(__return__) <= 1
    post: all(offset_range.start_offset <= s < e == offset_range.end_offset for s, e in __return__)
    """
    stream = image.streams.get(offset_range.stream_id)
    if stream is None:
        return []  # a deleted stream's data may be dropped
    start = max(offset_range.start_offset, stream.start_offset)
    return [(start, offset_range.end_offset)] if start < offset_range.end_offset else []


def _live_coverage(
    image: StreamMetadataImage, ranges: Iterable[StreamOffsetRange]
) -> dict[int, list[tuple[int, int]]]:
    """Per existing stream, the merged offsets at or above its start that ``ranges`` hold."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for offset_range in ranges:
        for piece in _clip(image, offset_range):
            pieces.setdefault(offset_range.stream_id, []).append(piece)
    merged: dict[int, list[tuple[int, int]]] = {}
    for stream_id, intervals in pieces.items():
        runs: list[tuple[int, int]] = []
        for start, end in sorted(intervals):
            if runs and start <= runs[-1][1]:
                runs[-1] = (runs[-1][0], max(runs[-1][1], end))
            else:
                runs.append((start, end))
        merged[stream_id] = runs
    return merged


def _on_commit_stream_set_object(
    image: StreamMetadataImage, event: CommitStreamSetObject
) -> _Outcome:
    ignored = _ignore_node(
        image, event.node_id, event.node_epoch, check_failover=not event.failover_mode
    )
    if ignored is not None:
        return ignored
    if event.object_id == NO_OBJECT and not event.stream_objects:
        return _reject(StreamErrorCode.INVALID_REQUEST, "commit of nothing")
    if event.object_id != NO_OBJECT and (redundant := _redundant_stream_set_object(image, event)):
        return redundant
    stream_objects, refused = _split_redundant_stream_objects(image, event.stream_objects)
    if refused is not None:
        return refused
    if event.object_id == NO_OBJECT and not stream_objects:
        return _accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    records: list[MetadataRecord] = []
    if event.object_id != NO_OBJECT:
        outcome, record = _commit_object(image, event.object_id, event.object_size, event.now_ms)
        if record is None:
            return _reject(outcome, f"object {event.object_id} cannot be committed")
        records.append(record)
    node = image.nodes[event.node_id]
    order_id = event.order_id
    data_time_ms = event.now_ms
    if event.compacted_object_ids:
        compacted = [node.stream_set_objects.get(i) for i in event.compacted_object_ids]
        sources = [source for source in compacted if source is not None]
        if len(sources) != len(compacted) or any(
            source.object_id not in image.objects
            or image.objects[source.object_id].state is not S3ObjectState.COMMITTED
            for source in sources
        ):
            return _reject(
                StreamErrorCode.COMPACTED_OBJECTS_NOT_FOUND,
                f"compacted objects {event.compacted_object_ids} are not all committed on "
                f"node {event.node_id}",
            )
        outputs = [
            StreamOffsetRange(r.stream_id, r.start_offset, r.end_offset)
            for r in event.stream_ranges
        ] + [StreamOffsetRange(o.stream_id, o.start_offset, o.end_offset) for o in stream_objects]
        inputs = [offset_range for source in sources for offset_range in source.ranges]
        output_coverage = _live_coverage(image, outputs)
        overlapping = sum(end - start for r in outputs for start, end in _clip(image, r)) != sum(
            end - start for runs in output_coverage.values() for start, end in runs
        )
        if overlapping or _live_coverage(image, inputs) != output_coverage:
            return _reject(
                StreamErrorCode.OFFSET_NOT_MATCHED,
                f"compaction into object {event.object_id} does not hold exactly the live "
                f"offsets of objects {event.compacted_object_ids}",
            )
        data_time_ms = min(source.data_time_ms for source in sources)
        if order_id == NO_OBJECT:
            order_id = min(source.order_id for source in sources)
        for source in sources:
            records.append(_mark_destroyed(image.objects[source.object_id], event.now_ms))
            records.append(RemoveStreamSetObjectRecord(event.node_id, source.object_id))
    else:
        entries = [
            (r.stream_id, r.stream_epoch, r.start_offset, r.end_offset) for r in event.stream_ranges
        ] + [(o.stream_id, ANY_STREAM_EPOCH, o.start_offset, o.end_offset) for o in stream_objects]
        if (ignored := _check_continuity(image, event.node_id, entries)) is not None:
            return ignored
        if order_id == NO_OBJECT:
            order_id = event.object_id
    for entry in stream_objects:
        outcome, record = _commit_object(image, entry.object_id, entry.object_size, event.now_ms)
        if record is None:
            return _reject(outcome, f"stream object {entry.object_id} cannot be committed")
        if entry.stream_id in image.streams:
            records.append(record)
            records.append(
                S3StreamObjectRecord(
                    entry.stream_id, entry.start_offset, entry.end_offset, entry.object_id
                )
            )
        else:
            records.append(_mark_destroyed(image.objects[entry.object_id], event.now_ms))
    if event.object_id != NO_OBJECT:
        records.append(
            S3StreamSetObjectRecord(
                event.node_id,
                event.object_id,
                order_id,
                _offset_ranges(event.stream_ranges),
                data_time_ms,
            )
        )
    return _accept(records)


def _on_commit_stream_object(image: StreamMetadataImage, event: CommitStreamObject) -> _Outcome:
    if (ignored := _ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return _reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {event.stream_id} not found")
    if event.stream_epoch != ANY_STREAM_EPOCH:
        owner = _ignore_owner(stream, event.stream_id, event.node_id, event.stream_epoch)
        if owner is not None:
            return owner
    if event.object_id != NO_OBJECT:
        entry = CommitStreamObjectEntry(
            event.object_id, event.stream_id, event.start_offset, event.end_offset, 0
        )
        fresh, refused = _split_redundant_stream_objects(image, [entry])
        if refused is not None:
            return refused
        if not fresh:
            return _accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    sources = [stream.stream_objects.get(object_id) for object_id in event.source_object_ids]
    ordered = sorted((s for s in sources if s is not None), key=lambda s: s.start_offset)
    if not sources or len(ordered) != len(sources):
        return _reject(
            StreamErrorCode.COMPACTED_OBJECTS_NOT_FOUND,
            f"sources {event.source_object_ids} are not all stream objects of "
            f"stream {event.stream_id}",
        )
    contiguous = all(a.end_offset == b.start_offset for a, b in itertools.pairwise(ordered))
    if event.object_id == NO_OBJECT:
        # Pure cleanup: only objects wholly below the stream's start may go without a successor.
        tiles = ordered[-1].end_offset <= stream.start_offset
    else:
        tiles = contiguous and (ordered[0].start_offset, ordered[-1].end_offset) == (
            event.start_offset,
            event.end_offset,
        )
    if not tiles:
        return _reject(
            StreamErrorCode.OFFSET_NOT_MATCHED,
            f"sources of stream {event.stream_id} do not tile "
            f"[{event.start_offset}, {event.end_offset})"
            if event.object_id != NO_OBJECT
            else f"cleanup of stream {event.stream_id} objects above its start "
            f"{stream.start_offset}",
        )
    records: list[MetadataRecord] = []
    if event.object_id != NO_OBJECT:
        outcome, record = _commit_object(image, event.object_id, event.object_size, event.now_ms)
        if record is None:
            return _reject(outcome, f"object {event.object_id} cannot be committed")
        records.append(record)
    for object_id in event.source_object_ids:
        records.append(_mark_destroyed(image.objects[object_id], event.now_ms))
        records.append(RemoveS3StreamObjectRecord(event.stream_id, object_id))
    if event.object_id != NO_OBJECT:
        records.append(
            S3StreamObjectRecord(
                event.stream_id, event.start_offset, event.end_offset, event.object_id
            )
        )
    return _accept(records)


def _on_expire_object(image: StreamMetadataImage, event: ExpireObject) -> _Outcome:
    s3_object = image.objects.get(event.object_id)
    if s3_object is None or s3_object.state is not S3ObjectState.PREPARED:
        return _reject(StreamErrorCode.OBJECT_NOT_EXIST, f"object {event.object_id} not prepared")
    if event.now_ms <= s3_object.timestamp_ms:
        return _reject(
            StreamErrorCode.INVALID_REQUEST,
            f"object {event.object_id} expires at {s3_object.timestamp_ms}, now {event.now_ms}",
        )
    return _accept([_mark_destroyed(s3_object, event.now_ms)])


def _on_remove_object(
    image: StreamMetadataImage, event: RemoveObject, params: StreamMetadataParams
) -> _Outcome:
    s3_object = image.objects.get(event.object_id)
    if s3_object is None:
        return _accept([])
    if s3_object.state is not S3ObjectState.MARK_DESTROYED:
        return _reject(
            StreamErrorCode.INVALID_REQUEST, f"object {event.object_id} is not destroyed"
        )
    if event.now_ms < s3_object.timestamp_ms + params.object_retention_ms:
        return _reject(
            StreamErrorCode.INVALID_REQUEST,
            f"object {event.object_id} is retained until "
            f"{s3_object.timestamp_ms + params.object_retention_ms}",
        )
    return _accept([RemoveS3ObjectRecord(event.object_id)])


# ---------------------------------------------------------------------------------------- KV


def _on_put_kv(image: StreamMetadataImage, event: PutKV) -> _Outcome:
    existing = image.kv.get(event.key)
    if existing is not None and not event.overwrite:
        return _accept([], error=StreamErrorCode.KEY_EXIST, value=existing)
    return _accept([KVRecord(event.key, event.value)], value=event.value)


def _on_delete_kv(image: StreamMetadataImage, event: DeleteKV) -> _Outcome:
    if event.key not in image.kv:
        return _accept([])
    return _accept([RemoveKVRecord(event.key)], value=image.kv[event.key])


# ================================================================================== queries


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """An object holding offsets ``[start_offset, end_offset)`` of one stream."""

    object_id: int
    start_offset: int
    end_offset: int
    is_stream_object: bool


def stream_object_slices(image: StreamMetadataImage, stream_id: int) -> list[ObjectSlice]:
    """Every committed object range of a stream, stream objects and stream set objects alike."""
    slices: list[ObjectSlice] = []
    stream = image.streams.get(stream_id)
    if stream is None:
        return slices
    for object_id, offset_range in stream.stream_objects.items():
        slices.append(
            ObjectSlice(object_id, offset_range.start_offset, offset_range.end_offset, True)
        )
    for node in image.nodes.values():
        for stream_set_object in node.stream_set_objects.values():
            for offset_range in stream_set_object.ranges:
                if offset_range.stream_id == stream_id:
                    slices.append(
                        ObjectSlice(
                            stream_set_object.object_id,
                            offset_range.start_offset,
                            offset_range.end_offset,
                            False,
                        )
                    )
    slices.sort(key=lambda s: (s.start_offset, s.end_offset))
    return slices


def get_objects(
    image: StreamMetadataImage, stream_id: int, start_offset: int, end_offset: int, limit: int
) -> tuple[StreamErrorCode, tuple[ObjectSlice, ...]]:
    """The objects that hold ``[start_offset, end_offset)``, in offset order, up to ``limit``.

    The walk stops at the first gap: if the result does not reach ``end_offset``, the image has
    not caught up with a commit yet (the reader retries on the next image). AutoMQ narrows the
    search with the owner of each range and the node's order ids; this walks every candidate,
    which gives the same answer.
    """
    stream = image.streams.get(stream_id)
    if stream is None:
        return StreamErrorCode.STREAM_NOT_EXIST, ()
    if start_offset < stream.start_offset:
        return StreamErrorCode.OFFSET_NOT_MATCHED, ()
    found: list[ObjectSlice] = []
    cursor = start_offset
    candidates = stream_object_slices(image, stream_id)
    while cursor < end_offset and len(found) < limit:
        following = [s for s in candidates if s.start_offset <= cursor < s.end_offset]
        exact = [s for s in following if s.start_offset == cursor]
        chosen = (exact or (following if not found else []))[:1]
        if not chosen:
            break
        found.append(chosen[0])
        cursor = chosen[0].end_offset
    return StreamErrorCode.NONE, tuple(found)


def expired_objects(image: StreamMetadataImage, now_ms: int) -> list[int]:
    """PREPARED objects whose deadline has passed: candidates for ExpireObject."""
    return sorted(
        o.object_id
        for o in image.objects.values()
        if o.state is S3ObjectState.PREPARED and now_ms > o.timestamp_ms
    )


def removable_objects(
    image: StreamMetadataImage, now_ms: int, params: StreamMetadataParams = DEFAULT_PARAMS
) -> list[int]:
    """MARK_DESTROYED objects past retention: the shell deletes them, then sends RemoveObject."""
    return sorted(
        o.object_id
        for o in image.objects.values()
        if o.state is S3ObjectState.MARK_DESTROYED
        and now_ms >= o.timestamp_ms + params.object_retention_ms
    )


# =============================================================================== invariants


class InvariantViolation(AssertionError):
    pass


def inv_single_writer(image: StreamMetadataImage) -> None:
    """SingleWriter: a stream's retained ranges have strictly increasing epochs, so no two
    nodes ever hold a range of the same stream epoch."""
    for stream in image.streams.values():
        epochs = [stream.ranges[index].epoch for index in sorted(stream.ranges)]
        if any(a >= b for a, b in itertools.pairwise(epochs)):
            raise InvariantViolation(f"stream {stream.stream_id}: range epochs {epochs}")
        current = stream.current_range
        if current is not None and current.epoch != stream.epoch:
            raise InvariantViolation(
                f"stream {stream.stream_id}: current range epoch {current.epoch} != "
                f"stream epoch {stream.epoch}"
            )


def inv_ranges_contiguous(image: StreamMetadataImage) -> None:
    """RangesContiguous: retained ranges tile without gap or overlap up to the stream's end."""
    for stream in image.streams.values():
        if stream.start_offset > stream.end_offset:
            raise InvariantViolation(
                f"stream {stream.stream_id}: start {stream.start_offset} > end {stream.end_offset}"
            )
        indexes = sorted(stream.ranges)
        for a, b in itertools.pairwise(indexes):
            if stream.range_end(a) != stream.ranges[b].start_offset:
                raise InvariantViolation(
                    f"stream {stream.stream_id}: range {a} ends at {stream.range_end(a)}, "
                    f"range {b} starts at {stream.ranges[b].start_offset}"
                )
        for index in indexes:
            if stream.ranges[index].start_offset > stream.range_end(index):
                raise InvariantViolation(f"stream {stream.stream_id}: range {index} inverted")
        if indexes and indexes[-1] != stream.range_index:
            raise InvariantViolation(
                f"stream {stream.stream_id}: last range {indexes[-1]} is not the current "
                f"{stream.range_index}"
            )


def inv_objects_cover_stream(image: StreamMetadataImage) -> None:
    """ObjectsCoverStream: the committed objects tile [start, end) with no gap or overlap."""
    for stream in image.streams.values():
        cursor = stream.start_offset
        for object_slice in stream_object_slices(image, stream.stream_id):
            if object_slice.end_offset <= stream.start_offset:
                continue
            if object_slice.start_offset > cursor or (
                object_slice.start_offset < cursor and cursor != stream.start_offset
            ):
                raise InvariantViolation(
                    f"stream {stream.stream_id}: object {object_slice.object_id} covers "
                    f"[{object_slice.start_offset}, {object_slice.end_offset}) after {cursor}"
                )
            cursor = object_slice.end_offset
        if cursor != stream.end_offset:
            raise InvariantViolation(
                f"stream {stream.stream_id}: objects reach {cursor}, stream ends at "
                f"{stream.end_offset}"
            )


def inv_no_fenced_commit_visible(image: StreamMetadataImage) -> None:
    """NoFencedCommitVisible: data in a node's stream set objects lies in ranges it owned."""
    for node in image.nodes.values():
        for stream_set_object in node.stream_set_objects.values():
            for offset_range in stream_set_object.ranges:
                stream = image.streams.get(offset_range.stream_id)
                if stream is None:
                    continue
                for index, stream_range in stream.ranges.items():
                    overlaps = (
                        stream_range.start_offset < offset_range.end_offset
                        and offset_range.start_offset < stream.range_end(index)
                        and offset_range.end_offset > stream.start_offset
                    )
                    if overlaps and stream_range.node_id != node.node_id:
                        raise InvariantViolation(
                            f"node {node.node_id} object {stream_set_object.object_id} holds "
                            f"stream {stream.stream_id} [{offset_range.start_offset}, "
                            f"{offset_range.end_offset}) inside node {stream_range.node_id}'s "
                            f"range {index}"
                        )


def inv_nothing_referenced_is_destroyed(image: StreamMetadataImage) -> None:
    """NothingReferencedIsDestroyed: every object a stream refers to is COMMITTED."""
    referenced = [
        object_id for stream in image.streams.values() for object_id in stream.stream_objects
    ] + [object_id for node in image.nodes.values() for object_id in node.stream_set_objects]
    for object_id in referenced:
        s3_object = image.objects.get(object_id)
        if s3_object is None or s3_object.state is not S3ObjectState.COMMITTED:
            raise InvariantViolation(f"object {object_id} is referenced but {s3_object}")


INVARIANTS: Final = (
    inv_single_writer,
    inv_ranges_contiguous,
    inv_objects_cover_stream,
    inv_no_fenced_commit_visible,
    inv_nothing_referenced_is_destroyed,
)


def check_invariants(image: StreamMetadataImage) -> None:
    for invariant in INVARIANTS:
        invariant(image)


def image_records(image: StreamMetadataImage) -> list[MetadataRecord]:
    """Records that rebuild ``image`` from the empty image (a snapshot of the log)."""
    records: list[MetadataRecord] = []
    if image.next_stream_id:
        records.append(AssignedStreamIdRecord(image.next_stream_id - 1))
    if image.next_object_id:
        records.append(AssignedS3ObjectIdRecord(image.next_object_id - 1))
    for s3_object in image.objects.values():
        records.append(
            S3ObjectRecord(
                s3_object.object_id,
                s3_object.object_size,
                s3_object.state,
                s3_object.timestamp_ms,
                s3_object.attributes,
            )
        )
    for node in image.nodes.values():
        records.append(NodeWALMetadataRecord(node.node_id, node.node_epoch, node.failover_mode))
    for stream in image.streams.values():
        records.append(
            S3StreamRecord(
                stream.stream_id,
                stream.epoch,
                stream.range_index,
                stream.start_offset,
                stream.state,
            )
        )
        for index, stream_range in stream.ranges.items():
            records.append(
                RangeRecord(
                    stream.stream_id,
                    stream_range.epoch,
                    index,
                    stream_range.start_offset,
                    stream_range.end_offset,
                    stream_range.node_id,
                )
            )
        # The objects that proved the end offset may be gone (trimmed, compacted away).
        records.append(S3StreamEndOffsetsRecord(stream.stream_id, stream.end_offset))
        for object_id, offset_range in stream.stream_objects.items():
            records.append(
                S3StreamObjectRecord(
                    stream.stream_id, offset_range.start_offset, offset_range.end_offset, object_id
                )
            )
    for node in image.nodes.values():
        for sso in node.stream_set_objects.values():
            records.append(
                S3StreamSetObjectRecord(
                    node.node_id, sso.object_id, sso.order_id, sso.ranges, sso.data_time_ms
                )
            )
    for key, value in image.kv.items():
        records.append(KVRecord(key, value))
    return records


# ============================================================================ trace validation


def tla_node(node_id: int) -> dict[str, object]:
    """A node id as the model value the trace names it by (``n0``, ``n1``, ...)."""
    return {"model": f"n{node_id}"}


def _tla_fn(pairs: Iterable[tuple[object, object]]) -> dict[str, object]:
    return {"fn": [[key, value] for key, value in pairs]}


def _tla_set(records: Iterable[dict[str, object]]) -> dict[str, object]:
    ordered = sorted(records, key=lambda record: repr(sorted(record.items())))
    return {"set": [{"record": record} for record in ordered]}


def _tla_ranges(stream: StreamMetadata) -> dict[str, object]:
    return _tla_set(
        {
            "index": index,
            "epoch": stream_range.epoch,
            "node": tla_node(stream_range.node_id),
            "start": stream_range.start_offset,
            # The spec keeps the current range's end at the stream's end, which is where the
            # image's current range ends too (``range_end``).
            "end": stream.range_end(index),
        }
        for index, stream_range in stream.ranges.items()
    )


def tla_state(image: StreamMetadataImage) -> dict[str, object]:
    """The image as the variables of specs/StreamMetadata.tla, in the trace format of
    specs/trace_validate.py (docs/trace_validation.md).

    Streams and objects are given for the ids handed out so far (``0 .. next id - 1``): a stream
    missing from the image is ``"DELETED"`` (with the spec's reset values: epoch and range index
    -1, offsets 0, no ranges), an object missing from it is ``"REMOVED"``. Each range of a stream
    set object is one record of ``streamSetObjects`` (the spec's objects hold one range each).
    Not observed, left to TLC: the history variables ``grants``, ``commits`` and ``expired``,
    which the image does not keep.
    """
    stream_ids = range(image.next_stream_id)
    streams = [(stream_id, image.streams.get(stream_id)) for stream_id in stream_ids]
    object_states = {
        object_id: s3_object.state.name if s3_object is not None else "REMOVED"
        for object_id in range(image.next_object_id)
        for s3_object in [image.objects.get(object_id)]
    }
    nodes = sorted(image.nodes.items())
    return {
        "nodeEpoch": _tla_fn((tla_node(node_id), node.node_epoch) for node_id, node in nodes),
        "failoverMode": _tla_fn((tla_node(node_id), node.failover_mode) for node_id, node in nodes),
        "nextStreamId": image.next_stream_id,
        "streamState": _tla_fn(
            (stream_id, stream.state.name if stream is not None else "DELETED")
            for stream_id, stream in streams
        ),
        "streamEpoch": _tla_fn(
            (stream_id, stream.epoch if stream is not None else NO_EPOCH)
            for stream_id, stream in streams
        ),
        "rangeIndex": _tla_fn(
            (stream_id, stream.range_index if stream is not None else -1)
            for stream_id, stream in streams
        ),
        "streamStart": _tla_fn(
            (stream_id, stream.start_offset if stream is not None else 0)
            for stream_id, stream in streams
        ),
        "streamEnd": _tla_fn(
            (stream_id, stream.end_offset if stream is not None else 0)
            for stream_id, stream in streams
        ),
        "ranges": _tla_fn(
            (stream_id, _tla_ranges(stream) if stream is not None else {"set": []})
            for stream_id, stream in streams
        ),
        "nextObjectId": image.next_object_id,
        "objectState": _tla_fn(object_states.items()),
        "streamSetObjects": _tla_set(
            {
                "object": stream_set_object.object_id,
                "node": tla_node(node_id),
                "stream": offset_range.stream_id,
                "start": offset_range.start_offset,
                "end": offset_range.end_offset,
            }
            for node_id, node in nodes
            for stream_set_object in node.stream_set_objects.values()
            for offset_range in stream_set_object.ranges
        ),
        "streamObjects": _tla_set(
            {
                "object": object_id,
                "stream": offset_range.stream_id,
                "start": offset_range.start_offset,
                "end": offset_range.end_offset,
            }
            for stream in image.streams.values()
            for object_id, offset_range in stream.stream_objects.items()
        ),
    }


def tla_action(event: StreamMetadataEvent) -> str:
    """The TLA+ action an event stands for in a trace: its class name, except the split of
    stream set objects into stream objects (a ``CommitStreamSetObject`` with compacted objects
    and stream objects only), which the spec models as ``CommitStreamObject``."""
    if (
        isinstance(event, CommitStreamSetObject)
        and event.compacted_object_ids
        and event.object_id == NO_OBJECT
        and event.stream_objects
    ):
        return "CommitStreamObject"
    return type(event).__name__
