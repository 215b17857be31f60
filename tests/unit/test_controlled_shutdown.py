"""A broker's graceful stop (controlled shutdown) in process: it hands its partitions over before
it closes, each with its data, and it waits for that at most ``controlled.shutdown.timeout.ms``.

Two in-process nodes on a test etcd and one local object store (docs/cluster.md, "Graceful
handover"); the bound on a node alone, whose partitions have nowhere to go; a give-up cut
short by the stop still closed; Metadata listing the stopping broker until it has handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from automq_ref.config import load_config
from automq_ref.kafka.handlers.metadata import _handing_over
from automq_ref.node import start_node
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import (
    BrokerHeartbeat,
    CloseStream,
    ControlledShutdown,
    CreateStream,
    CreateTopic,
    OpenStream,
    RegisterNode,
)
from automq_ref.vocabulary.metadata_records import StreamState
from tests.etcd_fixture import EtcdServer, running_etcd
from tests.properties.test_placement import PARAMS, listeners, run, topic_value
from tests.unit.test_cluster_balancing import cluster, held, produce
from tests.waiting import wait_until_async


@pytest.fixture(scope="module")
def etcd() -> Any:
    with running_etcd() as server:
        yield server


async def test_a_stopping_broker_hands_its_partitions_over_with_their_data(
    tmp_path: Path, etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(tmp_path, etcd) as running:
        first = await running.start(1)
        second = await running.start(2)
        await first.topics.create_topic("shared", 6, {}, assignments=[1, 2, 1, 2, 1, 2])
        await wait_until_async(lambda: held(second, "shared") == {1, 3, 5}, "broker 2 leading")
        for index in (1, 3, 5):
            await produce(second.topics.partitions[("shared", index)], 10 + index)
        stopping = running.nodes.pop(2)
        with caplog.at_level(logging.INFO, logger="automq_ref.node"):
            await stopping.shutdown()
        done = [r.getMessage() for r in caplog.records if "controlled shutdown done" in r.message]
        assert len(done) == 1 and "left=0" in done[0] and "timed_out=False" in done[0], done
        # Every partition it held was closed before it returned: broker 1 opens them all.
        await wait_until_async(
            lambda: held(first, "shared") == set(range(6)), "broker 1 leading all six"
        )
        for index in (1, 3, 5):
            assert first.topics.partitions[("shared", index)].log_end_offset == 10 + index


async def test_waiting_for_the_handover_is_bounded(tmp_path: Path) -> None:
    """A node alone keeps its partitions (placement gives them nobody else): the wait ends
    at its bound, not handed over."""
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        await node.topics.create_topic("kept", 2, {})
        assert not await node.topics.wait_handed_over(0.2)
        assert len(node.topics.partitions) == 2
    finally:
        await node.shutdown()


async def test_a_give_up_cut_short_is_closed_at_shutdown(tmp_path: Path) -> None:
    """The follower stopped in the middle of a partition's close (a stop right after its move
    was decided): the partition left the map, but the shutdown still closes its streams, which
    would otherwise keep its next broker out until this one started again."""
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        await node.topics.create_topic("cut", 1, {})
        partition = node.topics.partitions[("cut", 0)]
        await produce(partition, 5)
        streams = (partition.data_stream_id, partition.meta_stream_id)
        await node.topics.stop_following()
        giving_up = asyncio.create_task(node.topics._give_up(("cut", 0), None))
        await asyncio.sleep(0)  # out of the map; its close waits for the upload
        giving_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await giving_up
        assert ("cut", 0) not in node.topics.partitions
        assert node.topics.unclosed() == [partition]
        assert node.view.image.streams[streams[-1]].state is StreamState.OPENED
    finally:
        await node.shutdown()
    assert all(node.view.image.streams[s].state is StreamState.CLOSED for s in streams)


def test_metadata_lists_a_broker_until_it_has_handed_over() -> None:
    """A broker in controlled shutdown stays in Metadata's brokers while it holds a moved
    partition's stream open (a client must not see it vanish in the answer that moves the
    partition: librdkafka then loses the partition until its next leader query), and leaves
    the list once it closed it."""
    image = run(
        sm.EMPTY_IMAGE,
        RegisterNode(1, 0, "a", listeners(1)),
        RegisterNode(2, 0, "b", listeners(2)),
        BrokerHeartbeat(1, 0, 1_000),
        BrokerHeartbeat(2, 0, 1_000),
        CreateTopic("t0", topic_value("t0", 1), (1,)),
    )
    placed = sm.placed_topic(image, "t0")
    assert placed is not None
    created = sm.step(image, CreateStream(1, 0, placed.topic_id, 0), PARAMS)
    stream_id = sm.response_of(created).stream_id
    assert stream_id is not None
    image = run(created.state, OpenStream(1, 0, stream_id, 0))
    assert _handing_over(image) == []  # live, not shutting down
    image = run(image, ControlledShutdown(1, 0))
    assert sm.broker_partitions(image, 1) == []  # moved to broker 2 ...
    assert [b.node_id for b in _handing_over(image)] == [1]  # ... but still open on 1
    image = run(image, CloseStream(1, 0, stream_id, 0))
    assert _handing_over(image) == []
