"""The object WAL's two fixed layouts: the header of a WAL object and the reservation object.

WAL object header (44 bytes, big-endian), in front of the object's records::

    offset size field
         0    4 magic                0xEDCBA987
         4    8 start_offset         the WAL offset of the first record (a multiple of 64 MiB)
        12    8 data_length          bytes of records that follow the header
        20    4 sticky_record_length 0 (kept for the layout; nothing uses it)
        24    4 node_id              the node whose WAL this is
        28    8 epoch                the node epoch that wrote the object
        36    8 trim_offset          the writer's trim offset when the object was sealed

The records that follow are WAL records (:mod:`automq_ref.formats.wal_record`), one after
another from WAL offset ``start_offset``: the record at byte ``44 + p`` of the object sits at WAL
offset ``start_offset + p``, and its header's body offset says so. The header has no CRC of its
own: an object is written whole or not at all, the records check themselves, and the header's
fields are checked against the object's key and size.

Reservation (21 bytes, big-endian), the content of a node's reservation object::

    offset size field
         0    4 magic     0x12345678
         4    8 node_id
        12    8 epoch
        20    1 failover  1 when a survivor took the WAL over, else 0

A writer owns the WAL while the reservation object holds exactly the bytes it wrote; whoever
writes other bytes there takes the WAL from it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.errors import BadMagicError, InvalidFieldError, TruncatedError

WAL_OBJECT_MAGIC: Final = 0xEDCBA987
RESERVATION_MAGIC: Final = 0x12345678

_WAL_OBJECT_HEADER = struct.Struct(">Iqqiiqq")
_RESERVATION = struct.Struct(">Iqq?")

WAL_OBJECT_HEADER_SIZE: Final = _WAL_OBJECT_HEADER.size
RESERVATION_SIZE: Final = _RESERVATION.size
_MAX_OFFSET: Final = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class WalObjectHeader:
    start_offset: int
    data_length: int
    node_id: int
    epoch: int
    trim_offset: int

    def encode(self) -> bytes:
        for name, value in (
            ("start_offset", self.start_offset),
            ("data_length", self.data_length),
            ("trim_offset", self.trim_offset),
        ):
            if not 0 <= value <= _MAX_OFFSET:
                raise ValueError(f"WAL object header {name} {value} outside [0, 2^63)")
        return _WAL_OBJECT_HEADER.pack(
            WAL_OBJECT_MAGIC,
            self.start_offset,
            self.data_length,
            0,
            self.node_id,
            self.epoch,
            self.trim_offset,
        )

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> WalObjectHeader:
        """The header at the start of ``data``; raises a ``FormatError`` when it is not one."""
        if len(data) < WAL_OBJECT_HEADER_SIZE:
            raise TruncatedError(
                f"WAL object header needs {WAL_OBJECT_HEADER_SIZE} bytes, got {len(data)}"
            )
        magic, start, length, _sticky, node_id, epoch, trim = _WAL_OBJECT_HEADER.unpack_from(
            data, 0
        )
        if magic != WAL_OBJECT_MAGIC:
            raise BadMagicError(f"WAL object magic {magic:#010x}")
        if start < 0 or length < 0 or trim < 0:
            raise InvalidFieldError(
                f"WAL object header start {start}, length {length}, trim {trim}"
            )
        return cls(start, length, node_id, epoch, trim)


@dataclass(frozen=True, slots=True)
class Reservation:
    node_id: int
    epoch: int
    failover: bool

    def encode(self) -> bytes:
        return _RESERVATION.pack(RESERVATION_MAGIC, self.node_id, self.epoch, self.failover)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Reservation:
        """The reservation ``data`` holds; raises a ``FormatError`` when it is not one."""
        if len(data) != RESERVATION_SIZE:
            raise TruncatedError(f"a reservation is {RESERVATION_SIZE} bytes, not {len(data)}")
        magic, node_id, epoch, failover = _RESERVATION.unpack(data)
        if magic != RESERVATION_MAGIC:
            raise BadMagicError(f"reservation magic {magic:#010x}")
        if data[20] not in (0, 1):
            raise InvalidFieldError(f"reservation failover flag {data[20]}")
        return cls(node_id, epoch, failover)
