"""Fault injection for storage: a block device that loses power on cue, and a WAL file whose
un-fsynced tail can be thrown away after its process is killed.

Test code only: it lives under ``automq_ref.checker`` so that no production module can reach it
(``tests/unit/test_layers.py`` checks the imports). It reaches the WAL through the WAL's own seams
(``BlockWal.open_file(wrap_device=...)``); ``automq_ref.checker.broken`` builds those.

``MemoryBlockDevice`` keeps two images: what a crash would keep (``durable``) and what reads
see now (``volatile``). Writes land in ``volatile`` and are remembered until the next ``sync``.
``crash(rng)`` builds the disk a reboot would find: the durable image plus, for each write since
the last sync, an arbitrary subset of its sectors (torn and reordered writes). A countdown
(``crash_after_operations``) makes the device die in the middle of the WAL's own sequence of
writes and syncs, so a crash can fall between a write and the fsync that would have covered it.

Losing the un-fsynced tail of a real WAL file
---------------------------------------------
A SIGKILL alone loses nothing a process wrote: its writes sit in the kernel's page cache, and the
next process reads them whether or not they were fsynced. A power loss is what throws unsynced
writes away, and a test cannot cut the power of its own machine. ``UndoJournalBlockDevice``
(the broker mode ``wal-undo-journal``, ``--broken wal-undo-journal``) makes that loss
reproducible for a file:
before each write it appends to a journal beside the file (``<wal>.undo``) the position and the
bytes the write is about to overwrite, with a CRC; after each ``sync`` it truncates the journal.
The journal itself is written with plain writes and never fsynced, which is enough: it must
survive only a process kill, never a power loss. So at any instant the journal lists, oldest
first, exactly the writes since the last completed sync, each with the bytes it replaced. (A kill
between the fdatasync and the truncation leaves the last synced group journaled; its sync call
never returned, so nothing it covered was acknowledged, and losing it is a crash the disk could
have produced.) A journal entry cut short by the kill belongs to a write that was never issued,
since the write follows its entry: reading stops at the first entry that does not check.

``lose_unsynced_tail(wal_path, rng)`` runs after the process is dead and before it is started
again. It applies the same model as ``MemoryBlockDevice.crash``: undoing every journaled write,
newest first, gives the durable image and each write's own bytes; then, oldest first, each
sector a write covered is set to that write's bytes with probability ``keep_probability`` and
left as it was otherwise. Sectors are aligned to the file (``sector_bytes``, 512 by default),
as a disk's logical blocks are. Some sectors of an unsynced write may have reached the disk and
others not, in any combination, and a later write's sector may survive where an earlier one's
did not; a synced write is never touched. The journal is then removed. A device opened on a
file truncates any journal it finds: an earlier process that was killed without a tail loss left
writes that, as far as the test is concerned, reached the disk.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from crc32c import crc32c

from automq_ref.io.storage.block_device import BlockDevice, Buffer, FileBlockDevice

UNDO_JOURNAL_SUFFIX: Final = ".undo"
# An entry: position, length, CRC-32C of (position, length, old bytes); then the old bytes.
_UNDO_ENTRY = struct.Struct(">QII")
_UNDO_POSITION_LENGTH = struct.Struct(">QI")


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


def undo_journal_path(wal_path: Path | str) -> Path:
    """Where ``UndoJournalBlockDevice`` keeps the journal of a WAL file: ``<wal>.undo``."""
    path = Path(wal_path)
    return path.with_name(path.name + UNDO_JOURNAL_SUFFIX)


class UndoJournalBlockDevice:
    """A device that journals the bytes each write overwrites until the next sync.

    Test only (see the module docstring): it makes ``lose_unsynced_tail`` possible after a kill.
    The journal goes to ``journal_path``, by default ``<file>.undo`` beside a ``FileBlockDevice``.
    """

    def __init__(self, device: BlockDevice, journal_path: Path | None = None) -> None:
        self._device = device
        if journal_path is None:
            if not isinstance(device, FileBlockDevice):
                raise TypeError("an undo journal for a device that is not a file needs a path")
            journal_path = undo_journal_path(device.path)
        self.journal_path = journal_path
        # O_TRUNC: whatever an earlier process left unsynced survived its crash.
        self._journal_fd = os.open(
            self.journal_path,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
            0o644,
        )
        self.journaled_writes = 0

    @property
    def size_bytes(self) -> int:
        return self._device.size_bytes

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        length = sum(memoryview(buffer).nbytes for buffer in buffers)
        if length == 0:
            return
        old = self._device.read(length, position)
        _write_all(self._journal_fd, _encode_undo_entry(position, old))
        self.journaled_writes += 1
        self._device.write(buffers, position)

    def read(self, size: int, position: int) -> bytes:
        return self._device.read(size, position)

    def sync(self) -> None:
        self._device.sync()
        os.ftruncate(self._journal_fd, 0)
        self.journaled_writes = 0

    def close(self) -> None:
        self._device.close()
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = -1


def read_undo_journal(journal_path: Path) -> list[tuple[int, bytes]]:
    """The journaled writes, oldest first, as (position, bytes before the write); an entry cut
    short or damaged ends the list (its write was never issued)."""
    data = journal_path.read_bytes()
    entries: list[tuple[int, bytes]] = []
    at = 0
    while at + _UNDO_ENTRY.size <= len(data):
        position, length, stored_crc = _UNDO_ENTRY.unpack_from(data, at)
        start = at + _UNDO_ENTRY.size
        old = data[start : start + length]
        if len(old) < length or crc32c(_UNDO_POSITION_LENGTH.pack(position, length) + old) != (
            stored_crc
        ):
            break
        entries.append((position, old))
        at = start + length
    return entries


def lose_unsynced_tail(
    wal_path: Path | str,
    rng: random.Random,
    *,
    keep_probability: float = 0.5,
    sector_bytes: int = 512,
) -> dict[str, int]:
    """After a kill: undo a random subset of the sectors of every write since the last sync.

    Run it only while no process has the WAL open. Returns the number of journaled ``writes``,
    the ``sectors`` they covered, and how many of those (``sectors_reverted``, ``bytes_reverted``)
    went back to their contents before the writes. Without a journal it changes nothing.
    """
    journal = undo_journal_path(wal_path)
    counts = {"writes": 0, "sectors": 0, "sectors_reverted": 0, "bytes_reverted": 0}
    if not journal.exists():
        return counts
    entries = read_undo_journal(journal)
    fd = os.open(wal_path, os.O_RDWR | os.O_CLOEXEC)
    try:
        # Newest first: undo every write, keeping its own bytes; the file is then durable.
        written: list[bytes] = []
        for position, old in reversed(entries):
            written.append(_pread_exact(fd, len(old), position))
            _pwrite_all(fd, old, position)
        written.reverse()
        # Oldest first: an arbitrary subset of each write's sectors reached the disk.
        for (position, old), new in zip(entries, written, strict=True):
            for start, end in _sectors(position, len(old), sector_bytes):
                counts["sectors"] += 1
                if rng.random() < keep_probability:
                    _pwrite_all(fd, new[start - position : end - position], start)
                else:
                    counts["sectors_reverted"] += 1
                    counts["bytes_reverted"] += end - start
    finally:
        os.close(fd)
    counts["writes"] = len(entries)
    journal.unlink()
    return counts


def _encode_undo_entry(position: int, old: bytes) -> bytes:
    head = _UNDO_POSITION_LENGTH.pack(position, len(old))
    return _UNDO_ENTRY.pack(position, len(old), crc32c(head + old)) + old


def _sectors(position: int, length: int, sector_bytes: int) -> Iterator[tuple[int, int]]:
    """The file-aligned sectors ``[position, position + length)`` touches, clipped to it."""
    end = position + length
    start = position
    while start < end:
        boundary = (start // sector_bytes + 1) * sector_bytes
        yield start, min(boundary, end)
        start = boundary


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pwrite_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _pread_exact(fd: int, size: int, position: int) -> bytes:
    data = os.pread(fd, size, position)
    return data + bytes(size - len(data))
