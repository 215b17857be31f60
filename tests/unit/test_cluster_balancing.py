"""Brokers on one etcd share the partitions: a broker that joins takes its share at once, with
its data (nothing is copied: the old brokers close, the new one opens), and the autobalancer
moves partitions off a broker whose reported traffic is above the others'.

Three in-process nodes on a test etcd and one local object store (see docs/cluster.md,
"Partitions on brokers", and docs/machines/placement.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.kafka.partition import Partition
from automq_ref.node import Node, start_node
from automq_ref.state_machines import stream_metadata as sm
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.waiting import wait_until_async


@pytest.fixture(scope="module")
def etcd() -> Any:
    with running_etcd() as server:
        yield server


class Cluster:
    def __init__(self, tmp_path: Path, etcd: EtcdServer, extra: list[str]) -> None:
        self._tmp_path = tmp_path
        self._etcd = etcd
        self._extra = extra
        self._cluster_id = unique_cluster_id("balance")
        self.nodes: dict[int, Node] = {}

    async def start(self, node_id: int) -> Node:
        config = load_config(
            overrides=[
                f"node.id={node_id}",
                f"log.dirs={self._tmp_path / f'broker-{node_id}'}",
                "s3.wal.capacity=16777216",
                f"s3.data.buckets={(self._tmp_path / 'objects').as_uri()}",
                f"metadata.etcd.endpoints={self._etcd.endpoint}",
                f"cluster.id={self._cluster_id}",
                "controller.lease.ttl.ms=2000",
                f"broker.rack=az{node_id}",
                "broker.heartbeat.interval.ms=300",
                *self._extra,
            ],
            environment={},
        )
        node = self.nodes[node_id] = await start_node(config)
        return node

    async def stop(self) -> None:
        for node_id in sorted(self.nodes, reverse=True):
            await self.nodes.pop(node_id).shutdown()


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, etcd: EtcdServer, *extra: str) -> AsyncIterator[Cluster]:
    running = Cluster(tmp_path, etcd, list(extra))
    try:
        yield running
    finally:
        await running.stop()


def held(node: Node, topic: str) -> set[int]:
    return {index for name, index in node.topics.partitions if name == topic}


def assigned(node: Node, topic: str) -> dict[int, int]:
    placed = sm.placed_topic(node.view.image, topic)
    assert placed is not None
    return {index: a.leader for index, a in placed.partitions.items()}


def gave_up_the_rest(node: Node) -> bool:
    """``node`` holds exactly the partitions of ``shared`` assigned to it."""
    node_id = node.config.node_id
    mine = {i for i, leader in assigned(node, "shared").items() if leader == node_id}
    return held(node, "shared") == mine


async def produce(partition: Partition, count: int, size: int = 100) -> None:
    for value in range(count):
        batch = build_record_batch([(None, bytes([value % 256]) * size, (), 0)])
        result = partition.append_nowait(batch, 1 << 20)
        assert result.error is KafkaErrorCode.NONE and result.durable is not None
        await result.durable


async def until(condition: Callable[[], object], what: str) -> None:
    await wait_until_async(condition, what)


async def test_a_broker_that_joins_takes_its_share_with_the_data(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async with cluster(tmp_path, etcd) as brokers:
        first, second = await brokers.start(1), await brokers.start(2)
        await first.topics.create_topic("shared", 6, {})
        before = assigned(second, "shared")
        assert sorted(before.values()) == [1, 1, 1, 2, 2, 2]
        for index, leader in before.items():
            await produce(brokers.nodes[leader].topics.partitions[("shared", index)], 3)

        third = await brokers.start(3)
        # At its first heartbeat it joins and takes two partitions, one from each broker.
        await until(lambda: sorted(assigned(third, "shared").values()).count(3) == 2, "a share")
        moved = {i for i, leader in assigned(third, "shared").items() if leader == 3}
        await until(lambda: held(third, "shared") == moved, "the share opened on broker 3")
        for index in moved:
            partition = third.topics.partitions[("shared", index)]
            assert partition.log_end_offset == partition.high_watermark == 3
            assert partition.epoch == 1
        await until(
            lambda: gave_up_the_rest(first) and gave_up_the_rest(second), "the rest given up"
        )


async def test_the_autobalancer_moves_traffic_off_a_busy_broker(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    settings = (
        "autobalancer.controller.enable=true",
        "autobalancer.controller.anomaly.detect.interval.ms=500",
        "autobalancer.controller.metrics.delay.ms=3000",
        "autobalancer.controller.network.in.usage.distribution.detect.threshold=1024",
        "autobalancer.controller.network.out.usage.distribution.detect.threshold=1024",
    )
    async with cluster(tmp_path, etcd, *settings) as brokers:
        first, second = await brokers.start(1), await brokers.start(2)
        # Two partitions each; only broker 1's get traffic.
        await first.topics.create_topic("hot", 4, {}, assignments=[1, 1, 2, 2])
        busy = [first.topics.partitions[("hot", 0)], first.topics.partitions[("hot", 1)]]
        stop = asyncio.Event()

        async def traffic() -> None:
            while not stop.is_set():
                for partition in busy:
                    if ("hot", partition.index) in first.topics.partitions:
                        with contextlib.suppress(Exception):
                            await produce(partition, 5, size=1000)
                await asyncio.sleep(0.01)

        task = asyncio.create_task(traffic())
        try:
            # One of the busy partitions moves to broker 2 (moving one evens the load out).
            await until(
                lambda: sorted(assigned(second, "hot").values()) == [1, 2, 2, 2],
                "a busy partition moved to broker 2",
            )
        finally:
            stop.set()
            await task
        placement = assigned(second, "hot")
        assert {placement[0], placement[1]} == {1, 2}
        assert placement[2] == placement[3] == 2
