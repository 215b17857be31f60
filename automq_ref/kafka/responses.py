"""Typed responses: one frozen dataclass per Kafka response this broker builds with kio, and one per
entry nested in it, independent of the version; :func:`respond` turns any of them into the
version the request asked for.

The classes carry the union of the fields this broker sets across the versions it serves;
:func:`respond` converts one to plain values and hands them to kio's class for the request's
version (:func:`automq_ref.protocol.kio_codec.build`), which drops what that version does not
have. Values common to every answer live here once: ``throttle_time`` (this broker never
throttles) and ``authorized_operations``' default (not asked for: Kafka's "omitted" value).
mypy checks the field names where a response is built; ``tests/unit/test_broker_responses.py``
checks that every field exists in some served version of kio's class, so a misspelled field
cannot be silently dropped.

An encoded response is an :class:`~automq_ref.kafka.server.Answer`: with metrics on, the
listener counts the error codes of its typed response (:func:`error_codes`: every field named
``error_code`` or ending ``_error_code``, at any depth).

Produce and Fetch are not here: their encoders are written by hand (:mod:`automq_ref.protocol`).
"""

from __future__ import annotations

import datetime
import functools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.partition_transactions import ProducerDescription
from automq_ref.kafka.request import ApiKey, Request
from automq_ref.kafka.server import Answer, Chunks
from automq_ref.protocol.kio_codec import build, encode_response, response_class

NONE = KafkaErrorCode.NONE
ZERO_UUID = uuid.UUID(int=0)
AUTHORIZED_OPERATIONS_OMITTED = -2147483648  # Kafka's INT32_MIN: not requested
CONFIG_SOURCE_DYNAMIC_TOPIC = 1
CONFIG_SOURCE_DEFAULT = 5


class Response:
    """A response body; ``API_KEY`` says which API's kio classes it is encoded with."""

    __slots__ = ()
    API_KEY: ClassVar[ApiKey]


def respond(request: Request, response: Response) -> Chunks:
    """``response`` encoded in ``request``'s version, with its correlation id (no size prefix)."""
    return encode(request.api_version, request.correlation_id, response)


def encode(api_version: int, correlation_id: int, response: Response) -> Chunks:
    key = response.API_KEY
    cls = response_class(key, api_version)
    chunks = encode_response(key, api_version, correlation_id, build(cls, _values(response)))
    return Answer(chunks, functools.partial(error_codes, response))


# Per response or entry class: its error code fields, and the others (which may nest entries).
_ERROR_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def error_codes(entity: object) -> Iterator[int]:
    """The error codes ``entity`` carries, its own and its entries' (NONE among them)."""
    cls = type(entity)
    split = _ERROR_FIELDS.get(cls)
    if split is None:
        names = tuple(f.name for f in fields(entity))  # type: ignore[arg-type]
        codes = tuple(n for n in names if n == "error_code" or n.endswith("_error_code"))
        split = _ERROR_FIELDS[cls] = (codes, tuple(n for n in names if n not in codes))
    codes, others = split
    for name in codes:
        code = getattr(entity, name)
        if code is not None:
            yield int(code)
    for name in others:
        value = getattr(entity, name)
        if isinstance(value, list | tuple):
            # Entries are of one class: a list of plain values (replica ids) is not walked.
            if value and hasattr(type(value[0]), "__dataclass_fields__"):
                for item in value:
                    yield from error_codes(item)
        elif hasattr(type(value), "__dataclass_fields__"):
            yield from error_codes(value)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _values(entity: object) -> dict[str, Any]:
    cls = type(entity)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(entity))  # type: ignore[arg-type]
    return {name: _value(getattr(entity, name)) for name in names}


def _value(value: Any) -> Any:
    if hasattr(type(value), "__dataclass_fields__"):
        return _values(value)
    if isinstance(value, list | tuple):
        return [_value(item) for item in value]
    return value


# ------------------------------------------------------------------------------ ApiVersions


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Response):
    API_KEY = ApiKey.API_VERSIONS
    api_keys: Sequence[ApiVersionRange]
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


