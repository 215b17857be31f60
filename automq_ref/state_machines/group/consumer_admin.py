"""KIP-848 consumer groups in the coordinator's other requests: the timers (``Tick``), the
member checks of OffsetCommit and OffsetFetch, ListGroups' and ConsumerGroupDescribe's views,
and what DeleteGroups and OffsetDelete may do to one.

- Timers: a member whose session deadline passed, or that still holds partitions to revoke
  past its rebalance timeout, is fenced (removed, the group epoch bumped). An Empty consumer
  group with nothing of its own left (no offsets, none in flight or held for a transaction) is
  forgotten, as an Empty classic group is.
- OffsetCommit (Kafka's ``ConsumerGroup.validateOffsetCommit``): from a group with members, the
  member must exist (``UNKNOWN_MEMBER_ID``), commit with OffsetCommit v9+ unless transactional
  (``UNSUPPORTED_VERSION``), and name its current member epoch as the generation
  (``STALE_MEMBER_EPOCH``); a commit with generation -1 to an Empty group is a standalone
  consumer's, and a TxnOffsetCommit naming no member is not checked.
- OffsetFetch (``validateOffsetFetch``): a group of the request that names a member (v9) must
  have it at that epoch (``UNKNOWN_MEMBER_ID``, ``STALE_MEMBER_EPOCH``); without a member id
  and epoch -1 anyone may read.
- ListGroups lists a consumer group as type ``consumer`` with its state; DescribeGroups answers
  it ``GROUP_ID_NOT_FOUND`` (it is not a classic group), ConsumerGroupDescribe describes it with
  every member's assignment and target; DeleteGroups deletes it only while Empty
  (``NON_EMPTY_GROUP``), and OffsetDelete refuses the partitions of the topics its members
  subscribe to (``GROUP_SUBSCRIBED_TO_TOPIC``).
"""

from __future__ import annotations

from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.consumer_heartbeat import fence_member, preferred_assignor
from automq_ref.state_machines.group.consumer_state import (
    NO_PARTITIONS,
    ConsumerGroup,
    ConsumerGroupState,
    MemberState,
)
from automq_ref.state_machines.group.events import (
    NO_GENERATION,
    UNKNOWN_MEMBER_ID,
    ConsumerGroupDescribe,
    Error,
    OffsetCommit,
    OffsetFetchGroup,
    TxnOffsetCommit,
)
from automq_ref.state_machines.group.responses import (
    ConsumerGroupDescribeResponse,
    DescribedConsumerGroup,
    DescribedConsumerMember,
    Respond,
)
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupParams,
    GroupTransition,
    _respond,
)

OFFSET_COMMIT_CONSUMER_MIN_VERSION = 9


def expire_consumer_groups(state: CoordinatorState) -> CoordinatorState:
    """Fence the members whose session or rebalance timeout passed, then forget the Empty
    consumer groups that hold nothing else."""
    now_ms = state.now_ms
    groups: dict[str, ConsumerGroup] = {}
    for group_id, group in sorted(state.consumer_groups.items()):
        for member_id, member in list(group.members.items()):
            late_revoking = (
                member.state is MemberState.UNREVOKED_PARTITIONS
                and member.rebalance_deadline_ms is not None
                and now_ms >= member.rebalance_deadline_ms
            )
            if now_ms >= member.session_deadline_ms or late_revoking:
                group = fence_member(group, member_id)
        if group.members or holds_something(state, group_id):
            groups[group_id] = group
    return replace(state, consumer_groups=groups)


def holds_something(state: CoordinatorState, group_id: str) -> bool:
    """Offsets shown, in flight, or held for a transaction's marker."""
    return (
        bool(state.offsets.get(group_id))
        or any(group_id in w.group_ids for w in state.pending_writes.values())
        or any(held.get(group_id) for held in state.txn_offsets.values())
    )


def consumer_deadlines(state: CoordinatorState) -> list[int]:
    deadlines: list[int] = []
    for group in state.consumer_groups.values():
        for member in group.members.values():
            deadlines.append(member.session_deadline_ms)
            if member.rebalance_deadline_ms is not None:
                deadlines.append(member.rebalance_deadline_ms)
    return deadlines


def consumer_commit_error(
    group: ConsumerGroup, event: OffsetCommit | TxnOffsetCommit
) -> KafkaErrorCode | None:
    transactional = isinstance(event, TxnOffsetCommit)
    if event.generation_id < 0 and not group.members:
        return None  # a standalone consumer (or the admin client) commits for an Empty group
    if (
        transactional
        and event.generation_id == NO_GENERATION
        and event.member_id == UNKNOWN_MEMBER_ID
        and event.group_instance_id is None
    ):
        return None  # a producer that does not name its consumer: not checked
    member = group.members.get(event.member_id)
    if member is None:
        return Error.UNKNOWN_MEMBER_ID
    if (
        isinstance(event, OffsetCommit)
        and 0 <= event.api_version < OFFSET_COMMIT_CONSUMER_MIN_VERSION
    ):
        return Error.UNSUPPORTED_VERSION
    if event.generation_id != member.member_epoch:
        return Error.STALE_MEMBER_EPOCH
    return None


def consumer_fetch_error(state: CoordinatorState, request: OffsetFetchGroup) -> KafkaErrorCode:
    group = state.consumer_groups.get(request.group_id)
    if group is None or (request.member_id is None and request.member_epoch < 0):
        return Error.NONE
    member = group.members.get(request.member_id or "")
    if member is None:
        return Error.UNKNOWN_MEMBER_ID
    if request.member_epoch != member.member_epoch:
        return Error.STALE_MEMBER_EPOCH
    return Error.NONE


def describe_consumer_group(
    state: CoordinatorState, group_id: str, params: GroupParams
) -> DescribedConsumerGroup:
    group = state.consumer_groups.get(group_id)
    if group is None:
        message = (
            f"Group {group_id} is not a consumer group."
            if group_id in state.groups
            else f"Group {group_id} not found."
        )
        return DescribedConsumerGroup(group_id, Error.GROUP_ID_NOT_FOUND, message)
    members = tuple(
        DescribedConsumerMember(
            m.member_id,
            m.instance_id,
            m.rack_id,
            m.member_epoch,
            m.client_id,
            m.client_host,
            m.subscribed_topic_names,
            m.assigned,
            group.target.get(m.member_id, NO_PARTITIONS),
        )
        for m in group.members.values()
    )
    return DescribedConsumerGroup(
        group_id,
        Error.NONE,
        None,
        group.state.value,
        group.group_epoch,
        group.assignment_epoch,
        preferred_assignor(group, params),
        members,
    )


def on_consumer_group_describe(
    state: CoordinatorState, event: ConsumerGroupDescribe, params: GroupParams
) -> GroupTransition:
    described = tuple(describe_consumer_group(state, g, params) for g in event.group_ids)
    return _respond(state, Respond(event.request_id, ConsumerGroupDescribeResponse(described)))


def consumer_group_empty(group: ConsumerGroup) -> bool:
    return group.state is ConsumerGroupState.EMPTY
