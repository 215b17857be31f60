"""A cache block's objects written, committed through the controller machine, and read back."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from automq_ref.formats.object_file import DataBlockIndex
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.stream_objects import (
    DataBlockCache,
    ObjectIndexCache,
    StreamReadError,
    read_blocks,
    read_from_objects,
    upload_layout,
)
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    NO_OBJECT,
    CommitRange,
    CommitStreamObjectEntry,
)
from automq_ref.vocabulary.naming import object_key

NAMESPACE = "_kafka_test"
PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=10**9, stream_object_split_bytes=3000, capacity_bytes=10**9
)


def payload(stream_id: int, base: int, size: int) -> bytes:
    return bytes([stream_id, base % 256]) * (size // 2)


async def test_block_objects_round_trip_through_metadata(tmp_path: Path) -> None:
    image = sm.EMPTY_IMAGE

    def apply(event: sm.StreamMetadataEvent) -> sm.Response:
        nonlocal image
        transition = sm.step(image, event)
        response = sm.response_of(transition)
        assert response.ok, response
        image = transition.state
        return response

    apply(sm.RegisterNode(1, 1))
    for _ in range(3):
        apply(sm.CreateStream(1, 1))
    for stream_id in range(3):
        apply(sm.OpenStream(1, 1, stream_id, 0))

    # Stream 0 writes a lot (its own stream object); streams 1 and 2 share a stream set object.
    sizes = {0: 400, 1: 100, 2: 60}
    counts = {0: 20, 1: 5, 2: 3}
    cache = lc.LogCacheState()
    appended: dict[int, list[lc.CachedRecord]] = {0: [], 1: [], 2: []}
    wal_offset = 0
    for round_number in range(10):
        for stream_id in range(3):
            if round_number >= counts[stream_id] and stream_id:
                continue
            base = appended[stream_id][-1].end_offset if appended[stream_id] else 0
            wal_offset += 100
            record = lc.CachedRecord(
                stream_id, base, 2, payload(stream_id, base, sizes[stream_id]), wal_offset
            )
            appended[stream_id].append(record)
            cache = lc.step(cache, lc.RecordAppended(record, 0), PARAMS).state
    transition = lc.step(cache, lc.ForceUpload(lc.ALL_STREAMS, 0), PARAMS)
    (prepare,) = transition.effects
    assert isinstance(prepare, lc.PrepareObjects) and prepare.count == 2
    first = apply(sm.PrepareObject(1, 1, prepare.count, 60_000, 0)).first_object_id
    assert first is not None
    transition = lc.step(transition.state, lc.ObjectsPrepared(prepare.block_id, first), PARAMS)
    upload = next(e for e in transition.effects if isinstance(e, lc.UploadBlock))
    layout = upload.layout
    assert [run.stream_id for _, run in layout.stream_objects] == [0]
    assert [run.stream_id for run in layout.stream_set_runs] == [1, 2]

    async with LocalDirectoryObjectStore(tmp_path) as store:
        object_sizes = await upload_layout(
            store, NAMESPACE, layout, upload.records, block_size_threshold_bytes=1000
        )
        apply(
            sm.CommitStreamSetObject(
                1,
                1,
                layout.stream_set_object_id,
                NO_OBJECT,
                object_sizes[layout.stream_set_object_id],
                tuple(
                    CommitRange(run.stream_id, 0, run.start_offset, run.end_offset)
                    for run in layout.stream_set_runs
                ),
                tuple(
                    CommitStreamObjectEntry(
                        object_id,
                        run.stream_id,
                        run.start_offset,
                        run.end_offset,
                        object_sizes[object_id],
                    )
                    for object_id, run in layout.stream_objects
                ),
                (),
                False,
                1,
            )
        )
        indexes = ObjectIndexCache(store, NAMESPACE)
        blocks = DataBlockCache(store, NAMESPACE, 1 << 20)
        for stream_id, records in appended.items():
            end = records[-1].end_offset
            for start in (0, 1, 2, end - 1):
                batches = await read_from_objects(
                    store, NAMESPACE, image, indexes, blocks, stream_id, start, end, 10**9
                )
                expected = [r for r in records if r.end_offset > start]
                assert [(b.base_offset, bytes(b.payload)) for b in batches] == [
                    (r.base_offset, r.payload) for r in expected
                ]
            # A small budget still returns the first batch, and only whole, contiguous batches.
            few = await read_from_objects(
                store, NAMESPACE, image, indexes, blocks, stream_id, 3, end, 1
            )
            assert few[0].base_offset <= 3 < few[0].last_offset
            assert all(a.last_offset == b.base_offset for a, b in itertools.pairwise(few))
        with pytest.raises(StreamReadError, match="OFFSET_NOT_MATCHED"):
            apply(sm.TrimStream(1, 1, 1, 0, 4))
            await read_from_objects(store, NAMESPACE, image, indexes, blocks, 1, 0, 10, 100)


async def test_data_block_cache_gets_a_block_once_and_stays_within_capacity(
    tmp_path: Path,
) -> None:
    async with LocalDirectoryObjectStore(tmp_path) as store:
        await store.put(object_key(NAMESPACE, 7), [bytes(range(256)) * 8])
        first = DataBlockIndex(1, 0, 1, 1, start_position=0, block_size_bytes=400)
        second = DataBlockIndex(1, 1, 1, 1, start_position=400, block_size_bytes=400)
        huge = DataBlockIndex(1, 2, 1, 1, start_position=1024, block_size_bytes=1024)
        blocks = DataBlockCache(store, NAMESPACE, capacity_bytes=600)
        assert await blocks.get(7, first) == (bytes(range(256)) * 4)[:400]
        assert await blocks.get(7, first) == (bytes(range(256)) * 4)[:400]
        assert (blocks.hits, blocks.misses) == (1, 1)
        # A second block does not fit beside the first: the least recently used one goes.
        assert await blocks.get(7, second) == (bytes(range(256)) * 4)[400:800]
        assert blocks.size_bytes == 400
        await blocks.get(7, first)
        assert (blocks.hits, blocks.misses) == (1, 3)
        # A block larger than the whole cache is served but never kept.
        assert len(await blocks.get(7, huge)) == 1024
        assert blocks.size_bytes == 400


async def test_read_blocks_gets_each_run_of_adjacent_blocks_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-shot read a planned reader (the Spark source) uses: the block cache's GETs, one
    per run of adjacent blocks, and nothing kept afterwards."""
    data = bytes(range(256)) * 8
    async with LocalDirectoryObjectStore(tmp_path) as store:
        await store.put(object_key(NAMESPACE, 7), [data])
        first = DataBlockIndex(1, 0, 1, 1, start_position=0, block_size_bytes=400)
        second = DataBlockIndex(1, 1, 1, 1, start_position=400, block_size_bytes=400)
        apart = DataBlockIndex(1, 2, 1, 1, start_position=1024, block_size_bytes=1024)
        gets: list[tuple[int, int]] = []
        get_range = store.get_range

        async def counted(key: str, start: int, end: int) -> bytes:
            gets.append((start, end))
            return await get_range(key, start, end)

        monkeypatch.setattr(store, "get_range", counted)
        contents = await read_blocks(store, NAMESPACE, 7, [first, second, apart])
        assert [bytes(block) for block in contents] == [data[:400], data[400:800], data[1024:]]
        assert sorted(gets) == [(0, 800), (1024, 2048)]
