"""A partition's MetaStream records: small key/value records, the last value of a key wins.

Each record is one stream record whose payload is the JSON ``{"k": key, "v": value}``. Two keys
are used today:

``LOG``
    ``{"data": <data stream id>}``: the stream holding the partition's Kafka batches.
``LEADER_EPOCHS``
    ``[[epoch, start offset], ...]``: the epoch history, oldest first, rewritten whole each time
    the partition is opened (OffsetForLeaderEpoch answers from it).

Written by the broker's partitions (:mod:`automq_ref.kafka.partition`); read back by them when
they open, and by the ``automq-objects`` Spark source (:mod:`automq_ref.spark.image`) to find a
partition's data stream. Both replay the records with :func:`replay`, which ignores keys it does
not know (a later version may add some) and checks the values of those it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

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

LOG_KEY: Final = "LOG"
LEADER_EPOCHS_KEY: Final = "LEADER_EPOCHS"


def encode_entry(key: str, value: Json) -> bytes:
    """One MetaStream record: ``value`` under ``key``."""
    return encode_json({"k": key, "v": value})


def decode_entry(payload: bytes | bytearray | memoryview) -> tuple[str, Json]:
    """(key, value) of one MetaStream record."""
    document = require_object(decode_json(payload, "MetaStream record"), "MetaStream record")
    key = require_str(require_field(document, "k", "MetaStream record"), "MetaStream key")
    return key, require_field(document, "v", "MetaStream record")


def encode_log(data_stream_id: int) -> bytes:
    """The ``LOG`` record naming the partition's data stream."""
    return encode_entry(LOG_KEY, {"data": data_stream_id})


def encode_leader_epochs(epochs: Sequence[tuple[int, int]]) -> bytes:
    """The ``LEADER_EPOCHS`` record: (epoch, start offset) pairs, oldest first."""
    return encode_entry(LEADER_EPOCHS_KEY, [[epoch, offset] for epoch, offset in epochs])


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """What a partition's MetaStream says, once replayed."""

    data_stream_id: int | None = None  # None: no LOG record (yet)
    leader_epochs: tuple[tuple[int, int], ...] = ()


def _log_value(value: Json) -> int:
    document = require_object(value, "LOG value")
    return require_int(require_field(document, "data", "LOG value"), "LOG data", minimum=0)


def _leader_epochs_value(value: Json) -> tuple[tuple[int, int], ...]:
    pairs: list[tuple[int, int]] = []
    for item in require_list(value, "LEADER_EPOCHS value"):
        epoch, offset = require_list(item, "LEADER_EPOCHS entry", length=2)
        pairs.append((require_int(epoch, "leader epoch"), require_int(offset, "epoch start")))
    return tuple(pairs)


def replay(payloads: Iterable[bytes | bytearray | memoryview]) -> PartitionMeta:
    """The MetaStream's state after its records, in stream order: the last value of each key."""
    meta = PartitionMeta()
    for payload in payloads:
        key, value = decode_entry(payload)
        if key == LOG_KEY:
            meta = PartitionMeta(_log_value(value), meta.leader_epochs)
        elif key == LEADER_EPOCHS_KEY:
            meta = PartitionMeta(meta.data_stream_id, _leader_epochs_value(value))
    return meta
