"""Cold reads: reads from objects on an event loop of their own, in a thread of their own.

A broker's one event loop acknowledges produces, answers tail reads from the LogCache and, in a
catch-up, also does the work of every read that misses it: object-store requests (on S3,
aiobotocore signs, hooks and parses each GET), walks of the metadata image for the objects of
a range, block slicing. Measured in a 1,000-partition catch-up, that work held the loop most
of the time, and a produce waited behind it (docs/benchmarks.md, "Catch-up reads beside
producers"). AutoMQ separates the two by thread pool (a fetch first tries the LogCache only,
and one that misses is retried on the slow-read executor, so S3 latency never blocks tail
readers); here the whole object read path (the stream readers, the block cache, the index
cache and a store of its own) lives on a second loop, and the broker's loop only hands it a
read and awaits the answer.

Both loops share the interpreter lock, so the cold loop does not add CPU; what it changes is
who waits: the broker's loop no longer queues a produce's callbacks behind hundreds of GETs'
callbacks, and the interpreter switches threads every few milliseconds
(:func:`sys.getswitchinterval`), so a produce waits for one slice, not for a catch-up's whole
batch of work.

:class:`ObjectReads` is that read path (the counted store, the index and block caches, the
stream readers), on the cold loop when given one, else on the caller's. Thread rules:
everything built over :attr:`ColdReads.store` is used only on the cold loop, through
:meth:`ColdReads.run`; the metadata image it reads from the other thread is immutable
(each replay builds a new one), so reading the view's current image there is safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.network_limiter import BandwidthConsumer, NetworkBandwidthLimiter
from automq_ref.io.storage.block_cache import BlockCacheStats, StreamReaders
from automq_ref.io.storage.cold_read_process import (
    ColdReadProcess,
    ColdReadSettings,
    InChildProcess,
)
from automq_ref.io.storage.object_store import (
    CountingReads,
    ObjectStore,
    RequestShaping,
    ShapedObjectStore,
)
from automq_ref.io.storage.stream_objects import DataBlockCache, ObjectIndexCache
from automq_ref.state_machines import stream_metadata as sm

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio works too
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ColdReadsClosed(Exception):
    """A read handed to cold reads that were closed (the storage is shutting down)."""


class ColdReads:
    """A second event loop in a daemon thread and an object store opened on it.

    Build with :meth:`start`; :meth:`run` runs a coroutine there and awaits it from the
    caller's loop (cancelling the caller cancels it); :meth:`close` closes the store on its loop,
    stops the loop and joins the thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._loop = loop
        self._thread = thread
        self._store: ObjectStore | None = None
        self._closed = False

    @classmethod
    async def start(cls, open_store: Callable[[], ObjectStore], name: str) -> ColdReads:
        """Start the loop's thread (``name``), then open ``open_store()``'s store on it."""
        loop = _new_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        thread = threading.Thread(target=serve, name=name, daemon=True)
        thread.start()
        await asyncio.to_thread(ready.wait)
        cold = cls(loop, thread)

        async def open_on_loop() -> ObjectStore:
            store = open_store()
            await store.__aenter__()
            return store

        try:
            cold._store = await cold._submit(open_on_loop())
        except BaseException:
            await cold.close()
            raise
        return cold

    @property
    def store(self) -> ObjectStore:
        """The store opened on the cold loop: use it there only."""
        assert self._store is not None, "ColdReads.start opens the store"
        return self._store

    @property
    def thread_name(self) -> str:
        return self._thread.name

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the cold loop and return (or raise) what it did."""
        if self._closed:
            coroutine.close()
            raise ColdReadsClosed("reads from objects are closed")
        return await self._submit(coroutine)

    async def _submit(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            coroutine, self._loop
        )
        return await asyncio.wrap_future(future)

    async def close(self) -> None:
        """Close the store on its loop, cancel what still runs there, stop and join. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._store is not None:
            store, self._store = self._store, None
            await self._submit(store.close())
        if self._thread.is_alive():
            await self._submit(_cancel_others())
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)


