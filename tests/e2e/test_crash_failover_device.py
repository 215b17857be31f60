"""Crash failover on WAL devices: the cluster of tests/e2e/test_crash_failover.py (three brokers
on etcd, objects in moto, 2 s sessions), each broker's block WAL on a WAL device process of its
own (``s3.wal.path=0@device://127.0.0.1:PORT``), the stand-in for an EBS volume multi-attached
with NVMe reservations.

A broker (not its device) is killed with SIGKILL under an idempotent acks=all producer: the
controller's round names the dead broker's own device (published at its registration), a
survivor preempts the reservation there, recovers and uploads what the WAL holds and closes the
streams; its partitions take records again on the survivors and every acknowledged record is
read back once, in order. Started again, the broker finds its WAL emptied by the takeover.

Every broker's WAL is in a place of its own (brokers 1 and 3 on loopback ports, broker 2, often
the one killed, on a Unix socket): the WAL taken over is the dead broker's, never the
controller's. A cluster mixing the object WAL and devices is not run here (it would double the
time); the round's choice of the failed node's own WAL across kinds is
tests/unit/test_failover_wal_locations.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.conftest import MotoS3
from tests.e2e.test_cluster import NODES
from tests.e2e.test_crash_failover import (
    FailoverCluster,
    failover_cluster,
    kill_one_and_check,
    whole,  # noqa: F401 - the autouse fixture: every test starts from three live brokers
)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, moto_s3: MotoS3) -> Iterator[FailoverCluster]:
    with failover_cluster(request, moto_s3, wal="device") as made:
        yield made


def test_a_killed_broker_on_a_wal_device_is_failed_over(cluster: FailoverCluster) -> None:
    victim = kill_one_and_check(cluster, "broker")
    # The takeover happened on the victim's own device (the one it published), by a survivor
    # registered in failover mode as the victim; the other devices saw no preempt.
    preempts = {
        node: re.findall(r"wal-device: (.*) preempted (.*)", cluster.device_log(node))
        for node in NODES
    }
    assert not any(preempts[node] for node in NODES if node != victim), preempts
    assert any(
        taker.startswith(f"node {victim} epoch ") and taker.endswith("(failover)")
        for taker, _ in preempts[victim]
    ), preempts
