"""Checked runs against real broker processes (``automq_ref.checker``).

One run of at least 45 seconds and five faults, drawn from every one-broker nemesis (kill, pause,
loss of the un-fsynced WAL tail, object-store faults behind the S3 proxy, client connections
through the TCP proxy, a graceful restart, S3 faults), must find no anomaly.
Two deliberately broken brokers must be caught: one acknowledges before its WAL is fsynced (a
crash that loses the unsynced tail then loses acknowledged records), one throws its WAL away at
start-up. ``check --runs 2`` repeats a short run with the next seed, on fresh data, and
aggregates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from automq_ref.checker.nemesis import ONE_BROKER_NEMESES
from automq_ref.checker.run import run_check
from automq_ref.checker.workload import WorkloadSettings
from automq_ref.cli import main

SEED = 20261122


def test_every_nemesis_leaves_no_anomaly(tmp_path: Path) -> None:
    outcome = run_check(
        tmp_path / "check",
        WorkloadSettings(
            duration_s=45,
            fault_interval_s=5,
            min_faults=5,
            seed=SEED,
            nemeses=tuple(sorted(ONE_BROKER_NEMESES)),
        ),
    )
    # However slow the machine: the run goes on until five faults were injected.
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


def test_check_runs_repeats_short_seeded_runs_and_aggregates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak"
    code = main(
        [
            "check",
            "--runs",
            "2",
            "--seed",
            str(SEED),
            "--duration",
            "5",
            "--fault-interval",
            "1",
            "--nemesis",
            "kill,graceful-restart",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    saved = json.loads((out / "soak.json").read_text())
    runs = saved["runs"]
    assert [run["seed"] for run in runs] == [SEED, SEED + 1]
    assert all(run["valid"] and run["acknowledged"] > 0 and run["faults"] for run in runs), runs
    assert saved["aggregate"]["passed"] == 2 and saved["aggregate"]["failed_seeds"] == []
    assert f"run 2/2 seed {SEED + 1}: valid" in printed
    assert "2 runs: 2 passed, 0 failed" in printed
    for seed in (SEED, SEED + 1):  # each run its own report, its data gone, its log kept
        assert (out / f"seed-{seed}" / "report.json").exists()
        assert not (out / f"seed-{seed}" / "data").exists()
        assert (out / f"seed-{seed}" / "data.log").exists()
