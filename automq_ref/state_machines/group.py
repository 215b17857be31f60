"""Group: the classic Kafka consumer group coordinator (JoinGroup/SyncGroup/Heartbeat/...).

Spec: none (the behaviour is Kafka's ``GroupCoordinator``/``GroupMetadata``, the classic
protocol that kafka-python, aiokafka and librdkafka speak). Properties:
tests/properties/test_group.py::GroupMachine. Examples: tests/unit/test_group.py.
Page: docs/machines/group.md.

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
longer applied (its record precedes the tombstone in the log, so replay agrees). ``recover``
folds the durable records back into a state after a restart.

Group metadata is not durable (no ``PersistGroup``): after a restart every group is Empty at
generation 0 with its offsets, old member ids are unknown (``UNKNOWN_MEMBER_ID``) and clients
rejoin. Kafka writes the group's metadata on every generation and restores it; the difference is
one extra rebalance after a coordinator restart, which every client handles.

Where this deviates from Kafka, on purpose: requests Kafka silently drops are answered (a
JoinGroup or SyncGroup superseded by a newer one from the same member: ``REBALANCE_IN_PROGRESS``;
the SyncGroup of a member removed while it waited: ``UNKNOWN_MEMBER_ID``); protocol votes that tie
go to the protocol voted for by the earliest member (Kafka: hash order); an Empty group with no
members, pending members, offsets or writes in flight is forgotten at the next Tick (Kafka: the
periodic offsets cleanup). Not modelled: ``group.max.size``, offset retention, transactional
offset commits, JoinGroup v9's ``skip_assignment`` (clients use v5..v7), KIP-848 groups.

Timers fire only on ``Tick``: within one tick, per group in id order, pending members expire,
then members, then the join timer, then the sync timer; a timer re-armed at the tick's own time
fires in the same tick (a few rounds at most). ``next_deadline_ms`` tells the shell when
the next one is due.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.errors import KafkaErrorCode

UNKNOWN_MEMBER_ID: Final = ""
NO_GENERATION: Final = -1
NO_OFFSET: Final = -1
NO_LEADER_EPOCH: Final = -1
CLASSIC_GROUP_TYPE: Final = "classic"

Error = KafkaErrorCode
TopicPartition: TypeAlias = tuple[str, int]


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


# ======================================================================================= state


@dataclass(frozen=True, slots=True)
class Protocol:
    """One (assignor name, subscription metadata) pair of a JoinGroup, in preference order."""

    name: str
    metadata: bytes


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


# ============================================================================ responses


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    error_code: KafkaErrorCode
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = UNKNOWN_MEMBER_ID
    members: tuple[JoinGroupMember, ...] = ()  # only the leader's answer lists them


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: KafkaErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class LeaveGroupMemberResult:
    member_id: str
    group_instance_id: str | None
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    """v0..v2 carry one member and no list: their error is ``error_code`` if it is not NONE,
    else the only member's."""

    error_code: KafkaErrorCode
    members: tuple[LeaveGroupMemberResult, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetCommitPartitionResult:
    topic: str
    partition: int
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    partitions: tuple[OffsetCommitPartitionResult, ...]


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int  # NO_OFFSET when nothing is committed
    leader_epoch: int
    metadata: str
    error_code: KafkaErrorCode = KafkaErrorCode.NONE


@dataclass(frozen=True, slots=True)
class OffsetFetchGroupResult:
    group_id: str
    error_code: KafkaErrorCode
    partitions: tuple[FetchedOffset, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    """v8+ answer per group; v0..v7 asked for one group and answer with ``groups[0]``."""

    groups: tuple[OffsetFetchGroupResult, ...]


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True, slots=True)
class ListGroupsResponse:
    error_code: KafkaErrorCode
    groups: tuple[ListedGroup, ...]


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    """An unknown group is reported Dead with ``GROUP_ID_NOT_FOUND`` (DescribeGroups v6); for
    v0..v5 Kafka reports it Dead with ``NONE``, which the shell substitutes."""

    group_id: str
    error_code: KafkaErrorCode
    group_state: str
    protocol_type: str
    protocol_data: str  # the selected protocol, only while Stable
    members: tuple[DescribedMember, ...]


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse:
    groups: tuple[DescribedGroup, ...]


@dataclass(frozen=True, slots=True)
class DeletedGroupResult:
    group_id: str
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse:
    results: tuple[DeletedGroupResult, ...]


Response: TypeAlias = (
    JoinGroupResponse
    | SyncGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | ListGroupsResponse
    | DescribeGroupsResponse
    | DeleteGroupsResponse
)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A durable write in flight and the answers it leads to."""

    seq: int
    group_ids: tuple[str, ...]
    offsets: tuple[tuple[TopicPartition, CommittedOffset], ...]  # applied when durable
    response: Response
    failure_response: Response


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    groups: Mapping[str, Group] = field(default_factory=dict)
    offsets: Mapping[str, Mapping[TopicPartition, CommittedOffset]] = field(default_factory=dict)
    pending_writes: Mapping[int, PendingWrite] = field(default_factory=dict)  # by request id
    now_ms: int = 0
    next_member_number: int = 0
    next_write_seq: int = 1


# ================================================================================== events


@dataclass(frozen=True, slots=True)
class JoinGroup:
    request_id: int
    now_ms: int
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int  # v0: the session timeout
    protocol_type: str
    protocols: tuple[Protocol, ...]
    require_known_member_id: bool = True  # v4+


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroup:
    request_id: int
    now_ms: int
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    assignments: tuple[MemberAssignment, ...] = ()  # from the leader only
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class Heartbeat:
    request_id: int
    now_ms: int
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    request_id: int
    now_ms: int
    group_id: str
    members: tuple[LeavingMember, ...]  # v0..v2: the one member_id of the request


@dataclass(frozen=True, slots=True)
class OffsetCommitEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""  # a null metadata is ""


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    request_id: int
    now_ms: int
    group_id: str
    generation_id: int  # -1: a standalone consumer (no group management)
    member_id: str
    group_instance_id: str | None
    offsets: tuple[OffsetCommitEntry, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchGroup:
    group_id: str
    partitions: tuple[TopicPartition, ...] | None  # None: every committed partition


@dataclass(frozen=True, slots=True)
class OffsetFetch:
    request_id: int
    now_ms: int
    groups: tuple[OffsetFetchGroup, ...]


@dataclass(frozen=True, slots=True)
class ListGroups:
    request_id: int
    now_ms: int
    states_filter: tuple[str, ...] = ()  # v4+, case-insensitive
    types_filter: tuple[str, ...] = ()  # v5+, case-insensitive


@dataclass(frozen=True, slots=True)
class DescribeGroups:
    request_id: int
    now_ms: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroups:
    request_id: int
    now_ms: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    now_ms: int


@dataclass(frozen=True, slots=True)
class OffsetsPersisted:
    """The write of ``PersistOffsets``/``PersistGroupDeletion(request_id, ...)`` is durable."""

    request_id: int


@dataclass(frozen=True, slots=True)
class OffsetsPersistFailed:
    """That write failed and is known not to be in the log."""

    request_id: int


GroupEvent: TypeAlias = (
    JoinGroup
    | SyncGroup
    | Heartbeat
    | LeaveGroup
    | OffsetCommit
    | OffsetFetch
    | ListGroups
    | DescribeGroups
    | DeleteGroups
    | Tick
    | OffsetsPersisted
    | OffsetsPersistFailed
)

# ================================================================================= effects


@dataclass(frozen=True, slots=True)
class Respond:
    request_id: int
    response: Response


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PersistOffsets:
    """Append these offsets durably (after every earlier write), then send OffsetsPersisted."""

    request_id: int
    group_id: str
    offsets: tuple[OffsetRecord, ...]


@dataclass(frozen=True, slots=True)
class PersistGroupDeletion:
    """Append a tombstone for each group's offsets, then send OffsetsPersisted."""

    request_id: int
    group_ids: tuple[str, ...]


GroupEffect: TypeAlias = Respond | PersistOffsets | PersistGroupDeletion
DurableRecord: TypeAlias = PersistOffsets | PersistGroupDeletion


@dataclass(frozen=True, slots=True)
class Transition:
    state: CoordinatorState
    effects: tuple[GroupEffect, ...]


class GroupError(ValueError):
    """An event the coordinator cannot accept: a completion for no write, a reused request id."""


# ============================================================================ dispatch


def step(state: CoordinatorState, event: GroupEvent, params: GroupParams) -> Transition:
    if not isinstance(event, OffsetsPersisted | OffsetsPersistFailed):
        # Time never runs backwards: a late-stamped event happens now.
        state = replace(state, now_ms=max(state.now_ms, event.now_ms))
        if event.now_ms != state.now_ms:
            event = replace(event, now_ms=state.now_ms)
    match event:
        case JoinGroup():
            return _on_join_group(state, event, params)
        case SyncGroup():
            return _on_sync_group(state, event, params)
        case Heartbeat():
            return _on_heartbeat(state, event)
        case LeaveGroup():
            return _on_leave_group(state, event, params)
        case OffsetCommit():
            return _on_offset_commit(state, event, params)
        case OffsetFetch():
            return _on_offset_fetch(state, event)
        case ListGroups():
            return _on_list_groups(state, event)
        case DescribeGroups():
            return _on_describe_groups(state, event)
        case DeleteGroups():
            return _on_delete_groups(state, event)
        case Tick():
            return _on_tick(state, params)
        case OffsetsPersisted():
            return _on_offsets_persisted(state, event)
        case OffsetsPersistFailed():
            return _on_offsets_persist_failed(state, event)


# ======================================================================= group helpers
#
# Each takes a group and returns the new group plus the answers it produced; they mirror
# GroupCoordinator's private methods of the same names.

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
        return replace(base, state=GroupState.EMPTY, protocol_name=None, leader_id=None), []
    group = replace(
        base, state=GroupState.COMPLETING_REBALANCE, protocol_name=select_protocol(base)
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


# ============================================================================= JoinGroup


def _new_member_id(state: CoordinatorState, prefix: str, params: GroupParams) -> str:
    return f"{prefix}-{params.member_id_token}-{state.next_member_number}"


def _on_join_group(state: CoordinatorState, event: JoinGroup, params: GroupParams) -> Transition:
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


# ============================================================================= SyncGroup


def _on_sync_group(state: CoordinatorState, event: SyncGroup, params: GroupParams) -> Transition:
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


# ============================================================================= Heartbeat


def _on_heartbeat(state: CoordinatorState, event: Heartbeat) -> Transition:
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


# ============================================================================ LeaveGroup


def _on_leave_group(state: CoordinatorState, event: LeaveGroup, params: GroupParams) -> Transition:
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


# ========================================================================== OffsetCommit


def _commit_error(event: OffsetCommit, error: KafkaErrorCode) -> Respond:
    keys = dict.fromkeys((entry.topic, entry.partition) for entry in event.offsets)
    results = tuple(OffsetCommitPartitionResult(t, p, error) for t, p in keys)
    return Respond(event.request_id, OffsetCommitResponse(results))


def _validate_offset_commit(group: Group, event: OffsetCommit) -> KafkaErrorCode | None:
    if (
        event.generation_id >= 0
        or event.member_id != UNKNOWN_MEMBER_ID
        or event.group_instance_id is not None
    ):
        error = _validate_current_member(group, event.member_id, event.group_instance_id)
        if error is None and event.generation_id != group.generation_id:
            error = Error.ILLEGAL_GENERATION
        return error
    if group.state is not GroupState.EMPTY:
        return Error.UNKNOWN_MEMBER_ID  # only members commit for a group that has members
    return None


def _on_offset_commit(
    state: CoordinatorState, event: OffsetCommit, params: GroupParams
) -> Transition:
    _check_new_request_id(state, event.request_id)
    group = state.groups.get(event.group_id)
    if group is None:
        if event.generation_id >= 0:
            return _respond(state, _commit_error(event, Error.ILLEGAL_GENERATION))
        group = Group(event.group_id)  # a standalone consumer's group: created Empty
        state = _with_group(state, group)
    error = _validate_offset_commit(group, event)
    if error is None and group.state is GroupState.COMPLETING_REBALANCE:
        error = Error.REBALANCE_IN_PROGRESS
    if error is not None:
        return _respond(state, _commit_error(event, error))
    if event.member_id in group.members:
        state = _with_group(state, _heartbeat(group, event.member_id, state.now_ms))
    results: dict[TopicPartition, KafkaErrorCode] = {}
    accepted: dict[TopicPartition, CommittedOffset] = {}
    seq = state.next_write_seq
    for entry in event.offsets:
        key = (entry.topic, entry.partition)
        if len(entry.metadata) > params.offset_metadata_max_bytes:
            results[key] = Error.OFFSET_METADATA_TOO_LARGE
            accepted.pop(key, None)
        else:
            results[key] = Error.NONE
            accepted[key] = CommittedOffset(
                entry.offset, entry.leader_epoch, entry.metadata, state.now_ms, seq
            )
    response = OffsetCommitResponse(
        tuple(OffsetCommitPartitionResult(t, p, error) for (t, p), error in results.items())
    )
    if not accepted:
        return _respond(state, Respond(event.request_id, response))
    failure = OffsetCommitResponse(
        tuple(
            OffsetCommitPartitionResult(
                t, p, Error.COORDINATOR_NOT_AVAILABLE if (t, p) in accepted else error
            )
            for (t, p), error in results.items()
        )
    )
    write = PendingWrite(seq, (event.group_id,), tuple(accepted.items()), response, failure)
    state = replace(
        state,
        pending_writes={**state.pending_writes, event.request_id: write},
        next_write_seq=seq + 1,
    )
    records = tuple(
        OffsetRecord(t, p, c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms)
        for (t, p), c in accepted.items()
    )
    return Transition(state, (PersistOffsets(event.request_id, event.group_id, records),))


def _on_offsets_persisted(state: CoordinatorState, event: OffsetsPersisted) -> Transition:
    write = state.pending_writes.get(event.request_id)
    if write is None:
        raise GroupError(f"no write in flight for request {event.request_id}")
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    offsets = dict(state.offsets)
    if write.offsets:
        (group_id,) = write.group_ids
        committed = dict(offsets.get(group_id, {}))
        for key, offset in write.offsets:
            current = committed.get(key)
            if current is None or current.write_seq < offset.write_seq:
                committed[key] = offset
        offsets[group_id] = committed
    state = replace(state, pending_writes=pending, offsets=offsets)
    return Transition(state, (Respond(event.request_id, write.response),))


def _on_offsets_persist_failed(state: CoordinatorState, event: OffsetsPersistFailed) -> Transition:
    write = state.pending_writes.get(event.request_id)
    if write is None:
        raise GroupError(f"no write in flight for request {event.request_id}")
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    state = replace(state, pending_writes=pending)
    return Transition(state, (Respond(event.request_id, write.failure_response),))


# =================================================================== OffsetFetch and admin


def committed_offset(state: CoordinatorState, group_id: str, key: TopicPartition) -> FetchedOffset:
    committed = state.offsets.get(group_id, {}).get(key)
    if committed is None:
        return FetchedOffset(key[0], key[1], NO_OFFSET, NO_LEADER_EPOCH, "")
    return FetchedOffset(
        key[0], key[1], committed.offset, committed.leader_epoch, committed.metadata
    )


def _on_offset_fetch(state: CoordinatorState, event: OffsetFetch) -> Transition:
    results: list[OffsetFetchGroupResult] = []
    for request in event.groups:
        # Answered whatever the group's state: standalone consumers have no group to speak of.
        keys = request.partitions
        if keys is None:
            keys = tuple(sorted(state.offsets.get(request.group_id, {})))
        partitions = tuple(committed_offset(state, request.group_id, key) for key in keys)
        results.append(OffsetFetchGroupResult(request.group_id, Error.NONE, partitions))
    return _respond(state, Respond(event.request_id, OffsetFetchResponse(tuple(results))))


def _on_list_groups(state: CoordinatorState, event: ListGroups) -> Transition:
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


def _on_describe_groups(state: CoordinatorState, event: DescribeGroups) -> Transition:
    described = tuple(describe_group(state, group_id) for group_id in event.group_ids)
    return _respond(state, Respond(event.request_id, DescribeGroupsResponse(described)))


def _on_delete_groups(state: CoordinatorState, event: DeleteGroups) -> Transition:
    _check_new_request_id(state, event.request_id)
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
    """Drop the group and its offsets; commits of it still in flight will not apply."""
    groups = {gid: g for gid, g in state.groups.items() if gid != group_id}
    offsets = {gid: o for gid, o in state.offsets.items() if gid != group_id}
    pending = {
        rid: replace(write, offsets=())
        if write.offsets and write.group_ids == (group_id,)
        else write
        for rid, write in state.pending_writes.items()
    }
    return replace(state, groups=groups, offsets=offsets, pending_writes=pending)


# ================================================================================== Tick


_TICK_ROUNDS_MAX: Final = 4


def _on_tick(state: CoordinatorState, params: GroupParams) -> Transition:
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
    return (
        group.state is GroupState.EMPTY
        and not group.pending_members
        and not state.offsets.get(group.group_id)
        and not any(group.group_id in w.group_ids for w in state.pending_writes.values())
    )


# ================================================================================= helpers


def _with_group(state: CoordinatorState, group: Group) -> CoordinatorState:
    return replace(state, groups={**state.groups, group.group_id: group})


def _respond(state: CoordinatorState, answer: Respond) -> Transition:
    return Transition(state, (answer,))


def _check_new_request_id(state: CoordinatorState, request_id: int) -> None:
    if request_id in state.pending_writes:
        raise GroupError(f"request id {request_id} is already waiting for a write")


# ================================================================================= queries


def next_deadline_ms(state: CoordinatorState) -> int | None:
    """When the next timer is due (the shell sends a Tick then); None when nothing is."""
    deadlines: list[int] = []
    for group in state.groups.values():
        deadlines.extend(group.pending_members.values())
        deadlines.extend(
            member.session_deadline_ms
            for member in group.members.values()
            if member.is_new or (member.awaiting_join is None and member.awaiting_sync is None)
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.join_deadline_ms is not None:
            deadlines.append(group.join_deadline_ms)
        if group.sync_deadline_ms is not None and group.pending_sync:
            deadlines.append(group.sync_deadline_ms)
    return min(deadlines, default=None)


def recover(records: Iterable[DurableRecord]) -> CoordinatorState:
    """The coordinator after a restart: the durable records replayed in log order; every group
    with offsets is Empty at generation 0."""
    offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
    for record in records:
        match record:
            case PersistOffsets():
                committed = offsets.setdefault(record.group_id, {})
                for r in record.offsets:
                    committed[(r.topic, r.partition)] = CommittedOffset(
                        r.offset, r.leader_epoch, r.metadata, r.commit_timestamp_ms
                    )
            case PersistGroupDeletion():
                for group_id in record.group_ids:
                    offsets.pop(group_id, None)
    groups = {group_id: Group(group_id) for group_id, committed in offsets.items() if committed}
    kept = {group_id: committed for group_id, committed in offsets.items() if committed}
    return CoordinatorState(groups=groups, offsets=kept)


# ============================================================================== invariants


class InvariantViolation(AssertionError):
    pass


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


def waiting_requests(state: CoordinatorState) -> list[int]:
    """Request ids the coordinator owes an answer."""
    waiting = list(state.pending_writes)
    for group in state.groups.values():
        for member in group.members.values():
            waiting.extend(
                rid for rid in (member.awaiting_join, member.awaiting_sync) if rid is not None
            )
    return waiting


def inv_deferred_requests_unique(state: CoordinatorState) -> None:
    waiting = waiting_requests(state)
    if len(waiting) != len(set(waiting)):
        raise InvariantViolation(f"a request waits twice: {sorted(waiting)}")


def inv_offsets_belong_to_groups(state: CoordinatorState) -> None:
    for group_id, committed in state.offsets.items():
        if committed and group_id not in state.groups:
            raise InvariantViolation(f"offsets of {group_id}, which is not held")
    for write in state.pending_writes.values():
        if write.offsets and write.group_ids[0] not in state.groups:
            raise InvariantViolation(f"a commit in flight for {write.group_ids}, not held")


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
)


def inv_generation_never_decreases(before: CoordinatorState, after: CoordinatorState) -> None:
    """A transition invariant: while a group is held, its generation only grows."""
    for group_id, group in after.groups.items():
        old = before.groups.get(group_id)
        if old is not None and group.generation_id < old.generation_id:
            raise InvariantViolation(
                f"{group_id}: generation {old.generation_id} -> {group.generation_id}"
            )


TRANSITION_INVARIANTS: Final = (inv_generation_never_decreases,)


def check_invariants(state: CoordinatorState) -> None:
    for invariant in INVARIANTS:
        invariant(state)
