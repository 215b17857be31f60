"""The broker's read path from objects: stream readers over the shared data block cache.

A consumer catching up reads a stream sequentially, fetch after fetch, each one starting where
the last one ended. :class:`StreamReaders` keeps, per stream, the readers such reads left
behind, keyed by (stream id, next read offset): the next read of a sequential consumer finds
the reader its last read left, with the block indexes it already loaded; two readers that
reach the same position collapse into one; a reader not used for ``READER_IDLE_S`` is closed
(looked for at most once per ``READER_IDLE_S``, on a read).

A :class:`StreamReader` keeps a window of block indexes (object id, index entry) that starts
at the block holding its next offset and chains forward; it loads more as it goes, the objects
of ``INDEX_OBJECTS_PER_LOAD`` image slices at a time (each object's index through the shared
:class:`~automq_ref.io.storage.stream_objects.ObjectIndexCache`). Every block in its window is
watched in the :class:`~automq_ref.io.storage.stream_objects.DataBlockCache`: once the reader has
read past a block it lets go of it, and a block that every reader interested in it has read is
freed at once. A read must start at the reader's next offset and never runs concurrently with
another read of the same reader (the readers' map hands a reader to one read at a time). A read
picks the blocks its budget probably needs from the index's payload sizes and fetches them; if
they fall short it fetches more. The blocks it reads through are not kept by the cache unless
another reader counts on them (``passing`` of
:meth:`~automq_ref.io.storage.stream_objects.DataBlockCache.get_many`).

A read that stops inside a block (a catch-up's reads end where the consumer's byte limits do,
in the middle of blocks) remembers where in it the next record starts. The cache keeps that
block for the next read, but a catch-up of many streams through a small cache has more such
blocks than room: when the next read finds its block gone, it fetches only the block's rest,
from that record on (:meth:`~automq_ref.io.storage.stream_objects.DataBlockCache.get_rest`),
and counts the rest's bytes, not a share of the block's, towards its budget, so that a read the
rest covers takes no next block it would not reach. Readahead leaves that block to the read.

Readahead is adaptive: it starts at ``READAHEAD_UNIT_BYTES`` and grows by one unit per cache miss
of the reader's own reads since the last readahead, up to ``MAX_READAHEAD_BYTES``. A readahead is
started after a read only when none of the reader's is in flight, the reader has moved past
the start of its last readahead (so it runs at most about two readahead sizes ahead), and the
cache has room for the readahead plus a margin (``READAHEAD_MARGIN_BYTES``, at most a quarter of
the cache). It fetches the blocks from where the last readahead ended (or from the next offset)
for the readahead's size. When one of the reader's unread blocks is evicted (for room or by
age), the reader ran too far ahead for the cache: its readahead goes back to one unit and stops
for ``READAHEAD_COOLDOWN_S``.

Errors are the caller's: a reader whose read fails (an object store error, an object compacted
away and deleted: the store's not-found error) is closed, so a retry starts with a fresh reader
and a fresh window from the image of the moment. :meth:`StreamReaders.stats` sums what the
benchmarks watch: bytes the cache holds, readers open, GETs and bytes fetched from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from automq_ref.formats.object_file import (
    DATA_BLOCK_HEADER_SIZE_BYTES,
    DataBlockIndex,
    find,
    parse_data_block,
    parse_data_block_tail,
)
from automq_ref.formats.stream_record_batch import HEADER_SIZE_BYTES as RECORD_HEADER_SIZE_BYTES
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.storage.stream_objects import (
    Block,
    BlockKey,
    DataBlockCache,
    ObjectIndexCache,
    StreamReadError,
)
from automq_ref.state_machines import stream_metadata as sm

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
READAHEAD_UNIT_BYTES: Final = 512 * 1024
MAX_READAHEAD_BYTES: Final = 32 * MIB
READAHEAD_MARGIN_BYTES: Final = 32 * MIB
READAHEAD_COOLDOWN_S: Final = 60.0
READER_IDLE_S: Final = 60.0
# Image slices (objects) whose indexes a reader loads at a time.
INDEX_OBJECTS_PER_LOAD: Final = 4
# A window never holds more block indexes than this past its next offset (a bound on memory
# for a reader asked for a huge budget).
MAX_WINDOW_BLOCKS: Final = 65_536


@dataclass(frozen=True, slots=True)
class BlockCacheStats:
    """What the read path from objects holds and has fetched: bytes kept in the block cache (now,
    and at most since the last stats), stream readers open, and since start the GETs and bytes
    fetched from the object store (data blocks and indexes), of which readahead GETs; block hits
    and misses of reads; blocks evicted before every reader that planned to read them did."""

    resident_bytes: int
    peak_bytes: int  # the largest resident_bytes since the last stats
    readers: int
    gets: int
    fetched_bytes: int
    readahead_gets: int
    hits: int
    misses: int
    evicted_unread: int


class StreamReader:
    """One sequential reader of one stream (module docstring)."""

    def __init__(self, readers: StreamReaders, stream_id: int, next_offset: int) -> None:
        self._readers = readers
        self._cache = readers.blocks
        self.stream_id = stream_id
        self.next_offset = next_offset
        self.last_access_s = readers.clock()
        # The window: blocks from the one holding next_offset on, each starting at or before
        # the previous one's end; loaded_end is where the next load starts.
        self._window: deque[tuple[int, DataBlockIndex]] = deque()
        self._loaded_end = next_offset
        self._load_lock = asyncio.Lock()
        self._end = next_offset  # the end of the latest read: readahead stays below it
        self.readahead_bytes = readers.readahead_unit_bytes
        self._next_readahead_offset = next_offset
        self._readahead_mark = -1
        self._misses = 0
        self._cooldown_until_s = float("-inf")
        self._readahead: asyncio.Task[None] | None = None
        self._reserved = 0  # room counted out for the readahead until its GETs start
        # Where the last read stopped inside a block: (block, position of the next record in
        # it, that record's offset); the next read fetches only the rest if the block is gone.
        self._resume: tuple[BlockKey, int, int] | None = None
        self.closed = False

    # ------------------------------------------------------------------------------ reads

    async def read(self, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        if start != self.next_offset:
            raise ValueError(
                f"stream {self.stream_id}: read at {start}, reader at {self.next_offset}"
            )
        self.last_access_s = self._readers.clock()
        self._end = max(self._end, end)
        found: list[StreamRecordBatch] = []
        budget = max_bytes
        # Rounds: each fetches the blocks the rest of the budget probably needs (estimated from
        # the index), and the next continues if the estimate fell short.
        while self.next_offset < end and (not found or budget > 0):
            chosen, complete = self._gather(end, budget)
            while not complete and await self._load_more(end):
                chosen, complete = self._gather(end, budget)
            if not chosen:
                break
            self._misses += sum(
                not self._cache.is_cached(object_id, block) for object_id, block in chosen
            )
            parts = await self._fetch(chosen)
            budget, stopped = self._slice(parts, end, budget, found)
            self._release_read()
            if stopped or self.next_offset < chosen[-1][1].end_offset:
                break
        self._maybe_read_ahead()
        return found

    def _gather(self, end: int, budget: int) -> tuple[list[tuple[int, DataBlockIndex]], bool]:
        """The window's blocks a read of [next offset, ``end``) with ``budget`` bytes probably
        needs, from the index's payload sizes (the first block's share past the next offset by
        its offsets), and whether that is all the read needs (else the window must load more).
        Too few are followed by another round; too many cost a block read ahead."""
        chosen: list[tuple[int, DataBlockIndex]] = []
        for object_id, block in self._window:
            if chosen and (budget <= 0 or block.start_offset >= end):
                return chosen, True
            payload = block.estimated_payload_size_bytes
            if not chosen:
                resume = self._resume_position(object_id, block)
                if resume is not None:
                    # The bytes from the record the last read stopped at to the block's end,
                    # less one record's header: at least the payload left (so a read that the
                    # block's rest covers does not also take the next block).
                    payload = block.block_size_bytes - resume - RECORD_HEADER_SIZE_BYTES
                else:
                    span = max(block.end_offset - block.start_offset, 1)
                    payload = payload * (block.end_offset - self.next_offset) // span
            budget -= payload
            chosen.append((object_id, block))
            if block.end_offset >= end:
                return chosen, True
        return chosen, False

    def _resume_position(self, object_id: int, block: DataBlockIndex) -> int | None:
        """Where in ``block`` the record at the next offset starts, if the last read stopped
        there."""
        resume = self._resume
        if resume is None or resume[0] != (object_id, block.start_position):
            return None
        return resume[1] if resume[2] == self.next_offset else None

    async def _fetch(
        self, chosen: Sequence[tuple[int, DataBlockIndex]]
    ) -> list[tuple[int, DataBlockIndex, Block, int]]:
        """The bytes of the ``chosen`` blocks, as (object id, block, bytes, where the block starts
        among them): the blocks of one object in one call to the cache, the objects at once.
        The first block, when it is the one the last read stopped inside and the cache holds
        it no longer, is fetched from that record on (:meth:`DataBlockCache.get_rest`)."""
        rest: Awaitable[tuple[Block, int]] | None = None
        first_id, first = chosen[0]
        resume = self._resume_position(first_id, first)
        if resume is not None and not self._cache.is_cached(first_id, first):
            rest = self._cache.get_rest(first_id, first, resume)
            chosen = chosen[1:]
        groups = [
            (object_id, [block for _, block in group])
            for object_id, group in itertools.groupby(chosen, key=lambda item: item[0])
        ]
        calls: list[Awaitable[Any]] = [
            self._cache.get_many(object_id, blocks, passing=self) for object_id, blocks in groups
        ]
        if rest is not None:
            calls.insert(0, rest)
        contents = await asyncio.gather(*calls)
        parts: list[tuple[int, DataBlockIndex, Block, int]] = []
        if rest is not None:
            data, at = contents.pop(0)
            parts.append((first_id, first, data, at))
        for (object_id, blocks), datas in zip(groups, contents, strict=True):
            parts.extend(
                (object_id, block, data, 0) for block, data in zip(blocks, datas, strict=True)
            )
        return parts

    def _slice(
        self,
        parts: Sequence[tuple[int, DataBlockIndex, Block, int]],
        end: int,
        budget: int,
        found: list[StreamRecordBatch],
    ) -> tuple[int, bool]:
        """Append to ``found`` the batches of the blocks read from the next offset on, while
        the read wants more (the first batch always counts); advance the next offset, and
        remember where in its block the next record starts when that is inside one. The
        budget left, and whether the read is complete."""
        self._resume = None
        for object_id, block, data, at in parts:
            if at:
                batches = parse_data_block_tail(data, block, at, self.next_offset)
                position = at
            else:
                batches = parse_data_block(data, block)
                position = DATA_BLOCK_HEADER_SIZE_BYTES
            for batch in batches:
                batch_position = position
                position += RECORD_HEADER_SIZE_BYTES + len(batch.payload)
                if batch.last_offset <= self.next_offset:
                    continue
                if batch.base_offset > self.next_offset:
                    raise StreamReadError(
                        f"stream {self.stream_id}: gap in object {object_id} at {self.next_offset}"
                    )
                if self.next_offset >= end or (found and budget <= 0):
                    self._resume = (
                        (object_id, block.start_position),
                        batch_position,
                        self.next_offset,
                    )
                    return budget, True
                found.append(batch)
                budget -= len(batch.payload)
                self.next_offset = batch.last_offset
        return budget, self.next_offset >= end or (bool(found) and budget <= 0)

    def _release_read(self) -> None:
        """Let go of the blocks read past: the cache frees those nobody else plans to read."""
        while self._window and self._window[0][1].end_offset <= self.next_offset:
            object_id, block = self._window.popleft()
            self._cache.unwatch(object_id, block, self, read=True)

    async def _load_more(self, end: int) -> bool:
        """Load the indexes of the next objects into the window (up to ``end``); False when
        there is nothing more (the image ends there, for now)."""
        async with self._load_lock:
            if self.closed or self._loaded_end >= end or len(self._window) >= MAX_WINDOW_BLOCKS:
                return False
            cursor = self._loaded_end
            image, index = self._readers.current()
            error, slices = sm.get_objects(
                image, self.stream_id, cursor, end, limit=INDEX_OBJECTS_PER_LOAD, index=index
            )
            if error is not sm.StreamErrorCode.NONE:
                raise StreamReadError(f"stream {self.stream_id} from {cursor}: {error.value}")
            loaded: list[tuple[int, DataBlockIndex]] = []
            for object_slice in slices:
                s3_object = image.objects.get(object_slice.object_id)
                if s3_object is None:
                    raise StreamReadError(f"object {object_slice.object_id} is not in the image")
                indexes = await self._readers.indexes.get(
                    object_slice.object_id, s3_object.object_size
                )
                blocks = find(indexes, self.stream_id, cursor, object_slice.end_offset, 1 << 62)
                if not blocks:
                    raise StreamReadError(
                        f"object {object_slice.object_id} holds no block of stream "
                        f"{self.stream_id} at {cursor}"
                    )
                loaded.extend((object_slice.object_id, block) for block in blocks)
                cursor = blocks[-1].end_offset
            if self.closed or not loaded:
                return False
            for object_id, block in loaded:
                self._cache.watch(object_id, block, self)
            self._window.extend(loaded)
            self._loaded_end = cursor
            return True

    # -------------------------------------------------------------------------- readahead

    def _maybe_read_ahead(self) -> None:
        if self._readahead is not None and not self._readahead.done():
            return
        if self._readers.clock() < self._cooldown_until_s:
            return
        if self.next_offset <= self._readahead_mark:
            return
        unit = self._readers.readahead_unit_bytes
        size = min(self.readahead_bytes + self._misses * unit, self._readers.max_readahead_bytes)
        if self._cache.room_bytes < size + self._readers.readahead_margin_bytes:
            return
        start = max(self.next_offset, self._next_readahead_offset)
        if start >= self._end:
            return
        self.readahead_bytes = size
        self._misses = 0
        self._readahead_mark = start
        self._reserved = size
        self._cache.reserve(size)
        self._readahead = asyncio.create_task(self._read_ahead(start, size))
        # Also when cancelled before it ran.
        self._readahead.add_done_callback(lambda _: self._release_reservation())

    def _release_reservation(self) -> None:
        self._cache.reserve(-self._reserved)
        self._reserved = 0

    async def _read_ahead(self, start: int, size: int) -> None:
        try:
            blocks, complete = self._ahead_blocks(start, size)
            while not complete and await self._load_more(self._end):
                blocks, complete = self._ahead_blocks(start, size)
            if not blocks or self.closed:
                return
            self._next_readahead_offset = blocks[-1][1].end_offset
            futures: list[asyncio.Future[Block]] = []
            # The GETs' bytes count out of the cache's room from here on.
            self._release_reservation()
            for object_id, group in itertools.groupby(blocks, key=lambda item: item[0]):
                futures.extend(self._cache.load(object_id, [block for _, block in group]))
            outcomes = await asyncio.gather(
                *(asyncio.shield(future) for future in futures), return_exceptions=True
            )
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                raise failures[0]
        except Exception as error:  # the reads that need these blocks GET them again
            log.warning("stream %d: readahead from %d failed: %s", self.stream_id, start, error)

    def _ahead_blocks(self, start: int, size: int) -> tuple[list[tuple[int, DataBlockIndex]], bool]:
        chosen: list[tuple[int, DataBlockIndex]] = []
        total = 0
        for object_id, block in self._window:
            # Not the block the reader is inside: what it lacks of it, the next read fetches.
            if block.end_offset <= start or block.start_offset < self.next_offset:
                continue
            if block.start_offset >= self._end or total >= size:
                return chosen, True
            chosen.append((object_id, block))
            total += block.block_size_bytes
        return chosen, total >= size

    def block_evicted(self, key: BlockKey) -> None:
        """One of this reader's unread blocks was evicted: readahead ran too far for the cache,
        so it starts again from one unit, after a pause."""
        del key
        self.readahead_bytes = self._readers.readahead_unit_bytes
        self._misses = 0
        self._cooldown_until_s = self._readers.clock() + READAHEAD_COOLDOWN_S

    # ------------------------------------------------------------------------------ close

    @property
    def readahead_task(self) -> asyncio.Task[None] | None:
        """The readahead in flight or last run, if any."""
        return self._readahead

    def close(self) -> None:
        """Stop the readahead and let go of the window (its blocks age out)."""
        if self.closed:
            return
        self.closed = True
        if self._readahead is not None:
            self._readahead.cancel()
        for object_id, block in self._window:
            self._cache.unwatch(object_id, block, self, read=False)
        self._window.clear()

    async def wait_closed(self) -> None:
        if self._readahead is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(self._readahead, return_exceptions=True)


class _ByStream(Mapping[int, Collection[sm.ObjectSlice]]):
    """A read-only view of :class:`StreamSetIndexer`'s slices, by stream."""

    def __init__(self, by_stream: dict[int, dict[int, sm.ObjectSlice]]) -> None:
        self._by_stream = by_stream

    def __getitem__(self, stream_id: int) -> Collection[sm.ObjectSlice]:
        return self._by_stream[stream_id].values()

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_stream)

    def __len__(self) -> int:
        return len(self._by_stream)


