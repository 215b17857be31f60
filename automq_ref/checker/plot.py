"""A picture of a checked run: throughput and send latency over time, with the faults shaded.

``plot_history`` draws two panels that share the time axis (seconds since the history's first
entry) and writes them as a PNG (``history_figure`` is the same figure, unsaved, for a caller
that wants to look at it). The run's verdict, when given (``verdict_text`` words it from the
checkers' result), is the top panel's title, green when valid and red when not, so the picture
says what the run found without the report beside it. Every series is named in plain words
("acknowledged sends per second", "produce latency p99 (ms)", "fault injected: kill broker"):

1. Throughput per one-second bin, counted at completion time: acknowledged sends (``ok``), sends
   whose outcome is unknown (``info``; a send still open at the end of the history counts at its
   invocation), failed sends if there are any, and records returned by polls. The final read
   phase (polls marked ``final``) is left out: it reads the whole log at once and would dwarf
   the workload.
2. Send latency, invocation to completion, one dot per completed send at its invocation time
   (``ok`` and ``info`` in different colours, log-scale milliseconds), and the 99th percentile
   of every one-second bin that has sends (``ok`` and ``info`` together) as a line. A second
   with no sends has no p99: the line breaks there (NaN) rather than joining the seconds on
   either side, which would draw latencies nobody measured across a broker that was down.

Every fault window is shaded in both panels, one colour per kind, and the legend names the kinds;
in a cluster each window also says what it hit ("broker 2 (active controller)", "etcd"),
written up the window's left edge in the latency panel.
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
FAULT_COLOURS = {
    "kill": "tab:red",
    "pause": "tab:orange",
    "wal-loss": "tab:purple",
    "etcd-pause": "tab:cyan",
}
_SPARE_COLOURS = ("tab:brown", "tab:pink", "tab:olive", "tab:gray")
OK_COLOUR = "tab:blue"
INFO_COLOUR = "tab:orange"
FAIL_COLOUR = "tab:red"
POLL_COLOUR = "tab:green"
P99_COLOUR = "black"
VALID_COLOUR = "tab:green"
INVALID_COLOUR = "tab:red"
# The faults the checker injects, as the legend says them; another kind is named as it is.
FAULT_WORDS = {
    "kill": "kill broker",
    "pause": "pause broker",
    "wal-loss": "power loss (unsynced WAL tail undone)",
    "s3": "object store errors and latency",
    "net": "network faults on client connections",
    "etcd-pause": "pause etcd (the metadata quorum)",
    "zone-partition": "zone cut off from the other zones",
}
# Anomaly kinds as the verdict says them; another kind is named as it is.
ANOMALY_WORDS = {"lost-write": "lost", "duplicate": "duplicated"}
SENDS_OK_LABEL = "acknowledged sends per second"
SENDS_INFO_LABEL = "sends with unknown outcome per second"
SENDS_FAIL_LABEL = "failed sends per second"
POLLED_LABEL = "records read by consumers per second"
P99_LABEL = "produce latency p99 (ms)"
LATENCY_LABELS = {
    "ok": "produce latency, acknowledged (ms)",
    "info": "produce latency, outcome unknown (ms)",
}


def verdict_text(
    valid: bool, anomalies: dict[str, int], linearizable: str, unreadable: int = 0
) -> str:
    """The verdict in words: ``valid: no acknowledged record lost`` or, e.g., ``INVALID: 12
    lost, 3 duplicated; not linearizable``; ``unreadable`` partitions the final read could
    not read are said too."""
    if valid:
        return "valid: no acknowledged record lost, no anomaly, linearizable"
    found = [
        f"{count} {ANOMALY_WORDS.get(kind, kind)}" for kind, count in anomalies.items() if count
    ]
    if unreadable:
        found.append(
            f"{unreadable} partition{'' if unreadable == 1 else 's'} unreadable at the end"
        )
    if linearizable != "ok":
        found.append("not linearizable" if linearizable == "fail" else "linearizability unknown")
    return f"INVALID: {'; '.join(found) if found else 'see the report'}"


def plot_history(
    ops: list[Op],
    faults: list[FaultWindow],
    path: Path,
    title: str,
    *,
    verdict: str | None = None,
) -> None:
    """Write the two-panel PNG of ``ops`` with ``faults`` shaded (and ``verdict`` on it) to
    ``path``."""
    history_figure(ops, faults, title, verdict=verdict).savefig(path, format="png", dpi=100)


def history_figure(
    ops: list[Op], faults: list[FaultWindow], title: str, *, verdict: str | None = None
) -> Figure:
    """The two-panel figure of ``ops`` with ``faults`` shaded, on an Agg canvas."""
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
    if verdict is not None:
        valid = verdict.startswith("valid")
        throughput.set_title(
            verdict, color=VALID_COLOUR if valid else INVALID_COLOUR, fontweight="bold"
        )
    centres = np.arange(bins) + 0.5

    steps = "steps-mid"  # one flat step per one-second bin
    throughput.plot(centres, sends_ok, color=OK_COLOUR, label=SENDS_OK_LABEL, drawstyle=steps)
    throughput.plot(centres, sends_info, color=INFO_COLOUR, label=SENDS_INFO_LABEL, drawstyle=steps)
    if sends_fail.any():
        throughput.plot(
            centres, sends_fail, color=FAIL_COLOUR, label=SENDS_FAIL_LABEL, drawstyle=steps
        )
    throughput.plot(centres, records_polled, color=POLL_COLOUR, label=POLLED_LABEL, drawstyle=steps)
    throughput.set_ylabel("per second")
    throughput.set_ylim(bottom=0)

    for outcome, colour in (("ok", OK_COLOUR), ("info", INFO_COLOUR)):
        xs, ys = latency[outcome]
        if xs:
            latency_axes.scatter(
                xs, ys, s=4, color=colour, alpha=0.5, linewidths=0, label=LATENCY_LABELS[outcome]
            )
    # NaN where a second has no sends: the line breaks there; the marker keeps a second
    # between two gaps visible.
    p99 = np.array(
        [float(np.percentile(values, 99)) if values else math.nan for values in latencies_by_bin]
    )
    sent = bool(np.isfinite(p99).any())
    if sent:
        latency_axes.plot(
            centres,
            p99,
            color=P99_COLOUR,
            linewidth=1.2,
            marker=".",
            markersize=3,
            label=P99_LABEL,
        )
        latency_axes.set_yscale("log")
    else:
        latency_axes.text(
            0.5, 0.5, "no completed sends", transform=latency_axes.transAxes, ha="center"
        )
    latency_axes.set_ylabel("produce latency (ms)")
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
    for fault in faults:
        if fault.target:  # low in the latency panel: no send completes there while it lasts
            latency_axes.text(
                seconds(fault.start_ns),
                0.02,
                fault.target,
                transform=latency_axes.get_xaxis_transform(),
                rotation=90,
                va="bottom",
                ha="left",
                fontsize="x-small",
                color="dimgray",
                bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1},
            )
    fault_patches = [
        Patch(color=colour, alpha=0.2, label=f"fault injected: {FAULT_WORDS.get(kind, kind)}")
        for kind, colour in colours.items()
    ]
    handles, _ = throughput.get_legend_handles_labels()
    throughput.legend(handles=handles + fault_patches, loc="upper left", fontsize="small")
    if sent:
        latency_axes.legend(loc="upper left", fontsize="small", markerscale=3)
    return figure


def fault_colours(kinds: Sequence[str]) -> dict[str, str]:
    """One colour per fault kind, in order of first appearance."""
    colours: dict[str, str] = {}
    spare = iter(_SPARE_COLOURS * (1 + len(kinds) // len(_SPARE_COLOURS)))
    for kind in kinds:
        if kind not in colours:
            colours[kind] = FAULT_COLOURS.get(kind) or next(spare)
    return colours
