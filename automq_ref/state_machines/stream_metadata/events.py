"""What the controller is asked and what it answers: the request events (one per TLA+ action of
specs/StreamMetadata.tla or specs/Placement.tla, plus the KV requests, the producer-id blocks and
a few admin requests), the ``Response`` every request gets and its error codes (AutoMQ's names;
Kafka's for brokers, topics and partitions; ``VALUE_NOT_MATCHED`` for a conditional KV request
that lost), the effects of a step (``AppendRecords`` then ``Respond``), and the machine's
parameters.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

from automq_ref.state_machines.placement import DEFAULT_BALANCE_PARAMS, BalanceParams
from automq_ref.state_machines.stream_metadata.image import (
    StreamMetadataImage,
)
from automq_ref.state_machines.transition import InvariantViolation, Transition
from automq_ref.vocabulary.metadata_records import (
    NO_PARTITION,
    NO_TOPIC,
    Endpoint,
    MetadataRecord,
)

NO_OBJECT: Final = -1
ANY_STREAM_EPOCH: Final = -1  # a commit range that does not claim an epoch (AutoMQ sends -1)


class StreamErrorCode(enum.Enum):
    """Outcomes of controller requests, with AutoMQ's names."""

    NONE = "NONE"
    STREAM_NOT_EXIST = "STREAM_NOT_EXIST"
    STREAM_FENCED = "STREAM_FENCED"
    STREAM_NOT_OPENED = "STREAM_NOT_OPENED"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAM_INNER_ERROR = "STREAM_INNER_ERROR"
    OFFSET_NOT_MATCHED = "OFFSET_NOT_MATCHED"
    REDUNDANT_OPERATION = "REDUNDANT_OPERATION"
    OBJECT_NOT_EXIST = "OBJECT_NOT_EXIST"
    OBJECT_NOT_COMMITTED = "OBJECT_NOT_COMMITTED"
    COMPACTED_OBJECTS_NOT_FOUND = "COMPACTED_OBJECTS_NOT_FOUND"
    NODE_EPOCH_NOT_EXIST = "NODE_EPOCH_NOT_EXIST"
    NODE_EPOCH_EXPIRED = "NODE_EPOCH_EXPIRED"
    NODE_FENCED = "NODE_FENCED"
    KEY_EXIST = "KEY_EXIST"
    # A conditional KV request (``expected``) found another value under the key, or none.
    VALUE_NOT_MATCHED = "VALUE_NOT_MATCHED"
    INVALID_REQUEST = "INVALID_REQUEST"
    # Brokers, topics and partitions: Kafka's names.
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"  # the partition is another broker's
    FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"  # an open below the partition's leader epoch
    UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"  # an open above it
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_REPLICA_ASSIGNMENT = "INVALID_REPLICA_ASSIGNMENT"  # a broker that is not live
    INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"  # no live broker to place on
    ELECTION_NOT_NEEDED = "ELECTION_NOT_NEEDED"
    ELIGIBLE_LEADERS_NOT_AVAILABLE = "ELIGIBLE_LEADERS_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """getOpeningStreams and broker registration: a node (re)starts and asks for its epoch and
    its open streams, and registers as a broker (its rack, listeners and WAL location:
    ``wal_config``, the data failover carries to a survivor; the machine only records it).

    ``node_epoch`` is the node's proposal (its clock). The controller grants
    ``max(node_epoch, stored + 1)``, strictly above any epoch it stored for the node, so a
    restart on a clock that went backwards still fences the previous incarnation; it answers
    the granted epoch (``Response.node_epoch``), which the node then uses for everything.
    The broker starts fenced: partitions it held move to live brokers, and its first
    ``BrokerHeartbeat`` makes it live."""

    node_id: int
    node_epoch: int  # proposed
    rack: str = ""
    listeners: tuple[Endpoint, ...] = ()
    wal_config: str = ""


@dataclass(frozen=True, slots=True)
class PartitionLoad:
    """A partition's traffic over the last reporting interval, as its broker measured it."""

    topic_id: str
    partition: int
    bytes_in_per_sec: int
    bytes_out_per_sec: int