# --------------------------------------------------------------------- Metadata, cluster


@dataclass(frozen=True, slots=True)
class MetadataBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class MetadataPartition:
    partition_index: int
    leader_id: int
    leader_epoch: int
    replica_nodes: Sequence[int]
    isr_nodes: Sequence[int]
    offline_replicas: Sequence[int] = ()
    error_code: KafkaErrorCode = NONE


@dataclass(frozen=True, slots=True)
class MetadataTopic:
    name: str | None
    topic_id: uuid.UUID
    partitions: Sequence[MetadataPartition] = ()
    error_code: KafkaErrorCode = NONE
    is_internal: bool = False
    topic_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    API_KEY = ApiKey.METADATA
    brokers: Sequence[MetadataBroker]
    cluster_id: str
    controller_id: int
    topics: Sequence[MetadataTopic]
    error_code: KafkaErrorCode = NONE
    cluster_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeClusterBroker:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False


@dataclass(frozen=True, slots=True)
class DescribeClusterResponse(Response):
    API_KEY = ApiKey.DESCRIBE_CLUSTER
    cluster_id: str
    controller_id: int
    brokers: Sequence[DescribeClusterBroker]
    endpoint_type: int = 1  # brokers
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    cluster_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED
    throttle_time: int = 0


# -------------------------------------------------------------------------------- offsets


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition:
    partition_index: int
    error_code: KafkaErrorCode = NONE
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic:
    name: str
    partitions: Sequence[ListOffsetsPartition]


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Response):
    API_KEY = ApiKey.LIST_OFFSETS
    topics: Sequence[ListOffsetsTopic]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    partition: int
    error_code: KafkaErrorCode = NONE
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffsetTopic:
    topic: str
    partitions: Sequence[EpochEndOffset]


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochResponse(Response):
    API_KEY = ApiKey.OFFSET_FOR_LEADER_EPOCH
    topics: Sequence[EpochEndOffsetTopic]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartition:
    partition_index: int
    low_watermark: int = -1
    error_code: KafkaErrorCode = NONE


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopic:
    name: str
    partitions: Sequence[DeleteRecordsPartition]


@dataclass(frozen=True, slots=True)
class DeleteRecordsResponse(Response):
    API_KEY = ApiKey.DELETE_RECORDS
    topics: Sequence[DeleteRecordsTopic]
    throttle_time: int = 0


# --------------------------------------------------------------------------------- topics


@dataclass(frozen=True, slots=True)
class CreatableTopicConfig:
    name: str
    value: str | None
    config_source: int
    read_only: bool = False
    is_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class CreatableTopicResult:
    name: str
    topic_id: uuid.UUID = ZERO_UUID
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    topic_config_error_code: int = 0
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Sequence[CreatableTopicConfig] = ()


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse(Response):
    API_KEY = ApiKey.CREATE_TOPICS
    topics: Sequence[CreatableTopicResult]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeletableTopicResult:
    name: str | None
    topic_id: uuid.UUID = ZERO_UUID
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(Response):
    API_KEY = ApiKey.DELETE_TOPICS
    responses: Sequence[DeletableTopicResult]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopicResult:
    name: str
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse(Response):
    API_KEY = ApiKey.CREATE_PARTITIONS
    results: Sequence[CreatePartitionsTopicResult]
    throttle_time: int = 0


# -------------------------------------------------------------------------------- configs


@dataclass(frozen=True, slots=True)
class DescribedSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    name: str
    value: str | None
    config_source: int
    read_only: bool = False
    is_sensitive: bool = False
    synonyms: Sequence[DescribedSynonym] = ()
    config_type: int = 0  # UNKNOWN
    documentation: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult:
    resource_type: int
    resource_name: str
    configs: Sequence[DescribedConfig] = ()
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_CONFIGS
    results: Sequence[DescribeConfigsResult]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AlterConfigsResourceResponse:
    resource_type: int
    resource_name: str
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse(Response):
    API_KEY = ApiKey.ALTER_CONFIGS
    responses: Sequence[AlterConfigsResourceResponse]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsResponse(Response):
    API_KEY = ApiKey.INCREMENTAL_ALTER_CONFIGS
    responses: Sequence[AlterConfigsResourceResponse]
    throttle_time: int = 0


