"""Keys and values of the ``__transaction_state`` records: Kafka's own schemas.

A transaction coordinator keeps the state of each transactional id in the internal topic
``__transaction_state`` as Kafka records, with the key and value layouts Kafka's coordinator
uses, so the topic's compaction keeps the latest record of each transactional id and a tool that
knows Kafka's layouts reads the topic. Each key and value starts with an int16 schema version:

``TransactionLogKey`` (version 0)
    transactional id (string: an int16 length and UTF-8 bytes). A key of another version decodes
    to ``None``: a reader skips it.
``TransactionLogValue`` (versions 0 and 1 read; written as 0 unless asked for 1)
    producer id (int64), producer epoch (int16), transaction timeout (int32, ms), status (int8:
    see :data:`STATUS_NAMES`), the partitions in the transaction (a nullable array of a topic
    string and an array of int32 partition ids; null when there are none), last update
    timestamp (int64, ms), start timestamp (int64, ms).

    Version 1 is *flexible*: strings and arrays carry an unsigned varint of their length plus
    one (0 is null), and the value and each partition entry end with a tagged-fields section (an
    unsigned varint count, then per field an unsigned varint tag, an unsigned varint size and
    the field's bytes). The value's tags are 0, the previous producer id (int64, default -1);
    1, the next producer id (int64, default -1); 2, the client transaction version (int16,
    default 0). Unknown tags are skipped; a tag seen twice, or a known tag of the wrong size, is
    malformed. Version 1 writes only the tagged fields whose values are not the defaults;
    version 0 cannot carry them, so writing one that is not the default at version 0 is refused
    (as Kafka's generated code refuses it).

A null value (a tombstone: the transactional id expired) is the caller's to handle. Malformed
or truncated bytes raise :class:`~automq_ref.formats.errors.FormatError`; so does a value that
does not fit its fields, on encode.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import InvalidFieldError, TruncatedError

TRANSACTION_LOG_KEY_VERSION: Final = 0
TRANSACTION_LOG_VALUE_VERSIONS: Final = (0, 1)

STATUS_NAMES: Final = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)

_PREVIOUS_PRODUCER_ID_TAG: Final = 0
_NEXT_PRODUCER_ID_TAG: Final = 1
_CLIENT_TRANSACTION_VERSION_TAG: Final = 2

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT16_MAX = 2**15 - 1
_UNSIGNED_VARINT_MAX_BYTES = 5  # a 32-bit unsigned varint, as Kafka's ByteUtils reads it

_KEY: Final = "__transaction_state key"
_VALUE: Final = "__transaction_state value"


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    """One transactional id's state; ``partitions`` is ``(topic, partition ids)`` pairs."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: int
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


