"""What the coordinator takes: one event per group request the Kafka listener decodes (each with
the shell's ``request_id`` and ``now_ms``), the clock's ``Tick``, and the completions of durable
writes. Also the protocol constants the requests and answers share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from automq_ref.errors import KafkaErrorCode

UNKNOWN_MEMBER_ID: Final = ""
NO_GENERATION: Final = -1
NO_OFFSET: Final = -1
NO_LEADER_EPOCH: Final = -1
CLASSIC_GROUP_TYPE: Final = "classic"
CONSUMER_PROTOCOL_TYPE: Final = "consumer"  # the protocol type of Kafka's consumers
CONSUMER_GROUP_TYPE: Final = "consumer"  # a KIP-848 group's type (ListGroups v5)
LEAVE_GROUP_MEMBER_EPOCH: Final = -1  # ConsumerGroupHeartbeat: the member leaves
LEAVE_GROUP_STATIC_MEMBER_EPOCH: Final = -2  # a static member leaves for a while

Error = KafkaErrorCode
TopicPartition: TypeAlias = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Protocol:
    """One (assignor name, subscription metadata) pair of a JoinGroup, in preference order."""

    name: str
    metadata: bytes


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
    # The request's version (a consumer-protocol member must commit with v9+); -1: unchecked.
    api_version: int = -1


@dataclass(frozen=True, slots=True)
class TxnOffsetCommit:
    """Offsets committed inside producer ``producer_id``'s transaction: durable at once, shown
    only once the transaction's COMMIT marker lands in the group's partition (``TxnMarker``)."""

    request_id: int
    now_ms: int
    group_id: str
    producer_id: int
    producer_epoch: int
    generation_id: int  # -1: not checked (a producer that does not name its consumer's group)
    member_id: str
    group_instance_id: str | None
    offsets: tuple[OffsetCommitEntry, ...]


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A transaction's marker is durable in the group's partition: ``commit`` shows the
    producer's transactional offsets, an abort drops them."""

    producer_id: int
    commit: bool


@dataclass(frozen=True, slots=True)
class OffsetFetchGroup:
    group_id: str
    partitions: tuple[TopicPartition, ...] | None  # None: every committed partition
    # v9+: a consumer-protocol member names itself (checked against a KIP-848 group's members).
    member_id: str | None = None
    member_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetFetch:
    request_id: int
    now_ms: int
    groups: tuple[OffsetFetchGroup, ...]
    # v7+: a partition with a commit not settled yet (in flight, or a transaction's offsets
    # waiting for its marker) is answered UNSTABLE_OFFSET_COMMIT instead of its last offset.
    require_stable: bool = False


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
class OffsetDelete:
    """Delete ``group_id``'s committed offsets of ``partitions`` (partitions the cluster has:
    the shell answers the others ``UNKNOWN_TOPIC_OR_PARTITION``)."""

    request_id: int
    now_ms: int
    group_id: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeat:
    """KIP-848's heartbeat. The optional fields are None when unchanged since the member's last
    heartbeat (``rebalance_timeout_ms`` -1). ``owned`` is what the member owns now (the shell
    drops topic ids it does not know); ``topics`` the partition count of every topic of the
    cluster as the shell sees it now (the subscription metadata is read from it);
    ``generated_member_id`` the id the shell drew for a v0 member that sent none (the machine
    has no randomness)."""

    request_id: int
    now_ms: int
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: tuple[TopicPartition, ...] | None = None
    client_id: str = ""
    client_host: str = ""
    topics: Mapping[str, int] = field(default_factory=dict)
    api_version: int = 1
    generated_member_id: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribe:
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
    | TxnOffsetCommit
    | TxnMarker
    | OffsetFetch
    | ListGroups
    | DescribeGroups
    | DeleteGroups
    | OffsetDelete
    | ConsumerGroupHeartbeat
    | ConsumerGroupDescribe
    | Tick
    | OffsetsPersisted
    | OffsetsPersistFailed
)
