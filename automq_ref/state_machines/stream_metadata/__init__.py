"""Stream metadata: the controller's machine for streams, ranges, objects, nodes and the KV store.

Spec: specs/StreamMetadata.tla. Properties: tests/properties/test_stream_metadata.py.

Theory of operation
-------------------
A *stream* is an append-only sequence of offsets (a Kafka partition is a few of them). The
controller decides who may write each stream and which objects hold which offsets; the data
itself never passes through it. Every request is handled in two halves:

1. a handler reads the current image and decides: it either rejects the request with an error
   code (AutoMQ's names: ``STREAM_FENCED``, ``OFFSET_NOT_MATCHED``, ...) and produces no records,
   or accepts it and produces *metadata records* (AutoMQ's record types: ``S3StreamRecord``,
   ``RangeRecord``, ``S3ObjectRecord``, ...);
2. the records are appended to the metadata log and *replayed* into the image.

The image is nothing but the replay of the log, so any broker that replays the same log has the
same image and answers lookups (``get_objects``) locally. Replay of offsets uses max semantics,
as AutoMQ's does: a stream's end offset is the maximum of every fact that mentions it, its start
offset only grows, so replaying records in another order cannot move an offset backwards.

Fencing. Each stream has an *epoch* (the partition leader epoch of its opener) and a list of
*ranges*: ``[start, end)`` intervals each owned by one node at one epoch. Opening a stream with a
higher epoch seals the current range at the stream's end offset and starts a new one at that
offset, owned by the opener; it is refused while the stream is OPENED (``STREAM_NOT_CLOSED``), so
the new owner waits for the old one to close. A commit must come from the owner of the current
range (and, when it says, at the current epoch), and must start exactly at the stream's end offset;
so data an old owner uploads after losing the stream is never made visible. Nodes have epochs too,
granted at ``RegisterNode`` (the node proposes its start time, the controller grants at least one
more than it stored): a request from an older incarnation gets ``NODE_EPOCH_EXPIRED``, and a node
taken over by failover gets ``NODE_FENCED``.

Objects. ``PrepareObject`` hands out ids (PREPARED, with a deadline); a commit turns them
COMMITTED; a prepared object whose deadline passes is MARK_DESTROYED by ``ExpireObject`` and can
never be committed any more; compaction marks its inputs MARK_DESTROYED; ``RemoveObject`` forgets
a destroyed object once the shell has deleted it and the retention has passed. Committing an
object that is already COMMITTED is ``REDUNDANT_OPERATION``, answered as success: a retried commit
is idempotent.

Brokers and placement (spec: specs/Placement.tla). ``RegisterNode`` also registers the node as
a broker (rack, listeners), fenced until its first ``BrokerHeartbeat``; heartbeats keep a
session that ``ExpireSessions`` ends by fencing the broker and bumping its node epoch. Every
partition is assigned to one live broker at a leader epoch (KRaft's ``PartitionRecord``); when
brokers join or leave, the controller moves partitions in the same decision, and
``ReassignPartition``, ``ElectLeaders`` and the autobalancer's ``BalancePartitions`` move them
too. A partition's streams (tagged with it) open only on its broker at its leader epoch, and
only once no other broker holds one of them open. ``cluster`` has the handlers and the theory;
``automq_ref/state_machines/placement.py`` computes where partitions go.

Cluster-wide decisions outside the spec. The KV store (``PutKV``, ``DeleteKV``) offers
put-if-absent (``KEY_EXIST``), compare-and-set and compare-and-delete (``VALUE_NOT_MATCHED``), so
that two brokers deciding from their local images never both create a topic or overwrite each
other's change; ``AllocateProducerIds`` advances the producer-id counter in the KV in one
decision, so producer-id blocks never overlap.

Not modelled (yet): fast close and historical WAL responsibilities (``NodeWALUncommittedOffsets``),
"huge cluster" mode (ranges read from object indexes), locked nodes, object attributes beyond a
plain integer.

Layout
------
``image`` holds the image and its replay (and the snapshot of an image as records); ``events``
the requests, their answer (``Response``), the effects of a step (``AppendRecords`` then
``Respond``) and the machine's parameters; ``step`` the handlers that decide on streams, objects,
nodes and the KV, ``cluster`` those on brokers, topics and partitions, ``decisions`` what a
handler returns and the node-epoch check both share; ``queries`` the lookups the shell and the
handlers make on an image; ``invariants`` the specs' invariants as checks; ``tla`` the mapping of
an image onto the specs' variables for trace validation. The
record types are the vocabulary's (``automq_ref/vocabulary/metadata_records.py``); this package
re-exports them.
"""

