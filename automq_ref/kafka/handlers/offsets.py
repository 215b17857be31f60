"""ListOffsets, OffsetForLeaderEpoch and DeleteRecords: questions about, and the trimming of, a
partition's offsets.

ListOffsets answers the earliest (-2, and -4/-5: local and tiered are the same here), the latest
(-1; the last stable offset for READ_COMMITTED, ``isolation_level`` 1), the record with the
largest timestamp (-3), or the first record at or after a timestamp; a record found (-3 or a
timestamp) at or past the last fetchable offset (the last stable offset for READ_COMMITTED, the
high watermark otherwise) is answered as none, offset and timestamp -1, as Kafka's
``Partition.fetchOffsetForTimestamp`` filters it. DeleteRecords moves a
partition's log start forward (-1: to the high watermark); an internal topic's is refused
``INVALID_TOPIC_EXCEPTION``, as Kafka refuses it. ListOffsets for a partition placed on this
broker but not open yet (moved here, its open waiting for the old broker's or a failover's
close) waits for the open first, up to ``partition.open.wait.ms``.

With an authorizer, a partition of a topic the principal may not DESCRIBE (ListOffsets,
OffsetForLeaderEpoch: CLUSTER_ACTION on the cluster, a broker's, allows every topic) or DELETE
(DeleteRecords) is answered TOPIC_AUTHORIZATION_FAILED, before any other check, as Kafka does.
"""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import iter_batches
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    cluster_allowed,
    denied,
)
from automq_ref.kafka.handlers.partition_snapshot import snapshot_partition
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    DeleteRecordsPartition,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    EpochEndOffset,
    EpochEndOffsetTopic,
    ListOffsetsPartition,
    ListOffsetsResponse,
    ListOffsetsTopic,
    OffsetForLeaderEpochResponse,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.kafka.snapshot_read import SnapshotPartition
from automq_ref.vocabulary.naming import is_internal_topic

DENIED = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED


async def handle_list_offsets(context: Context, request: Request) -> Reply:
    partitions_by_key = context.topics.partitions
    opening = [
        (list_topic.name, int(list_partition.partition_index))
        for list_topic in request.body.topics
        for list_partition in list_topic.partitions
        if context.topics.opening(list_topic.name, int(list_partition.partition_index))
    ]
    if opening:
        await context.topics.wait_opened(opening, context.config.partition_open_wait_ms / 1000)
    # READ_COMMITTED (v2+): the latest offset is the last stable offset.
    committed = int(getattr(request.body, "isolation_level", 0)) == 1
    names = (t.name for t in request.body.topics)
    hidden = denied(context, request, AclOperation.DESCRIBE, ResourceType.TOPIC, names)
    topics = []
    for list_topic in request.body.topics:
        partitions = []
        for list_partition in list_topic.partitions:
            index = int(list_partition.partition_index)
            if list_topic.name in hidden:
                partitions.append(ListOffsetsPartition(index, error_code=DENIED))
                continue
            partition = partitions_by_key.get((list_topic.name, index))
            if partition is None:
                # A proxy answers for its main's partition, from its snapshot-read copy.
                proxied = snapshot_partition(context, request, list_topic.name, index)
                if proxied is not None and int(list_partition.timestamp) in (-1, -2, -4, -5):
                    offset, timestamp = await _list_offset(
                        proxied, int(list_partition.timestamp), committed
                    )
                    partitions.append(
                        ListOffsetsPartition(
                            index, timestamp=timestamp, offset=offset, leader_epoch=proxied.epoch
                        )
                    )
                    continue
                code = context.topics.not_here(list_topic.name, index)
                partitions.append(ListOffsetsPartition(index, error_code=code))
                continue
            epoch = partition.epoch
            offset, timestamp = await _list_offset(
                partition, int(list_partition.timestamp), committed
            )
            if offset < 0:
                epoch = -1  # none found: Kafka answers no leader epoch either
            partitions.append(
                ListOffsetsPartition(index, timestamp=timestamp, offset=offset, leader_epoch=epoch)
            )
        topics.append(ListOffsetsTopic(list_topic.name, partitions))
    return respond(request, ListOffsetsResponse(topics))


