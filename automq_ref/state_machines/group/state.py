"""The coordinator's state: every group (Kafka's states, members, pending members, timers), the
committed offsets, the durable writes in flight; and the broker settings it runs under.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from automq_ref.state_machines.group.consumer_state import ConsumerGroup
from automq_ref.state_machines.group.events import (
    CONSUMER_PROTOCOL_TYPE,
    Protocol,
    TopicPartition,
)
from automq_ref.state_machines.group.responses import (
    GroupEffect,
    Respond,
    Response,
)
from automq_ref.state_machines.transition import Transition


class GroupState(enum.Enum):
    """Kafka's names, as ListGroups and DescribeGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"  # only reported for groups the coordinator does not hold


@dataclass(frozen=True, slots=True)
class GroupParams:
    """Broker settings (Kafka property names in the comments)."""

    group_min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    group_initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    new_member_join_timeout_ms: int = 300_000  # GroupCoordinator.NewMemberJoinTimeoutMs
    offset_metadata_max_bytes: int = 4_096  # offset.metadata.max.bytes
    member_id_token: str = "0"  # chosen by the shell per start-up (e.g. random hex)
    # KIP-848 consumer groups (group.protocol=consumer):
    consumer_session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    consumer_heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    consumer_max_size: int = 2**31 - 1  # group.consumer.max.size
    consumer_assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    awaiting_join: int | None = None  # request id of the JoinGroup answered at join completion
    awaiting_sync: int | None = None  # request id of the SyncGroup answered by the leader's sync
    is_new: bool = False  # joined with an empty member id and not yet answered
    session_deadline_ms: int = 0

    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(protocol.name for protocol in self.protocols)

    def metadata_for(self, protocol_name: str) -> bytes:
        for protocol in self.protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        raise KeyError(protocol_name)


@dataclass(frozen=True, slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: Mapping[str, Member] = field(default_factory=dict)  # in join order
    pending_members: Mapping[str, int] = field(default_factory=dict)  # member id -> deadline
    pending_sync: frozenset[str] = frozenset()  # members of this generation yet to SyncGroup
    join_deadline_ms: int | None = None  # PreparingRebalance: when the join completes anyway
    initial_delay_ms: int | None = None  # set while the join timer is an initial delay
    initial_remaining_ms: int = 0
    new_member_added: bool = False
    sync_deadline_ms: int | None = None
    # The topics the members of the last generation subscribe to (a ``consumer`` group's,
    # read from their metadata as its join completed; empty once Empty), None when unknown
    # (Kafka's ``subscribedTopics``: never computed, another protocol type, metadata that
    # does not parse).
    subscribed_topics: frozenset[str] | None = None

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        if group_instance_id is None:
            return None
        for member in self.members.values():
            if member.group_instance_id == group_instance_id:
                return member.member_id
        return None

    def is_subscribed_to(self, topic: str) -> bool:
        """Whether the group consumes ``topic`` (Kafka's ``isSubscribedToTopic``): a topic of
        its members' subscriptions; when those are unknown, any topic if it is a ``consumer``
        group."""
        if self.subscribed_topics is None:
            return self.protocol_type == CONSUMER_PROTOCOL_TYPE
        return topic in self.subscribed_topics

    def supporters(self, protocol_name: str) -> int:
        return sum(protocol_name in member.protocol_names for member in self.members.values())

    def all_joined(self) -> bool:
        return not self.pending_members and all(
            member.awaiting_join is not None for member in self.members.values()
        )


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    write_seq: int = 0  # the durable write that set it (0: recovered)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A durable write in flight and the answers it leads to."""

    seq: int
    group_ids: tuple[str, ...]
    offsets: tuple[tuple[TopicPartition, CommittedOffset], ...]  # applied when durable
    response: Response
    failure_response: Response
    producer_id: int = -1  # a TxnOffsetCommit's: the offsets wait for the transaction's marker


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    groups: Mapping[str, Group] = field(default_factory=dict)  # classic groups
    # KIP-848 consumer groups; a group id is in one of the two maps at most.
    consumer_groups: Mapping[str, ConsumerGroup] = field(default_factory=dict)
    offsets: Mapping[str, Mapping[TopicPartition, CommittedOffset]] = field(default_factory=dict)
    pending_writes: Mapping[int, PendingWrite] = field(default_factory=dict)  # by request id
    # Per producer id, per group: offsets durable in a transaction not ended yet.
    txn_offsets: Mapping[int, Mapping[str, Mapping[TopicPartition, CommittedOffset]]] = field(
        default_factory=dict
    )
    now_ms: int = 0
    next_member_number: int = 0
    next_write_seq: int = 1


GroupTransition: TypeAlias = Transition[CoordinatorState, GroupEffect]


def _with_group(state: CoordinatorState, group: Group) -> CoordinatorState:
    return replace(state, groups={**state.groups, group.group_id: group})


def _with_consumer_group(state: CoordinatorState, group: ConsumerGroup) -> CoordinatorState:
    return replace(state, consumer_groups={**state.consumer_groups, group.group_id: group})


def _respond(state: CoordinatorState, answer: Respond) -> GroupTransition:
    return Transition(state, (answer,))
