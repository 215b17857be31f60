"""A broker's topic registry follows the view: topics another broker creates, grows,
reconfigures, re-creates or deletes appear in it, and each broker holds open exactly the
partitions placement assigns it, giving up and taking partitions as they move (see ``catch_up``
and ``reconcile`` in automq_ref/kafka/topic_registry.py).

Two brokers in one process: node 1 is a whole node (its embedded controller); broker 2 has its
own WAL, storage and view of that same controller, over the same object store, and a registry of
its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.io.metadata.client import register_node
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.object_store import open_object_store
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.kafka import topic_registry
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.topic_configs import ConfigChange, ConfigOperation
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.node import Node, open_wal, start_node
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import NAMESPACE
from tests.waiting import wait_until_async

OTHER = 2


@dataclass
class Brokers:
    node: Node
    other: TopicRegistry


@contextlib.asynccontextmanager
async def start_brokers(tmp_path: Path, *overrides: str) -> AsyncIterator[Brokers]:
    """Node 1 (with ``overrides``) and broker 2, following the view until the end."""
    config = load_config(
        overrides=[f"log.dirs={tmp_path / 'one'}", "s3.wal.capacity=16777216", *overrides],
        environment={},
    )
    node = await start_node(config)
    other_config = load_config(
        overrides=[
            f"log.dirs={tmp_path / 'two'}",
            "s3.wal.capacity=16777216",
            f"node.id={OTHER}",
        ],
        environment={},
    )
    other_config.data_dir.mkdir(parents=True)
    view = ImageView(node.controller.image)
    node.controller.subscribe(view.publish)
    registration = await register_node(node.client, OTHER, 1)
    assert (await node.client.submit(sm.BrokerHeartbeat(OTHER, registration.node_epoch, 1))).ok
    store = open_object_store(config.object_store_uri)
    await store.__aenter__()
    storage = await S3Storage.start(
        wal=await open_wal(other_config, registration.node_epoch),
        store=store,
        client=node.client,
        view=view,
        registration=registration,
        namespace=NAMESPACE,
        params=lc.LogCacheParams(upload_threshold_bytes=1 << 20, capacity_bytes=1 << 24),
    )
    other = await TopicRegistry.open(storage, node.client, view, other_config)
    node.topics.follow()
    other.follow()
    try:
        yield Brokers(node, other)
    finally:
        await other.stop_following()
        for partition in other.partitions.values():
            await partition.close()
        await storage.shutdown()
        await store.close()
        await node.shutdown()


@pytest.fixture
async def brokers(tmp_path: Path) -> AsyncIterator[Brokers]:
    async with start_brokers(tmp_path) as started:
        yield started


async def until(condition: Callable[[], bool]) -> None:
    # A hang guard, not a budget: the machine may be slow (tests/waiting.py).
    await wait_until_async(condition, "the brokers to catch up")


def held(registry: TopicRegistry, topic: str) -> set[int]:
    return {index for name, index in registry.partitions if name == topic}


def assigned(brokers: Brokers, topic: str, node_id: int) -> set[int]:
    image = brokers.node.view.image
    return {i for name, i, _ in sm.broker_partitions(image, node_id) if name == topic}


async def test_each_broker_holds_the_partitions_placed_on_it(brokers: Brokers) -> None:
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    created = await there.create_topic("theirs", 4, {})
    # Creating waits until the image names every leader: both brokers hold their share, and
    # only it (a broker's registry adds a partition just after its open is in the image, so a
    # loaded machine may see the image first).
    assert here.topics["theirs"] == created
    assert assigned(brokers, "theirs", me) and assigned(brokers, "theirs", OTHER)
    await until(lambda: held(here, "theirs") == assigned(brokers, "theirs", me))
    await until(lambda: held(there, "theirs") == assigned(brokers, "theirs", OTHER))
    for index in range(4):
        assignment = sm.partition_assignment(brokers.node.view.image, "theirs", index)
        assert assignment is not None
        owner = here if assignment.leader == me else there
        assert owner.partitions[("theirs", index)].epoch == assignment.leader_epoch == 0

    await there.add_partitions("theirs", 6, validate_only=False)
    await there.alter_configs(
        "theirs", [ConfigChange("retention.ms", ConfigOperation.SET, "5")], validate_only=False
    )
    await until(lambda: here.topics["theirs"] == there.topics["theirs"])
    assert here.topics["theirs"].partitions == 6
    await until(lambda: held(here, "theirs") | held(there, "theirs") == set(range(6)))
    assert here.topic_config(here.topics["theirs"], "retention.ms") == "5"

    # A change here decides on the followed record: no conflict with theirs.
    await here.alter_configs(
        "theirs", [ConfigChange("retention.ms", ConfigOperation.SET, "6")], validate_only=False
    )

    await there.delete_topic("theirs")
    await until(lambda: "theirs" not in here.topics and not held(here, "theirs"))
    image = brokers.node.view.image
    assert str(created.topic_id) not in image.topics
    await until(lambda: not [k for k in brokers.node.view.image.kv if str(created.topic_id) in k])


async def test_a_topic_deleted_elsewhere_drops_the_partitions_held_here(
    brokers: Brokers,
) -> None:
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    mine = await here.create_topic("mine", 2, {}, assignments=[me, me])
    assert held(here, "mine") == {0, 1} and not held(there, "mine")
    # Deleted by the other broker, which holds none of its partitions: this node, which
    # holds them, deletes them when it sees the topic go.
    await there.delete_topic("mine")
    await until(lambda: "mine" not in here.topics and not held(here, "mine"))
    assert str(mine.topic_id) not in brokers.node.view.image.topics
    await until(
        lambda: not [key for key in brokers.node.view.image.kv if str(mine.topic_id) in key]
    )


async def produce(partition: Partition, count: int) -> None:
    for value in range(count):
        batch = build_record_batch([(None, str(value).encode(), (), 0)])
        result = partition.append_nowait(batch, 1 << 20)
        assert result.error is KafkaErrorCode.NONE and result.durable is not None
        await result.durable


async def test_a_moved_partition_is_given_up_and_opened_at_the_next_epoch(
    brokers: Brokers,
) -> None:
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    await there.create_topic("moving", 1, {}, assignments=[OTHER])
    old = there.partitions[("moving", 0)]
    await produce(old, 5)
    moved = await brokers.node.client.submit(sm.ReassignPartition("moving", 0, me))
    assert moved.ok and moved.leader_epoch == 1
    # Broker 2 gives it up (its WAL's records uploaded), this node opens it at epoch 1.
    await until(lambda: ("moving", 0) in here.partitions)
    assert not held(there, "moving")
    new = here.partitions[("moving", 0)]
    assert new.epoch == 1 and new.log_end_offset == 5 and new.high_watermark == 5
    assert [e for e, _ in new.leader_epochs] == [0, 1]
    await produce(new, 2)
    assert new.log_end_offset == 7
    # Requests for it at broker 2 are sent on: it exists, but is led elsewhere.
    assert there.not_here("moving", 0) is KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
    assert there.not_here("moving", 1) is KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # And back: broker 2 opens it at epoch 2 with everything.
    assert (await brokers.node.client.submit(sm.ReassignPartition("moving", 0, OTHER))).ok
    await until(lambda: ("moving", 0) in there.partitions)
    assert there.partitions[("moving", 0)].log_end_offset == 7
    assert there.partitions[("moving", 0)].epoch == 2


async def test_a_partition_that_would_not_open_is_opened_at_a_later_round(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    await there.create_topic("moved", 1, {}, assignments=[OTHER])
    opened = Partition.open
    failures: list[object] = []

    async def open_once_failing(*args: Any, **kwargs: Any) -> Partition:
        if not failures:
            failures.append(args)
            raise OSError("the object store is away")
        return await opened(*args, **kwargs)

    monkeypatch.setattr(Partition, "open", open_once_failing)
    monkeypatch.setattr(topic_registry, "RETRY_S", 0.01)
    assert (await brokers.node.client.submit(sm.ReassignPartition("moved", 0, me))).ok
    await until(lambda: ("moved", 0) in here.partitions)
    assert failures and here.topics["moved"] == there.topics["moved"]


async def test_a_partition_that_moves_on_while_half_opened_is_left_closed(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by ``automq-ref check --brokers 3``: a partition moved to this node, and moved on
    again after its MetaStream opened here but before its data stream did. The data stream's
    open is refused (another leader epoch), and the MetaStream, left open here, kept its next
    broker from opening the partition (STREAM_NOT_CLOSED) for as long as this node ran."""
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    client = brokers.node.client
    await there.create_topic("restless", 1, {}, assignments=[OTHER])
    await produce(there.partitions[("restless", 0)], 3)
    storage = brokers.node.storage
    opened = storage.open_stream
    moved_on: list[sm.Response] = []

    async def open_then_move_on(stream_id: int, epoch: int) -> tuple[int, int]:
        result = await opened(stream_id, epoch)
        if not moved_on:  # the first stream (the MetaStream) is open here: move on now
            moved_on.append(await client.submit(sm.ReassignPartition("restless", 0, OTHER)))
        return result

    monkeypatch.setattr(storage, "open_stream", open_then_move_on)
    assert (await client.submit(sm.ReassignPartition("restless", 0, me))).ok
    await until(lambda: bool(moved_on))
    assert moved_on[0].ok and moved_on[0].leader_epoch == 2
    # Broker 2 opens it at epoch 2, with everything: nothing of it stayed open here.
    await until(lambda: ("restless", 0) in there.partitions)
    assert ("restless", 0) not in here.partitions
    assert there.partitions[("restless", 0)].epoch == 2
    assert there.partitions[("restless", 0)].log_end_offset == 3


async def test_loads_report_the_bytes_produced_to_each_partition_led_here(
    brokers: Brokers,
) -> None:
    there = brokers.other
    await there.create_topic("busy", 2, {}, assignments=[OTHER, OTHER])
    there.loads()  # the counters' start
    await produce(there.partitions[("busy", 1)], 3)
    loads = {load.partition: load for load in there.loads()}
    assert set(loads) == {0, 1}
    assert loads[0].bytes_in_per_sec == 0 and loads[1].bytes_in_per_sec > 0
    assert loads[1].topic_id == str(there.topics["busy"].topic_id)
    # Each call reports what came since the one before.
    assert all(load.bytes_in_per_sec == 0 for load in there.loads())
