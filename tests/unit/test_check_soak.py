"""``automq-ref check --runs N`` (``automq_ref.checker.soak``): the per-run lines and the
aggregate, without brokers (a stand-in check returns chosen outcomes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from automq_ref.checker.run import CheckOutcome
from automq_ref.checker.soak import RunLine, aggregate, run_checks
from automq_ref.checker.workload import WorkloadSettings
from automq_ref.cli import WORKLOAD_FAULT_INTERVAL_S


def outcome(seed: int, valid: bool, out: Path, **fields: Any) -> CheckOutcome:
    values: dict[str, Any] = {
        "valid": valid,
        "anomalies": {} if valid else {"lost-write": 3},
        "linearizable": "ok" if valid else "fail",
        "operations": {"send:ok": 100, "send:info": 2, "poll:ok": 50},
        "faults": ["kill", "pause-past-session", "kill"],
        "seed": seed,
        "seconds": 10.0,
        "report_dir": out,
    }
    values.update(fields)
    return CheckOutcome(**values)


def test_aggregate_counts_runs_totals_and_the_failed_seeds(tmp_path: Path) -> None:
    lines = [
        RunLine.of(outcome(5, True, tmp_path)),
        RunLine.of(outcome(6, False, tmp_path)),
        RunLine(seed=7, valid=None, seconds=3.0, error="RuntimeError: broker did not start"),
        RunLine.of(outcome(8, True, tmp_path, faults=["graceful-restart"])),
    ]
    total = aggregate(lines)
    assert (total.runs, total.passed, total.failed, total.errors) == (4, 2, 2, 1)
    assert total.failed_seeds == (6, 7)
    assert total.operations == 3 * 152
    assert total.acknowledged == 300
    assert total.faults == {"graceful-restart": 1, "kill": 4, "pause-past-session": 2}
    assert total.anomalies == {"lost-write": 3}
    assert total.seconds == 33.0
    assert not total.ok
    text = "\n".join(total.describe())
    assert "4 runs: 2 passed, 2 failed (1 did not complete)" in text
    assert "failed seeds (re-run one alone with --seed SEED): 6, 7" in text


def test_an_empty_or_clean_soak_is_ok(tmp_path: Path) -> None:
    assert aggregate([]).ok
    clean = aggregate([RunLine.of(outcome(seed, True, tmp_path)) for seed in range(3)])
    assert clean.ok and clean.failed_seeds == () and clean.passed == 3


def test_a_run_line_says_seed_counts_verdict_and_faults(tmp_path: Path) -> None:
    line = RunLine.of(outcome(6, False, tmp_path, unreadable=[2]))
    text = line.describe(1, 10)
    assert text.startswith("run 2/10 seed 6: INVALID; 152 operations, 100 acknowledged;")
    assert "kill x2, pause-past-session x1" in text
    assert "lost-write x3" in text and "linearizable fail" in text
    assert "unreadable partitions [2]" in text
    assert "valid;" in RunLine.of(outcome(5, True, tmp_path)).describe(0, 1)


def test_run_checks_gives_each_run_the_next_seed_fresh_data_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Path, int, int, str]] = []

    def check(out: Path, settings: WorkloadSettings, _overrides: Any, **options: Any) -> Any:
        calls.append((out, settings.seed, options["brokers"], options["wal"]))
        # What earlier runs left in the directory is gone: each run starts on fresh data.
        assert not (out / "stale").exists()
        (out / "data" / "broker-1").mkdir(parents=True)
        (out / "data" / "broker-1.log").write_text("log")
        (out / "data" / "wal").write_text("wal")
        if settings.seed == 41:
            raise RuntimeError("broker did not start; see broker-1.log\nits log")
        return outcome(settings.seed, settings.seed != 42, out)

    (tmp_path / "seed-42").mkdir()
    (tmp_path / "seed-42" / "stale").write_text("from an earlier soak")
    total = run_checks(tmp_path, WorkloadSettings(seed=40), 3, brokers=3, wal="s3", check=check)
    assert [(out.name, seed) for out, seed, _, _ in calls] == [
        ("seed-40", 40),
        ("seed-41", 41),
        ("seed-42", 42),
    ]
    assert {(brokers, wal) for _, _, brokers, wal in calls} == {(3, "s3")}
    assert total.failed_seeds == (41, 42) and total.errors == 1
    # A passed run keeps its logs, not its data; a failed one keeps everything.
    assert sorted(path.name for path in (tmp_path / "seed-40" / "data").iterdir()) == [
        "broker-1.log"
    ]
    assert (tmp_path / "seed-42" / "data" / "broker-1").is_dir()
    printed = capsys.readouterr().out
    assert "run 2/3 seed 41: ERROR;" in printed and "RuntimeError: broker did not start" in printed
    assert "3 runs: 1 passed, 2 failed (1 did not complete)" in printed
    saved = json.loads((tmp_path / "soak.json").read_text())
    assert saved["aggregate"]["failed_seeds"] == [41, 42] and not saved["aggregate"]["ok"]
    assert [run["seed"] for run in saved["runs"]] == [40, 41, 42]
    assert "failed seeds" in (tmp_path / "soak.txt").read_text()


def test_the_commands_default_fault_interval_is_the_workloads() -> None:
    assert WorkloadSettings.fault_interval_s == WORKLOAD_FAULT_INTERVAL_S
