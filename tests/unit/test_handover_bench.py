"""The handover benchmark's smoke run (``--quick``): one SIGTERM handover on three brokers (etcd,
moto) and 5 MB recovered from each WAL after a kill. It checks that the report has its tables
with figures in them and that the stop was clean (exit 0, nothing left in the WAL), so the
benchmark cannot rot unnoticed; the timings themselves are never judged (they depend on the
machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.etcd_fixture import etcd_binary

REPO = Path(__file__).resolve().parents[2]


def rows(report: str) -> dict[str, list[list[str]]]:
    found: dict[str, list[list[str]]] = {}
    for line in report.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            found.setdefault(cells[0], []).append(cells[1:])
    return found


def test_quick_run(tmp_path: Path) -> None:
    etcd_binary()  # a clear failure when etcd is missing
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "bench.handover_bench", "--quick", "--dir", str(tmp_path)]
    done = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard; the run itself takes 30-60 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text()
    assert report.strip() == done.stdout.strip()
    found = rows(report)
    (handover,) = found["defaults"]
    runs, partitions, p50, p99 = handover[:4]
    assert runs == "1" and int(partitions) >= 1 and 0 < float(p50) <= float(p99)
    assert handover[-2:] == ["0", "0"]  # exit code, records the restart recovered
    assert [cells[0] for cells in found["block"]] == ["5"]
    assert [cells[0] for cells in found["object"]] == ["5"]
    assert all(float(cells[3]) > 0 for cells in found["block"] + found["object"])
