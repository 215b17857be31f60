"""S3Storage end to end on one node: append, read from cache and objects, crash, recover."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.checker.object_faults import FaultyObjectStore
from automq_ref.formats.object_file import DataBlockIndex
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage.object_store import (
    CountingReads,
    LocalDirectoryObjectStore,
    ObjectStore,
    ObjectStoreUnavailable,
)
from automq_ref.io.storage.s3stream import S3Storage, StreamFencedError
from automq_ref.io.storage.stream_objects import DataBlockCache, ReadAhead, object_key
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.state_machines import log_cache as lc
from tests.storage_fixtures import NODE_ID, start_storage
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


class WalMedium:
    """Where the WAL lives, across the crashes of the processes that write it: a memory device
    for the block WAL, a directory of objects for the object WAL."""

    def __init__(self, kind: str, tmp_path: Path, *, max_unflushed_bytes: int = 1 << 30) -> None:
        self.kind = kind
        self.device = MemoryBlockDevice(1 << 20)
        self.objects = LocalDirectoryObjectStore(tmp_path / "wal", fsync=False)
        self.view = FaultyObjectStore(self.objects)
        self.wal: WriteAheadLog | None = None
        self.config = ObjectWalConfig(batch_interval_ms=5, max_unflushed_bytes=max_unflushed_bytes)

    async def open(self, node_epoch: int) -> WriteAheadLog:
        if self.kind == "block":
            self.wal = await BlockWal.open(
                self.device, node_id=NODE_ID, node_epoch=node_epoch, max_write_bytes=64 * 1024
            )
        else:
            self.view = FaultyObjectStore(self.objects)
            self.wal = await ObjectWal.open(
                self.view,
                namespace="_kafka_test",
                node_id=NODE_ID,
                node_epoch=node_epoch,
                config=self.config,
            )
        return self.wal

    async def crash(self) -> None:
        """The writing process dies: the device keeps what it synced (and some of the rest),
        the directory what landed."""
        if self.kind == "block":
            self.device = self.device.crash(random.Random(1))
        else:
            self.view.crash()
            assert self.wal is not None
            await self.wal.close()  # releases the dead process's tasks; writes nothing

    async def close(self) -> None:
        await self.objects.close()


@pytest.fixture(params=["block", "object"])
def wal_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def start(
    medium: WalMedium, tmp_path: Path, node_epoch: int, open_store: StoreFactory
) -> tuple[S3Storage, FileMetadataLog]:
    wal = await medium.open(node_epoch)
    running = await start_storage(
        tmp_path,
        wal,
        await open_store(),
        params=PARAMS,
        node_epoch=node_epoch,
        block_size_threshold_bytes=1024,
    )
    return running.storage, running.metadata_log


def store_of(storage: S3Storage) -> ObjectStore:
    """The store a storage reads objects through (counted, on the storage's own loop)."""
    reads = storage.reads
    assert isinstance(reads, CountingReads)
    return reads.store


def payload(stream_id: int, offset: int) -> bytes:
    return f"{stream_id}:{offset}:".encode() * 20


async def test_appends_survive_a_crash_and_read_back_from_objects(
    tmp_path: Path, open_store: StoreFactory, wal_kind: str
) -> None:
    medium = WalMedium(wal_kind, tmp_path)
    storage, metadata_log = await start(medium, tmp_path, 1, open_store)
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
    crashed_store = store_of(storage)
    await medium.crash()
    storage, metadata_log = await start(medium, tmp_path, 2, open_store)
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
    assert storage._view.image.streams[streams[0]].end_offset == 61
    await storage.shutdown()
    await metadata_log.close()
    await crashed_store.close()
    await store_of(storage).close()

    # A graceful shutdown uploaded everything: the next start recovers nothing from the WAL.
    storage, metadata_log = await start(medium, tmp_path, 3, open_store)
    assert storage.recovered.records == 0
    for stream_id in streams:
        assert await storage.open_stream(stream_id, 2) == (0, 61 if stream_id == streams[0] else 60)
    await storage.shutdown()
    await metadata_log.close()
    await store_of(storage).close()
    await medium.close()


async def test_concurrent_appends_into_a_full_wal_keep_offset_order(
    tmp_path: Path, wal_kind: str
) -> None:
    """Appends issued together overflow a small WAL (a small ring; little room for data not
    yet uploaded): they queue behind an upload, in order."""

    async def local() -> ObjectStore:
        return LocalDirectoryObjectStore(tmp_path / "objects")

    medium = WalMedium(wal_kind, tmp_path, max_unflushed_bytes=64 * 1024)
    medium.device = MemoryBlockDevice(256 * 1024)
    storage, metadata_log = await start(medium, tmp_path, 1, local)
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
    await medium.close()


# ------------------------------------------------------------------------ readahead (read path)

BLOCK = 1000


class SlowCountingStore(LocalDirectoryObjectStore):
    """A directory store whose ranged GETs take a while, counting how many overlap; GETs whose
    start is in ``fail_once`` fail the first time."""

    def __init__(self, root: Path, delay_s: float = 0.01) -> None:
        super().__init__(root, fsync=False)
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.gets: list[tuple[int, int]] = []
        self.fail_once: set[int] = set()

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        self.gets.append((start, end_exclusive))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if start in self.fail_once:
                self.fail_once.discard(start)
                raise ObjectStoreUnavailable(f"{key} at {start}: injected", key=key, attempts=1)
            return await super().get_range(key, start, end_exclusive)
        finally:
            self.in_flight -= 1


def object_blocks(count: int) -> tuple[bytes, list[DataBlockIndex]]:
    """An object of ``count`` blocks of BLOCK bytes (block i filled with i), one offset each."""
    data = b"".join(bytes([index]) * BLOCK for index in range(count))
    indexes = [DataBlockIndex(1, index, 1, 1, index * BLOCK, BLOCK) for index in range(count)]
    return data, indexes


async def test_a_sequential_read_keeps_several_gets_in_flight(tmp_path: Path) -> None:
    count = 40
    data, indexes = object_blocks(count)
    async with SlowCountingStore(tmp_path) as store:
        await store.put(object_key("ns", 7), [data])
        cache = DataBlockCache(store, "ns", capacity_bytes=64 * BLOCK)
        for index in range(count):
            ahead = ReadAhead(
                1,
                [(7, block) for block in indexes[index + 1 :]],
                window_bytes=16 * BLOCK,
                get_bytes=4 * BLOCK,
                to_the_end=True,
            )
            (got,) = await cache.get_many(7, [indexes[index]], ahead)
            assert bytes(got) == bytes([index]) * BLOCK
            assert cache.readahead_bytes <= cache.readahead_limit_bytes
            assert cache.size_bytes <= 64 * BLOCK
        # Readahead ran ahead with GETs of several blocks, more than one at a time, and every
        # block was fetched once.
        assert store.max_in_flight >= 2
        assert len(store.gets) < count // 2
        fetched = sorted(position for start, end in store.gets for position in range(start, end))
        assert fetched == list(range(count * BLOCK))
        assert cache.readahead_gets > 0 and cache.readahead_bytes == 0
        await cache.close()


async def test_a_failed_readahead_does_not_poison_later_reads(tmp_path: Path) -> None:
    data, indexes = object_blocks(12)
    async with SlowCountingStore(tmp_path) as store:
        await store.put(object_key("ns", 7), [data])
        cache = DataBlockCache(store, "ns", capacity_bytes=64 * BLOCK)
        # A readahead that fails before anyone reads its blocks: they are simply fetched again.
        store.fail_once = {1 * BLOCK}
        cache.read_ahead(
            ReadAhead(1, [(7, b) for b in indexes[1:3]], get_bytes=2 * BLOCK, to_the_end=True)
        )
        await asyncio.sleep(0.05)
        got = await cache.get_many(7, indexes[1:3])
        assert [bytes(g) for g in got] == [bytes([1]) * BLOCK, bytes([2]) * BLOCK]
        assert cache.readahead_bytes == 0
        # A readahead that fails while a reader waits for it: the reader GETs the block itself.
        store.fail_once = {5 * BLOCK}
        cache.read_ahead(
            ReadAhead(1, [(7, b) for b in indexes[5:7]], get_bytes=2 * BLOCK, to_the_end=True)
        )
        got = await cache.get_many(7, indexes[5:7])
        assert [bytes(g) for g in got] == [bytes([5]) * BLOCK, bytes([6]) * BLOCK]
        # A reader's own GET that fails is the reader's error, and is not remembered.
        store.fail_once = {9 * BLOCK}
        with pytest.raises(ObjectStoreUnavailable):
            await cache.get_many(7, indexes[9:10])
        assert bytes((await cache.get_many(7, indexes[9:10]))[0]) == bytes([9]) * BLOCK
        await cache.close()


async def test_readahead_stays_within_its_share_and_close_cancels_it(tmp_path: Path) -> None:
    data, indexes = object_blocks(40)
    async with SlowCountingStore(tmp_path, delay_s=10) as store:
        await store.put(object_key("ns", 7), [data])
        cache = DataBlockCache(store, "ns", capacity_bytes=16 * BLOCK)
        for stream_id in (1, 2, 3):
            for _ in range(5):  # windows grow; the limit (half the capacity) holds
                cache.read_ahead(
                    ReadAhead(
                        stream_id,
                        [(7, b) for b in indexes],
                        window_bytes=40 * BLOCK,
                        get_bytes=2 * BLOCK,
                        to_the_end=True,
                    )
                )
                assert 0 < cache.readahead_bytes <= cache.readahead_limit_bytes == 8 * BLOCK
        await asyncio.sleep(0)
        assert store.in_flight > 0
        await cache.close()
        assert store.in_flight == 0 and cache.readahead_bytes == 0


async def test_blocks_of_one_get_share_its_buffer_and_are_charged_for_it(tmp_path: Path) -> None:
    data, indexes = object_blocks(4)
    async with SlowCountingStore(tmp_path, delay_s=0) as store:
        await store.put(object_key("ns", 7), [data])
        cache = DataBlockCache(store, "ns", capacity_bytes=24 * BLOCK)
        first, second = await cache.get_many(7, indexes[:2])
        assert isinstance(first, memoryview) and first.obj is second.obj  # type: ignore[union-attr]
        assert cache.size_bytes == 2 * BLOCK
        # Too long a GET (over an eighth of the capacity) is copied block by block instead.
        small = DataBlockCache(store, "ns", capacity_bytes=8 * BLOCK)
        blocks = await small.get_many(7, indexes[:2])
        assert all(isinstance(block, bytes) for block in blocks)


async def test_storage_reads_a_long_stream_back_through_readahead(tmp_path: Path) -> None:
    store = SlowCountingStore(tmp_path / "objects", delay_s=0.002)

    async def same_store() -> ObjectStore:
        return store

    medium = WalMedium("block", tmp_path)
    storage, metadata_log = await start(medium, tmp_path, 1, same_store)
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    written = [payload(stream_id, index) for index in range(300)]
    for data in written:
        await storage.append(stream_id, 0, data, 1)
    await storage.close_stream(stream_id, 0)
    await storage.shutdown()
    await metadata_log.close()
    storage, metadata_log = await start(medium, tmp_path, 2, same_store)
    await storage.open_stream(stream_id, 1)
    got: list[bytes] = []
    while len(got) < len(written):
        found = await storage.read(stream_id, len(got), len(written), 500)
        got.extend(bytes(batch.payload) for batch in found)
    assert got == written
    assert storage.block_cache_stats().readahead_gets > 0
    await storage.shutdown()
    await metadata_log.close()
    await store.close()
    await medium.close()


async def test_an_append_copies_its_payload_before_returning(
    tmp_path: Path, open_store: StoreFactory
) -> None:
    """The partition hands over a view of the request frame: what is cached and written is the
    payload as it was at the call, whatever the frame holds afterwards."""
    medium = WalMedium("block", tmp_path)
    storage, metadata_log = await start(medium, tmp_path, 1, open_store)
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    frame = bytearray(payload(stream_id, 0) * 3)
    original = bytes(frame)
    _, durable = storage.append_nowait(stream_id, 0, memoryview(frame), 1)
    frame[:] = bytes(len(frame))
    await durable
    got = await storage.read(stream_id, 0, 1, 10**9)
    assert [bytes(batch.payload) for batch in got] == [original]
    await storage.shutdown()
    await metadata_log.close()
    await store_of(storage).close()

    storage, metadata_log = await start(medium, tmp_path, 2, open_store)
    await storage.open_stream(stream_id, 1)
    got = await storage.read(stream_id, 0, 1, 10**9)
    assert [bytes(batch.payload) for batch in got] == [original]  # from the uploaded object
    await storage.shutdown()
    await metadata_log.close()
    await store_of(storage).close()
    await medium.close()
