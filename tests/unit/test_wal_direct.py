"""The block WAL on a raw block device with O_DIRECT (a loop device over a sparse file)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_ref.io.storage.block_device import DirectBlockDevice, FileBlockDevice, open_device
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_device import RemoteBlockDevice, ReservationReport, serving
from tests.loop_device import loop_device, why_no_loop_device

SIZE = 8 << 20
MAX_WRITE = 256 * 1024


@pytest.fixture
def raw_device(tmp_path: Path) -> Iterator[Path]:
    reason = why_no_loop_device()
    if reason is not None:
        pytest.skip(reason)
    try:
        with loop_device(tmp_path / "backing", SIZE) as device:
            yield device
    except OSError as error:
        pytest.skip(f"no loop device: {error}")


def test_open_device_picks_o_direct_for_a_block_device(raw_device: Path, tmp_path: Path) -> None:
    direct = open_device(raw_device, SIZE)
    plain = open_device(tmp_path / "file", SIZE)
    try:
        assert isinstance(direct, DirectBlockDevice)
        assert isinstance(plain, FileBlockDevice)
        with pytest.raises(ValueError, match="multiple of 4096"):
            direct.write([b"x"], 100)
        with pytest.raises(ValueError, match="fewer than"):
            DirectBlockDevice(raw_device, SIZE * 2)
        # Buffers of any length gather into whole blocks; the rest of the last block is zeros.
        direct.write([b"abc", memoryview(b"defgh"), bytearray(b"i" * 5000)], 8192)
        direct.sync()
        assert direct.read(8, 8193) == b"bcdefghi"
        assert direct.read(4, 8192 + 5008) == b"\0\0\0\0"
        assert direct.read(10, SIZE - 4) == b"\0" * 10  # past the end reads as zeros
    finally:
        direct.close()
        plain.close()


async def test_the_block_wal_on_a_raw_device_recovers_after_many_laps(raw_device: Path) -> None:
    wal = await BlockWal.open_file(
        raw_device, node_id=3, node_epoch=1, capacity_bytes=SIZE, max_write_bytes=MAX_WRITE
    )
    async for _ in wal.recover():
        pass
    await wal.reset()
    sizes = [1, 100, 4072, 4073, 70_000, MAX_WRITE - 64]
    appended: list[bytes] = []
    for round_ in range(120):  # about three laps of the ring
        bodies = [bytes([round_ % 251]) * sizes[(round_ + i) % len(sizes)] for i in range(3)]
        results = [await wal.append(body) for body in bodies]
        appended.extend(bodies)
        if results[-1].next_offset - wal.start_offset > wal.ring_capacity_bytes // 2:
            await wal.trim(results[0].record_offset)
            kept = len(appended) - 3
            del appended[:kept]
    await wal.close()
    reopened = await BlockWal.open_file(
        raw_device, node_id=3, node_epoch=2, capacity_bytes=SIZE, max_write_bytes=MAX_WRITE
    )
    recovered = [record.body async for record in reopened.recover()]
    assert recovered[-len(appended) :] == appended
    await reopened.reset()
    await reopened.close()


async def test_a_wal_device_process_serves_a_raw_device(raw_device: Path, tmp_path: Path) -> None:
    with serving(raw_device, SIZE, str(tmp_path / "sock")) as server:
        assert isinstance(server.device, DirectBlockDevice)
        wal = await BlockWal.open_remote(
            server.address, node_id=3, node_epoch=1, max_write_bytes=MAX_WRITE
        )
        async for _ in wal.recover():
            pass
        await wal.reset()
        bodies = [b"%d" % i * 1000 for i in range(50)]
        for body in bodies:
            await wal.append(body)
        survivor = await BlockWal.take_over(
            server.address, node_id=3, node_epoch=1, max_write_bytes=MAX_WRITE
        )
        assert [record.body async for record in survivor.recover()] == bodies
        await survivor.reset()
        await survivor.close()
        await wal.close()
        client = RemoteBlockDevice(server.address)
        # Both closed: each unregistered, the holder releasing the reservation with it.
        assert client.report() == ReservationReport(None, ())
        client.close()
