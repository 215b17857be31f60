"""The crash failover benchmark: its measure (the acknowledgement that ends a partition's
longest silence around the kill), and its smoke run (``--quick``: one kill of each hold setting
on a fresh three-broker cluster on etcd and moto), which checks that the report has its rows
with figures in them, so the benchmark cannot rot unnoticed; the figures themselves are never
judged (they depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.failover_bench import (
    POINTS,
    Acks,
    ClientLog,
    Run,
    Setting,
    breakdown,
    load_runs,
    longest_silence,
    parse_sessions,
    save_runs,
    steady,
)
from tests.etcd_fixture import etcd_binary

REPO = Path(__file__).resolve().parents[2]


def test_the_longest_silence_and_when_it_ended() -> None:
    # The victim's last acknowledgements (read just after a kill at 10.0), the silence, the
    # new broker's.
    times = [9.5, 9.7, 10.01, 13.2, 13.3]
    assert longest_silence(times, 9.0, 14.0) == (13.2 - 10.01, 13.2)
    # No acknowledgement in the window: the window is the silence.
    assert longest_silence([], 9.0, 14.0) == (5.0, 14.0)
    # Acknowledgements outside the window are not counted.
    assert longest_silence([1.0, 20.0], 9.0, 14.0) == (5.0, 14.0)


def test_steady_wants_every_partition_acknowledged_for_a_while() -> None:
    acks = Acks()
    acks.times = {0: [7.5, 8.5, 9.9], 1: [9.5, 9.9]}
    assert not steady(acks, 2, 10.0)  # partition 1 began less than a second ago
    acks.times[1] = [7.9, 9.0, 9.95]
    assert steady(acks, 2, 10.0)
    assert not steady(acks, 3, 10.0)  # partition 2 never acknowledged


def test_sessions_are_session_slash_heartbeat() -> None:
    assert parse_sessions("2000/500, 9000/2000") == [(2000, 500), (9000, 2000)]


def a_run(writable: list[float], shift: float = 0.0) -> Run:
    """A run of two partitions whose chain points are their order in POINTS, plus ``shift``."""
    chain = [{name: index + shift for index, (name, _) in enumerate(POINTS)} for _ in writable]
    for points, writable_s in zip(chain, writable, strict=True):
        points["writable"] = writable_s
    chain[0]["wal_seconds"] = 0.1
    return Run(Setting(2000, 500, 1000), "broker 2", writable, [0.5], 1.0, 2.0, 3.0, chain, 1)


def test_the_breakdown_gives_each_point_and_step_its_median_and_max() -> None:
    lines = breakdown([a_run([8.0, 9.0]), a_run([8.5, 10.0], shift=1.0)])
    assert lines[0].startswith("4 partitions of 2 runs; librdkafka parked 2 of them")
    table = {row[0].split(":")[0]: row[1:] for row in rows("\n".join(lines))}
    assert table["deadline"] == ["0.50", "1.00", "-", "-"]  # no step before the first point
    assert table["fenced"] == ["1.50", "2.00", "1.00", "1.00"]
    # Steps from "client at new leader" (7, 7, 8, 8): 1.0, 2.0, 0.5, 2.0.
    assert table["writable"] == ["8.75", "10.0", "1.50", "2.00"]
    assert table["takeover"] == ["", "", "0.10", "0.10"]  # wal_seconds, per run


def test_saved_runs_read_back(tmp_path: Path) -> None:
    runs = [a_run([3.0, 3.5]), a_run([2.5, 4.0], shift=0.5)]
    save_runs(tmp_path / "runs.jsonl", runs[:1])
    save_runs(tmp_path / "runs.jsonl", runs[1:])  # appended
    assert load_runs([tmp_path / "runs.jsonl"]) == runs


def test_the_client_log_finds_each_delegation() -> None:
    client_log = ClientLog()
    client_log.logger.debug(
        "[thrd:main]: crash [1]: delegating to broker 127.0.0.1:5/3 for partition with 4 messages"
    )
    client_log.logger.debug(
        "[thrd:x]: crash [1]: delegating to broker :0/internal for partition with 0 messages"
    )
    client_log.logger.debug(
        "[thrd:x]: crash [10]: delegating to broker 127.0.0.1:5/1 for partition with 0 messages"
    )
    assert [to for _, to in client_log.delegated("crash", 1)] == ["3", "internal"]
    assert [to for _, to in client_log.delegated("crash", 10)] == ["1"]


def rows(report: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in report.splitlines()
        if line.startswith("| ") and not line.startswith("| victim") and "---" not in line
    ]


def test_quick_run(tmp_path: Path) -> None:
    etcd_binary()  # a clear failure when etcd is missing
    out = tmp_path / "report.md"
    command = [sys.executable, "-m", "bench.failover_bench", "--quick", "--dir", str(tmp_path)]
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
    assert [row[:3] for row in found] == [
        ["broker", "2000 / 500", "0"],
        ["broker", "2000 / 500", "1000"],
    ]
    for row in found:
        assert row[3] == "1" and int(row[4]) >= 1  # one run; the victim's partitions
        # Kill to writable takes at least the part of the session that ran after the kill.
        assert float(row[5]) > 0
        assert row[9] != "-" and row[10] != "-" and row[12] != "-", "the log lines were found"
    assert not list(tmp_path.glob("failover-bench-*")), "the work directory is removed"
