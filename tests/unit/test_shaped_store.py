"""The shaped object store (``automq_ref/io/storage/shaped_store.py``): ranged reads merged
across callers, reads and writes admitted through limits of their own, the read timeout.

The merge window is held open by a gate (the store's injected ``sleep``), so which reads share a
window is decided by the test, never by the time a step takes. The contract suite runs through
the shaped store too (``test_object_store.py``, backend ``shaped-local``).
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from automq_ref.io.storage.object_store import (
    CountingReads,
    LocalDirectoryObjectStore,
    NotFound,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    Payload,
    RangeNotSatisfiable,
    RequestShaping,
    ShapedObjectStore,
)
from automq_ref.io.storage.shaped_store import default_requests_in_flight
from tests.waiting import PATIENCE_S

KIB = 1024


class Gate:
    """A merge window that closes when the test says: the shaped store's ``sleep``."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waits = 0

    async def sleep(self, seconds: float) -> None:
        self.waits += 1
        await self.opened.wait()


class FakeStore(ObjectStore):
    """Objects in a dict; each call recorded; ranged GETs and puts can be held or failed."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.objects = dict(objects or {})
        self.ranged_gets: builtins.list[tuple[str, int, int]] = []
        self.hold_gets: asyncio.Event | None = None  # GETs wait for it to be set
        self.hold_puts: asyncio.Event | None = None
        self.gets_in_flight = 0
        self.get_error: Exception | None = None
        self.closed = False

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        if self.hold_puts is not None:
            await self.hold_puts.wait()
        body = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else b"".join(data)
        self.objects[key] = body
        return ObjectInfo(key, len(body), "etag")

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        return await self.put(key, data)

    async def get(self, key: str) -> bytes:
        return self.objects[key]

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        self.ranged_gets.append((key, start, end_exclusive))
        self.gets_in_flight += 1
        try:
            if self.hold_gets is not None:
                await self.hold_gets.wait()
            if self.get_error is not None:
                raise self.get_error
            if key not in self.objects:
                raise NotFound(key)
            data = self.objects[key]
            if end_exclusive > len(data):
                raise RangeNotSatisfiable(key, start, end_exclusive, len(data))
            return data[start:end_exclusive]
        finally:
            self.gets_in_flight -= 1

    async def head(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(self.objects[key]), "etag")

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        return [await self.head(key) for key in sorted(self.objects) if key.startswith(prefix)]

    async def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    async def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            await self.delete(key)

    async def close(self) -> None:
        self.closed = True


async def settle() -> None:
    """Let every task that can run, run (no time passes for the merge window: it is gated)."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[CountingReads]:
    async with CountingReads(LocalDirectoryObjectStore(tmp_path / "objects")) as counted:
        yield counted


def shaped_over(store: ObjectStore, gate: Gate | None = None, **shaping: Any) -> ShapedObjectStore:
    """``store`` shaped, its merge window held by ``gate`` (by default one left open)."""
    if gate is None:
        gate = Gate()
        gate.opened.set()
    return ShapedObjectStore(store, RequestShaping(**shaping), owns_store=False, sleep=gate.sleep)


# ---------------------------------------------------------------------------------------------
# Merging


async def test_concurrent_adjacent_reads_share_one_get_over_the_local_store(
    local: CountingReads,
) -> None:
    data = os.urandom(256 * KIB)
    await local.put("objects/1", data)
    gate = Gate()
    shaped = shaped_over(local, gate)
    ranges = [(64 * KIB, 128 * KIB), (0, 64 * KIB), (128 * KIB, 200 * KIB), (10, 20), (0, 64 * KIB)]
    reads = [asyncio.ensure_future(shaped.get_range("objects/1", s, e)) for s, e in ranges]
    await settle()
    assert local.gets == 0, "a read went to the store before its window closed"
    gate.opened.set()
    answers = await asyncio.gather(*reads)
    for (start, end), answer in zip(ranges, answers, strict=True):
        assert answer == await local.store.get_range("objects/1", start, end)
    assert (local.gets, local.get_bytes) == (1, 200 * KIB)
    assert (shaped.merged_gets, shaped.merged_reads) == (1, 5)
    await shaped.close()


