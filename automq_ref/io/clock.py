"""The clock seam: the shell reads time only through a :class:`Clock`, so that a node can be run
on a clock other than the machine's (a test's, a simulation's).

Two readings, for two uses: ``now_ms`` is wall-clock time in milliseconds (record timestamps,
retention, epochs that must grow across restarts), ``monotonic_s`` is seconds that never go
backwards (deadlines, timeouts).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time, milliseconds since the Unix epoch."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_s(self) -> float:
        return time.monotonic()
