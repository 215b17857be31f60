"""The ``automq`` source's client follows a partition's leader across a cluster of brokers.

On a Spark cluster the driver plans (Metadata, ListOffsets) and executors read later, each with a
client of its own; meanwhile a partition may move to another broker, or its broker die. The
client must then find the new leader through Metadata from any broker it knows, whether the old
leader answers NOT_LEADER_OR_FOLLOWER, Metadata names no live leader for a while (a move in
progress), or the old leader cannot be reached at all. No Spark here: the brokers are scripted
stand-ins for the client's connections (answers with the fields the client reads), so each
situation is exact and instant.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.spark import kafka_client
from automq_ref.spark.kafka_client import (
    FETCH_KEY,
    LIST_OFFSETS_KEY,
    METADATA_KEY,
    KafkaClient,
    KafkaConnectionError,
    KafkaResponseError,
)

TOPIC = "moving"
TOPIC_ID = uuid.uuid4()
HIGH_WATERMARK = 42


def address(node: int) -> tuple[str, int]:
    return ("127.0.0.1", 10_000 + node)


@dataclass
class Brokers:
    """Three brokers and the one leader of ``TOPIC``'s only partition. ``named`` is what
    Metadata names as leader (-1 while a move is in progress; by default the leader); ``down``
    brokers refuse connections; ``asked`` records (node, API key) of every request answered."""

    leader: int = 1
    named: list[int] = field(default_factory=list)  # consumed one per Metadata answer
    down: set[int] = field(default_factory=set)
    asked: list[tuple[int, int]] = field(default_factory=list)

    def node_at(self, where: tuple[str, int]) -> int:
        return where[1] - 10_000

    def answer(self, node: int, api_key: int) -> Any:
        self.asked.append((node, api_key))
        if api_key == METADATA_KEY:
            named = self.named.pop(0) if self.named else self.leader
            # A dead broker stays listed until its session lapses, as in a real cluster.
            return SimpleNamespace(
                brokers=[
                    SimpleNamespace(node_id=n, host=address(n)[0], port=address(n)[1])
                    for n in (1, 2, 3)
                ],
                topics=[
                    SimpleNamespace(
                        error_code=0,
                        name=TOPIC,
                        topic_id=TOPIC_ID,
                        partitions=[
                            SimpleNamespace(partition_index=0, leader_id=named, leader_epoch=0)
                        ],
                    )
                ],
            )
        code = 0 if node == self.leader else int(KafkaErrorCode.NOT_LEADER_OR_FOLLOWER)
        if api_key == LIST_OFFSETS_KEY:
            entry = SimpleNamespace(partition_index=0, error_code=code, offset=HIGH_WATERMARK)
            return SimpleNamespace(topics=[SimpleNamespace(name=TOPIC, partitions=[entry])])
        assert api_key == FETCH_KEY
        entry = SimpleNamespace(
            partition_index=0,
            error_code=code,
            high_watermark=HIGH_WATERMARK,
            log_start_offset=0,
            records=f"from broker {node}".encode(),
        )
        return SimpleNamespace(
            error_code=0, responses=[SimpleNamespace(topic=TOPIC, partitions=[entry])]
        )


@pytest.fixture
def brokers(monkeypatch: pytest.MonkeyPatch) -> Brokers:
    cluster = Brokers()

    class Connection:
        """Stands in for the client's socket to one broker."""

        def __init__(self, where: tuple[str, int], client_id: str, timeout_s: float) -> None:
            self.node = cluster.node_at(where)
            if self.node in cluster.down:
                raise ConnectionRefusedError(111, "Connection refused")
            self.address = where
            self.versions = {
                METADATA_KEY: (1, 13),
                LIST_OFFSETS_KEY: (1, 10),
                FETCH_KEY: (4, 17),
            }

        def negotiate(self) -> None:
            pass

        def version(self, api_key: int) -> int:
            return self.versions[api_key][1]

        def request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
            if self.node in cluster.down:  # died since the connection was made
                raise ConnectionResetError(104, "Connection reset by peer")
            return cluster.answer(self.node, api_key)

        def close(self) -> None:
            pass

    monkeypatch.setattr(kafka_client, "_Connection", Connection)
    return cluster


def client() -> KafkaClient:
    return KafkaClient(
        [f"{host}:{port}" for host, port in (address(1), address(2))], retry_backoff_s=0.001
    )


def test_a_moved_partition_is_fetched_from_its_new_leader(brokers: Brokers) -> None:
    reader = client()
    assert reader.metadata([TOPIC])[TOPIC].partitions[0].leader_id == 1  # planned on broker 1
    brokers.leader = 3  # moved before the executor reads
    result = reader.fetch(TOPIC, 0, 0)
    assert result.records == b"from broker 3"
    assert [node for node, key in brokers.asked if key == FETCH_KEY] == [1, 3]


def test_no_leader_while_a_move_is_in_progress(brokers: Brokers) -> None:
    reader = client()
    reader.metadata([TOPIC])
    brokers.leader = 2
    brokers.named = [-1, -1]  # the next two Metadata answers name no leader, then broker 2
    assert reader.fetch(TOPIC, 0, 0).records == b"from broker 2"
    brokers.leader = 3
    brokers.named = [-1]
    assert reader.latest_offsets([(TOPIC, 0)]) == {(TOPIC, 0): HIGH_WATERMARK}
    assert brokers.asked[-1] == (3, LIST_OFFSETS_KEY)


def test_a_dead_leader_is_left_for_the_new_one(brokers: Brokers) -> None:
    reader = client()
    assert reader.fetch(TOPIC, 0, 0).records == b"from broker 1"  # connected to broker 1
    brokers.down = {1}
    brokers.leader = 2  # its partitions fail over to broker 2
    assert reader.fetch(TOPIC, 0, 0).records == b"from broker 2"
    brokers.down = {2}
    brokers.leader = 3
    assert reader.latest_offsets([(TOPIC, 0)]) == {(TOPIC, 0): HIGH_WATERMARK}
    assert brokers.asked[-1] == (3, LIST_OFFSETS_KEY)


def test_a_leader_that_never_comes_back_fails_with_the_cause(brokers: Brokers) -> None:
    reader = client()
    reader.metadata([TOPIC])
    brokers.down = {1}  # Metadata (from broker 2) goes on naming broker 1
    with pytest.raises(KafkaConnectionError, match=r"127\.0\.0\.1:10001, the leader of moving-0"):
        reader.fetch(TOPIC, 0, 0)
    with pytest.raises(KafkaConnectionError, match=r"127\.0\.0\.1:10001 failed"):
        reader.latest_offsets([(TOPIC, 0)])
    brokers.down = set()
    brokers.leader = 2
    brokers.named = [-1] * 10  # broker 1 gave the partition up; a move that never ends
    with pytest.raises(KafkaResponseError, match="LEADER_NOT_AVAILABLE"):
        reader.fetch(TOPIC, 0, 0)
