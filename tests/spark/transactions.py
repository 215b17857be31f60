"""A topic written with Kafka transactions, for the Spark sources' ``kafka.isolation.level``.

:func:`write_transactions` writes, with confluent-kafka, into each of a new topic's two
partitions: plain records, a committed transaction, an aborted one, another committed one,
plain records, a transaction left open and plain records after it, and waits until the broker's
last stable offset stands at the open transaction (librdkafka's commit and abort return before
their markers land). It returns what each isolation level must read.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.spark.kafka_client import KafkaClient
from tests.waiting import wait_until

PARTITIONS = 2

# (partition, offset, value)
Written = tuple[int, int, bytes]


@dataclass
class Transactions:
    """What was written, sorted by (partition, offset)."""

    topic: str
    committed: list[Written]  # what read_committed returns: below the LSO, not aborted
    aborted: list[Written]  # the aborted transaction's
    everything: list[Written]  # every data record written: what read_uncommitted returns
    open_records: list[Written]  # the open transaction's
    after_open: list[Written]  # plain records written after the open transaction began
    open_producer: Producer  # its transaction is still open: commit or abort it
    stable: dict[int, int]  # per partition: the open transaction's first offset (the LSO)


def write_transactions(bootstrap: str, topic: str | None = None) -> Transactions:
    topic = topic or f"txn-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[
        topic
    ].result()
    written: list[Written] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        written.append((message.partition(), message.offset(), message.value()))

    def send(producer: Producer, name: str, count: int) -> list[Written]:
        before = len(written)
        for number in range(count):
            producer.produce(
                topic,
                f"{name}-{number}".encode(),
                partition=number % PARTITIONS,
                on_delivery=delivered,
            )
        assert producer.flush(30) == 0
        return written[before:]

    def transactional(name: str) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"{name}-{uuid.uuid4().hex[:6]}",
                # Open while the test reads; the test ends it.
                "transaction.timeout.ms": 600_000,
                "linger.ms": 5,
            }
        )
        producer.init_transactions(30)
        return producer

    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    committed = send(plain, "plain-before", 6)
    mover = transactional("mover")
    mover.begin_transaction()
    committed += send(mover, "committed-1", 8)
    mover.commit_transaction(30)
    mover.begin_transaction()
    aborted = send(mover, "aborted", 6)
    mover.abort_transaction(30)
    mover.begin_transaction()
    committed += send(mover, "committed-2", 4)
    mover.commit_transaction(30)
    committed += send(plain, "plain-middle", 4)
    holder = transactional("holder")
    holder.begin_transaction()
    open_records = send(holder, "open", 4)
    after_open = send(plain, "plain-after", 4)
    stable = {p: min(o for q, o, _ in open_records if q == p) for p in range(PARTITIONS)}
    keys = [(topic, p) for p in range(PARTITIONS)]
    with KafkaClient(bootstrap, read_committed=True) as client:
        wait_until(
            lambda: {p: o for (_, p), o in client.latest_offsets(keys).items()} == stable,
            "the markers of the decided transactions",
        )
    assert len(aborted) == 6 and all(o < stable[p] for p, o, _ in committed + aborted)
    return Transactions(
        topic,
        sorted(committed),
        sorted(aborted),
        sorted(committed + aborted + open_records + after_open),
        sorted(open_records),
        sorted(after_open),
        holder,
        stable,
    )
