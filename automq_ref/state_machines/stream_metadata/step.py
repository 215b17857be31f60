"""``step``: one request decided on the image. Each handler ``_on_<action>`` checks the request
against the image and either rejects it with an error code and no records, or accepts it with the
records that carry the decision; the records replayed give the next image. ``step`` turns the
decision into the transition's effects.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from automq_ref.formats.errors import FormatError
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.state_machines.stream_metadata import cluster
from automq_ref.state_machines.stream_metadata.cluster import with_soft_state
from automq_ref.state_machines.stream_metadata.decisions import (
    Decision,
    Outcome,
    accept,
    ignore_node,
    reject,
)
from automq_ref.state_machines.stream_metadata.events import (
    ANY_STREAM_EPOCH,
    DEFAULT_PARAMS,
    NO_OBJECT,
    AllocateProducerIds,
    AppendRecords,
    BalancePartitions,
    BrokerHeartbeat,
    CloseStream,
    CommitRange,
    CommitStreamObject,
    CommitStreamObjectEntry,
    CommitStreamSetObject,
    ControlledShutdown,
    CreatePartitions,
    CreateStream,
    CreateTopic,
    DeleteKV,
    DeleteStream,
    DeleteTopic,
    ElectLeaders,
    ExpireObject,
    ExpireSessions,
    FenceNode,
    OpenStream,
    PrepareObject,
    PutKV,
    ReassignPartition,
    RegisterNode,
    RemoveObject,
    Respond,
    Response,
    StreamErrorCode,
    StreamMetadataEvent,
    StreamMetadataParams,
    StreamMetadataTransition,
    TrimStream,
    UnregisterBroker,
)
from automq_ref.state_machines.stream_metadata.image import (
    NO_EPOCH,
    S3Object,
    StreamMetadata,
    StreamMetadataImage,
    replay_all,
)
from automq_ref.state_machines.stream_metadata.queries import (
    opening_streams,
)
from automq_ref.state_machines.transition import Transition
from automq_ref.vocabulary.metadata_records import (
    AssignedS3ObjectIdRecord,
    AssignedStreamIdRecord,
    KVRecord,
    MetadataRecord,
    NodeWALMetadataRecord,
    RangeRecord,
    RegisterBrokerRecord,
    RemoveKVRecord,
    RemoveRangeRecord,
    RemoveS3ObjectRecord,
    RemoveS3StreamObjectRecord,
    RemoveS3StreamRecord,
    RemoveStreamSetObjectRecord,
    S3ObjectRecord,
    S3ObjectState,
    S3StreamObjectRecord,
    S3StreamRecord,
    S3StreamSetObjectRecord,
    StreamOffsetRange,
    StreamState,
)
from automq_ref.vocabulary.naming import PRODUCER_ID_KEY


def step(
    image: StreamMetadataImage,
    event: StreamMetadataEvent,
    params: StreamMetadataParams = DEFAULT_PARAMS,
) -> StreamMetadataTransition:
    """Handle one request: decide, produce records, and replay them into the next image.

    The effects are ``AppendRecords(records)`` (when the decision writes any) and then
    ``Respond(response)``: the records must be durable before the next image is published and
    before the answer is released. A refusal is a ``Respond`` whose response carries the error
    code, with no records and the image unchanged. A heartbeat or a session tick may change
    only the controller's soft state (``image.sessions``, ``image.loads``): a new image with no
    records."""
    decision = _decide(image, event, params)
    appended = tuple(decision.records)
    after = replay_all(image, appended) if appended else image
    after = with_soft_state(after, decision)
    respond = Respond(decision.response)
    if not appended:
        return Transition(after, (respond,))
    return Transition(after, (AppendRecords(appended), respond))


def _decide(
    image: StreamMetadataImage, event: StreamMetadataEvent, params: StreamMetadataParams
) -> Decision:
    match event:
        case RegisterNode():
            return _on_register_node(image, event)
        case FenceNode():
            return Decision(*_on_fence_node(image, event))
        case CreateStream():
            return Decision(*_on_create_stream(image, event))
        case OpenStream():
            return Decision(*_on_open_stream(image, event))
        case CloseStream():
            return Decision(*_on_close_stream(image, event))
        case TrimStream():
            return Decision(*_on_trim_stream(image, event))
        case DeleteStream():
            return Decision(*_on_delete_stream(image, event))
        case PrepareObject():
            return Decision(*_on_prepare_object(image, event))
        case CommitStreamSetObject():
            return Decision(*_on_commit_stream_set_object(image, event))
        case CommitStreamObject():
            return Decision(*_on_commit_stream_object(image, event))
        case ExpireObject():
            return Decision(*_on_expire_object(image, event))
        case RemoveObject():
            return Decision(*_on_remove_object(image, event, params))
        case PutKV():
            return Decision(*_on_put_kv(image, event))
        case DeleteKV():
            return Decision(*_on_delete_kv(image, event))
        case AllocateProducerIds():
            return Decision(*_on_allocate_producer_ids(image, event))
        case BrokerHeartbeat():
            return cluster._on_broker_heartbeat(image, event, params)
        case ExpireSessions():
            return cluster._on_expire_sessions(image, event, params)
        case ControlledShutdown():
            return cluster._on_controlled_shutdown(image, event)
        case UnregisterBroker():
            return cluster._on_unregister_broker(image, event)
        case CreateTopic():
            return Decision(*cluster._on_create_topic(image, event))
        case CreatePartitions():
            return Decision(*cluster._on_create_partitions(image, event))
        case DeleteTopic():
            return Decision(*cluster._on_delete_topic(image, event))
        case ReassignPartition():
            return Decision(*cluster._on_reassign_partition(image, event))
        case ElectLeaders():
            return Decision(*cluster._on_elect_leaders(image, event))
        case BalancePartitions():
            return Decision(*cluster._on_balance_partitions(image, event, params))


# ------------------------------------------------------------------------------- nodes


def _on_register_node(image: StreamMetadataImage, event: RegisterNode) -> Decision:
    # Never refused: the granted epoch is above every epoch stored for the node, whatever the
    # node proposed (a clock that went backwards, a retried registration).
    node = image.nodes.get(event.node_id)
    stored = node.node_epoch if node is not None else NO_EPOCH
    granted = max(event.node_epoch, stored + 1)
    registration: list[MetadataRecord] = [
        NodeWALMetadataRecord(event.node_id, granted, False),
        # The new incarnation starts fenced; what the previous one held moves to live brokers.
        RegisterBrokerRecord(event.node_id, granted, event.rack, event.listeners, event.wal_config),
    ]
    records = cluster.departure_records(image, registration)
    response = Response(node_epoch=granted, opening_streams=opening_streams(image, event.node_id))
    sessions = {n: deadline for n, deadline in image.sessions.items() if n != event.node_id}
    return Decision(records, response, sessions=sessions)


def _on_fence_node(image: StreamMetadataImage, event: FenceNode) -> Outcome:
    node = image.nodes.get(event.node_id)
    if node is None:
        return reject(StreamErrorCode.NODE_EPOCH_NOT_EXIST, f"node {event.node_id} unknown")
    if node.node_epoch > event.node_epoch:
        # The node restarted meanwhile: it recovers by itself, there is nothing to take over.
        return reject(
            StreamErrorCode.NODE_EPOCH_EXPIRED,
            f"node {event.node_id} epoch {event.node_epoch} is older than {node.node_epoch}",
        )
    records: list[MetadataRecord] = [NodeWALMetadataRecord(event.node_id, event.node_epoch, True)]
    return accept(records, opening_streams=opening_streams(image, event.node_id))


# ---------------------------------------------------------------------------------- streams


def _on_create_stream(image: StreamMetadataImage, event: CreateStream) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    if (ignored := cluster.ignore_partition_create(image, event)) is not None:
        return ignored
    stream_id = image.next_stream_id
    records: list[MetadataRecord] = [
        AssignedStreamIdRecord(stream_id),
        S3StreamRecord(
            stream_id, NO_EPOCH, -1, 0, StreamState.CLOSED, event.topic_id, event.partition
        ),
    ]
    return accept(records, stream_id=stream_id)


def _stream_record(
    stream: StreamMetadata,
    *,
    epoch: int | None = None,
    range_index: int | None = None,
    start_offset: int | None = None,
    state: StreamState | None = None,
) -> S3StreamRecord:
    """The stream's S3StreamRecord with some fields changed; its tags always repeated."""
    return S3StreamRecord(
        stream.stream_id,
        stream.epoch if epoch is None else epoch,
        stream.range_index if range_index is None else range_index,
        stream.start_offset if start_offset is None else start_offset,
        stream.state if state is None else state,
        stream.topic_id,
        stream.partition,
    )


