"""The network bandwidth limiter's shell: waiting by priority, BYPASS that never suspends, close,
cancellation, the refill timer, and waiters on two event loops in two threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import pytest

from automq_ref.config import ConfigError, load_config
from automq_ref.io.network_limiter import (
    LimiterClosed,
    NetworkBandwidthLimiter,
    network_limiters,
)
from automq_ref.state_machines.network_limiter import LimiterParams, Priority

PARAMS = LimiterParams(max_tokens=100, refill_tokens=10, chunk_bytes=16)
WAIT_S = 30.0  # a bound on waiting for another thread, never a measurement


def drained() -> NetworkBandwidthLimiter:
    """A limiter whose balance is 0 and whose clock stands still: only the test refills it."""
    limiter = NetworkBandwidthLimiter(PARAMS, clock=lambda: 0.0)
    run_at_once(limiter.consume(PARAMS.max_tokens, Priority.BYPASS))
    assert limiter.tokens == 0
    return limiter


def run_at_once(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` to its end without an event loop: it must never suspend."""
    with pytest.raises(StopIteration):
        coroutine.send(None)


async def until(condition: Any) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_under_contention_the_queue_is_served_by_priority_then_arrival() -> None:
    limiter = drained()
    done: list[str] = []

    async def consume(name: str, priority: Priority) -> None:
        await limiter.consume(10, priority)
        done.append(name)

    asked = [
        ("catch-up", Priority.CATCH_UP),
        ("tail-1", Priority.TAIL),
        ("compaction", Priority.COMPACTION),
        ("tail-2", Priority.TAIL),
    ]
    tasks = [asyncio.create_task(consume(name, priority)) for name, priority in asked]
    await until(lambda: limiter.waiting == 4)
    for expected in range(1, 5):
        limiter.refill(1)  # 10 tokens: one request's worth
        await until(lambda: len(done) == expected)  # noqa: B023
        assert limiter.waiting == 4 - expected
    await asyncio.gather(*tasks)
    assert done == ["compaction", "tail-1", "tail-2", "catch-up"]
    assert limiter.waited == {
        Priority.CATCH_UP: 1,
        Priority.TAIL: 2,
        Priority.COMPACTION: 1,
    }
    assert limiter.granted_bytes[Priority.TAIL] == 20


async def test_bypass_never_waits_even_deep_in_debt_and_behind_waiters() -> None:
    limiter = drained()
    waiter = asyncio.create_task(limiter.consume(50, Priority.CATCH_UP))
    await until(lambda: limiter.waiting == 1)
    for _ in range(3):
        run_at_once(limiter.consume(10**9, Priority.BYPASS))
    assert limiter.tokens == -PARAMS.max_tokens and limiter.waited[Priority.BYPASS] == 0
    # The debt is paid before the waiter goes: 140 tokens pay the 100 of debt and 40 of its 50.
    limiter.refill(14)
    await asyncio.sleep(0)
    assert not waiter.done() and limiter.tokens == 0
    limiter.refill(1)
    await asyncio.wait_for(waiter, WAIT_S)


async def test_close_fails_the_waiters_and_refuses_what_comes_later() -> None:
    limiter = drained()
    waiters = [asyncio.create_task(limiter.consume(10**6, p)) for p in (Priority.TAIL,) * 2]
    await until(lambda: limiter.waiting == 2)
    limiter.close()
    for waiter in waiters:
        with pytest.raises(LimiterClosed, match="closed while this waited"):
            await asyncio.wait_for(waiter, WAIT_S)
    with pytest.raises(LimiterClosed):
        await limiter.consume(1, Priority.BYPASS)
    limiter.close()  # again: nothing more


async def test_a_cancelled_waiter_leaves_the_queue_and_its_tokens_go_on() -> None:
    limiter = drained()
    first = asyncio.create_task(limiter.consume(30, Priority.TAIL))
    second = asyncio.create_task(limiter.consume(20, Priority.CATCH_UP))
    await until(lambda: limiter.waiting == 2)
    limiter.refill(2)  # 20 of the first's 30
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    # Its 20 came back: the second is served with them.
    await asyncio.wait_for(second, WAIT_S)
    assert limiter.waiting == 0 and limiter.tokens == 0


