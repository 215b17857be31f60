"""What the block WAL needs from a disk: positioned writes, positioned reads, and a barrier.

``FileBlockDevice`` is a regular file (or a raw block device) through the page cache, opened with
``os.open`` and made durable with ``fdatasync``. ``DirectBlockDevice`` is a raw block device
opened with ``O_DIRECT``, as AutoMQ's Delta WAL drives its disk: the page cache is bypassed, so
every write goes from a 4 KiB-aligned buffer (anonymous ``mmap`` memory, page-aligned) to a
4 KiB-aligned position in whole 4 KiB blocks. ``open_device`` picks between them by what the
path is: a block device gets ``O_DIRECT``, anything else is a preallocated file. The calls
block, so the WAL runs them on a thread of its own. ``automq_ref.checker.faults`` (test code,
never imported here) holds an in-memory device that can lose power at any operation.

A device may also refuse a command because of a reservation (NVMe's "Reservation Conflict"):
the WAL device process (:mod:`automq_ref.io.storage.wal_device`) refuses writes and flushes from
a registrant that lost the reservation, with :class:`ReservationConflictError`, which the WAL
turns into its fenced error.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# Linux refuses more than IOV_MAX (1024) buffers in one pwritev.
IOV_MAX = 1024

Buffer = bytes | bytearray | memoryview

# O_DIRECT transfers: buffer address, file position and length all multiples of this.
DIRECT_ALIGN_BYTES = 4096


class ReservationConflictError(OSError):
    """The device refused a command: this host does not hold the device's reservation (it was
    preempted by another registrant, or never acquired it). Reads stay allowed."""


class BlockDevice(Protocol):
    @property
    def size_bytes(self) -> int: ...

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        """Write the concatenation of ``buffers`` at ``position`` (not yet durable)."""

    def read(self, size: int, position: int) -> bytes:
        """Read ``size`` bytes at ``position``; bytes past the end read as zeros."""

    def sync(self) -> None:
        """Make every completed write durable."""

    def close(self) -> None: ...


class FileBlockDevice:
    """A file (preallocated to ``size_bytes``) or a raw device (its own size)."""

    def __init__(self, path: Path | str, size_bytes: int) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            mode = os.fstat(self._fd).st_mode
            if stat.S_ISBLK(mode):
                device_bytes = os.lseek(self._fd, 0, os.SEEK_END)
                if device_bytes < size_bytes:
                    raise ValueError(
                        f"{self.path} holds {device_bytes} bytes, fewer than the "
                        f"{size_bytes} asked for"
                    )
            elif os.fstat(self._fd).st_size < size_bytes:
                # Allocate every block now so a later append never waits on block
                # allocation and an fdatasync never has file-size metadata to flush.
                os.posix_fallocate(self._fd, 0, size_bytes)
                os.fsync(self._fd)
        except BaseException:
            os.close(self._fd)
            raise
        self._size_bytes = size_bytes

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        pending = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
        while pending:
            chunk = pending[:IOV_MAX]
            written = os.pwritev(self._fd, chunk, position)
            position += written
            # A short write leaves a suffix of the chunk: drop what went out, keep the rest.
            while written and pending:
                head = pending[0]
                if written >= len(head):
                    written -= len(head)
                    pending.pop(0)
                else:
                    pending[0] = head[written:]
                    written = 0

    def read(self, size: int, position: int) -> bytes:
        data = os.pread(self._fd, size, position)
        if len(data) < size:
            data += bytes(size - len(data))
        return data

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def is_block_device(path: Path | str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def open_device(path: Path | str, size_bytes: int) -> FileBlockDevice | DirectBlockDevice:
    """A raw block device opened with ``O_DIRECT``, or a file (created and preallocated)."""
    if is_block_device(path):
        return DirectBlockDevice(path, size_bytes)
    return FileBlockDevice(path, size_bytes)


def _align_up(value: int) -> int:
    return -(-value // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES


class DirectBlockDevice:
    """A raw block device (or a file on a file system that supports it) with ``O_DIRECT``.

    ``O_DIRECT`` needs aligned transfers, so a write starts at a 4 KiB boundary and is copied
    into an aligned buffer; the rest of its last 4 KiB block is written as zeros. The block WAL
    only ever writes there what it treats as dead space (the body of a padding record, the rest
    of a header slot), so the zeros change nothing it reads back. Reads at any position are
    widened to whole blocks and cut back. The buffers are anonymous ``mmap`` memory, which is
    page-aligned, kept and grown as needed; ``fdatasync`` remains the barrier (it flushes the
    disk's own write cache)."""

    def __init__(self, path: Path | str, size_bytes: int) -> None:
        self.path = Path(path)
        direct: int | None = getattr(os, "O_DIRECT", None)
        if direct is None:
            raise OSError(f"{self.path}: this platform has no O_DIRECT")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | direct)
        try:
            mode = os.fstat(self._fd).st_mode
            if stat.S_ISBLK(mode):
                device_bytes = os.lseek(self._fd, 0, os.SEEK_END)
            else:
                if os.fstat(self._fd).st_size < size_bytes:
                    os.posix_fallocate(self._fd, 0, size_bytes)
                    os.fsync(self._fd)
                device_bytes = os.fstat(self._fd).st_size
            if device_bytes < size_bytes:
                raise ValueError(
                    f"{self.path} holds {device_bytes} bytes, fewer than the {size_bytes} asked for"
                )
        except BaseException:
            os.close(self._fd)
            raise
        self._size_bytes = size_bytes
        self._write_buffer = mmap.mmap(-1, DIRECT_ALIGN_BYTES)
        self._read_buffer = mmap.mmap(-1, DIRECT_ALIGN_BYTES)
        # One transfer at a time per buffer: the WAL uses one thread, but opening reads first.
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def write(self, buffers: Sequence[Buffer], position: int) -> None:
        if position % DIRECT_ALIGN_BYTES:
            raise ValueError(f"O_DIRECT write at {position}, not a multiple of 4096")
        total = sum(len(buffer) for buffer in buffers)
        padded = _align_up(total)
        if position + padded > self._size_bytes:
            raise OSError(f"write of {padded} bytes at {position} beyond device end")
        with self._lock:
            if len(self._write_buffer) < padded:
                self._write_buffer.close()
                self._write_buffer = mmap.mmap(-1, padded)
            view = memoryview(self._write_buffer)
            try:
                cursor = 0
                for buffer in buffers:
                    size = len(buffer)
                    view[cursor : cursor + size] = memoryview(buffer).cast("B")
                    cursor += size
                view[total:padded] = bytes(padded - total)
                done = 0
                while done < padded:
                    done += os.pwrite(self._fd, view[done:padded], position + done)
            finally:
                view.release()

    def read(self, size: int, position: int) -> bytes:
        start = position - position % DIRECT_ALIGN_BYTES
        end = min(_align_up(position + size), _align_up(self._size_bytes))
        length = max(0, end - start)
        with self._lock:
            if len(self._read_buffer) < length:
                self._read_buffer.close()
                self._read_buffer = mmap.mmap(-1, length)
            view = memoryview(self._read_buffer)
            try:
                got = 0
                while got < length:
                    count = os.preadv(self._fd, [view[got:length]], start + got)
                    if count == 0:
                        break
                    got += count
                data = bytes(view[position - start : min(got, position - start + size)])
            finally:
                view.release()
        if len(data) < size:
            data += bytes(size - len(data))
        return data

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._write_buffer.close()
            self._read_buffer.close()
