"""A broker's topic registry follows the view: topics another broker creates, grows,
reconfigures, re-creates or deletes appear in it, and a partition that broker holds open is left
to it (see ``catch_up`` in automq_ref/kafka/topic_registry.py).

Two brokers in one process: node 1 is a whole node (its embedded controller); broker 2 has its
own WAL, storage and view of that same controller, over the same object store, and a registry of
its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from automq_ref.config import load_config
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

OTHER = 2


@dataclass
class Brokers:
    node: Node
    other: TopicRegistry


@pytest.fixture
async def brokers(tmp_path: Path) -> AsyncIterator[Brokers]:
    config = load_config(
        overrides=[f"log.dirs={tmp_path / 'one'}", "s3.wal.capacity=16777216"], environment={}
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
    try:
        yield Brokers(node, other)
    finally:
        for partition in other.partitions.values():
            await partition.close()
        await storage.shutdown()
        await store.close()
        await node.shutdown()


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


async def test_topics_of_another_broker_are_followed(brokers: Brokers) -> None:
    here, there = brokers.node.topics, brokers.other
    created = await there.create_topic("theirs", 2, {})
    await until(lambda: "theirs" in here.topics)
    assert here.topics["theirs"] == created
    # Its partitions are open on the broker that created them, so not here.
    assert not [key for key in here.partitions if key[0] == "theirs"]

    await there.add_partitions("theirs", 3, validate_only=False)
    await there.alter_configs(
        "theirs", [ConfigChange("retention.ms", ConfigOperation.SET, "5")], validate_only=False
    )
    await until(lambda: here.topics["theirs"] == there.topics["theirs"])
    assert here.topics["theirs"].partitions == 3
    assert here.topic_config(here.topics["theirs"], "retention.ms") == "5"

    # A change here decides on the followed record: no conflict with theirs.
    await here.alter_configs(
        "theirs", [ConfigChange("retention.ms", ConfigOperation.SET, "6")], validate_only=False
    )

    await there.delete_topic("theirs")
    await until(lambda: "theirs" not in here.topics)


async def test_a_topic_deleted_elsewhere_drops_the_partitions_held_here(
    brokers: Brokers,
) -> None:
    here, there = brokers.node.topics, brokers.other
    there.follow()
    try:
        mine = await here.create_topic("mine", 2, {})
        await until(lambda: "mine" in there.topics)
        assert not there.partitions
        assert [key for key in brokers.node.view.image.kv if str(mine.topic_id) in key]
        # Deleted by the other broker, which holds none of its partitions: this node, which
        # holds them, deletes them when it sees the topic go.
        await there.delete_topic("mine")
        await until(lambda: "mine" not in here.topics)
        assert not [key for key in here.partitions if key[0] == "mine"]
        image = brokers.node.view.image
        assert str(mine.topic_id) not in image.topics
        assert not [key for key in image.kv if str(mine.topic_id) in key]
    finally:
        await there.stop_following()


async def test_a_partition_that_would_not_open_is_opened_at_a_later_round(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = brokers.node.topics, brokers.other
    await here.stop_following()
    await there.create_topic("moved", 1, {})
    # Broker 2 lets go of its partition: this node, following, opens it.
    await there.partitions.pop(("moved", 0)).close()
    opened = Partition.open
    failures: list[object] = []

    async def open_once_failing(*args: Any, **kwargs: Any) -> Partition:
        if not failures:
            failures.append(args)
            raise OSError("the object store is away")
        return await opened(*args, **kwargs)

    monkeypatch.setattr(Partition, "open", open_once_failing)
    monkeypatch.setattr(topic_registry, "FOLLOW_RETRY_S", 0.01)
    here.follow()
    await until(lambda: ("moved", 0) in here.partitions)
    assert failures and here.topics["moved"] == there.topics["moved"]
