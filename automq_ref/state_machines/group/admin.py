"""The administrative requests: ListGroups, DescribeGroups, DeleteGroups and OffsetDelete (both
answer once their tombstones are durable).
"""

from __future__ import annotations

from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.consumer_state import ConsumerGroupState
from automq_ref.state_machines.group.events import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_GROUP_TYPE,
    CONSUMER_PROTOCOL_TYPE,
    DeleteGroups,
    DescribeGroups,
    Error,
    ListGroups,
    OffsetDelete,
    TopicPartition,
)
from automq_ref.state_machines.group.responses import (
    DeletedGroupResult,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsResponse,
    ListedGroup,
    ListGroupsResponse,
    OffsetDeletePartitionResult,
    OffsetDeleteResponse,
    PersistGroupDeletion,
    PersistOffsetDeletion,
    Respond,
)
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupState,
    GroupTransition,
    PendingWrite,
    _respond,
)
from automq_ref.state_machines.transition import Transition


def _on_list_groups(state: CoordinatorState, event: ListGroups) -> GroupTransition:
    states = {name.lower() for name in event.states_filter}
    types = {name.lower() for name in event.types_filter}
    classic = [
        ListedGroup(group.group_id, group.protocol_type or "", group.state.value)
        for group in state.groups.values()
        if (not states or group.state.value.lower() in states)
        and (not types or CLASSIC_GROUP_TYPE in types)
    ]
    consumer = [
        ListedGroup(group.group_id, CONSUMER_PROTOCOL_TYPE, group.state.value, CONSUMER_GROUP_TYPE)
        for group in state.consumer_groups.values()
        if (not states or group.state.value.lower() in states)
        and (not types or CONSUMER_GROUP_TYPE in types)
    ]
    listed = tuple(sorted(classic + consumer, key=lambda g: g.group_id))
    return _respond(state, Respond(event.request_id, ListGroupsResponse(Error.NONE, listed)))


def describe_group(state: CoordinatorState, group_id: str) -> DescribedGroup:
    group = state.groups.get(group_id)
    if group is None:
        dead = GroupState.DEAD.value
        return DescribedGroup(group_id, Error.GROUP_ID_NOT_FOUND, dead, "", "", ())
    stable = group.state is GroupState.STABLE
    protocol = group.protocol_name if stable and group.protocol_name is not None else ""
    members = tuple(
        DescribedMember(
            member.member_id,
            member.group_instance_id,
            member.client_id,
            member.client_host,
            member.metadata_for(protocol) if stable else b"",
            member.assignment if stable else b"",
        )
        for member in group.members.values()
    )
    return DescribedGroup(
        group_id, Error.NONE, group.state.value, group.protocol_type or "", protocol, members
    )


def _on_describe_groups(state: CoordinatorState, event: DescribeGroups) -> GroupTransition:
    described = tuple(describe_group(state, group_id) for group_id in event.group_ids)
    return _respond(state, Respond(event.request_id, DescribeGroupsResponse(described)))


def _on_delete_groups(state: CoordinatorState, event: DeleteGroups) -> GroupTransition:
    results: dict[str, KafkaErrorCode] = {}
    for group_id in event.group_ids:
        group = state.groups.get(group_id)
        consumer = state.consumer_groups.get(group_id)
        if group_id in results:
            continue
        if consumer is not None:
            empty = consumer.state is ConsumerGroupState.EMPTY
            results[group_id] = Error.NONE if empty else Error.NON_EMPTY_GROUP
            if empty:
                state = _forget_group(state, group_id)
        elif group is None:
            results[group_id] = Error.GROUP_ID_NOT_FOUND
        elif group.state is not GroupState.EMPTY:
            results[group_id] = Error.NON_EMPTY_GROUP
        else:
            results[group_id] = Error.NONE
            state = _forget_group(state, group_id)
    deleted = tuple(group_id for group_id, error in results.items() if error is Error.NONE)
    response = DeleteGroupsResponse(tuple(DeletedGroupResult(g, e) for g, e in results.items()))
    if not deleted:
        return _respond(state, Respond(event.request_id, response))
    failure = DeleteGroupsResponse(
        tuple(
            DeletedGroupResult(g, Error.COORDINATOR_NOT_AVAILABLE if e is Error.NONE else e)
            for g, e in results.items()
        )
    )
    seq = state.next_write_seq
    write = PendingWrite(seq, deleted, (), response, failure)
    state = replace(
        state,
        pending_writes={**state.pending_writes, event.request_id: write},
        next_write_seq=seq + 1,
    )
    return Transition(state, (PersistGroupDeletion(event.request_id, deleted),))