def _on_open_stream(image: StreamMetadataImage, event: OpenStream) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {event.stream_id} not found")
    if (ignored := cluster.ignore_partition_open(image, stream, event)) is not None:
        return ignored
    if stream.epoch > event.stream_epoch:
        return reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {event.stream_id} epoch {event.stream_epoch} < current {stream.epoch}",
        )
    if stream.epoch == event.stream_epoch:
        # A retried open: fine for the owner of the current range, at the same range.
        current = stream.current_range
        if current is None:
            return reject(StreamErrorCode.STREAM_INNER_ERROR, "stream has no current range")
        if current.node_id != event.node_id:
            return reject(
                StreamErrorCode.STREAM_FENCED,
                f"stream {event.stream_id} epoch {stream.epoch} is owned by node {current.node_id}",
            )
        records: list[MetadataRecord] = []
        if stream.state is StreamState.CLOSED:
            records.append(_stream_record(stream, state=StreamState.OPENED))
        return accept(records, start_offset=stream.start_offset, next_offset=stream.end_offset)
    if stream.state is StreamState.OPENED:
        return reject(
            StreamErrorCode.STREAM_NOT_CLOSED,
            f"stream {event.stream_id} is still open at epoch {stream.epoch}",
        )
    end = stream.end_offset
    new_index = stream.range_index + 1
    records = [
        _stream_record(
            stream, epoch=event.stream_epoch, range_index=new_index, state=StreamState.OPENED
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
    return accept(records, start_offset=stream.start_offset, next_offset=end)


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
) -> Outcome | None:
    """The ownership check of close, trim and delete, as AutoMQ's controller does it.

    The stream must exist, the request must carry exactly the stream's epoch (an older one is
    fenced, a newer one is an inner error) and the caller must own the current range.
    """
    if stream is None:
        return reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {stream_id} not found")
    if stream.epoch > stream_epoch:
        return reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {stream_id} epoch {stream_epoch} < current {stream.epoch}",
        )
    if stream.epoch < stream_epoch:
        return reject(
            StreamErrorCode.STREAM_INNER_ERROR,
            f"stream {stream_id} epoch {stream_epoch} > current {stream.epoch}",
        )
    current = stream.current_range
    if current is None or current.node_id != node_id:
        return reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {stream_id} is not owned by node {node_id}",
        )
    return None


