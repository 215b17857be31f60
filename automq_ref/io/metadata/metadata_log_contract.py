"""The metadata log's contract: the :class:`MetadataLog` interface, its errors and values.

The controller's metadata log: an ordered, durable log of opaque records, plus one snapshot.

Interface contract
------------------
:class:`MetadataLog` is what the controller and the brokers see; the embedded implementation
here is :class:`FileMetadataLog` (one controller process), and an etcd-backed one implements the
same contract for a quorum.

* Records are opaque ``bytes`` at consecutive indexes ``0, 1, 2, ...``. ``next_index`` is the
  index the next record gets; ``first_index`` is the lowest index still readable (the snapshot
  index once a snapshot is installed, else 0).
* ``append(records, expected_next_index=n)`` is a compare-and-append: it succeeds only if the
  log's next index is ``n`` (else :class:`LogIndexConflict`, carrying the actual next index, as
  an etcd transaction guarded on the next-index key would fail), writes every record of the
  batch or none of them, also across crashes, and returns only once the batch is durable. It
  returns the new next index. An empty batch writes nothing but is still checked.
* ``read(from_index, max_records)`` returns acknowledged records in index order. Below
  ``first_index`` it raises :class:`LogTruncated` (carrying the snapshot index): the caller
  must load the snapshot first. At or beyond ``next_index`` it returns ``[]``.
* ``install_snapshot(index, payload)`` durably stores a snapshot that covers every record below
  ``index`` (``first_index <= index <= next_index``) and truncates those records. ``snapshot()``
  returns the newest one, or None.
* ``wait_for(index)`` returns once the record at ``index`` exists (``next_index > index``), so
  a broker replaying the log can follow it; it raises :class:`MetadataLogClosed` on close.
* :func:`read_log_directory` reads a directory read-only (no lock, nothing written or cut),
  for tools that look at the log of a running controller; a batch that does not check at the
  end is taken for an append in flight and ends the read.
* An append or snapshot that fails with an I/O error raises :class:`MetadataLogError` with the
  cause chained. Its outcome is unknown (after a reopen the batch is there entirely or not at
  all), and the log refuses further writes until it is reopened: after a failed ``fsync`` the
  kernel may have dropped the dirty pages, so nothing written later could be trusted to land
  after them.

The embedded implementation is ``file_metadata_log.py``; its on-disk format is
``metadata_log_format.py``, and ``metadata_log_reader.py`` reads a log directory read-only.
``metadata_log.py`` re-exports all of them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

# --------------------------------------------------------------------------- errors


class MetadataLogError(Exception):
    """Base class of the metadata log's errors; I/O failures arrive as this, cause chained."""


class LogIndexConflict(MetadataLogError):
    """``append`` expected another next index: someone else appended first."""

    def __init__(self, expected_next_index: int, next_index: int) -> None:
        super().__init__(
            f"append expected next index {expected_next_index}, the log's next index is "
            f"{next_index}"
        )
        self.expected_next_index = expected_next_index
        self.next_index = next_index


class LogTruncated(MetadataLogError):
    """The records asked for are below the snapshot: read the snapshot first."""

    def __init__(self, from_index: int, snapshot_index: int) -> None:
        super().__init__(
            f"records below {snapshot_index} are truncated by a snapshot; read from {from_index}"
        )
        self.from_index = from_index
        self.snapshot_index = snapshot_index


class MetadataLogCorrupt(MetadataLogError):
    """A file holds bytes that no crash can explain; nothing is dropped silently."""

    def __init__(self, path: Path, offset: int | None, reason: str) -> None:
        where = f"{path}" if offset is None else f"{path} at offset {offset}"
        super().__init__(f"metadata log corrupt: {where}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class MetadataLogLocked(MetadataLogError):
    """Another process (or another open log in this one) writes this directory."""

    def __init__(self, directory: Path, holder: str) -> None:
        super().__init__(f"metadata log {directory} is locked by another writer ({holder})")
        self.directory = directory


class MetadataLogClosed(MetadataLogError):
    """The log is not open (not yet, or closed)."""


# ---------------------------------------------------------------------- data types


@dataclass(frozen=True, slots=True)
class LogEntry:
    index: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    index: int  # records it covers: the next index after it
    payload: bytes


# ----------------------------------------------------------------------- interface


class MetadataLog(abc.ABC):
    """An ordered, durable, compare-and-append record log with one snapshot (see the module)."""

    @property
    @abc.abstractmethod
    def next_index(self) -> int:
        """The index the next appended record gets; every record below it is durable."""

    @property
    @abc.abstractmethod
    def first_index(self) -> int:
        """The lowest readable index: the snapshot index, or 0 without a snapshot."""

    @abc.abstractmethod
    async def append(self, records: Sequence[bytes], *, expected_next_index: int) -> int:
        """Append ``records`` atomically at ``expected_next_index``; return the new next index."""

    @abc.abstractmethod
    async def read(self, from_index: int, max_records: int | None = None) -> list[LogEntry]:
        """Records from ``from_index`` on, at most ``max_records`` of them."""

    @abc.abstractmethod
    async def snapshot(self) -> Snapshot | None:
        """The newest snapshot, or None."""

    @abc.abstractmethod
    async def install_snapshot(self, index: int, payload: bytes) -> None:
        """Store a snapshot covering the records below ``index`` and truncate them."""

    @abc.abstractmethod
    async def wait_for(self, index: int) -> int:
        """Return ``next_index`` once the record at ``index`` exists."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the log; idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
