"""The status line of long commands (``automq_ref.progress``), on an injected clock.

Off a terminal: a line at the start, then one every interval and one at each change of stage,
and the final state once at the end; nothing between. On a terminal: a bar redrawn in place
(carriage return, clear to the end of the line) on every tick, cut to the terminal's width, ended
by a newline. A run that
fails prints no final state (the bar is cleared for the error). Whether a stream is a terminal is
asked of the stream: a pseudo-terminal (``os.openpty``) is one, a pipe is not. No test waits on
the real clock.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest

from automq_ref.progress import CLEAR_TO_END, Progress, Status, elapsed_text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0  # monotonic clocks start anywhere

    def __call__(self) -> float:
        return self.now


class Work:
    """A status that reports how many items are done and which stage the work is in."""

    def __init__(self) -> None:
        self.stage = "warming up"
        self.items = 0

    def status(self, _elapsed_s: float) -> Status:
        return Status(self.stage, f"{self.items} items", self.items / 10)


def plain(clock: Clock, work: Work, stream: io.StringIO) -> Progress:
    return Progress(
        "automq-ref test", work.status, stream=stream, terminal=False, interval_s=5, clock=clock
    )


def test_off_a_terminal_a_line_every_interval_and_at_each_stage() -> None:
    clock, work, stream = Clock(), Work(), io.StringIO()
    progress = plain(clock, work, stream)
    written = []
    for second in range(13):
        clock.now = 1000.0 + second
        work.items = second
        if second == 7:
            work.stage = "working"
        written.append(progress.tick())
    work.stage = "done"
    progress.finish()
    assert [second for second, wrote in enumerate(written) if wrote] == [0, 5, 7, 12]
    assert stream.getvalue().splitlines() == [
        "automq-ref test: 0 s: warming up, 0 items",
        "automq-ref test: 5 s: warming up, 5 items",
        "automq-ref test: 7 s: working, 7 items",
        "automq-ref test: 12 s: working, 12 items",
        "automq-ref test: 12 s: done, 12 items",
    ]
    assert "\r" not in stream.getvalue()


def test_the_final_line_is_not_a_repeat_of_the_last() -> None:
    clock, work, stream = Clock(), Work(), io.StringIO()
    progress = plain(clock, work, stream)
    progress.tick()
    progress.finish()
    progress.finish()  # finishing twice is finishing once
    assert stream.getvalue().splitlines() == ["automq-ref test: 0 s: warming up, 0 items"]


def test_on_a_terminal_a_bar_redrawn_in_place() -> None:
    clock, work, stream = Clock(), Work(), io.StringIO()
    progress = Progress("automq-ref test", work.status, stream=stream, terminal=True, clock=clock)
    work.items = 5
    clock.now += 65
    assert progress.tick()
    assert progress.tick()  # every tick redraws
    progress.finish()
    text = stream.getvalue()
    draws = text.split("\r")[1:]
    assert len(draws) == 3
    assert all(draw.startswith("test [#####-----]  50% 1m05s: warming up") for draw in draws)
    assert draws[0].endswith(CLEAR_TO_END)
    assert text.endswith(CLEAR_TO_END + "\n")
    assert text.count("\n") == 1


def test_the_bar_is_cut_to_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "30")  # a stream without a terminal size falls back to it
    work, stream = Work(), io.StringIO()
    Progress("automq-ref test", work.status, stream=stream, terminal=True, clock=Clock()).tick()
    assert stream.getvalue() == "\rtest [----------]   0% 0 s: w" + CLEAR_TO_END


def test_a_failed_run_clears_the_bar_and_prints_no_final_state() -> None:
    clock, work = Clock(), Work()
    on_terminal, off_terminal = io.StringIO(), io.StringIO()
    bar = Progress("t", work.status, stream=on_terminal, terminal=True, clock=clock)
    line = Progress("t", work.status, stream=off_terminal, terminal=False, clock=clock)
    for progress in (bar, line):
        with pytest.raises(RuntimeError), progress:
            raise RuntimeError("broker gone")
    assert on_terminal.getvalue().endswith(f"\r{CLEAR_TO_END}")
    assert off_terminal.getvalue().splitlines() == ["t: 0 s: warming up, 0 items"]


def test_a_status_that_cannot_be_read_is_skipped() -> None:
    def broken(_elapsed_s: float) -> Status:
        raise ConnectionError("the JVM is stopping")

    stream = io.StringIO()
    progress = Progress("t", broken, stream=stream, terminal=False, clock=Clock())
    assert not progress.tick()
    progress.finish()
    assert stream.getvalue() == ""


def test_the_ticker_thread_shows_the_start_and_the_end() -> None:
    work, stream = Work(), io.StringIO()
    with Progress("t", work.status, stream=stream, terminal=False, interval_s=3600):
        work.stage = "done"
    lines = stream.getvalue().splitlines()
    assert lines[0] == "t: 0 s: warming up, 0 items"
    assert lines[-1] == "t: 0 s: done, 0 items"


@pytest.fixture
def pseudo_terminal() -> Iterator[io.TextIOWrapper]:
    controller, attached = os.openpty()
    stream = open(attached, "w")  # noqa: SIM115 - closed below, with the other end
    try:
        yield stream
    finally:
        stream.close()
        os.close(controller)


def test_a_pseudo_terminal_gets_the_bar_and_a_pipe_the_lines(
    pseudo_terminal: io.TextIOWrapper,
) -> None:
    work = Work()
    assert Progress("t", work.status, stream=pseudo_terminal).terminal
    reader, writer = os.pipe()
    with open(writer, "w") as pipe:
        assert not Progress("t", work.status, stream=pipe).terminal
    os.close(reader)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0 s"), (59.9, "59 s"), (60, "1m00s"), (3725, "62m05s")]
)
def test_elapsed_time_is_whole_seconds_then_minutes(seconds: float, text: str) -> None:
    assert elapsed_text(seconds) == text
