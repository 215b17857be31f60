"""The coordinator's invariants as checks on a state (and one between two states); the property
test runs them after every step.
"""

from __future__ import annotations

from typing import Final

from automq_ref.state_machines.group.consumer_invariants import (
    CONSUMER_INVARIANTS,
    inv_member_epoch_never_decreases,
)
from automq_ref.state_machines.group.queries import (
    waiting_requests,
)
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupState,
)
from automq_ref.state_machines.transition import InvariantViolation


def inv_member_ids_unique(state: CoordinatorState) -> None:
    """No member id is held twice: not by two groups, not as member and pending member."""
    seen: dict[str, str] = {}
    for group in state.groups.values():
        for member_id in [*group.members, *group.pending_members]:
            if member_id in seen:
                raise InvariantViolation(
                    f"member {member_id} in {seen[member_id]} and in {group.group_id}"
                )
            seen[member_id] = group.group_id
        for member_id, member in group.members.items():
            if member.member_id != member_id:
                raise InvariantViolation(f"{group.group_id}: member filed under {member_id}")


def inv_leader_is_member(state: CoordinatorState) -> None:
    for group in state.groups.values():
        if group.members and group.leader_id not in group.members:
            raise InvariantViolation(f"{group.group_id}: leader {group.leader_id} not a member")
        if not group.members and group.leader_id is not None:
            raise InvariantViolation(f"{group.group_id}: leader {group.leader_id} of nobody")


def inv_empty_group_is_empty(state: CoordinatorState) -> None:
    for group in state.groups.values():
        if group.state is GroupState.DEAD:
            raise InvariantViolation(f"{group.group_id}: a Dead group is still held")
        if group.state is GroupState.EMPTY and (
            group.members
            or group.protocol_name is not None
            or group.join_deadline_ms is not None
            or group.pending_sync
        ):
            raise InvariantViolation(f"{group.group_id}: Empty but {group}")


def inv_common_protocol_exists(state: CoordinatorState) -> None:
    """A group with members has a protocol type they all share and a protocol they all speak;
    once a generation is formed its selected protocol is one of those."""
    for group in state.groups.values():
        if not group.members:
            continue
        types = {member.protocol_type for member in group.members.values()}
        if types != {group.protocol_type}:
            raise InvariantViolation(f"{group.group_id}: protocol types {types}")
        names = {n for member in group.members.values() for n in member.protocol_names}
        if not any(group.supporters(name) == len(group.members) for name in names):
            raise InvariantViolation(f"{group.group_id}: no protocol every member supports")
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and (
            group.protocol_name is None
            or group.supporters(group.protocol_name) != len(group.members)
        ):
            raise InvariantViolation(f"{group.group_id}: {group.protocol_name} not supported")


def inv_awaiting_join_only_while_preparing(state: CoordinatorState) -> None:
    for group in state.groups.values():
        for member in group.members.values():
            if (
                member.awaiting_join is not None
                and group.state is not GroupState.PREPARING_REBALANCE
            ):
                raise InvariantViolation(
                    f"{group.group_id}: {member.member_id} waits to join in {group.state.value}"
                )
            if member.is_new and member.awaiting_join is None:
                raise InvariantViolation(f"{member.member_id} is new but not joining")


def inv_awaiting_sync_only_while_completing(state: CoordinatorState) -> None:
    for group in state.groups.values():
        for member in group.members.values():
            if (
                member.awaiting_sync is not None
                and group.state is not GroupState.COMPLETING_REBALANCE
            ):
                raise InvariantViolation(
                    f"{group.group_id}: {member.member_id} waits to sync in {group.state.value}"
                )


def inv_stable_group_is_assigned(state: CoordinatorState) -> None:
    """A Stable group has a leader among its members, a protocol, and nobody waiting."""
    for group in state.groups.values():
        if group.state is not GroupState.STABLE:
            continue
        if not group.members or group.protocol_name is None:
            raise InvariantViolation(f"{group.group_id}: Stable without members or protocol")
        if any(m.awaiting_join or m.awaiting_sync for m in group.members.values()):
            raise InvariantViolation(f"{group.group_id}: Stable with requests waiting")


def inv_rebalance_timers_armed(state: CoordinatorState) -> None:
    """Every rebalance in progress has a timer that ends it, and waits for someone."""
    for group in state.groups.values():
        if group.state is GroupState.PREPARING_REBALANCE:
            if group.join_deadline_ms is None:
                raise InvariantViolation(f"{group.group_id}: rebalance without a join timer")
            if group.initial_delay_ms is None and group.all_joined():
                raise InvariantViolation(f"{group.group_id}: everyone joined, not completed")
        if group.state is GroupState.COMPLETING_REBALANCE and (
            group.leader_id not in group.pending_sync or group.sync_deadline_ms is None
        ):
            raise InvariantViolation(f"{group.group_id}: not waiting for the leader's sync")
        if not group.pending_sync <= set(group.members):
            raise InvariantViolation(f"{group.group_id}: pending sync of non-members")
        if group.pending_sync and group.state not in (
            GroupState.COMPLETING_REBALANCE,
            GroupState.STABLE,
        ):
            raise InvariantViolation(f"{group.group_id}: pending sync in {group.state.value}")


def inv_static_instance_ids_unique(state: CoordinatorState) -> None:
    for group in state.groups.values():
        instances = [
            m.group_instance_id for m in group.members.values() if m.group_instance_id is not None
        ]
        if len(instances) != len(set(instances)):
            raise InvariantViolation(f"{group.group_id}: instance ids {instances}")


def inv_deferred_requests_unique(state: CoordinatorState) -> None:
    waiting = waiting_requests(state)
    if len(waiting) != len(set(waiting)):
        raise InvariantViolation(f"a request waits twice: {sorted(waiting)}")


def inv_offsets_belong_to_groups(state: CoordinatorState) -> None:
    held = {*state.groups, *state.consumer_groups}
    for group_id, committed in state.offsets.items():
        if committed and group_id not in held:
            raise InvariantViolation(f"offsets of {group_id}, which is not held")
    for write in state.pending_writes.values():
        if write.offsets and write.group_ids[0] not in held:
            raise InvariantViolation(f"a commit in flight for {write.group_ids}, not held")
    for producer_id, by_group in state.txn_offsets.items():
        for group_id, pending in by_group.items():
            if pending and group_id not in held:
                raise InvariantViolation(
                    f"offsets of {group_id} held for producer {producer_id}, a group not held"
                )


INVARIANTS: Final = (
    inv_member_ids_unique,
    inv_leader_is_member,
    inv_empty_group_is_empty,
    inv_common_protocol_exists,
    inv_awaiting_join_only_while_preparing,
    inv_awaiting_sync_only_while_completing,
    inv_stable_group_is_assigned,
    inv_rebalance_timers_armed,
    inv_static_instance_ids_unique,
    inv_deferred_requests_unique,
    inv_offsets_belong_to_groups,
    *CONSUMER_INVARIANTS,
)


def inv_generation_never_decreases(before: CoordinatorState, after: CoordinatorState) -> None:
    """A transition invariant: while a group is held, its generation only grows."""
    for group_id, group in after.groups.items():
        old = before.groups.get(group_id)
        if old is not None and group.generation_id < old.generation_id:
            raise InvariantViolation(
                f"{group_id}: generation {old.generation_id} -> {group.generation_id}"
            )


TRANSITION_INVARIANTS: Final = (inv_generation_never_decreases, inv_member_epoch_never_decreases)


def check_invariants(state: CoordinatorState) -> None:
    for invariant in INVARIANTS:
        invariant(state)
