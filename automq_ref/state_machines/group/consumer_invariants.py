"""The invariants of KIP-848 consumer groups, checked by the property test after every step:
no partition is owned by two members (assigned or still to revoke), the epochs are ordered,
targets only name members and subscribed partitions, a member waiting on a revocation has a
deadline; and between two states, a live member's epoch never goes down.
"""

from __future__ import annotations

from automq_ref.state_machines.group.consumer_state import MemberState
from automq_ref.state_machines.group.events import LEAVE_GROUP_STATIC_MEMBER_EPOCH
from automq_ref.state_machines.group.state import CoordinatorState
from automq_ref.state_machines.transition import InvariantViolation


def inv_group_ids_of_one_kind(state: CoordinatorState) -> None:
    both = set(state.groups) & set(state.consumer_groups)
    if both:
        raise InvariantViolation(f"groups both classic and consumer: {sorted(both)}")


def inv_partition_owned_once(state: CoordinatorState) -> None:
    """A partition is owned (assigned, or told and not yet revoked) by one member at most."""
    for group in state.consumer_groups.values():
        owner: dict[tuple[str, int], str] = {}
        for member_id, member in group.members.items():
            if member.assigned & member.pending_revocation:
                raise InvariantViolation(f"{member_id}: assigned and revoking at once")
            for tp in member.owned:
                if tp in owner:
                    raise InvariantViolation(
                        f"{group.group_id}: {tp} owned by {owner[tp]} and {member_id}"
                    )
                owner[tp] = member_id


def inv_consumer_epochs_ordered(state: CoordinatorState) -> None:
    for group in state.consumer_groups.values():
        if group.assignment_epoch > group.group_epoch:
            raise InvariantViolation(f"{group.group_id}: target ahead of the group epoch")
        for member in group.members.values():
            if member.member_epoch > group.assignment_epoch:
                raise InvariantViolation(f"{member.member_id}: epoch ahead of the target")
            if member.member_epoch < 0 and (
                member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH or member.instance_id is None
            ):
                raise InvariantViolation(f"{member.member_id}: epoch {member.member_epoch}")


def inv_consumer_targets_valid(state: CoordinatorState) -> None:
    """Targets name members only, give out subscribed partitions that exist, each once."""
    for group in state.consumer_groups.values():
        seen: set[tuple[str, int]] = set()
        for member_id, target in group.target.items():
            member = group.members.get(member_id)
            if member is None:
                raise InvariantViolation(f"{group.group_id}: target of non-member {member_id}")
            for topic, partition in target:
                if topic not in member.subscribed_topic_names or not (
                    0 <= partition < group.subscription_metadata.get(topic, 0)
                ):
                    raise InvariantViolation(f"{member_id}: target {topic}-{partition}")
            if seen & target:
                raise InvariantViolation(f"{group.group_id}: {seen & target} targeted twice")
            seen |= target


def inv_revocation_has_deadline(state: CoordinatorState) -> None:
    for group in state.consumer_groups.values():
        for member in group.members.values():
            revoking = member.state is MemberState.UNREVOKED_PARTITIONS
            if revoking != bool(member.pending_revocation):
                raise InvariantViolation(f"{member.member_id}: {member.state} {member}")
            if revoking and member.rebalance_deadline_ms is None:
                raise InvariantViolation(f"{member.member_id}: revoking without a deadline")


CONSUMER_INVARIANTS = (
    inv_group_ids_of_one_kind,
    inv_partition_owned_once,
    inv_consumer_epochs_ordered,
    inv_consumer_targets_valid,
    inv_revocation_has_deadline,
)


def inv_member_epoch_never_decreases(before: CoordinatorState, after: CoordinatorState) -> None:
    """Between two states, a member still in its group has an epoch at least as large, unless
    it is a static member leaving for a while (epoch -2); the group epoch only grows while the
    group is held."""
    for group_id, group in after.consumer_groups.items():
        old = before.consumer_groups.get(group_id)
        if old is None:
            continue
        if group.group_epoch < old.group_epoch:
            raise InvariantViolation(f"{group_id}: group epoch went down")
        for member_id, member in group.members.items():
            was = old.members.get(member_id)
            if (
                was is not None
                and member.member_epoch < was.member_epoch
                and member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
            ):
                raise InvariantViolation(
                    f"{member_id}: epoch {was.member_epoch} -> {member.member_epoch}"
                )
