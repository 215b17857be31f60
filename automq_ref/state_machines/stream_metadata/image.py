"""The image of the metadata log and its replay: streams, ranges, nodes, objects, KV.

The image is nothing but the replay of the records, so every broker that replays the same log
holds the same image. Replay of offsets uses max semantics: replaying records in another order
cannot move an offset backwards. ``image_records`` goes the other way: the records that rebuild
an image (a snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

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

NO_EPOCH: Final = -1


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