def partitions_of(keys: Iterable[tuple[str, int]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Group ``(topic, partition)`` pairs by topic, topics and ids sorted, duplicates dropped."""
    by_topic: dict[str, set[int]] = {}
    for topic, partition in keys:
        by_topic.setdefault(topic, set()).add(partition)
    return tuple((topic, tuple(sorted(by_topic[topic]))) for topic in sorted(by_topic))


# --- encoding -------------------------------------------------------------------------------


def _pack(layout: struct.Struct, value: int, field: str) -> bytes:
    try:
        return layout.pack(value)
    except struct.error as error:
        raise InvalidFieldError(f"{_VALUE}: {field} {value!r} does not fit: {error}") from error


def _unsigned_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_bytes(value: str, what: str) -> bytes:
    encoded = value.encode()
    if len(encoded) > _INT16_MAX:
        raise InvalidFieldError(f"{what}: a string of {len(encoded)} bytes is longer than 32767")
    return encoded


def _string(value: str, flexible: bool, what: str) -> bytes:
    encoded = _string_bytes(value, what)
    if flexible:
        return _unsigned_varint(len(encoded) + 1) + encoded
    return _INT16.pack(len(encoded)) + encoded


def _array_length(length: int, flexible: bool) -> bytes:
    return _unsigned_varint(length + 1) if flexible else _INT32.pack(length)


def _tagged_fields(fields: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(_unsigned_varint(len(fields)))
    for tag, data in fields:
        out += _unsigned_varint(tag) + _unsigned_varint(len(data)) + data
    return bytes(out)


def encode_key(transactional_id: str) -> bytes:
    return _INT16.pack(TRANSACTION_LOG_KEY_VERSION) + _string(transactional_id, False, _KEY)


def encode_value(value: TransactionLogValue, version: int = 0) -> bytes:
    """The value's bytes at ``version`` (0, as Kafka 3.x writes, or the flexible 1)."""
    if version not in TRANSACTION_LOG_VALUE_VERSIONS:
        raise InvalidFieldError(f"{_VALUE}: version {version} cannot be written")
    if not 0 <= value.status < len(STATUS_NAMES):
        raise InvalidFieldError(f"{_VALUE}: status {value.status} unknown")
    flexible = version >= 1
    out = bytearray(_INT16.pack(version))
    out += _pack(_INT64, value.producer_id, "producer id")
    out += _pack(_INT16, value.producer_epoch, "producer epoch")
    out += _pack(_INT32, value.timeout_ms, "transaction timeout")
    out += _INT8.pack(value.status)
    if not value.partitions:
        out += _unsigned_varint(0) if flexible else _INT32.pack(-1)  # null
    else:
        out += _array_length(len(value.partitions), flexible)
        for topic, partition_ids in value.partitions:
            out += _string(topic, flexible, _VALUE)
            out += _array_length(len(partition_ids), flexible)
            for partition in partition_ids:
                out += _pack(_INT32, partition, "partition id")
            if flexible:
                out += _tagged_fields([])
    out += _pack(_INT64, value.last_update_ms, "last update timestamp")
    out += _pack(_INT64, value.start_ms, "start timestamp")
    tagged: list[tuple[int, bytes]] = []
    if value.previous_producer_id != -1:
        tagged.append(
            (
                _PREVIOUS_PRODUCER_ID_TAG,
                _pack(_INT64, value.previous_producer_id, "previous producer id"),
            )
        )
    if value.next_producer_id != -1:
        tagged.append(
            (_NEXT_PRODUCER_ID_TAG, _pack(_INT64, value.next_producer_id, "next producer id"))
        )
    if value.client_transaction_version != 0:
        tagged.append(
            (
                _CLIENT_TRANSACTION_VERSION_TAG,
                _pack(_INT16, value.client_transaction_version, "client transaction version"),
            )
        )
    if flexible:
        out += _tagged_fields(tagged)
    elif tagged:
        raise InvalidFieldError(
            f"{_VALUE}: version 0 cannot carry a previous or next producer id or a client"
            " transaction version other than the default; write version 1"
        )
    return bytes(out)


# --- decoding -------------------------------------------------------------------------------


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

    def int8(self) -> int:
        value: int = _INT8.unpack(self._take(1))[0]
        return value

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def unsigned_varint(self) -> int:
        value = 0
        for index in range(_UNSIGNED_VARINT_MAX_BYTES):
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                if value >= 2**32:
                    raise InvalidFieldError(f"{self._what}: a varint larger than 32 bits")
                return value
        raise InvalidFieldError(f"{self._what}: a varint longer than 5 bytes")

    def string(self, flexible: bool) -> str:
        length = self.unsigned_varint() - 1 if flexible else self.int16()
        if length < 0:
            raise InvalidFieldError(f"{self._what}: a null string")
        if length > _INT16_MAX:
            raise InvalidFieldError(f"{self._what}: a string of {length} bytes")
        try:
            return self._take(length).decode()
        except UnicodeDecodeError as error:
            raise InvalidFieldError(f"{self._what}: a string that is not UTF-8") from error

    def array_length(self, flexible: bool) -> int:
        """An array's element count, or -1 for null."""
        length = self.unsigned_varint() - 1 if flexible else self.int32()
        if length < -1:
            raise InvalidFieldError(f"{self._what}: an array length of {length}")
        return length

    def tagged_fields(self) -> dict[int, bytes]:
        fields: dict[int, bytes] = {}
        for _ in range(self.unsigned_varint()):
            tag = self.unsigned_varint()
            if tag in fields:
                raise InvalidFieldError(f"{self._what}: tag {tag} appears twice")
            fields[tag] = self._take(self.unsigned_varint())
        return fields

    def done(self) -> None:
        if self._position != len(self._data):
            raise InvalidFieldError(
                f"{self._what}: {len(self._data) - self._position} bytes left over"
            )


def decode_key(data: bytes | memoryview) -> str | None:
    """The transactional id, or ``None`` for a key of a version other than 0 (to be skipped)."""
    reader = _Reader(data, _KEY)
    if reader.int16() != TRANSACTION_LOG_KEY_VERSION:
        return None
    transactional_id = reader.string(False)
    reader.done()
    return transactional_id


def _tagged_int(fields: dict[int, bytes], tag: int, layout: struct.Struct, default: int) -> int:
    data = fields.get(tag)
    if data is None:
        return default
    if len(data) != layout.size:
        raise InvalidFieldError(f"{_VALUE}: tag {tag} holds {len(data)} bytes, not {layout.size}")
    value: int = layout.unpack(data)[0]
    return value


def decode_value(data: bytes | memoryview) -> TransactionLogValue:
    reader = _Reader(data, _VALUE)
    version = reader.int16()
    if version not in TRANSACTION_LOG_VALUE_VERSIONS:
        raise InvalidFieldError(f"{_VALUE}: version {version} unknown")
    flexible = version >= 1
    producer_id = reader.int64()
    producer_epoch = reader.int16()
    timeout_ms = reader.int32()
    status = reader.int8()
    if not 0 <= status < len(STATUS_NAMES):
        raise InvalidFieldError(f"{_VALUE}: status {status} unknown")
    partitions: list[tuple[str, tuple[int, ...]]] = []
    for _ in range(max(reader.array_length(flexible), 0)):
        topic = reader.string(flexible)
        count = reader.array_length(flexible)
        if count < 0:
            raise InvalidFieldError(f"{_VALUE}: null partition ids of topic {topic!r}")
        partitions.append((topic, tuple(reader.int32() for _ in range(count))))
        if flexible:
            reader.tagged_fields()  # a partition entry defines no tags: all are unknown
    last_update_ms = reader.int64()
    start_ms = reader.int64()
    fields = reader.tagged_fields() if flexible else {}
    reader.done()
    return TransactionLogValue(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timeout_ms=timeout_ms,
        status=status,
        partitions=tuple(partitions),
        last_update_ms=last_update_ms,
        start_ms=start_ms,
        previous_producer_id=_tagged_int(fields, _PREVIOUS_PRODUCER_ID_TAG, _INT64, -1),
        next_producer_id=_tagged_int(fields, _NEXT_PRODUCER_ID_TAG, _INT64, -1),
        client_transaction_version=_tagged_int(fields, _CLIENT_TRANSACTION_VERSION_TAG, _INT16, 0),
    )
