"""The group helpers the handlers share. Each takes a group and returns the new group plus the
answers it produced; they mirror GroupCoordinator's private methods of the same names
(prepareRebalance, onCompleteJoin, removeMemberAndUpdateGroup, ...).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeAlias

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.consumer_protocol import subscription_topics
from automq_ref.state_machines.group.events import (
    CONSUMER_PROTOCOL_TYPE,
    Error,
    JoinGroup,
)
from automq_ref.state_machines.group.responses import (
    JoinGroupMember,
    JoinGroupResponse,
    Respond,
    SyncGroupResponse,
)
from automq_ref.state_machines.group.state import (
    Group,
    GroupParams,
    GroupState,
    Member,
)

_Answers: TypeAlias = list[Respond]


def _join_error(request_id: int, error: KafkaErrorCode, member_id: str = "") -> Respond:
    return Respond(request_id, JoinGroupResponse(error, member_id=member_id))


def _answer_join(member: Member, response: JoinGroupResponse) -> tuple[Member, Respond]:
    assert member.awaiting_join is not None
    return replace(member, awaiting_join=None), Respond(member.awaiting_join, response)


def _current_join_response(
    group: Group, member_id: str, *, leader: str | None = None
) -> JoinGroupResponse:
    """The current generation as a JoinGroup answer; the leader's lists every member."""
    assert group.protocol_name is not None
    members: tuple[JoinGroupMember, ...] = ()
    if member_id == group.leader_id and leader is None:
        members = tuple(
            JoinGroupMember(m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
            for m in group.members.values()
        )
    return JoinGroupResponse(
        Error.NONE,
        generation_id=group.generation_id,
        protocol_type=group.protocol_type,
        protocol_name=group.protocol_name,
        leader=(leader if leader is not None else group.leader_id) or "",
        member_id=member_id,
        members=members,
    )


def _supports_protocols(group: Group, protocol_type: str, protocol_names: Iterable[str]) -> bool:
    names = list(protocol_names)
    if group.state is GroupState.EMPTY:
        return protocol_type != "" and bool(names)
    return group.protocol_type == protocol_type and any(
        group.supporters(name) == len(group.members) for name in names
    )


def select_protocol(group: Group) -> str:
    """The protocol every member supports that most members list first among those; a tie goes
    to the protocol voted for by the earliest member."""
    assert group.members, "no protocol for a group without members"
    candidates = {
        name
        for member in group.members.values()
        for name in member.protocol_names
        if group.supporters(name) == len(group.members)
    }
    votes: dict[str, int] = {}
    for member in group.members.values():
        vote = next(name for name in member.protocol_names if name in candidates)
        votes[vote] = votes.get(vote, 0) + 1
    best = max(votes.values())
    return next(name for name, count in votes.items() if count == best)


def _validate_current_member(
    group: Group, member_id: str, group_instance_id: str | None
) -> KafkaErrorCode | None:
    if group_instance_id is not None:
        static_id = group.static_member_id(group_instance_id)
        if static_id is None:
            return Error.UNKNOWN_MEMBER_ID
        if static_id != member_id:
            return Error.FENCED_INSTANCE_ID
    if member_id not in group.members:
        return Error.UNKNOWN_MEMBER_ID
    return None


def _with_member(group: Group, member: Member) -> Group:
    return replace(group, members={**group.members, member.member_id: member})


def _heartbeat(group: Group, member_id: str, now_ms: int) -> Group:
    member = group.members[member_id]
    return _with_member(
        group, replace(member, session_deadline_ms=now_ms + member.session_timeout_ms)
    )


def _prepare_rebalance(group: Group, now_ms: int, params: GroupParams) -> tuple[Group, _Answers]:
    answers: _Answers = []
    members = dict(group.members)
    if group.state is GroupState.COMPLETING_REBALANCE:
        # Whoever waits for an assignment of this generation must rejoin instead.
        for member_id, member in members.items():
            if member.awaiting_sync is not None:
                answers.append(
                    Respond(member.awaiting_sync, SyncGroupResponse(Error.REBALANCE_IN_PROGRESS))
                )
                member = replace(
                    member,
                    awaiting_sync=None,
                    session_deadline_ms=now_ms + member.session_timeout_ms,
                )
            members[member_id] = replace(member, assignment=b"")
    group = replace(group, members=members, pending_sync=frozenset(), sync_deadline_ms=None)
    if group.state is GroupState.EMPTY:
        delay_ms = params.group_initial_rebalance_delay_ms
        group = replace(
            group,
            join_deadline_ms=now_ms + delay_ms,
            initial_delay_ms=delay_ms,
            initial_remaining_ms=max(group.rebalance_timeout_ms - delay_ms, 0),
        )
    else:
        group = replace(
            group,
            join_deadline_ms=now_ms + group.rebalance_timeout_ms,
            initial_delay_ms=None,
            initial_remaining_ms=0,
        )
    return replace(group, state=GroupState.PREPARING_REBALANCE), answers


def _maybe_prepare_rebalance(
    group: Group, now_ms: int, params: GroupParams
) -> tuple[Group, _Answers]:
    if group.state is GroupState.PREPARING_REBALANCE:
        return group, []
    return _prepare_rebalance(group, now_ms, params)


def _complete_join(group: Group, now_ms: int) -> tuple[Group, _Answers]:
    """Kafka's onCompleteJoin."""
    members = {
        member_id: member
        for member_id, member in group.members.items()
        if member.awaiting_join is not None or member.group_instance_id is not None
    }
    leader_id = group.leader_id
    if leader_id is not None and leader_id not in members:
        leader_id = next(iter(members), None)
    group = replace(group, members=members, leader_id=leader_id)
    if members and (leader_id is None or members[leader_id].awaiting_join is None):
        joined = [m for m in members.values() if m.awaiting_join is not None]
        if not joined:
            # Only static members that have not rejoined: wait another rebalance timeout.
            deadline = now_ms + group.rebalance_timeout_ms
            return replace(group, join_deadline_ms=deadline, initial_delay_ms=None), []
        group = replace(group, leader_id=joined[0].member_id)
    generation_id = group.generation_id + 1
    base = replace(
        group,
        generation_id=generation_id,
        join_deadline_ms=None,
        initial_delay_ms=None,
        initial_remaining_ms=0,
        new_member_added=False,
        pending_sync=frozenset(),
        sync_deadline_ms=None,
    )
    if not members:
        subscribed = frozenset[str]() if base.protocol_type == CONSUMER_PROTOCOL_TYPE else None
        empty = replace(
            base,
            state=GroupState.EMPTY,
            protocol_name=None,
            leader_id=None,
            subscribed_topics=subscribed,
        )
        return empty, []
    protocol_name = select_protocol(base)
    group = replace(
        base,
        state=GroupState.COMPLETING_REBALANCE,
        protocol_name=protocol_name,
        subscribed_topics=_subscribed_topics(base, protocol_name),
    )
    answers: _Answers = []
    completed: dict[str, Member] = {}
    for member_id, member in group.members.items():
        if member.awaiting_join is not None:
            member, answer = _answer_join(member, _current_join_response(group, member_id))
            answers.append(answer)
        completed[member_id] = replace(
            member, is_new=False, session_deadline_ms=now_ms + member.session_timeout_ms
        )
    group = replace(
        group,
        members=completed,
        pending_sync=frozenset(completed),
        sync_deadline_ms=now_ms + group.rebalance_timeout_ms,
    )
    return group, answers


def _maybe_complete_join(group: Group, now_ms: int) -> tuple[Group, _Answers]:
    """An ordinary (not initial-delay) join completes as soon as everyone has joined."""
    if (
        group.state is GroupState.PREPARING_REBALANCE
        and group.initial_delay_ms is None
        and group.all_joined()
    ):
        return _complete_join(group, now_ms)
    return group, []


def _remove_member(
    group: Group, member_id: str, now_ms: int, params: GroupParams
) -> tuple[Group, _Answers]:
    """Kafka's removeMemberAndUpdateGroup: whatever the member waits on is answered."""
    member = group.members[member_id]
    answers: _Answers = []
    if member.awaiting_join is not None:
        answers.append(_join_error(member.awaiting_join, Error.UNKNOWN_MEMBER_ID))
    if member.awaiting_sync is not None:
        answers.append(Respond(member.awaiting_sync, SyncGroupResponse(Error.UNKNOWN_MEMBER_ID)))
    members = {mid: m for mid, m in group.members.items() if mid != member_id}
    leader_id = group.leader_id
    if leader_id == member_id:
        leader_id = next(iter(members), None)
    group = replace(
        group, members=members, leader_id=leader_id, pending_sync=group.pending_sync - {member_id}
    )
    if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
        group, more = _prepare_rebalance(group, now_ms, params)
        answers.extend(more)
    if group.state is GroupState.PREPARING_REBALANCE:
        group, more = _maybe_complete_join(group, now_ms)
        answers.extend(more)
    return group, answers


def _remove_pending_member(group: Group, member_id: str, now_ms: int) -> tuple[Group, _Answers]:
    pending = {mid: d for mid, d in group.pending_members.items() if mid != member_id}
    return _maybe_complete_join(replace(group, pending_members=pending), now_ms)


def _add_member_and_rebalance(
    group: Group, member: Member, now_ms: int, params: GroupParams
) -> tuple[Group, _Answers]:
    if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
        group = replace(group, new_member_added=True)
    member = replace(
        member, is_new=True, session_deadline_ms=now_ms + params.new_member_join_timeout_ms
    )
    if not group.members:
        group = replace(group, protocol_type=member.protocol_type)
    pending = {mid: d for mid, d in group.pending_members.items() if mid != member.member_id}
    group = replace(
        _with_member(group, member),
        pending_members=pending,
        leader_id=group.leader_id if group.leader_id is not None else member.member_id,
    )
    return _maybe_prepare_rebalance(group, now_ms, params)


def _await_join(member: Member, request_id: int) -> tuple[Member, _Answers]:
    """The member now waits on ``request_id``; an older JoinGroup of it is answered."""
    answers: _Answers = []
    if member.awaiting_join is not None and member.awaiting_join != request_id:
        answers.append(_join_error(member.awaiting_join, Error.REBALANCE_IN_PROGRESS))
    return replace(member, awaiting_join=request_id), answers


def _update_member_and_rebalance(
    group: Group, member: Member, event: JoinGroup, params: GroupParams
) -> tuple[Group, _Answers]:
    member, answers = _await_join(
        replace(
            member,
            protocols=event.protocols,
            session_timeout_ms=event.session_timeout_ms,
            rebalance_timeout_ms=event.rebalance_timeout_ms,
        ),
        event.request_id,
    )
    group, more = _maybe_prepare_rebalance(_with_member(group, member), event.now_ms, params)
    return group, answers + more


def _subscribed_topics(group: Group, protocol_name: str) -> frozenset[str] | None:
    """The topics the members subscribe to in the protocol chosen, read from their metadata (a
    ``consumer`` group's only); None when one does not parse (Kafka then does not know them)."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        found = subscription_topics(member.metadata_for(protocol_name))
        if found is None:
            return None
        topics |= found
    return frozenset(topics)
