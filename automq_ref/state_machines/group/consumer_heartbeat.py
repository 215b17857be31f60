"""ConsumerGroupHeartbeat (KIP-848): a member joins, heartbeats, reconciles and leaves with one
request, and the coordinator assigns the partitions (Kafka's
``GroupMetadataManager.consumerGroupHeartbeat``); plus the timers that fence members that stop
heartbeating or do not give partitions up in time.

One heartbeat, in Kafka's order:

1. The request is checked (``INVALID_REQUEST``: a member id required from v1 on and whenever
   the epoch is not 0, no empty group, instance or rack id, a join with its rebalance timeout,
   a subscription and no owned partitions, epoch -2 only with an instance id, no epoch below
   -2; ``UNSUPPORTED_ASSIGNOR`` for a server assignor not in ``group.consumer.assignors``; a
   topic regex is ``INVALID_REQUEST`` too: not supported here).
2. Epoch -1 (or -2 for a static member) leaves (below). Otherwise the group: a classic group of
   that id with members is ``GROUP_ID_NOT_FOUND`` (Kafka, with online upgrades off); an Empty
   classic group (offsets only) becomes a consumer group on a join. A member that is not
   joining (epoch > 0) of a group not held is ``UNKNOWN_MEMBER_ID`` (Kafka:
   ``GROUP_ID_NOT_FOUND``; membership is not durable here, so after a restart this is what a
   member hears, and it rejoins, as classic members do). ``GROUP_MAX_SIZE_REACHED`` past
   ``group.consumer.max.size``.
3. The member: a join (epoch 0) creates it, or takes up the one of that id (a fenced member
   rejoining keeps its assignment, KAFKA-19233, static or not); a static join with a new member
   id takes over the place of an instance that left with -2 (its assignment and target, no
   rebalance), and is ``UNRELEASED_INSTANCE_ID`` while that instance is still in. Otherwise
   the member must exist (``UNKNOWN_MEMBER_ID``; a static one by its instance id,
   ``FENCED_INSTANCE_ID`` for another member id) at the epoch it names, or at its previous
   epoch owning a subset of what it was told (a lost answer), else ``FENCED_MEMBER_EPOCH``.
4. The group epoch is bumped when the group is new, when the member's subscribed topics changed,
   or when the subscription metadata (the partition counts of the subscribed topics, read from
   the heartbeat's view of the cluster) changed; then, the target assignment epoch being
   behind, the target is computed anew for every member by the assignor the members prefer
   (most votes, else the first of ``group.consumer.assignors``).
5. The member is reconciled towards its target (Kafka's ``CurrentAssignmentBuilder``): it keeps
   what is still in its target; partitions it must give up are revoked first (it stays at its
   epoch, in ``UNREVOKED_PARTITIONS``, until a heartbeat's owned partitions hold none of them);
   then it moves to the target's epoch and gets the target's partitions no other member still
   owns (``UNRELEASED_PARTITIONS`` until those are released). So no partition is ever told to
   two members at once, and a member's epoch only grows.
6. The answer: member id, epoch, ``group.consumer.heartbeat.interval.ms``, and the assignment
   when it changed or the request was a full one (a join, or every optional field set).

Every heartbeat moves the member's session deadline to ``group.consumer.session.timeout.ms``
ahead; a ``Tick`` past it fences the member (removed, its partitions free, the group epoch
bumped), as it does a member still holding partitions to revoke past its rebalance timeout.
Leaving: epoch -1 removes the member the same way (a static one named by its instance id);
-2 keeps a static member with its partitions at epoch -2 until it rejoins or its session ends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.assignors import assign
from automq_ref.state_machines.group.consumer_state import (
    NO_PARTITIONS,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
)
from automq_ref.state_machines.group.events import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupHeartbeat,
    Error,
)
from automq_ref.state_machines.group.responses import ConsumerGroupHeartbeatResponse, Respond
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupParams,
    GroupState,
    GroupTransition,
    _respond,
    _with_consumer_group,
)

CONSUMER_GENERATED_MEMBER_ID_VERSION = 1  # KIP-1082: the client generates its member id


class _Refused(Exception):
    """A heartbeat answered with an error (Kafka's ApiException); never leaves this module."""

    def __init__(self, error: KafkaErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _refuse(error: KafkaErrorCode, message: str) -> _Refused:
    return _Refused(error, message)


def on_consumer_heartbeat(
    state: CoordinatorState, event: ConsumerGroupHeartbeat, params: GroupParams
) -> GroupTransition:
    try:
        _validate(event, params)
        if event.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            state, response = _leave(state, event)
        else:
            state, response = _heartbeat(state, event, params)
    except _Refused as refused:
        response = ConsumerGroupHeartbeatResponse(refused.error, refused.message)
    return _respond(state, Respond(event.request_id, response))


def _validate(event: ConsumerGroupHeartbeat, params: GroupParams) -> None:
    def invalid(message: str) -> _Refused:
        return _refuse(Error.INVALID_REQUEST, message)

    epoch = event.member_epoch
    if event.member_id == "" and (
        event.api_version >= CONSUMER_GENERATED_MEMBER_ID_VERSION
        or epoch > 0
        or epoch == LEAVE_GROUP_MEMBER_EPOCH
    ):
        raise invalid("MemberId can't be empty.")
    if event.group_id == "":
        raise invalid("GroupId can't be empty.")
    if event.instance_id == "":
        raise invalid("InstanceId can't be empty.")
    if event.rack_id == "":
        raise invalid("RackId can't be empty.")
    if epoch == 0:
        if event.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if event.owned is None or event.owned:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if event.subscribed_topic_names is None and event.subscribed_topic_regex is None:
            raise invalid(
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining."
            )
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if event.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise invalid("MemberEpoch is invalid.")
    if event.subscribed_topic_regex:
        raise invalid(
            "SubscribedTopicRegex is not supported by this broker; subscribe to topic names"
        )
    if event.server_assignor is not None and event.server_assignor not in params.consumer_assignors:
        raise _refuse(
            Error.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {event.server_assignor} is not supported. Supported assignors: "
            f"{', '.join(params.consumer_assignors)}.",
        )


# ========================================================================================= leaving


def _leave(
    state: CoordinatorState, event: ConsumerGroupHeartbeat
) -> tuple[CoordinatorState, ConsumerGroupHeartbeatResponse]:
    group = state.consumer_groups.get(event.group_id)
    if group is None:
        raise _refuse(Error.UNKNOWN_MEMBER_ID, f"Member {event.member_id} is not in the group.")
    member = _existing_member(group, event)
    if event.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        left = replace(
            member,
            member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
            previous_member_epoch=member.member_epoch,
            pending_revocation=NO_PARTITIONS,
            state=MemberState.STABLE,
            rebalance_deadline_ms=None,
        )
        group = replace(group, members={**group.members, member.member_id: left})
    else:
        group = fence_member(group, member.member_id)
    state = _with_consumer_group(state, group)
    return state, ConsumerGroupHeartbeatResponse(
        Error.NONE, member_id=member.member_id, member_epoch=event.member_epoch
    )


def fence_member(group: ConsumerGroup, member_id: str) -> ConsumerGroup:
    """Remove a member (it left, or was fenced): its partitions are free at once, its target
    entry goes, and the group epoch is bumped so the next heartbeat assigns anew."""
    members = {mid: m for mid, m in group.members.items() if mid != member_id}
    target = {mid: t for mid, t in group.target.items() if mid != member_id}
    return replace(group, members=members, target=target, group_epoch=group.group_epoch + 1)


def _existing_member(group: ConsumerGroup, event: ConsumerGroupHeartbeat) -> ConsumerMember:
    if event.instance_id is None:
        member = group.members.get(event.member_id)
        if member is None:
            raise _refuse(
                Error.UNKNOWN_MEMBER_ID,
                f"Member {event.member_id} is not a member of group {group.group_id}.",
            )
        return member
    static = group.static_member(event.instance_id)
    if static is None:
        raise _refuse(Error.UNKNOWN_MEMBER_ID, f"Instance id {event.instance_id} is unknown.")
    if static.member_id != event.member_id:
        raise _refuse(
            Error.FENCED_INSTANCE_ID,
            f"Static member {event.member_id} with instance id {event.instance_id} was fenced "
            f"by member {static.member_id}.",
        )
    return static


# ======================================================================================= heartbeat


def _heartbeat(
    state: CoordinatorState, event: ConsumerGroupHeartbeat, params: GroupParams
) -> tuple[CoordinatorState, ConsumerGroupHeartbeatResponse]:
    joining = event.member_epoch == 0
    group = state.consumer_groups.get(event.group_id)
    if group is None:
        classic = state.groups.get(event.group_id)
        if classic is not None and (classic.state is not GroupState.EMPTY or classic.members):
            raise _refuse(
                Error.GROUP_ID_NOT_FOUND, f"Group {event.group_id} is not a consumer group."
            )
        if not joining:
            raise _refuse(
                Error.UNKNOWN_MEMBER_ID,
                f"Member {event.member_id} is not a member of group {event.group_id}.",
            )
        group = ConsumerGroup(event.group_id)
        if classic is not None:  # an Empty classic group (offsets only) turns consumer
            state = replace(
                state, groups={g: c for g, c in state.groups.items() if g != event.group_id}
            )
    member_id = event.member_id or event.generated_member_id
    if len(group.members) >= params.consumer_max_size and member_id not in group.members:
        raise _refuse(
            Error.GROUP_MAX_SIZE_REACHED,
            f"The consumer group has reached its maximum capacity of "
            f"{params.consumer_max_size} members.",
        )
    group, member = _member(group, event, member_id, state.now_ms)
    updated = replace(
        member,
        instance_id=event.instance_id if event.instance_id is not None else member.instance_id,
        rack_id=event.rack_id if event.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=(
            event.rebalance_timeout_ms
            if event.rebalance_timeout_ms != -1
            else member.rebalance_timeout_ms
        ),
        server_assignor=(
            event.server_assignor if event.server_assignor is not None else member.server_assignor
        ),
        subscribed_topic_names=(
            tuple(sorted(set(event.subscribed_topic_names)))
            if event.subscribed_topic_names is not None
            else member.subscribed_topic_names
        ),
        client_id=event.client_id,
        client_host=event.client_host,
    )
    bump = group.group_epoch == 0 or (
        updated.subscribed_topic_names != member.subscribed_topic_names
    )
    group = replace(group, members={**group.members, member_id: updated})
    subscribed = group.subscribed_topics()
    metadata = {t: event.topics[t] for t in sorted(subscribed) if t in event.topics}
    if metadata != dict(group.subscription_metadata):
        bump = True
    if bump:
        group = replace(group, group_epoch=group.group_epoch + 1, subscription_metadata=metadata)
    if group.group_epoch > group.assignment_epoch:
        group = _new_target(group, params)
    before = updated
    updated = reconcile(group, updated, event.owned, state.now_ms)
    updated = replace(
        updated, session_deadline_ms=state.now_ms + params.consumer_session_timeout_ms
    )
    group = replace(group, members={**group.members, member_id: updated})
    state = _with_consumer_group(state, group)
    full = joining or (
        event.rebalance_timeout_ms != -1
        and event.subscribed_topic_names is not None
        and event.owned is not None
    )
    return state, ConsumerGroupHeartbeatResponse(
        Error.NONE,
        member_id=member_id,
        member_epoch=updated.member_epoch,
        heartbeat_interval_ms=params.consumer_heartbeat_interval_ms,
        assignment=(updated.assigned if full or updated.assigned != before.assigned else None),
    )


def _member(
    group: ConsumerGroup, event: ConsumerGroupHeartbeat, member_id: str, now_ms: int
) -> tuple[ConsumerGroup, ConsumerMember]:
    """The member the heartbeat is from (Kafka's getOrMaybeSubscribe*ConsumerGroupMember)."""
    if event.member_epoch != 0:
        member = _existing_member(group, event)
        _check_epoch(member, event)
        return group, member
    if event.instance_id is not None:
        static = group.static_member(event.instance_id)
        if (
            static is not None
            and static.member_id == member_id
            and static.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
        ):
            return group, static  # the same member rejoining (fenced), as a dynamic one
        if static is not None:
            if static.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise _refuse(
                    Error.UNRELEASED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {event.instance_id} cannot "
                    f"join the group because the instance id is owned by {static.member_id} "
                    f"member.",
                )
            # The instance comes back: a new member id takes its place, assignment and target.
            member = replace(static, member_id=member_id, member_epoch=0, previous_member_epoch=0)
            members: dict[str, ConsumerMember] = {}
            for mid, m in group.members.items():
                if mid == static.member_id:
                    members[member_id] = member
                elif mid != member_id:
                    members[mid] = m
            target = {mid: t for mid, t in group.target.items() if mid != static.member_id}
            if static.member_id in group.target:
                target[member_id] = group.target[static.member_id]
            return replace(group, members=members, target=target), member
    existing = group.members.get(member_id)
    if existing is not None:
        return group, existing  # a (fenced) member rejoining keeps what it has (KAFKA-19233)
    return group, ConsumerMember(
        member_id=member_id,
        instance_id=event.instance_id,
        rack_id=event.rack_id,
        client_id=event.client_id,
        client_host=event.client_host,
        rebalance_timeout_ms=event.rebalance_timeout_ms,
        session_deadline_ms=now_ms,
    )


def _check_epoch(member: ConsumerMember, event: ConsumerGroupHeartbeat) -> None:
    received = event.member_epoch
    if received > member.member_epoch:
        raise _refuse(
            Error.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a greater member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            f"all its partitions and rejoin.",
        )
    if received < member.member_epoch and (
        received != member.previous_member_epoch
        or event.owned is None
        or not set(event.owned) <= member.assigned
    ):
        raise _refuse(
            Error.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a smaller member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            f"all its partitions and rejoin.",
        )


def preferred_assignor(group: ConsumerGroup, params: GroupParams) -> str:
    """The server assignor most members ask for (ties: the first by name), else the default."""
    votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
    if not votes:
        return params.consumer_assignors[0]
    return min(votes, key=lambda name: (-votes[name], name))


def _new_target(group: ConsumerGroup, params: GroupParams) -> ConsumerGroup:
    subscriptions = {mid: frozenset(m.subscribed_topic_names) for mid, m in group.members.items()}
    target = assign(
        preferred_assignor(group, params), subscriptions, group.subscription_metadata, group.target
    )
    return replace(group, target=target, assignment_epoch=group.group_epoch)


# ================================================================================== reconciliation


def reconcile(
    group: ConsumerGroup,
    member: ConsumerMember,
    owned: tuple[tuple[str, int], ...] | None,
    now_ms: int,
) -> ConsumerMember:
    """One step of the member towards its target (Kafka's CurrentAssignmentBuilder)."""
    epoch = group.assignment_epoch
    if member.reconciled_to(epoch) or member.member_epoch < 0:
        return member
    match member.state:
        case MemberState.UNREVOKED_PARTITIONS:
            if owned is None or not member.pending_revocation.isdisjoint(owned):
                return member  # it still holds partitions it must give up
            return _next(group, member, now_ms)
        case _:
            return _next(group, member, now_ms)


def _next(group: ConsumerGroup, member: ConsumerMember, now_ms: int) -> ConsumerMember:
    target = group.target.get(member.member_id, NO_PARTITIONS)
    kept = member.assigned & target
    revoke = member.assigned - kept
    wanted = target - kept
    free = wanted - group.owned_by_others(member.member_id)
    if revoke:
        # It stays at its epoch until it has given them up, within its rebalance timeout.
        deadline = member.rebalance_deadline_ms
        if member.state is not MemberState.UNREVOKED_PARTITIONS or deadline is None:
            deadline = now_ms + member.rebalance_timeout_ms
        return replace(
            member,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=kept,
            pending_revocation=revoke,
            rebalance_deadline_ms=deadline,
        )
    return replace(
        _with_epoch(member, group.assignment_epoch),
        state=MemberState.UNRELEASED_PARTITIONS if wanted - free else MemberState.STABLE,
        assigned=kept | free,
        pending_revocation=NO_PARTITIONS,
        rebalance_deadline_ms=None,
    )


def _with_epoch(member: ConsumerMember, epoch: int) -> ConsumerMember:
    if epoch == member.member_epoch:
        return member
    return replace(member, member_epoch=epoch, previous_member_epoch=member.member_epoch)
