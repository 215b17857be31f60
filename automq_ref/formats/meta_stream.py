"""A partition's MetaStream records: small key/value records, the last value of a key wins.

Each record is one stream record whose payload is the JSON ``{"k": key, "v": value}``. The keys:

``LOG``
    ``{"data": <data stream id>}``: the stream holding the partition's Kafka batches (the live
    log, where produce appends).
``LEADER_EPOCHS``
    ``[[epoch, start offset], ...]``: the epoch history, oldest first, rewritten whole each time
    the partition is opened (OffsetForLeaderEpoch answers from it).
``CLEANING``
    ``{"stream": <id>}``: a compaction began writing its output to this new stream. Until a
    ``CLEANED`` record names the same stream, that output is not part of the log: a partition
    opened with a ``CLEANING`` stream that ``CLEANED`` does not name deletes it (a clean cut
    short is discarded, never seen in part).
``CLEANED``
    ``{"stream": <id>, "end": <offset>, "replaces": <id> | null}``: the commit point of a
    compaction. The log below ``end`` is read from this stream (the compacted batches, at their
    own offsets), the log from ``end`` on from the ``LOG`` stream (trimmed to ``end`` right
    after); ``replaces`` is the previous clean's stream, deleted after the switch (and by the
    next open if that did not happen).
``CHECKPOINT``
    The batch index and the producer state up to an offset, written by a partition that closes
    cleanly and every so often while it runs (:mod:`automq_ref.formats.partition_checkpoint`
    has its layout): the next open scans the log only past that offset. :func:`replay` keeps
    the value undecoded: a checkpoint the partition cannot use (another version, corrupt, or
    one describing a log that changed since) is ignored by it and the whole log scanned, never
    an error.

The MetaStream only grows by appends; a partition writing a checkpoint also rewrites the last
record of each key (any key, known or not) once the stream holds more than twice their bytes,
and trims the stream to the first of them (:func:`latest_records` finds them): replay gives the
same state.

Written by the broker's partitions (:mod:`automq_ref.kafka.partition`); read back by them when
they open, and by the ``automq-objects`` Spark source (:mod:`automq_ref.spark.image`) to find a
partition's data stream. Both replay the records with :func:`replay`, which ignores keys it does
not know (a later version may add some) and checks the values of those it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
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
CLEANING_KEY: Final = "CLEANING"
CLEANED_KEY: Final = "CLEANED"
CHECKPOINT_KEY: Final = "CHECKPOINT"


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


def encode_cleaning(stream_id: int) -> bytes:
    """The ``CLEANING`` record: a compaction writes to ``stream_id``."""
    return encode_entry(CLEANING_KEY, {"stream": stream_id})


def encode_cleaned(stream_id: int, end: int, replaces: int | None) -> bytes:
    """The ``CLEANED`` record: the log below ``end`` is now ``stream_id``'s."""
    return encode_entry(CLEANED_KEY, {"stream": stream_id, "end": end, "replaces": replaces})


def encode_checkpoint_record(value: Json) -> bytes:
    """The ``CHECKPOINT`` record holding ``value`` (see :mod:`~.partition_checkpoint`)."""
    return encode_entry(CHECKPOINT_KEY, value)


def latest_records(payloads: Iterable[bytes | bytearray | memoryview]) -> dict[str, bytes]:
    """The last record of each key, in stream order of those records: replaying them alone
    gives what replaying every record gives."""
    latest: dict[str, bytes] = {}
    for payload in payloads:
        key, _ = decode_entry(payload)
        latest.pop(key, None)  # keep the order of the last records
        latest[key] = bytes(payload)
    return latest


@dataclass(frozen=True, slots=True)
class Cleaned:
    """The last committed compaction: its stream, where it ended, the stream it replaced."""

    stream_id: int
    end: int
    replaces: int | None


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """What a partition's MetaStream says, once replayed."""

    data_stream_id: int | None = None  # None: no LOG record (yet)
    leader_epochs: tuple[tuple[int, int], ...] = ()
    cleaning_stream_id: int | None = None  # the last compaction begun
    cleaned: Cleaned | None = None  # the last compaction committed
    checkpoint: Json = None  # the last CHECKPOINT value, undecoded (None: none written)


def _log_value(value: Json) -> int:
    document = require_object(value, "LOG value")
    return require_int(require_field(document, "data", "LOG value"), "LOG data", minimum=0)


def _leader_epochs_value(value: Json) -> tuple[tuple[int, int], ...]:
    pairs: list[tuple[int, int]] = []
    for item in require_list(value, "LEADER_EPOCHS value"):
        epoch, offset = require_list(item, "LEADER_EPOCHS entry", length=2)
        pairs.append((require_int(epoch, "leader epoch"), require_int(offset, "epoch start")))
    return tuple(pairs)


def _cleaning_value(value: Json) -> int:
    document = require_object(value, "CLEANING value")
    return require_int(require_field(document, "stream", "CLEANING value"), "stream", minimum=0)


def _cleaned_value(value: Json) -> Cleaned:
    document = require_object(value, "CLEANED value")
    stream_id = require_int(require_field(document, "stream", "CLEANED value"), "stream", minimum=0)
    end = require_int(require_field(document, "end", "CLEANED value"), "end", minimum=0)
    raw = require_field(document, "replaces", "CLEANED value")
    replaces = None if raw is None else require_int(raw, "replaces", minimum=0)
    return Cleaned(stream_id, end, replaces)


def replay(payloads: Iterable[bytes | bytearray | memoryview]) -> PartitionMeta:
    """The MetaStream's state after its records, in stream order: the last value of each key."""
    meta = PartitionMeta()
    for payload in payloads:
        key, value = decode_entry(payload)
        if key == LOG_KEY:
            meta = replace(meta, data_stream_id=_log_value(value))
        elif key == LEADER_EPOCHS_KEY:
            meta = replace(meta, leader_epochs=_leader_epochs_value(value))
        elif key == CLEANING_KEY:
            meta = replace(meta, cleaning_stream_id=_cleaning_value(value))
        elif key == CLEANED_KEY:
            meta = replace(meta, cleaned=_cleaned_value(value))
        elif key == CHECKPOINT_KEY:
            meta = replace(meta, checkpoint=value)
    return meta
