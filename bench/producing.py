"""What the produce benchmarks share: librdkafka's delivery reports counted, and records sent
round-robin over a topic's partitions while the producer's queue has room."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer


@dataclass
class Delivery:
    """Counts delivery reports; the first error is kept."""

    delivered: int = 0
    error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.error = self.error or error
        else:
            self.delivered += 1

    def check(self, what: str, expected: int) -> None:
        if self.error is not None:
            raise RuntimeError(f"{what}: delivery failed: {self.error}")
        if self.delivered != expected:
            raise RuntimeError(f"{what}: {self.delivered} of {expected} delivered")


def produce_some(
    producer: Producer,
    topic: str,
    partitions: int,
    payload: bytes,
    count: int,
    delivery: Delivery,
) -> None:
    """``count`` records, round-robin over the partitions, waiting while librdkafka's queue is
    full."""
    sent = 0
    while sent < count:
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=delivery)
        except BufferError:
            producer.poll(0.005)
            continue
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
