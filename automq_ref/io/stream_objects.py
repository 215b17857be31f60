"""Writing a cache block's objects, and reading a stream's offsets back from objects.

Upload: a LogCache block's :class:`~automq_ref.state_machines.log_cache.UploadLayout` names one
stream set object (the runs of several streams, in stream id order) and stream objects (one run
each). Each is built with :class:`~automq_ref.formats.object_file.ObjectWriter` and PUT under
AutoMQ's key for its id: ``reverse(hex8(id)) + "/" + namespace + "/" + id`` (the reversed hex
spreads keys over S3 prefixes).

Read: the metadata image says which objects hold ``[start, end)`` of a stream
(``get_objects``); for each, one tail GET usually covers footer and index (a second GET when the
index starts earlier), the index names the blocks to read, and whole blocks are fetched with
ranged GETs and checked against their index entries. Indexes are kept in a small cache keyed by
object id, and data blocks in a byte-bounded least-recently-used cache keyed by (object id, block
position), so a consumer that reads a block in several small fetches GETs it once. These two
classes are the seam where AutoMQ's BlockCache (read windows, watch-based eviction, readahead)
would come in.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from automq_ref.formats.object_file import (
    DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES,
    DataBlockIndex,
    ObjectWriter,
    WrittenObject,
    find,
    parse_data_block,
    parse_footer,
    parse_index,
    slice_index_from_tail,
    tail_read_size,
)
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.object_store import ObjectStore
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.log_cache import CachedRecord, StreamRun, UploadLayout

READAHEAD_BYTES = 4 * 1024 * 1024


class StreamReadError(Exception):
    """Objects named by the metadata do not hold the offsets they should."""


def object_key(namespace: str, object_id: int) -> str:
    return f"{f'{object_id:08x}'[::-1]}/{namespace}/{object_id}"


def _batches(records: Sequence[CachedRecord], runs: Sequence[StreamRun]) -> list[StreamRecordBatch]:
    wanted = {run.stream_id for run in runs}
    chosen = [record for record in records if record.stream_id in wanted]
    chosen.sort(key=lambda record: (record.stream_id, record.base_offset))
    # The stream epoch travels in the commit, not in each object record: AutoMQ writes the
    # writer's epoch into the batch header; the cache record does not carry it, so it is 0 here.
    return [
        StreamRecordBatch(record.stream_id, 0, record.base_offset, record.count, record.payload)
        for record in chosen
    ]


async def upload_layout(
    store: ObjectStore,
    namespace: str,
    layout: UploadLayout,
    records: Sequence[CachedRecord],
    *,
    block_size_threshold_bytes: int = DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES,
) -> dict[int, int]:
    """PUT every object of ``layout`` in parallel; return each object's size in bytes."""
    objects: list[tuple[int, Sequence[StreamRun]]] = [
        (object_id, (run,)) for object_id, run in layout.stream_objects
    ]
    if layout.stream_set_runs:
        objects.append((layout.stream_set_object_id, layout.stream_set_runs))

    def build(runs: Sequence[StreamRun]) -> WrittenObject:
        writer = ObjectWriter(block_size_threshold_bytes)
        for batch in _batches(records, runs):
            writer.write(batch)
        return writer.close()

    async def put(object_id: int, runs: Sequence[StreamRun]) -> tuple[int, int]:
        # Sorting a block's records and encoding them takes long enough (hundreds of ms for a
        # large block) to stall every connection if done on the event loop; in a thread the
        # interpreter switches back to the loop every few milliseconds.
        written = await asyncio.to_thread(build, runs)
        await store.put(object_key(namespace, object_id), written.chunks)
        return object_id, written.size_bytes

    return dict(await asyncio.gather(*(put(object_id, runs) for object_id, runs in objects)))


class ObjectIndexCache:
    """Object id -> its index entries, least recently used out first."""

    def __init__(self, store: ObjectStore, namespace: str, max_objects: int = 1024) -> None:
        self._store = store
        self._namespace = namespace
        self._max_objects = max_objects
        self._indexes: OrderedDict[int, tuple[DataBlockIndex, ...]] = OrderedDict()

    async def get(self, object_id: int, object_size: int) -> tuple[DataBlockIndex, ...]:
        cached = self._indexes.get(object_id)
        if cached is not None:
            self._indexes.move_to_end(object_id)
            return cached
        key = object_key(self._namespace, object_id)
        tail_bytes = tail_read_size(object_size)
        tail = await self._store.get_range(key, object_size - tail_bytes, object_size)
        location = parse_footer(tail, object_size)
        index_bytes = slice_index_from_tail(tail, object_size, location)
        if index_bytes is None:
            index_bytes = memoryview(
                await self._store.get_range(
                    key, location.start_position, location.start_position + location.length_bytes
                )
            )
        indexes = parse_index(index_bytes, index_start_position=location.start_position)
        self._indexes[object_id] = indexes
        if len(self._indexes) > self._max_objects:
            self._indexes.popitem(last=False)
        return indexes


