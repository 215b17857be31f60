"""One short checked run against the broker under kill and pause faults: no anomalies; and the
same workload against a deliberately broken broker (it discards its WAL at start-up, losing what
was acknowledged but not yet uploaded) must be caught."""

from __future__ import annotations

from pathlib import Path

from automq_ref.checker.run import run_check
from automq_ref.checker.workload import WorkloadSettings

SEED = 20261122


def test_kill_and_pause_leave_no_anomaly(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(duration_s=30, fault_interval_s=6, seed=SEED, nemeses=("kill", "pause")),
    )
    assert outcome.faults, "the nemesis injected nothing"
    assert outcome.operations.get("send:ok", 0) > 500
    assert outcome.valid, (outcome.anomalies, outcome.linearizable)


def test_a_broker_that_loses_its_wal_is_caught(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(duration_s=20, fault_interval_s=5, seed=SEED, nemeses=("kill",)),
        ("automq.ref.test.discard.wal.at.start=true",),
    )
    assert "kill" in outcome.faults
    assert not outcome.valid
    assert outcome.anomalies.get("lost-write", 0) > 0
    assert outcome.linearizable == "fail"