def _on_close_stream(image: StreamMetadataImage, event: CloseStream) -> Outcome:
    # Close skips the failover check: a survivor closes a failed node's streams as that node.
    ignored = ignore_node(image, event.node_id, event.node_epoch, check_failover=False)
    if ignored is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if ignored := _ignore_owner(stream, event.stream_id, event.node_id, event.stream_epoch):
        return ignored
    assert stream is not None
    if stream.state is StreamState.CLOSED:
        return accept([])
    records: list[MetadataRecord] = [_stream_record(stream, state=StreamState.CLOSED)]
    return accept(records)


def _on_trim_stream(image: StreamMetadataImage, event: TrimStream) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if ignored := _ignore_owner(stream, event.stream_id, event.node_id, event.stream_epoch):
        return ignored
    assert stream is not None
    if stream.state is StreamState.CLOSED:
        return reject(StreamErrorCode.STREAM_NOT_OPENED, f"stream {event.stream_id} is closed")
    new_start = event.new_start_offset
    if new_start < stream.start_offset:
        return reject(
            StreamErrorCode.OFFSET_NOT_MATCHED,
            f"trim to {new_start} is below the stream start {stream.start_offset}",
        )
    if new_start == stream.start_offset:
        return accept([])
    records: list[MetadataRecord] = [_stream_record(stream, start_offset=new_start)]
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
    return accept(records)


def _on_delete_stream(image: StreamMetadataImage, event: DeleteStream) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return accept([])
    if stream.state is not StreamState.CLOSED:
        return reject(StreamErrorCode.STREAM_NOT_CLOSED, f"stream {event.stream_id} is open")
    if stream.epoch > event.stream_epoch:
        return reject(
            StreamErrorCode.STREAM_FENCED,
            f"stream {event.stream_id} epoch {event.stream_epoch} < current {stream.epoch}",
        )
    records: list[MetadataRecord] = [RemoveS3StreamRecord(stream.stream_id)]
    for object_id in sorted(stream.stream_objects):
        records.append(_mark_destroyed(image.objects[object_id], event.now_ms))
    return accept(records)