# -------------------------------------------------------------------------- producer ids


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Response):
    API_KEY = ApiKey.INIT_PRODUCER_ID
    error_code: KafkaErrorCode = NONE
    producer_id: int = -1
    producer_epoch: int = -1
    throttle_time: int = 0


# --------------------------------------------------------------------------------- groups


@dataclass(frozen=True, slots=True)
class Coordinator:
    key: str
    node_id: int
    host: str
    port: int
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Response):
    """v4+ answer per key in ``coordinators``; v0-3 asked for one key and answer at the top."""

    API_KEY = ApiKey.FIND_COORDINATOR
    node_id: int = -1
    host: str = ""
    port: int = -1
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    coordinators: Sequence[Coordinator] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerGroupTopicPartitions:
    topic_id: uuid.UUID
    partitions: Sequence[int]


@dataclass(frozen=True, slots=True)
class ConsumerGroupAssignment:
    topic_partitions: Sequence[ConsumerGroupTopicPartitions]


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeatResponse(Response):
    """KIP-848's heartbeat: the member's id, epoch and, when sent, its assignment."""

    API_KEY = ApiKey.CONSUMER_GROUP_HEARTBEAT
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval: int = 0
    assignment: ConsumerGroupAssignment | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    API_KEY = ApiKey.JOIN_GROUP
    error_code: KafkaErrorCode
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: Sequence[JoinGroupMember]
    skip_assignment: bool = False
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    API_KEY = ApiKey.SYNC_GROUP
    error_code: KafkaErrorCode
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Response):
    API_KEY = ApiKey.HEARTBEAT
    error_code: KafkaErrorCode
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class LeaveGroupMember:
    member_id: str
    group_instance_id: str | None
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Response):
    """v3+ answer per member in ``members``; v0-2 left one member and answer ``error_code``."""

    API_KEY = ApiKey.LEAVE_GROUP
    error_code: KafkaErrorCode
    members: Sequence[LeaveGroupMember]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition:
    partition_index: int
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class OffsetCommitTopic:
    name: str
    partitions: Sequence[OffsetCommitPartition]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    API_KEY = ApiKey.OFFSET_COMMIT
    topics: Sequence[OffsetCommitTopic]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponse(Response):
    """TxnOffsetCommit's answer: OffsetCommit's shape."""

    API_KEY = ApiKey.TXN_OFFSET_COMMIT
    topics: Sequence[OffsetCommitTopic]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str | None
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class OffsetFetchTopic:
    name: str
    partitions: Sequence[OffsetFetchPartition]


@dataclass(frozen=True, slots=True)
class OffsetFetchGroup:
    group_id: str
    topics: Sequence[OffsetFetchTopic]
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    """v8+ answer per group in ``groups``; v0-7 asked for one group and answer at the top."""

    API_KEY = ApiKey.OFFSET_FETCH
    topics: Sequence[OffsetFetchTopic] = ()
    error_code: KafkaErrorCode = NONE
    groups: Sequence[OffsetFetchGroup] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Response):
    API_KEY = ApiKey.LIST_GROUPS
    error_code: KafkaErrorCode
    groups: Sequence[ListedGroup]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribedGroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    group_state: str
    protocol_type: str
    protocol_data: str
    members: Sequence[DescribedGroupMember]
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_GROUPS
    groups: Sequence[DescribedGroup]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DeletableGroupResult:
    group_id: str
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse(Response):
    API_KEY = ApiKey.DELETE_GROUPS
    results: Sequence[DeletableGroupResult]
    throttle_time: int = 0


# ------------------------------------------------------------------ reassignments, elections