@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    """A broker is alive at ``now_ms``: its session is renewed until ``now_ms`` plus the
    session timeout, and ``loads`` (the partitions it leads) are kept for balancing. A fenced
    broker that is not shutting down is unfenced: it joins, and takes its share of partitions.
    The answer says whether the broker is fenced (``Response.fenced``)."""

    node_id: int
    node_epoch: int
    now_ms: int
    loads: tuple[PartitionLoad, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpireSessions:
    """The controller's clock ticks: every live broker whose session ended before ``now_ms``
    is fenced and its node epoch bumped (its later requests get ``NODE_EPOCH_EXPIRED``), and its
    partitions move to live brokers. A live broker with no session (a controller that just took
    over) gets one from ``now_ms``."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class ControlledShutdown:
    """A broker is stopping: it is fenced and its partitions move to live brokers now; it keeps
    its epoch to close its streams (after uploading what its WAL holds)."""

    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class UnregisterBroker:
    """Remove a broker from the cluster (Kafka's UnregisterBroker, by an admin): refused while
    it holds streams open; its node epoch is bumped and its partitions move."""

    node_id: int


@dataclass(frozen=True, slots=True)
class FenceNode:
    """Failover: a survivor acts for a failed node's epoch; the failed node is NODE_FENCED."""

    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class CreateStream:
    """A new stream; tagged with a partition (``topic_id``, ``partition``), it may be created
    only by the broker the partition is assigned to."""

    node_id: int
    node_epoch: int
    topic_id: str = NO_TOPIC
    partition: int = NO_PARTITION


@dataclass(frozen=True, slots=True)
class OpenStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class TrimStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    new_start_offset: int


@dataclass(frozen=True, slots=True)
class DeleteStream:
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PrepareObject:
    node_id: int
    node_epoch: int
    count: int
    ttl_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitRange:
    """One stream's offsets inside a stream set object."""

    stream_id: int
    stream_epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class CommitStreamObjectEntry:
    """A stream object uploaded beside a stream set object (one stream, contiguous)."""

    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    object_size: int


@dataclass(frozen=True, slots=True)
class CommitStreamSetObject:
    node_id: int
    node_epoch: int
    object_id: int  # NO_OBJECT when the upload produced stream objects only
    order_id: int  # NO_OBJECT: the smallest order id of the compacted objects
    object_size: int
    stream_ranges: tuple[CommitRange, ...]
    stream_objects: tuple[CommitStreamObjectEntry, ...]
    compacted_object_ids: tuple[int, ...]
    failover_mode: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitStreamObject:
    """Stream object compaction: ``source_object_ids`` of one stream merged into one object."""

    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int  # ANY_STREAM_EPOCH skips the ownership check, as in AutoMQ
    object_id: int
    start_offset: int
    end_offset: int
    object_size: int
    source_object_ids: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class ExpireObject:
    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class RemoveObject:
    """The shell deleted a destroyed object from storage; forget it."""

    object_id: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class PutKV:
    """Write ``value`` under ``key``.

    * ``overwrite=False``: put-if-absent; an existing key is answered ``KEY_EXIST`` with its
      value, and nothing is written.
    * ``overwrite=True``, ``expected=None``: an unconditional put.
    * ``expected=v``: compare-and-set: written only if the key holds exactly ``v`` now, else
      ``VALUE_NOT_MATCHED`` with the current value (None when the key is absent).
      The ``overwrite`` rule still applies, so a compare-and-set passes ``overwrite=True``."""

    key: str
    value: bytes
    overwrite: bool
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class DeleteKV:
    """Remove ``key`` (absent: accepted, nothing written). With ``expected``: compare-and-delete,
    only if the key holds exactly ``expected`` now, else ``VALUE_NOT_MATCHED`` with the current
    value (None when the key is absent)."""

    key: str
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    """Reserve the next ``count`` producer ids for node ``node_id``: the counter under
    ``naming.PRODUCER_ID_KEY`` (decimal, ``formats.kv_integer``; absent means 0) is read and
    advanced by ``count`` in one decision, so two nodes never get overlapping blocks. Answers
    the block's first id (``Response.first_producer_id``). The node-epoch check applies."""

    node_id: int
    node_epoch: int
    count: int


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """CreateTopics: ``value`` is the topic's KV record (``formats.topic_record``), put under
    ``naming.topic_key(name)`` if absent (else ``KEY_EXIST`` with the existing value), and its
    partitions are placed on live brokers in the same decision: by hand when ``assignments``
    names a broker per partition (each must be live), else evenly and rack-aware."""

    name: str
    value: bytes
    assignments: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    """CreatePartitions: the topic's KV record becomes ``value`` if it holds ``expected``
    (compare-and-set), and every partition of the new record that has no broker yet is placed
    (by hand with ``assignments``, one per new partition). The same record again places a topic
    written before placement existed."""

    name: str
    value: bytes
    expected: bytes
    assignments: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """DeleteTopics: the topic's KV record (compare-and-delete with ``expected``) and its
    placement go; its streams are deleted by the brokers afterwards."""

    name: str
    expected: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReassignPartition:
    """AlterPartitionReassignments, one partition: move it to live broker ``broker`` (a new
    leader epoch). Already there: nothing to do."""

    topic: str
    partition: int
    broker: int


@dataclass(frozen=True, slots=True)
class ElectLeaders:
    """ElectLeaders, one partition: one replica means one eligible leader, its broker; only a
    partition left with no broker (none was live) gets one."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class BalancePartitions:
    """One round of the autobalancer at ``now_ms``: moves partitions so that no broker carries
    more than the configured margin above the mean load; with no load reported, so that
    partition counts differ by at most one. Only live brokers that heartbeat within the
    metrics delay take part (a controller that just took over moves nothing at first)."""

    now_ms: int


StreamMetadataEvent: TypeAlias = (
    RegisterNode
    | FenceNode
    | CreateStream
    | OpenStream
    | CloseStream
    | TrimStream
    | DeleteStream
    | PrepareObject
    | CommitStreamSetObject
    | CommitStreamObject
    | ExpireObject
    | RemoveObject
    | PutKV
    | DeleteKV
    | AllocateProducerIds
    | BrokerHeartbeat
    | ExpireSessions
    | ControlledShutdown
    | UnregisterBroker
    | CreateTopic
    | CreatePartitions
    | DeleteTopic
    | ReassignPartition
    | ElectLeaders
    | BalancePartitions
)

# Requests whose repeat the machine answers as the first try was answered, with the same effect,
# so a request whose answer was lost (the controller died after deciding it, or did not) may be
# sent again: an open at the stream's epoch by the owner of its current range is a retried open
# (start and next offset again; a CLOSED stream reopens on the same range); a close of a CLOSED
# stream succeeds; a trim to the stream's start and a delete of a deleted stream write nothing; a
# commit of objects already COMMITTED with the same contents is REDUNDANT_OPERATION, a success
# that writes nothing. A repeated PrepareObject or AllocateProducerIds is answered with new ids:
# the first answer's ids were never handed to anyone, and prepared ids expire (``ExpireObject``),
# producer ids are never reused. Not here: CreateStream (a second stream), RegisterNode (a
# second epoch), conditional KV requests and the admin requests (the repeat is refused).
RESENDABLE_REQUESTS: Final = (
    OpenStream,
    CloseStream,
    TrimStream,
    DeleteStream,
    PrepareObject,
    CommitStreamSetObject,
    CommitStreamObject,
    AllocateProducerIds,
)


def resendable(event: StreamMetadataEvent) -> bool:
    """Whether ``event`` may be sent again when its first answer was lost (see above)."""
    return isinstance(event, RESENDABLE_REQUESTS)


# The events of specs/Placement.tla's actions (and the placement requests it leaves out).
PlacementEvent: TypeAlias = (
    RegisterNode
    | BrokerHeartbeat
    | ExpireSessions
    | ControlledShutdown
    | UnregisterBroker
    | CreateTopic
    | CreatePartitions
    | DeleteTopic
    | ReassignPartition
    | ElectLeaders
    | BalancePartitions
    | CreateStream
    | OpenStream
    | CloseStream
)


@dataclass(frozen=True, slots=True)
class OpeningStream:
    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Response:
    error: StreamErrorCode = StreamErrorCode.NONE
    message: str = ""
    stream_id: int | None = None
    start_offset: int | None = None
    next_offset: int | None = None
    first_object_id: int | None = None
    opening_streams: tuple[OpeningStream, ...] = ()
    value: bytes | None = None
    node_epoch: int | None = None  # RegisterNode: the granted epoch
    first_producer_id: int | None = None  # AllocateProducerIds: the block's first id
    fenced: bool | None = None  # BrokerHeartbeat: whether the broker is fenced now
    leader: int | None = None  # ReassignPartition, ElectLeaders: the partition's broker now
    leader_epoch: int | None = None  # ... and its leader epoch

    @property
    def ok(self) -> bool:
        return self.error in (StreamErrorCode.NONE, StreamErrorCode.REDUNDANT_OPERATION)


@dataclass(frozen=True, slots=True)
class AppendRecords:
    """Make ``records`` durable on the metadata log, as one batch. Emitted first: the image of
    the transition (these records replayed) may be published, and the response released, only
    once they are durable."""

    records: tuple[MetadataRecord, ...]


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the request. Every request gets exactly one, a refusal too (its error code)."""

    response: Response


StreamMetadataEffect: TypeAlias = AppendRecords | Respond
StreamMetadataTransition: TypeAlias = Transition[StreamMetadataImage, StreamMetadataEffect]


def records_of(transition: StreamMetadataTransition) -> tuple[MetadataRecord, ...]:
    """The records a transition appends (none for a refusal or a no-op)."""
    for effect in transition.effects:
        if isinstance(effect, AppendRecords):
            return effect.records
    return ()


def response_of(transition: StreamMetadataTransition) -> Response:
    """The answer a transition gives."""
    for effect in transition.effects:
        if isinstance(effect, Respond):
            return effect.response
    raise InvariantViolation(f"a transition without an answer: {transition.effects}")


@dataclass(frozen=True, slots=True)
class StreamMetadataParams:
    """The controller's settings: object retention; Kafka's ``broker.session.timeout.ms``
    (9 s: a broker that has not heartbeaten for that long is fenced); the autobalancer's
    (AutoMQ's ``autobalancer.controller.*``): ``metrics.delay.ms`` (loads older than this are
    not used) and the goals (``placement.BalanceParams``)."""

    object_retention_ms: int = 60_000
    broker_session_timeout_ms: int = 9_000
    autobalancer_metrics_delay_ms: int = 60_000
    autobalancer: BalanceParams = DEFAULT_BALANCE_PARAMS


DEFAULT_PARAMS: Final = StreamMetadataParams()
