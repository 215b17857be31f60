"""KIP-848 consumer groups (``group.protocol=consumer``) against a broker process: two
confluent-kafka consumers share a topic's partitions and consume every record exactly once, never
holding a partition at the same time; when one closes the other takes every partition; the
admin client lists the group as a ``consumer`` group and describes its members; the committed
offsets survive a broker restart.

The broker runs with a short heartbeat interval and session timeout
(``group.consumer.heartbeat.interval.ms``, ``group.consumer.session.timeout.ms``) so that the
rebalances, each a few heartbeats long, take seconds rather than tens of seconds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupType,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.waiting import wait_until

PARTITIONS = 6
RECORDS = 600


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("consumer-groups") / "data",
        "group.consumer.heartbeat.interval.ms=300",
        "group.consumer.session.timeout.ms=6000",
    )
    process.start()
    try:
        yield process
    finally:
        if process.alive():
            process.stop()
    dropped = process.unawaited_coroutines()
    assert not dropped, f"the broker dropped coroutines unawaited: {dropped}"


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for index, value in enumerate(values):
        producer.produce(topic, value=value, partition=index % PARTITIONS)
    assert producer.flush(30) == 0


def consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )


class Member:
    """A consumer, what it read, and a check that it never shares a partition with ``others``."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        self.name = name
        self.consumer = consumer(bootstrap, group)
        self.consumer.subscribe([topic])
        self.read: list[tuple[int, bytes]] = []

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def poll(self, others: list[Member]) -> None:
        message = self.consumer.poll(0.1)
        mine = self.assigned()
        for other in others:
            shared = mine & other.assigned()
            assert not shared, f"{self.name} and {other.name} both hold {shared}"
        if message is None or message.error() is not None:
            return
        value, partition = message.value(), message.partition()
        assert value is not None and partition is not None
        self.read.append((partition, value))
        self.consumer.commit(message=message, asynchronous=False)


def test_two_members_share_rebalance_and_commit(broker: BrokerProcess) -> None:
    topic, group = f"kip848-{uuid.uuid4().hex[:6]}", f"cg-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    values = [f"v{index}".encode() for index in range(RECORDS)]
    produce(broker.bootstrap, topic, values)

    first = Member(broker.bootstrap, group, topic, "first")

    def first_holds_all() -> bool:
        first.poll([])
        return len(first.assigned()) == PARTITIONS and bool(first.read)

    wait_until(first_holds_all, "the first member to hold every partition", interval_s=0)
    second = Member(broker.bootstrap, group, topic, "second")
    members = [first, second]

    def both_hold_and_all_read() -> bool:
        for member in members:
            member.poll([m for m in members if m is not member])
        read = [value for member in members for _, value in member.read]
        return bool(first.assigned() and second.assigned()) and len(read) >= RECORDS

    wait_until(both_hold_and_all_read, "both members to hold partitions, all read", interval_s=0)
    assert len(first.assigned()) + len(second.assigned()) == PARTITIONS
    read = [value for member in members for _, value in member.read]
    assert sorted(read) == sorted(values), "a record was read twice or never"

    listed = admin.list_consumer_groups().result()
    (listing,) = [g for g in listed.valid if g.group_id == group]
    assert listing.type == ConsumerGroupType.CONSUMER
    (description,) = admin.describe_consumer_groups([group]).values()
    described = description.result()
    assert len(described.members) == 2
    owned = [tp.partition for m in described.members for tp in m.assignment.topic_partitions]
    assert sorted(owned) == list(range(PARTITIONS))

    # One leaves: the other takes every partition and reads what is produced next.
    first.consumer.close()
    more = [f"after-close-{index}".encode() for index in range(60)]
    produce(broker.bootstrap, topic, more)
    second.read.clear()

    def second_holds_all() -> bool:
        second.poll([])
        return len(second.assigned()) == PARTITIONS and len(second.read) >= len(more)

    wait_until(second_holds_all, "the second member to take every partition", interval_s=0)
    assert sorted(v for _, v in second.read) == sorted(more)
    second.consumer.close()

    # The committed offsets survive a restart: a new member reads only what came after.
    assert broker.stop() == 0
    broker.start()
    last = [f"after-restart-{index}".encode() for index in range(30)]
    produce(broker.bootstrap, topic, last)
    resumed = Member(broker.bootstrap, group, topic, "resumed")

    def resumed_read() -> bool:
        resumed.poll([])
        return len(resumed.read) >= len(last)

    wait_until(resumed_read, "the resumed member to read the new records", interval_s=0)
    assert sorted(v for _, v in resumed.read) == sorted(last)
    committed = resumed.consumer.committed(
        [TopicPartition(topic, index) for index in range(PARTITIONS)], timeout=10
    )
    assert sum(tp.offset for tp in committed) == RECORDS + len(more) + len(last)
    resumed.consumer.close()
