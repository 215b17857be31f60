"""Route epochs on three broker processes (``automq-ref serve`` on etcd, ``running_cluster`` of
tests/e2e/test_cluster.py) with the zone router on, a bump every second and recording on: the
active controller bumps and publishes, every broker learns each record and reports (through
the controller RPC when it is not the controller), the committed epoch advances, and the trace
of the run, merged from the brokers' files, replays through the RouteEpoch machine with the
shell doing what the machine does and is accepted by TLC.

The trace is copied while the brokers still run (a broker's stop fences it, which the machine
sees as a crash, and a stopping broker may still report): the copy ends at the last whole line
of each file. Nothing routes yet (the in-process test, tests/properties/
test_route_epoch_real_trace.py, drives routed writes through the broker API).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from automq_ref.io.metadata import route_epoch_trace as rt
from tests.e2e.test_cluster import running_cluster
from tests.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")


def copy_whole_lines(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.ndjson"):
        text = path.read_text()
        (target / path.name).write_text(text[: text.rfind("\n") + 1])


def replayed_of(directory: Path) -> rt.Replayed:
    return rt.replay(rt.merge(rt.read_steps(directory)))


def test_route_epochs_of_broker_processes_are_a_behaviour_of_the_spec(tmp_path: Path) -> None:
    live = tmp_path / "live"
    overrides = (
        f"automq.zonerouter.channels=0@dir://{tmp_path / 'channels'}",
        "automq.zonerouter.route.epoch.bump.interval.ms=1000",
        "automq.zonerouter.route.epoch.commit.interval.ms=200",
        "automq.zonerouter.route.epoch.commit.linger.ms=200",
        f"automq.zonerouter.route.epoch.trace.dir={live}",
    )
    copy = tmp_path / "copy"
    with running_cluster(lambda: False, overrides=overrides):
        # The cluster is whole: three live brokers (the first bumped alone meanwhile).
        copy_whole_lines(live, copy)
        whole_at = replayed_of(copy).states[-1].controller.route
        started = time.monotonic()

        def committed_past() -> bool:
            copy_whole_lines(live, copy)
            final = replayed_of(copy).states[-1]
            up = all(node.up for node in final.nodes.values()) and len(final.nodes) == 3
            return up and final.controller.committed >= whole_at + 1

        wait_until(committed_past, f"committed past route epoch {whole_at}, three brokers up")
        print(f"\ncommitted past {whole_at} in {time.monotonic() - started:.1f} s")
    replayed = replayed_of(copy)
    assert rt.mismatches(replayed) == []
    final = replayed.states[-1]
    # Committed past the route epoch of a whole cluster: every broker reported past it.
    assert all((n.reported or -10) > whole_at for n in final.nodes.values()), final.nodes
    actions = [type(e).__name__ for e in replayed.events]
    assert actions.count("BumpRouteEpoch") >= whole_at + 3, actions
    lines = [tv.TraceLine(action, state) for action, state in rt.tla_lines(replayed)]
    verdict = tv.validate(lines, "RouteEpoch")
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}"
    print(f"{len(lines)} lines accepted by TLC; refused (stutters): {replayed.refused}")
