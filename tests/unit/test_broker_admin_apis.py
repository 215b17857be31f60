"""The admin APIs admin clients send, through the dispatcher of a node in process:
DescribeLogDirs, OffsetDelete (and its tombstones replayed when the node restarts),
DescribeTopicPartitions (its cursor and limit), ConsumerGroupDescribe, the telemetry APIs
(served, not advertised), and an API a Kafka broker serves that this one does not, answered
UNSUPPORTED_VERSION rather than closed."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.describe_log_dirs.v4.request import DescribableLogDirTopic
from kio.schema.describe_topic_partitions.v0.request import Cursor, TopicRequest
from kio.schema.offset_delete.v0.request import (
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.handlers import telemetry
from automq_ref.kafka.server import CloseConnection, Peer
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import call, create_topic, node_config, request_frame
from tests.unit.test_group_shards import commit, fetched

PEER = Peer(1, "127.0.0.1:1")
DESCRIBE_LOG_DIRS, OFFSET_DELETE, DESCRIBE_TOPIC_PARTITIONS = 35, 47, 75
CONSUMER_GROUP_DESCRIBE, GET_TELEMETRY, PUSH_TELEMETRY = 69, 71, 72


async def produce(node: Node, topic: str, index: int, sizes: list[int]) -> list[int]:
    """Append one batch per size to a partition led here; the stored sizes of the batches."""
    partition = node.front_end.context.topics.partitions[(topic, index)]
    stored = []
    for size in sizes:
        batch = build_record_batch([(None, b"x" * size, (), 0)])
        result = partition.append_nowait(batch, 1 << 20)
        assert result.error is E.NONE and result.durable is not None
        await result.durable
        stored.append(len(batch))
    return stored


async def test_describe_log_dirs(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    try:
        admit = node.front_end.admit
        await create_topic(admit, PEER, "logs", 2)
        await create_topic(admit, PEER, "other", 1)
        sizes = await produce(node, "logs", 1, [10, 300])
        described = await call(admit, PEER, DESCRIBE_LOG_DIRS, 4, topics=None)
        assert int(described.error_code) == 0
        (result,) = described.results
        assert result.log_dir == str(tmp_path.absolute())
        usage = shutil.disk_usage(tmp_path)
        assert int(result.total_bytes) == usage.total
        assert 0 < int(result.usable_bytes) <= usage.total
        by_topic = {
            t.name: {int(p.partition_index): p for p in t.partitions} for t in result.topics
        }
        assert set(by_topic) >= {"logs", "other"}
        assert int(by_topic["logs"][0].partition_size) == 0
        assert int(by_topic["logs"][1].partition_size) == sum(sizes)
        assert {int(p.offset_lag) for p in by_topic["logs"].values()} == {0}
        assert not any(p.is_future_key for p in by_topic["logs"].values())
        # A filter: only the partitions named (an unknown one is left out).
        wanted = (DescribableLogDirTopic(topic=TopicName("logs"), partitions=(i32(1), i32(9))),)
        filtered = await call(admit, PEER, DESCRIBE_LOG_DIRS, 4, topics=wanted)
        ((topic,),) = [r.topics for r in filtered.results]
        assert topic.name == "logs"
        assert [int(p.partition_index) for p in topic.partitions] == [1]
        # v1: no totals, no top-level error, same partitions.
        old = await call(admit, PEER, DESCRIBE_LOG_DIRS, 1, topics=wanted)
        assert [int(p.partition_size) for p in old.results[0].topics[0].partitions] == [sum(sizes)]
    finally:
        await node.shutdown()


def offset_delete_topics(*keys: tuple[str, int]) -> tuple[OffsetDeleteRequestTopic, ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, index in keys:
        by_topic.setdefault(topic, []).append(index)
    return tuple(
        OffsetDeleteRequestTopic(
            name=TopicName(topic),
            partitions=tuple(OffsetDeleteRequestPartition(partition_index=i32(i)) for i in parts),
        )
        for topic, parts in by_topic.items()
    )


def results(response: Any) -> dict[tuple[str, int], int]:
    return {
        (t.name, int(p.partition_index)): int(p.error_code)
        for t in response.topics
        for p in t.partitions
    }


async def test_offset_delete_and_its_tombstones_after_a_restart(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    node = await start_node(config)
    try:
        admit = node.front_end.admit
        await create_topic(admit, PEER, "read", 1)
        await create_topic(admit, PEER, "kept", 1)
        assert await commit(admit, "solo", 5) is E.NONE
        assert await commit(admit, "solo", 7, topic="kept") is E.NONE
        deleted = await call(
            admit,
            PEER,
            OFFSET_DELETE,
            0,
            group_id=GroupId("solo"),
            topics=offset_delete_topics(("read", 0), ("read", 3), ("nope", 0)),
        )
        assert int(deleted.error_code) == 0
        assert results(deleted) == {
            ("read", 0): 0,
            ("read", 3): E.UNKNOWN_TOPIC_OR_PARTITION,
            ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert await fetched(admit, "solo") == [(E.NONE, -1)]
        assert await fetched(admit, "solo", topic="kept") == [(E.NONE, 7)]
        unknown = await call(
            admit,
            PEER,
            OFFSET_DELETE,
            0,
            group_id=GroupId("never"),
            topics=offset_delete_topics(("read", 0), ("nope", 1)),
        )
        assert int(unknown.error_code) == E.GROUP_ID_NOT_FOUND
        assert results(unknown) == {("nope", 1): E.UNKNOWN_TOPIC_OR_PARTITION}
        empty_id = await call(admit, PEER, OFFSET_DELETE, 0, group_id=GroupId(""), topics=())
        assert int(empty_id.error_code) == E.INVALID_GROUP_ID
    finally:
        await node.shutdown()
    # The shard loads again from the partition's log: the tombstone deletes the offset.
    node = await start_node(config)
    try:
        admit = node.front_end.admit
        assert await fetched(admit, "solo") == [(E.NONE, -1)]
        assert await fetched(admit, "solo", topic="kept") == [(E.NONE, 7)]
    finally:
        await node.shutdown()


async def test_describe_topic_partitions_pages_with_its_cursor(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    try:
        admit = node.front_end.admit
        await create_topic(admit, PEER, "a", 3)
        await create_topic(admit, PEER, "b", 2)
        await create_topic(admit, PEER, "c", 1)

        async def page(names: tuple[str, ...], limit: int, cursor: Cursor | None = None) -> Any:
            return await call(
                admit,
                PEER,
                DESCRIBE_TOPIC_PARTITIONS,
                0,
                topics=tuple(TopicRequest(name=TopicName(n)) for n in names),
                response_partition_limit=i32(limit),
                cursor=cursor,
            )

        first = await page(("a", "b", "c"), 4)
        assert [(t.name, [int(p.partition_index) for p in t.partitions]) for t in first.topics] == [
            ("a", [0, 1, 2]),
            ("b", [0]),
        ]
        assert (first.next_cursor.topic_name, int(first.next_cursor.partition_index)) == ("b", 1)
        (a, _) = first.topics
        assert a.topic_id == node.front_end.context.topics.topics["a"].topic_id
        assert {int(p.leader_id) for p in a.partitions} == {node.config.node_id}
        assert all(list(p.isr_nodes) == [node.config.node_id] for p in a.partitions)
        rest = await page(
            ("a", "b", "c"), 4, Cursor(topic_name=TopicName("b"), partition_index=i32(1))
        )
        assert [(t.name, [int(p.partition_index) for p in t.partitions]) for t in rest.topics] == [
            ("b", [1]),
            ("c", [0]),
        ]
        assert rest.next_cursor is None
        # A limit that ends with a topic: the next topic's first partition is the cursor.
        exact = await page(("a", "b"), 3)
        assert [t.name for t in exact.topics] == ["a"]
        assert (exact.next_cursor.topic_name, int(exact.next_cursor.partition_index)) == ("b", 0)
        # Every topic (an empty list), from the cursor on; an unknown one named is an error.
        every = await page((), 100, Cursor(topic_name=TopicName("b"), partition_index=i32(0)))
        assert [t.name for t in every.topics][:2] == ["b", "c"]
        missing = await page(("zzz", "bad name!"), 10)
        assert {t.name: int(t.error_code) for t in missing.topics} == {
            "zzz": E.UNKNOWN_TOPIC_OR_PARTITION,
            "bad name!": E.INVALID_TOPIC_EXCEPTION,
        }
        # A cursor on a topic the list does not name is INVALID_REQUEST.
        refused = await page(("a",), 10, Cursor(topic_name=TopicName("b"), partition_index=i32(0)))
        assert [(t.name, int(t.error_code)) for t in refused.topics] == [("a", E.INVALID_REQUEST)]
    finally:
        await node.shutdown()


async def test_consumer_group_describe_and_telemetry(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    try:
        admit = node.front_end.admit
        await create_topic(admit, PEER, "read", 1)
        assert await commit(admit, "classic", 1) is E.NONE
        described = await call(
            admit,
            PEER,
            CONSUMER_GROUP_DESCRIBE,
            1,
            group_ids=(GroupId("classic"), GroupId("unknown"), GroupId("")),
            include_authorized_operations=False,
        )
        assert [(g.group_id, int(g.error_code)) for g in described.groups] == [
            ("classic", E.GROUP_ID_NOT_FOUND),
            ("unknown", E.GROUP_ID_NOT_FOUND),
            ("", E.INVALID_GROUP_ID),
        ]
        got = await call(admit, PEER, GET_TELEMETRY, 0, client_instance_id=None)
        assert int(got.error_code) == 0
        instance = got.client_instance_id
        assert instance is not None and instance.int != 0
        assert list(got.requested_metrics) == []
        assert int(got.push_interval.total_seconds()) == 300
        again = await call(admit, PEER, GET_TELEMETRY, 0, client_instance_id=instance)
        assert again.client_instance_id == instance
        assert int(again.subscription_id) == int(got.subscription_id)

        async def push(instance_id: uuid.UUID, subscription: int, compression: int = 0) -> int:
            pushed = await call(
                admit,
                PEER,
                PUSH_TELEMETRY,
                0,
                client_instance_id=instance_id,
                subscription_id=i32(subscription),
                terminating=False,
                compression_type=i8(compression),
                metrics=b"metrics",
            )
            return int(pushed.error_code)

        assert await push(instance, int(got.subscription_id)) == 0
        assert await push(instance, int(got.subscription_id) ^ 1) == E.UNKNOWN_SUBSCRIPTION_ID
        assert await push(instance, int(got.subscription_id), 9) == E.UNSUPPORTED_COMPRESSION_TYPE
        assert await push(uuid.UUID(int=0), 0) == E.INVALID_REQUEST
    finally:
        await node.shutdown()


def test_the_subscription_id_is_kafkas() -> None:
    """Kafka's computeSubscriptionId of no metric at 300000 ms, for a known instance id:
    CRC32C("[]300000") ^ Uuid.hashCode, as Java computes them."""
    instance = uuid.UUID(int=(0x0123456789ABCDEF << 64) | 0x0FEDCBA987654321)
    xor = 0x0123456789ABCDEF ^ 0x0FEDCBA987654321
    java_hash = ((xor >> 32) ^ xor) & 0xFFFFFFFF
    expected = (3569834974 ^ java_hash) & 0xFFFFFFFF
    expected -= 2**32 if expected >= 2**31 else 0
    assert telemetry.subscription_id(instance) == expected


async def test_an_api_kafka_serves_is_answered_unsupported_not_closed(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    try:
        admit = node.front_end.admit
        # DescribeDelegationToken (41): no delegation tokens here; its response has an
        # error_code.
        tokens = await call(admit, PEER, 41, 3, owners=None)
        assert int(tokens.error_code) == E.UNSUPPORTED_VERSION
        assert list(tokens.tokens) == []
        # AlterReplicaLogDirs (34) has errors per entry only: the connection is closed.
        frame = request_frame(34, 2, 1, dirs=())
        with pytest.raises(CloseConnection):
            await admit(frame, PEER)
        # An API a Kafka broker does not serve (Vote, a controller's) is closed too.
        frame = request_frame(52, 0, 1, cluster_id=None, topics=())
        with pytest.raises(CloseConnection):
            await admit(frame, PEER)
    finally:
        await node.shutdown()