class StreamSetIndexer:
    """``sm.stream_set_index`` of the image asked about, kept up to date from one image to the
    next by the stream set objects that came and went (committed, compacted away), not built
    again: a catch-up looks up a thousand streams in each image, an image comes with each
    commit, and a walk of every range of every stream set object for each lookup held the
    read path's thread most of a catch-up. Answers the pure index's slices, in another order
    within a stream (``get_objects`` sorts them by offset). Used from one thread."""

    def __init__(self) -> None:
        self._nodes: Mapping[int, sm.NodeMetadata] | None = None
        self._objects: dict[int, sm.StreamSetObject] = {}
        self._by_stream: dict[int, dict[int, sm.ObjectSlice]] = {}
        self._view = _ByStream(self._by_stream)

    def index(self, image: sm.StreamMetadataImage) -> sm.StreamSetIndex:
        if image.nodes is not self._nodes:
            current = {
                object_id: stream_set_object
                for node in image.nodes.values()
                for object_id, stream_set_object in node.stream_set_objects.items()
            }
            for object_id, stream_set_object in self._objects.items():
                if current.get(object_id) is not stream_set_object:
                    self._forget(stream_set_object)
            for object_id, stream_set_object in current.items():
                if self._objects.get(object_id) is not stream_set_object:
                    self._add(stream_set_object)
            self._objects = current
            self._nodes = image.nodes
        return self._view

    def _add(self, stream_set_object: sm.StreamSetObject) -> None:
        for stream_id, object_slice in sm.stream_set_slices(stream_set_object):
            self._by_stream.setdefault(stream_id, {})[object_slice.object_id] = object_slice

    def _forget(self, stream_set_object: sm.StreamSetObject) -> None:
        for offset_range in stream_set_object.ranges:
            slices = self._by_stream.get(offset_range.stream_id)
            if slices is not None:
                slices.pop(stream_set_object.object_id, None)
                if not slices:
                    del self._by_stream[offset_range.stream_id]


