"""What the coordinator holds of a KIP-848 consumer group (``group.protocol=consumer``): its
members with their epochs, assignments and reconciliation state, the group epoch, the target
assignment and its epoch, and the subscription metadata the target was computed from.

A group's state (Kafka's ``ConsumerGroupState``) is not stored but read from the rest:
``Empty`` without members, ``Assigning`` while the group epoch is ahead of the target
assignment's, ``Reconciling`` while a member is not yet at the target (its epoch behind, or
partitions still to revoke or to receive), ``Stable`` otherwise.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from automq_ref.state_machines.group.events import TopicPartition

Partitions = frozenset[TopicPartition]
NO_PARTITIONS: Partitions = frozenset()


class ConsumerGroupState(enum.Enum):
    """Kafka's names, as ListGroups and ConsumerGroupDescribe report them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


class MemberState(enum.Enum):
    """Where a member's reconciliation stands (Kafka's ``MemberState``)."""

    STABLE = "stable"  # it holds what it was told at its epoch
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # it must give partitions up first
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # partitions it is due are still owned


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] = ()
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Partitions = NO_PARTITIONS  # what it was told it may use
    pending_revocation: Partitions = NO_PARTITIONS  # what it must still give up
    session_deadline_ms: int = 0
    rebalance_deadline_ms: int | None = None  # while UNREVOKED_PARTITIONS: fenced then

    @property
    def owned(self) -> Partitions:
        """The partitions this member may be using: assigned or not yet revoked."""
        return self.assigned | self.pending_revocation

    def reconciled_to(self, epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == epoch


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: Mapping[str, ConsumerMember] = field(default_factory=dict)  # in join order
    target: Mapping[str, Partitions] = field(default_factory=dict)  # member id -> target
    # Subscribed topic -> partition count, as of the last group epoch bump.
    subscription_metadata: Mapping[str, int] = field(default_factory=dict)

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str | None) -> ConsumerMember | None:
        if instance_id is None:
            return None
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in m.subscribed_topic_names)

    def owned_by_others(self, member_id: str) -> Partitions:
        """Partitions another member may still be using (Kafka's current partition epochs)."""
        return frozenset(
            tp for mid, m in self.members.items() if mid != member_id for tp in m.owned
        )


def partitions_of(topics: Mapping[str, int], names: Iterable[str]) -> list[TopicPartition]:
    """Every partition of the topics ``names`` that ``topics`` knows, in order."""
    return [(t, p) for t in sorted(set(names)) if t in topics for p in range(topics[t])]