def _forget_group(state: CoordinatorState, group_id: str) -> CoordinatorState:
    """Drop the group and its offsets; commits of it still in flight will not apply, and
    offsets held for a transaction's marker are dropped too (Kafka 4's ``deleteAllOffsets``:
    an offset's tombstone removes the pending transactional offsets of its key, so a later
    COMMIT marker shows nothing of the deleted group, in memory as in a replay)."""
    groups = {gid: g for gid, g in state.groups.items() if gid != group_id}
    consumer = {gid: g for gid, g in state.consumer_groups.items() if gid != group_id}
    offsets = {gid: o for gid, o in state.offsets.items() if gid != group_id}
    pending = {
        rid: replace(write, offsets=())
        if write.offsets and write.group_ids == (group_id,)
        else write
        for rid, write in state.pending_writes.items()
    }
    held = {
        producer_id: {gid: o for gid, o in by_group.items() if gid != group_id}
        for producer_id, by_group in state.txn_offsets.items()
    }
    return replace(
        state,
        groups=groups,
        consumer_groups=consumer,
        offsets=offsets,
        pending_writes=pending,
        txn_offsets=held,
    )


def _on_offset_delete(state: CoordinatorState, event: OffsetDelete) -> GroupTransition:
    """Kafka's ``OffsetMetadataManager.deleteOffsets``: an unknown group is
    ``GROUP_ID_NOT_FOUND``; a group with members that is not a ``consumer`` group
    ``NON_EMPTY_GROUP``; otherwise each partition of a topic the group consumes is
    ``GROUP_SUBSCRIBED_TO_TOPIC`` and every other one NONE, its offset (committed, in flight,
    or held for a transaction's marker) deleted at once and tombstoned; answered once the
    tombstones are durable (at once when there is none to write)."""
    group = state.groups.get(event.group_id)
    consumer = state.consumer_groups.get(event.group_id)
    if consumer is not None:
        subscribed = consumer.subscribed_topics()

        def is_subscribed(topic: str) -> bool:
            return topic in subscribed
    elif group is None:
        return _respond(
            state, Respond(event.request_id, OffsetDeleteResponse(Error.GROUP_ID_NOT_FOUND))
        )
    elif group.state is not GroupState.EMPTY and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return _respond(
            state, Respond(event.request_id, OffsetDeleteResponse(Error.NON_EMPTY_GROUP))
        )
    else:
        classic = group

        def is_subscribed(topic: str) -> bool:
            return classic.state is not GroupState.EMPTY and classic.is_subscribed_to(topic)

    results: list[OffsetDeletePartitionResult] = []
    deleted: dict[TopicPartition, None] = {}
    for topic, partition in event.partitions:
        if is_subscribed(topic):
            results.append(
                OffsetDeletePartitionResult(topic, partition, Error.GROUP_SUBSCRIBED_TO_TOPIC)
            )
            continue
        results.append(OffsetDeletePartitionResult(topic, partition, Error.NONE))
        if _holds_offset(state, event.group_id, (topic, partition)):
            deleted[(topic, partition)] = None
    response = OffsetDeleteResponse(Error.NONE, tuple(results))
    if not deleted:
        return _respond(state, Respond(event.request_id, response))
    keys = tuple(deleted)
    state = _forget_offsets(state, event.group_id, frozenset(keys))
    seq = state.next_write_seq
    failure = OffsetDeleteResponse(Error.COORDINATOR_NOT_AVAILABLE)
    write = PendingWrite(seq, (event.group_id,), (), response, failure)
    state = replace(
        state,
        pending_writes={**state.pending_writes, event.request_id: write},
        next_write_seq=seq + 1,
    )
    return Transition(state, (PersistOffsetDeletion(event.request_id, event.group_id, keys),))


def _holds_offset(state: CoordinatorState, group_id: str, key: TopicPartition) -> bool:
    """Whether the log holds, or will hold, an offset of ``key`` for ``group_id``: committed,
    held for a transaction's marker, or in a write in flight (appended before the tombstone)."""
    if key in state.offsets.get(group_id, {}):
        return True
    if any(key in by_group.get(group_id, {}) for by_group in state.txn_offsets.values()):
        return True
    return any(
        write.group_ids == (group_id,) and any(k == key for k, _ in write.offsets)
        for write in state.pending_writes.values()
    )


def _forget_offsets(
    state: CoordinatorState, group_id: str, keys: frozenset[TopicPartition]
) -> CoordinatorState:
    """Drop ``group_id``'s offsets of ``keys``: committed, held for a transaction's marker
    (Kafka's tombstone removes a key's pending transactional offsets too), and those of
    writes still in flight, which will not apply (their records precede the tombstones in the
    log, so a replay agrees)."""
    offsets = dict(state.offsets)
    if group_id in offsets:
        offsets[group_id] = {k: o for k, o in offsets[group_id].items() if k not in keys}
    pending = {
        rid: replace(write, offsets=tuple((k, o) for k, o in write.offsets if k not in keys))
        if write.offsets and write.group_ids == (group_id,)
        else write
        for rid, write in state.pending_writes.items()
    }
    held = {
        producer_id: {
            gid: (
                {k: o for k, o in o_by_key.items() if k not in keys}
                if gid == group_id
                else o_by_key
            )
            for gid, o_by_key in by_group.items()
        }
        for producer_id, by_group in state.txn_offsets.items()
    }
    return replace(state, offsets=offsets, pending_writes=pending, txn_offsets=held)
