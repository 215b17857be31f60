"""Object-store request shaping: ranged reads merged across callers, reads and writes admitted
through limits of their own, reads bounded in time.

:class:`ShapedObjectStore` is an :class:`ObjectStore` over another one (a directory, S3, a
counting wrapper), with the contract unchanged; it shapes the requests the store below sees, as
AutoMQ's object storage layer does.

Theory of operation
-------------------

- **Merged ranged reads.** ``get_range`` does not go to the store at once: the read joins a
  waiting list, and the first read to find the list empty opens a window of
  ``merge_window_ms`` (AutoMQ: 5 ms; here 0 by default, which closes it at the event loop's
  next turn; the wait is the injected ``sleep``). When it closes, the
  list is planned by :func:`~automq_ref.state_machines.read_merging.plan_merged_reads` (per
  object, in start order, while the merged span stays within 4 MiB and at most half of it is
  bytes nobody asked for), each merged read is one GET of the store below, in a task of its
  own, and each caller gets its own slice of the answer. An empty range and ``get`` of a whole
  object are not merged.
- **Errors.** A merged GET that fails fails each of its callers with the store's error, the
  same exception (``NotFound`` stays ``NotFound``: the read retry across a compaction in
  ``s3stream.py`` still sees it). A merged GET that runs past the object's end
  (``RangeNotSatisfiable``) while it serves more than one distinct range is issued again as
  one GET per distinct range, so each caller sees what a direct call of its own would: its
  bytes, or the error carrying the object's size.
- **Read/write isolation.** Reads (``get``, ``get_range``, ``head``, ``list``) and writes
  (``put``, ``put_if_absent``, ``delete``, ``delete_many``) each hold a permit of their own
  limit while the store below runs them, ``max(50, min(25 x CPUs, 1000))`` each by default
  (:func:`default_requests_in_flight`, AutoMQ's): a burst of catch-up GETs waits at the read
  limit and never holds up an upload's PUTs, nor a burst of PUTs the reads. A merged GET takes
  one read permit. (The store below must have room for both: the local store runs reads and
  writes on thread pools of their own, the S3 store's connection pool holds both limits.)
- **Read timeout.** A read the store below has not answered ``read_timeout_ms`` after it got its
  permit (AutoMQ: 2 minutes) fails with :class:`ObjectStoreUnavailable`. The store's own retries
  run inside that time: the S3 store retries with AutoMQ's backoff
  (``s3_object_store.backoff_delay_ms``); a directory does not retry.
- **Cancellation.** A caller cancelled while it waits is dropped from the list, or from its
  merged GET's answer; the GET goes on for the others. :meth:`close` fails the reads still
  waiting, cancels the GETs in flight (their callers get an :class:`ObjectStoreError`) and closes
  the store below if the wrapper owns it.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from automq_ref.io.storage.object_store_contract import (
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    Payload,
    RangeNotSatisfiable,
    check_range,
    validate_key,
)
from automq_ref.state_machines.read_merging import (
    MAX_MERGED_READ_BYTES,
    MAX_MERGED_READ_SPARSITY,
    MergedRead,
    RangeRead,
    member_slice,
    plan_merged_reads,
)

T = TypeVar("T")

# AutoMQ waits 5 ms for reads to merge with. Here the window closes at the loop's next turn by
# default (reads issued together still merge): a Fetch reads its partitions one after another,
# so each of its cache misses would wait the whole window (docs/benchmarks.md, "Merged ranged
# reads": 5 ms cut a catch-up's speed by 4x and merged next to nothing). AutoMQ's read timeout.
AUTOMQ_MERGE_WINDOW_MS = 5.0
MERGE_WINDOW_MS = 0.0
READ_TIMEOUT_MS = 120_000


def default_requests_in_flight(cpus: int | None = None) -> int:
    """AutoMQ's in-flight limit of reads, and separately of writes: max(50, min(25 x CPUs,
    1000)), ``cpus`` the machine's by default."""
    count = (os.cpu_count() or 1) if cpus is None else cpus
    return max(50, min(25 * count, 1000))


@dataclass(frozen=True, slots=True)
class RequestShaping:
    """The knobs of :class:`ShapedObjectStore`, AutoMQ's values by default but the merge window
    (``MERGE_WINDOW_MS``; ``None``: the machine's :func:`default_requests_in_flight`)."""

    merge_window_ms: float = MERGE_WINDOW_MS
    max_merged_bytes: int = MAX_MERGED_READ_BYTES
    max_sparsity: float = MAX_MERGED_READ_SPARSITY
    max_reads_in_flight: int | None = None
    max_writes_in_flight: int | None = None
    read_timeout_ms: float = READ_TIMEOUT_MS


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A caller's ranged read in the waiting list and the future its answer goes to."""

    read: RangeRead
    answer: asyncio.Future[bytes]


