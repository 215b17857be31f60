"""Metadata with the zone router on, through the real handler (automq_ref/kafka/handlers/
metadata.py): node 1 (zone az1) is a whole embedded node; brokers 2 (az2) and 3 (az3) are
registered with its controller and unfenced, so placement spreads partitions over all three
(nothing serves 2 and 3: Metadata names leaders from placement alone). A client declaring zone
az2 in its client id, or connecting from an address ``automq.zone.cidr.blocks`` puts in az2, is
told broker 2 leads every partition (replicas and ISR [2]); a client without a zone, or of a
zone without brokers, is told the real leaders with the leader and its proxies as replicas.
Leader epochs, the brokers list and the controller are the same for all; DescribeCluster and
FindCoordinator are not rewritten. With the router off nothing changes."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer

from automq_ref.config import load_config
from automq_ref.io.metadata.client import register_node
from automq_ref.kafka import topic_registry
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines import stream_metadata as sm
from tests.unit.test_broker_node import Chunks

METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 3, 10, 60
TOPIC = "zoned"
PARTITIONS = 6
LOCAL = Peer(1, "127.0.0.1:40000")


async def ask(
    node: Node, client_id: str, api_key: int, version: int, peer: Peer = LOCAL, **body: Any
) -> Any:
    """One request from a client with ``client_id``, connected from ``peer``."""
    cls: Any = load_request_schema(api_key, version)
    header_cls: Any = cls.__header_schema__
    out = Chunks()
    header = header_cls(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=1,
        client_id=client_id,
    )
    write_header: Any = entity_writer(header_cls)
    write_body: Any = entity_writer(cls)
    write_header(out, header)
    write_body(out, cls(**body))
    reply: Any = await node.front_end.admit(b"".join(out), peer)
    if inspect.isawaitable(reply):
        reply = await reply
    data = b"".join(bytes(chunk) for chunk in reply)
    response_cls: Any = load_response_schema(api_key, version)
    _, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    response, _ = entity_reader(response_cls)(data, offset)
    return response


async def metadata(
    node: Node, client_id: str, peer: Peer = LOCAL
) -> dict[int, tuple[int, int, list[int], list[int]]]:
    """``TOPIC``'s partitions as the client is told: leader, epoch, replicas, ISR."""
    answer = await ask(
        node,
        client_id,
        METADATA,
        12,
        peer,
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(TOPIC)),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    (topic,) = answer.topics
    assert topic.error_code == 0
    return {
        int(p.partition_index): (
            int(p.leader_id),
            int(p.leader_epoch),
            [int(n) for n in p.replica_nodes],
            [int(n) for n in p.isr_nodes],
        )
        for p in topic.partitions
    }


async def brokers_and_controller(node: Node, client_id: str) -> tuple[object, ...]:
    answer = await ask(
        node,
        client_id,
        METADATA,
        12,
        topics=(),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return tuple(answer.brokers), answer.controller_id


@pytest.fixture(autouse=True)
def no_wait_for_other_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers 2 and 3 are registrations only and never open their partitions: creating the
    topic would wait READY_WAIT_S (10 s) for them to lead."""
    monkeypatch.setattr(topic_registry, "READY_WAIT_S", 0.05)


async def three_zones(tmp_path: Path, *overrides: str) -> Node:
    """Node 1 in az1 with brokers 2 (az2) and 3 (az3) live beside it, and ``TOPIC`` created
    over the three."""
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "node.id=1",
            "broker.rack=az1",
            # Nothing heartbeats for brokers 2 and 3: their sessions must outlast the test.
            "broker.session.timeout.ms=600000",
            f"num.partitions={PARTITIONS}",
            *overrides,
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        for other in (2, 3):
            registration = await register_node(
                node.client,
                other,
                1,
                rack=f"az{other}",
                listeners=(sm.Endpoint("PLAINTEXT", f"127.0.0.{other}", 9092),),
            )
            heartbeat = sm.BrokerHeartbeat(other, registration.node_epoch, node.clock.now_ms())
            assert (await node.client.submit(heartbeat)).ok
        await metadata(node, "creator")  # auto-creates TOPIC over the three brokers
    except BaseException:
        await node.shutdown()
        raise
    return node


@pytest.fixture
async def zoned(tmp_path: Path) -> AsyncIterator[Node]:
    node = await three_zones(
        tmp_path,
        f"automq.zonerouter.channels=0@dir://{tmp_path / 'channel'}?batchInterval=250",
        "automq.zone.cidr.blocks=az2@10.2.0.0/16<>az3@10.3.0.0/16",
    )
    try:
        yield node
    finally:
        await node.shutdown()


async def test_a_client_in_a_zone_sees_only_its_zone(zoned: Node) -> None:
    real = await metadata(zoned, "plain-client")
    assert {leader for leader, *_ in real.values()} == {1, 2, 3}, "placement spreads the topic"
    for client_id, peer in [
        ("automq_az=az2", LOCAL),
        ("automq_az=az2&automq_type=producer", LOCAL),
        ("plain-client", Peer(2, "10.2.7.7:5555")),  # az2 by its address
    ]:
        told = await metadata(zoned, client_id, peer)
        assert told == {index: (2, epoch, [2], [2]) for index, (_, epoch, _, _) in real.items()}, (
            client_id
        )
    # A declared zone wins over the address.
    in_az3 = await metadata(zoned, "automq_az=az3", Peer(3, "10.2.7.7:5555"))
    assert {leader for leader, *_ in in_az3.values()} == {3}


async def test_a_client_without_a_zone_sees_leaders_with_their_proxies(zoned: Node) -> None:
    placed = sm.broker_partitions  # leaders come from placement
    image = zoned.context.topics.view.image
    expected_leaders = {
        index: leader
        for leader in (1, 2, 3)
        for (topic, index, _) in placed(image, leader)
        if topic == TOPIC
    }
    for client_id in ("plain-client", "automq_az=az9", "automq_az=", "automq_az=%zz"):
        told = await metadata(zoned, client_id)
        assert {index: leader for index, (leader, *_) in told.items()} == expected_leaders
        for leader, _, replicas, isr in told.values():
            # The leader first, then its proxy in each other zone (one broker per zone here).
            assert replicas == isr == [leader, *sorted({1, 2, 3} - {leader})]


async def test_the_rest_of_the_answer_is_the_same_for_every_client(zoned: Node) -> None:
    plain = await brokers_and_controller(zoned, "plain-client")
    assert await brokers_and_controller(zoned, "automq_az=az2") == plain
    assert [int(b.node_id) for b in plain[0]] == [1, 2, 3]  # type: ignore[attr-defined]
    described = [
        await ask(
            zoned, client_id, DESCRIBE_CLUSTER, 0, include_cluster_authorized_operations=False
        )
        for client_id in ("plain-client", "automq_az=az2")
    ]
    assert described[0] == described[1]
    found = [
        await ask(zoned, client_id, FIND_COORDINATOR, 1, key="g", key_type=0)
        for client_id in ("plain-client", "automq_az=az2")
    ]
    assert found[0] == found[1]


async def test_with_the_router_off_nothing_changes(tmp_path: Path) -> None:
    node = await three_zones(tmp_path, "automq.zone.cidr.blocks=az2@127.0.0.0/8")
    try:
        plain = await metadata(node, "plain-client")
        assert await metadata(node, "automq_az=az2") == plain
        assert all(replicas == isr == [leader] for leader, _, replicas, isr in plain.values())
    finally:
        await node.shutdown()
