"""``automq-ref check --runs N``: the whole checked run repeated N times on fresh data, run i
with seed S+i, and what the runs add up to.

A run's history cannot prove a rare bug absent; many seeds make each kind of fault meet the
broker in many states. Each run gets its own report directory, ``<out>/seed-<seed>`` (emptied
first), with everything one ``check`` writes; a run that passed has its data directories removed
afterwards (logs, history and report stay), so a long soak does not fill the disk. After each run
one line says its seed, operations, acknowledged sends, verdict and fault events; at the end the
aggregate says how many runs passed and failed, the totals, and the seeds that failed, each of
which reproduces its schedule alone with ``check --seed SEED``. A run that could not run (a
broker that did not start, an error of the checker's) counts as failed, with its error, and the
soak goes on. ``soak.json`` and ``soak.txt`` in ``<out>`` keep the lines and the aggregate.

:func:`aggregate` is pure (the lines in, the totals out) so it is tested without brokers.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from automq_ref.checker.run import CheckOutcome, run_check
from automq_ref.checker.workload import WorkloadSettings

log = logging.getLogger(__name__)

Check = Callable[..., CheckOutcome]


@dataclass(frozen=True)
class RunLine:
    """One run of a soak: ``valid`` None when the run did not complete (``error`` says why)."""

    seed: int
    valid: bool | None
    operations: int = 0
    acknowledged: int = 0
    faults: tuple[str, ...] = ()
    anomalies: dict[str, int] = field(default_factory=dict)
    linearizable: str = ""
    unreadable: tuple[int, ...] = ()
    seconds: float = 0.0
    error: str = ""

    @classmethod
    def of(cls, outcome: CheckOutcome) -> RunLine:
        return cls(
            seed=outcome.seed,
            valid=outcome.valid,
            operations=sum(outcome.operations.values()),
            acknowledged=outcome.operations.get("send:ok", 0),
            faults=tuple(outcome.faults),
            anomalies=dict(outcome.anomalies),
            linearizable=outcome.linearizable,
            unreadable=tuple(outcome.unreadable),
            seconds=outcome.seconds,
        )

    @property
    def verdict(self) -> str:
        if self.valid is None:
            return "ERROR"
        return "valid" if self.valid else "INVALID"

    def describe(self, index: int, runs: int) -> str:
        faults = _counts(Counter(self.faults)) or "no faults"
        line = (
            f"run {index + 1}/{runs} seed {self.seed}: {self.verdict}; {self.operations:,} "
            f"operations, {self.acknowledged:,} acknowledged; {faults}; {self.seconds:.0f} s"
        )
        if self.valid is None:
            return f"{line}; {self.error}"
        if not self.valid:
            found = [_counts(self.anomalies)] if self.anomalies else []
            if self.linearizable != "ok":
                found.append(f"linearizable {self.linearizable}")
            if self.unreadable:
                found.append(f"unreadable partitions {list(self.unreadable)}")
            line += "; " + "; ".join(found)
        return line


@dataclass(frozen=True)
class Aggregate:
    runs: int
    passed: int
    failed: int  # invalid runs and runs that did not complete
    errors: int  # of the failed, those that did not complete
    operations: int
    acknowledged: int
    faults: dict[str, int]
    anomalies: dict[str, int]
    failed_seeds: tuple[int, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def describe(self) -> list[str]:
        lines = [
            f"{self.runs} runs: {self.passed} passed, {self.failed} failed"
            + (f" ({self.errors} did not complete)" if self.errors else ""),
            f"{self.operations:,} operations, {self.acknowledged:,} acknowledged sends, "
            f"{sum(self.faults.values())} faults ({_counts(self.faults) or 'none'}), "
            f"{self.seconds / 60:.1f} min",
            f"anomalies: {_counts(self.anomalies) or 'none'}",
        ]
        if self.failed_seeds:
            lines.append(
                "failed seeds (re-run one alone with --seed SEED): "
                + ", ".join(map(str, self.failed_seeds))
            )
        return lines


def aggregate(lines: Iterable[RunLine]) -> Aggregate:
    """The totals of a soak's runs."""
    lines = list(lines)
    faults: Counter[str] = Counter()
    anomalies: Counter[str] = Counter()
    for line in lines:
        faults.update(line.faults)
        anomalies.update(line.anomalies)
    failed = [line for line in lines if not line.valid]
    return Aggregate(
        runs=len(lines),
        passed=len(lines) - len(failed),
        failed=len(failed),
        errors=sum(1 for line in lines if line.valid is None),
        operations=sum(line.operations for line in lines),
        acknowledged=sum(line.acknowledged for line in lines),
        faults=dict(sorted(faults.items())),
        anomalies=dict(sorted(anomalies.items())),
        failed_seeds=tuple(line.seed for line in failed),
        seconds=sum(line.seconds for line in lines),
    )


def run_checks(
    out_dir: Path,
    settings: WorkloadSettings,
    runs: int,
    broker_overrides: tuple[str, ...] = (),
    *,
    broken: tuple[str, ...] = (),
    brokers: int = 1,
    wal: str = "file",
    check: Check = run_check,
) -> Aggregate:
    """Run ``check`` ``runs`` times, run i with seed ``settings.seed + i`` in
    ``out_dir/seed-<seed>``; print a line per run and the aggregate, and keep both in
    ``soak.json`` and ``soak.txt``. Interrupted (Ctrl-C), it reports the runs done so far."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[RunLine] = []
    described: list[str] = []
    try:
        for index in range(runs):
            seed = settings.seed + index
            run_dir = out_dir / f"seed-{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)  # fresh data, a fresh report
            started = time.monotonic()
            try:
                outcome = check(
                    run_dir,
                    replace(settings, seed=seed),
                    broker_overrides,
                    broken=broken,
                    brokers=brokers,
                    wal=wal,
                )
                line = RunLine.of(outcome)
            except Exception as error:
                log.warning("run with seed %d did not complete:\n%s", seed, traceback.format_exc())
                first = (str(error).splitlines() or [""])[0]
                line = RunLine(
                    seed=seed,
                    valid=None,
                    seconds=round(time.monotonic() - started, 1),
                    error=f"{type(error).__name__}: {first}",
                )
            if line.valid:
                _remove_data(run_dir / "data")
            lines.append(line)
            described.append(line.describe(index, runs))
            print(f"automq-ref check: {described[-1]}", flush=True)
    finally:
        total = aggregate(lines)
        summary = total.describe()
        print("\n".join(f"automq-ref check: {text}" for text in summary), flush=True)
        (out_dir / "soak.txt").write_text("\n".join([*described, *summary]) + "\n")
        (out_dir / "soak.json").write_text(
            json.dumps(
                {
                    "aggregate": {**asdict(total), "ok": total.ok},
                    "runs": [asdict(line) for line in lines],
                },
                indent=2,
            )
        )
    return total


def _remove_data(data_dir: Path) -> None:
    """Everything under a passed run's data (the broker's data, or a cluster's brokers, objects
    and etcd) but the logs."""
    if not data_dir.is_dir():
        return
    for child in data_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        elif child.suffix != ".log":
            child.unlink(missing_ok=True)
    if not any(data_dir.iterdir()):  # one broker's data directory: its log lies beside it
        data_dir.rmdir()


def _counts(counts: dict[str, int] | Counter[str]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))
