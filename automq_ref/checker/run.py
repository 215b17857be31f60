"""``automq-ref check``: a broker process, the queue workload under faults, both checkers, a report.

The report (``report.json`` and ``report.txt`` in the output directory, beside
``history.jsonl`` and ``plot.png``) gives the verdict, the count of every anomaly kind with
examples, the linearizability verdict per partition, the operation counts and the fault windows;
the plot shows throughput and latency over time with the fault windows shaded. The seed is
printed and recorded: the same seed gives the same fault schedule. While it runs, a progress
line on stderr (:mod:`automq_ref.progress`: a bar on a terminal, a line every few seconds
otherwise) shows the elapsed time, the stage, the sends acknowledged and the faults injected so
far. The plot carries the verdict and names its series in plain words.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from automq_ref.checker import linearizability, queue
from automq_ref.checker.broken import MODES as BROKEN_MODES
from automq_ref.checker.history import pair, write_history
from automq_ref.checker.nemesis import Environment
from automq_ref.checker.workload import (
    CheckTally,
    WorkloadResult,
    WorkloadSettings,
    run_workload,
)
from automq_ref.progress import Progress

# The broker modes ``run_check(broken=...)`` accepts: the CLI's door to checker/broken.py, which
# no module outside the checker imports itself.
__all__ = ["BROKEN_MODES", "CheckOutcome", "run_check"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckOutcome:
    valid: bool
    anomalies: dict[str, int]
    linearizable: str
    operations: dict[str, int]
    faults: list[str]
    seed: int
    seconds: float
    report_dir: Path


def run_check(
    out_dir: Path,
    settings: WorkloadSettings,
    broker_overrides: tuple[str, ...] = (),
    *,
    broken: tuple[str, ...] = (),
) -> CheckOutcome:
    """Run the workload against a broker under ``settings.nemeses``; ``broken`` names the
    deliberately broken modes of :mod:`automq_ref.checker.broken` the broker runs in."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"automq-ref check: seed {settings.seed}, nemeses {','.join(settings.nemeses)}",
        flush=True,
    )
    tally = CheckTally(settings.duration_s)
    with Progress("automq-ref check", tally.status):
        env = Environment.start(
            out_dir / "data", settings.nemeses, broker_overrides, broken=broken, seed=settings.seed
        )
        try:
            result = run_workload(env, settings, tally)
        finally:
            tally.stage = "stopping the broker"
            env.close()
        tally.stage = "checking the history"
        write_history(out_dir / "history.jsonl", result.ops)
        queue_report = queue.check_all(result.ops)
        linear = linearizability.check_history(result.ops)
        operations = Counter(f"{op.f}:{op.outcome}" for op in pair(result.ops))
        outcome = CheckOutcome(
            valid=queue_report.valid and linear.verdict == "ok",
            anomalies={kind: count for kind, count in queue_report.counts.items() if count},
            linearizable=linear.verdict,
            operations=dict(operations),
            faults=[fault.kind for fault in result.faults],
            seed=settings.seed,
            seconds=round(time.monotonic() - started, 1),
            report_dir=out_dir,
        )
        tally.stage = "drawing the plot"
        _plot(result, outcome, out_dir / "plot.png")
        tally.stage = "done"
    examples: dict[str, list[dict[str, Any]]] = {}
    for anomaly in queue_report.anomalies:
        examples.setdefault(anomaly.kind, [])
        if len(examples[anomaly.kind]) < 5:
            examples[anomaly.kind].append(asdict(anomaly))
    report = {
        **{key: value for key, value in asdict(outcome).items() if key != "report_dir"},
        "topic": result.topic,
        "fault_windows_ns": [asdict(fault) for fault in result.faults],
        "anomaly_examples": examples,
        "linearizability": linear.describe(),
    }
    first_ns = result.ops[0].time_ns if result.ops else 0
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        f"verdict: {'VALID' if outcome.valid else 'INVALID'}",
        f"seed {outcome.seed}; faults: {', '.join(outcome.faults) or 'none'}",
        *(
            f"  {(fault.start_ns - first_ns) / 1e9:7.1f}s-{(fault.end_ns - first_ns) / 1e9:.1f}s "
            f"{fault.kind}: {fault.detail}"
            for fault in result.faults
        ),
        f"operations: {dict(sorted(outcome.operations.items()))}",
        f"queue anomalies: {outcome.anomalies or 'none'}",
        f"linearizable: {outcome.linearizable}",
    ]
    (out_dir / "report.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return outcome


def _plot(result: WorkloadResult, outcome: CheckOutcome, path: Path) -> None:
    """The run's picture, with the verdict on it; none (a warning) without matplotlib."""
    try:
        from automq_ref.checker.plot import plot_history, verdict_text
    except ImportError as error:  # matplotlib is in the test extra, not a runtime dependency
        log.warning("no plot: %s", error)
        return
    plot_history(
        result.ops,
        result.faults,
        path,
        f"automq-ref check, seed {outcome.seed}",
        verdict=verdict_text(outcome.valid, outcome.anomalies, outcome.linearizable),
    )
