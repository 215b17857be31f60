"""AlterPartitionReassignments, ListPartitionReassignments and ElectLeaders in process, through
the front end's dispatch: what the controller decided (the image's assignment and leader epoch)
and what the APIs answer.

One embedded node plays broker 0; a second broker is registered on its controller by hand (its
heartbeats make it live; an embedded controller never expires sessions), and its streams are
opened and closed by hand to show a move in flight. Their topics are written to the controller
directly, so no broker opens their partitions on its own. A controller that never decides times the
request out, asked once. Then two nodes on one etcd: a reassignment asked of one broker is seen
by both. Partition ownership does not follow the image here: the
tests check the controller's decisions and the answers, not where data is served.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.alter_partition_reassignments.v0.request import (
    ReassignablePartition,
    ReassignableTopic,
)
from kio.schema.elect_leaders.v2.request import TopicPartitions
from kio.schema.list_partition_reassignments.v0.request import ListPartitionReassignmentsTopics
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic
from automq_ref.io.metadata.client import ControllerError
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import topic_key
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.unit.test_broker_node import call, node_config

PEER = Peer(1, "127.0.0.1:1")
ELECT_LEADERS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS = 43, 45, 46
TIMEOUT = datetime.timedelta(seconds=10)
PREFERRED, UNCLEAN = 0, 1
E = KafkaErrorCode

Partition = tuple[str, int]


async def reassign(admit: Any, moves: dict[Partition, list[int] | None]) -> dict[Partition, Any]:
    """AlterPartitionReassignments v0: each partition's (error code, message)."""
    by_topic: dict[str, list[ReassignablePartition]] = {}
    for (topic, index), replicas in moves.items():
        by_topic.setdefault(topic, []).append(
            ReassignablePartition(
                partition_index=i32(index),
                replicas=None if replicas is None else tuple(BrokerId(b) for b in replicas),
            )
        )
    response = await call(
        admit,
        PEER,
        ALTER_REASSIGNMENTS,
        0,
        timeout=TIMEOUT,
        topics=tuple(
            ReassignableTopic(name=TopicName(topic), partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    )
    assert response.error_code == E.NONE and response.error_message is None
    return {
        (topic.name, int(p.partition_index)): (E(p.error_code), p.error_message)
        for topic in response.responses
        for p in topic.partitions
    }


async def listed(admit: Any, topics: dict[str, list[int]] | None = None) -> dict[Partition, Any]:
    """ListPartitionReassignments v0: each listed partition's (replicas, adding, removing)."""
    response = await call(
        admit,
        PEER,
        LIST_REASSIGNMENTS,
        0,
        timeout=TIMEOUT,
        topics=None
        if topics is None
        else tuple(
            ListPartitionReassignmentsTopics(
                name=TopicName(name), partition_indexes=tuple(i32(i) for i in indexes)
            )
            for name, indexes in topics.items()
        ),
    )
    assert response.error_code == E.NONE
    return {
        (topic.name, int(p.partition_index)): (
            list(p.replicas),
            list(p.adding_replicas),
            list(p.removing_replicas),
        )
        for topic in response.topics
        for p in topic.partitions
    }


async def settled(admit: Any, timeout_s: float = 20) -> None:
    """Wait until no move is listed: every broker a partition moved away from has closed its
    streams (at once here, where no broker follows the image)."""
    deadline = time.monotonic() + timeout_s
    while await listed(admit):
        assert time.monotonic() < deadline, "a move stayed in flight"
        await asyncio.sleep(0.05)


async def elect(
    admit: Any, election_type: int, partitions: dict[str, list[int]] | None, version: int = 2
) -> tuple[KafkaErrorCode, dict[Partition, Any]]:
    """ElectLeaders: the top-level error (v1+) and each partition's (error code, message)."""
    body: dict[str, Any] = {
        "timeout": TIMEOUT,
        "topic_partitions": None
        if partitions is None
        else tuple(
            TopicPartitions(topic=TopicName(t), partitions=tuple(i32(i) for i in indexes))
            for t, indexes in partitions.items()
        ),
    }
    if version >= 1:
        body["election_type"] = i8(election_type)
    response = await call(admit, PEER, ELECT_LEADERS, version, **body)
    top = E(getattr(response, "error_code", 0))
    return top, {
        (result.topic, int(p.partition_id)): (E(p.error_code), p.error_message)
        for result in response.replica_election_results
        for p in result.partition_result
    }


async def controller_topic(node: Node, name: str, partitions: int) -> sm.TopicPlacement:
    """A topic written to the controller directly (``CreateTopic``: its record and its
    placement): no broker opens its partitions, so the only streams a partition has are those
    a test opens by hand."""
    record = Topic(name, uuid.uuid4(), partitions).encode()
    created = await node.client.submit(sm.CreateTopic(name, record))
    assert created.ok, created
    found = sm.placed_topic(node.view.image, name)
    assert found is not None
    return found


async def registry_topic(node: Node, name: str, partitions: int) -> None:
    """A topic created through the node's registry, then placed by the controller (a topic
    written before placement is placed by its own record again; one already placed stays)."""
    await node.topics.create_topic(name, partitions, {})
    record = node.view.image.kv[topic_key(name)]
    placed = await node.client.submit(sm.CreatePartitions(name, record, expected=record))
    assert placed.ok, placed


async def join_broker(node: Node, node_id: int, rack: str = "az2") -> int:
    """Register broker ``node_id`` on the node's controller and make it live; its epoch."""
    registered = await node.client.submit(sm.RegisterNode(node_id, 1, rack=rack))
    assert registered.node_epoch is not None
    beat = await node.client.submit(
        sm.BrokerHeartbeat(node_id, registered.node_epoch, node.clock.now_ms())
    )
    assert beat.ok and beat.fenced is False, beat
    return registered.node_epoch


async def hold_open(node: Node, broker: int, epoch: int, topic: str, index: int) -> int:
    """Broker ``broker`` creates a stream of the partition and opens it at the partition's
    leader epoch, as its broker would (retrying while another broker still holds one of the
    partition's streams open); the stream's id."""
    placed = sm.placed_topic(node.view.image, topic)
    assert placed is not None
    created = await node.client.submit(sm.CreateStream(broker, epoch, placed.topic_id, index))
    assert created.ok and created.stream_id is not None, created
    deadline = time.monotonic() + 20
    while True:
        leader_epoch = assignment(node, topic, index).leader_epoch
        opened = await node.client.submit(
            sm.OpenStream(broker, epoch, created.stream_id, leader_epoch)
        )
        if opened.error is not sm.StreamErrorCode.STREAM_NOT_CLOSED:
            break
        assert time.monotonic() < deadline, opened
        await asyncio.sleep(0.05)
    assert opened.ok, opened
    return created.stream_id


def assignment(node: Node, topic: str, index: int) -> sm.PartitionAssignment:
    found = sm.partition_assignment(node.view.image, topic, index)
    assert found is not None
    return found


async def test_reassign_list_and_cancel(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    admit = node.front_end.admit
    try:
        me = node.config.node_id
        other_epoch = await join_broker(node, 2)
        await controller_topic(node, "moved", 4)
        # Placed evenly on the two live brokers.
        leaders = [assignment(node, "moved", i).leader for i in range(4)]
        assert sorted(leaders) == [me, me, 2, 2]
        mine, theirs = leaders.index(me), leaders.index(2)
        before = assignment(node, "moved", mine)

        answers = await reassign(
            admit,
            {
                ("moved", mine): [2],
                ("moved", 9): [2],
                ("nowhere", 0): [2],
            },
        )
        assert answers[("moved", mine)] == (E.NONE, None)
        assert assignment(node, "moved", mine) == sm.PartitionAssignment(2, before.leader_epoch + 1)
        assert answers[("moved", 9)][0] is E.UNKNOWN_TOPIC_OR_PARTITION
        assert answers[("nowhere", 0)][0] is E.UNKNOWN_TOPIC_OR_PARTITION
        # Already there: nothing to do, no new epoch.
        assert (await reassign(admit, {("moved", mine): [2]}))[("moved", mine)] == (E.NONE, None)
        assert assignment(node, "moved", mine).leader_epoch == before.leader_epoch + 1

        refused = await reassign(
            admit,
            {("moved", 0): [me, 2], ("moved", 1): [], ("moved", 2): [7]},
        )
        code, message = refused[("moved", 0)]
        assert code is E.INVALID_REPLICA_ASSIGNMENT and "one replica per partition" in message
        code, message = refused[("moved", 1)]
        assert code is E.INVALID_REPLICA_ASSIGNMENT and "no replica" in message
        code, message = refused[("moved", 2)]
        assert code is E.INVALID_REPLICA_ASSIGNMENT and "broker 7 is not live" in message

        # Nothing is in flight: no broker holds a partition's streams open elsewhere.
        assert await listed(admit) == {}
        cancelled = await reassign(admit, {("moved", mine): None, ("nowhere", 0): None})
        assert cancelled[("moved", mine)][0] is E.NO_REASSIGNMENT_IN_PROGRESS
        assert cancelled[("nowhere", 0)][0] is E.UNKNOWN_TOPIC_OR_PARTITION

        # A move in flight: broker 2 holds its partition's stream open at its leader epoch,
        # then the partition is moved to this broker; until broker 2 closes the stream, the
        # move is listed and cannot be cancelled.
        stream_id = await hold_open(node, 2, other_epoch, "moved", theirs)
        assert await listed(admit) == {}
        moved = await reassign(admit, {("moved", theirs): [me]})
        assert moved[("moved", theirs)] == (E.NONE, None)
        ongoing = {("moved", theirs): ([me, 2], [me], [2])}
        assert await listed(admit) == ongoing
        assert await listed(admit, {"moved": [theirs, 99], "nowhere": [0]}) == ongoing
        assert await listed(admit, {"moved": [i for i in range(4) if i != theirs]}) == {}
        code, message = (await reassign(admit, {("moved", theirs): None}))[("moved", theirs)]
        assert code is E.REASSIGNMENT_IN_PROGRESS
        assert "reassign it to broker 2" in message

        stream = node.view.image.streams[stream_id]
        closed = await node.client.submit(sm.CloseStream(2, other_epoch, stream_id, stream.epoch))
        assert closed.ok, closed
        assert await listed(admit) == {}
        cancelled = await reassign(admit, {("moved", theirs): None})
        assert cancelled[("moved", theirs)][0] is E.NO_REASSIGNMENT_IN_PROGRESS
    finally:
        await node.shutdown()


async def test_elections(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    admit = node.front_end.admit
    try:
        await controller_topic(node, "led", 2)
        # Every partition's broker is live: no election needed, asked by name in any version.
        for version in (0, 1, 2):
            top, results = await elect(admit, PREFERRED, {"led": [0, 1, 5]}, version)
            assert top is E.NONE
            assert results[("led", 0)][0] is E.ELECTION_NOT_NEEDED
            assert results[("led", 1)][0] is E.ELECTION_NOT_NEEDED
            assert results[("led", 5)][0] is E.UNKNOWN_TOPIC_OR_PARTITION
        _, results = await elect(admit, UNCLEAN, {"nowhere": [0]})
        assert results[("nowhere", 0)][0] is E.UNKNOWN_TOPIC_OR_PARTITION
        # Asked for every partition, those that need no election are left out.
        assert await elect(admit, PREFERRED, None) == (E.NONE, {})
        top, results = await elect(admit, 7, {"led": [0]})
        assert top is E.INVALID_REQUEST and results[("led", 0)][0] is E.INVALID_REQUEST

        # The only broker stops: the partitions have no broker, and none can be elected.
        stopped = await node.client.submit(
            sm.ControlledShutdown(node.config.node_id, node.session.node_epoch)
        )
        assert stopped.ok, stopped
        assert assignment(node, "led", 0).leader == sm.NO_LEADER
        _, results = await elect(admit, PREFERRED, {"led": [0]})
        assert results[("led", 0)][0] is E.PREFERRED_LEADER_NOT_AVAILABLE
        _, results = await elect(admit, UNCLEAN, {"led": [0]})
        assert results[("led", 0)][0] is E.ELIGIBLE_LEADERS_NOT_AVAILABLE
        _, results = await elect(admit, UNCLEAN, None)
        assert {key: code for key, (code, _) in results.items()} == {
            ("led", 0): E.ELIGIBLE_LEADERS_NOT_AVAILABLE,
            ("led", 1): E.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        }
        # A broker joining takes the leaderless partitions itself: nothing left to elect.
        await join_broker(node, 3)
        assert assignment(node, "led", 0).leader == 3
        assert await elect(admit, UNCLEAN, None) == (E.NONE, {})
    finally:
        await node.shutdown()


# ---------------------------------------------------------------------------- two brokers


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


async def until(condition: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_two_brokers_on_etcd(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster_id = unique_cluster_id("reassign")
    nodes: list[Node] = []

    def config(node_id: int) -> Any:
        return load_config(
            overrides=[
                f"node.id={node_id}",
                f"log.dirs={tmp_path / f'broker-{node_id}'}",
                "s3.wal.capacity=16777216",
                f"s3.data.buckets={(tmp_path / 'objects').as_uri()}",
                f"metadata.etcd.endpoints={etcd.endpoint}",
                f"cluster.id={cluster_id}",
                "controller.lease.ttl.ms=2000",
                f"broker.rack=az{node_id}",
            ],
            environment={},
        )

    try:
        for node_id in (1, 2):
            nodes.append(await start_node(config(node_id)))
        first, second = nodes
        live = [b.node_id for b in sm.live_brokers(second.view.image)]
        assert live == [1, 2]
        await registry_topic(first, "spread", 4)
        await until(lambda: sm.placed_topic(second.view.image, "spread") is not None)
        leaders = [assignment(second, "spread", i).leader for i in range(4)]
        assert sorted(leaders) == [1, 1, 2, 2]
        on_first = leaders.index(1)
        epoch = assignment(second, "spread", on_first).leader_epoch

        # Asked of broker 2, decided by whichever broker is the controller, seen by both.
        answers = await reassign(second.front_end.admit, {("spread", on_first): [2]})
        assert answers == {("spread", on_first): (E.NONE, None)}
        moved = sm.PartitionAssignment(2, epoch + 1)
        assert assignment(second, "spread", on_first) == moved
        await until(lambda: assignment(first, "spread", on_first) == moved)
        code, message = (await reassign(first.front_end.admit, {("spread", 0): [3]}))[("spread", 0)]
        assert code is E.INVALID_REPLICA_ASSIGNMENT and "broker 3" in message

        # Once no broker holds the partition's streams elsewhere, nothing is listed.
        for node in nodes:
            await settled(node.front_end.admit)
            assert await elect(node.front_end.admit, PREFERRED, None) == (E.NONE, {})
    finally:
        for node in reversed(nodes):
            await node.shutdown()


class Unreachable:
    """A controller client whose controller never decides (none elected, the answer lost)."""

    def __init__(self) -> None:
        self.asked = 0

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        self.asked += 1
        raise ControllerError(f"{type(event).__name__}: no controller answered in 0.1 s")


async def test_no_decision_times_the_request_out_once(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    admit = node.front_end.admit
    try:
        await controller_topic(node, "stuck", 3)
        unreachable = Unreachable()
        node.context.controller_client = unreachable
        answers = await reassign(admit, {("stuck", i): [node.config.node_id] for i in range(3)})
        assert {code for code, _ in answers.values()} == {E.REQUEST_TIMED_OUT}
        assert all("no controller answered" in message for _, message in answers.values())
        # The first partition waited for the controller; the others were not asked again.
        assert unreachable.asked == 1
    finally:
        await node.shutdown()
