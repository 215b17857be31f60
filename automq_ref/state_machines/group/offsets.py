"""Committed offsets: OffsetCommit (answered once ``OffsetsPersisted`` says the write is durable,
or failed by ``OffsetsPersistFailed``), OffsetFetch, and ``recover``, which folds the durable
records back into a state after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.events import (
    NO_LEADER_EPOCH,
    NO_OFFSET,
    UNKNOWN_MEMBER_ID,
    Error,
    OffsetCommit,
    OffsetFetch,
    OffsetsPersisted,
    OffsetsPersistFailed,
    TopicPartition,
)
from automq_ref.state_machines.group.rebalance import (
    _heartbeat,
    _validate_current_member,
)
from automq_ref.state_machines.group.responses import (
    DurableRecord,
    FetchedOffset,
    OffsetCommitPartitionResult,
    OffsetCommitResponse,
    OffsetFetchGroupResult,
    OffsetFetchResponse,
    OffsetRecord,
    PersistGroupDeletion,
    PersistOffsets,
    Respond,
)
from automq_ref.state_machines.group.state import (
    CommittedOffset,
    CoordinatorState,
    Group,
    GroupParams,
    GroupState,
    GroupTransition,
    PendingWrite,
    _respond,
    _with_group,
)
from automq_ref.state_machines.transition import Transition

# ===================================================================================== OffsetCommit


def _commit_error(event: OffsetCommit, error: KafkaErrorCode) -> Respond:
    keys = dict.fromkeys((entry.topic, entry.partition) for entry in event.offsets)
    results = tuple(OffsetCommitPartitionResult(t, p, error) for t, p in keys)
    return Respond(event.request_id, OffsetCommitResponse(results))


def _validate_offset_commit(group: Group, event: OffsetCommit) -> KafkaErrorCode | None:
    if (
        event.generation_id >= 0
        or event.member_id != UNKNOWN_MEMBER_ID
        or event.group_instance_id is not None
    ):
        error = _validate_current_member(group, event.member_id, event.group_instance_id)
        if error is None and event.generation_id != group.generation_id:
            error = Error.ILLEGAL_GENERATION
        return error
    if group.state is not GroupState.EMPTY:
        return Error.UNKNOWN_MEMBER_ID  # only members commit for a group that has members
    return None


def _on_offset_commit(
    state: CoordinatorState, event: OffsetCommit, params: GroupParams
) -> GroupTransition:
    group = state.groups.get(event.group_id)
    if group is None:
        if event.generation_id >= 0:
            return _respond(state, _commit_error(event, Error.ILLEGAL_GENERATION))
        group = Group(event.group_id)  # a standalone consumer's group: created Empty
        state = _with_group(state, group)
    error = _validate_offset_commit(group, event)
    if error is None and group.state is GroupState.COMPLETING_REBALANCE:
        error = Error.REBALANCE_IN_PROGRESS
    if error is not None:
        return _respond(state, _commit_error(event, error))
    if event.member_id in group.members:
        state = _with_group(state, _heartbeat(group, event.member_id, state.now_ms))
    results: dict[TopicPartition, KafkaErrorCode] = {}
    accepted: dict[TopicPartition, CommittedOffset] = {}
    seq = state.next_write_seq
    for entry in event.offsets:
        key = (entry.topic, entry.partition)
        if len(entry.metadata) > params.offset_metadata_max_bytes:
            results[key] = Error.OFFSET_METADATA_TOO_LARGE
            accepted.pop(key, None)
        else:
            results[key] = Error.NONE
            accepted[key] = CommittedOffset(
                entry.offset, entry.leader_epoch, entry.metadata, state.now_ms, seq
            )
    response = OffsetCommitResponse(
        tuple(OffsetCommitPartitionResult(t, p, error) for (t, p), error in results.items())
    )
    if not accepted:
        return _respond(state, Respond(event.request_id, response))
    failure = OffsetCommitResponse(
        tuple(
            OffsetCommitPartitionResult(
                t, p, Error.COORDINATOR_NOT_AVAILABLE if (t, p) in accepted else error
            )
            for (t, p), error in results.items()
        )
    )
    write = PendingWrite(seq, (event.group_id,), tuple(accepted.items()), response, failure)
    state = replace(
        state,
        pending_writes={**state.pending_writes, event.request_id: write},
        next_write_seq=seq + 1,
    )
    records = tuple(
        OffsetRecord(t, p, c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms)
        for (t, p), c in accepted.items()
    )
    return Transition(state, (PersistOffsets(event.request_id, event.group_id, records),))


def _on_offsets_persisted(state: CoordinatorState, event: OffsetsPersisted) -> GroupTransition:
    write = state.pending_writes[event.request_id]  # step refuses a completion for no write
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    offsets = dict(state.offsets)
    if write.offsets:
        (group_id,) = write.group_ids
        committed = dict(offsets.get(group_id, {}))
        for key, offset in write.offsets:
            current = committed.get(key)
            if current is None or current.write_seq < offset.write_seq:
                committed[key] = offset
        offsets[group_id] = committed
    state = replace(state, pending_writes=pending, offsets=offsets)
    return Transition(state, (Respond(event.request_id, write.response),))


def _on_offsets_persist_failed(
    state: CoordinatorState, event: OffsetsPersistFailed
) -> GroupTransition:
    write = state.pending_writes[event.request_id]  # step refuses a completion for no write
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    state = replace(state, pending_writes=pending)
    return Transition(state, (Respond(event.request_id, write.failure_response),))


# ====================================================================================== OffsetFetch


def committed_offset(state: CoordinatorState, group_id: str, key: TopicPartition) -> FetchedOffset:
    committed = state.offsets.get(group_id, {}).get(key)
    if committed is None:
        return FetchedOffset(key[0], key[1], NO_OFFSET, NO_LEADER_EPOCH, "")
    return FetchedOffset(
        key[0], key[1], committed.offset, committed.leader_epoch, committed.metadata
    )


def _on_offset_fetch(state: CoordinatorState, event: OffsetFetch) -> GroupTransition:
    results: list[OffsetFetchGroupResult] = []
    for request in event.groups:
        # Answered whatever the group's state: standalone consumers have no group to speak of.
        keys = request.partitions
        if keys is None:
            keys = tuple(sorted(state.offsets.get(request.group_id, {})))
        partitions = tuple(committed_offset(state, request.group_id, key) for key in keys)
        results.append(OffsetFetchGroupResult(request.group_id, Error.NONE, partitions))
    return _respond(state, Respond(event.request_id, OffsetFetchResponse(tuple(results))))


# ========================================================================================= recovery


def recover(records: Iterable[DurableRecord]) -> CoordinatorState:
    """The coordinator after a restart: the durable records replayed in log order; every group
    with offsets is Empty at generation 0."""
    offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
    for record in records:
        match record:
            case PersistOffsets():
                committed = offsets.setdefault(record.group_id, {})
                for r in record.offsets:
                    committed[(r.topic, r.partition)] = CommittedOffset(
                        r.offset, r.leader_epoch, r.metadata, r.commit_timestamp_ms
                    )
            case PersistGroupDeletion():
                for group_id in record.group_ids:
                    offsets.pop(group_id, None)
    groups = {group_id: Group(group_id) for group_id, committed in offsets.items() if committed}
    kept = {group_id: committed for group_id, committed in offsets.items() if committed}
    return CoordinatorState(groups=groups, offsets=kept)
