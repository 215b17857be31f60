"""The image of the metadata log and its replay: streams, ranges, nodes, objects, KV, brokers
and the placement of partitions.

The image is nothing but the replay of the records, so every broker that replays the same log
holds the same image. Replay of offsets uses max semantics: replaying records in another order
cannot move an offset backwards. ``image_records`` goes the other way: the records that rebuild
an image (a snapshot).

One part is not replayed: the active controller's *soft state*, the session deadline of each
live broker, the load each partition last reported and when each broker last reported.
Heartbeats renew them every couple of seconds, and writing each one to the log would fill it
with nothing worth replaying; KRaft's controller keeps broker sessions in memory for the same
reason. The fields are left out of
equality (``compare=False``), so an image equals the replay of its records whatever its soft
state; a controller that takes over starts with none and gives every live broker a fresh session
(``ExpireSessions``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from automq_ref.state_machines.placement import Load, PartitionKey
from automq_ref.vocabulary.metadata_records import (
    NO_PARTITION,
    NO_TOPIC,
    AssignedS3ObjectIdRecord,
    AssignedStreamIdRecord,
    BrokerRegistrationChangeRecord,
    Endpoint,
    KVRecord,
    MetadataRecord,
    NodeWALMetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RangeRecord,
    RegisterBrokerRecord,
    RemoveKVRecord,
    RemoveRangeRecord,
    RemoveS3ObjectRecord,
    RemoveS3StreamObjectRecord,
    RemoveS3StreamRecord,
    RemoveStreamSetObjectRecord,
    RemoveTopicRecord,
    S3ObjectRecord,
    S3ObjectState,
    S3StreamEndOffsetsRecord,
    S3StreamObjectRecord,
    S3StreamRecord,
    S3StreamSetObjectRecord,
    StreamOffsetRange,
    StreamState,
    TopicRecord,
    UnregisterBrokerRecord,
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
    topic_id: str = NO_TOPIC  # the tags: the partition whose data the stream holds, if any
    partition: int = NO_PARTITION

    @property
    def partition_key(self) -> PartitionKey | None:
        """The (topic id, index) of the partition the stream belongs to, if tagged."""
        return (self.topic_id, self.partition) if self.topic_id != NO_TOPIC else None

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
class BrokerRegistration:
    """A registered broker: the node epoch its registration was granted, where it runs, where
    its WAL lives (``wal_config``, empty when its registration did not say), and whether it
    may hold partitions (unfenced and not shutting down: *live*)."""

    node_id: int
    node_epoch: int
    rack: str
    listeners: tuple[Endpoint, ...]
    fenced: bool = True
    in_controlled_shutdown: bool = False
    wal_config: str = ""

    @property
    def live(self) -> bool:
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """Where a partition lives: its broker (``NO_LEADER`` when no broker was live) and the
    leader epoch at which that broker opens its streams."""

    leader: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicPlacement:
    topic_id: str
    name: str
    partitions: Mapping[int, PartitionAssignment] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """A partition's traffic as a heartbeat reported it, and when (soft state)."""

    load: Load
    reported_ms: int


@dataclass(frozen=True, slots=True)
class StreamMetadataImage:
    """The replay of the metadata log. Its maps are never mutated: replay builds new ones.

    ``sessions`` (node -> session deadline), ``loads`` (partition -> its last report) and
    ``reports`` (node -> when it last reported) are the controller's soft state, not replayed
    and not compared (module docstring)."""

    streams: Mapping[int, StreamMetadata] = field(default_factory=dict)
    nodes: Mapping[int, NodeMetadata] = field(default_factory=dict)
    objects: Mapping[int, S3Object] = field(default_factory=dict)
    kv: Mapping[str, bytes] = field(default_factory=dict)
    next_stream_id: int = 0
    next_object_id: int = 0
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=dict)
    topics: Mapping[str, TopicPlacement] = field(default_factory=dict)  # by topic id
    sessions: Mapping[int, int] = field(default_factory=dict, compare=False)
    loads: Mapping[PartitionKey, ReportedLoad] = field(default_factory=dict, compare=False)
    reports: Mapping[int, int] = field(default_factory=dict, compare=False)


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
                topic_id=record.topic_id,
                partition=record.partition,
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
        case (
            RegisterBrokerRecord()
            | BrokerRegistrationChangeRecord()
            | UnregisterBrokerRecord()
            | TopicRecord()
            | RemoveTopicRecord()
            | PartitionRecord()
            | PartitionChangeRecord()
        ):
            return _replay_placement(image, record)


def _replay_placement(
    image: StreamMetadataImage,
    record: RegisterBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
    | TopicRecord
    | RemoveTopicRecord
    | PartitionRecord
    | PartitionChangeRecord,
) -> StreamMetadataImage:
    """Replay of the broker and placement records (KRaft's)."""
    match record:
        case RegisterBrokerRecord():
            registration = BrokerRegistration(
                record.node_id,
                record.node_epoch,
                record.rack,
                record.listeners,
                wal_config=record.wal_config,
            )
            return replace(image, brokers={**image.brokers, record.node_id: registration})
        case BrokerRegistrationChangeRecord():
            current = image.brokers.get(record.node_id)
            if current is None or current.node_epoch != record.node_epoch:
                return image  # a change to a registration that was replaced
            changed = replace(
                current,
                fenced=record.fenced,
                in_controlled_shutdown=record.in_controlled_shutdown,
            )
            return replace(image, brokers={**image.brokers, record.node_id: changed})
        case UnregisterBrokerRecord():
            current = image.brokers.get(record.node_id)
            if current is None or current.node_epoch != record.node_epoch:
                return image
            brokers = dict(image.brokers)
            del brokers[record.node_id]
            return replace(image, brokers=brokers)
        case TopicRecord():
            topic = TopicPlacement(record.topic_id, record.name)
            return replace(image, topics={**image.topics, record.topic_id: topic})
        case RemoveTopicRecord():
            topics = dict(image.topics)
            topics.pop(record.topic_id, None)
            return replace(image, topics=topics)
        case PartitionRecord() | PartitionChangeRecord():
            placed = image.topics.get(record.topic_id)
            if placed is None:
                return image
            if isinstance(record, PartitionChangeRecord) and record.partition not in (
                placed.partitions
            ):
                return image
            assignment = PartitionAssignment(record.leader, record.leader_epoch)
            placed = replace(placed, partitions={**placed.partitions, record.partition: assignment})
            return replace(image, topics={**image.topics, record.topic_id: placed})


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
                stream.topic_id,
                stream.partition,
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
    for broker in image.brokers.values():
        records.append(
            RegisterBrokerRecord(
                broker.node_id, broker.node_epoch, broker.rack, broker.listeners, broker.wal_config
            )
        )
        if broker.live or broker.in_controlled_shutdown:
            records.append(
                BrokerRegistrationChangeRecord(
                    broker.node_id, broker.node_epoch, broker.fenced, broker.in_controlled_shutdown
                )
            )
    for placed in image.topics.values():
        records.append(TopicRecord(placed.topic_id, placed.name))
        for index, assignment in placed.partitions.items():
            records.append(
                PartitionRecord(placed.topic_id, index, assignment.leader, assignment.leader_epoch)
            )
    return records
