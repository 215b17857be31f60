"""The zoned clients of ``tests/e2e/test_zone_clients.py``, run inside a zone's namespace
(``ip netns exec NS python -m tests.e2e.zone_clients_tool ...``): real clients (confluent-kafka
and kafka-python) declaring their zone in ``client.id`` (``automq_az=<zone>``) and bootstrapped
from their zone's broker. Each command prints one JSON line.

- ``produce --bootstrap B --topic T --zone Z --partitions N --count C [--seconds S]``: one
  producer of each library (acks=all, idempotent where the library has it), C records each,
  round-robin over the N partitions, values ``<zone>/<library>/<sequence>``; with ``--seconds``
  the records are spread over that long. Records that fail (a cut-off zone) are counted, not
  raised. Prints ``{"acked": [[partition, offset, value], ...], "failed": n}``.
- ``consume --bootstrap B --topic T --zone Z --ends JSON``: a consumer of each library reads
  every partition from the beginning up to the given end offsets (``{partition: end}``); prints
  ``{"confluent": {partition: [[offset, value], ...]}, "kafka-python": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError as PythonKafkaError

PATIENCE_S = 60.0


def produce_confluent(arguments: argparse.Namespace) -> tuple[list[list[Any]], int]:
    producer = Producer(
        {
            "bootstrap.servers": arguments.bootstrap,
            "client.id": f"automq_az={arguments.zone}&automq_type=producer",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            # A cut-off zone's records fail after this; what was acknowledged before counts.
            "delivery.timeout.ms": 20000,
        }
    )
    acked: list[list[Any]] = []
    failed = [0]

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            acked.append([message.partition(), message.offset(), (message.value() or b"").decode()])
        else:
            failed[0] += 1

    started = time.monotonic()
    for sequence in range(arguments.count):
        due = started + arguments.seconds * sequence / max(1, arguments.count)
        while time.monotonic() < due:
            producer.poll(0.01)
        value = f"{arguments.zone}/confluent/{sequence}".encode()
        while True:
            try:
                producer.produce(
                    arguments.topic,
                    value=value,
                    partition=sequence % arguments.partitions,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.05)
    remaining = producer.flush(PATIENCE_S)
    return acked, failed[0] + remaining


def produce_kafka_python(arguments: argparse.Namespace) -> tuple[list[list[Any]], int]:
    producer = KafkaProducer(
        bootstrap_servers=arguments.bootstrap,
        client_id=f"automq_az={arguments.zone}&automq_type=producer",
        acks="all",
        linger_ms=5,
        # One request in flight per broker: retries cannot reorder (kafka-python is not
        # idempotent).
        max_in_flight_requests_per_connection=1,
        retries=5,
        request_timeout_ms=10000,
    )
    acked: list[list[Any]] = []
    failed = 0
    futures = []
    started = time.monotonic()
    for sequence in range(arguments.count):
        due = started + arguments.seconds * sequence / max(1, arguments.count)
        time.sleep(max(0.0, due - time.monotonic()))
        value = f"{arguments.zone}/kafka-python/{sequence}"
        futures.append(
            (
                value,
                producer.send(
                    arguments.topic,
                    value=value.encode(),
                    partition=sequence % arguments.partitions,
                ),
            )
        )
    for value, future in futures:
        try:
            metadata = future.get(timeout=PATIENCE_S)
        except PythonKafkaError:
            failed += 1
            continue
        acked.append([metadata.partition, metadata.offset, value])
    producer.close(timeout=10)
    return acked, failed


def consume_confluent(arguments: argparse.Namespace, ends: dict[int, int]) -> dict[int, list[Any]]:
    consumer = Consumer(
        {
            "bootstrap.servers": arguments.bootstrap,
            "client.id": f"automq_az={arguments.zone}&automq_type=consumer",
            "group.id": f"zone-clients-{arguments.zone}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign(
        [ConfluentPartition(arguments.topic, p, OFFSET_BEGINNING) for p in sorted(ends)]
    )
    read: dict[int, list[Any]] = {p: [] for p in ends}
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if all(read[p][-1][0] + 1 >= end if read[p] else end == 0 for p, end in ends.items()):
            break
        message = consumer.poll(0.2)
        if message is None or message.error() is not None:
            continue
        partition = message.partition() or 0
        read[partition].append([message.offset(), (message.value() or b"").decode()])
    consumer.close()
    return read


def consume_kafka_python(
    arguments: argparse.Namespace, ends: dict[int, int]
) -> dict[int, list[Any]]:
    consumer = KafkaConsumer(
        bootstrap_servers=arguments.bootstrap,
        client_id=f"automq_az={arguments.zone}&automq_type=consumer",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    partitions = [TopicPartition(arguments.topic, p) for p in sorted(ends)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    read: dict[int, list[Any]] = {p: [] for p in ends}
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if all(read[p][-1][0] + 1 >= end if read[p] else end == 0 for p, end in ends.items()):
            break
        for tp, records in consumer.poll(timeout_ms=200).items():
            for record in records:
                read[tp.partition].append([record.offset, record.value.decode()])
    consumer.close()
    return read


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("produce", "consume"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--zone", required=True)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--ends", default="{}")
    arguments = parser.parse_args()
    result: dict[str, Any]
    if arguments.command == "produce":
        # Both at once, so that both are producing while a zone is cut off.
        with ThreadPoolExecutor(2) as pool:
            confluent_run = pool.submit(produce_confluent, arguments)
            python_run = pool.submit(produce_kafka_python, arguments)
            confluent, confluent_failed = confluent_run.result()
            python, python_failed = python_run.result()
        result = {"acked": confluent + python, "failed": confluent_failed + python_failed}
    else:
        ends = {int(p): int(end) for p, end in json.loads(arguments.ends).items()}
        result = {
            "confluent": consume_confluent(arguments, ends),
            "kafka-python": consume_kafka_python(arguments, ends),
        }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
