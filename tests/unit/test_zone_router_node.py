"""The zone router in a whole embedded node, through the real dispatcher and a real listener:
node 1 (zone az1) serves; brokers 2 (az2) and 3 (az3) are registered with node 1's own listener
as their address, so that what node 1 routes to "broker 2" comes back to node 1 over the
Kafka protocol (AutomqZoneRouter on a real connection), where its main side answers that it
does not lead the partition. With the router on, ApiVersions lists AutomqZoneRouter v0-1;
off, it is neither listed nor served.

A producer in az1 writes the partitions node 1 leads through node 1's RouterChannel in
``router_channel`` mode (straight to the partition in ``direct`` mode); the partitions brokers
2 and 3 lead are routed and answered by their "leader"; a producer of another zone is sent
away (``NOT_LEADER_OR_FOLLOWER``).
"""

from __future__ import annotations

import asyncio
import inspect
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.metadata.client import register_node
from automq_ref.kafka.broker_metrics import BrokerState
from automq_ref.kafka.server import CloseConnection, Peer
from automq_ref.kafka.snapshot_sessions import SnapshotSessions
from automq_ref.node import Node, start_node
from automq_ref.protocol.partition_snapshot import MAX_VERSION as SNAPSHOT_VERSION
from automq_ref.protocol.partition_snapshot import (
    GetPartitionSnapshotRequest,
    encode_request_frame,
)
from automq_ref.protocol.zone_router import (
    ZoneRouterRequest,
    decode_zone_router_response,
    encode_produce_request_body,
    encode_zone_router_request,
)
from automq_ref.state_machines import stream_metadata as sm
from tests.unit.test_zone_metadata import (  # the fixture: autouse here too
    TOPIC,
    ask,
    metadata,
    no_wait_for_other_brokers,  # noqa: F401
)

PARTITIONS = 6
PEER = Peer(9, "127.0.0.1:40000")
API_VERSIONS, PRODUCE, ZONE_ROUTER = 18, 0, 515


async def node_in_az1(tmp_path: Path, *overrides: str) -> Node:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "node.id=1",
            "broker.rack=az1",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "broker.session.timeout.ms=600000",
            f"num.partitions={PARTITIONS}",
            *overrides,
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        host, port = await node.listen()
        for other in (2, 3):
            registration = await register_node(
                node.client,
                other,
                1,
                rack=f"az{other}",
                listeners=(sm.Endpoint("PLAINTEXT", host, port),),
            )
            heartbeat = sm.BrokerHeartbeat(other, registration.node_epoch, node.clock.now_ms())
            assert (await node.client.submit(heartbeat)).ok
        await metadata(node, "creator")  # auto-creates TOPIC over the three brokers
    except BaseException:
        await node.shutdown()
        raise
    return node


def router_on(tmp_path: Path, mode: str = "router_channel") -> tuple[str, ...]:
    return (
        f"automq.zonerouter.channels=0@dir://{tmp_path / 'channel'}?batchInterval=20",
        f"automq.zonerouter.local.write.mode={mode}",
    )


@pytest.fixture
async def routed(tmp_path: Path) -> AsyncIterator[Node]:
    node = await node_in_az1(tmp_path, *router_on(tmp_path))
    try:
        yield node
    finally:
        await node.shutdown()


async def produce(
    node: Node, client_id: str, values: dict[int, bytes]
) -> dict[int, tuple[int, int]]:
    """One Produce v9 (acks=-1) of a batch per partition; partition -> (error, base offset)."""
    body = encode_produce_request_body(
        9,
        None,
        -1,
        10_000,
        [
            (
                TOPIC,
                [
                    (index, build_record_batch([(None, value, (), 1)]))
                    for index, value in values.items()
                ],
            )
        ],
    )
    encoded_id = client_id.encode()
    frame = struct.pack(">hhih", PRODUCE, 9, 5, len(encoded_id)) + encoded_id + b"\x00" + body
    reply: Any = await node.front_end.admit(bytearray(frame), PEER)
    if inspect.isawaitable(reply):
        reply = await reply
    data = b"".join(bytes(chunk) for chunk in reply)
    response_cls: Any = load_response_schema(PRODUCE, 9)
    _, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    response, _ = entity_reader(response_cls)(data, offset)
    (topic,) = response.responses
    return {
        int(p.index): (int(p.error_code.value), int(p.base_offset))
        for p in topic.partition_responses
    }


def leaders(node: Node) -> dict[int, int]:
    image = node.context.topics.view.image
    found = {}
    for index in range(PARTITIONS):
        assignment = sm.partition_assignment(image, TOPIC, index)
        assert assignment is not None
        found[index] = assignment.leader
    return found


async def test_api_versions_lists_the_zone_router_only_when_it_is_on(
    routed: Node, tmp_path: Path
) -> None:
    answer = await ask(
        routed, "c", API_VERSIONS, 3, client_software_name="t", client_software_version="1"
    )
    ranges = {
        int(key.api_key): (int(key.min_version), int(key.max_version)) for key in answer.api_keys
    }
    assert ranges[ZONE_ROUTER] == (0, 1)

    off = await node_in_az1(tmp_path / "off")
    try:
        answer = await ask(
            off, "c", API_VERSIONS, 3, client_software_name="t", client_software_version="1"
        )
        assert ZONE_ROUTER not in {int(key.api_key) for key in answer.api_keys}
        frame = encode_zone_router_request(
            1, 1, "c", ZoneRouterRequest(b"\x02\x00\x00\x00\x02", 0, 1)
        )
        with pytest.raises(CloseConnection):
            await off.front_end.admit(frame, PEER)
    finally:
        await off.shutdown()