async def test_with_the_default_window_reads_issued_together_still_share_a_get(
    local: CountingReads,
) -> None:
    data = os.urandom(64 * KIB)
    await local.put("objects/1", data)
    shaped = ShapedObjectStore(local, owns_store=False)  # window 0: the loop's next turn
    assert shaped.shaping.merge_window_ms == 0
    halves = await asyncio.gather(
        shaped.get_range("objects/1", 0, 32 * KIB),
        shaped.get_range("objects/1", 32 * KIB, 64 * KIB),
    )
    assert b"".join(halves) == data
    assert local.gets == 1
    await shaped.close()


async def test_far_apart_reads_and_reads_of_other_objects_get_their_own_gets(
    local: CountingReads,
) -> None:
    await local.put("objects/1", os.urandom(6 * 1024 * KIB))
    await local.put("objects/2", os.urandom(KIB))
    shaped = shaped_over(local)
    answers = await asyncio.gather(
        shaped.get_range("objects/1", 0, 100),
        shaped.get_range("objects/1", 301, 400),  # 201 of 400 bytes nobody asked for
        shaped.get_range("objects/1", 5 * 1024 * KIB, 5 * 1024 * KIB + 10),  # past 4 MiB
        shaped.get_range("objects/2", 0, 100),
    )
    assert [len(answer) for answer in answers] == [100, 99, 10, 100]
    assert local.gets == 4
    await shaped.close()


async def test_reads_one_after_another_are_not_merged() -> None:
    store = FakeStore({"k": bytes(range(200))})
    shaped = shaped_over(store)
    assert await shaped.get_range("k", 0, 100) == bytes(range(100))
    assert await shaped.get_range("k", 100, 200) == bytes(range(100, 200))
    assert store.ranged_gets == [("k", 0, 100), ("k", 100, 200)]
    await shaped.close()


async def test_a_read_after_the_window_closed_waits_for_the_next_one() -> None:
    store = FakeStore({"k": bytes(range(200))})
    store.hold_gets = asyncio.Event()
    gate = Gate()
    shaped = shaped_over(store, gate)
    first = asyncio.ensure_future(shaped.get_range("k", 0, 100))
    await settle()
    gate.opened.set()
    await settle()
    assert store.ranged_gets == [("k", 0, 100)]
    gate.opened.clear()
    second = asyncio.ensure_future(shaped.get_range("k", 100, 200))
    await settle()
    assert gate.waits == 2 and len(store.ranged_gets) == 1
    gate.opened.set()
    store.hold_gets.set()
    assert list(await asyncio.gather(first, second)) == [bytes(range(100)), bytes(range(100, 200))]
    assert store.ranged_gets == [("k", 0, 100), ("k", 100, 200)]
    await shaped.close()


async def test_an_empty_range_is_not_merged_and_behaves_as_a_direct_call(
    local: CountingReads,
) -> None:
    await local.put("objects/1", b"12345")
    shaped = ShapedObjectStore(local, owns_store=False)
    assert await shaped.get_range("objects/1", 5, 5) == b""
    with pytest.raises(RangeNotSatisfiable):
        await shaped.get_range("objects/1", 6, 6)
    with pytest.raises(NotFound):
        await shaped.get_range("objects/missing", 0, 0)
    with pytest.raises(ValueError):
        await shaped.get_range("objects/1", 3, 2)
    await shaped.close()


# ---------------------------------------------------------------------------------------------
# Errors


async def test_a_failed_merged_get_fails_every_caller_with_the_stores_error() -> None:
    store = FakeStore()
    shaped = shaped_over(store)
    results = await asyncio.gather(
        shaped.get_range("gone", 0, 10), shaped.get_range("gone", 5, 20), return_exceptions=True
    )
    assert len(store.ranged_gets) == 1
    assert all(isinstance(result, NotFound) for result in results), results
    store.objects["k"] = b"x" * 100
    store.get_error = ObjectStoreUnavailable("503s", key="k", attempts=10)
    results = await asyncio.gather(
        shaped.get_range("k", 0, 10), shaped.get_range("k", 10, 20), return_exceptions=True
    )
    assert results[0] is results[1] is store.get_error
    await shaped.close()


async def test_a_merged_get_past_the_object_end_serves_the_ranges_inside_it(
    local: CountingReads,
) -> None:
    data = os.urandom(200)
    await local.put("objects/1", data)
    shaped = shaped_over(local)
    inside, past, past_again = await asyncio.gather(
        shaped.get_range("objects/1", 0, 100),
        shaped.get_range("objects/1", 150, 300),
        shaped.get_range("objects/1", 150, 300),
        return_exceptions=True,
    )
    assert inside == data[:100]
    for error in (past, past_again):
        assert isinstance(error, RangeNotSatisfiable) and error.size_bytes == 200
    # The merged GET failed, then each distinct range had a GET of its own: CountingReads counts
    # the GETs that answered, the inside range's.
    assert local.gets == 1
    await shaped.close()


