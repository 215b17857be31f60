"""A broker of three stopped with SIGTERM while a producer runs (confluent-kafka, idempotent,
acks=all): it hands its partitions over (a controlled shutdown) and exits 0 within its bound;
every partition it led is led by a survivor; nothing acknowledged is lost or reordered; started
again with the same node id, it recovers nothing from its WAL (the stop uploaded it all) and
takes partitions again.

The cluster is ``tests/e2e/test_cluster.py``'s (three ``automq-ref serve`` processes on one
etcd and a shared object store directory), one for this module. The longest gap between
acknowledgements on each partition handed over is printed (``bench/handover_bench.py``
measures it; the test asserts only that every partition takes records again).
"""

from __future__ import annotations

import time

from tests.e2e import test_cluster as base
from tests.e2e.test_cluster import (
    NODES,
    PARTITIONS,
    Cluster,
    RunningProducer,
    agreed_leaders,
    check,
    create_topic,
    describe,
    read_all,
    unique,
)
from tests.waiting import wait_until

# The module's own cluster (one per module), each test on a whole one.
cluster = base.cluster
whole = base.whole

# controlled.shutdown.timeout.ms's default, and what the final close may take after it.
HANDOVER_BOUND_S = 60.0
CLOSE_MARGIN_S = 30.0


def test_sigterm_hands_the_partitions_over(cluster: Cluster) -> None:
    topic = unique("handover")
    create_topic(cluster.bootstrap(), topic, PARTITIONS)
    before = agreed_leaders(cluster, topic)
    controller = cluster.controller()
    # Not the controller: this is about the handover, not the election.
    victim = next(node for node in NODES if node != controller)
    survivors = tuple(node for node in NODES if node != victim)
    led = sorted(index for index, leader in before.items() if leader == victim)
    assert led, before
    broker = cluster.brokers[victim]
    log_from = len(broker.log_path.read_text().splitlines())

    with RunningProducer(
        cluster.bootstrap(),
        topic,
        tuple(range(PARTITIONS)),
        diagnose=lambda: describe(cluster, topic),
    ) as producer:
        producer.wait_acked(range(PARTITIONS), 0.0, "before the stop")
        stopped = time.monotonic()
        broker.terminate()
        code = broker.wait_stopped(HANDOVER_BOUND_S + CLOSE_MARGIN_S)
        exit_s = time.monotonic() - stopped
        after = agreed_leaders(cluster, topic, survivors)
        producer.wait_acked(range(PARTITIONS), time.monotonic(), "after the stop")
        gaps = {index: producer.longest_gap(index, stopped, time.monotonic()) for index in led}
        restarted = len(broker.log_path.read_text().splitlines())
        broker.start()  # the same node id, data directory and port
        wait_until(lambda: base._leads_some(cluster, victim), f"broker {victim} leading again")
        producer.wait_acked(range(PARTITIONS), time.monotonic(), "after the restart")

    print(
        f"\nbroker {victim} stopped (exit {code}) after {exit_s:.2f} s; the longest gap on "
        "each partition it led: " + ", ".join(f"{i}: {g:.3f} s" for i, g in gaps.items())
    )
    assert code == 0, f"broker {victim} exited {code} after {exit_s:.1f} s"
    assert not producer.failures, producer.failures[:5]
    assert all(after[index] in survivors for index in led), after
    lines = broker.log_path.read_text().splitlines()
    done = [line for line in lines[log_from:restarted] if "controlled shutdown done" in line]
    assert len(done) == 1 and "left=0" in done[0] and "timed_out=False" in done[0], done
    recovered = [line for line in lines[restarted:] if "WAL recovered" in line]
    assert recovered and " records=0 " in recovered[0], recovered
    check(read_all(cluster.bootstrap(), topic, PARTITIONS), producer.acks, ["ck"])
