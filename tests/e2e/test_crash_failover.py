"""Crash failover with real processes: three brokers on one etcd and one S3 bucket (moto), each
on the object WAL in that bucket, short sessions (2 s, heartbeats every 0.5 s) and a short
grace after a start (``failover.new.epoch.grace.ms`` 1 s).

- A broker killed (SIGKILL) and left dead: its partitions become writable on the survivors (a
  survivor took its WAL over, uploaded it as the dead node and closed its streams), and every
  record acknowledged before and after is read back at its offset, in order, none twice. The
  longest gap between two acknowledgements on its partitions across the kill (kill to writable,
  as clients see it) is printed, not asserted: the machine is shared. Started again, the broker
  finds nothing to recover.
- A broker paused (SIGSTOP) past its session is failed over while paused; a produce request
  queued to it meanwhile is answered with an error when it resumes (its reservation check
  fails, or it already knows it no longer leads), never acknowledged, and the record is not
  in the partition; then it notices it was fenced and starts again by itself.

One cluster serves the module (tests/e2e/test_cluster.py's helpers and producer); each test
starts from three live brokers. The same cluster with each broker's WAL on a WAL device process
of its own runs the kill in tests/e2e/test_crash_failover_device.py (:func:`failover_cluster`,
:func:`kill_one_and_check`).
"""

from __future__ import annotations

import contextlib
import datetime
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.serial import entity_reader
from kio.static.primitive import Records, i32

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.metadata import failover_trace as ft
from automq_ref.launch import wal_device_address, wal_device_command
from automq_ref.state_machines import failover as fo
from tests.conftest import MotoS3
from tests.e2e.test_cluster import (
    NODES,
    Cluster,
    RunningProducer,
    _receive,
    _whole,
    agreed_leaders,
    check,
    create_topic,
    describe,
    read_all,
    unique,
)
from tests.etcd_fixture import EtcdServer
from tests.unit.test_broker_node import request_frame
from tests.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

SESSION_MS = 2000
HEARTBEAT_MS = 500
TTL_MS = 2000
GRACE_MS = 1000
PARTITIONS = 6
PRODUCE = 0
WAL_DEVICE_BYTES = 64 * 1024 * 1024


