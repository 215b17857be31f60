"""Group: Kafka's consumer group coordinator, for the classic protocol
(JoinGroup/SyncGroup/Heartbeat/...) and KIP-848's consumer protocol (ConsumerGroupHeartbeat).

Spec: none (the behaviour is Kafka's ``GroupCoordinator``/``GroupMetadata`` for the classic
protocol that kafka-python, aiokafka and librdkafka speak by default, and its
``GroupMetadataManager`` for ``group.protocol=consumer``: see
:mod:`.consumer_heartbeat`, :mod:`.consumer_admin`, :mod:`.assignors`). Properties:
tests/properties/test_group.py::GroupMachine,
tests/properties/test_consumer_group.py::ConsumerGroupMachine. Examples:
tests/unit/test_group.py. Page: docs/machines/group.md.

Theory of operation
-------------------
The coordinator holds every group by id and the committed offsets of every group. It does no
I/O: the Kafka listener decodes a request into an event carrying a ``request_id`` (the shell's
handle to route the answer back to its connection) and ``now_ms``; ``step`` returns the new
state and a list of effects. An answer is the effect ``Respond(request_id, response)``, so an
answer can come later than its request: a JoinGroup is answered when the rebalance completes,
a follower's SyncGroup when the leader's assignment arrives, an OffsetCommit when the offsets are
durable. Time arrives as ``Tick(now_ms)``; durable writes come back as ``OffsetsPersisted``.
Every request is answered exactly once: when its member is removed, fenced or superseded, or
the rebalance it waits for is abandoned, it is answered with an error at that moment.

A group goes through Kafka's states::

    Empty --join--> PreparingRebalance --all joined / timer--> CompletingRebalance
      ^                  ^      |                                   | leader's SyncGroup
      |                  |      +--(no members left)--> Empty       v
      |                  +------ join with new metadata, leave, expiry ------ Stable

PreparingRebalance collects JoinGroups. Entered from Empty, it waits
``group.initial.rebalance.delay.ms`` (and, in generation 0, once more for every delay in which
a new member arrived, up to the rebalance timeout: Kafka's ``InitialDelayedJoin``); entered from
CompletingRebalance or Stable, it completes as soon as every member and every pending member
has rejoined, or when the largest rebalance timeout of the members passes. Completing the join
removes dynamic members that did not rejoin (static ones stay: they may come back with their
instance id), keeps the leader if it rejoined or else elects the first member that did, bumps
the generation, picks the protocol every member supports with the most first-choice votes, and
answers every waiting JoinGroup: the leader gets every member's metadata for that protocol.
CompletingRebalance waits for the leader's SyncGroup; its assignment (missing members get empty
bytes) answers every waiting SyncGroup and the group is Stable. A member that has not sent its
SyncGroup within the rebalance timeout is removed and the group rebalances (Kafka's
``DelayedSync``).

Member ids. JoinGroup v4+ with an empty member id gets ``MEMBER_ID_REQUIRED`` and a new id; the
id is *pending* (and holds up the rebalance) until the member rejoins with it or its session
timeout passes. Ids are ``<client id or instance id>-<member_id_token>-<n>``: ``n`` counts in
the state and the token is chosen by the shell at start-up, so a restarted coordinator never
hands out an id an old client still holds (Kafka uses a random UUID; a pure machine may not).

Static membership (KIP-345). A JoinGroup with a ``group_instance_id`` and an empty member id
never gets ``MEMBER_ID_REQUIRED``. If the instance id is already in the group the new member
replaces the old one: a JoinGroup or SyncGroup the old member still waits on is answered
``FENCED_INSTANCE_ID``, as is every later request carrying the old member id with that instance
id; the replacement keeps the old member's assignment and leadership. In Stable, when the
protocol the group would select is unchanged, it is answered at once with the current generation
(naming the old leader id, so a replaced leader does not reassign) and no rebalance happens; in
CompletingRebalance it forces a rebalance. Static members are only removed by their session
timeout, a pending-sync timeout, or a LeaveGroup naming their instance id.

Liveness. A member's session deadline moves to ``now + session timeout`` on a heartbeat, a
commit, an answered JoinGroup or SyncGroup. A member waiting on a JoinGroup or SyncGroup is not
expired (its request is the proof of life), except a *new* member whose first JoinGroup has
waited ``new_member_join_timeout_ms`` (Kafka: 5 minutes). Heartbeats in PreparingRebalance
answer ``REBALANCE_IN_PROGRESS`` (the member then rejoins); in CompletingRebalance ``NONE``.

Offsets. A commit from a member (generation and member id checked; allowed in Stable and
PreparingRebalance, ``REBALANCE_IN_PROGRESS`` in CompletingRebalance) or from a standalone
consumer (generation -1, empty member id; allowed only while the group is Empty, which it
creates) produces ``PersistOffsets``; the offsets become visible to OffsetFetch, and the commit
is answered, only once ``OffsetsPersisted`` says they are durable, as in Kafka (whose cache takes
a commit only in the append callback). So a reader never sees an offset a crash could lose.
Writes carry a sequence number in emission order; the shell appends them in that order, and a
completion applies an offset only over an older write's, so completions may come back in any
order. ``DeleteGroups`` (only Empty groups: ``NON_EMPTY_GROUP`` otherwise, ``GROUP_ID_NOT_FOUND``
for unknown ones) removes the group and its offsets at once and answers once the tombstone is
durable (``PersistGroupDeletion``); a commit of that group still in flight is answered but no
longer applied (its record precedes the tombstone in the log, so replay agrees). OffsetDelete
(Kafka's ``deleteOffsets``) deletes a group's offsets of some partitions the same way
(``PersistOffsetDeletion``, a tombstone per offset the log holds), refusing ``GROUP_ID_NOT_FOUND``
for an unknown group, ``NON_EMPTY_GROUP`` for a group with members of another protocol type than
``consumer``, and ``GROUP_SUBSCRIBED_TO_TOPIC`` for the partitions of a topic the members of the
group's generation subscribe to (read from their metadata as the join completed). ``recover``
folds the durable records back into a state after a restart. An OffsetFetch with
``require_stable`` (v7+; librdkafka's read_committed consumers) answers a partition whose commit
is still in flight, or held in a transaction not ended, ``UNSTABLE_OFFSET_COMMIT`` (Kafka's
``hasPendingOffsetCommitsForTopicPartition``); the client asks again.

Group metadata is not durable (no ``PersistGroup``): after a restart every group is Empty at
generation 0 with its offsets, old member ids are unknown (``UNKNOWN_MEMBER_ID``) and clients
rejoin. Kafka writes the group's metadata on every generation and restores it; the difference is
one extra rebalance after a coordinator restart, which every client handles.

Where this deviates from Kafka, on purpose: requests Kafka silently drops are answered (a
JoinGroup or SyncGroup superseded by a newer one from the same member: ``REBALANCE_IN_PROGRESS``;
the SyncGroup of a member removed while it waited: ``UNKNOWN_MEMBER_ID``); protocol votes that tie
go to the protocol voted for by the earliest member (Kafka: hash order); an Empty group with no
members, pending members, offsets (shown or held for a transaction) or writes in flight is
forgotten at the next Tick (Kafka: the periodic offsets cleanup). Not modelled:
``group.max.size``, offset retention, JoinGroup v9's ``skip_assignment`` (clients use v5..v7),
KIP-848 groups.

Timers fire only on ``Tick``: within one tick, per group in id order, pending members expire,
then members, then the join timer, then the sync timer; a timer re-armed at the tick's own time
fires in the same tick (a few rounds at most). ``next_deadline_ms`` tells the shell when
the next one is due.

Layout
------
``events`` holds the requests and completions the coordinator takes; ``responses`` its answers
and the effects that carry them (``Respond``) or make offsets durable (``PersistOffsets``,
``PersistGroupDeletion``); ``state`` the groups, members and offsets it holds; ``rebalance`` the
group helpers the handlers share (Kafka's private GroupCoordinator methods); ``membership`` the
handlers of JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the timers (``Tick``); ``offsets``
OffsetCommit, its durable completion, OffsetFetch and ``recover``; ``admin`` ListGroups,
DescribeGroups, DeleteGroups and OffsetDelete; ``step`` the dispatch; ``queries`` what the shell
asks of a state; ``invariants`` the checks the property test runs after every step.
"""

