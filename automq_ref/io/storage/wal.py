"""The write-ahead log interface every WAL implements, with the values and errors they share.

S3Storage writes each StreamRecordBatch to a WAL before it answers the producer, and replays the
WAL after a crash. Two WALs implement :class:`WriteAheadLog`: the block WAL on a file or a device
(:mod:`automq_ref.io.storage.wal_block`) and the object WAL over an object store
(:mod:`automq_ref.io.storage.wal_object`); the node picks one from ``s3.wal.path`` and S3Storage
never learns which.

The contract, identical for both:

- Open (each WAL has its own ``open``), then iterate :meth:`~WriteAheadLog.recover` once, then
  :meth:`~WriteAheadLog.reset` (which discards everything recovery could return), then append.
- :meth:`~WriteAheadLog.submit` queues one record at once, in submission order, and returns a
  future that completes with the record's :class:`AppendResult` once the record is durable (and,
  on the object WAL, once this writer's reservation was verified after it landed). It raises at
  once when the record cannot be queued (:class:`WalOverCapacityError`,
  :class:`WalRecordTooLargeError`, or the WAL's state). Offsets are opaque, grow with submission
  order, and are not contiguous: each WAL leaves gaps of its own (padding, alignment).
- Futures complete in submission order; after one fails, no later one succeeds.
- :meth:`~WriteAheadLog.trim` takes the ``next_offset`` of an acknowledged or recovered record
  and declares every record ending at or before it dead, durably, before it returns.
- :class:`WalFencedError`: the WAL belongs to another writer now (a newer epoch of the node, or
  a survivor that took it over). A fenced WAL acknowledges nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from automq_ref.io.metrics import S3_STORAGE, BrokerMetrics

Buffer: TypeAlias = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class AppendResult:
    record_offset: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class RecoveredRecord:
    record_offset: int
    next_offset: int
    body: bytes


class WalError(Exception):
    """Base class of the WALs' errors."""


class WalOverCapacityError(WalError):
    """No room for this record until the WAL is trimmed (block WAL) or its uploads land
    (object WAL)."""


class WalRecordTooLargeError(WalError, ValueError):
    """A single record larger than one write may be."""


class WalStateError(WalError):
    """An operation out of order (append before reset, reset before recover, use after close)."""


class WalFencedError(WalError):
    """The WAL belongs to another node, or to a newer epoch of this one, or was taken over."""


class WalIOError(WalError):
    """The device or the store failed; the WAL accepts nothing more until it is reopened and
    recovered."""


class WriteAheadLog(Protocol):
    """What S3Storage needs of a WAL; see the module docstring for the contract."""

    @property
    def confirm_offset(self) -> int:
        """Every record that ends at or before this offset is durable (and acknowledged)."""
        ...

    @property
    def max_record_bytes(self) -> int:
        """The largest body one record may carry."""
        ...

    def recover(self) -> AsyncIterator[RecoveredRecord]:
        """Every record that survived, in offset order; once, before :meth:`reset`."""
        ...

    async def reset(self) -> None:
        """Discard everything recovery could return; appends are accepted afterwards."""
        ...

    def submit(self, body: Buffer) -> asyncio.Future[AppendResult]:
        """Queue one record; the future completes once it is durable."""
        ...

    async def append(self, body: Buffer) -> AppendResult:
        """:meth:`submit` and wait."""
        ...

    async def trim(self, offset: int) -> None:
        """Declare every record ending at or before ``offset`` dead, durably."""
        ...

    async def close(self) -> None:
        """Finish queued appends and release the WAL."""
        ...


class MeasuredWal:
    """``wal`` as it is, each append timed into ``metrics`` until it is durable
    (``kafka_stream_operation_latency{operation_type="S3Storage", operation_name="append"}``,
    AutoMQ's name for a WAL append) and its bytes counted (``kafka_stream_wal_append_size``)."""

    def __init__(self, wal: WriteAheadLog, metrics: BrokerMetrics) -> None:
        self.wal = wal
        self._metrics = metrics

    @property
    def confirm_offset(self) -> int:
        return self.wal.confirm_offset

    @property
    def max_record_bytes(self) -> int:
        return self.wal.max_record_bytes

    def recover(self) -> AsyncIterator[RecoveredRecord]:
        return self.wal.recover()

    async def reset(self) -> None:
        await self.wal.reset()

    def submit(self, body: Buffer) -> asyncio.Future[AppendResult]:
        metrics, began = self._metrics, time.perf_counter()
        durable = self.wal.submit(body)
        metrics.wal_appended.inc(memoryview(body).nbytes)

        def done(future: asyncio.Future[AppendResult]) -> None:
            ok = not future.cancelled() and future.exception() is None
            metrics.operation(S3_STORAGE, "append", ok, time.perf_counter() - began)

        durable.add_done_callback(done)
        return durable

    async def append(self, body: Buffer) -> AppendResult:
        return await self.submit(body)

    async def trim(self, offset: int) -> None:
        await self.wal.trim(offset)

    async def close(self) -> None:
        await self.wal.close()
