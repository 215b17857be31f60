"""A Kafka client the three-zone tests run inside a zone (``ip netns exec NS python -m
tests.e2e.zone_tool ...``): the zones' addresses exist only in their namespaces, so the test's
own process cannot be the client. Each command prints one JSON line.

- ``topic --bootstrap B --topic T --partitions N``: create the topic and wait until every
  broker of the bootstrap list names the same leader for each partition; prints
  ``{"leaders": {partition: node id}}``.
- ``produce --bootstrap B --topic T --partition P --count N --size S``: N records of S bytes
  each to partition P (acks=all, idempotent), all acknowledged; prints ``{"acked": N}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

PATIENCE_S = 120.0


def leaders_seen(address: str, topic: str) -> dict[int, int] | None:
    admin = AdminClient({"bootstrap.servers": address})
    found = admin.list_topics(topic, timeout=10).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return {p: meta.leader for p, meta in found.partitions.items()}


def topic(bootstrap: str, name: str, partitions: int) -> dict[str, object]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)], request_timeout=30).values():
        try:
            future.result(60)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        seen = [leaders_seen(address, name) for address in bootstrap.split(",")]
        first = seen[0]
        if (
            first is not None
            and len(first) == partitions
            and all(leader >= 0 for leader in first.values())
            and all(other == first for other in seen)
        ):
            return {"leaders": first}
        time.sleep(0.2)
    raise SystemExit(f"the brokers do not agree on {name}'s leaders: {seen}")


def produce(bootstrap: str, name: str, partition: int, count: int, size: int) -> dict[str, object]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "none",
        }
    )
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    value = bytes(size)
    for _ in range(count):
        while True:
            try:
                producer.produce(name, value=value, partition=partition, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(PATIENCE_S)
    if remaining or failures:
        raise SystemExit(f"{remaining} records unacknowledged, failures: {failures[:3]}")
    return {"acked": count}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("topic", "produce"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--size", type=int, default=0)
    arguments = parser.parse_args()
    if arguments.command == "topic":
        result = topic(arguments.bootstrap, arguments.topic, arguments.partitions)
    else:
        result = produce(
            arguments.bootstrap,
            arguments.topic,
            arguments.partition,
            arguments.count,
            arguments.size,
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
