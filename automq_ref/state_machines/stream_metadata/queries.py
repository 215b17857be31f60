"""Lookups on an image: the objects that hold a range of a stream (what a reader fetches), the
streams a node still holds open, the objects the lifecycle expires or removes. Pure reads; the
handlers use some of them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from automq_ref.state_machines.stream_metadata.events import (
    DEFAULT_PARAMS,
    OpeningStream,
    StreamErrorCode,
    StreamMetadataParams,
)
from automq_ref.state_machines.stream_metadata.image import (
    StreamMetadataImage,
)
from automq_ref.vocabulary.metadata_records import (
    S3ObjectState,
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
