"""The TLS benchmark: a smoke run (``--quick``, with ``--separate-cores`` when there are two
CPUs to separate) against our broker, which checks that the report has a figure in every row
(the run exits 0: the three producers delivered everything, over plaintext, TLS and SASL_SSL)
and CPU figures for both sides of each,
so the benchmark cannot rot unnoticed; the figures themselves are never judged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.tls_bench import parse_arguments

REPO = Path(__file__).resolve().parents[2]


def test_arguments() -> None:
    quick = parse_arguments(["--quick"])
    assert (quick.runs, quick.mb, quick.rounds) == (1, 4, 2)
    assert parse_arguments([]).mb == 200


def test_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.tls_bench",
            "--quick",
            *(["--separate-cores"] if len(os.sched_getaffinity(0)) > 1 else []),
            "--dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard; the run takes about 5 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in out.read_text().splitlines()
        if line.startswith("| ")
    }
    for metric in (
        "plaintext MB/s",
        "TLS MB/s",
        "SASL_SSL (PLAIN) MB/s",
        "TLS / plaintext (paired per run)",
        "SASL_SSL / plaintext (paired per run)",
        "broker CPU per MB, plaintext / TLS (paired per run)",
    ):
        assert float(rows[metric]) > 0, (metric, rows)
    cpu = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:5]]
        for line in out.read_text().splitlines()
        if line.startswith("| ") and ("per MB |" in line or "one CPU |" in line)
    }
    for label in ("client ms per MB", "broker ms per MB"):
        assert all(float(cell) > 0 for cell in cpu[label]), (label, cpu)
    for label in ("client, share of one CPU", "broker, share of one CPU"):
        assert all(float(cell.rstrip("%")) > 0 for cell in cpu[label]), (label, cpu)
    assert not list(tmp_path.glob("tls-bench-*")), "the work directory is removed"
    if len(os.sched_getaffinity(0)) > 1:
        assert "brokers and producers on separate cores" in out.read_text()
