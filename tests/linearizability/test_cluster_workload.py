"""Checked runs against a cluster: three broker processes (node ids 1-3, racks az1-az3) on an
etcd member the check starts, over one shared object store, clients bootstrapped to all three.

One short run with a broker killed, a broker paused past its session (fenced, it starts itself
again in its process) and etcd paused must find nothing, and leave no etcd behind. One more,
through ``check --runs``' runner, under the failover nemeses: a broker paused until the
controller fenced it and then resumed (the zombie), a graceful restart, and S3 faults while a
broker is down past its session, must find nothing either. A cluster in
which broker 1 throws its WAL away at start-up, killed, must be caught: the check cannot pass
because it looked at nothing. With the zone router on and clients declaring their zones, zones
cut off from the others and restored must lose nothing either. The seeds are chosen so that
the faults the assertions name come first in the schedule (one seed, one schedule of kinds and
brokers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from automq_ref.checker.run import run_check
from automq_ref.checker.soak import run_checks
from automq_ref.checker.workload import WorkloadSettings

# kill, pause past the session and etcd-pause within the first three faults
CLUSTER_SEED = 79
# pause-past-session (broker 2), graceful-restart (broker 3), s3-faults (ambiguous PUTs, broker 1)
FAILOVER_SEED = 53
# the first two kills hit broker 1
BROKEN_SEED = 8
# zone-partition: az2 cut off for 3.1 s, then az3 for 3.9 s
ZONE_SEED = 31


def test_a_cluster_under_kill_pause_and_etcd_pause_leaves_no_anomaly(tmp_path: Path) -> None:
    out = tmp_path / "check"
    outcome = run_check(
        out,
        WorkloadSettings(
            partitions=6,
            duration_s=30,
            fault_interval_s=4,
            seed=CLUSTER_SEED,
            nemeses=("kill", "pause", "etcd-pause"),
        ),
        brokers=3,
    )
    assert {"kill", "pause", "etcd-pause"} <= set(outcome.faults), outcome.faults
    assert outcome.operations.get("send:ok", 0) > 500
    assert outcome.valid, (outcome.anomalies, outcome.linearizable, outcome.unreadable)
    # The long pause was long enough: the paused broker was fenced and came back by itself.
    assert outcome.fenced_restarts is not None and sum(outcome.fenced_restarts.values()) >= 1
    report = json.loads((out / "report.json").read_text())
    assert report["brokers"] == 3
    targets = {window["target"] for window in report["fault_windows_ns"]}
    assert "etcd" in targets and any(target.startswith("broker ") for target in targets)
    assert "broker " in (out / "report.txt").read_text()
    # The metadata log was kept as text; etcd itself is gone, data and all.
    assert "RegisterBrokerRecord(node_id=3" in (out / "metadata.txt").read_text()
    assert not (out / "data" / "etcd").exists()
    # No idempotent producer was answered OUT_OF_ORDER_SEQUENCE_NUMBER: each sends its next
    # record once the one before was acknowledged, so a leader answering it lacks an
    # acknowledged batch (the broken run below may show it).
    assert "OUT_OF_ORDER_SEQUENCE_NUMBER" not in (out / "history.jsonl").read_text()


def test_a_cluster_with_a_broker_that_loses_its_wal_is_caught(tmp_path: Path) -> None:
    out = tmp_path / "check"
    outcome = run_check(
        out,
        WorkloadSettings(
            partitions=6, duration_s=20, fault_interval_s=4, seed=BROKEN_SEED, nemeses=("kill",)
        ),
        broken=("discard-wal-at-start",),
        brokers=3,
    )
    report = json.loads((out / "report.json").read_text())
    assert report["broken_broker"] == "broker 1"
    assert report["fault_windows_ns"][0]["target"].startswith("broker 1")
    assert not outcome.valid
    assert outcome.anomalies.get("lost-write", 0) > 0
    assert outcome.linearizable == "fail"


def test_a_cluster_under_the_failover_nemeses_leaves_no_anomaly(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    total = run_checks(
        out,
        WorkloadSettings(
            partitions=6,
            duration_s=20,
            fault_interval_s=2,
            min_faults=3,
            seed=FAILOVER_SEED,
            nemeses=("pause-past-session", "graceful-restart", "s3-faults"),
        ),
        1,
        brokers=3,
    )
    report = json.loads((out / f"seed-{FAILOVER_SEED}" / "report.json").read_text())
    windows = {window["kind"]: window for window in report["fault_windows_ns"]}
    assert set(windows) == {"pause-past-session", "graceful-restart", "s3-faults"}, windows
    # Safety first: nothing acknowledged lost, duplicated, reordered or contradicted.
    assert set(total.anomalies) <= {"unseen"}, (total.anomalies, (out / "soak.txt").read_text())
    assert report["linearizable"] == "ok"
    assert total.ok, (total.anomalies, (out / "soak.txt").read_text())
    assert total.acknowledged > 200
    # The pause lasted until the controller had fenced the broker, which restarted itself.
    assert "fenced" in windows["pause-past-session"]["detail"], windows
    assert "no fence" not in windows["pause-past-session"]["detail"]
    assert sum(report["fenced_restarts"].values()) >= 1
    assert "exited (0)" in windows["graceful-restart"]["detail"]
    assert "object store" in windows["s3-faults"]["target"]


def test_a_cluster_under_zone_partitions_leaves_no_anomaly(tmp_path: Path) -> None:
    out = tmp_path / "check"
    outcome = run_check(
        out,
        WorkloadSettings(
            partitions=6,
            producers=3,
            consumers=3,
            duration_s=15,
            fault_interval_s=3,
            min_faults=2,
            seed=ZONE_SEED,
            nemeses=("zone-partition",),
        ),
        brokers=3,
    )
    report = json.loads((out / "report.json").read_text())
    targets = [window["target"] for window in report["fault_windows_ns"]]
    assert targets[0].startswith("zone az2, broker 2"), targets
    assert targets[1].startswith("zone az3, broker 3"), targets
    # The cuts held the inter-broker requests too, not only the clients: the zone router's or
    # the snapshot reads' connections of the cut zone's broker, into another broker.
    details = " ".join(window["detail"] for window in report["fault_windows_ns"])
    assert re.search(r"into broker [13] from [^;]*(snapshot-read|automq-ref-router)-2", details), (
        details
    )
    assert outcome.valid, (outcome.anomalies, outcome.linearizable, outcome.unreadable)
    assert outcome.linearizable == "ok"
    assert outcome.operations.get("send:ok", 0) > 100, outcome.operations
    # The clients of every zone went through their zone's broker, which routed the partitions
    # other brokers lead and served them from its snapshot reads.
    for node_id in (1, 2, 3):
        log = (out / "data" / f"broker-{node_id}.log").read_text()
        assert "for clients of zone az" + str(node_id) in log, log[-3000:]
        assert "snapshot read serves" in log, log[-3000:]