from __future__ import annotations

from automq_ref.state_machines.stream_metadata.events import (
    ANY_STREAM_EPOCH,
    DEFAULT_PARAMS,
    NO_OBJECT,
    RESENDABLE_REQUESTS,
    AllocateProducerIds,
    AppendRecords,
    BalancePartitions,
    BrokerHeartbeat,
    CloseStream,
    CommitRange,
    CommitStreamObject,
    CommitStreamObjectEntry,
    CommitStreamSetObject,
    ControlledShutdown,
    CreatePartitions,
    CreateStream,
    CreateTopic,
    DeleteKV,
    DeleteStream,
    DeleteTopic,
    ElectLeaders,
    ExpireObject,
    ExpireSessions,
    FenceNode,
    OpeningStream,
    OpenStream,
    PartitionLoad,
    PlacementEvent,
    PrepareObject,
    PutKV,
    ReassignPartition,
    RegisterNode,
    RemoveObject,
    Respond,
    Response,
    StreamErrorCode,
    StreamMetadataEffect,
    StreamMetadataEvent,
    StreamMetadataParams,
    StreamMetadataTransition,
    TrimStream,
    UnregisterBroker,
    records_of,
    resendable,
    response_of,
)
from automq_ref.state_machines.stream_metadata.image import (
    EMPTY_IMAGE,
    NO_EPOCH,
    BrokerRegistration,
    NodeMetadata,
    PartitionAssignment,
    ReportedLoad,
    S3Object,
    StreamMetadata,
    StreamMetadataImage,
    StreamRange,
    StreamSetObject,
    TopicPlacement,
    image_records,
    replay,
    replay_all,
)
from automq_ref.state_machines.stream_metadata.invariants import (
    INVARIANTS,
    PLACEMENT_INVARIANTS,
    check_invariants,
    inv_no_fenced_commit_visible,
    inv_nothing_referenced_is_destroyed,
    inv_objects_cover_stream,
    inv_one_owner_per_partition,
    inv_partitions_on_live_brokers,
    inv_ranges_contiguous,
    inv_single_opener_per_epoch,
    inv_single_writer,
)
from automq_ref.state_machines.stream_metadata.queries import (
    ObjectSlice,
    StreamSetIndex,
    assigned_broker,
    broker_partitions,
    expired_objects,
    get_objects,
    live_brokers,
    opening_streams,
    partition_assignment,
    partition_leader,
    partition_streams,
    placed_topic,
    removable_objects,
    stream_object_slices,
    stream_set_index,
    stream_set_slices,
)
from automq_ref.state_machines.stream_metadata.step import (
    step,
)
from automq_ref.state_machines.stream_metadata.tla import (
    tla_action,
    tla_node,
    tla_placement_action,
    tla_placement_state,
    tla_state,
)
from automq_ref.state_machines.transition import InvariantViolation, Transition
from automq_ref.vocabulary.metadata_records import (
    NO_LEADER,
    NO_PARTITION,
    NO_TOPIC,
    AssignedS3ObjectIdRecord,
    AssignedStreamIdRecord,
    BrokerRegistrationChangeRecord,
    Endpoint,
    KVRecord,
    MetadataRecord,
    NodeWALMetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RangeRecord,
    RegisterBrokerRecord,
    RemoveKVRecord,
    RemoveRangeRecord,
    RemoveS3ObjectRecord,
    RemoveS3StreamObjectRecord,
    RemoveS3StreamRecord,
    RemoveStreamSetObjectRecord,
    RemoveTopicRecord,
    S3ObjectRecord,
    S3ObjectState,
    S3StreamEndOffsetsRecord,
    S3StreamObjectRecord,
    S3StreamRecord,
    S3StreamSetObjectRecord,
    StreamOffsetRange,
    StreamState,
    TopicRecord,
    UnregisterBrokerRecord,
)