async def test_the_refill_timer_grants_what_waits() -> None:
    limiter = NetworkBandwidthLimiter(PARAMS)  # the real clock
    await limiter.consume(PARAMS.max_tokens * 3, Priority.CATCH_UP)  # 20 refills' worth
    assert limiter.waited[Priority.CATCH_UP] == 1


async def test_a_refill_counts_the_periods_the_clock_says_passed() -> None:
    now = [0.0]
    limiter = NetworkBandwidthLimiter(PARAMS, clock=lambda: now[0])
    run_at_once(limiter.consume(10**6, Priority.BYPASS))
    assert limiter.tokens == -100
    now[0] = 0.075  # seven periods and a half: seven refills
    run_at_once(limiter.consume(0, Priority.BYPASS))
    assert limiter.tokens == -30
    now[0] = 0.08  # the half left over makes the eighth
    run_at_once(limiter.consume(0, Priority.BYPASS))
    assert limiter.tokens == -20


def test_waiters_on_two_loops_in_two_threads_are_woken_on_their_own_loops() -> None:
    limiter = drained()
    granted: dict[str, threading.Event] = {"tail": threading.Event(), "catch-up": threading.Event()}
    woken_on: dict[str, int] = {}
    failures: list[BaseException] = []

    def serve(name: str, priority: Priority) -> None:
        async def consume() -> None:
            await limiter.consume(50, priority)
            woken_on[name] = threading.get_ident()
            granted[name].set()

        try:
            asyncio.run(asyncio.wait_for(consume(), WAIT_S))
        except BaseException as error:
            failures.append(error)
            granted[name].set()

    threads = {
        name: threading.Thread(target=serve, args=(name, priority))
        for name, priority in (("catch-up", Priority.CATCH_UP), ("tail", Priority.TAIL))
    }
    threads["catch-up"].start()
    assert _eventually(lambda: limiter.waiting == 1)
    threads["tail"].start()
    assert _eventually(lambda: limiter.waiting == 2)
    limiter.refill(5)  # the tail's 50, from this third thread
    assert granted["tail"].wait(WAIT_S)
    assert not granted["catch-up"].is_set() and limiter.waiting == 1
    limiter.refill(5)
    assert granted["catch-up"].wait(WAIT_S)
    for thread in threads.values():
        thread.join(WAIT_S)
    assert not failures
    assert woken_on == {name: thread.ident for name, thread in threads.items()}


def _eventually(condition: Any) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.001)):
        if condition():
            return True
        done.wait(0.001)
    return False


def test_the_modes_build_the_buckets_as_automq_sizes_them() -> None:
    bandwidth = 1024 * 1024 * 1024
    separate = network_limiters(bandwidth)
    assert separate.inbound is not separate.outbound
    assert separate.inbound.params.max_tokens == bandwidth
    assert separate.outbound.params.max_tokens == 5 * bandwidth
    assert separate.inbound.params.refill_tokens == bandwidth // 100  # 10 ms' worth
    shared = network_limiters(bandwidth, "shared")
    assert shared.inbound is shared.outbound and shared.inbound.params.max_tokens == 2 * bandwidth
    with pytest.raises(ValueError, match="unknown network limiter mode"):
        network_limiters(bandwidth, "split")


def test_the_settings_name_the_bandwidth_and_the_mode() -> None:
    default = load_config(overrides=[], environment={})
    assert default.s3_network_baseline_bandwidth == 1024 * 1024 * 1024
    assert default.s3_network_limiter_mode == "separate"
    shared = load_config(
        overrides=["s3.network.baseline.bandwidth=1000", "s3.network.limiter.mode=Shared"],
        environment={},
    )
    assert (shared.s3_network_baseline_bandwidth, shared.s3_network_limiter_mode) == (
        1000,
        "shared",
    )
    with pytest.raises(ConfigError, match=r"s3\.network\.limiter\.mode"):
        load_config(overrides=["s3.network.limiter.mode=split"], environment={})
    with pytest.raises(ConfigError, match=r"s3\.network\.baseline\.bandwidth"):
        load_config(overrides=["s3.network.baseline.bandwidth=0"], environment={})
