"""Metadata record types: what the controller writes to the metadata log (AutoMQ 4.1's names).

The StreamMetadata machine produces these records and replays them into its image;
``formats/metadata_record.py`` encodes them on the log; the shell and ``spark/`` read them back.
They live here, below all of those, so that the format layer need not reach up into a machine
for its own types. Plain frozen dataclasses and the two state enums they carry; no behaviour.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias


class StreamState(enum.IntEnum):
    CLOSED = 0
    OPENED = 1


class S3ObjectState(enum.IntEnum):
    PREPARED = 1
    COMMITTED = 2
    MARK_DESTROYED = 3


# ===================================================================== records (AutoMQ 4.1)


@dataclass(frozen=True, slots=True)
class S3StreamRecord:
    stream_id: int
    epoch: int
    range_index: int
    start_offset: int
    state: StreamState


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
)