class FailoverCluster(Cluster):
    """test_cluster's cluster, on S3 (moto) with the object WAL in the same bucket, or with
    ``wal="device"`` each broker's block WAL on a WAL device process of its own (the devices
    start before the brokers, run on when a broker is killed, and stop after them; broker 2's
    on a Unix socket, the others' on loopback ports)."""

    def __init__(
        self, root: Path, etcd: EtcdServer, moto: MotoS3, bucket: str, wal: str = "object"
    ) -> None:
        super().__init__(root, etcd)
        self.trace_dir = root / "failover-trace"  # every broker records its failover steps
        location = f"{bucket}?region={moto.region}&endpoint={moto.endpoint_url}&pathStyle=true"
        self.devices: dict[int, subprocess.Popen[bytes]] = {}
        wals: dict[int, tuple[str, ...]] = {node: (f"0@s3://{location}",) for node in NODES}
        if wal == "device":
            try:
                for node in NODES:
                    address = self._start_device(node, unix=node == NODES[1])
                    wals[node] = (f"0@device://{address}", f"s3.wal.capacity={WAL_DEVICE_BYTES}")
            except BaseException:
                self.stop_devices()
                raise
        common = (
            f"metadata.etcd.endpoints={etcd.endpoint}",
            f"cluster.id={self.cluster_id}",
            f"s3.data.buckets=0@s3://{location}",
            f"controller.lease.ttl.ms={TTL_MS}",
            f"broker.session.timeout.ms={SESSION_MS}",
            f"broker.heartbeat.interval.ms={HEARTBEAT_MS}",
            f"failover.new.epoch.grace.ms={GRACE_MS}",
            f"failover.trace.dir={self.trace_dir}",
        )
        env = {
            "AWS_ACCESS_KEY_ID": moto.access_key_id,
            "AWS_SECRET_ACCESS_KEY": moto.secret_access_key,
        }
        self.brokers = {
            node: BrokerProcess(
                root / f"broker-{node}",
                *common,
                f"node.id={node}",
                f"broker.rack=az{node}",
                f"s3.wal.path={wals[node][0]}",
                *wals[node][1:],
                env=env,
            )
            for node in NODES
        }

    def _start_device(self, node: int, unix: bool) -> str:
        """Start broker ``node``'s WAL device process (on a Unix socket or a free loopback
        port); the address it listens on."""
        home = self.root / f"wal-device-{node}"
        home.mkdir()
        log_path = home / "device.log"
        listen = str(home / "wal.sock") if unix else "127.0.0.1:0"
        with log_path.open("wb") as log_file:
            self.devices[node] = subprocess.Popen(
                wal_device_command(home / "wal", WAL_DEVICE_BYTES, listen),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        address: list[str] = []

        def listening() -> bool:
            found = wal_device_address(log_path.read_text(errors="replace"))
            assert self.devices[node].poll() is None, log_path.read_text(errors="replace")
            address.extend([found] if found else [])
            return bool(address)

        wait_until(listening, f"broker {node}'s WAL device listening")
        return address[0]

    def device_log(self, node: int) -> str:
        path = self.root / f"wal-device-{node}" / "device.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.stop_devices()

    def stop_devices(self) -> None:
        for device in self.devices.values():
            device.terminate()
        for device in self.devices.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                device.wait(30)
            if device.poll() is None:
                device.kill()
                device.wait()

    def log(self, node: int) -> str:
        path = self.brokers[node].log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def events_after(self, wall_s: float, *patterns: str) -> list[str]:
        """``+seconds pattern`` for the first log line after ``wall_s`` (time.time()) matching
        each pattern, over every broker's log: where a failover's time went."""
        found = []
        for pattern in patterns:
            times = [
                stamp
                for node in NODES
                for line in self.log(node).splitlines()
                if re.search(pattern, line) and (stamp := _stamp(line)) is not None
                if stamp > wall_s
            ]
            if times:
                found.append(f"+{min(times) - wall_s:.2f} s {pattern}")
        return found

    def failovers_done(self, failed: int) -> int:
        pattern = re.compile(rf"failover done failed_node={failed} ")
        return sum(len(pattern.findall(self.log(node))) for node in NODES)


def _stamp(line: str) -> float | None:
    """The wall-clock time a broker's log line starts with."""
    try:
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


@contextlib.contextmanager
def failover_cluster(
    request: pytest.FixtureRequest, moto_s3: MotoS3, wal: str = "object"
) -> Iterator[FailoverCluster]:
    """A module's cluster: started, yielded, stopped; on a failure the logs are kept."""
    root = Path(tempfile.mkdtemp(prefix=f"automq-ref-crash-failover-{wal}-"))
    failed_before = request.session.testsfailed
    (root / "etcd").mkdir()
    etcd = EtcdServer(root / "etcd")
    bucket = unique("failover")
    urllib.request.urlopen(
        urllib.request.Request(f"{moto_s3.endpoint_url}/{bucket}", data=b"", method="PUT"),
        timeout=10,
    ).read()
    made: FailoverCluster | None = None
    try:
        etcd.start()
        made = FailoverCluster(root, etcd, moto_s3, bucket, wal)
        for broker in made.brokers.values():
            broker.start()
        yield made
    finally:
        if made is not None:
            made.stop()
        etcd.stop()
        if request.session.testsfailed > failed_before:
            # The data goes (the objects were in moto's memory anyway), the logs stay.
            for path in [*root.glob("broker-*"), root / "etcd" / "data"]:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
            for path in root.glob("wal-device-*/wal"):
                path.unlink(missing_ok=True)
            print(f"\ncrash failover tests failed: the brokers' logs are kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, moto_s3: MotoS3) -> Iterator[FailoverCluster]:
    with failover_cluster(request, moto_s3) as made:
        yield made


@pytest.fixture(autouse=True)
def whole(cluster: FailoverCluster) -> Iterator[FailoverCluster]:
    cluster.heal()
    wait_until(lambda: _whole(cluster), "three live brokers agreeing on one controller")
    yield cluster
    cluster.heal()


@pytest.mark.parametrize("which", ["broker", "controller"])
def test_a_killed_broker_is_failed_over_and_its_partitions_take_records_again(
    cluster: FailoverCluster, which: str
) -> None:
    kill_one_and_check(cluster, which)


def kill_one_and_check(cluster: FailoverCluster, which: str) -> int:
    """Kill a broker leading partitions (the active controller or not) under a producer; its
    partitions take records again on the survivors and every acknowledged record is read back
    once, in order; started again, it finds nothing to recover. The broker killed."""
    topic = unique("crash")
    create_topic(cluster.bootstrap(), topic, PARTITIONS)
    led = agreed_leaders(cluster, topic)
    controller = cluster.controller()
    # A broker that leads partitions, the active controller or another one (killing the
    # controller adds its election to the time: the new one gives every broker a whole session).
    victim = next(
        n for n in NODES if (n == controller) == (which == "controller") and n in led.values()
    )
    survivors = [n for n in NODES if n != victim]
    orphaned = sorted(p for p, n in led.items() if n == victim)
    before = cluster.failovers_done(victim)
    with RunningProducer(
        cluster.bootstrap(),
        topic,
        tuple(range(PARTITIONS)),
        interval_s=0.05,
        diagnose=lambda: describe(cluster, topic),
    ) as producer:
        producer.wait_acked(range(PARTITIONS), 0.0, "before the kill")
        time.sleep(1.0)  # some records acknowledged into the victim's WAL, not yet uploaded
        killed_at, killed_wall = time.monotonic(), time.time()
        cluster.brokers[victim].kill()
        producer.wait_acked(orphaned, killed_at, f"on broker {victim}'s partitions after the kill")
        # The longest silence between two acknowledgements across the kill (an acknowledgement
        # the victim sent just before it died may reach the callback just after the kill).
        writable_s = max(producer.longest_gap(p, killed_at, time.monotonic()) for p in orphaned)
        print(
            f"\nkill to writable: {writable_s:.2f} s for {which} {victim}'s partitions {orphaned} "
            f"(session {SESSION_MS} ms, heartbeat {HEARTBEAT_MS} ms, grace {GRACE_MS} ms)"
        )
        producer.wait_acked(range(PARTITIONS), time.monotonic(), "after the failover")
    print(
        "after the kill: "
        + ", ".join(
            cluster.events_after(
                killed_wall,
                rf"failover assigned failed_node={victim} ",
                rf"failover done failed_node={victim} ",
                rf"partition led topic={topic} ",
            )
        )
    )
    assert not producer.failures, producer.failures[:5]
    assert cluster.failovers_done(victim) > before, "no survivor logged the failover"
    record_crash(cluster, victim)
    assert_failover_recorded(cluster, victim)
    if which == "broker" and shutil.which("java") is not None:
        assert_trace_is_a_behaviour_until_the_restart(cluster, victim)
    log = read_all(cluster.bootstrap(survivors), topic, PARTITIONS)
    check(log, producer.acks, ["ck"])
    # Started again, the broker finds its WAL taken over and uploaded: nothing to recover.
    cluster.brokers[victim].start()
    recovered = re.findall(r"WAL recovered records=(\d+)", cluster.log(victim))
    assert recovered and recovered[-1] == "0", recovered[-3:]
    return victim


def record_crash(cluster: FailoverCluster, victim: int) -> None:
    """The kill, as this test's own trace step: right after the victim's last recorded step
    (a process killed takes no step after its last)."""
    mine = [s for s in ft.read_steps(cluster.trace_dir) if s.process.startswith(f"node{victim}-")]
    last = max((s.index for s in mine), default=0)
    ft.FailoverTrace(cluster.trace_dir, "test", lambda: last).record(fo.Crash(victim))


def assert_trace_is_a_behaviour_until_the_restart(cluster: FailoverCluster, victim: int) -> None:
    """The three processes' traces of a fresh cluster, merged and replayed through the
    machine up to the victim's restart, are a behaviour of specs/Failover.tla. (After the
    restart partitions move back to it from live brokers, a close the spec leaves out.) The
    machine refuses only a first start's EndGrace (the machine's nodes start outside their
    grace) and the round's ClearFailover of a context the takeover already removed."""
    steps = ft.merge(ft.read_steps(cluster.trace_dir))
    restarts = [n for n, s in enumerate(steps) if s.event == fo.Restart(victim)]
    steps = steps[: restarts[0]] if restarts else steps
    replayed = ft.replay(ft.events_of(steps))
    refused = {(type(event).__name__, error) for _, event, error in replayed.refused}
    assert refused <= {
        ("EndGrace", fo.FailoverError.NOT_IN_GRACE),
        ("ClearFailover", fo.FailoverError.NO_FAILOVER_TASK),
    }, replayed.refused
    assert ft.effect_mismatches(steps, replayed) == []
    lines = [tv.TraceLine(action, state) for action, state in ft.tla_lines(replayed)]
    verdict = tv.validate(lines, "Failover")
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}"


def assert_failover_recorded(cluster: FailoverCluster, victim: int) -> None:
    """The brokers' trace files, merged by metadata log index, hold the victim's last failover
    as the machine's steps, in its order: the active controller's AssignFailover, then its
    target's FenceWal, RecoverFailedWal and CloseFailedStreams (recorded by other processes)."""
    steps = ft.merge(ft.read_steps(cluster.trace_dir))
    assigned = [
        number
        for number, step in enumerate(steps)
        if isinstance(step.event, fo.AssignFailover) and step.event.failed_node_id == victim
    ]
    assert assigned, [step.event for step in steps][-20:]
    target = steps[assigned[-1]].event.target_node_id  # type: ignore[union-attr]
    taken = [
        type(step.event).__name__
        for step in steps[assigned[-1] :]
        if getattr(step.event, "target_node_id", None) == target
        and not isinstance(step.event, fo.AssignFailover)
    ]
    assert taken[:3] == ["FenceWal", "RecoverFailedWal", "CloseFailedStreams"], taken


def produce_frame(topic: str, partition: int, value: bytes) -> bytes:
    frame = request_frame(
        PRODUCE,
        9,
        7,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=20),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(
                    PartitionProduceData(
                        index=i32(partition), records=Records(build_record_batch([(None, value)]))
                    ),
                ),
            ),
        ),
    )
    return struct.pack(">i", len(frame)) + frame