class ShapedObjectStore(ObjectStore):
    """``store`` with its requests shaped (module docstring). ``merged_gets`` and
    ``merged_reads`` count the GETs the merging issued and the ranged reads they served."""

    def __init__(
        self,
        store: ObjectStore,
        shaping: RequestShaping | None = None,
        *,
        owns_store: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        shaping = shaping or RequestShaping()
        reads = shaping.max_reads_in_flight or default_requests_in_flight()
        writes = shaping.max_writes_in_flight or default_requests_in_flight()
        if reads < 1 or writes < 1:
            raise ValueError(f"in-flight limits must be positive, not {reads} and {writes}")
        if shaping.merge_window_ms < 0 or shaping.read_timeout_ms <= 0:
            raise ValueError(f"a negative merge window or a non-positive timeout: {shaping}")
        self.store = store
        self.shaping = shaping
        self._owns_store = owns_store
        self._sleep = sleep
        self._reads = asyncio.Semaphore(reads)
        self._writes = asyncio.Semaphore(writes)
        self._waiting: list[_Waiting] = []
        self._window: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.merged_gets = 0
        self.merged_reads = 0

    def __repr__(self) -> str:
        return f"ShapedObjectStore({self.store!r})"

    # -- reads --------------------------------------------------------------------------------

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        check_range(start, end_exclusive)
        validate_key(key)
        self._check_open("get_range", key)
        if start == end_exclusive:
            return await self._read(key, lambda: self.store.get_range(key, start, end_exclusive))
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(RangeRead(key, start, end_exclusive), answer))
        if self._window is None:
            self._window = self._spawn(self._close_window())
        return await answer

    async def get(self, key: str) -> bytes:
        self._check_open("get", key)
        return await self._read(key, lambda: self.store.get(key))

    async def head(self, key: str) -> ObjectInfo:
        self._check_open("head", key)
        return await self._read(key, lambda: self.store.head(key))

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        self._check_open("list", None)
        return await self._read(None, lambda: self.store.list(prefix))

    # -- writes -------------------------------------------------------------------------------

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        self._check_open("put", key)
        async with self._writes:
            return await self.store.put(key, data)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        self._check_open("put_if_absent", key)
        async with self._writes:
            return await self.store.put_if_absent(key, data)

    async def delete(self, key: str) -> None:
        self._check_open("delete", key)
        async with self._writes:
            await self.store.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> None:
        self._check_open("delete_many", None)
        async with self._writes:
            await self.store.delete_many(keys)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        waiting, self._waiting = self._waiting, []
        _fail(waiting, ObjectStoreError(f"{self!r} is closed"))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owns_store:
            await self.store.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _check_open(self, operation: str, key: str | None) -> None:
        if self._closed:
            raise ObjectStoreError(f"{operation}: {self!r} is closed", key=key)

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self, key: str | None, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` (a read of the store below) under a read permit and the read timeout."""
        async with self._reads:
            timer = asyncio.timeout(self.shaping.read_timeout_ms / 1000)
            try:
                async with timer:
                    return await call()
            except TimeoutError as error:
                if not timer.expired():
                    raise
                target = f" {key!r}" if key is not None else ""
                raise ObjectStoreUnavailable(
                    f"read{target}: no answer from {self.store!r} within "
                    f"{self.shaping.read_timeout_ms:.0f} ms",
                    key=key,
                    attempts=1,
                ) from error

    async def _close_window(self) -> None:
        """Wait out the merge window, then issue the waiting reads' merged GETs."""
        try:
            await self._sleep(self.shaping.merge_window_ms / 1000)
        finally:
            self._window = None
        waiting = [entry for entry in self._waiting if not entry.answer.done()]
        self._waiting = []
        plan = plan_merged_reads(
            [entry.read for entry in waiting],
            max_merged_bytes=self.shaping.max_merged_bytes,
            max_sparsity=self.shaping.max_sparsity,
        )
        for merged in plan:
            self._spawn(self._get_merged(merged, [waiting[index] for index in merged.members]))

    async def _get_merged(self, merged: MergedRead, callers: Sequence[_Waiting]) -> None:
        """One GET for ``merged``; each caller gets its slice, or the GET's error."""
        key = merged.key
        try:
            data = await self._read(
                key, lambda: self.store.get_range(key, merged.start, merged.end_exclusive)
            )
        except RangeNotSatisfiable as error:
            distinct = {(entry.read.start, entry.read.end_exclusive) for entry in callers}
            if len(distinct) == 1:
                _fail(callers, error)
            else:  # some callers' ranges may lie inside the object: each range on its own
                await asyncio.gather(*(self._get_alone(group) for group in _by_range(callers)))
            return
        except asyncio.CancelledError:
            _fail(callers, ObjectStoreError(f"{self!r} closed while reading {key!r}", key=key))
            raise
        except Exception as error:
            _fail(callers, error)
            return
        self.merged_gets += 1
        self.merged_reads += len(callers)
        for entry in callers:
            if not entry.answer.done():
                part = member_slice(merged, entry.read)
                whole = part.start == 0 and part.stop == len(data)
                entry.answer.set_result(data if whole else data[part])

    async def _get_alone(self, callers: Sequence[_Waiting]) -> None:
        read = callers[0].read
        alone = MergedRead(
            read.key,
            read.start,
            read.end_exclusive,
            tuple(range(len(callers))),
            read.end_exclusive - read.start,
        )
        await self._get_merged(alone, callers)


def _by_range(callers: Sequence[_Waiting]) -> builtins.list[builtins.list[_Waiting]]:
    groups: dict[tuple[int, int], builtins.list[_Waiting]] = {}
    for entry in callers:
        groups.setdefault((entry.read.start, entry.read.end_exclusive), []).append(entry)
    return builtins.list(groups.values())


def _fail(callers: Iterable[_Waiting], error: BaseException) -> None:
    for entry in callers:
        if not entry.answer.done():
            entry.answer.set_exception(error)
