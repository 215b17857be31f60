"""S3Storage end to end on one node: append, read from cache and objects, crash, recover."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from automq_ref.io.controller import Controller
from automq_ref.io.faults import MemoryBlockDevice
from automq_ref.io.metadata_log import FileMetadataLog
from automq_ref.io.object_store import LocalDirectoryObjectStore, ObjectStore
from automq_ref.io.s3stream import S3Storage, StreamFencedError
from automq_ref.io.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from tests.unit.test_object_store import fresh_bucket, moto_store

PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=4000,
    upload_interval_ms=-1,
    stream_object_split_bytes=3000,
    capacity_bytes=20_000,
)


StoreFactory = Callable[[], Awaitable[ObjectStore]]


@pytest.fixture(params=["local", "s3"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens the same store (directory or bucket) again at every start."""
    bucket = fresh_bucket()

    async def local() -> ObjectStore:
        return LocalDirectoryObjectStore(tmp_path / "objects")

    async def s3() -> ObjectStore:
        return await moto_store(request.getfixturevalue("moto_s3"), bucket)

    return local if request.param == "local" else s3


async def start(
    device: MemoryBlockDevice, tmp_path: Path, node_epoch: int, open_store: StoreFactory
) -> tuple[S3Storage, FileMetadataLog]:
    metadata_log = await FileMetadataLog.open(tmp_path / "meta")
    controller = await Controller.open(metadata_log)
    wal = await BlockWal.open(device, node_id=1, node_epoch=node_epoch, max_write_bytes=64 * 1024)
    store = await open_store()
    storage = await S3Storage.start(
        wal=wal,
        store=store,
        controller=controller,
        node_id=1,
        node_epoch=node_epoch,
        namespace="_kafka_test",
        params=PARAMS,
        block_size_threshold_bytes=1024,
    )
    return storage, metadata_log


def payload(stream_id: int, offset: int) -> bytes:
    return f"{stream_id}:{offset}:".encode() * 20


async def test_appends_survive_a_crash_and_read_back_from_objects(
    tmp_path: Path, open_store: StoreFactory
) -> None:
    device = MemoryBlockDevice(1 << 20)
    storage, metadata_log = await start(device, tmp_path, 1, open_store)
    streams = [await storage.create_stream() for _ in range(2)]
    for stream_id in streams:
        assert await storage.open_stream(stream_id, 0) == (0, 0)
    written: dict[int, list[tuple[int, bytes]]] = {s: [] for s in streams}
    for index in range(60):
        stream_id = streams[index % 2]
        data = payload(stream_id, index)
        base = await storage.append(stream_id, 0, data, 2)
        written[stream_id].append((base, data))
    for stream_id in streams:
        got = await storage.read(stream_id, 0, 1000, 10**9)
        assert [(b.base_offset, bytes(b.payload)) for b in got] == written[stream_id]
        assert await storage.read(stream_id, 60, 1000, 10**9) == []  # past the confirm offset
    with pytest.raises(StreamFencedError):
        await storage.append(streams[0], 5, b"x", 1)

    # Crash: the process dies; the WAL keeps what it synced; the metadata log is on disk.
    if storage._ticker is not None:
        storage._ticker.cancel()
    await metadata_log.close()
    crashed_store = storage._store
    crashed = device.crash(random.Random(1))
    storage, metadata_log = await start(crashed, tmp_path, 2, open_store)
    for stream_id in streams:
        # Recovery committed the WAL tail and closed the stream: reopen at a newer epoch.
        start_offset, next_offset = await storage.open_stream(stream_id, 1)
        assert (start_offset, next_offset) == (0, 60)
        got = await storage.read(stream_id, 0, 1000, 10**9)
        assert [(b.base_offset, bytes(b.payload)) for b in got] == written[stream_id]
        middle = await storage.read(stream_id, 31, 1000, 10**9)
        assert middle[0].base_offset == 30
    # After a recovery, a force upload still waits for its own commit (regression: block ids
    # restarted at 0 after recovery and matched the recovered block's finished commit).
    await storage.append(streams[0], 1, payload(streams[0], 60), 1)
    await storage.force_upload(streams[0])
    assert storage._controller.image.streams[streams[0]].end_offset == 61
    await storage.shutdown()
    await metadata_log.close()
    await crashed_store.close()
    await storage._store.close()

    # A graceful shutdown uploaded everything: the next start recovers nothing from the WAL.
    storage, metadata_log = await start(crashed, tmp_path, 3, open_store)
    for stream_id in streams:
        assert await storage.open_stream(stream_id, 2) == (0, 61 if stream_id == streams[0] else 60)
    await storage.shutdown()
    await metadata_log.close()
    await storage._store.close()


async def test_concurrent_appends_into_a_full_wal_keep_offset_order(tmp_path: Path) -> None:
    """Appends issued together overflow a small WAL: they queue behind an upload, in order."""

    async def local() -> ObjectStore:
        return LocalDirectoryObjectStore(tmp_path / "objects")

    device = MemoryBlockDevice(256 * 1024)
    storage, metadata_log = await start(device, tmp_path, 1, local)
    streams = [await storage.create_stream() for _ in range(2)]
    for stream_id in streams:
        await storage.open_stream(stream_id, 0)
    appends = [
        storage.append(streams[index % 2], 0, payload(streams[index % 2], index) * 40, 1)
        for index in range(120)
    ]
    bases = await asyncio.gather(*appends)
    assert bases == [index // 2 for index in range(120)]
    for stream_id in streams:
        got = await storage.read(stream_id, 0, 1000, 10**9)
        assert [bytes(b.payload) for b in got] == [
            payload(stream_id, index) * 40
            for index in range(120)
            if streams[index % 2] == stream_id
        ]
    await storage.shutdown()
    await metadata_log.close()
