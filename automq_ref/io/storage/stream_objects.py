"""Writing a cache block's objects, and reading a stream's offsets back from objects.

Upload: a LogCache block's :class:`~automq_ref.state_machines.log_cache.UploadLayout` names one
stream set object (the runs of several streams, in stream id order) and stream objects (one run
each). Each is built with :class:`~automq_ref.formats.object_file.ObjectWriter` and PUT under
AutoMQ's key for its id (:func:`~automq_ref.vocabulary.naming.object_key`).

Read: the metadata image says which objects hold ``[start, end)`` of a stream
(``get_objects``); for each, one tail GET usually covers footer and index (a second GET when the
index starts earlier), the index names the blocks to read, and whole blocks are fetched with
ranged GETs and checked against their index entries. Indexes are kept in a small cache keyed by
object id, and data blocks in a byte-bounded cache keyed by (object id, block position), so a
consumer that reads a block in several small fetches GETs it once. The broker reads through the
stream readers of :mod:`automq_ref.io.storage.block_cache`, which count on the blocks they plan to
read (:meth:`DataBlockCache.watch`): a block all of them have read is freed at once, the others
age out after ``BLOCK_TTL_S`` or, least recently used first, when room is needed.

The reading side is read-only (it needs a metadata image and an object store, nothing of the
node that wrote them), so it is also how the ``automq-objects`` Spark source reads a broker's
objects (:mod:`automq_ref.spark.image`): :class:`ObjectIndexCache` for the indexes its plans are
made of, :func:`read_from_objects` for the MetaStreams it reads whole, and :func:`read_blocks`
(the block cache's fetching, nothing kept) for the planned ranges its executors read.

Readahead of :func:`read_from_objects` (the one-shot reader; the broker's stream readers have
their own, adaptive one): a read from objects is usually a consumer catching up, which will ask
for the next bytes as soon as it has these. So while a read waits for its own blocks, the blocks
that follow (up to ``READAHEAD_BYTES``, across object boundaries once the next object's index is
known) are requested in the background in GETs of at most ``READAHEAD_GET_BYTES``, several in
flight at once, and wait in the block cache; GET latency then overlaps with the consumer's own
work instead of adding to it. Readahead is bounded by half the block cache, shared among the
streams being read (see :meth:`DataBlockCache.read_ahead`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
from automq_ref.io.network_limiter import BandwidthConsumer
from automq_ref.io.storage.object_store import ObjectStore, ObjectStoreError
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.log_cache import CachedRecord, StreamRun, UploadLayout
from automq_ref.state_machines.network_limiter import Priority
from automq_ref.vocabulary.naming import object_key as object_key  # re-exported for callers

log = logging.getLogger(__name__)

# A cached data block: its own bytes, or a read-only slice of the GET that brought it.
Block = bytes | memoryview

# How far past a read's budget its stream's blocks are fetched ahead, and the largest GET that
# readahead issues (so that several are in flight at once).
READAHEAD_BYTES = 32 * 1024 * 1024
READAHEAD_GET_BYTES = 8 * 1024 * 1024
# Streams whose readahead window is remembered (least recently read forgotten first).
MAX_READAHEAD_STREAMS = 4096
# A block nobody accessed for this long is evicted (checked at most once per this period).
BLOCK_TTL_S = 60.0


BlockKey = tuple[int, int]  # (object id, block start position)


class BlockWatcher(Protocol):
    """A reader that plans to read cached blocks (:meth:`DataBlockCache.watch`); told when one
    of them is evicted (for room, or by age) before it read it."""

    def block_evicted(self, key: BlockKey) -> None: ...


class StreamReadError(Exception):
    """Objects named by the metadata do not hold the offsets they should."""


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
    """Object id -> its index entries, least recently used out first.

    The broker's storage keeps one for all its reads; a reader planning from an image (the Spark
    source) keeps one per planning pass, large enough for every object it visits, since a stream
    set object is shared by many partitions. Concurrent gets of one index share its GETs (many
    readers of the streams of one stream set object start together in a catch-up)."""

    def __init__(self, store: ObjectStore, namespace: str, max_objects: int = 1024) -> None:
        self._store = store
        self._namespace = namespace
        self._max_objects = max_objects
        self._indexes: OrderedDict[int, tuple[DataBlockIndex, ...]] = OrderedDict()
        self._fetching: dict[int, asyncio.Task[None]] = {}
        self._loading: dict[int, asyncio.Task[tuple[DataBlockIndex, ...]]] = {}
        # GETs of tails and indexes, and their bytes.
        self.gets = 0
        self.fetched_bytes = 0

    async def get(self, object_id: int, object_size: int) -> tuple[DataBlockIndex, ...]:
        cached = self._indexes.get(object_id)
        if cached is not None:
            self._indexes.move_to_end(object_id)
            return cached
        loading = self._loading.get(object_id)
        if loading is None:
            loading = asyncio.create_task(self._load(object_id, object_size))
            self._loading[object_id] = loading

            def done(task: asyncio.Task[tuple[DataBlockIndex, ...]]) -> None:
                self._loading.pop(object_id, None)
                if not task.cancelled():
                    task.exception()  # retrieved: its getters may all have been cancelled

            loading.add_done_callback(done)
        # Shielded: one getter cancelled does not cancel the GET the others wait for.
        return await asyncio.shield(loading)

    async def _load(self, object_id: int, object_size: int) -> tuple[DataBlockIndex, ...]:
        key = object_key(self._namespace, object_id)
        tail_bytes = tail_read_size(object_size)
        tail = await self._store.get_range(key, object_size - tail_bytes, object_size)
        self.gets += 1
        self.fetched_bytes += len(tail)
        location = parse_footer(tail, object_size)
        index_bytes = slice_index_from_tail(tail, object_size, location)
        if index_bytes is None:
            index_bytes = memoryview(
                await self._store.get_range(
                    key, location.start_position, location.start_position + location.length_bytes
                )
            )
            self.gets += 1
            self.fetched_bytes += len(index_bytes)
        indexes = parse_index(index_bytes, index_start_position=location.start_position)
        self._indexes[object_id] = indexes
        if len(self._indexes) > self._max_objects:
            self._indexes.popitem(last=False)
        return indexes

    def peek(self, object_id: int) -> tuple[DataBlockIndex, ...] | None:
        """The object's index if it is cached (no GET)."""
        return self._indexes.get(object_id)

    def prefetch(self, object_id: int, object_size: int) -> None:
        """Fetch the object's index in the background (once; a failure is only logged)."""
        if object_id in self._indexes or object_id in self._fetching:
            return

        async def fetch() -> None:
            try:
                await self.get(object_id, object_size)
            except Exception as error:  # a read that needs it GETs it again
                log.warning("index prefetch of object %d failed: %s", object_id, error)
            finally:
                self._fetching.pop(object_id, None)

        self._fetching[object_id] = asyncio.create_task(fetch())

    async def close(self) -> None:
        """Cancel the index fetches still in flight."""
        tasks: list[asyncio.Task[Any]] = [*self._fetching.values(), *self._loading.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class ReadOrigin:
    """Where a read found its batches, for a caller that asks (``S3Storage.read``'s ``origin``):
    ``from_objects`` once any came from objects rather than the LogCache (a Fetch answers those
    at the network limiter's CATCH_UP priority, the others at TAIL)."""

    from_objects: bool = False


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """Blocks of ``stream_id`` that a reader will probably want next (see
    :meth:`DataBlockCache.read_ahead`)."""

    stream_id: int
    blocks: Sequence[tuple[int, DataBlockIndex]]  # (object id, block)
    window_bytes: int = READAHEAD_BYTES
    get_bytes: int = READAHEAD_GET_BYTES
    to_the_end: bool = False


class DataBlockCache:
    """(object id, block start position) -> the block's bytes; least recently used out first,
    never holding more than ``capacity_bytes`` (a block larger than that is not kept).

    Blocks being fetched are tracked too, so two readers of one block share one GET. A reader
    may also ask for blocks it will want soon (:meth:`read_ahead`): those GETs run in the
    background, several at once, and their blocks wait in the cache. Readahead is bounded: the
    blocks it has in flight plus those it brought in that nobody has read yet stay within half
    the capacity, shared evenly among the streams that have some, so that readahead does not
    evict what is about to be read and one stream cannot starve the others. A failed readahead
    is forgotten (logged): a later read of its blocks GETs them again.

    Watches ("read counts"): a stream reader (:mod:`automq_ref.io.storage.block_cache`) counts
    on each block it plans to read (:meth:`watch`) and lets go once it has read it
    (:meth:`unwatch`); a block every interested reader has read is freed at once, so the cache
    holds mostly what is still to be read. The other blocks age out: one not accessed for
    ``ttl_s`` is evicted (looked for at most once per ``ttl_s``), and the least recently used
    go when room is needed. A watched block evicted before its readers read it is reported to
    them (:class:`BlockWatcher`), which is how a reader learns its readahead ran too far.

    With a ``limiter`` (the broker's inbound bandwidth limiter) every GET first consumes its
    bytes: a read's own at ``priority`` (BYPASS, as AutoMQ's foreground misses: a Fetch waits
    for them), readahead's at CATCH_UP, so that readahead yields to the rest when the bandwidth
    runs short.
    """

    def __init__(
        self,
        store: ObjectStore,
        namespace: str,
        capacity_bytes: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = BLOCK_TTL_S,
        limiter: BandwidthConsumer | None = None,
        priority: Priority = Priority.BYPASS,
    ) -> None:
        self._store = store
        self._limiter = limiter
        self._priority = priority
        self._namespace = namespace
        self._capacity_bytes = capacity_bytes
        self._clock = clock
        self._ttl_s = ttl_s
        self._last_expiry_s = clock()
        # (object id, position) -> (the block, the id of the GET buffer it is a slice of, when
        # it was last accessed), least recently accessed first.
        self._blocks: OrderedDict[BlockKey, tuple[Block, int, float]] = OrderedDict()
        # Block -> the readers that plan to read it (each counts once); the kept blocks nobody
        # watches, least recently accessed first (evicted before any watched block).
        self._watchers: dict[BlockKey, set[BlockWatcher]] = {}
        self._idle: OrderedDict[BlockKey, None] = OrderedDict()
        # Blocks being fetched for a reader that reads them through at once (not kept, unless
        # another reader watches them by the time they arrive).
        self._passing: dict[BlockKey, BlockWatcher] = {}
        # Bytes of the GETs in flight (room they will take), and what was fetched so far.
        self._loading_bytes = 0
        self._reserved_bytes = 0
        self.gets = 0
        self.fetched_bytes = 0
        self.evicted_unread = 0  # watched blocks evicted before all their readers read them
        # Buffer id -> [its length, how many kept blocks it holds]; size_bytes sums the lengths.
        self._buffers: dict[int, list[int]] = {}
        self._last_buffer_id = 0
        self._size_bytes = 0
        self.peak_bytes = 0  # the largest size_bytes since the last take_peak_bytes
        self._in_flight: dict[tuple[int, int], asyncio.Future[Block]] = {}
        # Readahead's share: bytes in flight for it plus its blocks in the cache not read yet.
        self._unread: dict[tuple[int, int], tuple[int, int]] = {}  # -> (stream id, size)
        self._ahead_bytes = 0
        self._ahead_by_stream: dict[int, int] = {}
        # Stream id -> its readahead window, least recently read first.
        self._windows: OrderedDict[int, int] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.hits = 0
        self.misses = 0
        self.readahead_gets = 0

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def take_peak_bytes(self) -> int:
        """The largest size held since the last call (blocks a read fetches and consumes at
        once may come and go between two samples of ``size_bytes``); it starts again from now."""
        peak, self.peak_bytes = max(self.peak_bytes, self._size_bytes), self._size_bytes
        return peak

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def room_bytes(self) -> int:
        """Capacity neither held by kept blocks nor about to be by the GETs in flight or the
        readaheads about to start them (:meth:`reserve`)."""
        return self._capacity_bytes - self._size_bytes - self._loading_bytes - self._reserved_bytes

    def reserve(self, size_bytes: int) -> None:
        """Count ``size_bytes`` out of the room until released (a negative size): a readahead
        decided on the room it saw, and others deciding before its GETs start must see less."""
        self._reserved_bytes += size_bytes

    def is_cached(self, object_id: int, block: DataBlockIndex) -> bool:
        """Whether a read of ``block`` finds it kept or on its way (no GET of its own)."""
        key = (object_id, block.start_position)
        return key in self._blocks or key in self._in_flight

    def watch(self, object_id: int, block: DataBlockIndex, watcher: BlockWatcher) -> None:
        """``watcher`` plans to read ``block`` (cached or not yet)."""
        key = (object_id, block.start_position)
        self._watchers.setdefault(key, set()).add(watcher)
        self._idle.pop(key, None)

    def unwatch(
        self, object_id: int, block: DataBlockIndex, watcher: BlockWatcher, *, read: bool
    ) -> None:
        """``watcher`` no longer plans to read ``block``; if it ``read`` it and was the last
        reader interested, the block is freed at once."""
        key = (object_id, block.start_position)
        watchers = self._watchers.get(key)
        if watchers is None:
            return
        watchers.discard(watcher)
        if watchers:
            return
        del self._watchers[key]
        if key in self._blocks:
            if read:
                self._drop(key, evicted=False)
            else:
                self._idle[key] = None

    def load(self, object_id: int, blocks: Sequence[DataBlockIndex]) -> list[asyncio.Future[Block]]:
        """Start fetching the ``blocks`` of one object (in position order) that are neither kept
        nor on their way, in GETs of at most ``READAHEAD_GET_BYTES`` (a reader's readahead);
        the futures of all of them, the ones already on their way included."""
        self._expire()
        futures: list[asyncio.Future[Block]] = []
        missing: list[DataBlockIndex] = []
        for block in blocks:
            key = (object_id, block.start_position)
            pending = self._in_flight.get(key)
            if pending is not None:
                futures.append(pending)
            elif key not in self._blocks:
                missing.append(block)
        for run in _adjacent_runs(missing, READAHEAD_GET_BYTES):
            self.readahead_gets += 1
            futures.extend(self._start_get(object_id, run, None, Priority.CATCH_UP))
        return futures

    @property
    def readahead_bytes(self) -> int:
        """Bytes readahead has in flight or waiting unread in the cache."""
        return self._ahead_bytes

    @property
    def readahead_limit_bytes(self) -> int:
        return self._capacity_bytes // 2

    async def get_many(
        self,
        object_id: int,
        blocks: Sequence[DataBlockIndex],
        ahead: ReadAhead | None = None,
        *,
        passing: BlockWatcher | None = None,
        max_get_bytes: int | None = None,
    ) -> list[Block]:
        """The bytes of each block; the ones neither cached nor already being fetched are
        fetched with one ranged GET per run of adjacent blocks, the runs concurrently. The
        readahead ``ahead`` asks for starts once these GETs are on their way, not before (and
        the blocks right after a GET this read waits for anyway come in that GET).

        ``passing``: a reader that reads every block but the last through, at once. Those this
        call fetches are not kept unless another reader watches them when they arrive: they
        would be freed right after the read, and meanwhile take the room of blocks still to be
        read (a catch-up of many streams at once otherwise evicts the blocks its readers are in
        the middle of). ``max_get_bytes`` bounds a GET (a single larger block is one GET)."""
        self._expire()
        found: dict[int, Block] = {}
        waits: list[tuple[DataBlockIndex, asyncio.Future[Block], bool]] = []
        missing: list[DataBlockIndex] = []
        for block in blocks:
            key = (object_id, block.start_position)
            cached = self._blocks.get(key)
            if cached is not None:
                self._blocks[key] = (cached[0], cached[1], self._clock())
                self._blocks.move_to_end(key)
                if key in self._idle:
                    self._idle.move_to_end(key)
                self.hits += 1
                self._mark_read(key)
                found[block.start_position] = cached[0]
                continue
            pending = self._in_flight.get(key)
            if pending is not None:
                self.hits += 1
                waits.append((block, pending, True))
                continue
            missing.append(block)
            if passing is not None and block is not blocks[-1]:
                self._passing[key] = passing
        runs = _adjacent_runs(missing, max_get_bytes)
        if runs and ahead is not None:
            # The reader waits for a GET anyway: the blocks right after it come in the same one,
            # up to a readahead GET's length (one request instead of two).
            last = runs[-1]
            for ahead_object_id, block in ahead.blocks:
                key = (ahead_object_id, block.start_position)
                if (
                    ahead_object_id != object_id
                    or block.start_position != last[-1].end_position
                    or block.end_position - last[0].start_position > ahead.get_bytes
                    or key in self._blocks
                    or key in self._in_flight
                ):
                    break
                last.append(block)
        for run in runs:
            self.misses += len(run)
            futures = self._start_get(object_id, run, None, self._priority)
            waits.extend((block, future, False) for block, future in zip(run, futures, strict=True))
        if ahead is not None:
            self.read_ahead(ahead)
        for block, future, borrowed in waits:
            key = (object_id, block.start_position)
            try:
                # Shielded: a reader that is cancelled must not cancel a GET others share.
                found[block.start_position] = await asyncio.shield(future)
            except ObjectStoreError:
                if not borrowed:
                    raise
                # Someone else's GET (a readahead) failed: try this block once more, ourselves.
                self.misses += 1
                (again,) = self._start_get(object_id, [block], None, self._priority)
                found[block.start_position] = await asyncio.shield(again)
            self._mark_read(key)
        return [found[block.start_position] for block in blocks]

    async def get(self, object_id: int, block: DataBlockIndex) -> Block:
        return (await self.get_many(object_id, [block]))[0]

    async def get_rest(
        self, object_id: int, block: DataBlockIndex, from_position: int
    ) -> tuple[Block, int]:
        """The bytes of ``block`` from ``from_position`` (relative to its start) on, for a
        reader that read the block's first records and let it go, or saw it evicted, and where
        the block starts among the bytes returned (0: the whole block, kept or on its way for
        another reader; else ``from_position``: only the rest was fetched, with one ranged GET,
        and is not kept). A catch-up of many streams stops each read in the middle of a block;
        when the cache cannot keep all those blocks, the next reads fetch only what they lack."""
        self._expire()
        key = (object_id, block.start_position)
        if key in self._blocks or key in self._in_flight:
            return (await self.get_many(object_id, [block]))[0], 0
        first = block.start_position + from_position
        size = block.end_position - first
        self.misses += 1
        self.gets += 1
        self._loading_bytes += size
        try:
            if self._limiter is not None:
                await self._limiter.consume(size, self._priority)
            data = await self._store.get_range(
                object_key(self._namespace, object_id), first, block.end_position
            )
        except ObjectStoreError:
            raise
        except Exception as error:
            raise ObjectStoreError(f"object {object_id} at {first}: {error!r}") from error
        finally:
            self._loading_bytes -= size
        self.fetched_bytes += len(data)
        return data, from_position

    def read_ahead(self, ahead: ReadAhead) -> None:
        """Keep the blocks that follow a read (``ahead.blocks``, in stream order, possibly in
        several objects) coming.

        Each stream has a window, the bytes past its read position it wants fetched or on the
        way: it starts at one GET and doubles with each read (so that streams starting together
        do not leave the last ones nothing), up to ``ahead.window_bytes`` and to an even share
        of readahead's limit among the streams that have readahead in flight or unread in the
        cache (so that none starves the others). GETs are ``ahead.get_bytes`` long (at most the
        window): nothing is asked until a GET's worth of the window is neither cached nor in
        flight; then every such block within the window is, as far as the limit allows. A last
        short GET is left for a later call unless ``ahead.to_the_end`` says nothing follows."""
        if not ahead.blocks:
            return
        limit = self.readahead_limit_bytes
        readers = len(self._ahead_by_stream) + (ahead.stream_id not in self._ahead_by_stream)
        share = limit // readers
        previous = self._windows.pop(ahead.stream_id, None)
        first_window = min(ahead.get_bytes, ahead.window_bytes)
        window = first_window if previous is None else min(2 * previous, ahead.window_bytes)
        self._windows[ahead.stream_id] = window
        if len(self._windows) > MAX_READAHEAD_STREAMS:
            self._windows.popitem(last=False)
        window = max(min(window, share), 1)
        get_bytes = max(min(ahead.get_bytes, window), 1)
        wanted: list[tuple[int, DataBlockIndex]] = []
        room = limit - self._ahead_bytes
        to_the_end = ahead.to_the_end
        distance = 0  # from the read's end to the start of this block
        for object_id, block in ahead.blocks:
            start, distance = distance, distance + block.block_size_bytes
            if distance > window:
                to_the_end = False
                break
            key = (object_id, block.start_position)
            if key in self._blocks or key in self._in_flight:
                continue
            if not wanted and start > window - get_bytes:
                return  # less than a GET's worth is missing from the window: later
            if block.block_size_bytes > room:
                to_the_end = False
                break
            room -= block.block_size_bytes
            wanted.append((object_id, block))
        runs: list[tuple[int, list[DataBlockIndex]]] = []
        for object_id, block in wanted:
            if runs and runs[-1][0] == object_id:
                run = runs[-1][1]
                if (
                    run[-1].end_position == block.start_position
                    and block.end_position - run[0].start_position <= get_bytes
                ):
                    run.append(block)
                    continue
            runs.append((object_id, [block]))
        if len(runs) > 1 and not to_the_end:
            last = runs[-1][1]
            if last[-1].end_position - last[0].start_position < get_bytes:
                runs.pop()
        for object_id, run in runs:
            self.readahead_gets += 1
            self._start_get(object_id, run, ahead.stream_id, Priority.CATCH_UP)

    async def close(self) -> None:
        """Cancel the readahead still in flight."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_get(
        self,
        object_id: int,
        run: Sequence[DataBlockIndex],
        ahead: int | None,
        priority: Priority,
    ) -> list[asyncio.Future[Block]]:
        """GET ``run`` in a task, its bytes consumed at ``priority`` first; ``ahead`` names the
        stream whose readahead this is, if any."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Block]] = []
        for block in run:
            future: asyncio.Future[Block] = loop.create_future()
            self._in_flight[(object_id, block.start_position)] = future
            futures.append(future)
        size = run[-1].end_position - run[0].start_position
        self._loading_bytes += size
        if ahead is not None:
            self._add_ahead(ahead, size)
        task = asyncio.create_task(self._get_run(object_id, run, futures, ahead, size, priority))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return futures

    async def _get_run(
        self,
        object_id: int,
        run: Sequence[DataBlockIndex],
        futures: list[asyncio.Future[Block]],
        ahead: int | None,
        size: int,
        priority: Priority,
    ) -> None:
        first = run[0].start_position
        self.gets += 1
        try:
            if self._limiter is not None:
                await self._limiter.consume(size, priority)
            data = await self._store.get_range(
                object_key(self._namespace, object_id), first, run[-1].end_position
            )
        except BaseException as error:
            self._loading_bytes -= size
            for block in run:
                self._passing.pop((object_id, block.start_position), None)
            if ahead is not None:
                self._add_ahead(ahead, -size)
                if isinstance(error, Exception):
                    log.warning("readahead of object %d at %d failed: %s", object_id, first, error)
            failure = (
                error
                if isinstance(error, ObjectStoreError)
                else ObjectStoreError(f"object {object_id} at {first}: {error!r}")
            )
            for block, future in zip(run, futures, strict=True):
                self._in_flight.pop((object_id, block.start_position), None)
                if not future.done():
                    future.set_exception(failure)
                    future.exception()  # retrieved: nobody may be waiting (readahead)
            if not isinstance(error, Exception):
                raise
            return
        self._loading_bytes -= size
        self.fetched_bytes += len(data)
        view = memoryview(data)
        # Blocks read through at once by the reader that asked (get_many's passing) and watched
        # by no other reader are not kept.
        through: list[bool] = []
        for block in run:
            key = (object_id, block.start_position)
            passer = self._passing.pop(key, None)
            through.append(passer is not None and self._watchers.get(key, set()) <= {passer})
        # The blocks of a GET up to an eighth of the capacity share its buffer (no copy), which
        # the cache charges whole for as long as any of them is kept; a longer GET's blocks are
        # copied, so that one kept block does not pin a large buffer, and so are those of a GET
        # whose other blocks are not kept.
        shared = len(data) <= self._capacity_bytes // 8 and not any(through)
        buffer = self._new_buffer_id()
        for block, future, passed in zip(run, futures, through, strict=True):
            key = (object_id, block.start_position)
            offset = block.start_position - first
            piece: Block = view[offset : offset + block.block_size_bytes]
            if passed:
                kept = False
            elif shared:
                kept = self._remember(key, piece, buffer, len(data))
            else:
                piece = bytes(piece)
                kept = self._remember(key, piece, self._new_buffer_id(), len(piece))
            self._in_flight.pop(key, None)
            if ahead is not None:
                self._add_ahead(ahead, -block.block_size_bytes)
                if kept:
                    self._unread[key] = (ahead, block.block_size_bytes)
                    self._add_ahead(ahead, block.block_size_bytes)
            if not future.done():
                future.set_result(piece)

    def _mark_read(self, key: tuple[int, int]) -> None:
        unread = self._unread.pop(key, None)
        if unread is not None:
            self._add_ahead(unread[0], -unread[1])

    def _add_ahead(self, stream_id: int, delta: int) -> None:
        self._ahead_bytes += delta
        left = self._ahead_by_stream.get(stream_id, 0) + delta
        if left:
            self._ahead_by_stream[stream_id] = left
        else:
            self._ahead_by_stream.pop(stream_id, None)

    def _new_buffer_id(self) -> int:
        self._last_buffer_id += 1
        return self._last_buffer_id

    def _remember(self, key: tuple[int, int], data: Block, buffer: int, buffer_bytes: int) -> bool:
        """Keep ``data``, a slice of buffer ``buffer`` (``buffer_bytes`` long), evicting the least
        recently used blocks while the buffers kept exceed the capacity; False if not kept."""
        if buffer_bytes > self._capacity_bytes or key in self._blocks:
            return False
        held = self._buffers.get(buffer)
        if held is None:
            held = self._buffers[buffer] = [buffer_bytes, 0]
            self._size_bytes += buffer_bytes
            self.peak_bytes = max(self.peak_bytes, self._size_bytes)
        held[1] += 1
        self._blocks[key] = (data, buffer, self._clock())
        if key not in self._watchers:
            self._idle[key] = None
        while self._size_bytes > self._capacity_bytes:
            # Least recently used first, the blocks no reader still plans to read before the
            # others.
            self._drop(next(iter(self._idle or self._blocks)), evicted=True)
        return key in self._blocks

    def _drop(self, key: BlockKey, *, evicted: bool) -> None:
        """Forget a kept block; ``evicted`` (for room or by age, not read by all its readers)
        tells the readers that still planned to read it."""
        _, buffer, _ = self._blocks.pop(key)
        self._idle.pop(key, None)
        self._mark_read(key)
        held = self._buffers[buffer]
        held[1] -= 1
        if held[1] == 0:
            del self._buffers[buffer]
            self._size_bytes -= held[0]
        watchers = self._watchers.get(key)
        if evicted and watchers:
            self.evicted_unread += 1
            for watcher in list(watchers):
                watcher.block_evicted(key)

    def _expire(self) -> None:
        """Evict the blocks not accessed for the TTL, looking at most once per TTL."""
        now = self._clock()
        if now - self._last_expiry_s < self._ttl_s:
            return
        self._last_expiry_s = now
        while self._blocks:
            key, (_, _, accessed_s) = next(iter(self._blocks.items()))
            if now - accessed_s < self._ttl_s:
                break
            self._drop(key, evicted=True)


async def read_blocks(
    store: ObjectStore,
    namespace: str,
    object_id: int,
    blocks: Sequence[DataBlockIndex],
    max_get_bytes: int | None = None,
) -> list[Block]:
    """The bytes of ``blocks`` of one object, fetched once, as a :class:`DataBlockCache` does (one
    ranged GET per run of adjacent blocks, at most ``max_get_bytes`` long, the runs concurrently)
    but kept nowhere: for a reader that reads each block once."""
    cache = DataBlockCache(store, namespace, capacity_bytes=0)
    try:
        return await cache.get_many(object_id, blocks, max_get_bytes=max_get_bytes)
    finally:
        await cache.close()


def _adjacent_runs(
    blocks: Sequence[DataBlockIndex], max_bytes: int | None
) -> list[list[DataBlockIndex]]:
    """``blocks`` (in position order) cut into runs of adjacent blocks, each at most
    ``max_bytes`` long unless a single block is longer."""
    runs: list[list[DataBlockIndex]] = []
    run: list[DataBlockIndex] = []
    for block in blocks:
        if run and (
            run[-1].end_position != block.start_position
            or (max_bytes is not None and block.end_position - run[0].start_position > max_bytes)
        ):
            runs.append(run)
            run = []
        run.append(block)
    if run:
        runs.append(run)
    return runs


def _charged(blocks: Sequence[DataBlockIndex]) -> int:
    """What :func:`find` charged the budget for ``blocks`` (the first block is free)."""
    return sum(block.estimated_payload_size_bytes for block in blocks[1:])


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
    for number, object_slice in enumerate(slices):
        if cursor >= end_offset or (found and budget <= 0):
            break
        s3_object = image.objects.get(object_slice.object_id)
        if s3_object is None:
            raise StreamReadError(f"object {object_slice.object_id} is not in the image")
        object_indexes = await indexes.get(object_slice.object_id, s3_object.object_size)
        found_blocks = find(object_indexes, stream_id, cursor, end_offset, max(budget, 0))
        if not found_blocks:
            raise StreamReadError(
                f"object {object_slice.object_id} holds no block of stream {stream_id} at {cursor}"
            )
        # Readahead: a consumer reads on from here, so the blocks that follow, up to
        # READAHEAD_BYTES past the budget, are fetched in the background while this read waits
        # for its own blocks; the next reads of this stream find them in the cache.
        # Readahead: a consumer reads on from here, so the blocks that follow (in this object
        # and, when the stream's run in it ends, in the next objects whose index is known) are
        # fetched in the background while this read waits for its own blocks; the next reads
        # of the stream find them in the cache.
        window = max(budget, 0) + READAHEAD_BYTES
        in_object = find(object_indexes, stream_id, cursor, end_offset, window)
        ahead = [(object_slice.object_id, block) for block in in_object[len(found_blocks) :]]
        to_the_end = _charged(in_object) < window
        ahead_bytes = sum(block.block_size_bytes for _, block in ahead)
        for next_slice in slices[number + 1 :]:
            if not to_the_end or ahead_bytes >= READAHEAD_BYTES:
                break
            next_object = image.objects.get(next_slice.object_id)
            if next_object is None:
                break
            next_indexes = indexes.peek(next_slice.object_id)
            if next_indexes is None:
                indexes.prefetch(next_slice.object_id, next_object.object_size)
                to_the_end = False
                break
            more = find(
                next_indexes, stream_id, next_slice.start_offset, end_offset, READAHEAD_BYTES
            )
            if not more:
                break
            ahead.extend((next_slice.object_id, block) for block in more)
            ahead_bytes += sum(block.block_size_bytes for block in more)
            to_the_end = _charged(more) < READAHEAD_BYTES
        contents = await blocks.get_many(
            object_slice.object_id,
            found_blocks,
            ReadAhead(
                stream_id,
                ahead,
                window_bytes=READAHEAD_BYTES,
                get_bytes=READAHEAD_GET_BYTES,
                to_the_end=to_the_end,
            ),
        )
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
