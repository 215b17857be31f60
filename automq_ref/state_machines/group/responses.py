"""What the coordinator gives back: one response type per group request (Kafka's fields, errors
as ``KafkaErrorCode``), and the effects: ``Respond`` carries an answer to its request,
``PersistOffsets``, ``PersistGroupDeletion`` and ``PersistOffsetDeletion`` ask the shell to make
a write durable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.events import (
    CLASSIC_GROUP_TYPE,
    NO_GENERATION,
    UNKNOWN_MEMBER_ID,
)
from automq_ref.state_machines.transition import Rejected


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


@dataclass(frozen=True, slots=True)
class OffsetDeletePartitionResult:
    topic: str
    partition: int
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse:
    """A group-level error (``GROUP_ID_NOT_FOUND``, ``NON_EMPTY_GROUP``, ...) with no
    partitions, or NONE with one result per partition asked for."""

    error_code: KafkaErrorCode
    partitions: tuple[OffsetDeletePartitionResult, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeatResponse:
    """KIP-848's answer: ``assignment`` (the partitions the member may use now) is None when
    not sent (the member's assignment did not change and its request was not a full one)."""

    error_code: KafkaErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: frozenset[tuple[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class DescribedConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    assignment: frozenset[tuple[str, int]]
    target_assignment: frozenset[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class DescribedConsumerGroup:
    """ConsumerGroupDescribe's group: ``GROUP_ID_NOT_FOUND`` (and nothing else) for a group
    that is not a KIP-848 group held here."""

    group_id: str
    error_code: KafkaErrorCode
    error_message: str | None = None
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedConsumerMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeResponse:
    groups: tuple[DescribedConsumerGroup, ...]


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
    | OffsetDeleteResponse
    | ConsumerGroupHeartbeatResponse
    | ConsumerGroupDescribeResponse
)


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
    # A TxnOffsetCommit's: written in the producer's transaction (a transactional batch).
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class PersistGroupDeletion:
    """Append a tombstone for each group's offsets, then send OffsetsPersisted."""

    request_id: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PersistOffsetDeletion:
    """Append a tombstone for each of ``group_id``'s offsets of ``partitions``, then send
    OffsetsPersisted."""

    request_id: int
    group_id: str
    partitions: tuple[tuple[str, int], ...]


# Rejected: an event that breaks the shell's contract (a completion for no write in flight, a
# request id reused while its write is in flight); no request is answered for it.
GroupEffect: TypeAlias = (
    Respond
    | PersistOffsets
    | PersistGroupDeletion
    | PersistOffsetDeletion
    | Rejected[KafkaErrorCode]
)
DurableRecord: TypeAlias = PersistOffsets | PersistGroupDeletion | PersistOffsetDeletion
