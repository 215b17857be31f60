"""The transactions benchmark: its argument handling, the end offsets it expects, and a smoke run
(``--quick``) against our broker, which checks that the report has a figure in every row and
that the offsets check passed (the run exits 0), so the benchmark cannot rot unnoticed; the
figures themselves are never judged (they depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.txn_bench import expected_end_offsets, parse_arguments

REPO = Path(__file__).resolve().parents[2]


def test_arguments_and_their_checks() -> None:
    arguments = parse_arguments(["--targets", "ours-local", "--modes", "transactional"])
    assert (arguments.records, arguments.per_transaction, arguments.rounds) == (200_000, 1000, 10)
    assert arguments.targets == ("ours-local",)
    assert arguments.modes == ("transactional",)
    quick = parse_arguments(["--quick"])
    assert (quick.records, quick.per_transaction, quick.rounds, quick.runs) == (5000, 500, 2, 1)
    assert quick.targets == ("ours-local",)
    for wrong in (
        ["--targets", "nobody"],
        ["--modes", "exactly-once"],
        ["--records", "1500", "--rounds", "1"],  # not whole transactions
        ["--rounds", "0"],
    ):
        with pytest.raises(SystemExit):
            parse_arguments(["--targets", "ours-local", *wrong])


def test_end_offsets_count_the_warm_up_and_one_marker_per_transaction_and_partition() -> None:
    assert expected_end_offsets(5000, 500, 1, transactional=False) == 5500
    assert expected_end_offsets(5000, 500, 1, transactional=True) == 5500 + 11
    assert expected_end_offsets(5000, 500, 4, transactional=True) == 5500 + 11 * 4


def test_quick_run_against_our_broker(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "bench.txn_bench", "--quick", "--dir", str(tmp_path)]
    done = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard; the run itself takes 5-20 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text()
    assert report.strip() == done.stdout.strip()
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in report.splitlines()
        if line.startswith("| ")
    }
    assert rows["metric (median)"] == ["ours (local objects)"]
    for metric in (
        "idempotent records/s",
        "transactional records/s",
        "transactional / idempotent (records/s, paired per run)",
        "commit_transaction p50 ms",
        "commit_transaction p99 ms",
    ):
        assert float(rows[metric][0]) > 0, (metric, rows[metric])
    assert "| transactional / idempotent of ours (local objects) >= 0.8 |" in report
    assert not list(tmp_path.glob("txn-bench-*")), "the work directory is removed"
