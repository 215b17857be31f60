"""The broker's log over a session, read from a broker process' stderr: one INFO line per topic
created and deleted, per group rebalance, per burst of client connections, for recovery at start
and for the upload at shutdown, each with its ``key=value`` fields; a TLS client on the plaintext
listener is named once, however often it retries; ``automq-ref serve --log-level`` chooses what
is written."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.checker.cluster import SERVING
from tests.e2e.conftest import BrokerProcess
from tests.unit.test_broker_logs import parse_fields


def info_lines(broker: BrokerProcess, start: str) -> list[dict[str, str]]:
    """The fields of the broker's INFO lines whose message starts with ``start``."""
    found = []
    for line in broker.log_path.read_text(errors="replace").splitlines():
        _, info, message = line.partition(" INFO ")
        if info and message.split(": ", 1)[-1].startswith(start):
            found.append(parse_fields(message.split(": ", 1)[1]))
    return found


def consume_in_group(bootstrap: str, topic: str, group: str, expected: int) -> int:
    consumers = [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
            }
        )
        for _ in range(2)
    ]
    for consumer in consumers:
        consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 30
    while seen < expected and time.monotonic() < deadline:
        for consumer in consumers:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen += 1
    for consumer in consumers:
        consumer.close()
    return seen


def tls_attempt(port: int) -> None:
    context = ssl.create_default_context()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost"):
                raise AssertionError("a TLS handshake completed on the plaintext listener")
        except (ssl.SSLError, OSError):
            pass


def test_a_session_reads_as_one_line_per_event(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        topic, group = "orders", "readers"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, 3, config={"retention.ms": "3600000"})])[
            topic
        ].result()
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for index in range(100):
            producer.produce(topic, str(index).encode())
        assert producer.flush(30) == 0
        assert consume_in_group(broker.bootstrap, topic, group, 100) == 100
        for _ in range(5):
            tls_attempt(broker.port)
        broker.kill()  # what the WAL holds is replayed at the next start
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([topic])[topic].result()
    finally:
        if broker.alive():
            assert broker.stop() == 0

    # The topic, then the groups' internal topic, created by the first group request.
    created, internal = info_lines(broker, "topic created")
    assert (internal["topic"], internal["configs"]) == (
        "__consumer_offsets",
        "cleanup.policy=compact",
    )
    assert (created["topic"], created["partitions"], created["configs"]) == (
        topic,
        "3",
        "retention.ms=3600000",
    )
    (deleted,) = info_lines(broker, "topic deleted")
    assert (deleted["topic"], deleted["partitions"]) == (topic, "3")
    rebalances = info_lines(broker, "group rebalanced")
    assert rebalances and all(fields["group"] == group for fields in rebalances)
    # Both consumers in one generation (the first one may have had one to itself; on closing,
    # one may have rejoined alone before leaving).
    both = [fields for fields in rebalances if fields["members"] == "2"]
    assert both and both[0]["protocol"] == "range" and both[0]["leader"]
    assert [fields["generation"] for fields in rebalances] == [
        str(number) for number in range(1, len(rebalances) + 1)
    ]
    assert info_lines(broker, "client connected")
    recoveries = info_lines(broker, "WAL recovered")
    assert len(recoveries) == 2  # one per start
    assert recoveries[0]["records"] == "0"
    assert int(recoveries[1]["records"]) > 0 and int(recoveries[1]["bytes"]) > 0
    assert int(recoveries[1]["streams"]) >= 1
    (shutdown,) = info_lines(broker, "uploaded during=shutdown")
    assert int(shutdown["objects"]) >= 1
    log = broker.log_path.read_text(errors="replace")
    tls = [line for line in log.splitlines() if "TLS handshake on a plaintext listener" in line]
    assert len(tls) == 1, tls
    assert "security.protocol=PLAINTEXT" in tls[0] and " WARNING " in tls[0]


def serve(tmp_path: Path, level: str) -> str:
    """``automq-ref serve --log-level LEVEL`` with one client connection; its stderr."""
    command = [
        sys.executable,
        "-m",
        "automq_ref.cli",
        "serve",
        "--log-level",
        level,
        "--override",
        "listeners=PLAINTEXT://127.0.0.1:0",
        "--override",
        f"log.dirs={tmp_path / level}",
        "--override",
        "s3.wal.capacity=16777216",
    ]
    stderr_path = tmp_path / f"{level}.log"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=dict(os.environ)
        )
        assert process.stdout is not None
        match = None
        while match is None:
            line = process.stdout.readline()
            assert line, stderr_path.read_text()
            match = SERVING.search(line)
        socket.create_connection(("127.0.0.1", int(match.group(2))), timeout=10).close()
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    return stderr_path.read_text()


def test_log_level_chooses_what_is_written(tmp_path: Path) -> None:
    debug = serve(tmp_path, "DEBUG")  # any case
    assert " DEBUG automq_ref.kafka.server: connection opened client=127.0.0.1:" in debug
    info = serve(tmp_path, "info")
    assert " INFO automq_ref.node: node started " in info
    assert " INFO automq_ref.kafka.server: client connected " in info
    assert " DEBUG " not in info
    warning = serve(tmp_path, "warning")
    assert " INFO " not in warning
    refused = subprocess.run(
        [sys.executable, "-m", "automq_ref.cli", "serve", "--log-level", "loud"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "invalid choice: 'loud'" in refused.stderr