@dataclass(frozen=True, slots=True)
class ReassignablePartitionResponse:
    partition_index: int
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ReassignableTopicResponse:
    name: str
    partitions: Sequence[ReassignablePartitionResponse]


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsResponse(Response):
    API_KEY = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    responses: Sequence[ReassignableTopicResponse]
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OngoingPartitionReassignment:
    partition_index: int
    replicas: Sequence[int]
    adding_replicas: Sequence[int]
    removing_replicas: Sequence[int]


@dataclass(frozen=True, slots=True)
class OngoingTopicReassignment:
    name: str
    partitions: Sequence[OngoingPartitionReassignment]


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsResponse(Response):
    API_KEY = ApiKey.LIST_PARTITION_REASSIGNMENTS
    topics: Sequence[OngoingTopicReassignment]
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ElectionPartitionResult:
    partition_id: int
    error_code: KafkaErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaElectionResult:
    topic: str
    partition_result: Sequence[ElectionPartitionResult]


@dataclass(frozen=True, slots=True)
class ElectLeadersResponse(Response):
    API_KEY = ApiKey.ELECT_LEADERS
    replica_election_results: Sequence[ReplicaElectionResult]
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


# --------------------------------------------------------------------------- transactions


@dataclass(frozen=True, slots=True)
class TxnPartitionResult:
    partition_index: int
    partition_error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class TxnTopicResult:
    name: str
    results_by_partition: Sequence[TxnPartitionResult]


@dataclass(frozen=True, slots=True)
class TxnResult:
    transactional_id: str
    topic_results: Sequence[TxnTopicResult]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse(Response):
    """v0-3: one transaction's results in ``results_by_topic_v3_and_below``; v4+: per
    transaction in ``results_by_transaction``."""

    API_KEY = ApiKey.ADD_PARTITIONS_TO_TXN
    results_by_topic_v3_and_below: Sequence[TxnTopicResult] = ()
    results_by_transaction: Sequence[TxnResult] = ()
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse(Response):
    API_KEY = ApiKey.ADD_OFFSETS_TO_TXN
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class EndTxnResponse(Response):
    API_KEY = ApiKey.END_TXN
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class TxnTopicData:
    topic: str
    partitions: Sequence[int]


@dataclass(frozen=True, slots=True)
class DescribedState:
    error_code: KafkaErrorCode
    transactional_id: str
    transaction_state: str
    transaction_timeout: int
    transaction_start_time: datetime.datetime
    producer_id: int
    producer_epoch: int
    topics: Sequence[TxnTopicData]


@dataclass(frozen=True, slots=True)
class DescribeTransactionsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_TRANSACTIONS
    transaction_states: Sequence[DescribedState]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ListedState:
    transactional_id: str
    producer_id: int
    transaction_state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResponse(Response):
    API_KEY = ApiKey.LIST_TRANSACTIONS
    transaction_states: Sequence[ListedState]
    unknown_state_filters: Sequence[str] = ()
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class PartitionProducers:
    partition_index: int
    error_code: KafkaErrorCode
    active_producers: Sequence[ProducerDescription]
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class TopicProducers:
    name: str
    partitions: Sequence[PartitionProducers]


@dataclass(frozen=True, slots=True)
class DescribeProducersResponse(Response):
    API_KEY = ApiKey.DESCRIBE_PRODUCERS
    topics: Sequence[TopicProducers]
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class MarkerPartitionResult:
    partition_index: int
    error_code: KafkaErrorCode


@dataclass(frozen=True, slots=True)
class MarkerTopicResult:
    name: str
    partitions: Sequence[MarkerPartitionResult]


@dataclass(frozen=True, slots=True)
class MarkerResult:
    producer_id: int
    topics: Sequence[MarkerTopicResult]


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersResponse(Response):
    API_KEY = ApiKey.WRITE_TXN_MARKERS
    markers: Sequence[MarkerResult]


# ---------------------------------------------------------------------- admin: log dirs, ...


