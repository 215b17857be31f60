"""The cross-zone benchmark: seed 002's cost formula gives the seed's own worked example, moto's
request log is counted by method, and (as root, where namespaces can be made) a short run
prints its last line with a figure for each mode, the router on's below the router off's.
The figures themselves are not otherwise judged (they depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from automq_ref.netzones import unavailable_reason
from bench.cross_zone_bench import (
    SEED_KAFKA_FACTOR,
    crossing_by_kind,
    monthly_cost,
    s3_requests,
)

REPO = Path(__file__).resolve().parents[2]
REASON = unavailable_reason()


def test_seed_002s_worked_example() -> None:
    # 30 MiB/s, three replicas, clients over three zones: $4050 a month.
    assert round(monthly_cost(30, SEED_KAFKA_FACTOR)) == 4050
    assert monthly_cost(30, 0) == 0


def test_moto_requests_are_counted_by_method(tmp_path: Path) -> None:
    log = tmp_path / "s3-moto.log"
    log.write_text(
        " * Running on http://10.64.100.1:1\n"
        '10.64.100.1 - - [25/Nov/2026 10:56:07] "PUT /automq-ref HTTP/1.1" 200 -\n'
        '10.64.3.1 - - [25/Nov/2026 10:56:10] "\x1b[33mGET /automq-ref/x HTTP/1.1\x1b[0m" 404 -\n'
    )
    counts, end = s3_requests(log, 0)
    assert counts == {"PUT": 1, "GET": 1}
    assert s3_requests(log, end)[0] == {}


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_short_run_reports_both_modes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cross_zone_bench", "--seconds", "5", "--rate", "50"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last) == {
        "router_off_cross_zone_per_produced_byte",
        "router_on_cross_zone_per_produced_byte",
    }
    assert last["router_off_cross_zone_per_produced_byte"] > 0, done.stderr[-3000:]
    on = last["router_on_cross_zone_per_produced_byte"]
    assert on is not None, done.stderr[-3000:]
    # Clients talk to their own zone's broker only: no payload has to cross.
    assert on < last["router_off_cross_zone_per_produced_byte"]
    assert "produce p50" in done.stdout
    assert "TCP payload across zones (brokers' open connections), kafka_listener" in done.stdout


def test_crossing_is_counted_per_connection_kind_over_the_window() -> None:
    before = {("az1", "10.64.1.1:5000", "10.64.2.1:9093"): (100, 1000)}
    after = {
        ("az1", "10.64.1.1:5000", "10.64.2.1:9093"): (150, 1600),
        ("az3", "10.64.3.1:6000", "10.64.1.1:9092"): (10, 20),
        ("az2", "10.64.2.1:7000", "10.64.1.1:40000"): (300, 40),
    }
    assert crossing_by_kind(before, after, {9092, 9093, 9094}) == {
        "kafka_listener": {"connections": 2, "request": 60, "answer": 620},
        "other_port_controller_rpc": {"connections": 1, "request": 300, "answer": 40},
    }
