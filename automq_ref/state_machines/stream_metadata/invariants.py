"""The specs' safety invariants (specs/StreamMetadata.tla, then specs/Placement.tla) as checks on
an image; the property tests run ``check_invariants`` after every step.
"""

from __future__ import annotations

import itertools
from typing import Final

from automq_ref.state_machines.stream_metadata.image import (
    StreamMetadataImage,
)
from automq_ref.state_machines.stream_metadata.queries import (
    live_brokers,
    partition_streams,
    stream_object_slices,
)
from automq_ref.state_machines.transition import InvariantViolation
from automq_ref.vocabulary.metadata_records import (
    NO_LEADER,
    S3ObjectState,
    StreamState,
)


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


# ------------------------------------------------------------------- specs/Placement.tla


def inv_partitions_on_live_brokers(image: StreamMetadataImage) -> None:
    """PartitionsOnLiveBrokers: every partition is assigned to a live broker (registered,
    unfenced, not shutting down) or to one draining in a controlled shutdown (its partitions
    leave it in batches), or to none when no broker is live."""
    live = {broker.node_id for broker in live_brokers(image)}
    draining = {b.node_id for b in image.brokers.values() if b.in_controlled_shutdown}
    for placed in image.topics.values():
        for index, assignment in placed.partitions.items():
            if assignment.leader == NO_LEADER and not live:
                continue
            if assignment.leader not in live | draining:
                raise InvariantViolation(
                    f"{placed.name}-{index} is on broker {assignment.leader}; live: {sorted(live)}"
                )


def inv_one_owner_per_partition(image: StreamMetadataImage) -> None:
    """OneOwnerPerPartition: a partition's open streams are all on one broker, and a stream
    open at the partition's leader epoch is on the partition's broker; no stream of it is at
    a higher epoch."""
    for placed in image.topics.values():
        for index, assignment in placed.partitions.items():
            owners = set()
            for stream in partition_streams(image, placed.topic_id, index):
                if stream.epoch > assignment.leader_epoch:
                    raise InvariantViolation(
                        f"{placed.name}-{index}: stream {stream.stream_id} at epoch "
                        f"{stream.epoch} > leader epoch {assignment.leader_epoch}"
                    )
                current = stream.current_range
                if stream.state is not StreamState.OPENED or current is None:
                    continue
                owners.add(current.node_id)
                if stream.epoch == assignment.leader_epoch and current.node_id != (
                    assignment.leader
                ):
                    raise InvariantViolation(
                        f"{placed.name}-{index}: stream {stream.stream_id} open on "
                        f"{current.node_id} at the leader epoch of broker {assignment.leader}"
                    )
            if len(owners) > 1:
                raise InvariantViolation(f"{placed.name}-{index} is open on {sorted(owners)}")


def inv_single_opener_per_epoch(image: StreamMetadataImage) -> None:
    """SingleOpenerPerEpoch: all the ranges that a partition's streams hold at one epoch
    belong to one broker: two brokers never opened the same partition at the same epoch."""
    for placed in image.topics.values():
        for index in placed.partitions:
            openers: dict[int, int] = {}
            for stream in partition_streams(image, placed.topic_id, index):
                for stream_range in stream.ranges.values():
                    opener = openers.setdefault(stream_range.epoch, stream_range.node_id)
                    if opener != stream_range.node_id:
                        raise InvariantViolation(
                            f"{placed.name}-{index} opened at epoch {stream_range.epoch} by "
                            f"{opener} and {stream_range.node_id}"
                        )


PLACEMENT_INVARIANTS: Final = (
    inv_partitions_on_live_brokers,
    inv_one_owner_per_partition,
    inv_single_opener_per_epoch,
)


def check_invariants(image: StreamMetadataImage) -> None:
    for invariant in (*INVARIANTS, *PLACEMENT_INVARIANTS):
        invariant(image)
