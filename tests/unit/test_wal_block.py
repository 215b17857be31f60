"""Block WAL: append, group commit, trim, recovery, and crashes on a real file and in memory."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from automq_ref.checker.faults import DeviceCrashedError, MemoryBlockDevice
from automq_ref.io.storage.block_device import BlockDevice
from automq_ref.io.storage.wal_block import (
    BLOCK_SIZE_BYTES,
    HEADER_SLOT_BYTES,
    RING_START_BYTES,
    BlockWal,
    RecoveredRecord,
    ShutdownType,
    SyncPolicy,
    WalFencedError,
    WalHeaderCorruptError,
    WalIOError,
    WalOverCapacityError,
    WalRecordTooLargeError,
    WalStateError,
)
from tests.waiting import PATIENCE_S

NODE_ID = 7
CAPACITY = 1 << 20
MAX_WRITE = 64 * 1024


async def open_wal(
    target: BlockDevice | Path,
    epoch: int = 1,
    *,
    node_id: int = NODE_ID,
    wrap_device: Callable[[BlockDevice], BlockDevice] | None = None,
    sync_policy: SyncPolicy | None = None,
) -> BlockWal:
    """Open the WAL of node ``NODE_ID`` on a device, or on a file of ``CAPACITY`` bytes."""
    if isinstance(target, Path):
        return await BlockWal.open_file(
            target,
            node_id=node_id,
            node_epoch=epoch,
            capacity_bytes=CAPACITY,
            max_write_bytes=MAX_WRITE,
            wrap_device=wrap_device,
            sync_policy=sync_policy,
        )
    assert wrap_device is None, "wrap the device before passing it"
    return await BlockWal.open(
        target,
        node_id=node_id,
        node_epoch=epoch,
        max_write_bytes=MAX_WRITE,
        sync_policy=sync_policy,
    )


async def ready(wal: BlockWal) -> BlockWal:
    """Recover (ignoring what is found) and reset: the WAL takes appends."""
    async for _ in wal.recover():
        pass
    await wal.reset()
    return wal


async def open_ready(target: BlockDevice | Path, epoch: int = 1) -> BlockWal:
    return await ready(await open_wal(target, epoch))


async def recover_all(
    target: BlockDevice | Path, epoch: int = 2
) -> tuple[BlockWal, list[RecoveredRecord]]:
    wal = await open_wal(target, epoch)
    return wal, [record async for record in wal.recover()]


def body(index: int, size: int = 100) -> bytes:
    return index.to_bytes(4, "big") * (size // 4) + b"!" * (size % 4)


async def test_append_then_recover_after_crash_returns_every_acknowledged_record() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    results = [await wal.append(body(index)) for index in range(20)]
    assert [result.record_offset for result in results] == sorted(
        result.record_offset for result in results
    )
    # No close: the process dies with the device as it is on disk.
    _, recovered = await recover_all(device.crash(random.Random(1)))
    assert [record.body for record in recovered] == [body(index) for index in range(20)]
    assert [record.record_offset for record in recovered] == [r.record_offset for r in results]


async def test_concurrent_appends_share_syncs_and_complete_only_after_sync() -> None:
    release = threading.Event()
    syncs_started = threading.Event()

    class SlowSyncDevice(MemoryBlockDevice):
        def sync(self) -> None:
            syncs_started.set()
            release.wait(PATIENCE_S)
            super().sync()

    device = SlowSyncDevice(CAPACITY)
    release.set()
    wal = await open_ready(device)
    release.clear()
    syncs_started.clear()
    first = asyncio.ensure_future(wal.append(body(0)))
    # The first group is now blocked in its sync; these 63 gather behind it.
    assert await asyncio.to_thread(syncs_started.wait, PATIENCE_S)
    rest = [asyncio.ensure_future(wal.append(body(index))) for index in range(1, 64)]
    await asyncio.sleep(0.05)
    assert not first.done() and not any(task.done() for task in rest)
    syncs_before = device.sync_count
    release.set()
    results = await asyncio.gather(first, *rest)
    assert len({result.record_offset for result in results}) == 64
    # One sync for the first group, one for the 63 that waited behind it.
    assert device.sync_count - syncs_before == 2
    await wal.close()


async def test_trim_moves_recovery_start_and_rejects_non_boundaries() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    results = [await wal.append(body(index)) for index in range(10)]
    await wal.trim(results[3].next_offset)
    with pytest.raises(ValueError, match="not a WAL record boundary"):
        await wal.trim(results[5].record_offset + 1)
    with pytest.raises(ValueError, match="beyond the durable end"):
        await wal.trim(wal.confirm_offset + BLOCK_SIZE_BYTES)
    await wal.trim(results[1].next_offset)  # backwards: no-op
    assert wal.start_offset == results[3].next_offset
    _, recovered = await recover_all(device.crash(random.Random(2)))
    assert [record.body for record in recovered] == [body(index) for index in range(4, 10)]


async def test_ring_wraps_many_times_with_trims_and_recovers_exactly() -> None:
    device = MemoryBlockDevice(256 * 1024)
    wal = await open_ready(device)
    live: list[tuple[int, bytes]] = []
    rng = random.Random(3)
    for index in range(600):
        data = body(index, rng.randrange(1, 9000))
        try:
            result = await wal.append(data)
        except WalOverCapacityError:
            keep = len(live) // 2
            trim_to = live[-keep - 1][0] if keep < len(live) else wal.start_offset
            await wal.trim(trim_to)
            live = live[len(live) - keep :]
            result = await wal.append(data)
        live.append((result.next_offset, data))
    assert wal.confirm_offset > 3 * wal.ring_capacity_bytes
    _, recovered = await recover_all(device.crash(random.Random(4)))
    assert [record.body for record in recovered] == [data for _, data in live]


async def test_reset_hides_everything_recovered_from_later_recoveries() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    for index in range(30):
        await wal.append(body(index, 3000))
    crashed = device.crash(random.Random(5))
    wal2, recovered = await recover_all(crashed)
    assert len(recovered) == 30
    await wal2.reset()
    # A short new record lands where old ones lie; none of the old ones may come back.
    await wal2.append(b"new")
    _, again = await recover_all(crashed.crash(random.Random(6)), epoch=3)
    assert [record.body for record in again] == [b"new"]


async def test_crash_between_write_and_sync_loses_only_unacknowledged_records() -> None:
    for seed in range(40):
        device = MemoryBlockDevice(CAPACITY)
        wal = await open_ready(device)
        acknowledged = [body(index, 700) for index in range(5)]
        for data in acknowledged:
            await wal.append(data)
        # Die after the next write, before the sync that would cover it.
        device.crash_after_operations = 1
        unacknowledged = [body(100 + index, 700) for index in range(8)]
        outcomes = await asyncio.gather(
            *(wal.append(data) for data in unacknowledged), return_exceptions=True
        )
        assert all(isinstance(outcome, WalIOError) for outcome in outcomes)
        assert isinstance(outcomes[0], WalIOError)
        assert isinstance(outcomes[0].__cause__, DeviceCrashedError)
        _, recovered = await recover_all(device.crash(random.Random(seed)))
        bodies = [record.body for record in recovered]
        assert bodies[:5] == acknowledged
        assert bodies[5:] == unacknowledged[: len(bodies) - 5]


async def test_device_failure_fails_appends_and_refuses_more() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    device.crash_after_operations = 0
    with pytest.raises(WalIOError):
        await wal.append(b"lost")
    with pytest.raises(WalIOError, match="reopen and recover"):
        await wal.append(b"again")


async def test_bit_flip_in_an_acknowledged_record_stops_recovery_there() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    results = [await wal.append(body(index, 500)) for index in range(10)]
    victim = results[6]
    physical = RING_START_BYTES + victim.record_offset % wal.ring_capacity_bytes
    for position in (physical + 3, physical + 30, physical + 400):
        crashed = device.crash(random.Random(7))
        crashed.flip_bit(position, 5)
        _, recovered = await recover_all(crashed)
        assert [record.body for record in recovered] == [body(index, 500) for index in range(6)]


async def test_torn_header_write_falls_back_to_the_other_slot() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device)
    results = [await wal.append(body(index)) for index in range(6)]
    await wal.trim(results[1].next_offset)
    await wal.trim(results[3].next_offset)
    newest_slot = wal._header_slot
    crashed = device.crash(random.Random(8))
    crashed.flip_bit(newest_slot * HEADER_SLOT_BYTES + 10, 0)
    _, recovered = await recover_all(crashed)
    # The older header still says "start after record 1": records 2.. come back.
    assert [record.body for record in recovered] == [body(index) for index in range(2, 6)]


async def test_both_header_slots_corrupt_is_refused_not_reformatted() -> None:
    device = MemoryBlockDevice(CAPACITY)
    await open_ready(device)
    device.flip_bit(10, 1)
    device.flip_bit(HEADER_SLOT_BYTES + 10, 1)
    with pytest.raises(WalHeaderCorruptError):
        await open_wal(device, 2)


async def test_owner_checks() -> None:
    device = MemoryBlockDevice(CAPACITY)
    wal = await open_ready(device, epoch=5)
    await wal.close()
    with pytest.raises(WalFencedError, match="node 7"):
        await open_wal(device, 9, node_id=8)
    with pytest.raises(WalFencedError, match="newer than epoch 4"):
        await open_wal(device, 4)


async def test_order_of_operations_is_enforced() -> None:
    wal = await open_wal(MemoryBlockDevice(CAPACITY))
    with pytest.raises(WalStateError):
        await wal.append(b"x")
    with pytest.raises(WalStateError):
        await wal.reset()
    async for _ in wal.recover():
        pass
    await wal.reset()
    with pytest.raises(ValueError, match="empty"):
        await wal.append(b"")
    with pytest.raises(WalRecordTooLargeError):
        await wal.append(bytes(MAX_WRITE))
    await wal.close()
    with pytest.raises(WalStateError):
        await wal.append(b"x")


async def test_over_capacity_until_trimmed() -> None:
    device = MemoryBlockDevice(RING_START_BYTES + 4 * MAX_WRITE)
    wal = await open_ready(device)
    results = []
    with pytest.raises(WalOverCapacityError):
        while True:
            results.append(await wal.append(bytes(30_000)))
    await wal.trim(results[-1].next_offset)
    await wal.append(bytes(30_000))


@pytest.mark.parametrize("seed", range(6))
async def test_an_admitted_record_is_always_placed_however_full_the_ring(seed: int) -> None:
    """Queue records of any size until ``submit`` refuses one; every record it admitted must
    then be written (the writer never meets a full ring: failing there would leave a gap in a
    stream after later records were admitted). Many laps, trims of varying depth."""
    device = MemoryBlockDevice(RING_START_BYTES + 4 * MAX_WRITE)
    wal = await open_ready(device)
    rng = random.Random(seed)
    live: list[tuple[int, bytes]] = []
    index = 0
    while wal.confirm_offset < 12 * wal.ring_capacity_bytes:
        futures = []
        while True:
            index += 1
            size = rng.choice((1, 100, 4000, 4072, 4096, 20_000, MAX_WRITE - 24))
            data = body(index, size)
            try:
                futures.append((wal.submit(data), data))
            except WalOverCapacityError:
                break
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # let the writer take what is queued so far
        for future, data in futures:
            live.append(((await future).next_offset, data))
        keep = rng.randrange(0, len(live))
        await wal.trim(live[-keep - 1][0] if keep < len(live) else wal.start_offset)
        live = live[len(live) - keep :]
    _, recovered = await recover_all(device.crash(random.Random(seed)))
    assert [record.body for record in recovered] == [data for _, data in live]


async def test_graceful_close_marks_the_header(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await open_ready(path)
    await wal.append(b"last words")
    await wal.close()
    reopened = await open_wal(path, 2)
    assert reopened.header.shutdown_type is ShutdownType.GRACEFUL
    assert [record.body async for record in reopened.recover()] == [b"last words"]
    await reopened.close()


async def test_real_file_torn_tail_truncation_and_garbage(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await open_ready(path)
    results = [await wal.append(body(index, 1000)) for index in range(12)]
    await wal.close()
    ninth = RING_START_BYTES + results[8].record_offset
    original = path.read_bytes()

    # Torn tail: garbage over the last records.
    with path.open("r+b") as file:
        file.seek(ninth + 10)
        file.write(os.urandom(3000))
    reopened, recovered = await recover_all(path)
    assert [record.body for record in recovered] == [body(index, 1000) for index in range(8)]
    await reopened.close()

    # Truncation into the ninth record: the file is cut short, the WAL restores its size.
    path.write_bytes(original[: ninth + 100])
    reopened, recovered = await recover_all(path)
    assert [record.body for record in recovered] == [body(index, 1000) for index in range(8)]
    await reopened.close()
    assert path.stat().st_size == CAPACITY
