"""The catch-up benchmark: its pure helpers (the broker's ``read objects`` lines summed, the
latency windows, the ratios, py-spy's collapsed stacks) and a smoke run of a tiny configuration
against our broker on local objects, which checks that the report has its rows with figures in
them and that the last line is the summary object, so the benchmark cannot rot unnoticed; the
figures themselves are never judged (they depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.catchup_bench import (
    Outcome,
    latencies_between,
    loop_share,
    parse_fields,
    per_second,
    read_totals,
    results_table,
    safe_ratio,
    summary,
    top_frames,
)
from tests.unit.test_cluster_bench import rows

REPO = Path(__file__).resolve().parents[2]


def test_fields_split_back_including_quoted_values() -> None:
    assert parse_fields('seconds=5 gets=12 reason="not supported" bytes=3') == {
        "seconds": "5",
        "gets": "12",
        "reason": "not supported",
        "bytes": "3",
    }


def test_read_lines_are_summed_and_the_cache_peak_is_the_largest() -> None:
    log = [
        "2026 INFO automq_ref.node: node started node=0",
        "2026 INFO automq_ref.node: read objects seconds=5 gets=10 bytes=1000 cache_peak_bytes=70",
        "2026 INFO automq_ref.node: uploaded seconds=60 blocks=1 objects=2 bytes=5",
        "2026 INFO automq_ref.node: read objects seconds=5 gets=3 bytes=200 cache_peak_bytes=90",
        "2026 INFO automq_ref.node: read objects seconds=5 gets=1 bytes=5 cache_peak_bytes=20",
    ]
    totals = read_totals(log)
    assert (totals.lines, totals.gets, totals.get_bytes, totals.cache_peak_bytes) == (
        3,
        14,
        1205,
        90,
    )
    assert read_totals(log[:1]).lines == 0


def test_latencies_fall_in_the_window_of_their_send_time() -> None:
    samples = [(10.0, 0.005), (10.5, 0.001), (11.0, 0.100), (12.0, 0.002)]
    assert latencies_between(samples, 10.0, 11.0) == [0.001, 0.005]  # end excluded, sorted
    assert latencies_between(samples, 11.0, 13.0) == [0.002, 0.100]
    assert latencies_between(samples, 20.0, 30.0) == []


def test_per_second_rows_give_each_second_its_percentiles() -> None:
    samples = [(100.2, 0.001), (100.7, 0.003), (102.1, 0.010)]
    assert per_second(samples, 100.0) == [(0.0, 0.003, 0.003), (2.0, 0.010, 0.010)]


def test_ratios_need_a_positive_denominator() -> None:
    assert safe_ratio(30.0, 10.0) == 3.0
    assert safe_ratio(30.0, 0.0) is None
    assert safe_ratio(None, 10.0) is None
    assert safe_ratio(5.0, None) is None


def test_collapsed_stacks_give_self_and_inclusive_frames() -> None:
    main = "_run_module_as_main (<frozen runpy>:198);Runner.run (asyncio/runners.py:118)"
    thread = "Thread._bootstrap (threading.py:1002);_worker (concurrent/futures/thread.py:83)"
    collapsed = [
        f"{main};handle (h.py:2);fetch (c.py:3) 6",
        f"{main};handle (h.py:2);produce (d.py:4) 2",
        f"{thread};pread (s.py:9) 2",
        "not a stack line",
    ]
    total, own, inclusive = top_frames(collapsed, count=2)
    assert total == 10
    assert own == [("fetch (c.py:3)", 6), ("produce (d.py:4)", 2)]
    # The roots of the threads' stacks are in every sample of their thread: left out.
    assert inclusive == [("handle (h.py:2)", 8), ("fetch (c.py:3)", 6)]
    assert loop_share(collapsed) == 0.8
    assert loop_share([]) is None


def test_the_summary_takes_our_first_target_and_says_none_for_what_is_missing() -> None:
    peer = Outcome(figures={"p99_ratio": 1.5})
    ours = Outcome(figures={"p99_ratio": 4.0, "store_bytes_per_delivered_byte": 1.1})
    found = summary({"peer-memory": peer, "ours-s3": ours})
    assert found == {
        "target": "ours-s3",
        "produce_p99_ratio_during_catchup": 4.0,
        "store_bytes_per_delivered_byte": 1.1,
        "cache_bytes_per_reading_stream": None,
    }
    table = results_table({"ours-s3": ours, "peer-memory": peer})
    assert "| produce p99 during / before | 4.00 | 1.50 |" in table
    assert "| store bytes fetched per byte delivered | 1.10 | - |" in table
    assert "catch-up MB/s" not in table  # no target has the figure: no row


def test_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "bench.catchup_bench", "--targets", "ours-local"]
    command += ["--partitions", "20", "--backlog-mb", "4", "--cache-mb", "1", "--rate", "200"]
    command += ["--before-seconds", "1", "--dir", str(tmp_path), "--out", str(out)]
    done = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard; the run itself takes 20-40 s
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    saved = json.loads(out.read_text())
    printed = done.stdout.strip().splitlines()
    assert saved["report"] == "\n".join(printed[:-1])
    last = json.loads(printed[-1])
    assert set(last) >= {
        "produce_p99_ratio_during_catchup",
        "store_bytes_per_delivered_byte",
        "cache_bytes_per_reading_stream",
    }
    assert all(isinstance(last[key], float) for key in last if key != "target")
    assert list(saved["windows"]) == ["ours-local"]
    started, catchup_started, catchup_ended = saved["windows"]["ours-local"]
    assert started < catchup_started <= catchup_ended
    assert saved["per_second"]["ours-local"], "produce latency per second, for the plot"
    table = rows(saved["report"])
    assert table["metric"] == ["ours (local objects)"]
    for metric in (
        "catch-up MB/s",
        "produce p99 ms before",
        "produce p99 ms during catch-up",
        "produce p99 during / before",
        "store GETs per MB delivered (broker's count)",
        "store bytes fetched per byte delivered",
        "block cache bytes per reading stream",
    ):
        assert float(table[metric][0]) > 0, (metric, table[metric])
    assert table["catch-up read the whole backlog (1 = yes)"] == ["1.00"]
    assert not list(tmp_path.glob("catchup-bench-*")), "the work directory is removed"
