"""Cold reads: the object read path on an event loop of its own, in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from automq_ref.io.storage.cold_reads import ColdReads, ColdReadsClosed
from automq_ref.io.storage.object_store import (
    CountingReads,
    LocalDirectoryObjectStore,
    NotFound,
    ObjectStore,
)
from tests.storage_fixtures import start_storage
from tests.unit.test_s3stream import PARAMS, WalMedium, payload
from tests.waiting import PATIENCE_S


def _thread() -> str:
    return threading.current_thread().name


class RecordingStore(CountingReads):
    """A store that notes on which thread it was opened, read and closed."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.entered_on: str | None = None
        self.closed_on: str | None = None
        self.read_threads: set[str] = set()
        self.range_reads: list[tuple[str, int, int]] = []
        self.whole_reads = 0

    async def __aenter__(self) -> RecordingStore:
        self.entered_on = _thread()
        return self

    async def get(self, key: str) -> bytes:
        self.read_threads.add(_thread())
        self.whole_reads += 1
        return await super().get(key)

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        self.read_threads.add(_thread())
        self.range_reads.append((key, start, end_exclusive))
        return await super().get_range(key, start, end_exclusive)

    async def close(self) -> None:
        self.closed_on = _thread()
        await super().close()


async def cold_over(tmp_path: Path) -> tuple[ColdReads, list[RecordingStore]]:
    opened: list[RecordingStore] = []

    def open_store() -> ObjectStore:
        opened.append(RecordingStore(LocalDirectoryObjectStore(tmp_path / "objects")))
        return opened[-1]

    return await ColdReads.start(open_store, "cold-reads-test"), opened


async def test_a_coroutine_runs_on_the_cold_thread_and_answers_the_caller(tmp_path: Path) -> None:
    cold, opened = await cold_over(tmp_path)
    try:

        async def where() -> str:
            await asyncio.sleep(0)
            return _thread()

        assert await cold.run(where()) == "cold-reads-test" != _thread()
        assert opened[0].entered_on == "cold-reads-test"  # the store was opened over there

        async def missing() -> bytes:
            return await cold.store.get_range("missing", 0, 1)

        with pytest.raises(NotFound):  # the store's own error reaches the caller
            await cold.run(missing())
    finally:
        await cold.close()
    assert opened[0].closed_on == "cold-reads-test"


async def test_cancelling_the_caller_cancels_the_read_over_there(tmp_path: Path) -> None:
    cold, _ = await cold_over(tmp_path)
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        waiting = asyncio.ensure_future(cold.run(forever()))
        assert await asyncio.to_thread(started.wait, PATIENCE_S)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await asyncio.to_thread(cancelled.wait, PATIENCE_S)
    finally:
        await cold.close()


async def test_close_stops_the_thread_and_refuses_later_reads(tmp_path: Path) -> None:
    cold, _ = await cold_over(tmp_path)
    threads = {thread.name for thread in threading.enumerate()}
    assert "cold-reads-test" in threads
    await cold.close()
    await cold.close()  # again: nothing more to do
    assert "cold-reads-test" not in {thread.name for thread in threading.enumerate()}

    async def anything() -> int:
        return 1

    with pytest.raises(ColdReadsClosed):
        await cold.run(anything())


async def test_storage_reads_objects_on_the_cold_loop_and_closes_it(tmp_path: Path) -> None:
    """S3Storage given cold reads reads objects through their store, on their thread, with
    the same results as reading on its own loop; its shutdown stops them."""
    medium = WalMedium("block", tmp_path)
    store = LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)
    running = await start_storage(tmp_path, await medium.open(1), store, params=PARAMS)
    storage = running.storage
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    written = [payload(stream_id, index) for index in range(120)]
    for data in written:
        await storage.append(stream_id, 0, data, 1)
    await storage.close_stream(stream_id, 0)
    await storage.shutdown()
    await running.metadata_log.close()

    cold, opened = await cold_over(tmp_path)
    running = await start_storage(
        tmp_path,
        await medium.open(2),
        LocalDirectoryObjectStore(tmp_path / "objects", fsync=False),
        params=PARAMS,
        node_epoch=2,
        cold_reads=cold,
    )
    storage = running.storage
    await storage.open_stream(stream_id, 1)
    got: list[bytes] = []
    while len(got) < len(written):
        found = await storage.read(stream_id, len(got), len(written), 900)
        assert found
        got.extend(bytes(batch.payload) for batch in found)
    assert got == written
    cold_store = opened[0]
    assert cold_store.range_reads and cold_store.read_threads == {"cold-reads-test"}
    gets, get_bytes = storage.reads.take()
    assert gets == len(cold_store.range_reads) + cold_store.whole_reads
    assert get_bytes >= sum(len(data) for data in written)
    assert storage.reads.take() == (0, 0)  # taken
    await storage.shutdown()
    await running.metadata_log.close()
    await medium.close()
    assert cold_store.closed_on == "cold-reads-test"
    assert "cold-reads-test" not in {thread.name for thread in threading.enumerate()}
