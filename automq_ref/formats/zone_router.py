"""The zone router's byte layouts: where a proxy put produce data, and what it sends the main.

A client in zone B produces to a proxy in B; the proxy appends the data to its own RouterChannel
(an object WAL of its own, readable by every node) and tells the partition's leader, the *main*,
only where the data is. The main reads it, appends it, and keeps in its own WAL a *link record*
pointing back into the channel. Five layouts carry this, all big-endian:

WAL record offset (:class:`RecordOffset`, 21 bytes): where one record of an object WAL lies::

    offset size field
         0    1 magic   0xA8
         1    8 epoch   the node epoch of the WAL instance that wrote the record
         9    8 offset  the record's WAL offset (object = epoch + floor64MiB(offset))
        17    4 size    bytes of the whole WAL record: its 24-byte header and its body

Channel offset (:class:`ChannelOffset`, 34 bytes): a record in some node's RouterChannel::

    offset size field
         0    1 magic               0x86
         1    2 channel_id          i16, the channel's bucket id (from its URI, ``<id>@s3://..``)
         3    2 order_hint          i16, hash(topic, partition, connection) mod 32767
         5    4 channel_owner       i32, the node whose channel holds the record
         9    4 attributes          i32, the target node (the main the data is for)
        13   21 record_offset       a RecordOffset

Link record v0 (:class:`LinkRecord`, 25 + 34 bytes), the payload of the StreamRecordBatch a
main writes to its WAL in place of routed data (that batch's count is minus the data's count)::

    offset size field
         0    1 magic                  0x00
         1    8 last_offset            i64, the last offset of the data's Kafka batch
         9    4 timestamp_type         i32, 0 create time, 1 log-append time
        13    8 max_timestamp          i64
        21    4 partition_leader_epoch i32
        25   34 channel_offset         a ChannelOffset

Router record v2 (:class:`RouterRecordV2`), the metadata of a zone router request: one proxy's
channel offsets for one target node::

    offset size field
         0    1 magic          0x02
         1    4 proxy_node_id  i32
         5    .. entries       repeated to the end: length i16, then that many bytes of one
                               ChannelOffset

Zone router pack data block (:class:`ZoneRouterPack`), the payload a proxy appends to its
channel: the produce requests it routes, each kept whole so the main can decode it as it would a
client's::

    offset size field
         0    1 magic        0x01
         1    .. requests    repeated to the end: api_version i16, flag i16, size i32, then
                             ``size`` bytes of a ProduceRequest body

Decoding checks every byte it is given: a wrong magic raises ``BadMagicError``, a buffer that
ends early ``TruncatedError``, trailing bytes or a value the layout does not allow (a negative
offset or length) ``InvalidFieldError``; each message names the layout and the field. All of
them are ``FormatError``, which carries the Kafka error code a broker answers such bytes with.
Constructing a value whose field does not fit its width raises ``InvalidFieldError`` too, so
:meth:`encode` never writes what :meth:`decode` would refuse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

from automq_ref.formats.errors import BadMagicError, InvalidFieldError, TruncatedError

Buffer: TypeAlias = bytes | bytearray | memoryview

RECORD_OFFSET_MAGIC: Final = 0xA8
CHANNEL_OFFSET_MAGIC: Final = 0x86
LINK_RECORD_MAGIC_V0: Final = 0x00
ROUTER_RECORD_MAGIC_V2: Final = 0x02
ZONE_ROUTER_PACK_MAGIC: Final = 0x01

ORDER_HINT_MODULUS: Final = 32767
"""A proxy's order hint is ``hash(topic, partition, connection) mod`` this (AutoMQ's)."""

_RECORD_OFFSET = struct.Struct(">Bqqi")
_CHANNEL_OFFSET_HEAD = struct.Struct(">Bhhii")
_LINK_RECORD_HEAD = struct.Struct(">Bqiqi")
_ROUTER_RECORD_HEAD = struct.Struct(">Bi")
_ENTRY_LENGTH = struct.Struct(">h")
_PACK_MAGIC = struct.Struct(">B")
_PACK_REQUEST_HEAD = struct.Struct(">hhi")

RECORD_OFFSET_SIZE: Final = _RECORD_OFFSET.size
CHANNEL_OFFSET_SIZE: Final = _CHANNEL_OFFSET_HEAD.size + RECORD_OFFSET_SIZE
LINK_RECORD_SIZE: Final = _LINK_RECORD_HEAD.size + CHANNEL_OFFSET_SIZE

_I16: Final = (-(1 << 15), (1 << 15) - 1)
_I32: Final = (-(1 << 31), (1 << 31) - 1)
_I64: Final = (-(1 << 63), (1 << 63) - 1)


def _check(layout: str, name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidFieldError(f"{layout} {name} {value} outside [{low}, {high}]")


def _need(layout: str, data: Buffer, position: int, size: int) -> None:
    if len(data) - position < size:
        raise TruncatedError(
            f"{layout} needs {size} bytes at position {position}, "
            f"{max(0, len(data) - position)} remain"
        )


def _magic(layout: str, found: int, expected: int) -> None:
    if found != expected:
        raise BadMagicError(f"{layout} magic {found:#04x}, expected {expected:#04x}")


def _exact(layout: str, data: Buffer, size: int) -> None:
    if len(data) != size:
        if len(data) < size:
            raise TruncatedError(f"{layout} is {size} bytes, got {len(data)}")
        raise InvalidFieldError(f"{layout} is {size} bytes, got {len(data)} (trailing bytes)")


# ------------------------------------------------------------------------- record offset


@dataclass(frozen=True, slots=True)
class RecordOffset:
    """Where one record of an object WAL lies: the writer's epoch, the record's WAL offset and
    the bytes of the whole record (header and body)."""

    epoch: int
    offset: int
    size: int

    def __post_init__(self) -> None:
        _check("RecordOffset", "epoch", self.epoch, (0, _I64[1]))
        _check("RecordOffset", "offset", self.offset, (0, _I64[1]))
        _check("RecordOffset", "size", self.size, (0, _I32[1]))

    def encode(self) -> bytes:
        return _RECORD_OFFSET.pack(RECORD_OFFSET_MAGIC, self.epoch, self.offset, self.size)

    @classmethod
    def decode(cls, data: Buffer) -> RecordOffset:
        """The record offset ``data`` holds exactly; raises a ``FormatError`` otherwise."""
        _exact("RecordOffset", data, RECORD_OFFSET_SIZE)
        magic, epoch, offset, size = _RECORD_OFFSET.unpack_from(data, 0)
        _magic("RecordOffset", magic, RECORD_OFFSET_MAGIC)
        return cls(epoch, offset, size)


# ------------------------------------------------------------------------ channel offset


@dataclass(frozen=True, slots=True)
class ChannelOffset:
    """A record in ``channel_owner``'s RouterChannel ``channel_id``, routed to
    ``target_node_id`` (the layout's ``attributes`` field) under ``order_hint``."""

    channel_id: int
    order_hint: int
    channel_owner: int
    target_node_id: int
    record_offset: RecordOffset

    def __post_init__(self) -> None:
        _check("ChannelOffset", "channel_id", self.channel_id, _I16)
        _check("ChannelOffset", "order_hint", self.order_hint, _I16)
        _check("ChannelOffset", "channel_owner", self.channel_owner, _I32)
        _check("ChannelOffset", "target_node_id (attributes)", self.target_node_id, _I32)

    @property
    def attributes(self) -> int:
        """The layout's name of the field that holds the target node."""
        return self.target_node_id

    def encode(self) -> bytes:
        return (
            _CHANNEL_OFFSET_HEAD.pack(
                CHANNEL_OFFSET_MAGIC,
                self.channel_id,
                self.order_hint,
                self.channel_owner,
                self.target_node_id,
            )
            + self.record_offset.encode()
        )

    @classmethod
    def decode(cls, data: Buffer) -> ChannelOffset:
        """The channel offset ``data`` holds exactly; raises a ``FormatError`` otherwise."""
        _need("ChannelOffset", data, 0, _CHANNEL_OFFSET_HEAD.size)
        magic, channel_id, hint, owner, target = _CHANNEL_OFFSET_HEAD.unpack_from(data, 0)
        _magic("ChannelOffset", magic, CHANNEL_OFFSET_MAGIC)
        _exact("ChannelOffset", data, CHANNEL_OFFSET_SIZE)
        record_offset = RecordOffset.decode(memoryview(data)[_CHANNEL_OFFSET_HEAD.size :])
        return cls(channel_id, hint, owner, target, record_offset)


# --------------------------------------------------------------------------- link record


@dataclass(frozen=True, slots=True)
class LinkRecord:
    """What a main's WAL holds for routed data: the data's batch facts the partition needs
    (its last offset, timestamp type and maximum, leader epoch) and where the data is."""

    last_offset: int
    timestamp_type: int
    max_timestamp: int
    partition_leader_epoch: int
    channel_offset: ChannelOffset

    def __post_init__(self) -> None:
        _check("LinkRecord", "last_offset", self.last_offset, _I64)
        _check("LinkRecord", "timestamp_type", self.timestamp_type, _I32)
        _check("LinkRecord", "max_timestamp", self.max_timestamp, _I64)
        _check("LinkRecord", "partition_leader_epoch", self.partition_leader_epoch, _I32)

    @property
    def data_size(self) -> int:
        """The size of the data it stands for, as AutoMQ reports a link record's size: the
        size of the channel record it points to."""
        return self.channel_offset.record_offset.size

    def encode(self) -> bytes:
        return (
            _LINK_RECORD_HEAD.pack(
                LINK_RECORD_MAGIC_V0,
                self.last_offset,
                self.timestamp_type,
                self.max_timestamp,
                self.partition_leader_epoch,
            )
            + self.channel_offset.encode()
        )

    @classmethod
    def decode(cls, data: Buffer) -> LinkRecord:
        """The link record ``data`` holds exactly; raises a ``FormatError`` otherwise."""
        _need("LinkRecord", data, 0, 1)
        _magic("LinkRecord", data[0], LINK_RECORD_MAGIC_V0)
        _exact("LinkRecord", data, LINK_RECORD_SIZE)
        _, last, ts_type, max_ts, leader_epoch = _LINK_RECORD_HEAD.unpack_from(data, 0)
        channel_offset = ChannelOffset.decode(memoryview(data)[_LINK_RECORD_HEAD.size :])
        return cls(last, ts_type, max_ts, leader_epoch, channel_offset)


# ------------------------------------------------------------------------- router record


@dataclass(frozen=True, slots=True)
class RouterRecordV2:
    """A zone router request's metadata: ``proxy_node_id``'s channel offsets, in the order the
    main must answer them."""

    proxy_node_id: int
    channel_offsets: tuple[ChannelOffset, ...]

    def __post_init__(self) -> None:
        _check("RouterRecordV2", "proxy_node_id", self.proxy_node_id, _I32)

    def encode(self) -> bytes:
        parts = [_ROUTER_RECORD_HEAD.pack(ROUTER_RECORD_MAGIC_V2, self.proxy_node_id)]
        for channel_offset in self.channel_offsets:
            encoded = channel_offset.encode()
            parts.append(_ENTRY_LENGTH.pack(len(encoded)))
            parts.append(encoded)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: Buffer) -> RouterRecordV2:
        """The router record ``data`` holds exactly; raises a ``FormatError`` otherwise."""
        _need("RouterRecordV2", data, 0, _ROUTER_RECORD_HEAD.size)
        magic, proxy = _ROUTER_RECORD_HEAD.unpack_from(data, 0)
        _magic("RouterRecordV2", magic, ROUTER_RECORD_MAGIC_V2)
        view = memoryview(data)
        position = _ROUTER_RECORD_HEAD.size
        offsets: list[ChannelOffset] = []
        while position < len(view):
            index = len(offsets)
            _need(f"RouterRecordV2 entry {index} length", view, position, _ENTRY_LENGTH.size)
            (length,) = _ENTRY_LENGTH.unpack_from(view, position)
            position += _ENTRY_LENGTH.size
            if length < 0:
                raise InvalidFieldError(f"RouterRecordV2 entry {index} length {length} < 0")
            _need(f"RouterRecordV2 entry {index}", view, position, length)
            offsets.append(ChannelOffset.decode(view[position : position + length]))
            position += length
        return cls(proxy, tuple(offsets))


