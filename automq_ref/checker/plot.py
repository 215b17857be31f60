"""A picture of a checked run: throughput and send latency over time, with the faults shaded.

``plot_history`` draws two panels that share the time axis (seconds since the history's first
entry) and writes them as a PNG:

1. Throughput per one-second bin, counted at completion time: acknowledged sends (``ok``), sends
   whose outcome is unknown (``info``; a send still open at the end of the history counts at its
   invocation), failed sends if there are any, and records returned by polls. The final read
   phase (polls marked ``final``) is left out: it reads the whole log at once and would dwarf
   the workload.
2. Send latency, invocation to completion, one dot per completed send at its invocation time
   (``ok`` and ``info`` in different colours, log-scale milliseconds), and the 99th percentile
   of every one-second bin that has sends (``ok`` and ``info`` together) as a line.

Every fault window is shaded in both panels, one colour per kind, and the legend names the kinds.
Invocations are matched with completions by :func:`automq_ref.checker.history.pair`, so a
history that breaks the format raises its ``HistoryError``. An empty history raises
``ValueError``: with no operation there is no time axis to draw. The figure is drawn on the Agg
canvas without pyplot, so plotting leaves matplotlib's global state alone and is safe off the
main thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from automq_ref.checker.history import Op, pair
from automq_ref.checker.workload import FaultWindow

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
# Fixed colours for the workload's own fault kinds; other kinds take the next free colour.
FAULT_COLOURS = {"kill": "tab:red", "pause": "tab:orange", "wal-loss": "tab:purple"}
_SPARE_COLOURS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
OK_COLOUR = "tab:blue"
INFO_COLOUR = "tab:orange"
FAIL_COLOUR = "tab:red"
POLL_COLOUR = "tab:green"
P99_COLOUR = "black"


def plot_history(ops: list[Op], faults: list[FaultWindow], path: Path, title: str) -> None:
    """Write the two-panel PNG of ``ops`` with ``faults`` shaded to ``path``."""
    if not ops:
        raise ValueError("an empty history has nothing to plot")
    origin_ns = min(op.time_ns for op in ops)
    end_ns = max([op.time_ns for op in ops] + [fault.end_ns for fault in faults])
    bins = max(1, math.ceil((end_ns - origin_ns) / NS_PER_S))

    def seconds(time_ns: int) -> float:
        return (time_ns - origin_ns) / NS_PER_S

    def bin_of(time_ns: int) -> int:
        return min(bins - 1, max(0, (time_ns - origin_ns) // NS_PER_S))

    sends_ok = np.zeros(bins)
    sends_info = np.zeros(bins)
    sends_fail = np.zeros(bins)
    records_polled = np.zeros(bins)
    latency: dict[str, tuple[list[float], list[float]]] = {"ok": ([], []), "info": ([], [])}
    latencies_by_bin: list[list[float]] = [[] for _ in range(bins)]
    for operation in pair(ops):
        completion = operation.completion
        if operation.f == "poll":
            polled = completion is not None and completion.type == "ok"
            if completion is not None and polled and not completion.value.get("final"):
                records_polled[bin_of(completion.time_ns)] += len(
                    completion.value.get("records", [])
                )
            continue
        if operation.f != "send":
            continue
        if completion is None:
            sends_info[bin_of(operation.invoke.time_ns)] += 1
            continue
        counts = {"ok": sends_ok, "info": sends_info, "fail": sends_fail}[completion.type]
        counts[bin_of(completion.time_ns)] += 1
        if completion.type in latency:
            latency_ms = (completion.time_ns - operation.invoke.time_ns) / NS_PER_MS
            xs, ys = latency[completion.type]
            xs.append(seconds(operation.invoke.time_ns))
            ys.append(max(latency_ms, 1e-3))  # a log axis has no zero
            latencies_by_bin[bin_of(operation.invoke.time_ns)].append(ys[-1])

    figure = Figure(figsize=(12, 7), layout="constrained")
    FigureCanvasAgg(figure)
    throughput, latency_axes = figure.subplots(2, 1, sharex=True)
    figure.suptitle(title)
    centres = np.arange(bins) + 0.5

    steps = "steps-mid"  # one flat step per one-second bin
    throughput.plot(centres, sends_ok, color=OK_COLOUR, label="sends ok/s", drawstyle=steps)
    throughput.plot(centres, sends_info, color=INFO_COLOUR, label="sends info/s", drawstyle=steps)
    if sends_fail.any():
        throughput.plot(
            centres, sends_fail, color=FAIL_COLOUR, label="sends fail/s", drawstyle=steps
        )
    throughput.plot(
        centres, records_polled, color=POLL_COLOUR, label="records polled/s", drawstyle=steps
    )
    throughput.set_ylabel("per second")
    throughput.set_ylim(bottom=0)

    for outcome, colour in (("ok", OK_COLOUR), ("info", INFO_COLOUR)):
        xs, ys = latency[outcome]
        if xs:
            latency_axes.scatter(
                xs, ys, s=4, color=colour, alpha=0.5, linewidths=0, label=f"send {outcome}"
            )
    p99 = [
        (centre, float(np.percentile(values, 99)))
        for centre, values in zip(centres, latencies_by_bin, strict=True)
        if values
    ]
    if p99:
        latency_axes.plot(*zip(*p99, strict=True), color=P99_COLOUR, linewidth=1.2, label="p99")
        latency_axes.set_yscale("log")
    else:
        latency_axes.text(
            0.5, 0.5, "no completed sends", transform=latency_axes.transAxes, ha="center"
        )
    latency_axes.set_ylabel("send latency (ms)")
    latency_axes.set_xlabel("seconds since the first operation")
    latency_axes.set_xlim(0, seconds(end_ns))

    colours = fault_colours([fault.kind for fault in faults])
    for axes in (throughput, latency_axes):
        for fault in faults:
            axes.axvspan(
                seconds(fault.start_ns),
                seconds(fault.end_ns),
                color=colours[fault.kind],
                alpha=0.2,
                linewidth=0,
            )
    fault_patches = [
        Patch(color=colour, alpha=0.2, label=f"fault: {kind}") for kind, colour in colours.items()
    ]
    handles, _ = throughput.get_legend_handles_labels()
    throughput.legend(handles=handles + fault_patches, loc="upper left", fontsize="small")
    if p99:
        latency_axes.legend(loc="upper left", fontsize="small", markerscale=3)
    figure.savefig(path, format="png", dpi=100)


def fault_colours(kinds: Sequence[str]) -> dict[str, str]:
    """One colour per fault kind, in order of first appearance."""
    colours: dict[str, str] = {}
    spare = iter(_SPARE_COLOURS * (1 + len(kinds) // len(_SPARE_COLOURS)))
    for kind in kinds:
        if kind not in colours:
            colours[kind] = FAULT_COLOURS.get(kind) or next(spare)
    return colours
