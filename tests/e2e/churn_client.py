"""A producer that runs until it is killed: ``python -m tests.e2e.churn_client CLIENT BOOTSTRAP
TOPIC ACKS PREFIX``, CLIENT ``confluent`` or ``kafka-python``. It keeps many produce requests in
flight and prints ``ack PARTITION OFFSET ID`` for every acknowledged record (ID: what its value
starts with) (flushed at once,
so what the parent reads after the kill is exactly what was acknowledged)."""

from __future__ import annotations

import itertools
import sys
from typing import Any


def main(client: str, bootstrap: str, topic: str, acks: str, prefix: str) -> None:
    def acknowledged(partition: int, offset: int, value: bytes) -> None:
        sys.stdout.write(f"ack {partition} {offset} {value.split(b'|')[0].decode()}\n")
        sys.stdout.flush()

    def record(number: int) -> bytes:
        return f"{prefix}-{number}|".encode().ljust(2000, b".")

    if client == "confluent":
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": acks,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "max.in.flight.requests.per.connection": 5,
                "enable.idempotence": False,
            }
        )

        def delivered(error: Any, message: Any) -> None:
            if error is None:
                acknowledged(message.partition(), message.offset(), message.value())

        for number in itertools.count():
            while True:
                try:
                    producer.produce(topic, record(number), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
    else:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks=int(acks) if acks != "all" else "all",
            linger_ms=0,
            max_in_flight_requests_per_connection=5,
        )
        for number in itertools.count():
            value = record(number)
            future = producer.send(topic, value)
            future.add_callback(
                lambda metadata, value=value: acknowledged(
                    metadata.partition, metadata.offset, value
                )
            )


if __name__ == "__main__":
    main(*sys.argv[1:6])
