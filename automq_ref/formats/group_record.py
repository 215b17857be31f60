"""Records of the offsets streams of earlier versions: committed offsets and group deletions.

Before groups moved to ``__consumer_offsets`` (:mod:`automq_ref.formats.offsets_record`), the
coordinator appended one record per durable effect of the Group machine, in emission order, to
an offsets stream (found under :data:`~automq_ref.vocabulary.naming.OFFSETS_STREAM_KEY`, or a
node's :func:`~automq_ref.vocabulary.naming.node_offsets_stream_key`) and replayed them all at
start-up; such a stream is now read once, to import it
(:mod:`automq_ref.kafka.group_import`). Each record is JSON:

``{"type": "offsets", "group": id, "offsets": [[topic, partition, offset, leader epoch,
metadata, commit timestamp ms], ...]}``
    the offsets one OffsetCommit made durable for group ``id``;
``{"type": "delete", "groups": [id, ...]}``
    a tombstone for each group's offsets (DeleteGroups, or an expired group).

The types here are the codec's own, so that ``formats`` needs nothing from the machines: the
import converts to and from the Group machine's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.json_document import (
    Json,
    decode_json,
    encode_json,
    require_field,
    require_int,
    require_list,
    require_object,
    require_str,
)

OFFSETS_TYPE = "offsets"
DELETE_TYPE = "delete"


@dataclass(frozen=True, slots=True)
class StoredOffset:
    """One committed offset of one partition, as the offsets stream holds it."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OffsetsCommitted:
    group_id: str
    offsets: tuple[StoredOffset, ...]


@dataclass(frozen=True, slots=True)
class GroupsDeleted:
    group_ids: tuple[str, ...]


GroupRecord: TypeAlias = OffsetsCommitted | GroupsDeleted


def encode_group_record(record: GroupRecord) -> bytes:
    document: dict[str, Json]
    if isinstance(record, OffsetsCommitted):
        document = {
            "type": OFFSETS_TYPE,
            "group": record.group_id,
            "offsets": [
                [o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms]
                for o in record.offsets
            ],
        }
    else:
        document = {"type": DELETE_TYPE, "groups": list(record.group_ids)}
    return encode_json(document)


def _stored_offset(item: Json) -> StoredOffset:
    topic, partition, offset, epoch, metadata, timestamp = require_list(
        item, "stored offset", length=6
    )
    return StoredOffset(
        require_str(topic, "stored offset topic"),
        require_int(partition, "stored offset partition"),
        require_int(offset, "stored offset"),
        require_int(epoch, "stored offset leader epoch"),
        require_str(metadata, "stored offset metadata"),
        require_int(timestamp, "stored offset commit timestamp"),
    )


def decode_group_record(payload: bytes | bytearray | memoryview) -> GroupRecord:
    what = "offsets stream record"
    document = require_object(decode_json(payload, what), what)
    record_type = require_field(document, "type", what)
    if record_type == OFFSETS_TYPE:
        group_id = require_str(require_field(document, "group", what), "offsets record group")
        offsets = require_list(require_field(document, "offsets", what), "offsets record offsets")
        return OffsetsCommitted(group_id, tuple(_stored_offset(item) for item in offsets))
    if record_type == DELETE_TYPE:
        groups = require_list(require_field(document, "groups", what), "delete record groups")
        return GroupsDeleted(tuple(require_str(group, "deleted group id") for group in groups))
    raise InvalidFieldError(f"{what}: unknown record type {record_type!r}")