async def _cancel_others() -> None:
    """Cancel every task on the running loop but this one, and wait for them to end."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class ReadCounts(Protocol):
    """The GETs and bytes the read path's store returned since the last :meth:`take`."""

    gets: int
    get_bytes: int

    def take(self) -> tuple[int, int]: ...


class ObjectReadPath(Protocol):
    """The read path from objects as the storage uses it: :class:`ObjectReads` (on the caller's
    loop, or a cold-read loop) or :class:`ColdReadProcess` (in a child process)."""

    @property
    def counts(self) -> ReadCounts: ...

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]: ...

    def stats(self, *, take_peak: bool = True) -> BlockCacheStats: ...

    async def close(self) -> None: ...


def object_read_path(
    store: ObjectStore,
    namespace: str,
    block_cache_bytes: int,
    image: Callable[[], sm.StreamMetadataImage],
    where: ColdReads | InChildProcess | None,
    *,
    limiter: NetworkBandwidthLimiter | None = None,
    shaping: RequestShaping | None = None,
) -> ObjectReadPath:
    """The read path from objects over ``store`` (or, in a child process, over the store its
    URI names), where ``where`` says: on the caller's loop (None), a cold-read loop, a child."""
    if isinstance(where, InChildProcess):
        settings = ColdReadSettings(
            where.store_uri,
            namespace,
            block_cache_bytes,
            shaping=shaping or RequestShaping(),
            name=where.name,
            niceness=where.niceness,
        )
        return ColdReadProcess(settings, image, limiter)
    return ObjectReads(
        store, namespace, block_cache_bytes, image, where, limiter=limiter, shaping=shaping
    )


class ObjectReads:
    """The read path from objects of one storage: ``store`` counted (``counts``)
    and shaped over that (``shaping``: merged ranged reads, its own in-flight limit), the object
    index cache, the data block cache of ``block_cache_bytes`` and the stream
    readers over ``image``, the block GETs through ``limiter`` (the inbound bucket of the
    network bandwidth limiter, safe from any loop). Given ``cold``, they are built over its
    store and used on its loop only; :meth:`close` closes them and then ``cold`` (which this
    read path owns), and ``store`` too when it ``owns_store``."""

    def __init__(
        self,
        store: ObjectStore,
        namespace: str,
        block_cache_bytes: int,
        image: Callable[[], sm.StreamMetadataImage],
        cold: ColdReads | None = None,
        *,
        limiter: BandwidthConsumer | None = None,
        shaping: RequestShaping | None = None,
        owns_store: bool = False,
    ) -> None:
        self._cold = cold
        self.counts = CountingReads(store if cold is None else cold.store)
        self.shaped = ShapedObjectStore(self.counts, shaping, owns_store=owns_store)
        self.indexes = ObjectIndexCache(self.shaped, namespace)
        self.blocks = DataBlockCache(self.shaped, namespace, block_cache_bytes, limiter=limiter)
        self.readers = StreamReaders(image, self.indexes, self.blocks)

    def stats(self, *, take_peak: bool = True) -> BlockCacheStats:
        """The readers' and caches' :meth:`StreamReaders.stats` (with a cold-read loop, counters
        another thread moves: a snapshot, not a transaction)."""
        return self.readers.stats(take_peak=take_peak)

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """:meth:`StreamReaders.read`, where the readers live."""
        reading = self.readers.read(stream_id, start_offset, end_offset, max_bytes)
        if self._cold is None:
            return await reading
        return await self._cold.run(reading)

    async def close(self) -> None:
        """Close the readers and both caches, then the cold reads, if any."""

        async def close_caches() -> None:
            await self.readers.close()
            await self.indexes.close()
            await self.blocks.close()
            await self.shaped.close()

        if self._cold is None:
            await close_caches()
            return
        try:
            await self._cold.run(close_caches())
        finally:
            await self._cold.close()
