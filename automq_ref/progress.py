"""Progress on long work: one status line a person can follow, for ``check``, ``produce`` and
``verify``.

A command describes where its work is with a :class:`Status` (a stage, a detail, and how much of
the whole is done when that is known); a :class:`Progress` adds the elapsed time and shows it on
stderr in one of two ways:

- on a terminal, a bar redrawn in place (carriage return) a few times a second, cut to the
  terminal's width so it never wraps;
- anywhere else (a pipe, a log file, CI), a plain line every ``interval_s`` (5 s by default) and
  whenever the stage changes, so a log shows the work moving without a wall of redraws, and a
  slow stage (Spark starting, a broker recovering) is not silence.

A ticker thread asks for the status (the status function must be cheap and safe to call from
another thread); :meth:`Progress.finish` prints the last state once, in both modes, so a run that
ends normally always ends with a line saying how far it got. A run that ends by an exception
prints no final line: the bar is cleared so the error that follows stands on its own line. The
clock is injectable and :meth:`Progress.tick` is public, so the cadence can be tested without
waiting.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO

LINE_INTERVAL_S = 5.0  # a plain line this often when not on a terminal
REDRAW_INTERVAL_S = 0.2  # the bar's redraw period on a terminal
BAR_WIDTH = 10
CLEAR_TO_END = "\x1b[K"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    """Where the work is: ``stage`` names the step (a change of stage is reported at once in
    plain mode), ``detail`` the counts so far, ``fraction`` how much of the whole is done (0-1)
    when known, for the bar."""

    stage: str
    detail: str = ""
    fraction: float | None = None


def elapsed_text(seconds: float) -> str:
    """``7 s``, ``59 s``, ``1m05s``: whole seconds, minutes from one minute on."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60}m{whole % 60:02d}s"


class Progress:
    """The status line of one command; use as a context manager (starts the ticker, finishes
    on the way out) or drive :meth:`tick` and :meth:`finish` by hand."""

    def __init__(
        self,
        command: str,
        status: Callable[[float], Status],
        *,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        interval_s: float = LINE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``status(elapsed_s)`` says where the work is. ``terminal`` defaults to whether
        ``stream`` (stderr by default) is a terminal."""
        self.command = command
        self._status = status
        self._stream = stream if stream is not None else sys.stderr
        self.terminal = self._stream.isatty() if terminal is None else terminal
        self._interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._last_line: float | None = None
        self._last_stage: str | None = None
        self._last_text: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish(failed=error is not None)

    def start(self) -> None:
        """Show the first status now and keep it current from a daemon thread."""
        self.tick()
        period = REDRAW_INTERVAL_S if self.terminal else min(REDRAW_INTERVAL_S, self._interval_s)
        self._thread = threading.Thread(
            target=self._run, args=(period,), name=f"{self.command}-progress", daemon=True
        )
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.tick()

    def tick(self) -> bool:
        """Show the status if it is due: always on a terminal; otherwise when the stage changed
        or ``interval_s`` passed since the last line. True if something was written."""
        now = self._clock()
        status = self._current(now)
        if status is None:
            return False
        if self.terminal:
            self._draw(now, status)
            return True
        due = self._last_line is None or now - self._last_line >= self._interval_s
        if not due and status.stage == self._last_stage:
            return False
        self._line(now, status)
        return True

    def finish(self, *, failed: bool = False) -> None:
        """Stop the ticker; print the final status (or, after a failure, clear the bar)."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        now = self._clock()
        if failed:
            if self.terminal:
                self._write(f"\r{CLEAR_TO_END}")
            return
        status = self._current(now)
        if status is None:
            return
        if self.terminal:
            self._draw(now, status)
            self._write("\n")
        elif self._text(now, status) != self._last_text:  # the same line twice says nothing
            self._line(now, status)

    def _current(self, now: float) -> Status | None:
        try:
            return self._status(now - self._started)
        except Exception:  # a status that cannot be read this time is skipped, never fatal
            log.debug("progress status of %s", self.command, exc_info=True)
            return None

    def _text(self, now: float, status: Status) -> str:
        words = [status.stage, status.detail] if status.detail else [status.stage]
        return f"{elapsed_text(now - self._started)}: {', '.join(words)}"

    def _line(self, now: float, status: Status) -> None:
        self._last_line = now
        self._last_stage = status.stage
        self._last_text = self._text(now, status)
        self._write(f"{self.command}: {self._last_text}\n")

    def _draw(self, now: float, status: Status) -> None:
        self._last_stage = status.stage
        bar = ""
        if status.fraction is not None:
            fraction = min(1.0, max(0.0, status.fraction))
            filled = round(fraction * BAR_WIDTH)
            bar = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction:4.0%} "
        # The command's last word: the bar needs the width more than the program's name.
        text = f"{self.command.split()[-1]} {bar}{self._text(now, status)}"
        width = self._columns() - 1
        self._write(f"\r{text[:width]}{CLEAR_TO_END}")

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self._stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return shutil.get_terminal_size().columns

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream ends the display, not the work
            self._stop.set()