async def _list_offset(
    partition: Partition | SnapshotPartition, timestamp: int, committed: bool = False
) -> tuple[int, int]:
    if timestamp in (-2, -4, -5):  # earliest; earliest local; earliest tiered
        return partition.log_start_offset, -1
    if timestamp == -1:  # latest
        if committed:  # a snapshot-read copy knows the leader's LSO at its high watermark
            return partition.last_stable_offset, -1
        return partition.high_watermark, -1
    assert isinstance(partition, Partition)  # a snapshot-read copy answers the two above
    # A record found must be fetchable at the request's isolation level: below the last
    # stable offset for READ_COMMITTED (not in a transaction still open), else below the high
    # watermark; one at or past it is answered as none (Kafka's lastFetchableOffset filter).
    fetchable = partition.last_stable_offset if committed else partition.high_watermark
    if timestamp == -3:  # the record with the largest timestamp
        found = partition.max_timestamp_offset()
        if found is None:
            return -1, -1
        batch_last, max_timestamp = found
        offset, at = await _record_at_timestamp(partition, batch_last, max_timestamp, exact=True)
    else:
        located = partition.offset_for_timestamp(timestamp)
        if located is None:
            return -1, -1
        batch_offset, _ = located
        offset, at = await _record_at_timestamp(partition, batch_offset, timestamp, exact=False)
    return (offset, at) if offset < fetchable else (-1, -1)


async def _record_at_timestamp(
    partition: Partition, offset: int, timestamp: int, *, exact: bool
) -> tuple[int, int]:
    """The first record of the batch at ``offset`` whose timestamp is >= (or, ``exact``, ==)
    ``timestamp``."""
    chunks = await partition.read(offset, 1)
    for chunk in chunks:
        for view in iter_batches(chunk, verify_crc=False, compacted=True):
            for record in view.records():
                if record.offset < partition.log_start_offset:
                    continue
                if (record.timestamp == timestamp) if exact else (record.timestamp >= timestamp):
                    return record.offset, record.timestamp
    return -1, -1


async def handle_offset_for_leader_epoch(context: Context, request: Request) -> Reply:
    partitions_by_key = context.topics.partitions
    hidden = frozenset[str]()
    if not cluster_allowed(context, request, AclOperation.CLUSTER_ACTION):
        names = (t.topic for t in request.body.topics)
        hidden = denied(context, request, AclOperation.DESCRIBE, ResourceType.TOPIC, names)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for asked in topic.partitions:
            index = int(asked.partition)
            if topic.topic in hidden:
                partitions.append(EpochEndOffset(index, DENIED))
                continue
            partition: Partition | SnapshotPartition | None = partitions_by_key.get(
                (topic.topic, index)
            )
            if partition is None:
                # A proxy answers for its main's partition, from its snapshot-read copy.
                partition = snapshot_partition(context, request, topic.topic, index)
            current_epoch = int(asked.current_leader_epoch)
            if partition is None:
                code = context.topics.not_here(topic.topic, index)
                partitions.append(EpochEndOffset(index, error_code=code))
            elif 0 <= current_epoch < partition.epoch:
                partitions.append(EpochEndOffset(index, KafkaErrorCode.FENCED_LEADER_EPOCH))
            elif current_epoch > partition.epoch:
                partitions.append(EpochEndOffset(index, KafkaErrorCode.UNKNOWN_LEADER_EPOCH))
            else:
                epoch, end = partition.end_offset_for_epoch(int(asked.leader_epoch))
                partitions.append(EpochEndOffset(index, leader_epoch=epoch, end_offset=end))
        topics.append(EpochEndOffsetTopic(topic.topic, partitions))
    return respond(request, OffsetForLeaderEpochResponse(topics))


async def handle_delete_records(context: Context, request: Request) -> Reply:
    partitions_by_key = context.topics.partitions
    names = (t.name for t in request.body.topics)
    hidden = denied(context, request, AclOperation.DELETE, ResourceType.TOPIC, names)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for asked in topic.partitions:
            index = int(asked.partition_index)
            partition = partitions_by_key.get((topic.name, index))
            if topic.name in hidden:
                partitions.append(DeleteRecordsPartition(index, error_code=DENIED))
                continue
            if is_internal_topic(topic.name):
                # Kafka: "Cannot delete records of internal topic" (its log is a coordinator's).
                code = KafkaErrorCode.INVALID_TOPIC_EXCEPTION
                partitions.append(DeleteRecordsPartition(index, error_code=code))
                continue
            if partition is None:
                code = context.topics.not_here(topic.name, index)
                partitions.append(DeleteRecordsPartition(index, error_code=code))
                continue
            offset = int(asked.offset)
            offset = partition.high_watermark if offset == -1 else offset
            if offset < 0 or offset > partition.high_watermark:
                partitions.append(
                    DeleteRecordsPartition(index, error_code=KafkaErrorCode.OFFSET_OUT_OF_RANGE)
                )
                continue
            if offset > partition.log_start_offset:
                await partition.trim(offset)
            partitions.append(DeleteRecordsPartition(index, partition.log_start_offset))
        topics.append(DeleteRecordsTopic(topic.name, partitions))
    return respond(request, DeleteRecordsResponse(topics))
