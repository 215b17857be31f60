"""The topic registry's changes are conditional: another node's topic of the same name, or its
change to a topic meanwhile, is never overwritten (the controller decides put-if-absent,
compare-and-set and compare-and-delete; see automq_ref/kafka/topic_registry.py), and creating
or growing a topic places its new partitions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.kv_integer import encode_kv_integer
from automq_ref.formats.meta_stream import encode_leader_epochs, encode_log
from automq_ref.formats.topic_record import Topic
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.kafka.topic_configs import ConfigChange, ConfigOperation
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.kafka.topics import TopicError
from automq_ref.node import Node, start_node
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import PARTITION_KEY_PREFIX, partition_key, topic_key

SET = ConfigOperation.SET


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        yield node
    finally:
        await node.shutdown()


async def foreign_put(node: Node, topic: Topic) -> None:
    """Another node writes ``topic``'s record."""
    assert (await node.client.submit(sm.PutKV(topic_key(topic.name), topic.encode(), True))).ok


async def untagged_partition(node: Node, topic: Topic, index: int) -> None:
    """A partition as brokers wrote it before placement: streams tagged with nothing, opened
    at epoch 0, its LOG record, its KV entry."""
    storage = node.storage
    meta_stream, data_stream = await storage.create_stream(), await storage.create_stream()
    for stream_id in (meta_stream, data_stream):
        await storage.open_stream(stream_id, 0)
    await storage.append(meta_stream, 0, encode_log(data_stream), 1)
    await storage.append(meta_stream, 0, encode_leader_epochs([(0, 0)]), 1)
    put = sm.PutKV(partition_key(topic.topic_id, index), encode_kv_integer(meta_stream), False)
    assert (await node.client.submit(put)).ok


def stored(node: Node, name: str) -> Topic:
    return Topic.decode(name, node.view.image.kv[topic_key(name)])


def partition_keys(node: Node) -> set[str]:
    return {key for key in node.view.image.kv if key.startswith(PARTITION_KEY_PREFIX)}


class RacingClient:
    """Another node creates the topic just before this node's record is written."""

    def __init__(self, client: ControllerClient, rival: Topic) -> None:
        self._client = client
        self._rival = rival

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        if isinstance(event, sm.CreateTopic) and event.name == self._rival.name:
            rival = sm.CreateTopic(event.name, self._rival.encode())
            assert (await self._client.submit(rival)).ok
        return await self._client.submit(event)


async def test_a_topic_another_node_created_meanwhile_is_not_overwritten(node: Node) -> None:
    rival = Topic("raced", uuid.uuid4(), 1, {})
    before = partition_keys(node)
    registry = TopicRegistry(node.storage, RacingClient(node.client, rival), node.view, node.config)
    with pytest.raises(TopicError) as refused:
        await registry.create_topic("raced", 3, {})
    assert refused.value.code is KafkaErrorCode.TOPIC_ALREADY_EXISTS
    assert stored(node, "raced") == rival
    # The partitions made for the lost creation are gone again.
    assert partition_keys(node) == before and registry.partitions == {}
    # And a topic found in the KV is refused before any partition is made.
    with pytest.raises(TopicError) as again:
        await node.topics.create_topic("raced", 1, {})
    assert again.value.code is KafkaErrorCode.TOPIC_ALREADY_EXISTS


async def test_changes_decide_again_on_another_nodes_configs(node: Node) -> None:
    topic = await node.topics.create_topic("t", 1, {"retention.ms": "1000"})
    await foreign_put(node, Topic("t", topic.topic_id, 1, {"retention.bytes": "5"}))
    await node.topics.alter_configs(
        "t", [ConfigChange("retention.ms", SET, "2000")], validate_only=False
    )
    assert stored(node, "t").configs == {"retention.bytes": "5", "retention.ms": "2000"}
    assert node.topics.topics["t"] == stored(node, "t")

    await foreign_put(node, Topic("t", topic.topic_id, 1, {"retention.bytes": "6"}))
    await node.topics.add_partitions("t", 3, validate_only=False)
    assert stored(node, "t") == Topic("t", topic.topic_id, 3, {"retention.bytes": "6"})
    assert sorted(index for name, index in node.topics.partitions if name == "t") == [0, 1, 2]

    await foreign_put(node, Topic("t", topic.topic_id, 3, {}))
    await node.topics.delete_topic("t")
    assert topic_key("t") not in node.view.image.kv and partition_keys(node) == set()


