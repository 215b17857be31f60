"""The check report's plot: a synthetic history with two faults gives a PNG that matplotlib
wrote; an empty history is refused with a ValueError. The figure itself (its artists, not its
pixels) carries the verdict as the top panel's title, names every series in plain words, and
breaks the p99 line (NaN) over seconds with no sends."""

from __future__ import annotations

import random
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from automq_ref.checker.history import Op, Recorder
from automq_ref.checker.plot import (
    INVALID_COLOUR,
    P99_LABEL,
    VALID_COLOUR,
    fault_colours,
    history_figure,
    plot_history,
    verdict_text,
)
from automq_ref.checker.workload import FaultWindow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NS_PER_MS = 1_000_000
ORIGIN_NS = 5_000_000_000_000  # monotonic clocks start anywhere


def synthetic_history(seconds: int = 12) -> tuple[list[Op], list[FaultWindow]]:
    """Two producers (one send at a time each), one consumer, a kill and a pause."""
    rng = random.Random(3)
    kill = FaultWindow("kill", ORIGIN_NS + 3_000 * NS_PER_MS, ORIGIN_NS + 4_500 * NS_PER_MS)
    pause = FaultWindow("pause", ORIGIN_NS + 7_000 * NS_PER_MS, ORIGIN_NS + 8_500 * NS_PER_MS)
    events: list[tuple[int, int, str, str, dict[str, object]]] = []
    for process in (0, 1):
        now = ORIGIN_NS + process * NS_PER_MS
        count = 0
        while now < ORIGIN_NS + seconds * 1000 * NS_PER_MS:
            value = {"partition": count % 3, "value": f"{process}-{count}"}
            events.append((now, process, "invoke", "send", value))
            in_fault = any(f.start_ns <= now < f.end_ns for f in (kill, pause))
            latency_ns = int(rng.lognormvariate(1.0, 0.6) * NS_PER_MS)
            if in_fault and rng.random() < 0.3:
                now += 1_500 * NS_PER_MS
                events.append((now, process, "info", "send", {**value, "error": "timed out"}))
            else:
                now += latency_ns + (1_200 * NS_PER_MS if in_fault else 0)
                events.append((now, process, "ok", "send", {**value, "offset": count}))
            now += 5 * NS_PER_MS
            count += 1
        # An open send at the end: counts as info.
        events.append((now, process, "invoke", "send", {"partition": 0, "value": "open"}))
    now = ORIGIN_NS
    while now < ORIGIN_NS + seconds * 1000 * NS_PER_MS:
        events.append((now, 100, "invoke", "poll", {"partitions": [0, 1, 2]}))
        now += 200 * NS_PER_MS
        records = [[0, index, f"0-{index}"] for index in range(rng.randint(0, 40))]
        events.append((now, 100, "ok", "poll", {"records": records}))
    final_at = ORIGIN_NS + (seconds + 1) * 1000 * NS_PER_MS
    events.append((final_at, 1000, "invoke", "poll", {"partitions": [0], "final": True}))
    everything = [[0, index, "x"] for index in range(5000)]
    events.append((final_at + 1, 1000, "ok", "poll", {"records": everything, "final": True}))
    recorder = Recorder()
    for time_ns, process, type_, f, value in sorted(events, key=lambda event: event[0]):
        recorder.add(process, type_, f, time_ns, value)  # type: ignore[arg-type]
    return recorder.ops, [kill, pause]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_history_with_two_faults_makes_a_png(tmp_path: Path) -> None:
    ops, faults = synthetic_history()
    path = tmp_path / "history.png"
    plot_history(ops, faults, path, "seed 3: kill, pause")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 20_000
    assert b"Matplotlib" in data[:4096]  # the Software text chunk matplotlib writes
    assert png_size(data) == (1200, 700)


