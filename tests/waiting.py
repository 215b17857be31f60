"""Waiting in tests: on a condition, with a limit that only guards against a hang.

A test's verdict must not depend on how fast the machine is: the suite runs on busy machines (CI
runners, a laptop building something else), where a step that takes 50 ms alone can take
seconds. So a test waits for the thing it needs (a record read, a fault injected, a member
joined) rather than sleeping and hoping, and the limit on that wait is :data:`PATIENCE_S`: far
longer than any healthy run needs, so that reaching it means something hangs, never that the
machine was slow. A check that something does *not* happen is made on a logical event where one
exists (a clock the test moves, a counter the code keeps), not on elapsed time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PATIENCE_S = 120.0
"""How long a test waits for something that takes well under a second on an idle machine."""


def wait_until(
    condition: Callable[[], object],
    what: str,
    *,
    timeout_s: float = PATIENCE_S,
    interval_s: float = 0.05,
) -> None:
    """Call ``condition`` until it returns something true; fail the test naming ``what`` once
    ``timeout_s`` has passed. ``interval_s`` is the pause between calls (0 when the condition
    blocks by itself, such as a consumer's poll)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


async def wait_until_async(
    condition: Callable[[], object],
    what: str,
    *,
    timeout_s: float = PATIENCE_S,
    interval_s: float = 0.02,
) -> None:
    """:func:`wait_until` inside an event loop: sleeps without blocking the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)