# -------------------------------------------------------------------- zone router pack


@dataclass(frozen=True, slots=True)
class RoutedProduceRequest:
    """One produce request a proxy routes: its API version, the router's flag bits, and the
    ProduceRequest body exactly as the client sent it (no request header)."""

    api_version: int
    flag: int
    body: bytes

    def __post_init__(self) -> None:
        _check("ZoneRouterPack request", "api_version", self.api_version, _I16)
        _check("ZoneRouterPack request", "flag", self.flag, _I16)
        _check("ZoneRouterPack request", "size", len(self.body), (0, _I32[1]))


@dataclass(frozen=True, slots=True)
class ZoneRouterPack:
    """The data block a proxy appends to its RouterChannel: the produce requests it routes."""

    requests: tuple[RoutedProduceRequest, ...]

    def encode(self) -> bytes:
        parts: list[bytes] = [_PACK_MAGIC.pack(ZONE_ROUTER_PACK_MAGIC)]
        for request in self.requests:
            parts.append(
                _PACK_REQUEST_HEAD.pack(request.api_version, request.flag, len(request.body))
            )
            parts.append(request.body)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: Buffer) -> ZoneRouterPack:
        """The data block ``data`` holds exactly; raises a ``FormatError`` otherwise."""
        _need("ZoneRouterPack", data, 0, _PACK_MAGIC.size)
        _magic("ZoneRouterPack", data[0], ZONE_ROUTER_PACK_MAGIC)
        view = memoryview(data)
        position = _PACK_MAGIC.size
        requests: list[RoutedProduceRequest] = []
        while position < len(view):
            index = len(requests)
            layout = f"ZoneRouterPack request {index}"
            _need(f"{layout} header", view, position, _PACK_REQUEST_HEAD.size)
            version, flag, size = _PACK_REQUEST_HEAD.unpack_from(view, position)
            position += _PACK_REQUEST_HEAD.size
            if size < 0:
                raise InvalidFieldError(f"{layout} size {size} < 0")
            _need(f"{layout} body", view, position, size)
            requests.append(
                RoutedProduceRequest(version, flag, bytes(view[position : position + size]))
            )
            position += size
        return cls(tuple(requests))
