"""The administrative requests: ListGroups, DescribeGroups and DeleteGroups (which answers once
the tombstone is durable).
"""

from __future__ import annotations

from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.events import (
    CLASSIC_GROUP_TYPE,
    DeleteGroups,
    DescribeGroups,
    Error,
    ListGroups,
)
from automq_ref.state_machines.group.responses import (
    DeletedGroupResult,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsResponse,
    ListedGroup,
    ListGroupsResponse,
    PersistGroupDeletion,
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
    listed = tuple(
        ListedGroup(group.group_id, group.protocol_type or "", group.state.value)
        for group_id, group in sorted(state.groups.items())
        if (not states or group.state.value.lower() in states)
        and (not types or CLASSIC_GROUP_TYPE in types)
    )
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
        if group_id in results:
            continue
        if group is None:
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
    return replace(state, groups=groups, offsets=offsets, pending_writes=pending, txn_offsets=held)