def test_plotting_works_off_the_main_thread(tmp_path: Path) -> None:
    ops, faults = synthetic_history(seconds=3)
    errors: list[BaseException] = []

    def draw() -> None:
        try:
            plot_history(ops, faults[:1], tmp_path / "thread.png", "from a thread")
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=draw)
    thread.start()
    thread.join()
    assert not errors
    assert (tmp_path / "thread.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_history_without_sends_still_plots(tmp_path: Path) -> None:
    recorder = Recorder()
    recorder.add(100, "invoke", "poll", ORIGIN_NS, {"partitions": [0]})
    recorder.add(100, "ok", "poll", ORIGIN_NS + 300 * NS_PER_MS, {"records": [[0, 0, "a"]]})
    path = tmp_path / "polls.png"
    plot_history(recorder.ops, [], path, "polls only")
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_an_empty_history_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    with pytest.raises(ValueError, match="empty history"):
        plot_history([], [FaultWindow("kill", 1, 2)], path, "nothing")
    assert not path.exists()


def test_each_fault_kind_has_its_own_colour() -> None:
    colours = fault_colours(["kill", "pause", "kill", "disk-full", "wal-loss", "clock"])
    assert list(colours) == ["kill", "pause", "disk-full", "wal-loss", "clock"]
    assert len(set(colours.values())) == len(colours)


def sends_with_a_silent_gap() -> list[Op]:
    """One producer sending every 100 ms in seconds 0-3 and 6-9, nothing in seconds 3-6."""
    recorder = Recorder()
    count = 0
    for second in (0, 1, 2, 6, 7, 8):
        for tenth in range(10):
            invoked = ORIGIN_NS + second * 1000 * NS_PER_MS + tenth * 100 * NS_PER_MS
            value = {"partition": 0, "value": f"0-{count}"}
            recorder.add(0, "invoke", "send", invoked, value)
            recorder.add(0, "ok", "send", invoked + 5 * NS_PER_MS, {**value, "offset": count})
            count += 1
    return recorder.ops


def test_the_p99_line_breaks_over_seconds_without_sends() -> None:
    kill = FaultWindow("kill", ORIGIN_NS + 3_000 * NS_PER_MS, ORIGIN_NS + 6_000 * NS_PER_MS)
    figure = history_figure(sends_with_a_silent_gap(), [kill], "gap")
    _, latency = figure.axes
    (p99,) = [line for line in latency.get_lines() if line.get_label() == P99_LABEL]
    xs = np.asarray(p99.get_xdata(), dtype=float)
    ys = np.asarray(p99.get_ydata(), dtype=float)
    silent = (xs > 3) & (xs < 6)
    assert silent.sum() == 3
    assert np.isnan(ys[silent]).all()  # a break in the line, not a segment across the gap
    assert np.isfinite(ys[~silent]).all()
    assert ys[~silent] == pytest.approx(5.0)


def test_the_verdict_is_on_the_figure_and_the_series_are_named_in_words() -> None:
    ops, faults = synthetic_history(seconds=4)
    verdict = verdict_text(False, {"lost-write": 12, "duplicate": 3}, "fail")
    assert verdict == "INVALID: 12 lost; 3 duplicated; not linearizable"
    figure = history_figure(ops, faults, "seed 3", verdict=verdict)
    throughput, latency = figure.axes
    assert throughput.get_title() == verdict
    assert to_hex(throughput.title.get_color()) == to_hex(INVALID_COLOUR)
    legend = throughput.get_legend()
    assert legend is not None
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == [
        "acknowledged sends per second",
        "sends with unknown outcome per second",
        "records read by consumers per second",
        "fault injected: kill broker",
        "fault injected: pause broker",
    ]
    latency_legend = latency.get_legend()
    assert latency_legend is not None
    assert "produce latency p99 (ms)" in [text.get_text() for text in latency_legend.get_texts()]


def test_a_valid_run_says_so_in_green() -> None:
    verdict = verdict_text(True, {}, "ok")
    assert verdict.startswith("valid: no acknowledged record lost")
    ops, faults = synthetic_history(seconds=3)
    throughput, _ = history_figure(ops, faults, "seed 3", verdict=verdict).axes
    assert throughput.get_title() == verdict
    assert to_hex(throughput.title.get_color()) == to_hex(VALID_COLOUR)


def test_an_unlinearizable_run_without_queue_anomalies_says_which() -> None:
    assert verdict_text(False, {}, "fail") == "INVALID: not linearizable"
    assert verdict_text(False, {"unseen": 2}, "unknown") == (
        "INVALID: 2 unseen; linearizability unknown"
    )


def test_a_cluster_run_names_what_each_fault_hit() -> None:
    ops, _ = synthetic_history()
    faults = [
        FaultWindow("kill", ORIGIN_NS + 3_000 * NS_PER_MS, ORIGIN_NS + 4_500 * NS_PER_MS),
        FaultWindow("etcd-pause", ORIGIN_NS + 7_000 * NS_PER_MS, ORIGIN_NS + 9_000 * NS_PER_MS),
    ]
    faults[0].target = "broker 2 (active controller)"
    faults[1].target = "etcd"
    figure = history_figure(ops, faults, "cluster")
    texts = {text.get_text() for axes in figure.axes for text in axes.texts}
    assert {"broker 2 (active controller)", "etcd"} <= texts
    # One broker: no target, no label.
    single = history_figure(*synthetic_history(), "one broker")
    assert not [text for axes in single.axes for text in axes.texts]


def test_partitions_unreadable_at_the_end_are_in_the_verdict() -> None:
    assert verdict_text(False, {}, "ok", unreadable=1) == (
        "INVALID: 1 partition unreadable at the end"
    )
