"""Fault injection for storage: a block device that loses power on cue.

``MemoryBlockDevice`` keeps two images: what a crash would keep (``durable``) and what reads
see now (``volatile``). Writes land in ``volatile`` and are remembered until the next ``sync``.
``crash(rng)`` builds the disk a reboot would find: the durable image plus, for each write since
the last sync, an arbitrary subset of its sectors (torn and reordered writes). A countdown
(``crash_after_operations``) makes the device die in the middle of the WAL's own sequence of
writes and syncs, so a crash can fall between a write and the fsync that would have covered it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from automq_ref.io.block_device import Buffer


class DeviceCrashedError(OSError):
    """The simulated device lost power: this and every later operation fail."""


class MemoryBlockDevice:
    def __init__(
        self,
        size_bytes: int,
        *,
        sector_bytes: int = 512,
        durable: bytes | None = None,
    ) -> None:
        if durable is not None and len(durable) != size_bytes:
            raise ValueError("durable image must be exactly size_bytes long")
        self._size_bytes = size_bytes
        self.sector_bytes = sector_bytes
        self.durable = bytearray(durable if durable is not None else bytes(size_bytes))
        self.volatile = bytearray(self.durable)
        self.unsynced_writes: list[tuple[int, bytes]] = []
        self.crash_after_operations: int | None = None
        self.crashed = False
        self.write_count = 0
        self.sync_count = 0

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def _operation(self) -> None:
        if self.crashed:
            raise DeviceCrashedError("device lost power")
        if self.crash_after_operations is not None:
            if self.crash_after_operations <= 0:
                self.crashed = True
                raise DeviceCrashedError("device lost power")
            self.crash_after_operations -= 1

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        self._operation()
        data = b"".join(bytes(buffer) for buffer in buffers)
        if position < 0 or position + len(data) > self._size_bytes:
            raise OSError(f"write of {len(data)} bytes at {position} beyond device end")
        self.volatile[position : position + len(data)] = data
        self.unsynced_writes.append((position, data))
        self.write_count += 1

    def read(self, size: int, position: int) -> bytes:
        self._operation()
        data = bytes(self.volatile[position : position + size])
        return data + bytes(size - len(data))

    def sync(self) -> None:
        self._operation()
        self.durable[:] = self.volatile
        self.unsynced_writes.clear()
        self.sync_count += 1

    def close(self) -> None:
        pass

    def crash(self, rng: random.Random, *, keep_probability: float = 0.5) -> MemoryBlockDevice:
        """The device a reboot would find: durable bytes plus a random subset of later sectors."""
        image = bytearray(self.durable)
        for position, data in self.unsynced_writes:
            for start in range(0, len(data), self.sector_bytes):
                if rng.random() < keep_probability:
                    end = min(start + self.sector_bytes, len(data))
                    image[position + start : position + end] = data[start:end]
        return MemoryBlockDevice(
            self._size_bytes, sector_bytes=self.sector_bytes, durable=bytes(image)
        )

    def flip_bit(self, position: int, bit: int) -> None:
        """Flip one bit in both images (silent media corruption)."""
        self.durable[position] ^= 1 << bit
        self.volatile[position] ^= 1 << bit
