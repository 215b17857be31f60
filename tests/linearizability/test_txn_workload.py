"""Checked transactional runs against a real broker process (``automq-ref check --workload
txn``): confluent-kafka transactions of sends and ``read_committed`` polls, committed and
aborted, under kill, pause and object-store faults, must show no anomaly; a broker whose
transaction coordinator writes markers before its decision is durable must be caught (a kill
between two partitions' markers tears a transaction once the producer's next instance fences
it)."""

from __future__ import annotations

import json
from pathlib import Path

from automq_ref.checker.run import run_check
from automq_ref.checker.workload import WorkloadSettings

SEED = 20261203
# Its schedule: kill, pause, s3-faults, kill (the fault schedule follows the seed).
VALID_SEED = 2


def test_transactions_under_kill_pause_and_s3_faults_show_no_anomaly(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(
            workload="txn",
            producers=4,
            duration_s=30,
            fault_interval_s=5,
            min_faults=4,
            seed=VALID_SEED,
            nemeses=("kill", "pause", "s3-faults"),
        ),
    )
    assert len(outcome.faults) >= 4, outcome.faults
    assert {"kill", "pause", "s3-faults"} <= set(outcome.faults), outcome.faults
    transactions = outcome.transactions or {}
    assert transactions.get("ok", 0) > 200, transactions
    assert transactions.get("fail", 0) > 20, transactions
    assert outcome.valid, (outcome.anomalies, outcome.unreadable)
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["workload"] == "txn"
    assert "G0" in report["allowed"]


def test_markers_before_the_decision_is_durable_are_caught(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(
            workload="txn",
            producers=4,
            duration_s=25,
            fault_interval_s=4,
            min_faults=4,
            seed=SEED,
            nemeses=("kill",),
        ),
        broken=("txn-markers-before-decision",),
    )
    assert not outcome.valid
    assert outcome.anomalies.get("lost-write", 0) >= 1, outcome.anomalies
