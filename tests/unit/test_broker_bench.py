"""The broker benchmark's smoke run (``--quick``) against this project's broker only.

It starts ``automq-ref serve`` (local objects, then S3 on a counting moto server), runs every
workload on a few MB, and checks that the report has a figure in every row: the benchmark code
cannot rot unnoticed. The peer broker is left out (it needs its own setup).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_against_our_broker(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.broker_bench",
            "--quick",
            "--targets",
            "ours",
            "--dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard; the run itself takes 15-30 s
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
    header = rows["metric (median)"]
    assert header == ["ours (local objects)", "ours (S3 on moto)"]
    for metric in (
        "produce MB/s, 1 partition",
        "produce MB/s, 16 partitions",
        "produce p99 ms at 1000 msg/s",
        "catch-up consume MB/s, 1 partition",
        "catch-up consume MB/s, 16 partitions",
    ):
        assert all(float(cell) > 0 for cell in rows[metric]), (metric, rows[metric])
    local_writes, s3_writes = rows["object PUT+POST requests per GB"]
    assert local_writes == "-"  # no S3 requests to count with local objects
    assert float(s3_writes) > 0  # the graceful stop uploaded at least one object
    # The targets table is printed (judged, never asserted: the figures depend on the machine).
    assert "| produce p99 of ours (local objects) <= 10 ms |" in report
    assert not list(tmp_path.glob("broker-bench-*")), "the work directory is removed"
