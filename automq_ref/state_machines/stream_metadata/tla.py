"""Trace validation: an image as the variables of specs/StreamMetadata.tla (or of
specs/Placement.tla) and an event as the TLA+ action it stands for, in the trace format of
specs/trace_validate.py (docs/trace_validation.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from automq_ref.state_machines.stream_metadata.events import (
    CommitStreamSetObject,
    CreatePartitions,
    StreamMetadataEvent,
)
from automq_ref.state_machines.stream_metadata.image import (
    NO_EPOCH,
    StreamMetadata,
    StreamMetadataImage,
)
from automq_ref.vocabulary.metadata_records import NO_LEADER


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
    """The TLA+ action an event stands for in a trace: its class name, except the compaction
    form of ``CommitStreamSetObject`` (compacted objects named: a merge, a split or a pure
    cleanup), which the spec models as ``CommitStreamSetObjectCompaction``."""
    if isinstance(event, CommitStreamSetObject) and event.compacted_object_ids:
        return "CommitStreamSetObjectCompaction"
    return type(event).__name__


# ----------------------------------------------------------------------- specs/Placement.tla


def _partition_name(image: StreamMetadataImage, topic_id: str, index: int) -> object:
    """A partition as the trace names it: ``"<topic>-<index>"`` (``NoPartition`` if gone)."""
    placed = image.topics.get(topic_id)
    return f"{placed.name}-{index}" if placed is not None else {"model": "NoPartition"}


def _tla_broker(node_id: int) -> dict[str, object]:
    return tla_node(node_id) if node_id != NO_LEADER else {"model": "NoBroker"}


def tla_placement_state(image: StreamMetadataImage) -> dict[str, object]:
    """The image as the variables of specs/Placement.tla, in the trace format of
    specs/trace_validate.py.

    Brokers are the nodes the image knows (``n<id>``); one never registered is not listed,
    an unregistered one has no registration epoch (-1) and is fenced. Partitions are
    ``"<topic>-<index>"``, streams the ids of the streams tagged with a partition. Every
    variable is given for the keys the image knows only; ``trace_validate`` completes them over
    the batch's keys with the spec's initial values. Not observed, left to TLC: the history
    variables ``openers`` and ``strayOpen``."""
    node_ids = sorted(set(image.nodes) | set(image.brokers))
    brokers = [(node_id, image.brokers.get(node_id)) for node_id in node_ids]
    partitions = sorted(
        (f"{placed.name}-{index}", assignment)
        for placed in image.topics.values()
        for index, assignment in placed.partitions.items()
    )
    tagged = sorted(
        (stream_id, stream, key)
        for stream_id, stream in image.streams.items()
        if (key := stream.partition_key) is not None
    )
    return {
        "nodeEpoch": _tla_fn((tla_node(n), image.nodes[n].node_epoch) for n in node_ids),
        "regEpoch": _tla_fn((tla_node(n), b.node_epoch if b else NO_EPOCH) for n, b in brokers),
        "fenced": _tla_fn((tla_node(n), b is None or b.fenced) for n, b in brokers),
        "shutdown": _tla_fn(
            (tla_node(n), b is not None and b.in_controlled_shutdown) for n, b in brokers
        ),
        "leader": _tla_fn((name, _tla_broker(a.leader)) for name, a in partitions),
        "leaderEpoch": _tla_fn((name, a.leader_epoch) for name, a in partitions),
        "streamPartition": _tla_fn((s, _partition_name(image, *key)) for s, _, key in tagged),
        "streamState": _tla_fn((s, stream.state.name) for s, stream, _ in tagged),
        "streamEpoch": _tla_fn((s, stream.epoch) for s, stream, _ in tagged),
        "owner": _tla_fn(
            (s, _tla_broker(r.node_id if (r := stream.current_range) else NO_LEADER))
            for s, stream, _ in tagged
        ),
    }


def tla_placement_action(event: StreamMetadataEvent) -> str:
    """The action of specs/Placement.tla an event stands for: its class name, except
    ``CreatePartitions``, which the spec models as ``CreateTopic`` (new partitions)."""
    if isinstance(event, CreatePartitions):
        return "CreateTopic"
    return type(event).__name__