class DataBlockCache:
    """(object id, block start position) -> the block's bytes; least recently used out first,
    never holding more than ``capacity_bytes`` (a block larger than that is not kept)."""

    def __init__(self, store: ObjectStore, namespace: str, capacity_bytes: int) -> None:
        self._store = store
        self._namespace = namespace
        self._capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._size_bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    async def get_many(self, object_id: int, blocks: Sequence[DataBlockIndex]) -> list[bytes]:
        """The bytes of each block; the ones not cached are fetched with one ranged GET per run
        of adjacent blocks (a read and its readahead cost one request)."""
        found: dict[int, bytes] = {}
        run: list[DataBlockIndex] = []
        runs: list[list[DataBlockIndex]] = []
        for block in blocks:
            cached = self._blocks.get((object_id, block.start_position))
            if cached is not None:
                self._blocks.move_to_end((object_id, block.start_position))
                self.hits += 1
                found[block.start_position] = cached
                continue
            if run and run[-1].end_position != block.start_position:
                runs.append(run)
                run = []
            run.append(block)
        if run:
            runs.append(run)
        key = object_key(self._namespace, object_id)
        for adjacent in runs:
            self.misses += len(adjacent)
            data = await self._store.get_range(
                key, adjacent[0].start_position, adjacent[-1].end_position
            )
            view = memoryview(data)
            for block in adjacent:
                offset = block.start_position - adjacent[0].start_position
                # A copy: a cached block must not pin the whole readahead buffer.
                piece = bytes(view[offset : offset + block.end_position - block.start_position])
                found[block.start_position] = piece
                self._remember((object_id, block.start_position), piece)
        return [found[block.start_position] for block in blocks]

    def _remember(self, key: tuple[int, int], data: bytes) -> None:
        if len(data) > self._capacity_bytes or key in self._blocks:
            return
        self._blocks[key] = data
        self._size_bytes += len(data)
        while self._size_bytes > self._capacity_bytes:
            _, evicted = self._blocks.popitem(last=False)
            self._size_bytes -= len(evicted)

    async def get(self, object_id: int, block: DataBlockIndex) -> bytes:
        return (await self.get_many(object_id, [block]))[0]


async def read_from_objects(
    store: ObjectStore,
    namespace: str,
    image: sm.StreamMetadataImage,
    indexes: ObjectIndexCache,
    blocks: DataBlockCache,
    stream_id: int,
    start_offset: int,
    end_offset: int,
    max_bytes: int,
) -> list[StreamRecordBatch]:
    """Batches of ``stream_id`` from ``start_offset``, contiguous, until ``end_offset`` or the
    byte budget is spent (the first batch always counts). Stops early, without error, where the
    image has no object yet (a commit not replayed here yet)."""
    error, slices = sm.get_objects(image, stream_id, start_offset, end_offset, limit=64)
    if error is not sm.StreamErrorCode.NONE:
        raise StreamReadError(f"stream {stream_id} from {start_offset}: {error.value}")
    found: list[StreamRecordBatch] = []
    cursor = start_offset
    budget = max_bytes
    for object_slice in slices:
        if cursor >= end_offset or (found and budget <= 0):
            break
        s3_object = image.objects.get(object_slice.object_id)
        if s3_object is None:
            raise StreamReadError(f"object {object_slice.object_id} is not in the image")
        object_indexes = await indexes.get(object_slice.object_id, s3_object.object_size)
        # Readahead: the blocks past the budget come in the same GET and wait in the cache for
        # the next read of this stream (a consumer reads on from here).
        found_blocks = find(
            object_indexes, stream_id, cursor, end_offset, max(budget, 0) + READAHEAD_BYTES
        )
        if not found_blocks:
            raise StreamReadError(
                f"object {object_slice.object_id} holds no block of stream {stream_id} at {cursor}"
            )
        contents = await blocks.get_many(object_slice.object_id, found_blocks)
        for block, data in zip(found_blocks, contents, strict=True):
            for batch in parse_data_block(data, block):
                if batch.last_offset <= cursor:
                    continue
                if batch.base_offset > cursor:
                    raise StreamReadError(
                        f"stream {stream_id}: gap in object {object_slice.object_id} at {cursor}"
                    )
                if cursor >= end_offset or (found and budget <= 0):
                    return found
                found.append(batch)
                budget -= len(batch.payload)
                cursor = batch.last_offset
    return found