__all__ = [
    "ANY_STREAM_EPOCH",
    "DEFAULT_PARAMS",
    "EMPTY_IMAGE",
    "INVARIANTS",
    "NO_EPOCH",
    "NO_LEADER",
    "NO_OBJECT",
    "NO_PARTITION",
    "NO_TOPIC",
    "PLACEMENT_INVARIANTS",
    "RESENDABLE_REQUESTS",
    "AllocateProducerIds",
    "AppendRecords",
    "AssignedS3ObjectIdRecord",
    "AssignedStreamIdRecord",
    "BalancePartitions",
    "BrokerHeartbeat",
    "BrokerRegistration",
    "BrokerRegistrationChangeRecord",
    "CloseStream",
    "CommitRange",
    "CommitStreamObject",
    "CommitStreamObjectEntry",
    "CommitStreamSetObject",
    "ControlledShutdown",
    "CreatePartitions",
    "CreateStream",
    "CreateTopic",
    "DeleteKV",
    "DeleteStream",
    "DeleteTopic",
    "ElectLeaders",
    "Endpoint",
    "ExpireObject",
    "ExpireSessions",
    "FenceNode",
    "InvariantViolation",
    "KVRecord",
    "MetadataRecord",
    "NodeMetadata",
    "NodeWALMetadataRecord",
    "ObjectSlice",
    "OpenStream",
    "OpeningStream",
    "PartitionAssignment",
    "PartitionChangeRecord",
    "PartitionLoad",
    "PartitionRecord",
    "PlacementEvent",
    "PrepareObject",
    "PutKV",
    "RangeRecord",
    "ReassignPartition",
    "RegisterBrokerRecord",
    "RegisterNode",
    "RemoveKVRecord",
    "RemoveObject",
    "RemoveRangeRecord",
    "RemoveS3ObjectRecord",
    "RemoveS3StreamObjectRecord",
    "RemoveS3StreamRecord",
    "RemoveStreamSetObjectRecord",
    "RemoveTopicRecord",
    "ReportedLoad",
    "Respond",
    "Response",
    "S3Object",
    "S3ObjectRecord",
    "S3ObjectState",
    "S3StreamEndOffsetsRecord",
    "S3StreamObjectRecord",
    "S3StreamRecord",
    "S3StreamSetObjectRecord",
    "StreamErrorCode",
    "StreamMetadata",
    "StreamMetadataEffect",
    "StreamMetadataEvent",
    "StreamMetadataImage",
    "StreamMetadataParams",
    "StreamMetadataTransition",
    "StreamOffsetRange",
    "StreamRange",
    "StreamSetIndex",
    "StreamSetObject",
    "StreamState",
    "TopicPlacement",
    "TopicRecord",
    "Transition",
    "TrimStream",
    "UnregisterBroker",
    "UnregisterBrokerRecord",
    "assigned_broker",
    "broker_partitions",
    "check_invariants",
    "expired_objects",
    "get_objects",
    "image_records",
    "inv_no_fenced_commit_visible",
    "inv_nothing_referenced_is_destroyed",
    "inv_objects_cover_stream",
    "inv_one_owner_per_partition",
    "inv_partitions_on_live_brokers",
    "inv_ranges_contiguous",
    "inv_single_opener_per_epoch",
    "inv_single_writer",
    "live_brokers",
    "opening_streams",
    "partition_assignment",
    "partition_leader",
    "partition_streams",
    "placed_topic",
    "records_of",
    "removable_objects",
    "replay",
    "replay_all",
    "resendable",
    "response_of",
    "step",
    "stream_object_slices",
    "stream_set_index",
    "stream_set_slices",
    "tla_action",
    "tla_node",
    "tla_placement_action",
    "tla_placement_state",
    "tla_state",
]
