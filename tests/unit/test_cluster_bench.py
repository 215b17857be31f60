"""The cluster benchmark's smoke run (``--quick``): one and three brokers on etcd and moto, 2 MB
produced, one move per client setting. It checks that the report has every table with figures
in it, so the benchmark code cannot rot unnoticed; the figures themselves are never judged
(they depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.etcd_fixture import etcd_binary

REPO = Path(__file__).resolve().parents[2]


def rows(report: str) -> dict[str, list[str]]:
    return {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in report.splitlines()
        if line.startswith("| ")
    }


def test_quick_run(tmp_path: Path) -> None:
    etcd_binary()  # a clear failure when etcd is missing
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "bench.cluster_bench", "--quick", "--dir", str(tmp_path)]
    done = subprocess.run(
        [*command, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard; the run itself takes 20-40 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = out.read_text()
    assert report.strip() == done.stdout.strip()
    found = rows(report)
    assert found["median"] == ["1 broker", "3 brokers", "3 / 1"]
    assert all(float(cell) > 0 for cell in found["produce MB/s"])
    # The quick run's 2 MB take a few ms on one broker, less than /proc's 10 ms CPU tick, so a
    # broker's CPU may read 0; across all processes of both runs something was counted.
    assert all(float(cell) >= 0 for cell in found["CPU ms per MB: brokers"][:2])
    assert all(float(cell) > 0 for cell in found["CPU ms per MB: all"][:2])
    # etcd counted something in each cluster (the brokers' lease keepalives at least).
    assert any(key.startswith("grpc ") for key in found), report
    moves = {
        key.split(" (")[0]: cells
        for key, cells in found.items()
        if key.startswith(("defaults (", "fast ("))
    }
    assert set(moves) == {"defaults", "fast"}
    for cells in moves.values():
        assert cells[0] == "1"  # one move each
        assert float(cells[2]) > 0  # the longest gap around it
    breakdown = [key for key in found if key in ("defaults", "fast")]
    assert sorted(breakdown) == ["defaults", "fast"]
    for key in breakdown:
        assert found[key][2] != "-", "the old broker's log line was found"
        assert found[key][4] != "-", "the new broker's log line was found"
    assert not list(tmp_path.glob("cluster-bench-*")), "the work directory is removed"
