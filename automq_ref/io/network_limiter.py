"""The network bandwidth limiter's shell: awaitable consumes over the NetworkLimiter machine.

:mod:`automq_ref.state_machines.network_limiter` decides who may send or receive how many
bytes; this shell gives it a clock and callers to wait. ``await limiter.consume(size, priority)``
returns once the machine granted the bytes: at once for ``BYPASS`` (the call never suspends),
else when the queue reaches the request. Refills are counted from the clock: every step first
adds the periods (10 ms each) that passed since the last refill, and a refill timer runs on each
event loop that has a request waiting (``call_later``, one period), so waiters are granted as
the tokens come in; with nobody waiting no timer runs, and a late tick loses no refill.
``close()`` fails every waiter with :class:`LimiterClosed`; a consume after it raises the same.

One limiter is shared by traffic on more than one event loop (cold object reads may run on a
loop of their own in another thread while Fetch responses stay on the main one), so the machine
is stepped under a ``threading.Lock`` and a waiter is woken on its own loop
(``call_soon_threadsafe``), whichever thread's step granted it. A waiter cancelled while it
waits withdraws its request; the tokens it held go to the next in line.

Which traffic goes through which bucket, at which priority, is the callers' (``docs/storage.md``,
"Network bandwidth limiter"); :func:`network_limiters` builds the inbound and outbound buckets
from ``s3.network.baseline.bandwidth`` and the mode.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from automq_ref.state_machines import network_limiter as nl
from automq_ref.state_machines.network_limiter import Priority
from automq_ref.state_machines.transition import Transition

REFILL_PERIOD_S = nl.REFILL_PERIOD_MS / 1000


class BandwidthConsumer(Protocol):
    """What a reader needs of a limiter: a wait for its bytes (a :class:`NetworkBandwidthLimiter`,
    or one in another process asked over a connection: ``cold_read_child.py``)."""

    async def consume(self, size_bytes: int, priority: Priority) -> None: ...


class LimiterClosed(Exception):
    """The limiter was closed: nothing it still held, and nothing asked of it later, is
    granted."""


class NetworkBandwidthLimiter:
    """A token bucket that callers on any event loop, in any thread, may consume from."""

    def __init__(
        self,
        params: nl.LimiterParams,
        *,
        name: str = "network",
        refill_period_s: float = REFILL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.params = params
        self.name = name
        self._refill_period_s = refill_period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = nl.initial_state(params)
        self._ids = itertools.count()
        self._waiters: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        self._priorities: dict[int, Priority] = {}  # of the requests not settled yet
        self._started_s = clock()
        self._refilled_periods = 0
        self._ticking: set[asyncio.AbstractEventLoop] = set()  # loops with a tick pending
        # Per priority: the bytes granted, and the requests that had to wait for their grant.
        self.granted_bytes: collections.Counter[Priority] = collections.Counter()
        self.waited: collections.Counter[Priority] = collections.Counter()

    @property
    def tokens(self) -> int:
        """The balance (negative: the debt BYPASS traffic ran into)."""
        return self._state.tokens

    @property
    def waiting(self) -> int:
        return len(self._state.queue)

    async def consume(self, size_bytes: int, priority: Priority) -> None:
        """Return once ``size_bytes`` are granted at ``priority``; BYPASS returns at once."""
        request_id = next(self._ids)
        future: asyncio.Future[None] | None = None
        with self._lock:
            effects = list(self._refill_from_clock().effects)
            transition = self._step(nl.Consume(request_id, size_bytes, priority))
            effects.extend(transition.effects)
            if self._state.waiting(request_id) is not None:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiters[request_id] = (loop, future)
                self.waited[priority] += 1
                self._tick_later(loop)
        self._wake(effects, request_id)
        refusal = transition.rejection
        if refusal is not None:
            if refusal.error is nl.LimiterError.LIMITER_CLOSED:
                raise LimiterClosed(f"the {self.name} bandwidth limiter is closed")
            raise ValueError(f"{self.name} bandwidth limiter: {refusal.message}")
        if future is None:
            return
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                self._waiters.pop(request_id, None)
                withdrawn = self._step(nl.Withdraw(request_id))
            self._wake(withdrawn.effects)
            raise

    def refill(self, periods: int) -> None:
        """Step ``Refill(periods)`` now, whatever the clock says (tests, with a clock that
        stands still)."""
        with self._lock:
            transition = self._step(nl.Refill(periods))
        self._wake(transition.effects)

    def close(self) -> None:
        """Fail every waiter with :class:`LimiterClosed` and refuse what comes later. Closing
        twice does nothing more."""
        with self._lock:
            transition = self._step(nl.Close())
        self._wake(transition.effects)

    def _refill_from_clock(self) -> nl.LimiterTransition:
        """Under the lock: the refills the clock says are due."""
        # Counted from the first clock reading, so that rounding never loses a period.
        elapsed = int((self._clock() - self._started_s) / self._refill_period_s + 1e-9)
        periods, self._refilled_periods = elapsed - self._refilled_periods, elapsed
        if periods <= 0:
            return Transition(self._state)
        return self._step(nl.Refill(periods))

    def _tick_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """Under the lock, on ``loop``'s thread: a tick on ``loop`` in a period (one at most)."""
        if loop not in self._ticking:
            self._ticking.add(loop)
            loop.call_later(self._refill_period_s, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._ticking.discard(loop)
            transition = self._refill_from_clock()
            if not self._state.closed and any(
                waiter_loop is loop and not future.done()
                for waiter_loop, future in self._waiters.values()
            ):
                self._tick_later(loop)
        self._wake(transition.effects)

    def _step(self, event: nl.LimiterEvent) -> nl.LimiterTransition:
        """One step, under the lock."""
        transition = nl.step(self._state, event, self.params)
        if __debug__:  # the invariants that cost nothing (the property test checks them all)
            nl.inv_balance_within_bounds(transition.state, self.params)
            nl.inv_no_idle_tokens(transition.state)
        self._state = transition.state
        if isinstance(event, nl.Consume) and transition.refusal is None:
            self._priorities[event.request_id] = event.priority
        elif isinstance(event, nl.Withdraw):
            self._priorities.pop(event.request_id, None)
        for effect in transition.effects:
            if isinstance(effect, nl.Granted | nl.Failed):
                priority = self._priorities.pop(effect.request_id, None)
                if isinstance(effect, nl.Granted) and priority is not None:
                    self.granted_bytes[priority] += effect.size_bytes
        return transition

    def _wake(self, effects: Iterable[nl.LimiterEffect], own_request: int | None = None) -> None:
        """Settle the futures of the waiters the effects granted or failed, each on its loop."""
        for effect in effects:
            if not isinstance(effect, nl.Granted | nl.Failed) or effect.request_id == own_request:
                continue
            with self._lock:
                waiter = self._waiters.pop(effect.request_id, None)
            if waiter is None:
                continue
            loop, future = waiter
            error = (
                LimiterClosed(f"the {self.name} bandwidth limiter closed while this waited")
                if isinstance(effect, nl.Failed)
                else None
            )
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody is left to wake
                loop.call_soon_threadsafe(_settle, future, error)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


@dataclass(frozen=True)
class NetworkLimiters:
    """The broker's buckets: bytes GET from the object store (``inbound``), and bytes PUT to it
    or sent in Fetch responses (``outbound``); one bucket for both in ``shared`` mode."""

    inbound: NetworkBandwidthLimiter
    outbound: NetworkBandwidthLimiter

    def close(self) -> None:
        self.inbound.close()
        self.outbound.close()


SEPARATE = "separate"
SHARED = "shared"


def network_limiters(bandwidth_bytes_per_s: int, mode: str = SEPARATE) -> NetworkLimiters:
    """AutoMQ's buckets for ``s3.network.baseline.bandwidth``: ``separate``, an inbound bucket
    of at most one second's bandwidth and an outbound one of five; ``shared``, one bucket of
    two seconds' for both directions."""
    if mode == SHARED:
        both = NetworkBandwidthLimiter(
            nl.LimiterParams.for_bandwidth(bandwidth_bytes_per_s, 2 * bandwidth_bytes_per_s),
            name="shared",
        )
        return NetworkLimiters(both, both)
    if mode != SEPARATE:
        raise ValueError(f"unknown network limiter mode {mode!r}: {SEPARATE} or {SHARED}")
    return NetworkLimiters(
        NetworkBandwidthLimiter(
            nl.LimiterParams.for_bandwidth(bandwidth_bytes_per_s, bandwidth_bytes_per_s),
            name="inbound",
        ),
        NetworkBandwidthLimiter(
            nl.LimiterParams.for_bandwidth(bandwidth_bytes_per_s, 5 * bandwidth_bytes_per_s),
            name="outbound",
        ),
    )