async def test_v0_is_answered_unsupported_version(routed: Node) -> None:
    frame = encode_zone_router_request(0, 3, "c", ZoneRouterRequest(b"\x01", 0, 0))
    reply: Any = await routed.front_end.admit(frame, PEER)
    _, response = decode_zone_router_response(b"".join(reply), 0)
    assert response.error_code == KafkaErrorCode.UNSUPPORTED_VERSION.value


async def test_a_producer_in_the_node_s_zone_is_routed_per_leader(routed: Node) -> None:
    placed = leaders(routed)
    assert set(placed.values()) == {1, 2, 3}, placed
    answers = await produce(
        routed, "automq_az=az1", {index: b"v%d" % index for index in range(PARTITIONS)}
    )
    for index, leader in placed.items():
        code, base = answers[index]
        if leader == 1:
            assert (code, base) == (0, 0), (index, answers)
        else:
            # Routed over the wire to "broker 2 or 3" (node 1 itself), which does not lead it.
            assert code == KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value, (index, answers)
    router_out = routed.context.router_out
    assert router_out is not None
    assert {node for node, target in router_out.targets.items() if target.sent_requests} == {2, 3}
    assert routed.zone_router is not None and routed.zone_router.channel is not None
    assert routed.zone_router.channel.epoch_ends  # node 1's own partitions went through it too
    # The records of node 1's partitions are there to read.
    for index, leader in placed.items():
        if leader == 1:
            partition = routed.topics.partitions[(TOPIC, index)]
            assert partition.high_watermark == 1


async def test_a_producer_of_another_zone_is_sent_to_its_own(routed: Node) -> None:
    answers = await produce(routed, "automq_az=az2", dict.fromkeys(range(PARTITIONS), b"x"))
    assert {code for code, _ in answers.values()} == {KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value}


async def test_direct_mode_appends_local_partitions_without_the_channel(tmp_path: Path) -> None:
    node = await node_in_az1(tmp_path, *router_on(tmp_path, "direct"))
    try:
        placed = leaders(node)
        mine = {index: b"d" for index, leader in placed.items() if leader == 1}
        answers = await produce(node, "automq_az=az1", mine)
        assert {code for code, _ in answers.values()} == {0}
        assert node.zone_router is not None and node.zone_router.channel is not None
        assert node.zone_router.channel.epoch_ends == {}
    finally:
        await node.shutdown()


async def test_a_producer_without_a_zone_is_appended_without_the_channel(tmp_path: Path) -> None:
    """router_channel mode is for zoned clients: a zoneless producer writing to its leader is
    appended at once (through the channel, every produce of a zoneless client on a cluster
    with the router on would wait for two object WAL batches)."""
    node = await node_in_az1(tmp_path, *router_on(tmp_path, "router_channel"))
    try:
        placed = leaders(node)
        mine = {index: b"z" for index, leader in placed.items() if leader == 1}
        answers = await produce(node, "plain-client", mine)
        assert {code for code, _ in answers.values()} == {0}
        assert node.zone_router is not None and node.zone_router.channel is not None
        assert node.zone_router.channel.epoch_ends == {}
    finally:
        await node.shutdown()


def cross_zone(node: Node) -> dict[tuple[str, str, str], float]:
    """``kafka_zone_router_cross_zone_bytes_total`` by (direction, api, role), as scraped."""
    (family,) = [
        metric
        for metric in BrokerState(node.context).collect()
        if metric.name == "kafka_zone_router_cross_zone_bytes"
    ]
    return {
        (s.labels["direction"], s.labels["api"], s.labels["role"]): s.value for s in family.samples
    }


async def test_the_bytes_between_zones_are_counted_at_both_ends(routed: Node) -> None:
    """Node 1 routes to "brokers 2 and 3", itself over a real connection: what its proxy side
    writes is what its main side takes, and the reverse; a snapshot-read poll it answers as
    a main is counted as taken and answered."""
    before = cross_zone(routed)
    assert set(before.values()) == {0}
    await produce(routed, "automq_az=az1", {index: b"v%d" % index for index in range(PARTITIONS)})
    after = cross_zone(routed)
    proxy_out = after["out", "AutomqZoneRouter", "proxy"]
    proxy_in = after["in", "AutomqZoneRouter", "proxy"]
    assert proxy_out > 0 and proxy_in > 0
    assert after["in", "AutomqZoneRouter", "main"] == proxy_out
    assert after["out", "AutomqZoneRouter", "main"] == proxy_in

    routed.context.snapshot_sessions = SnapshotSessions(
        partitions=lambda: [],
        commit=lambda linger_s: asyncio.sleep(0),
        wal_epoch=lambda: 1,
        wal_config="",
        clock=routed.clock,
    )
    frame = encode_request_frame(GetPartitionSnapshotRequest(), SNAPSHOT_VERSION, 7, "proxy-2")
    reply: Any = await routed.front_end.admit(frame, PEER)
    if inspect.isawaitable(reply):
        reply = await reply
    polled = cross_zone(routed)
    assert polled["in", "AutomqGetPartitionSnapshot", "main"] == 4 + len(frame)
    answered = sum(len(chunk) for chunk in reply)
    assert polled["out", "AutomqGetPartitionSnapshot", "main"] == 4 + answered