class StreamReaders:
    """The stream readers of one broker's storage, keyed by (stream id, next offset)."""

    def __init__(
        self,
        image: Callable[[], sm.StreamMetadataImage],
        indexes: ObjectIndexCache,
        blocks: DataBlockCache,
        *,
        clock: Callable[[], float] = time.monotonic,
        readahead_margin_bytes: int | None = None,
        readahead_unit_bytes: int = READAHEAD_UNIT_BYTES,
        max_readahead_bytes: int = MAX_READAHEAD_BYTES,
    ) -> None:
        """``readahead_margin_bytes`` defaults to ``READAHEAD_MARGIN_BYTES``, at most a quarter
        of the cache; tests shrink the readahead sizes to the scale of their streams."""
        self.image = image
        self.readahead_unit_bytes = readahead_unit_bytes
        self.max_readahead_bytes = max_readahead_bytes
        self.indexes = indexes
        self.blocks = blocks
        self.clock = clock
        self.readahead_margin_bytes = (
            min(READAHEAD_MARGIN_BYTES, blocks.capacity_bytes // 4)
            if readahead_margin_bytes is None
            else readahead_margin_bytes
        )
        self._readers: dict[tuple[int, int], StreamReader] = {}
        self._reading: set[StreamReader] = set()
        self._last_sweep_s = clock()
        self._index = StreamSetIndexer()
        self._closing: set[StreamReader] = set()

    def current(self) -> tuple[sm.StreamMetadataImage, sm.StreamSetIndex]:
        """The current image and its stream set objects by stream (:class:`StreamSetIndexer`)."""
        image = self.image()
        return image, self._index.index(image)

    def __len__(self) -> int:
        """Readers open: waiting for their next read, or reading."""
        return len(self._readers) + len(self._reading)

    def reader(self, stream_id: int, offset: int) -> StreamReader | None:
        """The reader waiting at ``offset`` of ``stream_id``, if any."""
        return self._readers.get((stream_id, offset))

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Batches of ``stream_id`` from ``start_offset``, contiguous, until ``end_offset`` or the
        byte budget is spent (the first batch always counts), read from objects. Stops early,
        without error, where the image has no object yet (a commit not replayed here yet)."""
        self._sweep()
        reader = self._readers.pop((stream_id, start_offset), None)
        if reader is None:
            reader = StreamReader(self, stream_id, start_offset)
        self._reading.add(reader)
        try:
            found = await reader.read(start_offset, end_offset, max_bytes)
        except BaseException:
            self._close(reader)
            raise
        finally:
            self._reading.discard(reader)
        key = (stream_id, reader.next_offset)
        if key in self._readers or reader.closed:
            self._close(reader)  # another reader is already there: one is enough
        else:
            self._readers[key] = reader
        return found

    def stats(self, *, take_peak: bool = True) -> BlockCacheStats:
        """``take_peak``: the peak starts again from now (the storage log's samples); False
        (a metrics scrape) leaves it to them."""
        blocks = self.blocks
        return BlockCacheStats(
            resident_bytes=blocks.size_bytes,
            peak_bytes=blocks.take_peak_bytes()
            if take_peak
            else max(blocks.peak_bytes, blocks.size_bytes),
            readers=len(self),
            gets=self.blocks.gets + self.indexes.gets,
            fetched_bytes=self.blocks.fetched_bytes + self.indexes.fetched_bytes,
            readahead_gets=self.blocks.readahead_gets,
            hits=self.blocks.hits,
            misses=self.blocks.misses,
            evicted_unread=self.blocks.evicted_unread,
        )

    def _sweep(self) -> None:
        now = self.clock()
        if now - self._last_sweep_s < READER_IDLE_S:
            return
        self._last_sweep_s = now
        for key, reader in list(self._readers.items()):
            if now - reader.last_access_s >= READER_IDLE_S:
                del self._readers[key]
                self._close(reader)

    def _close(self, reader: StreamReader) -> None:
        reader.close()
        task = reader.readahead_task
        if task is not None and not task.done():
            self._closing.add(reader)
            task.add_done_callback(lambda _: self._closing.discard(reader))

    async def close(self) -> None:
        """Close every reader and wait for their readahead to stop."""
        readers = [*self._readers.values(), *self._reading, *self._closing]
        self._readers.clear()
        for reader in readers:
            reader.close()
        await asyncio.gather(*(reader.wait_closed() for reader in readers))
