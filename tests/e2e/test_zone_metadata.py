"""Metadata by zone on three broker processes (racks az1, az2, az3 on one etcd, the zone
router's settings on): real clients (confluent-kafka, kafka-python) that declare zone az2 in
their client id are told broker 2 leads every partition, and clients without a zone are told the
real leaders, the ones placement chose, with the leader and its proxies as replicas.

Only Metadata: the router that would carry a produce sent to broker 2 for a partition broker 1
leads is not built yet, so neither produce nor fetch through a proxy is tried here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, TopicPartition

from tests.e2e.test_cluster import (
    NODES,
    Cluster,
    agreed_leaders,
    create_topic,
    running_cluster,
    unique,
)
from tests.waiting import PATIENCE_S

PARTITIONS = 9


@pytest.fixture(scope="module")
def zoned(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    failed_before = request.session.testsfailed
    channel = tmp_path_factory.mktemp("router-channel")
    overrides = (f"automq.zonerouter.channels=0@dir://{channel}?batchInterval=250",)
    with running_cluster(
        lambda: request.session.testsfailed > failed_before, overrides=overrides
    ) as cluster:
        yield cluster


def confluent_view(
    bootstrap: str, topic: str, client_id: str | None
) -> dict[int, tuple[int, list[int]]]:
    """``topic``'s partitions as confluent-kafka is told them: leader and replicas."""
    settings: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap}
    if client_id is not None:
        settings["client.id"] = client_id
    answer = AdminClient(settings).list_topics(topic, timeout=PATIENCE_S)
    partitions = answer.topics[topic].partitions
    return {index: (p.leader, list(p.replicas)) for index, p in partitions.items()}


def kafka_python_leaders(bootstrap: str, topic: str, client_id: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id)
    try:
        partitions = consumer.partitions_for_topic(topic)
        assert partitions is not None
        cluster = consumer._client.cluster  # the metadata kafka-python keeps
        return {
            index: cluster.leader_for_partition(TopicPartition(topic, index))
            for index in sorted(partitions)
        }
    finally:
        consumer.close()


def test_a_client_in_az2_sees_node_2_lead_every_partition(zoned: Cluster) -> None:
    topic = unique("zoned")
    create_topic(zoned.brokers[1].bootstrap, topic, PARTITIONS)
    real = agreed_leaders(zoned, topic)
    assert set(real.values()) == set(NODES), f"placement spreads the topic: {real}"

    for node in NODES:  # whichever broker the client asks first
        bootstrap = zoned.brokers[node].bootstrap
        told = confluent_view(bootstrap, topic, "automq_az=az2")
        assert told == {index: (2, [2]) for index in range(PARTITIONS)}, (node, told)
        assert kafka_python_leaders(bootstrap, topic, "automq_az=az2&automq_type=consumer") == {
            index: 2 for index in range(PARTITIONS)
        }

    for client_id in (None, "plain-client", "automq_az=az9"):
        told = confluent_view(zoned.bootstrap(), topic, client_id)
        assert {index: leader for index, (leader, _) in told.items()} == real, client_id
        for leader, replicas in told.values():
            # The leader, then its proxy in each other zone (one broker per zone here).
            assert replicas[0] == leader and sorted(replicas) == list(NODES), told
    assert kafka_python_leaders(zoned.bootstrap(), topic, "plain-client") == real
