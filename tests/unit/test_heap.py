"""The heap freezer: what is alive leaves the full collections; a thaw collects what froze."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from automq_ref.io.heap import HeapFreezer, HeapSettings


class Node:
    """An object in a reference cycle (a garbage cycle once nothing else refers to it)."""

    def __init__(self) -> None:
        self.partner: Node | None = None


def old_garbage_cycle() -> weakref.ref[Node]:
    """A cycle that survives a full collection while referenced, so it reaches the old
    generation, and is then dropped: garbage that only a full collection can free."""
    first, second = Node(), Node()
    first.partner, second.partner = second, first
    gc.collect()  # referenced here: both move to the old generation
    return weakref.ref(first)


@pytest.fixture
def thawed_after() -> Iterator[None]:
    """The test process's heap is never left frozen."""
    try:
        yield
    finally:
        gc.unfreeze()


class FakeMonotonic:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.usefixtures("thawed_after")
def test_freeze_leaves_live_objects_out_of_full_collections() -> None:
    freezer = HeapFreezer(HeapSettings(freeze_interval_ms=10, thaw_interval_ms=0))
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    freezer.freeze()
    assert gc.get_freeze_count() > 0
    assert freezer.freezes == 1


@pytest.mark.usefixtures("thawed_after")
def test_a_frozen_garbage_cycle_waits_for_the_thaw() -> None:
    clock = FakeMonotonic()
    freezer = HeapFreezer(
        HeapSettings(freeze_interval_ms=10, thaw_interval_ms=1_000), monotonic_s=clock
    )
    cycle = old_garbage_cycle()
    assert cycle() is not None
    assert freezer.step() is None  # a freeze: the thaw is not due yet
    gc.collect()
    assert cycle() is not None  # frozen: a full collection leaves it
    clock.now_s = 1.0
    thawed = freezer.step()
    assert thawed is not None and thawed.collected >= 2
    assert cycle() is None
    assert (freezer.freezes, freezer.thaws) == (1, 1)
    assert gc.get_freeze_count() > 0  # frozen again after the thaw


@pytest.mark.usefixtures("thawed_after")
def test_young_garbage_cycles_are_freed_before_a_freeze() -> None:
    freezer = HeapFreezer(HeapSettings(freeze_interval_ms=10, thaw_interval_ms=0))
    gc.collect()
    first, second = Node(), Node()
    first.partner, second.partner = second, first
    cycle = weakref.ref(first)
    del first, second
    freezer.freeze()
    assert cycle() is None


@pytest.mark.usefixtures("thawed_after")
async def test_run_forever_freezes_at_once_and_thaws_when_stopped() -> None:
    gc.unfreeze()
    freezer = HeapFreezer(HeapSettings(freeze_interval_ms=5, thaw_interval_ms=0))
    task = asyncio.create_task(freezer.run_forever())
    for _ in range(1000):  # a hang guard, not a timing
        if freezer.freezes >= 3:
            break
        await asyncio.sleep(0.005)
    assert freezer.freezes >= 3 and gc.get_freeze_count() > 0
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert gc.get_freeze_count() == 0


def test_a_freezer_that_never_freezes_is_refused() -> None:
    with pytest.raises(AssertionError):
        HeapFreezer(HeapSettings(freeze_interval_ms=0))
