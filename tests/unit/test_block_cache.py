"""The read path from objects: stream readers over the block cache (read counts, shared loads,
adaptive readahead, readers kept by position)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from automq_ref.formats.object_file import DataBlockIndex
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.storage.block_cache import (
    MAX_READAHEAD_BYTES,
    READAHEAD_UNIT_BYTES,
    READER_IDLE_S,
    StreamReader,
    StreamReaders,
)
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, NotFound
from automq_ref.io.storage.stream_objects import DataBlockCache, ObjectIndexCache
from automq_ref.vocabulary.naming import object_key
from tests.block_cache_fixtures import (
    NAMESPACE,
    CountingStore,
    FakeClock,
    WrittenStreams,
    write_streams,
)

KIB = 1024
MIB = 1024 * KIB


def payloads(stream_id: int, count: int, size: int) -> list[bytes]:
    return [bytes([stream_id, index % 251]) * (size // 2) for index in range(count)]


def readers_over(
    store: CountingStore,
    written: WrittenStreams,
    capacity_bytes: int,
    clock: FakeClock,
    *,
    ttl_s: float = 60.0,
) -> StreamReaders:
    blocks = DataBlockCache(store, NAMESPACE, capacity_bytes, clock=clock, ttl_s=ttl_s)
    return StreamReaders(
        lambda: written.image,
        ObjectIndexCache(store, NAMESPACE),
        blocks,
        clock=clock,
        readahead_margin_bytes=0,
    )


def payload_bytes(batches: Sequence[StreamRecordBatch]) -> list[bytes]:
    return [bytes(batch.payload) for batch in batches]


async def settle(reader: StreamReader | None) -> None:
    assert reader is not None
    if reader.readahead_task is not None:
        await reader.readahead_task


async def test_a_sequential_consumer_reuses_its_reader_and_leaves_nothing_cached(
    tmp_path: Path,
) -> None:
    async with CountingStore(tmp_path) as store:
        written = await write_streams(
            store, [[payloads(0, 40, 3000), payloads(0, 40, 3000)]], block_size_bytes=8 * KIB
        )
        readers = readers_over(store, written, 64 * MIB, FakeClock())
        expected = written.batches[0]
        end = expected[-1].last_offset
        got: list[bytes] = []
        offset = 0
        seen: set[int] = set()
        while offset < end:
            batches = await readers.read(0, offset, end, 20 * KIB)
            got.extend(payload_bytes(batches))
            offset = batches[-1].last_offset
            reader = readers.reader(0, offset)
            assert reader is not None and len(readers) == 1
            seen.add(id(reader))
            await settle(reader)
        assert got == [bytes(batch.payload) for batch in expected]
        assert len(seen) == 1  # one reader all along
        # Each block was freed as soon as its only reader read past it.
        assert readers.blocks.size_bytes == 0
        stats = readers.stats()
        assert stats.readers == 1 and stats.resident_bytes == 0
        # Readahead kept blocks until they were read: the peak saw them; taking it starts anew.
        assert stats.peak_bytes > 0 and readers.stats().peak_bytes == 0
        assert stats.gets == len(store.gets)
        assert stats.fetched_bytes == sum(end - start for _, start, end in store.gets)
        assert stats.readahead_gets > 0
        await readers.close()
        await readers.blocks.close()


async def test_a_block_is_freed_once_every_reader_that_watches_it_has_read_it(
    tmp_path: Path,
) -> None:
    async with CountingStore(tmp_path) as store:
        written = await write_streams(store, [[payloads(0, 30, 3000)]], block_size_bytes=8 * KIB)
        readers = readers_over(store, written, 64 * MIB, FakeClock())
        end = written.batches[0][-1].last_offset
        # A slow consumer reads one batch: its reader now watches every block of the object.
        slow = await readers.read(0, 0, end, 1)
        # A fast one reads the whole stream from the start: the blocks stay for the slow one.
        fast = await readers.read(0, 0, end, 10 * MIB)
        assert fast[-1].last_offset == end
        await asyncio.gather(*(settle(r) for r in [readers.reader(0, slow[-1].last_offset)]))
        assert readers.blocks.size_bytes > 0
        gets_before = len(store.gets)
        # The slow one reads on from the cache (no GET), and then nothing is left.
        rest = await readers.read(0, slow[-1].last_offset, end, 10 * MIB)
        assert payload_bytes(slow + rest) == payload_bytes(fast)
        assert len(store.gets) == gets_before
        assert readers.blocks.size_bytes == 0
        # Two readers at the same position became one.
        assert len(readers) == 1
        await readers.close()
        await readers.blocks.close()


async def test_concurrent_gets_of_a_block_share_one_load(tmp_path: Path) -> None:
    async with CountingStore(tmp_path, delay_s=0.05) as store:
        await store.put(object_key(NAMESPACE, 7), [bytes(range(256)) * 8])
        block = DataBlockIndex(1, 0, 1, 1, start_position=0, block_size_bytes=400)
        cache = DataBlockCache(store, NAMESPACE, 1 * MIB)
        got = await asyncio.gather(*(cache.get(7, block) for _ in range(5)))
        assert all(bytes(g) == (bytes(range(256)) * 2)[:400] for g in got)
        assert len(store.gets) == 1 and cache.gets == 1
        await cache.close()

        # Two consumers in the same block of a stream, at once: one GET of that block.
        written = await write_streams(store, [[payloads(0, 10, 3000)]], block_size_bytes=64 * KIB)
        readers = readers_over(store, written, 64 * MIB, FakeClock())
        store.gets.clear()
        first, second = await asyncio.gather(readers.read(0, 0, 15, 1), readers.read(0, 3, 15, 1))
        assert first[0].base_offset == 0 and second[0].base_offset <= 3 < second[0].last_offset
        data_key = object_key(NAMESPACE, next(iter(written.image.objects)))
        data_gets = [g for g in store.gets if g[0] == data_key and g[1] == 0]
        assert len(data_gets) == 1
        # And the object's index was fetched once for both (one tail GET covers it).
        assert len([g for g in store.gets if g[0] == data_key and g[1] > 0]) == 1
        await readers.close()
        await readers.blocks.close()


async def test_readahead_grows_with_misses_up_to_its_maximum(tmp_path: Path) -> None:
    async with CountingStore(tmp_path) as store:
        written = await write_streams(
            store,
            [[payloads(0, 400, 16 * KIB) for _ in range(4)]],
            block_size_bytes=64 * KIB,
        )
        readers = readers_over(store, written, 512 * MIB, FakeClock())
        end = written.batches[0][-1].last_offset
        cache = readers.blocks
        batches = await readers.read(0, 0, end, 100 * KIB)
        misses = cache.misses
        assert misses >= 2
        reader = readers.reader(0, batches[-1].last_offset)
        assert reader is not None
        assert reader.readahead_bytes == READAHEAD_UNIT_BYTES * (1 + misses)
        await settle(reader)
        # Within the readahead: no miss, and the size stays.
        batches = await readers.read(0, batches[-1].last_offset, end, 200 * KIB)
        assert cache.misses == misses
        assert reader.readahead_bytes == READAHEAD_UNIT_BYTES * (1 + misses)
        await settle(reader)
        # A long read runs far past it: one unit more per miss, up to the maximum.
        size = reader.readahead_bytes
        batches = await readers.read(0, batches[-1].last_offset, end, 16 * MIB)
        assert readers.reader(0, batches[-1].last_offset) is reader
        assert size + (cache.misses - misses) * READAHEAD_UNIT_BYTES > MAX_READAHEAD_BYTES
        assert reader.readahead_bytes == MAX_READAHEAD_BYTES
        await readers.close()
        await cache.close()


async def test_an_evicted_unread_block_resets_readahead_and_pauses_it(tmp_path: Path) -> None:
    async with CountingStore(tmp_path) as store:
        written = await write_streams(
            store,
            [[payloads(0, 400, 16 * KIB)], [payloads(1, 400, 16 * KIB)]],
            block_size_bytes=64 * KIB,
        )
        clock = FakeClock()
        readers = readers_over(store, written, 64 * MIB, clock, ttl_s=45)
        end = written.batches[0][-1].last_offset
        batches = await readers.read(0, 0, end, 1)
        offset = batches[-1].last_offset
        reader = readers.reader(0, offset)
        assert reader is not None
        task = reader.readahead_task
        assert task is not None and reader.readahead_bytes > READAHEAD_UNIT_BYTES
        await task
        # The blocks it read ahead are not read in time: they age out, and the next access to
        # the cache (another consumer's read) evicts them.
        clock.now += 46
        await readers.read(1, 0, 10, 1)
        assert readers.blocks.evicted_unread > 0
        assert reader.readahead_bytes == READAHEAD_UNIT_BYTES
        misses = readers.blocks.misses
        # For a minute, the reader reads without readahead.
        for step in (1, 33):
            clock.now += step
            batches = await readers.read(0, offset, end, 1)
            offset = batches[-1].last_offset
            assert readers.reader(0, offset) is reader and reader.readahead_task is task
        # Then readahead starts again, from the smallest size grown by the misses since.
        clock.now += 27
        await readers.read(0, offset, end, 1)
        assert reader.readahead_task is not task
        assert readers.blocks.misses > misses
        assert reader.readahead_bytes == READAHEAD_UNIT_BYTES * (1 + readers.blocks.misses - misses)
        await readers.close()
        await readers.blocks.close()


class Watcher:
    def __init__(self) -> None:
        self.evicted: list[tuple[int, int]] = []

    def block_evicted(self, key: tuple[int, int]) -> None:
        self.evicted.append(key)


async def test_watched_blocks_go_last_and_their_watchers_hear_of_it(tmp_path: Path) -> None:
    async with CountingStore(tmp_path) as store:
        await store.put(object_key(NAMESPACE, 7), [bytes(range(256)) * 8])
        a, b, c, d = (
            DataBlockIndex(1, n, 1, 1, start_position=400 * n, block_size_bytes=400)
            for n in range(4)
        )
        cache = DataBlockCache(store, NAMESPACE, capacity_bytes=800)
        first, second = Watcher(), Watcher()
        cache.watch(7, a, first)
        cache.watch(7, b, second)
        await cache.get(7, a)
        await cache.get(7, c)  # nobody watches it
        # Room is needed: the unwatched block goes, though it was used last.
        await cache.get(7, b)
        assert not cache.is_cached(7, c) and cache.is_cached(7, a) and cache.is_cached(7, b)
        assert first.evicted == second.evicted == [] and cache.evicted_unread == 0
        # Only watched blocks left: the least recently used goes, and its watcher hears of it.
        cache.watch(7, d, second)
        await cache.get(7, d)
        assert not cache.is_cached(7, a) and first.evicted == [(7, 0)]
        assert cache.evicted_unread == 1
        # A block read by its only watcher is freed at once.
        cache.unwatch(7, b, second, read=True)
        assert not cache.is_cached(7, b) and cache.size_bytes == 400
        # A watcher that lets go without reading leaves the block to age out.
        cache.unwatch(7, d, second, read=False)
        assert cache.is_cached(7, d) and second.evicted == []
        await cache.close()


async def test_idle_readers_close_and_a_failed_read_drops_its_reader(tmp_path: Path) -> None:
    async with CountingStore(tmp_path) as store:
        written = await write_streams(
            store, [[payloads(0, 20, 3000)], [payloads(1, 20, 3000)]], block_size_bytes=8 * KIB
        )
        clock = FakeClock()
        readers = readers_over(store, written, 64 * MIB, clock)
        await readers.read(0, 0, 10, 1)
        clock.now += READER_IDLE_S / 2
        await readers.read(1, 0, 10, 1)
        assert len(readers) == 2
        clock.now += READER_IDLE_S / 2
        await readers.read(1, 1, 10, 1)  # stream 0's reader has been idle a minute: closed
        assert len(readers) == 1 and readers.reader(0, 1) is None
        # An object gone from the store (compacted away): the store's error, and no reader left.
        for object_id in written.image.objects:
            await store.delete(object_key(NAMESPACE, object_id))
        fresh = readers_over(store, written, 64 * MIB, clock)
        with pytest.raises(NotFound):
            await fresh.read(0, 0, 10, 1)
        assert len(fresh) == 0
        await readers.close()
        await fresh.close()
        await readers.blocks.close()
        await fresh.blocks.close()


async def test_storage_reads_objects_through_one_reader_per_consumer(tmp_path: Path) -> None:
    """S3Storage's reads from objects go through the stream readers: a consumer reading a
    stream from the start is served by one reader, and the stats say what was fetched."""
    from tests.unit.test_s3stream import WalMedium, payload, start

    async def local() -> LocalDirectoryObjectStore:
        return LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)

    medium = WalMedium("block", tmp_path)
    storage, metadata_log = await start(medium, tmp_path, 1, local)
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    written = [payload(stream_id, index) for index in range(200)]
    for data in written:
        await storage.append(stream_id, 0, data, 1)
    await storage.close_stream(stream_id, 0)
    await storage.shutdown()
    await metadata_log.close()
    storage, metadata_log = await start(medium, tmp_path, 2, local)
    await storage.open_stream(stream_id, 1)
    got: list[bytes] = []
    while len(got) < len(written):
        found = await storage.read(stream_id, len(got), len(written), 700)
        got.extend(bytes(batch.payload) for batch in found)
        assert storage.block_cache_stats().readers == 1
    assert got == written
    stats = storage.block_cache_stats()
    assert stats.gets > 0 and stats.fetched_bytes >= sum(len(data) for data in written)
    await storage.shutdown()
    await metadata_log.close()
    await medium.close()


async def test_a_read_stopped_inside_a_block_the_cache_let_go_fetches_only_the_rest(
    tmp_path: Path,
) -> None:
    """A catch-up of many streams stops each read inside a block, and a cache too small to keep
    all those blocks lets them go: the next read GETs its block from the record it stopped at,
    not from the block's start, and a budget that the block's rest covers takes no next block."""
    async with CountingStore(tmp_path) as store:
        written = await write_streams(store, [[payloads(0, 40, 1000)]], block_size_bytes=8 * KIB)
        # Smaller than a block: the cache keeps none.
        readers = readers_over(store, written, KIB, FakeClock())
        (object_id,) = written.image.objects
        s3_object = written.image.objects[object_id]
        blocks = await readers.indexes.get(object_id, s3_object.object_size)
        first, second = blocks[0], blocks[1]
        per_block = first.record_count
        assert per_block >= 4 and len(blocks) >= 3
        key = object_key(NAMESPACE, object_id)
        end = written.batches[0][-1].last_offset

        def data_gets(since: int) -> list[tuple[int, int]]:
            return [
                (a, b) for k, a, b in store.gets[since:] if k == key and a < blocks[-1].end_position
            ]

        # Three batches of the first block (each payload 1,000 bytes: the budget is exact).
        before = len(store.gets)
        got = await readers.read(0, 0, end, 3 * 1000)
        assert len(got) == 3 and data_gets(before) == [(first.start_position, first.end_position)]
        # The rest of the first block: one GET from the fourth record on, nothing of the next.
        before = len(store.gets)
        rest = await readers.read(0, got[-1].last_offset, end, (per_block - 3) * 1000)
        assert len(rest) == per_block - 3
        fourth = first.start_position + first.block_size_bytes - (per_block - 3) * (33 + 1000)
        assert data_gets(before) == [(fourth, first.end_position)]
        assert readers.blocks.fetched_bytes == first.block_size_bytes + first.end_position - fourth
        # Stopped inside the second block, then on to the end: its start is fetched once.
        more = await readers.read(0, rest[-1].last_offset, end, 1000)
        offset = more[-1].last_offset
        tail: list[StreamRecordBatch] = []
        while offset < end:
            tail += await readers.read(0, offset, end, 2500)
            offset = tail[-1].last_offset
        assert payload_bytes(got + rest + more + tail) == payload_bytes(written.batches[0])
        starts = [a for a, _ in data_gets(0)]
        assert starts.count(second.start_position) == 1
        assert all(starts.count(block.start_position) == 1 for block in blocks)
        await readers.close()
        await readers.blocks.close()