# ---------------------------------------------------------------------------------- objects


def _mark_destroyed(s3_object: S3Object, now_ms: int) -> S3ObjectRecord:
    return S3ObjectRecord(
        s3_object.object_id,
        s3_object.object_size,
        S3ObjectState.MARK_DESTROYED,
        now_ms,
        s3_object.attributes,
    )


def _on_prepare_object(image: StreamMetadataImage, event: PrepareObject) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    if event.count < 1 or event.ttl_ms < 0:
        return reject(
            StreamErrorCode.INVALID_REQUEST,
            f"prepare needs count >= 1 and ttl >= 0, got {event.count} and {event.ttl_ms}",
        )
    first = image.next_object_id
    records: list[MetadataRecord] = [AssignedS3ObjectIdRecord(first + event.count - 1)]
    deadline = event.now_ms + event.ttl_ms
    for object_id in range(first, first + event.count):
        records.append(S3ObjectRecord(object_id, 0, S3ObjectState.PREPARED, deadline))
    return accept(records, first_object_id=first)


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
) -> Outcome | None:
    """Every (stream, epoch, start, end) must extend its stream exactly at its end offset."""
    expected_end: dict[int, int] = {}
    for stream_id, stream_epoch, start, end in sorted(entries, key=lambda e: (e[0], e[2])):
        if start >= end:
            return reject(
                StreamErrorCode.INVALID_REQUEST,
                f"stream {stream_id}: empty or inverted range [{start}, {end})",
            )
        stream = image.streams.get(stream_id)
        if stream is None:
            continue  # deleted meanwhile: its data is dropped later by compaction
        if end <= stream.start_offset:
            continue  # wholly trimmed: accepted, moves nothing
        if stream.state is not StreamState.OPENED:
            return reject(StreamErrorCode.STREAM_NOT_OPENED, f"stream {stream_id} is closed")
        current = stream.current_range
        if current is None:
            return reject(StreamErrorCode.STREAM_INNER_ERROR, f"stream {stream_id} has no range")
        if current.node_id != node_id or (
            stream_epoch != ANY_STREAM_EPOCH and stream_epoch != stream.epoch
        ):
            return reject(
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
            return reject(
                StreamErrorCode.OFFSET_NOT_MATCHED,
                f"stream {stream_id}: commit starts at {start}, stream ends at {stream_end}",
            )
        expected_end[stream_id] = end
    return None


def _redundant_stream_set_object(
    image: StreamMetadataImage, event: CommitStreamSetObject
) -> Outcome | None:
    """A retried commit of a stream set object that is already in: success, nothing to do."""
    s3_object = image.objects.get(event.object_id)
    if s3_object is None or s3_object.state is not S3ObjectState.COMMITTED:
        return None
    node = image.nodes.get(event.node_id)
    existing = node.stream_set_objects.get(event.object_id) if node is not None else None
    if existing is not None and existing.ranges == _offset_ranges(event.stream_ranges):
        return accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    return reject(
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
) -> tuple[list[CommitStreamObjectEntry], Outcome | None]:
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
            return [], reject(
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
) -> Outcome:
    ignored = ignore_node(
        image, event.node_id, event.node_epoch, check_failover=not event.failover_mode
    )
    if ignored is not None:
        return ignored
    # A compaction may produce nothing: its sources held only dropped data.
    if event.object_id == NO_OBJECT and not event.stream_objects and not event.compacted_object_ids:
        return reject(StreamErrorCode.INVALID_REQUEST, "commit of nothing")
    if event.object_id != NO_OBJECT and (redundant := _redundant_stream_set_object(image, event)):
        return redundant
    stream_objects, refused = _split_redundant_stream_objects(image, event.stream_objects)
    if refused is not None:
        return refused
    if event.object_id == NO_OBJECT and event.stream_objects and not stream_objects:
        return accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    records: list[MetadataRecord] = []
    if event.object_id != NO_OBJECT:
        outcome, record = _commit_object(image, event.object_id, event.object_size, event.now_ms)
        if record is None:
            return reject(outcome, f"object {event.object_id} cannot be committed")
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
            return reject(
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
            return reject(
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
            return reject(outcome, f"stream object {entry.object_id} cannot be committed")
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
    return accept(records)


def _on_commit_stream_object(image: StreamMetadataImage, event: CommitStreamObject) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    stream = image.streams.get(event.stream_id)
    if stream is None:
        return reject(StreamErrorCode.STREAM_NOT_EXIST, f"stream {event.stream_id} not found")
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
            return accept([], error=StreamErrorCode.REDUNDANT_OPERATION)
    sources = [stream.stream_objects.get(object_id) for object_id in event.source_object_ids]
    ordered = sorted((s for s in sources if s is not None), key=lambda s: s.start_offset)
    if not sources or len(ordered) != len(sources):
        return reject(
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
        return reject(
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
            return reject(outcome, f"object {event.object_id} cannot be committed")
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
    return accept(records)


def _on_expire_object(image: StreamMetadataImage, event: ExpireObject) -> Outcome:
    s3_object = image.objects.get(event.object_id)
    if s3_object is None or s3_object.state is not S3ObjectState.PREPARED:
        return reject(StreamErrorCode.OBJECT_NOT_EXIST, f"object {event.object_id} not prepared")
    if event.now_ms <= s3_object.timestamp_ms:
        return reject(
            StreamErrorCode.INVALID_REQUEST,
            f"object {event.object_id} expires at {s3_object.timestamp_ms}, now {event.now_ms}",
        )
    return accept([_mark_destroyed(s3_object, event.now_ms)])


def _on_remove_object(
    image: StreamMetadataImage, event: RemoveObject, params: StreamMetadataParams
) -> Outcome:
    s3_object = image.objects.get(event.object_id)
    if s3_object is None:
        return accept([])
    if s3_object.state is not S3ObjectState.MARK_DESTROYED:
        return reject(StreamErrorCode.INVALID_REQUEST, f"object {event.object_id} is not destroyed")
    if event.now_ms < s3_object.timestamp_ms + params.object_retention_ms:
        return reject(
            StreamErrorCode.INVALID_REQUEST,
            f"object {event.object_id} is retained until "
            f"{s3_object.timestamp_ms + params.object_retention_ms}",
        )
    return accept([RemoveS3ObjectRecord(event.object_id)])


# --------------------------------------------------------------------- KV and producer ids


def _on_put_kv(image: StreamMetadataImage, event: PutKV) -> Outcome:
    existing = image.kv.get(event.key)
    if event.expected is not None and existing != event.expected:
        return _reject_value(event.key, existing)
    if existing is not None and not event.overwrite:
        return accept([], error=StreamErrorCode.KEY_EXIST, value=existing)
    return accept([KVRecord(event.key, event.value)], value=event.value)


def _on_delete_kv(image: StreamMetadataImage, event: DeleteKV) -> Outcome:
    existing = image.kv.get(event.key)
    if event.expected is not None and existing != event.expected:
        return _reject_value(event.key, existing)
    if existing is None:
        return accept([])
    return accept([RemoveKVRecord(event.key)], value=existing)


def _reject_value(key: str, existing: bytes | None) -> Outcome:
    """A conditional request lost: answer the value the key holds now, so the caller can
    decide again on it without another read."""
    found = "no value" if existing is None else f"another value ({len(existing)} bytes)"
    message = f"KV {key!r} holds {found}"
    return [], Response(error=StreamErrorCode.VALUE_NOT_MATCHED, message=message, value=existing)


def _on_allocate_producer_ids(image: StreamMetadataImage, event: AllocateProducerIds) -> Outcome:
    if (ignored := ignore_node(image, event.node_id, event.node_epoch)) is not None:
        return ignored
    if event.count < 1:
        return reject(StreamErrorCode.INVALID_REQUEST, f"a block of {event.count} producer ids")
    raw = image.kv.get(PRODUCER_ID_KEY)
    try:
        first = decode_kv_integer(raw, "next producer id") if raw is not None else 0
    except FormatError as error:
        return reject(StreamErrorCode.STREAM_INNER_ERROR, str(error))
    if first < 0:
        return reject(StreamErrorCode.STREAM_INNER_ERROR, f"next producer id {first} < 0")
    records: list[MetadataRecord] = [
        KVRecord(PRODUCER_ID_KEY, encode_kv_integer(first + event.count))
    ]
    return accept(records, first_producer_id=first)