from __future__ import annotations

from automq_ref.state_machines.group.admin import (
    describe_group,
)
from automq_ref.state_machines.group.assignors import ASSIGNORS, assign
from automq_ref.state_machines.group.consumer_state import (
    ConsumerGroup,
    ConsumerGroupState,
    ConsumerMember,
    MemberState,
)
from automq_ref.state_machines.group.events import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_GROUP_TYPE,
    CONSUMER_PROTOCOL_TYPE,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    NO_GENERATION,
    NO_LEADER_EPOCH,
    NO_OFFSET,
    UNKNOWN_MEMBER_ID,
    ConsumerGroupDescribe,
    ConsumerGroupHeartbeat,
    DeleteGroups,
    DescribeGroups,
    Error,
    GroupEvent,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    LeavingMember,
    ListGroups,
    MemberAssignment,
    OffsetCommit,
    OffsetCommitEntry,
    OffsetDelete,
    OffsetFetch,
    OffsetFetchGroup,
    OffsetsPersisted,
    OffsetsPersistFailed,
    Protocol,
    SyncGroup,
    Tick,
    TopicPartition,
    TxnMarker,
    TxnOffsetCommit,
)
from automq_ref.state_machines.group.invariants import (
    INVARIANTS,
    TRANSITION_INVARIANTS,
    check_invariants,
    inv_awaiting_join_only_while_preparing,
    inv_awaiting_sync_only_while_completing,
    inv_common_protocol_exists,
    inv_deferred_requests_unique,
    inv_empty_group_is_empty,
    inv_generation_never_decreases,
    inv_leader_is_member,
    inv_member_ids_unique,
    inv_offsets_belong_to_groups,
    inv_rebalance_timers_armed,
    inv_stable_group_is_assigned,
    inv_static_instance_ids_unique,
)
from automq_ref.state_machines.group.offsets import (
    committed_offset,
    recover,
    unstable_offset,
)
from automq_ref.state_machines.group.queries import (
    next_deadline_ms,
    waiting_requests,
)
from automq_ref.state_machines.group.rebalance import (
    select_protocol,
)
from automq_ref.state_machines.group.responses import (
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
    DeletedGroupResult,
    DeleteGroupsResponse,
    DescribedConsumerGroup,
    DescribedConsumerMember,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsResponse,
    DurableRecord,
    FetchedOffset,
    GroupEffect,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupResponse,
    LeaveGroupMemberResult,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsResponse,
    OffsetCommitPartitionResult,
    OffsetCommitResponse,
    OffsetDeletePartitionResult,
    OffsetDeleteResponse,
    OffsetFetchGroupResult,
    OffsetFetchResponse,
    OffsetRecord,
    PersistGroupDeletion,
    PersistOffsetDeletion,
    PersistOffsets,
    Respond,
    Response,
    SyncGroupResponse,
)
from automq_ref.state_machines.group.state import (
    CommittedOffset,
    CoordinatorState,
    Group,
    GroupParams,
    GroupState,
    GroupTransition,
    Member,
    PendingWrite,
)
from automq_ref.state_machines.group.step import (
    step,
)
from automq_ref.state_machines.transition import InvariantViolation, Rejected, Transition

