"""``make cluster``'s command, ``automq-ref cluster``, as a user runs it: it starts etcd, an S3
server (moto) and three brokers, prints the bootstrap line once all three serve, carries
``--override`` to every broker, and at SIGTERM stops every process it started, the brokers
gracefully, and exits 0.

The launcher runs with ``--base-port 0`` (each broker binds a free port, never 9092-9094,
and the bootstrap line names them) in a temporary directory; real clients (confluent-kafka)
create a topic, produce and consume through the bootstrap list, and clients declaring zone az2
produce and consume through node 2 alone (the zone router: issue 18, item 5).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from automq_ref.launch import BROKERS
from tests.waiting import wait_until

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
RECORDS = 20
ZONED_PARTITIONS = 3
ZONED_RECORDS = 30


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc/PID/stat's fourth field)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def knows_topic(address: str, topic: str) -> bool:
    """Whether the broker at ``address`` lists ``topic`` with a leader in its Metadata."""
    admin = AdminClient({"bootstrap.servers": address, "allow.auto.create.topics": False})
    found = admin.list_topics(topic, timeout=10).topics.get(topic)
    return found is not None and found.error is None and bool(found.partitions)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    data_dir = tmp_path / "cluster"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "automq_ref.cli",
            "cluster",
            "--base-port",
            "0",  # a free port per broker
            "--data-dir",
            str(data_dir),
            "--override",
            "s3.wal.capacity=67108864",
            "--override",
            "group.initial.rebalance.delay.ms=0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield process, data_dir
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_make_cluster_serves_three_brokers_and_stops_gracefully(
    launcher: tuple[subprocess.Popen[str], Path],
) -> None:
    process, data_dir = launcher
    assert process.stdout is not None
    started = time.monotonic()
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("bootstrap.servers="):
            break
        assert time.monotonic() - started < START_TIMEOUT_S, "".join(output)
    assert output and output[-1].startswith("bootstrap.servers="), "".join(output)
    bootstrap = output[-1].strip().removeprefix("bootstrap.servers=")
    ports = [int(address.removeprefix("127.0.0.1:")) for address in bootstrap.split(",")]
    assert len(set(ports)) == BROKERS and 0 not in ports, bootstrap
    print(f"bootstrap line after {time.monotonic() - started:.1f} s")
    pids = children_of(process.pid)
    # etcd, moto and three brokers
    assert len(pids) == BROKERS + 2, pids

    # Every broker got its node id, its rack and the overrides passed to the command.
    for node_id in range(1, BROKERS + 1):
        log = (data_dir / f"broker-{node_id}.log").read_text()
        assert f"node started node_id={node_id} " in log
        assert f"serving Kafka on 127.0.0.1:{ports[node_id - 1]}" in log

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("made", 1)], request_timeout=30).values():
        future.result(40)
    # Until brokers learn topics that another broker created (docs/cluster.md, "What is not
    # there yet"), a client whose metadata request lands on such a broker never finds the
    # topic: the clients bootstrap from the brokers that know it (all three once they do).
    clients_bootstrap = ",".join(
        address for address in bootstrap.split(",") if knows_topic(address, "made")
    )
    assert clients_bootstrap, "no broker lists the topic it created"
    # The zone router is on: a client declaring zone az2 is told node 2 leads the topic, one
    # without a zone the real leader (zoned_clients_stay_in_az2 produces and consumes so).
    for client_id, leaders in [("automq_az=az2", {2}), ("made-client", {1, 2, 3})]:
        admin = AdminClient({"bootstrap.servers": clients_bootstrap, "client.id": client_id})
        (partition,) = admin.list_topics("made", timeout=30).topics["made"].partitions.values()
        assert partition.leader in leaders, (client_id, partition.leader)
        assert client_id == "made-client" or partition.replicas == [2]
    producer = Producer({"bootstrap.servers": clients_bootstrap, "enable.idempotence": True})
    for index in range(RECORDS):
        producer.produce("made", value=f"record-{index}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": clients_bootstrap, "group.id": "made", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("made", 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < RECORDS and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value() or b"")
    consumer.close()
    assert values == [f"record-{index}".encode() for index in range(RECORDS)]

    zoned_clients_stay_in_az2(bootstrap.split(",")[1], data_dir)
    every_broker_has_metrics(output, ports)

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=STOP_TIMEOUT_S)
    assert process.returncode == 0, "".join(output) + rest
    assert re.search(r"stopping brokers .*then etcd and S3", rest), rest
    assert rest.rstrip().endswith("automq-ref cluster: stopped"), rest
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=10, what="children gone")
    for node_id in range(1, BROKERS + 1):
        log = (data_dir / f"broker-{node_id}.log").read_text()
        assert "shutting down: uploading the WAL's data" in log, log[-2000:]
        assert log.rstrip().endswith("automq-ref: stopped"), log[-2000:]


def every_broker_has_metrics(output: list[str], ports: list[int]) -> None:
    """Each broker's Prometheus endpoint, named in the launcher's lines, answers a scrape that
    prometheus_client parses, with the Produce requests the clients sent it."""
    urls = {
        int(match.group(1)): match.group(2)
        for line in output
        if (match := re.search(r"broker (\d+) .*, metrics (\S+)$", line.strip()))
    }
    assert sorted(urls) == list(range(1, BROKERS + 1)), "".join(output)
    produced = 0.0
    for node_id, url in urls.items():
        assert f":{ports[node_id - 1]}" not in url  # a port of its own
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        families = {family.name: family for family in text_string_to_metric_families(text)}
        assert "kafka_request_count" in families, text[:500]
        produced += sum(
            sample.value
            for sample in families["kafka_request_count"].samples
            if sample.labels.get("type") == "Produce"
        )
    assert produced > 0


def _requests_by_node(stats: list[str]) -> dict[int, dict[str, int]]:
    """Produce and Fetch requests the client sent to each broker (node id), from its last
    librdkafka statistics report (cumulative counters per broker connection)."""
    sent: dict[int, dict[str, int]] = {}
    for broker in json.loads(stats[-1])["brokers"].values():
        if broker["nodeid"] >= 0:  # not the bootstrap connection
            counts = sent.setdefault(broker["nodeid"], {"Produce": 0, "Fetch": 0})
            for api in counts:
                counts[api] += broker["req"].get(api, 0)
    return sent


def zoned_clients_stay_in_az2(node_2: str, data_dir: Path) -> None:
    """Issue 18 item 5: a producer and a consumer declaring zone az2 (client.id
    automq_az=az2), bootstrapped to node 2 only, are told node 2 leads every partition of a
    topic led by all three brokers; every acknowledged record is read back in order; node 2 is
    the only broker they send Produce or Fetch to (the clients' own request counters), and
    node 2's log says it routed the other leaders' partitions and served them from its
    snapshot reads."""
    topic = "zoned"
    admin = AdminClient({"bootstrap.servers": node_2})
    admin.create_topics([NewTopic(topic, ZONED_PARTITIONS)])[topic].result(40)
    wait_until(lambda: knows_topic(node_2, topic), timeout_s=30, what="node 2 knows the topic")
    plain = AdminClient({"bootstrap.servers": node_2, "client.id": "no-zone"})
    leaders = {
        index: partition.leader
        for index, partition in plain.list_topics(topic, timeout=30)
        .topics[topic]
        .partitions.items()
    }
    zoned: dict[str, Any] = {"bootstrap.servers": node_2, "client.id": "automq_az=az2"}
    seen = AdminClient(zoned).list_topics(topic, timeout=30).topics[topic].partitions
    assert {index: p.leader for index, p in seen.items()} == dict.fromkeys(leaders, 2)
    assert set(leaders.values()) - {2}, f"placement put every partition on node 2: {leaders}"

    stats: list[str] = []
    producer = Producer(
        {
            **zoned,
            "enable.idempotence": True,
            "statistics.interval.ms": 100,
            "stats_cb": stats.append,
        }
    )
    acknowledged: dict[int | None, list[tuple[int | None, bytes | None]]] = {
        index: [] for index in leaders
    }

    def delivered(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        acknowledged[message.partition()].append((message.offset(), message.value()))

    for index in range(ZONED_RECORDS):
        producer.produce(
            topic,
            f"zoned-{index}".encode(),
            partition=index % ZONED_PARTITIONS,
            on_delivery=delivered,
        )
    assert producer.flush(60) == 0
    time.sleep(0.3)
    producer.poll(0)  # the last statistics report
    produced = _requests_by_node(stats)
    assert sum(len(records) for records in acknowledged.values()) == ZONED_RECORDS

    consumer_stats: list[str] = []
    consumer = Consumer(
        {
            **zoned,
            "group.id": "zoned",
            "enable.auto.commit": False,
            "statistics.interval.ms": 100,
            "stats_cb": consumer_stats.append,
        }
    )
    consumer.assign([TopicPartition(topic, index, 0) for index in leaders])
    read: dict[int | None, list[tuple[int | None, bytes]]] = {index: [] for index in leaders}
    deadline = time.monotonic() + 60
    while sum(map(len, read.values())) < ZONED_RECORDS and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read[message.partition()].append((message.offset(), message.value() or b""))
    time.sleep(0.3)
    consumer.poll(0)
    consumer.close()
    assert read == acknowledged
    fetched = _requests_by_node(consumer_stats)

    assert produced[2]["Produce"] > 0 and fetched[2]["Fetch"] > 0, (produced, fetched)
    for node_id, counts in [*produced.items(), *fetched.items()]:
        if node_id != 2:
            assert counts == {"Produce": 0, "Fetch": 0}, (node_id, produced, fetched)
    log_2 = (data_dir / "broker-2.log").read_text()
    for index, leader in leaders.items():
        if leader != 2:
            assert (
                f"routing {topic}-{index} to its leader, node {leader}, for clients of zone az2"
                in log_2
            )
            assert f"snapshot read serves {topic}-{index} from offset 0" in log_2


def test_a_broker_that_dies_stops_the_cluster(
    launcher: tuple[subprocess.Popen[str], Path],
) -> None:
    process, _ = launcher
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("bootstrap.servers="):
            break
    pids = children_of(process.pid)
    broker_2 = [pid for pid in pids if b"node.id=2" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(broker_2) == 1, pids
    os.kill(broker_2[0], signal.SIGKILL)
    rest, _ = process.communicate(timeout=STOP_TIMEOUT_S)
    assert process.returncode == 1, rest
    assert "broker-2 exited on its own with code -9" in rest, rest
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=10, what="children gone")
