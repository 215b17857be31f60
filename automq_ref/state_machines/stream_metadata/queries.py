"""Lookups on an image: the objects that hold a range of a stream (what a reader fetches), the
streams a node still holds open, the objects the lifecycle expires or removes; the live brokers,
where each partition lives and which streams are a partition's. Pure reads; the handlers use
some of them too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from automq_ref.state_machines.stream_metadata.events import (
    DEFAULT_PARAMS,
    OpeningStream,
    StreamErrorCode,
    StreamMetadataParams,
)
from automq_ref.state_machines.stream_metadata.image import (
    BrokerRegistration,
    PartitionAssignment,
    StreamMetadata,
    StreamMetadataImage,
    StreamSetObject,
    TopicPlacement,
)
from automq_ref.vocabulary.metadata_records import (
    S3ObjectState,
    StreamOffsetRange,
    StreamState,
)


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


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """An object holding offsets ``[start_offset, end_offset)`` of one stream."""

    object_id: int
    start_offset: int
    end_offset: int
    is_stream_object: bool


# Per stream id, the ranges the image's stream set objects hold of it (``stream_set_index``).
StreamSetIndex = Mapping[int, Collection[ObjectSlice]]


def stream_set_slices(stream_set_object: StreamSetObject) -> list[tuple[int, ObjectSlice]]:
    """Each range a stream set object holds, as (its stream id, the slice a reader fetches)."""
    return [
        (offset_range.stream_id, _stream_set_slice(stream_set_object, offset_range))
        for offset_range in stream_set_object.ranges
    ]


def _stream_set_slice(
    stream_set_object: StreamSetObject, offset_range: StreamOffsetRange
) -> ObjectSlice:
    return ObjectSlice(
        stream_set_object.object_id, offset_range.start_offset, offset_range.end_offset, False
    )


def stream_set_index(image: StreamMetadataImage) -> StreamSetIndex:
    """Every stream set object range of ``image``, by stream: one walk of every node's stream
    set objects, which ``stream_object_slices`` otherwise makes for each lookup. A reader that
    looks up many streams in one image computes this once and passes it along."""
    index: dict[int, list[ObjectSlice]] = {}
    for node in image.nodes.values():
        for stream_set_object in node.stream_set_objects.values():
            for stream_id, object_slice in stream_set_slices(stream_set_object):
                index.setdefault(stream_id, []).append(object_slice)
    return index


def stream_object_slices(
    image: StreamMetadataImage, stream_id: int, index: StreamSetIndex | None = None
) -> list[ObjectSlice]:
    """Every committed object range of a stream, stream objects and stream set objects alike.
    ``index``, if given, is ``stream_set_index(image)`` of this same image: the answer is the
    same, without walking every stream set object."""
    slices: list[ObjectSlice] = []
    stream = image.streams.get(stream_id)
    if stream is None:
        return slices
    for object_id, offset_range in stream.stream_objects.items():
        slices.append(
            ObjectSlice(object_id, offset_range.start_offset, offset_range.end_offset, True)
        )
    if index is not None:
        slices.extend(index.get(stream_id, ()))
    else:
        for node in image.nodes.values():
            for stream_set_object in node.stream_set_objects.values():
                for offset_range in stream_set_object.ranges:
                    if offset_range.stream_id == stream_id:
                        slices.append(_stream_set_slice(stream_set_object, offset_range))
    slices.sort(key=lambda s: (s.start_offset, s.end_offset))
    return slices


def get_objects(
    image: StreamMetadataImage,
    stream_id: int,
    start_offset: int,
    end_offset: int,
    limit: int,
    index: StreamSetIndex | None = None,
) -> tuple[StreamErrorCode, tuple[ObjectSlice, ...]]:
    """The objects that hold ``[start_offset, end_offset)``, in offset order, up to ``limit``.

    The walk stops at the first gap: if the result does not reach ``end_offset``, the image has
    not caught up with a commit yet (the reader retries on the next image). AutoMQ narrows the
    search with the owner of each range and the node's order ids; this walks every candidate,
    which gives the same answer. ``index``: as for ``stream_object_slices``.
    """
    stream = image.streams.get(stream_id)
    if stream is None:
        return StreamErrorCode.STREAM_NOT_EXIST, ()
    if start_offset < stream.start_offset:
        return StreamErrorCode.OFFSET_NOT_MATCHED, ()
    found: list[ObjectSlice] = []
    cursor = start_offset
    candidates = stream_object_slices(image, stream_id, index)
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


# ------------------------------------------------------------------------ brokers, placement


def live_brokers(image: StreamMetadataImage, now_ms: int | None = None) -> list[BrokerRegistration]:
    """Registered brokers that may hold partitions: unfenced and not shutting down, by id.

    With ``now_ms``, on the controller, also leave out a broker whose session (soft state) ended
    before then but that ``ExpireSessions`` has not fenced yet; an image without sessions (a
    broker's replica of the log) leaves none out."""
    found = []
    for broker in sorted(image.brokers.values(), key=lambda b: b.node_id):
        deadline = image.sessions.get(broker.node_id)
        lapsed = now_ms is not None and deadline is not None and deadline < now_ms
        if broker.live and not lapsed:
            found.append(broker)
    return found


def placed_topic(image: StreamMetadataImage, name: str) -> TopicPlacement | None:
    """The placement of topic ``name``, if the controller placed it."""
    for placed in image.topics.values():
        if placed.name == name:
            return placed
    return None


def partition_assignment(
    image: StreamMetadataImage, topic: str, partition: int
) -> PartitionAssignment | None:
    """Where partition ``partition`` of topic ``topic`` (a name) lives, and at which leader
    epoch its broker opens its streams; None if it is not placed."""
    placed = placed_topic(image, topic)
    return placed.partitions.get(partition) if placed is not None else None


def assigned_broker(image: StreamMetadataImage, topic: str, partition: int) -> int | None:
    """The broker a partition is assigned to (``NO_LEADER`` when no broker was live); None if
    the partition is not placed."""
    assignment = partition_assignment(image, topic, partition)
    return assignment.leader if assignment is not None else None


def broker_partitions(image: StreamMetadataImage, node_id: int) -> list[tuple[str, int, int]]:
    """(topic name, partition, leader epoch) of every partition assigned to ``node_id``: what
    that broker must hold open, each at its leader epoch."""
    return sorted(
        (placed.name, index, assignment.leader_epoch)
        for placed in image.topics.values()
        for index, assignment in placed.partitions.items()
        if assignment.leader == node_id
    )


def partition_streams(
    image: StreamMetadataImage, topic_id: str, partition: int
) -> list[StreamMetadata]:
    """The streams tagged with a partition, by id."""
    return sorted(
        (s for s in image.streams.values() if s.partition_key == (topic_id, partition)),
        key=lambda s: s.stream_id,
    )


def partition_leader(image: StreamMetadataImage, topic_id: str, partition: int) -> int | None:
    """The broker that holds the partition's streams open (the one leading it now), if any."""
    for stream in partition_streams(image, topic_id, partition):
        current = stream.current_range
        if stream.state is StreamState.OPENED and current is not None:
            return current.node_id
    return None