async def test_a_read_the_store_does_not_answer_times_out() -> None:
    store = FakeStore({"k": b"x" * 100})
    store.hold_gets = asyncio.Event()  # never set
    shaped = shaped_over(store, read_timeout_ms=10)
    results = await asyncio.gather(
        shaped.get_range("k", 0, 10), shaped.get_range("k", 10, 20), return_exceptions=True
    )
    assert all(isinstance(result, ObjectStoreUnavailable) for result in results), results
    assert store.gets_in_flight == 0
    await shaped.close()


async def test_a_cancelled_caller_leaves_the_others_their_answer() -> None:
    store = FakeStore({"k": bytes(range(100))})
    store.hold_gets = asyncio.Event()
    gate = Gate()
    shaped = shaped_over(store, gate)
    waiting_cancelled = asyncio.ensure_future(shaped.get_range("k", 50, 60))
    getting_cancelled = asyncio.ensure_future(shaped.get_range("k", 0, 10))
    kept = asyncio.ensure_future(shaped.get_range("k", 10, 20))
    await settle()
    waiting_cancelled.cancel()
    await settle()
    gate.opened.set()
    await settle()
    assert store.ranged_gets == [("k", 0, 20)]  # the cancelled read is not in it
    getting_cancelled.cancel()
    store.hold_gets.set()
    assert await kept == bytes(range(10, 20))
    assert getting_cancelled.cancelled()
    await shaped.close()


async def test_close_fails_the_waiting_and_the_reading_callers() -> None:
    store = FakeStore({"k": bytes(range(100)), "l": b"y" * 10})
    store.hold_gets = asyncio.Event()
    gate = Gate()
    shaped = ShapedObjectStore(store, sleep=gate.sleep)
    reading = asyncio.ensure_future(shaped.get_range("k", 0, 10))
    await settle()
    gate.opened.set()
    await settle()
    gate.opened.clear()
    waiting = asyncio.ensure_future(shaped.get_range("l", 0, 10))
    await settle()
    await shaped.close()
    for caller in (reading, waiting):
        with pytest.raises(ObjectStoreError):
            await caller
    assert store.closed
    with pytest.raises(ObjectStoreError):
        await shaped.get_range("k", 0, 10)


# ---------------------------------------------------------------------------------------------
# Read/write isolation


async def test_reads_waiting_at_their_limit_do_not_hold_up_a_put() -> None:
    store = FakeStore({f"k{index}": b"x" * 100 for index in range(3)})
    store.hold_gets = asyncio.Event()
    shaped = shaped_over(store, max_reads_in_flight=1, max_writes_in_flight=1)
    reads = [asyncio.ensure_future(shaped.get_range(f"k{index}", 0, 10)) for index in range(3)]
    await settle()
    assert store.gets_in_flight == 1, "the read limit let more than one GET through"
    await asyncio.wait_for(shaped.put("upload", b"data"), PATIENCE_S)
    assert store.objects["upload"] == b"data"
    assert not any(read.done() for read in reads)
    store.hold_gets.set()
    assert await asyncio.gather(*reads) == [b"x" * 10] * 3
    await shaped.close()


async def test_puts_waiting_at_their_limit_do_not_hold_up_a_read() -> None:
    store = FakeStore({"k": b"x" * 100})
    store.hold_puts = asyncio.Event()
    shaped = shaped_over(store, max_reads_in_flight=1, max_writes_in_flight=1)
    puts = [asyncio.ensure_future(shaped.put(f"p{index}", b"data")) for index in range(3)]
    await settle()
    assert await asyncio.wait_for(shaped.get_range("k", 0, 10), PATIENCE_S) == b"x" * 10
    assert await asyncio.wait_for(shaped.head("k"), PATIENCE_S) == ObjectInfo("k", 100, "etag")
    assert not any(put.done() for put in puts)
    store.hold_puts.set()
    await asyncio.gather(*puts)
    await shaped.close()


def test_in_flight_limits_are_automqs() -> None:
    assert [default_requests_in_flight(cpus) for cpus in (1, 2, 4, 16, 40, 64)] == [
        50,
        50,
        100,
        400,
        1000,
        1000,
    ]
    assert default_requests_in_flight() >= 50
