"""The broker process's heap and CPython's cyclic garbage collector.

A full (generation 2) collection walks every object the collector tracks, and stops the event
loop for all of it. A broker serving 1,000 partitions holds a large, long-lived heap (the
partitions, the metadata image with thousands of object ranges, the caches), and a catch-up
read allocates fast, so full collections come every few seconds and each took 0.1-1.1 s on the
benchmark machine (docs/benchmarks.md, "Catch-up reads beside producers"): one of them sets a
producer's p99.

:class:`HeapFreezer` moves what is alive into the permanent generation (:func:`gc.freeze`),
which later collections leave out, every ``freeze_interval_s``, right after a young
(generation 1) collection has freed the young garbage cycles. Full collections then walk only
what was allocated since the last freeze, and stay short. Frozen objects are still freed by
reference counting when the last reference goes; only a garbage cycle that had reached the old
generation before a freeze outlives it. Every ``thaw_interval_s`` the freezer therefore thaws
the heap (:func:`gc.unfreeze`), runs one full collection, logs what it found, and freezes
again: a bounded leak in between, one full pause per thaw interval instead of one every few
seconds.

It is a process's concern, not a node's: ``automq-ref serve`` runs one for its process
(:func:`automq_ref.node.serve`); brokers started inside a test process do not freeze the
test's heap.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from automq_ref.io.logfmt import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeapSettings:
    """``heap.freeze.interval.ms`` (0: never freeze, collect as CPython does by default) and
    ``heap.thaw.interval.ms`` (0: never thaw)."""

    freeze_interval_ms: int = 5_000
    thaw_interval_ms: int = 600_000


@dataclass(frozen=True, slots=True)
class Thawed:
    """What one thaw found: the garbage cycles a full collection freed, and how long it took."""

    collected: int
    seconds: float


class HeapFreezer:
    """Freezes the process's heap every ``freeze_interval_s``, thaws and collects it in full
    every ``thaw_interval_s`` (module docstring). Steps are plain methods, so tests drive them
    without waiting; :meth:`run_forever` paces them on the event loop."""

    def __init__(
        self, settings: HeapSettings, *, monotonic_s: Callable[[], float] = time.monotonic
    ) -> None:
        assert settings.freeze_interval_ms > 0, "a freezer that never freezes has nothing to do"
        self.freeze_interval_s = settings.freeze_interval_ms / 1000
        self.thaw_interval_s = settings.thaw_interval_ms / 1000
        self._monotonic_s = monotonic_s
        self._last_thaw_s = monotonic_s()
        self.freezes = 0
        self.thaws = 0

    def freeze(self) -> None:
        """Free the young garbage cycles, then freeze every object alive."""
        gc.collect(1)
        gc.freeze()
        self.freezes += 1

    def thaw(self) -> Thawed:
        """Unfreeze, run one full collection, freeze again; what it found."""
        started_s = time.perf_counter()
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        self.thaws += 1
        self._last_thaw_s = self._monotonic_s()
        return Thawed(collected, time.perf_counter() - started_s)

    def step(self) -> Thawed | None:
        """One turn of :meth:`run_forever`: a thaw when one is due, else a freeze."""
        due = self.thaw_interval_s > 0
        if due and self._monotonic_s() - self._last_thaw_s >= self.thaw_interval_s:
            return self.thaw()
        self.freeze()
        return None

    async def run_forever(self) -> None:
        """Freeze once at once (start-up has just built the long-lived state), then a turn
        every ``freeze_interval_s`` until cancelled; the heap is thawed when it stops, so the
        process's later collections see all of it again."""
        try:
            self.freeze()
            while True:
                await asyncio.sleep(self.freeze_interval_s)
                thawed = self.step()
                if thawed is not None:
                    log.info(
                        "heap thawed %s",
                        fields(collected=thawed.collected, seconds=round(thawed.seconds, 3)),
                    )
        finally:
            gc.unfreeze()
