"""``automq-ref check``: a broker process (or a cluster: ``brokers`` > 1, on an etcd member of its
own), a workload under faults, its checkers, a report. The queue workload (sends and polls) is
judged by the queue checks and linearizability; the transactional one (``workload="txn"``) by
the transactional checks, its allowed G0 cycles counted apart.

The report (``report.json`` and ``report.txt`` in the output directory, beside
``history.jsonl`` and ``plot.png``) gives the verdict, the count of every anomaly kind with
examples, the linearizability verdict per partition, the operation counts and the fault windows;
the plot shows throughput and latency over time with the fault windows shaded. In a cluster
each fault window names what it hit (a broker, and whether it was the active controller, or
etcd), in the report and on the plot, and the report counts per broker how often it was fenced
and started itself again. The seed is
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from automq_ref.checker import linearizability, queue, transactional
from automq_ref.checker.broken import MODES as BROKEN_MODES
from automq_ref.checker.history import pair, write_history
from automq_ref.checker.nemesis import Environment
from automq_ref.checker.txn_workload import run_txn_workload
from automq_ref.checker.workload import (
    FINAL_READ_TIMEOUT_S,
    CheckTally,
    WorkloadResult,
    WorkloadSettings,
    run_workload,
)
from automq_ref.progress import Progress

# The broker modes ``run_check(broken=...)`` accepts: the CLI's door to checker/broken.py, which
# no module outside the checker imports itself.
__all__ = ["BROKEN_MODES", "WORKLOADS", "CheckOutcome", "run_check"]
WORKLOADS = ("queue", "txn")

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
    brokers: int = 1
    # per broker ("broker N"), how often it was fenced and restarted itself (a cluster only)
    fenced_restarts: dict[str, int] | None = None
    # partitions the final read could not read, every fault healed: the run is invalid
    unreadable: list[int] = field(default_factory=list)
    workload: str = "queue"
    # the transactional workload's allowed anomalies (G0), counted apart from the verdict
    allowed: dict[str, int] | None = None
    # the transactional workload's transactions per outcome (ok committed, fail aborted)
    transactions: dict[str, int] | None = None


def run_check(
    out_dir: Path,
    settings: WorkloadSettings,
    broker_overrides: tuple[str, ...] = (),
    *,
    broken: tuple[str, ...] = (),
    brokers: int = 1,
    wal: str = "file",
) -> CheckOutcome:
    """Run the workload against ``brokers`` brokers (more than one: a cluster) under
    ``settings.nemeses``; ``broken`` names the deliberately broken modes of
    :mod:`automq_ref.checker.broken` the broker runs in (in a cluster, broker 1 alone);
    ``wal`` the brokers' WAL (``file``, or ``s3``: the object WAL in the checked bucket);
    ``settings.workload`` is ``queue`` (sends and polls: the queue checks and
    linearizability) or ``txn`` (transactions: :mod:`automq_ref.checker.txn_workload`, checked
    by :mod:`automq_ref.checker.transactional`; linearizability is not judged)."""
    workload = settings.workload
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    where = f", {brokers} brokers on etcd" if brokers > 1 else ""
    if wal != "file":
        where += f", {wal} WAL"
    print(
        f"automq-ref check: {workload} workload, seed {settings.seed}, "
        f"nemeses {','.join(settings.nemeses)}{where}",
        flush=True,
    )
    if broken and brokers > 1:
        print(f"automq-ref check: broker 1 runs broken: {', '.join(broken)}", flush=True)
    tally = CheckTally(settings.duration_s)
    if workload == "txn":
        tally.counted = "transactions committed"
    if brokers > 1:
        tally.stage = "starting etcd and the brokers"
    with Progress("automq-ref check", tally.status):
        env = Environment.start(
            out_dir / "data",
            settings.nemeses,
            broker_overrides,
            broken=broken,
            seed=settings.seed,
            brokers=brokers,
            metadata_path=out_dir / "metadata.txt",
            wal=wal,
        )
        try:
            result = (run_txn_workload if workload == "txn" else run_workload)(env, settings, tally)
        finally:
            tally.stage = "stopping the brokers" if brokers > 1 else "stopping the broker"
            env.close()
        fenced = (
            {f"broker {i + 1}": broker.fenced_restarts() for i, broker in enumerate(env.brokers)}
            if brokers > 1
            else None
        )
        tally.stage = "checking the history"
        write_history(out_dir / "history.jsonl", result.ops)
        txn_report = transactional.check_all(result.ops) if workload == "txn" else None
        if txn_report is None:
            queue_report = queue.check_all(result.ops)
            linear: linearizability.LinearizabilityResult | None = linearizability.check_history(
                result.ops
            )
        else:
            queue_report, linear = txn_report.report, None
        verdict = "not judged (transactional workload)" if linear is None else linear.verdict
        operations = Counter(f"{op.f}:{op.outcome}" for op in pair(result.ops))
        outcome = CheckOutcome(
            valid=queue_report.valid
            and verdict in ("ok", "not judged (transactional workload)")
            and not result.unreadable,
            anomalies={kind: count for kind, count in queue_report.counts.items() if count},
            linearizable=verdict,
            operations=dict(operations),
            faults=[fault.kind for fault in result.faults],
            seed=settings.seed,
            seconds=round(time.monotonic() - started, 1),
            report_dir=out_dir,
            brokers=brokers,
            fenced_restarts=fenced,
            unreadable=result.unreadable,
            workload=workload,
            allowed=None if txn_report is None else txn_report.allowed,
            transactions=None if txn_report is None else txn_report.outcomes,
        )
        tally.stage = "drawing the plot"
        plotted = result if txn_report is None else replace(result, ops=txn_report.projected)
        _plot(plotted, outcome, out_dir / "plot.png")
        tally.stage = "done"
    examples: dict[str, list[dict[str, Any]]] = {}
    allowed_examples = () if txn_report is None else txn_report.allowed_examples
    for anomaly in (*queue_report.anomalies, *allowed_examples):
        examples.setdefault(anomaly.kind, [])
        if len(examples[anomaly.kind]) < 5:
            examples[anomaly.kind].append(asdict(anomaly))
    report = {
        **{
            key: value
            for key, value in asdict(outcome).items()
            if key != "report_dir" and value is not None
        },
        **({"broken_broker": "broker 1"} if broken and brokers > 1 else {}),
        "topic": result.topic,
        "fault_windows_ns": [asdict(fault) for fault in result.faults],
        "anomaly_examples": examples,
        "linearizability": "not judged" if linear is None else linear.describe(),
    }
    first_ns = result.ops[0].time_ns if result.ops else 0
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        f"verdict: {'VALID' if outcome.valid else 'INVALID'}",
        f"seed {outcome.seed}; faults: {', '.join(outcome.faults) or 'none'}",
        *(
            f"  {(fault.start_ns - first_ns) / 1e9:7.1f}s-{(fault.end_ns - first_ns) / 1e9:.1f}s "
            f"{' '.join(filter(None, (fault.kind, fault.target)))}: {fault.detail}"
            for fault in result.faults
        ),
        f"operations: {dict(sorted(outcome.operations.items()))}",
        f"{'transactional' if txn_report else 'queue'} anomalies: {outcome.anomalies or 'none'}",
        *(
            [
                f"transactions: {outcome.transactions}",
                f"allowed in Kafka, not against the verdict: {outcome.allowed}",
            ]
            if txn_report is not None
            else []
        ),
        f"linearizable: {outcome.linearizable}",
    ]
    if outcome.unreadable:
        lines.append(
            f"unreadable at the end: partition {', '.join(map(str, outcome.unreadable))} "
            f"(no offsets within {FINAL_READ_TIMEOUT_S:.0f} s of the final read's start, every "
            "fault healed)"
        )
    if outcome.fenced_restarts is not None:
        lines.append(
            f"{outcome.brokers} brokers; fenced and restarted themselves: "
            + ", ".join(f"{name} {count}x" for name, count in outcome.fenced_restarts.items())
        )
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
        f"automq-ref check, seed {outcome.seed}"
        + (f", {outcome.brokers} brokers" if outcome.brokers > 1 else ""),
        verdict=verdict_text(
            outcome.valid, outcome.anomalies, outcome.linearizable, len(outcome.unreadable)
        ),
    )
