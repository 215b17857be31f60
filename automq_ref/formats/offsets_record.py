"""Keys and values of the ``__consumer_offsets`` records: Kafka's own schemas.

The group coordinator writes its durable state to the partitions of the internal topic
``__consumer_offsets`` as Kafka records (:mod:`automq_ref.kafka.group_shard`), with the key and
value layouts Kafka's coordinator uses, so the topic's compaction keeps the latest record of
each key and a tool that knows Kafka's layouts reads the topic. Each key and value starts with
an int16 schema version; strings are an int16 length and UTF-8 bytes (the non-flexible
versions):

``OffsetCommitKey`` (versions 0 and 1; written as 1)
    group, topic (strings), partition (int32): one committed offset's key. Its value is an
    ``OffsetCommitValue``, or null (a tombstone: the offset is deleted).
``OffsetCommitValue`` (versions 0 to 3 read; written as 3)
    offset (int64), leader epoch (int32, version 3), metadata (string), commit timestamp (int64),
    expire timestamp (int64, version 1 only).
``GroupMetadataKey`` (version 2)
    group (string). This coordinator keeps no group metadata (members rejoin after a restart:
    :mod:`automq_ref.state_machines.group`), so it writes only this key's tombstone, when a
    group is deleted; a value found under it is skipped.

A key of another version (Kafka's newer group types, share groups, ...) decodes to
:class:`UnknownKey`: a reader skips it. Malformed bytes raise
:class:`~automq_ref.formats.errors.FormatError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

from automq_ref.formats.errors import InvalidFieldError, TruncatedError

OFFSET_COMMIT_KEY_VERSION: Final = 1
OFFSET_COMMIT_VALUE_VERSION: Final = 3
GROUP_METADATA_KEY_VERSION: Final = 2

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT16_MAX = 2**15 - 1


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class UnknownKey:
    version: int


RecordKey: TypeAlias = OffsetKey | GroupKey | UnknownKey


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


def _string(value: str) -> bytes:
    encoded = value.encode()
    if len(encoded) > _INT16_MAX:
        raise InvalidFieldError(f"a string of {len(encoded)} bytes does not fit an int16 length")
    return _INT16.pack(len(encoded)) + encoded


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    return (
        _INT16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(group)
        + _string(topic)
        + _INT32.pack(partition)
    )


def encode_group_key(group: str) -> bytes:
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(group)


def encode_offset_value(value: OffsetValue) -> bytes:
    return (
        _INT16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _INT64.pack(value.offset)
        + _INT32.pack(value.leader_epoch)
        + _string(value.metadata)
        + _INT64.pack(value.commit_timestamp_ms)
    )


class _Reader:
    def __init__(self, data: bytes | memoryview, what: str) -> None:
        self._data = bytes(data)
        self._position = 0
        self._what = what

    def _take(self, size: int) -> bytes:
        end = self._position + size
        if end > len(self._data):
            raise TruncatedError(f"{self._what}: ends at {len(self._data)}, needs {end}")
        chunk = self._data[self._position : end]
        self._position = end
        return chunk

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise InvalidFieldError(f"{self._what}: a null string")
        try:
            return self._take(length).decode()
        except UnicodeDecodeError as error:
            raise InvalidFieldError(f"{self._what}: a string that is not UTF-8") from error

    def done(self) -> None:
        if self._position != len(self._data):
            raise InvalidFieldError(
                f"{self._what}: {len(self._data) - self._position} bytes left over"
            )


def decode_key(data: bytes | memoryview) -> RecordKey:
    reader = _Reader(data, "__consumer_offsets key")
    version = reader.int16()
    if version in (0, 1):
        key: RecordKey = OffsetKey(reader.string(), reader.string(), reader.int32())
    elif version == GROUP_METADATA_KEY_VERSION:
        key = GroupKey(reader.string())
    else:
        return UnknownKey(version)
    reader.done()
    return key


def decode_offset_value(data: bytes | memoryview) -> OffsetValue:
    reader = _Reader(data, "__consumer_offsets offset value")
    version = reader.int16()
    if not 0 <= version <= OFFSET_COMMIT_VALUE_VERSION:
        raise InvalidFieldError(f"__consumer_offsets offset value: version {version} unknown")
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string()
    commit_timestamp_ms = reader.int64()
    if version == 1:
        reader.int64()  # the expire timestamp: offset retention is not modelled
    reader.done()
    return OffsetValue(offset, leader_epoch, metadata, commit_timestamp_ms)
