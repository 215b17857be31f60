"""The object WAL benchmark's smoke run (``--quick``): both targets start (the block WAL and the
object WAL on a counting moto server), every workload runs on a few MB, and the report has a
figure in every row, so the benchmark cannot rot unnoticed. No figure is judged here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "bench.wal_object_bench", "--quick"]
    done = subprocess.run(
        [*command, "--dir", str(tmp_path), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard; the run itself takes 10-30 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text()
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in report.splitlines()
        if line.startswith("| ")
    }
    assert rows["metric (median)"] == ["block WAL", "object WAL"]
    for metric in ("produce MB/s at full rate, 16 partitions", "produce p99 ms at 1000 msg/s"):
        assert all(float(cell) > 0 for cell in rows[metric]), (metric, rows[metric])
    block, objects = rows["WAL PUTs per GB at full rate"]
    assert block == "-"  # the block WAL writes no objects
    assert float(objects) > 0
    assert "| object WAL PUTs per GB at full rate <= 150 |" in report
