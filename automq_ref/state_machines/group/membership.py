"""The handlers of group membership: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and ``Tick``,
which fires the session, join and sync timers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.events import (
    UNKNOWN_MEMBER_ID,
    Error,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    SyncGroup,
)
from automq_ref.state_machines.group.rebalance import (
    _add_member_and_rebalance,
    _answer_join,
    _Answers,
    _complete_join,
    _current_join_response,
    _heartbeat,
    _join_error,
    _maybe_complete_join,
    _prepare_rebalance,
    _remove_member,
    _remove_pending_member,
    _supports_protocols,
    _update_member_and_rebalance,
    _validate_current_member,
    _with_member,
    select_protocol,
)
from automq_ref.state_machines.group.responses import (
    HeartbeatResponse,
    LeaveGroupMemberResult,
    LeaveGroupResponse,
    Respond,
    SyncGroupResponse,
)
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    Group,
    GroupParams,
    GroupState,
    GroupTransition,
    Member,
    _respond,
    _with_group,
)
from automq_ref.state_machines.transition import Transition

# ======================================================================================== JoinGroup


def _new_member_id(state: CoordinatorState, prefix: str, params: GroupParams) -> str:
    return f"{prefix}-{params.member_id_token}-{state.next_member_number}"


def _on_join_group(
    state: CoordinatorState, event: JoinGroup, params: GroupParams
) -> GroupTransition:
    now_ms = state.now_ms
    if event.group_id == "":
        return _respond(
            state, _join_error(event.request_id, Error.INVALID_GROUP_ID, event.member_id)
        )
    if not (
        params.group_min_session_timeout_ms
        <= event.session_timeout_ms
        <= params.group_max_session_timeout_ms
    ):
        error = Error.INVALID_SESSION_TIMEOUT
        return _respond(state, _join_error(event.request_id, error, event.member_id))
    group = state.groups.get(event.group_id)
    if group is None:
        if event.member_id != UNKNOWN_MEMBER_ID:
            error = Error.UNKNOWN_MEMBER_ID
            return _respond(state, _join_error(event.request_id, error, event.member_id))
        group = Group(event.group_id)
        state = _with_group(state, group)
    if event.member_id == UNKNOWN_MEMBER_ID:
        state, group, answers = _join_new_member(state, group, event, params)
    else:
        group, answers = _join_current_member(group, event, params)
    group, more = _maybe_complete_join(group, now_ms)
    return Transition(_with_group(state, group), tuple(answers + more))


def _join_new_member(
    state: CoordinatorState, group: Group, event: JoinGroup, params: GroupParams
) -> tuple[CoordinatorState, Group, _Answers]:
    if not _supports_protocols(group, event.protocol_type, (p.name for p in event.protocols)):
        return state, group, [_join_error(event.request_id, Error.INCONSISTENT_GROUP_PROTOCOL)]
    prefix = event.group_instance_id if event.group_instance_id is not None else event.client_id
    member_id = _new_member_id(state, prefix, params)
    state = replace(state, next_member_number=state.next_member_number + 1)
    now_ms = state.now_ms
    if event.group_instance_id is not None:
        old_member_id = group.static_member_id(event.group_instance_id)
        if old_member_id is not None:
            group, answers = _replace_static_member(group, old_member_id, member_id, event, params)
            return state, group, answers
    elif event.require_known_member_id:
        pending = {**group.pending_members, member_id: now_ms + event.session_timeout_ms}
        answer = _join_error(event.request_id, Error.MEMBER_ID_REQUIRED, member_id)
        return state, replace(group, pending_members=pending), [answer]
    group, answers = _add_member_and_rebalance(group, _new_member(event, member_id), now_ms, params)
    return state, group, answers


def _new_member(event: JoinGroup, member_id: str) -> Member:
    return Member(
        member_id=member_id,
        group_instance_id=event.group_instance_id,
        client_id=event.client_id,
        client_host=event.client_host,
        session_timeout_ms=event.session_timeout_ms,
        rebalance_timeout_ms=event.rebalance_timeout_ms,
        protocol_type=event.protocol_type,
        protocols=event.protocols,
        awaiting_join=event.request_id,
    )


def _replace_static_member(
    group: Group, old_member_id: str, member_id: str, event: JoinGroup, params: GroupParams
) -> tuple[Group, _Answers]:
    """Kafka's updateStaticMemberAndRebalance: the new incarnation of an instance id fences the
    old one and takes over its place, assignment and leadership."""
    now_ms = event.now_ms
    old = group.members[old_member_id]
    answers: _Answers = []
    if old.awaiting_join is not None:
        answers.append(_join_error(old.awaiting_join, Error.FENCED_INSTANCE_ID, old_member_id))
    if old.awaiting_sync is not None:
        answers.append(Respond(old.awaiting_sync, SyncGroupResponse(Error.FENCED_INSTANCE_ID)))
    previous_leader = group.leader_id
    member = replace(
        old,
        member_id=member_id,
        protocols=event.protocols,
        session_timeout_ms=event.session_timeout_ms,
        rebalance_timeout_ms=event.rebalance_timeout_ms,
        awaiting_join=event.request_id,
        awaiting_sync=None,
        session_deadline_ms=now_ms + event.session_timeout_ms,
    )
    members = {mid: m for mid, m in group.members.items() if mid != old_member_id}
    members[member_id] = member
    pending_sync = group.pending_sync
    if old_member_id in pending_sync:
        pending_sync = (pending_sync - {old_member_id}) | {member_id}
    group = replace(
        group,
        members=members,
        pending_sync=pending_sync,
        leader_id=member_id if previous_leader == old_member_id else previous_leader,
    )
    match group.state:
        case GroupState.STABLE:
            if select_protocol(group) == group.protocol_name:
                # Nothing the assignment depends on changed: answer with the current generation,
                # naming the leader as it was so that a replaced leader does not reassign.
                response = _current_join_response(group, member_id, leader=previous_leader or "")
                member, answer = _answer_join(member, response)
                return _with_member(group, member), [*answers, answer]
            group, more = _prepare_rebalance(group, now_ms, params)
        case GroupState.COMPLETING_REBALANCE:
            # The leader may already have the old member id in its assignment.
            group, more = _prepare_rebalance(group, now_ms, params)
        case _:
            more = []
    return group, answers + more


def _join_current_member(
    group: Group, event: JoinGroup, params: GroupParams
) -> tuple[Group, _Answers]:
    member_id = event.member_id
    if not _supports_protocols(group, event.protocol_type, (p.name for p in event.protocols)):
        return group, [_join_error(event.request_id, Error.INCONSISTENT_GROUP_PROTOCOL, member_id)]
    if member_id in group.pending_members and event.group_instance_id is None:
        member = _new_member(event, member_id)
        return _add_member_and_rebalance(group, member, event.now_ms, params)
    error = _validate_current_member(group, member_id, event.group_instance_id)
    if error is not None:
        return group, [_join_error(event.request_id, error, member_id)]
    member = group.members[member_id]
    match group.state:
        case GroupState.COMPLETING_REBALANCE if member.protocols == event.protocols:
            # It missed the answer of this generation: repeat it.
            return group, [Respond(event.request_id, _current_join_response(group, member_id))]
        case GroupState.STABLE if (
            member_id != group.leader_id and member.protocols == event.protocols
        ):
            # A follower with unchanged metadata: it may SyncGroup for the current generation.
            # (A leader's rejoin always rebalances: it may have seen new topic metadata.)
            return group, [Respond(event.request_id, _current_join_response(group, member_id))]
        case _:
            return _update_member_and_rebalance(group, member, event, params)


# ======================================================================================== SyncGroup


def _on_sync_group(
    state: CoordinatorState, event: SyncGroup, params: GroupParams
) -> GroupTransition:
    if event.group_id == "":
        return _respond(state, Respond(event.request_id, SyncGroupResponse(Error.INVALID_GROUP_ID)))
    group = state.groups.get(event.group_id)
    if group is None:
        return _respond(
            state, Respond(event.request_id, SyncGroupResponse(Error.UNKNOWN_MEMBER_ID))
        )
    error = _validate_current_member(group, event.member_id, event.group_instance_id)
    if error is None and event.generation_id != group.generation_id:
        error = Error.ILLEGAL_GENERATION
    if error is None and (
        (event.protocol_type is not None and event.protocol_type != group.protocol_type)
        or (event.protocol_name is not None and event.protocol_name != group.protocol_name)
    ):
        error = Error.INCONSISTENT_GROUP_PROTOCOL
    if error is None and group.state is GroupState.PREPARING_REBALANCE:
        error = Error.REBALANCE_IN_PROGRESS
    if error is not None:
        return _respond(state, Respond(event.request_id, SyncGroupResponse(error)))
    now_ms = state.now_ms
    member = group.members[event.member_id]
    group = replace(group, pending_sync=group.pending_sync - {event.member_id})
    if group.state is GroupState.STABLE:
        group = _heartbeat(group, event.member_id, now_ms)
        response = SyncGroupResponse(
            Error.NONE, group.protocol_type, group.protocol_name, member.assignment
        )
        return Transition(_with_group(state, group), (Respond(event.request_id, response),))
    assert group.state is GroupState.COMPLETING_REBALANCE, group.state
    answers: _Answers = []
    if member.awaiting_sync is not None and member.awaiting_sync != event.request_id:
        superseded = SyncGroupResponse(Error.REBALANCE_IN_PROGRESS)
        answers.append(Respond(member.awaiting_sync, superseded))
    group = _with_member(group, replace(member, awaiting_sync=event.request_id))
    if event.member_id == group.leader_id:
        assignments = {entry.member_id: entry.assignment for entry in event.assignments}
        group, more = _set_and_propagate_assignment(group, assignments, now_ms)
        answers.extend(more)
    return Transition(_with_group(state, group), tuple(answers))


def _set_and_propagate_assignment(
    group: Group, assignments: Mapping[str, bytes], now_ms: int
) -> tuple[Group, _Answers]:
    """The leader's assignment (missing members get empty bytes) answers every waiting
    SyncGroup; the group is Stable."""
    answers: _Answers = []
    members: dict[str, Member] = {}
    for member_id, member in group.members.items():
        member = replace(member, assignment=assignments.get(member_id, b""))
        if member.awaiting_sync is not None:
            response = SyncGroupResponse(
                Error.NONE, group.protocol_type, group.protocol_name, member.assignment
            )
            answers.append(Respond(member.awaiting_sync, response))
            member = replace(
                member, awaiting_sync=None, session_deadline_ms=now_ms + member.session_timeout_ms
            )
        members[member_id] = member
    return replace(group, members=members, state=GroupState.STABLE), answers


# ======================================================================================== Heartbeat


def _on_heartbeat(state: CoordinatorState, event: Heartbeat) -> GroupTransition:
    def answer(error: KafkaErrorCode) -> Respond:
        return Respond(event.request_id, HeartbeatResponse(error))

    if event.group_id == "":
        return _respond(state, answer(Error.INVALID_GROUP_ID))
    group = state.groups.get(event.group_id)
    if group is None:
        return _respond(state, answer(Error.UNKNOWN_MEMBER_ID))
    error = _validate_current_member(group, event.member_id, event.group_instance_id)
    if error is None and event.generation_id != group.generation_id:
        error = Error.ILLEGAL_GENERATION
    if error is not None:
        return _respond(state, answer(error))
    group = _heartbeat(group, event.member_id, state.now_ms)
    if group.state is GroupState.PREPARING_REBALANCE:
        error = Error.REBALANCE_IN_PROGRESS
    else:
        error = Error.NONE
    return Transition(_with_group(state, group), (answer(error),))


# ======================================================================================= LeaveGroup


def _on_leave_group(
    state: CoordinatorState, event: LeaveGroup, params: GroupParams
) -> GroupTransition:
    if event.group_id == "":
        return _respond(
            state, Respond(event.request_id, LeaveGroupResponse(Error.INVALID_GROUP_ID))
        )
    group = state.groups.get(event.group_id)
    results: list[LeaveGroupMemberResult] = []
    answers: _Answers = []
    for leaving in event.members:
        error: KafkaErrorCode | None = Error.UNKNOWN_MEMBER_ID
        if group is None:
            pass
        elif leaving.member_id == UNKNOWN_MEMBER_ID:
            # An administrator removing a static member by its instance id.
            static_id = group.static_member_id(leaving.group_instance_id)
            if static_id is not None:
                group, more = _remove_member(group, static_id, state.now_ms, params)
                answers.extend(more)
                error = Error.NONE
        elif leaving.member_id in group.pending_members:
            group, more = _remove_pending_member(group, leaving.member_id, state.now_ms)
            answers.extend(more)
            error = Error.NONE
        else:
            error = _validate_current_member(group, leaving.member_id, leaving.group_instance_id)
            if error is None:
                group, more = _remove_member(group, leaving.member_id, state.now_ms, params)
                answers.extend(more)
                error = Error.NONE
        assert error is not None
        results.append(LeaveGroupMemberResult(leaving.member_id, leaving.group_instance_id, error))
    if group is not None:
        state = _with_group(state, group)
    response = LeaveGroupResponse(Error.NONE, tuple(results))
    return Transition(state, (*answers, Respond(event.request_id, response)))


# ============================================================================================= Tick


_TICK_ROUNDS_MAX: Final = 4


def _on_tick(state: CoordinatorState, params: GroupParams) -> GroupTransition:
    now_ms = state.now_ms
    answers: _Answers = []
    for group_id in sorted(state.groups):
        group = state.groups[group_id]
        # A timer may re-arm itself at ``now_ms`` (an initial delay of 0 extended by a new
        # member): fire again until nothing changes, a few rounds at most.
        for _ in range(_TICK_ROUNDS_MAX):
            fired, more = _expire(group, now_ms, params)
            answers.extend(more)
            if fired == group:
                break
            group = fired
        state = _with_group(state, group)
        if _forgettable(state, group):
            state = replace(
                state, groups={gid: g for gid, g in state.groups.items() if gid != group_id}
            )
    return Transition(state, tuple(answers))


def _expires(member: Member, now_ms: int) -> bool:
    """post: implies(now_ms < member.session_deadline_ms, not __return__)"""
    waiting = member.awaiting_join is not None or member.awaiting_sync is not None
    return now_ms >= member.session_deadline_ms and (member.is_new or not waiting)


def _expire(group: Group, now_ms: int, params: GroupParams) -> tuple[Group, _Answers]:
    answers: _Answers = []
    for member_id, deadline in list(group.pending_members.items()):
        if now_ms >= deadline:
            group, more = _remove_pending_member(group, member_id, now_ms)
            answers.extend(more)
    for member_id in list(group.members):
        member = group.members.get(member_id)
        if member is not None and _expires(member, now_ms):
            group, more = _remove_member(group, member_id, now_ms, params)
            answers.extend(more)
    if (
        group.state is GroupState.PREPARING_REBALANCE
        and group.join_deadline_ms is not None
        and now_ms >= group.join_deadline_ms
    ):
        group, more = _on_join_timer(group, now_ms, params)
        answers.extend(more)
    if (
        group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
        and group.sync_deadline_ms is not None
        and now_ms >= group.sync_deadline_ms
    ):
        group, more = _on_sync_timer(group, now_ms, params)
        answers.extend(more)
    return group, answers


def _on_join_timer(group: Group, now_ms: int, params: GroupParams) -> tuple[Group, _Answers]:
    """Kafka's InitialDelayedJoin / DelayedJoin expiring."""
    if (
        group.initial_delay_ms is not None
        and group.new_member_added
        and group.initial_remaining_ms != 0
    ):
        delay_ms = min(params.group_initial_rebalance_delay_ms, group.initial_remaining_ms)
        remaining_ms = max(group.initial_remaining_ms - group.initial_delay_ms, 0)
        extended = replace(
            group,
            new_member_added=False,
            join_deadline_ms=now_ms + delay_ms,
            initial_delay_ms=delay_ms,
            initial_remaining_ms=remaining_ms,
        )
        return extended, []
    return _complete_join(group, now_ms)


def _on_sync_timer(group: Group, now_ms: int, params: GroupParams) -> tuple[Group, _Answers]:
    """Kafka's DelayedSync: members that never sent their SyncGroup are removed."""
    if not group.pending_sync:
        return replace(group, sync_deadline_ms=None), []
    members = {mid: m for mid, m in group.members.items() if mid not in group.pending_sync}
    leader_id = group.leader_id if group.leader_id in members else next(iter(members), None)
    group = replace(group, members=members, leader_id=leader_id, pending_sync=frozenset())
    group, answers = _prepare_rebalance(group, now_ms, params)
    group, more = _maybe_complete_join(group, now_ms)
    return group, answers + more


def _forgettable(state: CoordinatorState, group: Group) -> bool:
    """An Empty group with nothing of its own left: no offsets, none in flight, none held for a
    transaction's marker (Kafka's ``hasOffsets`` counts its pending transactional offsets)."""
    return (
        group.state is GroupState.EMPTY
        and not group.pending_members
        and not state.offsets.get(group.group_id)
        and not any(group.group_id in w.group_ids for w in state.pending_writes.values())
        and not any(held.get(group.group_id) for held in state.txn_offsets.values())
    )