async def test_a_topic_grown_recreated_or_deleted_elsewhere_is_an_error(node: Node) -> None:
    topic = await node.topics.create_topic("t", 1, {})
    grown = Topic("t", topic.topic_id, 2, {})
    await foreign_put(node, grown)
    with pytest.raises(TopicError) as changed:
        await node.topics.alter_configs(
            "t", [ConfigChange("retention.ms", SET, "1")], validate_only=False
        )
    assert changed.value.code is KafkaErrorCode.UNKNOWN_SERVER_ERROR
    assert "changed by another node" in str(changed.value)
    assert stored(node, "t") == grown

    recreated = Topic("t", uuid.uuid4(), 1, {})
    await foreign_put(node, recreated)
    before = partition_keys(node)
    with pytest.raises(TopicError):
        await node.topics.add_partitions("t", 4, validate_only=False)
    assert stored(node, "t") == recreated
    assert partition_keys(node) == before  # the partitions added for it are gone again

    assert (await node.client.submit(sm.DeleteKV(topic_key("t")))).ok
    with pytest.raises(TopicError) as deleted:
        await node.topics.delete_topic("t")
    assert deleted.value.code is KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "deleted by another node" in str(deleted.value)


async def test_topics_are_placed_as_they_are_created_grown_and_deleted(node: Node) -> None:
    me = node.config.node_id
    topic = await node.topics.create_topic("p", 2, {})
    assert sm.broker_partitions(node.view.image, me) == [("p", 0, 0), ("p", 1, 0)]
    await node.topics.add_partitions("p", 3, assignments=[[me]], validate_only=False)
    assert sm.assigned_broker(node.view.image, "p", 2) == me
    with pytest.raises(TopicError) as refused:
        await node.topics.create_topic("q", 1, {}, assignments=[me + 7])
    assert refused.value.code is KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "q" not in node.topics.topics and topic_key("q") not in node.view.image.kv
    await node.topics.delete_topic("p")
    assert sm.placed_topic(node.view.image, "p") is None
    assert str(topic.topic_id) not in node.view.image.topics


async def test_a_topic_written_before_placement_is_placed_at_open(tmp_path: Path) -> None:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216"], environment={}
    )
    node = await start_node(config)
    try:
        # Its partition and a bare record, as topics were written before the controller
        # placed partitions.
        old = Topic("old", uuid.uuid4(), 1, {})
        await untagged_partition(node, old, 0)
        await foreign_put(node, old)
        assert sm.placed_topic(node.view.image, "old") is None
    finally:
        await node.shutdown()
    node = await start_node(config)
    try:
        assert sm.assigned_broker(node.view.image, "old", 0) == config.node_id
        assert node.topics.topics["old"] == stored(node, "old")
    finally:
        await node.shutdown()


class UndecidingClient:
    """Passes requests through, but a topic change of type ``lost`` gets no decision (the
    metadata quorum away, or the controller failed over with it in flight)."""

    def __init__(self, client: ControllerClient, lost: type) -> None:
        self._client = client
        self._lost = lost

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        if isinstance(event, self._lost):
            raise ControllerError(f"{type(event).__name__}: no answer (its outcome is unknown)")
        return await self._client.submit(event)


@pytest.mark.parametrize(
    ("change", "lost"),
    [
        ("create", sm.CreateTopic),
        ("delete", sm.DeleteTopic),
        ("alter", sm.PutKV),
        ("grow", sm.CreatePartitions),
    ],
)
async def test_a_change_the_controller_gave_no_decision_is_request_timed_out(
    node: Node, change: str, lost: type
) -> None:
    """Answered with an error the client can act on (the handlers answer TopicError per
    topic), not raised past the handler, which would close the client's connection."""
    await node.topics.create_topic("t", 1, {})
    registry = TopicRegistry(
        node.storage, UndecidingClient(node.client, lost), node.view, node.config
    )
    registry.topics, registry._records = dict(node.topics.topics), dict(node.topics._records)
    with pytest.raises(TopicError) as undecided:
        if change == "create":
            await registry.create_topic("u", 1, {})
        elif change == "delete":
            await registry.delete_topic("t")
        elif change == "alter":
            changes = [ConfigChange("retention.ms", SET, "1")]
            await registry.alter_configs("t", changes, validate_only=False)
        else:
            await registry.add_partitions("t", 2, validate_only=False)
    assert undecided.value.code is KafkaErrorCode.REQUEST_TIMED_OUT
    assert "no decision" in str(undecided.value) and "may have been applied" in str(undecided.value)
    assert lost.__name__ in str(undecided.value)
