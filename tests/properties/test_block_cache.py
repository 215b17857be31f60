"""BlockCacheMachine: consumers read streams from objects through the stream readers and the
block cache, alone or several at once, while time passes (blocks age out, readers idle out),
the cache is small or large, and consumers jump to other offsets. Every read returns exactly
what a direct read of the objects (nothing cached, nothing kept) returns for the same range and
budget, and the cache never holds more than its capacity."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.storage.block_cache import StreamReaders
from automq_ref.io.storage.stream_objects import (
    DataBlockCache,
    ObjectIndexCache,
    read_from_objects,
)
from tests.block_cache_fixtures import (
    NAMESPACE,
    CountingStore,
    FakeClock,
    WrittenStreams,
    write_streams,
)

CONSUMERS = 4

payload = st.integers(1, 900).map(lambda size: bytes([size % 251]) * size)
segment = st.lists(payload, min_size=1, max_size=30)
streams = st.lists(st.lists(segment, min_size=1, max_size=4), min_size=1, max_size=3)


def shape(batches: list[StreamRecordBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset, b.count, bytes(b.payload)) for b in batches]


class BlockCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = Path(tempfile.mkdtemp(prefix="block-cache-"))
        self.store = CountingStore(self.root)
        self.clock = FakeClock()
        self.readers: StreamReaders | None = None
        self.direct_indexes = ObjectIndexCache(self.store, NAMESPACE)
        self.written: WrittenStreams | None = None
        self.capacity = 0
        # Consumer -> (stream id, next offset).
        self.consumers: list[tuple[int, int]] = []

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @initialize(
        segments=streams,
        block_size=st.integers(100, 2_000),
        capacity=st.one_of(st.sampled_from([0, 3_000, 20_000, 1_000_000]), st.integers(0, 100_000)),
        margin=st.sampled_from([None, 0, 5_000]),
        unit=st.sampled_from([500, 2_000, 8_000]),
    )
    def start(
        self,
        segments: list[list[list[bytes]]],
        block_size: int,
        capacity: int,
        margin: int | None,
        unit: int,
    ) -> None:
        self.written = self.run(write_streams(self.store, segments, block_size_bytes=block_size))
        written = self.written
        self.capacity = capacity
        blocks = DataBlockCache(self.store, NAMESPACE, capacity, clock=self.clock)
        self.readers = StreamReaders(
            lambda: written.image,
            ObjectIndexCache(self.store, NAMESPACE),
            blocks,
            clock=self.clock,
            readahead_margin_bytes=margin,
            readahead_unit_bytes=unit,
            max_readahead_bytes=8 * unit,
        )
        self.consumers = [(number % len(segments), 0) for number in range(CONSUMERS)]

    def end_of(self, stream_id: int) -> int:
        assert self.written is not None
        batches = self.written.batches[stream_id]
        return batches[-1].last_offset if batches else 0

    async def read_one(self, consumer: int, budget: int, end_cut: int) -> None:
        assert self.readers is not None and self.written is not None
        stream_id, offset = self.consumers[consumer]
        end = max(self.end_of(stream_id) - end_cut, offset)
        got = await self.readers.read(stream_id, offset, end, budget)
        if offset >= end:
            assert got == []
            return
        direct = DataBlockCache(self.store, NAMESPACE, capacity_bytes=0)
        try:
            expected = await read_from_objects(
                self.store,
                NAMESPACE,
                self.written.image,
                self.direct_indexes,
                direct,
                stream_id,
                offset,
                end,
                budget,
            )
        finally:
            await direct.close()
        assert shape(got) == shape(expected)
        assert got, "a read below the end returns at least one batch"
        self.consumers[consumer] = (stream_id, got[-1].last_offset)

    @rule(
        consumer=st.integers(0, CONSUMERS - 1),
        budget=st.integers(1, 4_000),
        end_cut=st.integers(0, 3),
    )
    def read(self, consumer: int, budget: int, end_cut: int) -> None:
        self.run(self.read_one(consumer, budget, end_cut))

    @rule(
        chosen=st.sets(st.integers(0, CONSUMERS - 1), min_size=2),
        budget=st.integers(1, 4_000),
    )
    def read_together(self, chosen: set[int], budget: int) -> None:
        async def together() -> None:
            await asyncio.gather(*(self.read_one(c, budget, 0) for c in sorted(chosen)))
            await asyncio.sleep(0)  # let readahead start some GETs

        self.run(together())

    @rule(consumer=st.integers(0, CONSUMERS - 1), data=st.data())
    def seek(self, consumer: int, data: st.DataObject) -> None:
        """The consumer jumps (to the start, to another consumer's position, anywhere)."""
        assert self.written is not None
        stream_id = data.draw(st.integers(0, len(self.written.batches) - 1))
        end = self.end_of(stream_id)
        offsets = [o for s, o in self.consumers if s == stream_id] + [0]
        offset = data.draw(st.one_of(st.sampled_from(offsets), st.integers(0, max(end - 1, 0))))
        self.consumers[consumer] = (stream_id, offset)

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def readahead_lands(self) -> None:
        self.run(asyncio.sleep(0.01))

    @invariant()
    def the_cache_stays_within_its_capacity(self) -> None:
        if self.readers is not None:
            assert 0 <= self.readers.blocks.size_bytes <= self.capacity
            stats = self.readers.stats()
            event(f"readahead: {stats.readahead_gets > 0}")
            event(f"unread blocks evicted: {stats.evicted_unread > 0}")

    def teardown(self) -> None:
        try:
            if self.readers is not None:
                self.run(self.readers.close())
                self.run(self.readers.blocks.close())
                # Nothing in flight, nothing reserved for a readahead any more.
                blocks = self.readers.blocks
                assert blocks.room_bytes == blocks.capacity_bytes - blocks.size_bytes
            self.run(self.store.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)


BlockCacheMachine.TestCase.settings = settings(
    BlockCacheMachine.TestCase.settings, max_examples=100, stateful_step_count=40, deadline=None
)
TestBlockCacheMachine = BlockCacheMachine.TestCase
