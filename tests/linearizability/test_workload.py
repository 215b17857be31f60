"""Checked runs against real broker processes (``automq_ref.checker``).

One 75-second run with every nemesis (kill, pause, loss of the un-fsynced WAL tail, object-store
faults behind the S3 proxy, client connections through the TCP proxy) must find no anomaly.
Two deliberately broken brokers must be caught: one acknowledges before its WAL is fsynced (a
crash that loses the unsynced tail then loses acknowledged records), one throws its WAL away at
start-up.
"""

from __future__ import annotations

from pathlib import Path

from automq_ref.checker.nemesis import ONE_BROKER_NEMESES
from automq_ref.checker.run import run_check
from automq_ref.checker.workload import WorkloadSettings

SEED = 20261122


def test_every_nemesis_leaves_no_anomaly(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(
            duration_s=75, fault_interval_s=5, seed=SEED, nemeses=tuple(sorted(ONE_BROKER_NEMESES))
        ),
    )
    assert len(outcome.faults) >= 5, outcome.faults
    assert outcome.operations.get("send:ok", 0) > 500
    assert outcome.valid, (outcome.anomalies, outcome.linearizable)
    assert (tmp_path / "check" / "plot.png").stat().st_size > 10_000


def test_a_broker_that_acknowledges_before_fsync_is_caught(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(duration_s=20, fault_interval_s=5, seed=SEED, nemeses=("wal-loss",)),
        broken=("ack-before-fsync",),
    )
    assert "wal-loss" in outcome.faults
    assert not outcome.valid
    assert outcome.anomalies.get("lost-write", 0) > 0
    assert outcome.linearizable == "fail"


def test_a_broker_that_loses_its_wal_is_caught(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(duration_s=20, fault_interval_s=5, seed=SEED, nemeses=("kill",)),
        broken=("discard-wal-at-start",),
    )
    assert "kill" in outcome.faults
    assert not outcome.valid
    assert outcome.anomalies.get("lost-write", 0) > 0
    assert outcome.linearizable == "fail"
