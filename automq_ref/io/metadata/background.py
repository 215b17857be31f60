"""Stopping the background tasks of the cluster metadata (election, follower, RPC).

:func:`stop` cancels tasks and waits until they have ended, without taking their outcome and
without swallowing a cancellation of the caller: the usual ``task.cancel()`` then ``with
suppress(BaseException): await task`` also suppresses the ``CancelledError`` meant for the
*awaiting* task, and a loop that does that in its ``finally`` outlives its own cancellation.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None ones skipped) and wait until each has ended."""
    pending = {task for task in tasks if task is not None}
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in pending:
        # Taken, so that an error of a cancelled task is not reported as never retrieved.
        if not task.cancelled():
            task.exception()
