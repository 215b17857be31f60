"""The block WAL: AutoMQ's "Delta WAL" on a file or a raw device.

Theory of operation
-------------------
The device holds two 4 KiB header slots (physical 0 and 4096) and then a ring of
``capacity - 8 KiB`` bytes. Positions in the WAL are *logical* offsets that only grow; the byte
at logical offset ``x`` lives at physical ``8192 + x mod ring_capacity``. Every record carries its
own logical offset (the WAL record header's ``body_offset``), so a record left over from an
earlier lap of the ring is told apart from a current one even though both are intact.

Appends are group-committed. ``append`` queues the body and waits; one writer task takes every
queued body, lays the group out contiguously from the current tail (a 4 KiB-aligned offset),
writes it with one ``pwritev`` and makes it durable with one ``fdatasync``, and only then
completes the futures of that group. While one group is on disk the next one gathers, so the
more writers there are, the more records share a sync.

Every byte between the recovery start and the tail is covered by a record: after a group's last
record, a *padding record* (a header only; its body is never written nor read) runs to the next
4 KiB boundary, and a group that would not fit before the end of the ring is preceded by a
padding record that runs to the end of the lap. Recovery therefore needs no guessing: it walks
record after record from the start offset in the header and stops at the first one that does not
check (bad header CRC, wrong body offset, bad body CRC, or a length that leaves the window).
Since groups are written one after another and each is synced before the next is written, a
crash can tear only the last group, and the walk returns every acknowledged record followed by
whatever prefix of the unacknowledged group reached the disk intact.

``trim(offset)`` declares the records that end at or before ``offset`` dead and persists the new
start in the header. Space is reused only up to the durable start: a write may land at logical
``[p, p + n)`` only if ``p + n - start <= ring_capacity``, otherwise the append fails with
:class:`WalOverCapacityError`.

``recover()`` must run before ``reset()``, and ``reset()`` before the first append. ``reset``
discards whatever recovery found by moving the start a whole ring forward (aligned): every byte
on the device then belongs to an older logical offset than any the WAL will write next, so none of
it can ever pass the body-offset check again. That bound holds when the header read is the newest
durable one. When the other slot holds something unreadable (a torn header write, or a newer
header lost to corruption), ``reset`` does not trust the header: it reads the record header at
every 4 KiB boundary of the ring and starts past the highest group it finds.

Headers are written alternately into the two slots and synced; on open the valid slot with the
higher sequence number wins, so a torn header write falls back to the previous header. If a
durable header is later corrupted, the older one's start is used: recovery may then return
records that were trimmed (or discarded by a reset) since, each one intact and at its own
offset, but never a record that was not written there.

Differences from AutoMQ's implementation: a single writer with one group in flight instead of a
sliding window of concurrent block writes (so a crash cannot leave holes, and recovery can stop
at the first invalid record instead of scanning a window beyond it); explicit padding records
instead of "jump to the next 4 KiB boundary on failure"; a header sequence number instead of a
wall-clock timestamp; buffered I/O plus ``fdatasync`` on a file (a raw block device gets direct
I/O, as AutoMQ's does); CRC-32C.

Failover: on a WAL device process (:mod:`automq_ref.io.storage.wal_device`, NVMe-like
reservations over a local socket), :meth:`BlockWal.open_remote` registers (node, epoch) and
takes the device's reservation, and :meth:`BlockWal.take_over` does it in failover mode for a
survivor, preempting the failed node's registration: from then on the device refuses the old
writer's writes and flushes, and the WAL that gets such a refusal is *fenced*
(:class:`WalFencedError` for that group, every queued append and everything after), so a zombie
acknowledges nothing it writes once taken over.

Two seams let a caller change how the WAL meets its disk without the WAL knowing why (the
checker's broken modes and crash recorders use them; they live in ``automq_ref.checker``, and
nothing here imports them). ``wrap_device`` (``open_file``) wraps the file's
:class:`FileBlockDevice` in another :class:`BlockDevice`. ``sync_policy`` is asked, on the I/O
thread after each group is written, whether to defer that group's fdatasync; a deferred group is
acknowledged unsynced, which breaks durability and is therefore never done without one. The
default (``None``) syncs every group, with no call on the hot path.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import struct
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol, TypeVar

from crc32c import crc32c

from automq_ref.formats.errors import FormatError
from automq_ref.formats.wal_record import (
    RECORD_MAGIC_PADDING,
    WAL_RECORD_HEADER_SIZE,
    WalRecordHeader,
    check_wal_record_body,
    decode_wal_record_header,
    encode_padding_header,
    encode_wal_record_header,
)
from automq_ref.io.storage.block_device import (
    BlockDevice,
    Buffer,
    ReservationConflictError,
    open_device,
)

# The values and errors every WAL shares, re-exported for the block WAL's callers.
from automq_ref.io.storage.wal import AppendResult as AppendResult
from automq_ref.io.storage.wal import RecoveredRecord as RecoveredRecord
from automq_ref.io.storage.wal import WalError as WalError
from automq_ref.io.storage.wal import WalFencedError as WalFencedError
from automq_ref.io.storage.wal import WalIOError as WalIOError
from automq_ref.io.storage.wal import WalOverCapacityError as WalOverCapacityError
from automq_ref.io.storage.wal import WalRecordTooLargeError as WalRecordTooLargeError
from automq_ref.io.storage.wal import WalStateError as WalStateError
from automq_ref.io.storage.wal_device import RegistrantKey, RemoteBlockDevice, claim

log = logging.getLogger(__name__)

BLOCK_SIZE_BYTES: Final = 4096
HEADER_SLOT_BYTES: Final = 4096
HEADER_SLOT_COUNT: Final = 2
RING_START_BYTES: Final = HEADER_SLOT_BYTES * HEADER_SLOT_COUNT
DEFAULT_CAPACITY_BYTES: Final = 2 * 1024 * 1024 * 1024
DEFAULT_MAX_WRITE_BYTES: Final = 4 * 1024 * 1024
# Each record takes two iovecs (header, body); keep a group inside one pwritev.
MAX_RECORDS_PER_WRITE: Final = 500
# Groups handed to the I/O thread and not yet durable: one on disk, one queued behind it.
MAX_GROUPS_IN_FLIGHT: Final = 2
RECOVERY_READ_BYTES: Final = 4 * 1024 * 1024

WAL_HEADER_MAGIC: Final = 0x12345678
_WAL_HEADER = struct.Struct(">iqqqqiiq")
_CRC = struct.Struct(">I")
WAL_HEADER_SIZE: Final = _WAL_HEADER.size + _CRC.size


class ShutdownType(enum.IntEnum):
    UNCLEAN = 0
    GRACEFUL = 1


class WalHeaderCorruptError(WalError):
    """Neither header slot holds a valid header, and the device is not blank."""


@dataclass(frozen=True, slots=True)
class WalHeader:
    capacity_bytes: int
    start_offset: int
    sequence: int
    max_write_bytes: int
    shutdown_type: ShutdownType
    node_id: int
    node_epoch: int

    def encode(self) -> bytes:
        body = _WAL_HEADER.pack(
            WAL_HEADER_MAGIC,
            self.capacity_bytes,
            self.start_offset,
            self.sequence,
            self.max_write_bytes,
            int(self.shutdown_type),
            self.node_id,
            self.node_epoch,
        )
        return body + _CRC.pack(crc32c(body))

    @classmethod
    def decode(cls, data: bytes) -> WalHeader | None:
        """The header in ``data``, or None if it does not check."""
        if len(data) < WAL_HEADER_SIZE:
            return None
        (stored_crc,) = _CRC.unpack_from(data, _WAL_HEADER.size)
        if crc32c(memoryview(data)[: _WAL_HEADER.size]) != stored_crc:
            return None
        magic, capacity, start, sequence, max_write, shutdown, node_id, node_epoch = (
            _WAL_HEADER.unpack_from(data, 0)
        )
        if magic != WAL_HEADER_MAGIC or shutdown not in (0, 1) or capacity <= RING_START_BYTES:
            return None
        return cls(
            capacity, start, sequence, max_write, ShutdownType(shutdown), node_id, node_epoch
        )


class SyncPolicy(Protocol):
    """When the WAL may skip the fdatasync after a group. Both calls run on the WAL's I/O thread.

    Without a policy every group is synced before it is acknowledged, the WAL's guarantee; a
    policy that defers a sync gives that guarantee up, so only the checker's broken modes do.
    """

    def defer_sync(self) -> bool:
        """After a group's writes: True acknowledges the group without syncing it (a later
        group's or header's sync covers it)."""
        ...

    def synced(self) -> None:
        """After every sync of the device, a group's or a header's."""
        ...


def align_up(value: int, alignment: int = BLOCK_SIZE_BYTES) -> int:
    return -(-value // alignment) * alignment


class _State(enum.Enum):
    OPENED = "opened"  # header read; recover() not run yet
    RECOVERING = "recovering"  # recover() started; reset() allowed
    READY = "ready"  # appends accepted
    FAILED = "failed"  # device error: reopen and recover
    FENCED = "fenced"  # the device refused a write: another registrant holds the WAL
    CLOSED = "closed"


_T = TypeVar("_T")


@dataclass(slots=True)
class _Pending:
    body: Buffer
    future: asyncio.Future[AppendResult]


class BlockWal:
    """A write-ahead log on a :class:`BlockDevice`. Open with :meth:`open` or :meth:`open_file`."""

    def __init__(
        self,
        device: BlockDevice,
        header: WalHeader,
        *,
        header_slot: int,
        fresh: bool,
        node_epoch: int,
        max_groups_in_flight: int = MAX_GROUPS_IN_FLIGHT,
        header_fallback: bool = False,
        sync_policy: SyncPolicy | None = None,
    ) -> None:
        self._header_fallback = header_fallback
        self._sync_policy = sync_policy
        if max_groups_in_flight < 1:
            raise ValueError("max_groups_in_flight must be at least 1")
        self._max_groups_in_flight = max_groups_in_flight
        self._device = device
        self._node_epoch = node_epoch
        self._header = header
        self._header_slot = header_slot
        self._fresh = fresh
        self._ring_bytes = header.capacity_bytes - RING_START_BYTES
        self._max_write_bytes = header.max_write_bytes
        self._max_record_bytes = (
            min(self._max_write_bytes, self._ring_bytes - 2 * BLOCK_SIZE_BYTES)
            - WAL_RECORD_HEADER_SIZE
        )
        # Durable start (what the header on disk says), tail where the next group goes, and the
        # end of the last durable group: the three offsets every decision below is made from.
        self._start_offset = header.start_offset
        self._next_offset = header.start_offset
        self._confirm_offset = header.start_offset
        self._pending: list[_Pending] = []
        # What the queued records may occupy once laid out: each as its own 4 KiB-aligned group.
        self._pending_span = 0
        self._state = _State.OPENED
        self._failure: BaseException | None = None
        self._device_failed = False  # set by the I/O thread itself, read before each write
        self._groups_in_flight = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="block-wal")
        self._wakeup: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self.sync_count = 0
        self.write_count = 0

    # ---------------------------------------------------------------- opening

    @classmethod
    async def open_file(
        cls,
        path: Path | str,
        *,
        node_id: int,
        node_epoch: int,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        max_groups_in_flight: int = MAX_GROUPS_IN_FLIGHT,
        wrap_device: Callable[[BlockDevice], BlockDevice] | None = None,
        sync_policy: SyncPolicy | None = None,
    ) -> BlockWal:
        """Open (creating and preallocating) a WAL file, or a raw block device with ``O_DIRECT``,
        the device wrapped by ``wrap_device`` and its syncs governed by ``sync_policy`` (both
        seams for the checker; None in production)."""
        capacity_bytes = capacity_bytes // BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES
        file_device = await asyncio.to_thread(open_device, path, capacity_bytes)
        device: BlockDevice = file_device
        try:
            if wrap_device is not None:
                device = wrap_device(file_device)
            return await cls.open(
                device,
                node_id=node_id,
                node_epoch=node_epoch,
                capacity_bytes=capacity_bytes,
                max_write_bytes=max_write_bytes,
                max_groups_in_flight=max_groups_in_flight,
                sync_policy=sync_policy,
            )
        except BaseException:
            device.close()
            raise

    @classmethod
    async def open_remote(
        cls,
        address: str,
        *,
        node_id: int,
        node_epoch: int,
        failover: bool = False,
        capacity_bytes: int | None = None,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        max_groups_in_flight: int = MAX_GROUPS_IN_FLIGHT,
    ) -> BlockWal:
        """Open the WAL a WAL device process serves at ``address`` (``HOST:PORT`` or a socket
        path): register (``node_id``, ``node_epoch``, ``failover``) and take the device's
        reservation (:func:`~automq_ref.io.storage.wal_device.claim`), then read the header as
        :meth:`open` does. Refused with :class:`WalFencedError` if a newer epoch of the node
        holds it, or a takeover of this very epoch."""
        try:
            device = await asyncio.to_thread(RemoteBlockDevice, address)
        except OSError as error:
            raise WalIOError(f"WAL device {address}: {error}") from error
        try:
            await asyncio.to_thread(claim, device, RegistrantKey(node_id, node_epoch, failover))
            return await cls.open(
                device,
                node_id=node_id,
                node_epoch=node_epoch,
                capacity_bytes=capacity_bytes,
                max_write_bytes=max_write_bytes,
                max_groups_in_flight=max_groups_in_flight,
            )
        except BaseException as error:
            await asyncio.to_thread(device.close)
            if isinstance(error, ReservationConflictError):
                raise WalFencedError(f"WAL device {address}: {error}") from error
            if isinstance(error, OSError):
                raise WalIOError(f"WAL device {address}: {error}") from error
            raise

    @classmethod
    async def take_over(
        cls,
        address: str,
        *,
        node_id: int,
        node_epoch: int,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
    ) -> BlockWal:
        """Open failed node ``node_id``'s WAL, last written at ``node_epoch``, on the WAL device
        at ``address``, in failover mode (as ``ObjectWal.take_over`` does on an object store).

        The failed node's registration is preempted (and its commands aborted): the device
        refuses every later write and flush of the old writer, should it still run, so it
        acknowledges nothing more; then the caller recovers the WAL (:meth:`recover`), uploads
        what it holds, and resets it. Refused with :class:`WalFencedError` if the node already
        runs a newer epoch."""
        return await cls.open_remote(
            address,
            node_id=node_id,
            node_epoch=node_epoch,
            failover=True,
            max_write_bytes=max_write_bytes,
        )

    @classmethod
    async def open(
        cls,
        device: BlockDevice,
        *,
        node_id: int,
        node_epoch: int,
        capacity_bytes: int | None = None,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        max_groups_in_flight: int = MAX_GROUPS_IN_FLIGHT,
        sync_policy: SyncPolicy | None = None,
    ) -> BlockWal:
        """Read the header (or format a blank device) and check who owns the WAL."""
        if max_write_bytes < BLOCK_SIZE_BYTES or max_write_bytes % BLOCK_SIZE_BYTES:
            raise ValueError(f"max_write_bytes {max_write_bytes} is not a multiple of 4096")
        slots = await asyncio.to_thread(device.read, HEADER_SLOT_BYTES * 2, 0)
        candidates = [
            (header, slot)
            for slot in range(HEADER_SLOT_COUNT)
            if (header := WalHeader.decode(slots[slot * HEADER_SLOT_BYTES :])) is not None
        ]
        if not candidates:
            if any(slots):
                raise WalHeaderCorruptError(
                    "neither WAL header slot is valid and the device is not blank; "
                    "refusing to format over unknown data"
                )
            capacity = capacity_bytes if capacity_bytes is not None else device.size_bytes
            capacity = min(capacity, device.size_bytes) // BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES
            if capacity - RING_START_BYTES < 2 * max_write_bytes:
                raise ValueError(
                    f"WAL capacity {capacity} leaves no room for two writes of {max_write_bytes}"
                )
            header = WalHeader(capacity, 0, 0, max_write_bytes, ShutdownType.UNCLEAN, node_id, 0)
            return cls(
                device,
                header,
                header_slot=1,
                fresh=True,
                node_epoch=node_epoch,
                max_groups_in_flight=max_groups_in_flight,
                sync_policy=sync_policy,
            )
        header, slot = max(candidates, key=lambda candidate: candidate[0].sequence)
        other_slot = slots[(1 - slot) * HEADER_SLOT_BYTES : (2 - slot) * HEADER_SLOT_BYTES]
        header_fallback = len(candidates) == 1 and any(other_slot)
        if header.node_id != node_id:
            raise WalFencedError(f"WAL belongs to node {header.node_id}, not node {node_id}")
        if header.node_epoch > node_epoch:
            raise WalFencedError(
                f"WAL was last opened by node {node_id} epoch {header.node_epoch}, "
                f"newer than epoch {node_epoch}"
            )
        if header.capacity_bytes > device.size_bytes:
            raise WalHeaderCorruptError(
                f"WAL header capacity {header.capacity_bytes} exceeds the device's "
                f"{device.size_bytes} bytes"
            )
        if header.max_write_bytes != max_write_bytes:
            # A smaller write cap on reopen must not make old records unreadable.
            max_write_bytes = max(max_write_bytes, header.max_write_bytes)
            header = replace(header, max_write_bytes=max_write_bytes)
        return cls(
            device,
            header,
            header_slot=slot,
            fresh=False,
            node_epoch=node_epoch,
            max_groups_in_flight=max_groups_in_flight,
            header_fallback=header_fallback,
            sync_policy=sync_policy,
        )

    # --------------------------------------------------------------- properties

    @property
    def header(self) -> WalHeader:
        return self._header

    @property
    def start_offset(self) -> int:
        """Durable start: records that end at or before it are trimmed."""
        return self._start_offset

    @property
    def confirm_offset(self) -> int:
        """Every record that ends at or before this offset is durable."""
        return self._confirm_offset

    @property
    def ring_capacity_bytes(self) -> int:
        return self._ring_bytes

    @property
    def fenced(self) -> bool:
        """The device refused a write or flush: another registrant holds the WAL now."""
        return self._state is _State.FENCED

    @property
    def max_record_bytes(self) -> int:
        return self._max_record_bytes

    # ---------------------------------------------------------------- recovery

    async def recover(self) -> AsyncIterator[RecoveredRecord]:
        """Yield every record from the start offset up to the first one that does not check."""
        if self._state is not _State.OPENED:
            raise WalStateError(f"recover() in state {self._state.value}")
        self._state = _State.RECOVERING
        if self._fresh:
            return
        position = self._start_offset
        limit = self._start_offset + self._ring_bytes
        reader = _RingReader(self, limit)
        while position + WAL_RECORD_HEADER_SIZE <= limit:
            header_bytes = await reader.read(position, WAL_RECORD_HEADER_SIZE)
            try:
                header = decode_wal_record_header(header_bytes, 0, position)
            except FormatError as error:
                log.debug("WAL recovery stops at %d: %s", position, error)
                break
            if not self._fits(position, header):
                log.debug("WAL recovery stops at %d: record length leaves the window", position)
                break
            if header.magic == RECORD_MAGIC_PADDING:
                position = header.next_record_offset
                continue
            body = await reader.read(position + WAL_RECORD_HEADER_SIZE, header.body_length)
            try:
                check_wal_record_body(header, body)
            except FormatError as error:
                log.debug("WAL recovery stops at %d: %s", position, error)
                break
            yield RecoveredRecord(position, header.next_record_offset, body)
            position = header.next_record_offset

    async def _highest_group_start(self) -> int:
        """The highest logical offset at which a group begins, from every 4 KiB boundary."""
        highest = 0
        for chunk_start in range(0, self._ring_bytes, RECOVERY_READ_BYTES):
            length = min(RECOVERY_READ_BYTES, self._ring_bytes - chunk_start)
            chunk = await self._run_io(self._device.read, length, RING_START_BYTES + chunk_start)
            for position in range(0, length, BLOCK_SIZE_BYTES):
                try:
                    header = decode_wal_record_header(chunk, position, None)
                except FormatError:
                    continue
                if header.record_offset % self._ring_bytes == chunk_start + position:
                    highest = max(highest, header.record_offset)
        return highest

    def _fits(self, position: int, header: WalRecordHeader) -> bool:
        """A record may neither leave the live window nor cross the end of the ring."""
        end = header.next_record_offset
        lap_end = position - position % self._ring_bytes + self._ring_bytes
        if end > self._start_offset + self._ring_bytes or end > lap_end:
            return False
        return header.magic == RECORD_MAGIC_PADDING or 0 < header.body_length <= (
            self._max_record_bytes
        )

    async def reset(self) -> None:
        """Discard everything recovery could find and start appending a whole ring further on."""
        if self._state is not _State.RECOVERING:
            raise WalStateError(f"reset() needs recover() first; state is {self._state.value}")
        # Everything on the device was written below start + ring when ``start`` is the newest
        # durable header's. If the other slot holds something unreadable, the header read may
        # be an older one (a torn write, or a newer header lost to corruption): then find the
        # highest group on the device instead of trusting the header.
        if self._fresh:
            new_start = 0
        else:
            floor = self._start_offset + self._ring_bytes
            if self._header_fallback:
                floor = max(floor, await self._highest_group_start() + self._max_write_bytes)
            new_start = align_up(floor + 2 * BLOCK_SIZE_BYTES)
        await self._write_header(start_offset=new_start, shutdown_type=ShutdownType.UNCLEAN)
        self._start_offset = self._next_offset = self._confirm_offset = new_start
        self._fresh = False
        self._state = _State.READY
        self._wakeup = asyncio.Event()
        self._writer = asyncio.create_task(self._run_writer(), name="block-wal-writer")

    # ------------------------------------------------------------------ append

    async def append(self, body: Buffer) -> AppendResult:
        """Write one record; return once it is durable (after the fsync that covers it)."""
        return await self.submit(body)

    def submit(self, body: Buffer) -> asyncio.Future[AppendResult]:
        """Queue one record now (records are written in submission order) and return the
        future that completes once it is durable. Raises at once if it cannot be queued."""
        if self._state is not _State.READY:
            raise self._not_ready("append")
        size = len(body)
        if size == 0:
            raise ValueError("a WAL record body must not be empty")
        if size > self._max_record_bytes:
            raise WalRecordTooLargeError(
                f"WAL record of {size} bytes exceeds the limit of {self._max_record_bytes}"
            )
        record_bytes = WAL_RECORD_HEADER_SIZE + size
        # Admit a record only if every queued record surely fits when laid out, whatever the
        # groups turn out to be: a record the writer could not place would have to fail after
        # later ones were admitted (a gap in its stream). Worst case: each record its own group
        # (grouping only saves padding), plus the padding to the end of the lap if the queue
        # may cross it (less than one group). An empty WAL admits anything laying out allows.
        worst = self._pending_span + _span(record_bytes)
        lap_end = self._next_offset - self._next_offset % self._ring_bytes + self._ring_bytes
        if self._next_offset + worst > lap_end:
            worst += min(lap_end - self._next_offset, self._max_write_bytes + BLOCK_SIZE_BYTES)
        used = self._next_offset + worst - self._start_offset
        empty = not self._pending and self._next_offset == self._start_offset
        if used > self._ring_bytes and not empty:
            raise WalOverCapacityError(
                f"WAL ring of {self._ring_bytes} bytes is full ({used} needed); trim it first"
            )
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(body, future))
        self._pending_span += _span(record_bytes)
        assert self._wakeup is not None
        self._wakeup.set()
        return future

    def _not_ready(self, operation: str) -> WalError:
        if self._state is _State.FENCED:
            error: WalError = WalFencedError(f"{operation}: {self._failure}")
            error.__cause__ = self._failure
            return error
        if self._state is _State.FAILED:
            error = WalIOError(f"{operation}: the WAL device failed; reopen and recover")
            error.__cause__ = self._failure
            return error
        return WalStateError(f"{operation}() in state {self._state.value}")

    async def _run_writer(self) -> None:
        """Lay out groups and hand them to the I/O thread, keeping a few in its queue.

        The I/O thread runs write + sync of one group after another, in submission order, so a
        group is written only after every earlier group is durable. Keeping the next group
        queued while one is on disk removes the gap between them, and the event loop computes
        the next group's CRCs while the thread waits on the disk.
        """
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            if self._state in (_State.FAILED, _State.FENCED):
                self._fail_pending([], self._failed_error())
            if self._pending and self._groups_in_flight < self._max_groups_in_flight:
                group = self._take_group()
                try:
                    writes, results = self._lay_out(group)
                except WalOverCapacityError as error:
                    self._fail_pending(group, error)
                    continue
                io = loop.run_in_executor(self._executor, self._write_and_sync, writes)
                self._groups_in_flight += 1
                io.add_done_callback(
                    functools.partial(self._on_group_synced, group, results, self._next_offset)
                )
                continue
            idle = not self._pending and not self._groups_in_flight
            if idle and self._state is not _State.READY:
                return
            self._wakeup.clear()
            await self._wakeup.wait()

    def _on_group_synced(
        self,
        group: list[_Pending],
        results: list[AppendResult],
        end_offset: int,
        io: asyncio.Future[None],
    ) -> None:
        self._groups_in_flight -= 1
        assert self._wakeup is not None
        self._wakeup.set()
        error = io.exception() if not io.cancelled() else asyncio.CancelledError()
        if self._state in (_State.FAILED, _State.FENCED):
            # An earlier group failed: this one may be on disk, but never acknowledged, since
            # recovery stops at the earlier group's damage and would not return it.
            self._fail_pending(group, self._failed_error())
        elif error is not None:
            self._fail(error, group)
        else:
            self._confirm_offset = end_offset
            for pending, result in zip(group, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)

    def _take_group(self) -> list[_Pending]:
        group: list[_Pending] = []
        group_bytes = 0
        for pending in self._pending:
            record_bytes = WAL_RECORD_HEADER_SIZE + len(pending.body)
            if group and (
                group_bytes + record_bytes > self._max_write_bytes
                or len(group) >= MAX_RECORDS_PER_WRITE
            ):
                break
            group.append(pending)
            group_bytes += record_bytes
        del self._pending[: len(group)]
        self._pending_span -= sum(
            _span(WAL_RECORD_HEADER_SIZE + len(pending.body)) for pending in group
        )
        return group

    def _lay_out(
        self, group: list[_Pending]
    ) -> tuple[list[tuple[int, list[Buffer]]], list[AppendResult]]:
        """Assign offsets to a group; return the device writes and each record's result."""
        start = self._next_offset
        data_bytes = sum(WAL_RECORD_HEADER_SIZE + len(pending.body) for pending in group)
        writes: list[tuple[int, list[Buffer]]] = []
        lap_end = start - start % self._ring_bytes + self._ring_bytes
        if start + _span(data_bytes) > lap_end:
            # The group does not fit before the end of the ring: pad to the end of this lap.
            writes.append((self._physical(start), [_padding_header(start, lap_end)]))
            start = lap_end
        span = _span(data_bytes)
        if start + span - self._start_offset > self._ring_bytes:
            raise WalOverCapacityError(
                f"WAL ring of {self._ring_bytes} bytes is full; trim it before appending"
            )
        buffers: list[Buffer] = []
        results: list[AppendResult] = []
        position = start
        for pending in group:
            buffers.append(encode_wal_record_header(pending.body, position))
            buffers.append(pending.body)
            next_position = position + WAL_RECORD_HEADER_SIZE + len(pending.body)
            results.append(AppendResult(position, next_position))
            position = next_position
        end = start + span
        if position != end:
            buffers.append(_padding_header(position, end))
        writes.append((self._physical(start), buffers))
        self._next_offset = end
        return writes, results

    def _physical(self, offset: int) -> int:
        return RING_START_BYTES + offset % self._ring_bytes

    def _write_and_sync(self, writes: list[tuple[int, list[Buffer]]]) -> None:
        """Runs on the I/O thread. After one failure it refuses every later group untouched."""
        if self._device_failed:
            raise WalIOError("an earlier WAL write failed")
        try:
            for physical, buffers in writes:
                self._device.write(buffers, physical)
                self.write_count += 1
            policy = self._sync_policy
            if policy is not None:
                if policy.defer_sync():
                    return
                self._device.sync()
                policy.synced()
            else:
                self._device.sync()
        except BaseException:
            self._device_failed = True
            raise
        self.sync_count += 1

    def _fail_pending(self, group: list[_Pending], error: BaseException) -> None:
        for pending in [*group, *self._pending]:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()
        self._pending_span = 0

    def _failed_error(self) -> WalError:
        if self._state is _State.FENCED:
            return self._not_ready("append")
        error = WalIOError(f"WAL write failed: {self._failure}")
        error.__cause__ = self._failure
        return error

    def _fail(self, error: BaseException, group: list[_Pending]) -> None:
        if isinstance(error, ReservationConflictError):
            log.error("block WAL fenced: the device refused a write: %s", error)
            self._state = _State.FENCED
        else:
            log.error("block WAL device failed: %s", error)
            self._state = _State.FAILED
        self._failure = error
        self._fail_pending(group, self._failed_error())

    # -------------------------------------------------------------------- trim

    async def trim(self, offset: int) -> None:
        """Declare every record that ends at or before ``offset`` dead, durably.

        ``offset`` must be a record boundary that is already durable: the ``next_offset`` of
        an acknowledged append or of a recovered record. Trimming backwards is a no-op.
        """
        if self._state is not _State.READY:
            raise self._not_ready("trim")
        if offset <= self._start_offset:
            return
        if offset > self._confirm_offset:
            raise ValueError(
                f"trim to {offset} beyond the durable end {self._confirm_offset} of the WAL"
            )
        if offset < self._confirm_offset:
            # A wrong boundary would make recovery stop early and lose records: check it.
            header_bytes = await self._run_io(
                self._device.read, WAL_RECORD_HEADER_SIZE, self._physical(offset)
            )
            try:
                decode_wal_record_header(header_bytes, 0, offset)
            except FormatError as error:
                raise ValueError(f"trim offset {offset} is not a WAL record boundary") from error
        await self._write_header(start_offset=offset, shutdown_type=ShutdownType.UNCLEAN)
        self._start_offset = max(self._start_offset, offset)

    # ------------------------------------------------------------------ header

    async def _write_header(self, *, start_offset: int, shutdown_type: ShutdownType) -> None:
        header = replace(
            self._header,
            node_epoch=self._node_epoch,
            start_offset=start_offset,
            sequence=self._header.sequence + 1,
            shutdown_type=shutdown_type,
        )
        slot = 1 - self._header_slot
        data = header.encode()
        try:
            await self._run_io(self._write_header_sync, data, slot * HEADER_SLOT_BYTES)
        except ReservationConflictError as conflict:
            if self._state is not _State.CLOSED:
                self._state = _State.FENCED
            self._failure = conflict
            raise WalFencedError(f"WAL header write refused: {conflict}") from conflict
        self._header = header
        self._header_slot = slot

    def _write_header_sync(self, data: bytes, physical: int) -> None:
        self._device.write([data], physical)
        self._device.sync()
        if self._sync_policy is not None:
            self._sync_policy.synced()

    async def _run_io(self, function: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    # ------------------------------------------------------------------- close

    async def close(self) -> None:
        """Finish queued appends, mark a graceful shutdown in the header, release the device.
        A WAL taken over meanwhile (the device refuses the header) just releases it."""
        if self._state is _State.CLOSED:
            return
        was_ready = self._state is _State.READY
        self._state = _State.CLOSED
        if self._writer is not None:
            assert self._wakeup is not None
            self._wakeup.set()
            await self._writer
        try:
            if was_ready:
                await self._write_header(
                    start_offset=self._start_offset, shutdown_type=ShutdownType.GRACEFUL
                )
        except WalFencedError as error:
            # Taken over: the new holder owns the header now; nothing of ours is pending.
            log.warning("block WAL close: %s", error)
        except OSError as error:
            raise WalIOError(f"WAL close could not write its header: {error}") from error
        finally:
            await self._run_io(self._device.close)
            self._executor.shutdown(wait=True)


def _span(data_bytes: int) -> int:
    """Bytes a group occupies: its records, then padding to a 4 KiB boundary."""
    if data_bytes % BLOCK_SIZE_BYTES == 0:
        return data_bytes
    # The padding header itself needs 24 bytes before the boundary.
    return align_up(data_bytes + WAL_RECORD_HEADER_SIZE)


def _padding_header(position: int, end: int) -> bytes:
    return encode_padding_header(position, end - position - WAL_RECORD_HEADER_SIZE)


class _RingReader:
    """Sequential reads for recovery, in large chunks that never cross the end of the ring."""

    def __init__(self, wal: BlockWal, limit: int) -> None:
        self._wal = wal
        self._limit = limit
        self._chunk_start = 0
        self._chunk = b""

    async def read(self, offset: int, size: int) -> bytes:
        chunk_end = self._chunk_start + len(self._chunk)
        if not (self._chunk_start <= offset and offset + size <= chunk_end):
            ring = self._wal.ring_capacity_bytes
            lap_end = offset - offset % ring + ring
            length = max(size, min(RECOVERY_READ_BYTES, lap_end - offset, self._limit - offset))
            self._chunk = await self._wal._run_io(
                self._wal._device.read, length, self._wal._physical(offset)
            )
            self._chunk_start = offset
        start = offset - self._chunk_start
        return self._chunk[start : start + size]
