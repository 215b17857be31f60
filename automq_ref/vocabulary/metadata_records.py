"""Metadata record types: what the controller writes to the metadata log.

Streams, objects, nodes and the KV store carry AutoMQ 4.1's record names; brokers, topics and
partition placement carry KRaft's (``RegisterBrokerRecord``, ``BrokerRegistrationChangeRecord``,
``UnregisterBrokerRecord``, ``TopicRecord``, ``RemoveTopicRecord``, ``PartitionRecord``,
``PartitionChangeRecord``), with the fields a cluster of one-replica partitions needs.

The StreamMetadata machine produces these records and replays them into its image;
``formats/metadata_record.py`` encodes them on the log; the shell and ``spark/`` read them back.
They live here, below all of those, so that the format layer need not reach up into a machine
for its own types. Plain frozen dataclasses and the two state enums they carry; no behaviour.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias


class StreamState(enum.IntEnum):
    CLOSED = 0
    OPENED = 1


class S3ObjectState(enum.IntEnum):
    PREPARED = 1
    COMMITTED = 2
    MARK_DESTROYED = 3


# ===================================================================== records (AutoMQ 4.1)


NO_TOPIC: Final = ""  # the tags of a stream that belongs to no partition
NO_PARTITION: Final = -1


@dataclass(frozen=True, slots=True)
class S3StreamRecord:
    """A stream's epoch, current range, start and state; ``topic_id`` and ``partition`` are its
    tags (AutoMQ's v1 tags): the partition whose data the stream holds, or none. Every
    S3StreamRecord of a stream repeats its tags; logs written before tags existed decode with
    none."""

    stream_id: int
    epoch: int
    range_index: int
    start_offset: int
    state: StreamState
    topic_id: str = NO_TOPIC
    partition: int = NO_PARTITION


@dataclass(frozen=True, slots=True)
class RemoveS3StreamRecord:
    stream_id: int


@dataclass(frozen=True, slots=True)
class RangeRecord:
    stream_id: int
    epoch: int
    range_index: int
    start_offset: int
    end_offset: int
    node_id: int


@dataclass(frozen=True, slots=True)
class RemoveRangeRecord:
    stream_id: int
    range_index: int


@dataclass(frozen=True, slots=True)
class S3StreamObjectRecord:
    stream_id: int
    start_offset: int
    end_offset: int
    object_id: int


@dataclass(frozen=True, slots=True)
class RemoveS3StreamObjectRecord:
    stream_id: int
    object_id: int


@dataclass(frozen=True, slots=True)
class StreamOffsetRange:
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class S3StreamSetObjectRecord:
    node_id: int
    object_id: int
    order_id: int
    ranges: tuple[StreamOffsetRange, ...]
    data_time_ms: int


@dataclass(frozen=True, slots=True)
class RemoveStreamSetObjectRecord:
    node_id: int
    object_id: int


@dataclass(frozen=True, slots=True)
class S3ObjectRecord:
    object_id: int
    object_size: int
    state: S3ObjectState
    # PREPARED: the deadline; COMMITTED: the commit time; MARK_DESTROYED: the mark time.
    timestamp_ms: int
    attributes: int = 0


@dataclass(frozen=True, slots=True)
class RemoveS3ObjectRecord:
    object_id: int


@dataclass(frozen=True, slots=True)
class AssignedStreamIdRecord:
    assigned_stream_id: int


@dataclass(frozen=True, slots=True)
class AssignedS3ObjectIdRecord:
    assigned_object_id: int


@dataclass(frozen=True, slots=True)
class NodeWALMetadataRecord:
    node_id: int
    node_epoch: int
    failover_mode: bool


@dataclass(frozen=True, slots=True)
class S3StreamEndOffsetsRecord:
    """A stream's end offset on its own (snapshots; AutoMQ uses it in huge-cluster mode)."""

    stream_id: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class KVRecord:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class RemoveKVRecord:
    key: str


# ============================================================ brokers and placement (KRaft)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A listener a broker serves on (KRaft's ``BrokerEndpoint``): its name, host and port."""

    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    """A broker's registration: the node epoch it was granted, its rack and listeners, and
    where its WAL lives (its ``s3.wal.path``; empty in a record written before brokers
    published it), which crash failover names to the survivor taking that WAL over. A
    registered broker is fenced until its first heartbeat unfences it."""

    node_id: int
    node_epoch: int
    rack: str
    listeners: tuple[Endpoint, ...]
    wal_config: str = ""


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord:
    """The registration of ``node_id`` at ``node_epoch`` is now fenced or not, and in
    controlled shutdown or not (a change to another registration of the node is ignored)."""

    node_id: int
    node_epoch: int
    fenced: bool
    in_controlled_shutdown: bool


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord:
    node_id: int
    node_epoch: int


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic the controller places: its id (a UUID as text) and name."""

    topic_id: str
    name: str


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    """The topic and every partition of it are gone."""

    topic_id: str


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """A new partition: ``leader`` is the broker it is assigned to (its one replica, the
    preferred leader; ``NO_LEADER`` when no broker is live), ``leader_epoch`` the epoch at which
    that broker opens the partition's streams."""

    topic_id: str
    partition: int
    leader: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionChangeRecord:
    """A partition moved: its new leader and leader epoch (always higher than the last)."""

    topic_id: str
    partition: int
    leader: int
    leader_epoch: int


NO_LEADER: Final = -1  # Kafka's: the partition has no leader (no broker was live)


MetadataRecord: TypeAlias = (
    S3StreamRecord
    | RemoveS3StreamRecord
    | RangeRecord
    | RemoveRangeRecord
    | S3StreamObjectRecord
    | RemoveS3StreamObjectRecord
    | S3StreamSetObjectRecord
    | RemoveStreamSetObjectRecord
    | S3ObjectRecord
    | RemoveS3ObjectRecord
    | AssignedStreamIdRecord
    | AssignedS3ObjectIdRecord
    | NodeWALMetadataRecord
    | S3StreamEndOffsetsRecord
    | KVRecord
    | RemoveKVRecord
    | RegisterBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
    | TopicRecord
    | RemoveTopicRecord
    | PartitionRecord
    | PartitionChangeRecord
)
