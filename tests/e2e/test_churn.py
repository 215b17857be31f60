"""Client churn: producers that keep produce requests in flight (acks=1 and acks=all,
confluent-kafka and kafka-python) killed at random moments, several at a time.

A connection that goes away with responses not yet written must not leave anything behind: the
broker's log shows no ``coroutine ... was never awaited`` (the listener closes the answers it
will not write), and every record a producer saw acknowledged is in the log at the offset it was
given.
"""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S, wait_until

PARTITIONS = 3
CLIENTS = ["confluent", "kafka-python"]
ACKS = ["1", "all"]
ROUNDS = 6  # each round runs one producer per (client, acks) pair
CHURN_SEED = 20261125

REPOSITORY = Path(__file__).resolve().parents[2]


def acknowledged_by(output: str) -> dict[tuple[int, int], str]:
    acked: dict[tuple[int, int], str] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ack":
            acked[(int(parts[1]), int(parts[2]))] = parts[3]
    return acked


class ChurnClient:
    """A ``churn_client`` process and its output so far (read on a thread as it comes)."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPOSITORY)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def producing(self) -> bool:
        """True once a record was acknowledged: connected, and sends in flight."""
        if self.lines:
            return True
        assert self.process.poll() is None, "a producer exited before it was killed"
        return False

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    def output(self) -> str:
        """Everything it printed, once it has ended."""
        self.process.wait(timeout=PATIENCE_S)
        self._reader.join(timeout=PATIENCE_S)
        return "".join(self.lines)


def all_producing(producers: list[ChurnClient]) -> bool:
    return all(producer.producing() for producer in producers)


def read_everything(bootstrap: str, topic: str) -> dict[tuple[int, int], str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"churn-check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, index, 0) for index in range(PARTITIONS)])
    found: dict[tuple[int, int], str] = {}
    ended: set[int] = set()
    deadline = time.monotonic() + PATIENCE_S
    while len(ended) < PARTITIONS:
        assert time.monotonic() < deadline, "could not read the topic back"
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            assert error.code() == error._PARTITION_EOF, error
            ended.add(message.partition() or 0)
            continue
        value = message.value() or b""
        found[(message.partition() or 0, message.offset() or 0)] = value.split(b"|")[0].decode()
    consumer.close()
    return found


def test_producers_killed_mid_flight_leave_nothing_behind(broker: BrokerProcess) -> None:
    topic = f"churn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    chooser = random.Random(CHURN_SEED)
    acked: dict[tuple[int, int], str] = {}
    for round_number in range(ROUNDS):
        producers = []
        for client in CLIENTS:
            for acks in ACKS:
                prefix = f"r{round_number}-{client}-{acks}"
                command = [
                    sys.executable,
                    "-m",
                    "tests.e2e.churn_client",
                    client,
                    broker.bootstrap,
                    topic,
                    acks,
                    prefix,
                ]
                producers.append(ChurnClient(command))
        # Long enough to connect and produce (the imports take most of a second, several on a
        # busy machine: so also until each has had a record acknowledged), then kill each at
        # its own moment: requests are in flight, answers queued behind a WAL sync.
        try:
            time.sleep(1.5)
            wait_until(functools.partial(all_producing, producers), "every producer to produce")
            for producer in producers:
                time.sleep(chooser.uniform(0.0, 0.3))
                producer.kill()
        finally:
            for producer in producers:
                producer.kill()  # again, or first if the wait failed: none is left running
        for producer in producers:
            acked.update(acknowledged_by(producer.output()))
    assert len(acked) > 100, "the producers were killed before they produced"
    for client in CLIENTS:
        assert any(f"-{client}-" in value for value in acked.values()), f"{client} acked nothing"
    found = read_everything(broker.bootstrap, topic)
    missing = {place: value for place, value in acked.items() if found.get(place) != value}
    assert not missing, f"{len(missing)} acknowledged records are not where they were acked"
    log = broker.log_path.read_text()
    assert "was never awaited" not in log, log[-3000:]