def produce_answer(sock: socket.socket) -> int | None:
    """The error code of the one partition answered, or None when the broker closed the
    connection without answering."""
    try:
        size = struct.unpack(">i", _receive(sock, 4))[0]
        data = _receive(sock, size)
    except (ConnectionError, TimeoutError, OSError):
        return None
    cls: Any = load_response_schema(PRODUCE, 9)
    _, offset = entity_reader(cls.__header_schema__)(data, 0)
    answer, _ = entity_reader(cls)(data, offset)
    (topic,) = answer.responses
    (partition,) = topic.partition_responses
    return int(partition.error_code)


def test_a_zombie_acknowledges_nothing_after_its_failover(cluster: FailoverCluster) -> None:
    controller = cluster.controller()
    zombie = next(n for n in NODES if n != controller)
    others = [n for n in NODES if n != zombie]
    topic = unique("zombie")
    assignment = [[zombie], [others[0]], [others[1]]]
    create_topic(cluster.bootstrap(), topic, 3, assignment)
    agreed_leaders(cluster, topic)
    before = cluster.failovers_done(zombie)
    restarts = cluster.brokers[zombie].fenced_restarts()
    zombie_value = b"written-by-the-zombie"
    with RunningProducer(
        cluster.bootstrap(others),
        topic,
        (0, 1, 2),
        interval_s=0.05,
        diagnose=lambda: describe(cluster, topic),
        # Kept with the brokers' logs when the module fails: once (1 run in about 10), this
        # producer stopped sending to partition 0 after the zombie came back until its records
        # timed out; the brokers' logs showed nothing refused.
        client_log=cluster.root / f"{topic}-ck-client.log",
    ) as producer:
        producer.wait_acked((0, 1, 2), 0.0, "before the pause")
        time.sleep(1.0)
        paused_at = time.monotonic()
        cluster.pause(zombie)
        # Queued in the kernel while the zombie is stopped: it reads it when it resumes.
        sock = socket.create_connection(("127.0.0.1", cluster.brokers[zombie].port), timeout=30)
        sock.sendall(produce_frame(topic, 0, zombie_value))
        wait_until(lambda: cluster.failovers_done(zombie) > before, "the zombie's failover")
        failed_over_s = time.monotonic() - paused_at
        # The first producer's requests to the zombie wait for it (or for their timeout): a
        # second one, started now, finds the partition on its new broker.
        with RunningProducer(
            cluster.bootstrap(others),
            topic,
            (0,),
            name="ck2",
            interval_s=0.05,
            diagnose=lambda: describe(cluster, topic),
        ) as second:
            second.wait_acked((0,), paused_at, "on the zombie's partition, on a survivor")
        writable_s = min(a.at for a in second.acks) - paused_at
        print(
            f"\npause to failed over: {failed_over_s:.2f} s, "
            f"to writable again: {writable_s:.2f} s (session {SESSION_MS} ms)"
        )
        cluster.resume(zombie)
        with sock:
            code = produce_answer(sock)
        assert code != 0, "the zombie acknowledged a record after its failover"
        print(f"the zombie answered its queued produce with error code {code}")
        wait_until(
            lambda: cluster.brokers[zombie].fenced_restarts() > restarts,
            "the zombie noticing it was fenced and starting again",
        )
        producer.wait_acked((0, 1, 2), time.monotonic(), "after the zombie came back")
    assert not producer.failures, producer.failures[:5]
    assert not second.failures, second.failures[:5]
    log = read_all(cluster.bootstrap(others), topic, 3)
    check(log, [*producer.acks, *second.acks], ["ck", "ck2"])
    assert all(value != zombie_value for records in log.values() for _, value in records)
