"""What the block WAL needs from a disk: positioned writes, positioned reads, and a barrier.

``FileBlockDevice`` is a regular file or a raw block device opened with ``os.open``. Its calls
block, so the WAL runs them on a thread of its own. ``automq_ref.checker.faults`` (test code,
never imported here) holds an in-memory device that can lose power at any operation.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# Linux refuses more than IOV_MAX (1024) buffers in one pwritev.
IOV_MAX = 1024

Buffer = bytes | bytearray | memoryview


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