__all__ = [
    "ASSIGNORS",
    "CLASSIC_GROUP_TYPE",
    "CONSUMER_GROUP_TYPE",
    "CONSUMER_PROTOCOL_TYPE",
    "INVARIANTS",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "NO_GENERATION",
    "NO_LEADER_EPOCH",
    "NO_OFFSET",
    "TRANSITION_INVARIANTS",
    "UNKNOWN_MEMBER_ID",
    "CommittedOffset",
    "ConsumerGroup",
    "ConsumerGroupDescribe",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeat",
    "ConsumerGroupHeartbeatResponse",
    "ConsumerGroupState",
    "ConsumerMember",
    "CoordinatorState",
    "DeleteGroups",
    "DeleteGroupsResponse",
    "DeletedGroupResult",
    "DescribeGroups",
    "DescribeGroupsResponse",
    "DescribedConsumerGroup",
    "DescribedConsumerMember",
    "DescribedGroup",
    "DescribedMember",
    "DurableRecord",
    "Error",
    "FetchedOffset",
    "Group",
    "GroupEffect",
    "GroupEvent",
    "GroupParams",
    "GroupState",
    "GroupTransition",
    "Heartbeat",
    "HeartbeatResponse",
    "InvariantViolation",
    "JoinGroup",
    "JoinGroupMember",
    "JoinGroupResponse",
    "LeaveGroup",
    "LeaveGroupMemberResult",
    "LeaveGroupResponse",
    "LeavingMember",
    "ListGroups",
    "ListGroupsResponse",
    "ListedGroup",
    "Member",
    "MemberAssignment",
    "MemberState",
    "OffsetCommit",
    "OffsetCommitEntry",
    "OffsetCommitPartitionResult",
    "OffsetCommitResponse",
    "OffsetDelete",
    "OffsetDeletePartitionResult",
    "OffsetDeleteResponse",
    "OffsetFetch",
    "OffsetFetchGroup",
    "OffsetFetchGroupResult",
    "OffsetFetchResponse",
    "OffsetRecord",
    "OffsetsPersistFailed",
    "OffsetsPersisted",
    "PendingWrite",
    "PersistGroupDeletion",
    "PersistOffsetDeletion",
    "PersistOffsets",
    "Protocol",
    "Rejected",
    "Respond",
    "Response",
    "SyncGroup",
    "SyncGroupResponse",
    "Tick",
    "TopicPartition",
    "Transition",
    "TxnMarker",
    "TxnOffsetCommit",
    "assign",
    "check_invariants",
    "committed_offset",
    "describe_group",
    "inv_awaiting_join_only_while_preparing",
    "inv_awaiting_sync_only_while_completing",
    "inv_common_protocol_exists",
    "inv_deferred_requests_unique",
    "inv_empty_group_is_empty",
    "inv_generation_never_decreases",
    "inv_leader_is_member",
    "inv_member_ids_unique",
    "inv_offsets_belong_to_groups",
    "inv_rebalance_timers_armed",
    "inv_stable_group_is_assigned",
    "inv_static_instance_ids_unique",
    "next_deadline_ms",
    "recover",
    "select_protocol",
    "step",
    "unstable_offset",
    "waiting_requests",
]