@dataclass(frozen=True, slots=True)
class DescribeLogDirsPartition:
    partition_index: int
    partition_size: int
    offset_lag: int = 0
    is_future_key: bool = False


@dataclass(frozen=True, slots=True)
class DescribeLogDirsTopic:
    name: str
    partitions: Sequence[DescribeLogDirsPartition]


@dataclass(frozen=True, slots=True)
class DescribeLogDirsResult:
    log_dir: str
    topics: Sequence[DescribeLogDirsTopic]
    error_code: KafkaErrorCode = NONE
    total_bytes: int = -1
    usable_bytes: int = -1


@dataclass(frozen=True, slots=True)
class DescribeLogDirsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_LOG_DIRS
    results: Sequence[DescribeLogDirsResult]
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class OffsetDeletePartition:
    partition_index: int
    error_code: KafkaErrorCode = NONE


@dataclass(frozen=True, slots=True)
class OffsetDeleteTopic:
    name: str
    partitions: Sequence[OffsetDeletePartition]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse(Response):
    API_KEY = ApiKey.OFFSET_DELETE
    topics: Sequence[OffsetDeleteTopic] = ()
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class DescribeTopicPartitionsPartition:
    partition_index: int
    leader_id: int
    leader_epoch: int
    replica_nodes: Sequence[int]
    isr_nodes: Sequence[int]
    offline_replicas: Sequence[int] = ()
    eligible_leader_replicas: Sequence[int] | None = ()
    last_known_elr: Sequence[int] | None = ()
    error_code: KafkaErrorCode = NONE


@dataclass(frozen=True, slots=True)
class DescribeTopicPartitionsTopic:
    name: str | None
    topic_id: uuid.UUID
    partitions: Sequence[DescribeTopicPartitionsPartition] = ()
    is_internal: bool = False
    topic_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED
    error_code: KafkaErrorCode = NONE


@dataclass(frozen=True, slots=True)
class DescribeTopicPartitionsCursor:
    topic_name: str
    partition_index: int


@dataclass(frozen=True, slots=True)
class DescribeTopicPartitionsResponse(Response):
    API_KEY = ApiKey.DESCRIBE_TOPIC_PARTITIONS
    topics: Sequence[DescribeTopicPartitionsTopic]
    next_cursor: DescribeTopicPartitionsCursor | None = None
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeTopicPartitions:
    topic_id: uuid.UUID
    topic_name: str
    partitions: Sequence[int]


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeAssignment:
    topic_partitions: Sequence[ConsumerGroupDescribeTopicPartitions]


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: Sequence[str]
    assignment: ConsumerGroupDescribeAssignment
    target_assignment: ConsumerGroupDescribeAssignment
    subscribed_topic_regex: str | None = None
    member_type: int = 1  # v1: a consumer-protocol member


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeGroup:
    """KIP-848's describe: a consumer group with its members, or only the error."""

    group_id: str
    error_code: KafkaErrorCode
    error_message: str | None = None
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: Sequence[ConsumerGroupDescribeMember] = ()
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeResponse(Response):
    API_KEY = ApiKey.CONSUMER_GROUP_DESCRIBE
    groups: Sequence[ConsumerGroupDescribeGroup]
    throttle_time: int = 0


# ---------------------------------------------------------------------------- telemetry


@dataclass(frozen=True, slots=True)
class GetTelemetrySubscriptionsResponse(Response):
    API_KEY = ApiKey.GET_TELEMETRY_SUBSCRIPTIONS
    error_code: KafkaErrorCode
    client_instance_id: uuid.UUID
    subscription_id: int = 0
    accepted_compression_types: Sequence[int] = ()
    push_interval: int = 0
    telemetry_max_bytes: int = 0
    delta_temporality: bool = True
    requested_metrics: Sequence[str] = ()
    throttle_time: int = 0


@dataclass(frozen=True, slots=True)
class PushTelemetryResponse(Response):
    API_KEY = ApiKey.PUSH_TELEMETRY
    error_code: KafkaErrorCode = NONE
    throttle_time: int = 0
