"""Kafka's control batches: the transaction markers a partition leader writes (KIP-98).

A control batch is a RecordBatch v2 whose attributes have the transactional (bit 4) and control
(bit 5) flags, whose producer id and epoch are the transaction's producer's, whose base sequence
is -1, and which holds one record (Kafka's ``EndTransactionMarker``):

- key: int16 version (0) + int16 control type (0 = ABORT, 1 = COMMIT);
- value: int16 version (0) + int32 coordinator epoch.

Consumers never deliver control records; a READ_COMMITTED consumer reads the markers to know
where each transaction ends.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.record_batch import RecordBatchView
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.formats.record_codec import RecordInput

CONTROL_KEY_VERSION: Final = 0
MARKER_VALUE_VERSION: Final = 0
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class Marker:
    """What one transaction marker says."""

    control_type: ControlType
    coordinator_epoch: int

    @property
    def commit(self) -> bool:
        return self.control_type is ControlType.COMMIT


def encode_marker_key(control_type: ControlType) -> bytes:
    return _KEY.pack(CONTROL_KEY_VERSION, control_type)


def encode_marker_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(MARKER_VALUE_VERSION, coordinator_epoch)


def decode_marker(key: bytes | None, value: bytes | None) -> Marker:
    """The marker a control record's key and value hold; :class:`InvalidFieldError` if they
    are not a transaction marker this version knows (a newer version's trailing bytes are
    tolerated, as Kafka does)."""
    if key is None or len(key) < _KEY.size:
        raise InvalidFieldError("control record key too short")
    key_version, raw_type = _KEY.unpack_from(key)
    if key_version < 0:
        raise InvalidFieldError(f"control record key version {key_version}")
    try:
        control_type = ControlType(raw_type)
    except ValueError:
        raise InvalidFieldError(f"control record type {raw_type} is not a marker") from None
    if value is None or len(value) < _VALUE.size:
        raise InvalidFieldError("transaction marker value too short")
    value_version, coordinator_epoch = _VALUE.unpack_from(value)
    if value_version < 0:
        raise InvalidFieldError(f"transaction marker value version {value_version}")
    return Marker(control_type, coordinator_epoch)


def build_marker_batch(
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    commit: bool,
    timestamp_ms: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """One control batch holding a COMMIT (``commit``) or ABORT marker."""
    control_type = ControlType.COMMIT if commit else ControlType.ABORT
    record = RecordInput(
        key=encode_marker_key(control_type),
        value=encode_marker_value(coordinator_epoch),
        timestamp=timestamp_ms,
    )
    return build_record_batch(
        [record],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_timestamp=timestamp_ms,
        is_transactional=True,
        is_control=True,
    )


def batch_marker(view: RecordBatchView) -> Marker | None:
    """The marker a control batch holds (None: not a control batch, or one without a marker
    record, e.g. compaction emptied it)."""
    if not view.is_control:
        return None
    records = view.records()
    if not records:
        return None
    return decode_marker(records[0].key, records[0].value)
