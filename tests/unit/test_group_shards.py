"""Groups spread over the partitions of ``__consumer_offsets`` (automq_ref/kafka/groups.py): a
group's coordinator partition is Kafka's hash of its id; the broker leading that partition runs
its shard, loaded from the partition's log; when the partition moves, the old broker answers
``NOT_COORDINATOR`` (also to the requests still waiting) and the new one serves the group's
offsets from the same log. Also the internal topic's place among topics, compaction of its log,
and the import of earlier versions' offsets streams.

Two brokers in one process, as in tests/unit/test_topic_following.py: node 1 is a whole node
(its embedded controller); broker 2 has its own WAL, storage, view of that same controller,
topic registry, group coordinator and front end.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_partitions.v3.request import CreatePartitionsTopic
from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.delete_records.v2.request import DeleteRecordsPartition, DeleteRecordsTopic
from kio.schema.delete_topics.v6.request import DeleteTopicState
from kio.schema.join_group.v5.request import JoinGroupRequestProtocol
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import Records, i16, i32, i64

from automq_ref.config import BrokerConfig, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import offsets_record as orec
from automq_ref.formats.kv_integer import encode_kv_integer
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata.client import register_node
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.object_store import open_object_store
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.kafka import groups as groups_module
from automq_ref.kafka.compaction import clean_partition
from automq_ref.kafka.coordinator_topic import coordinator_partition, java_string_hashcode
from automq_ref.kafka.dispatch import Dispatcher
from automq_ref.kafka.group_import import encode_record
from automq_ref.kafka.group_shard import GroupShard
from automq_ref.kafka.groups import GroupCoordinator
from automq_ref.kafka.partition import stored_batches
from automq_ref.kafka.producer_ids import ProducerIdAllocator
from automq_ref.kafka.request import Context
from automq_ref.kafka.server import Peer
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.node import Node, open_wal, start_node
from automq_ref.state_machines import group as gc
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.compaction import CleanerConfig
from automq_ref.vocabulary.naming import (
    CONSUMER_OFFSETS_TOPIC,
    NAMESPACE,
    OFFSETS_IMPORTED_PREFIX,
    OFFSETS_STREAM_KEY,
    node_offsets_stream_key,
)
from tests.unit.test_broker_node import call

OTHER = 2
PARTITIONS = 4
PEER = Peer(1, "127.0.0.1:1")
OTHER_ADDRESS = ("127.0.0.2", 19092)
JOIN, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 11, 8, 9, 10


def config(data_dir: Path, *extra: str) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={data_dir}",
            "s3.wal.capacity=16777216",
            f"offsets.topic.num.partitions={PARTITIONS}",
            # A JoinGroup waits out the delay: a request still waiting when its partition moves.
            "group.initial.rebalance.delay.ms=60000",
            *extra,
        ],
        environment={},
    )


def test_the_coordinator_partition_is_kafkas() -> None:
    # Java's String.hashCode, over UTF-16 code units, in 32-bit arithmetic.
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("Aa") == java_string_hashcode("BB") == 2112
    assert java_string_hashcode("Hello World") == -862545276
    assert java_string_hashcode("\U0001f600") == 0xD83D * 31 + 0xDE00  # a surrogate pair
    # Utils.abs: the absolute value, except Integer.MIN_VALUE, which is 0.
    assert java_string_hashcode("polygenelubricants") == -(2**31)
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("Hello World", 50) == 862545276 % 50
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("anything", 1) == 0


def test_the_records_are_kafkas_schemas() -> None:
    key = orec.encode_offset_key("g", "t", 3)
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x03"
    assert orec.decode_key(key) == orec.OffsetKey("g", "t", 3)
    assert orec.decode_key(orec.encode_group_key("g")) == orec.GroupKey("g")
    assert orec.decode_key(b"\x00\x0b\x00\x01g") == orec.UnknownKey(11)
    value = orec.OffsetValue(42, 7, "meta", 1_700_000_000_000)
    assert orec.decode_offset_value(orec.encode_offset_value(value)) == value
    # Version 1 (with an expire timestamp) and 0 (without a leader epoch) are read too.
    v1 = b"\x00\x01" + (5).to_bytes(8, "big") + b"\x00\x00" + (9).to_bytes(8, "big") * 2
    assert orec.decode_offset_value(v1) == orec.OffsetValue(5, -1, "", 9)


@dataclass
class Brokers:
    node: Node
    other: TopicRegistry
    other_groups: GroupCoordinator
    other_admit: Any


@pytest.fixture
async def brokers(tmp_path: Path) -> AsyncIterator[Brokers]:
    node = await start_node(config(tmp_path / "one"))
    other_config = config(tmp_path / "two", f"node.id={OTHER}")
    other_config.data_dir.mkdir(parents=True)
    view = ImageView(node.controller.image)
    node.controller.subscribe(view.publish)
    registration = await register_node(
        node.client, OTHER, 1, listeners=(sm.Endpoint("PLAINTEXT", *OTHER_ADDRESS),)
    )
    assert (await node.client.submit(sm.BrokerHeartbeat(OTHER, registration.node_epoch, 1))).ok
    store = open_object_store(node.config.object_store_uri)
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
    clock = SystemClock()
    groups = GroupCoordinator(storage, node.client, view, other_config, clock)
    other = await TopicRegistry.open(storage, node.client, view, other_config, (groups,))
    groups.start(other)
    other.follow()
    context = Context(
        config=other_config,
        topics=other,
        groups=groups,
        producer_ids=ProducerIdAllocator(node.client, OTHER, registration.node_epoch),
        clock=clock,
        controller_client=node.client,
        view=view,
        advertised_host=OTHER_ADDRESS[0],
        advertised_port=OTHER_ADDRESS[1],
    )
    try:
        yield Brokers(node, other, groups, Dispatcher(context).admit)
    finally:
        await other.stop_following()
        await groups.close()
        for partition in other.partitions.values():
            await partition.close()
        await storage.shutdown()
        await store.close()
        await node.shutdown()


async def until(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def commit(admit: Any, group: str, offset: int, topic: str = "read") -> KafkaErrorCode:
    """A standalone consumer's commit (no generation, no member): partition 0 of ``topic``."""
    response = await call(
        admit,
        PEER,
        OFFSET_COMMIT,
        8,
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        topics=(
            OffsetCommitRequestTopic(
                name=TopicName(topic),
                partitions=(
                    OffsetCommitRequestPartition(
                        partition_index=i32(0),
                        committed_offset=i64(offset),
                        committed_leader_epoch=i32(-1),
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )
    return KafkaErrorCode(response.topics[0].partitions[0].error_code)


async def fetched(
    admit: Any, *groups: str, topic: str = "read"
) -> list[tuple[KafkaErrorCode, int]]:
    """(error, committed offset of partition 0 of ``topic``) per group, from one OffsetFetch."""
    response = await call(
        admit,
        PEER,
        OFFSET_FETCH,
        8,
        groups=tuple(
            OffsetFetchRequestGroup(
                group_id=GroupId(group),
                topics=(
                    OffsetFetchRequestTopics(name=TopicName(topic), partition_indexes=(i32(0),)),
                ),
            )
            for group in groups
        ),
        require_stable=False,
    )
    found = []
    for group in response.groups:
        offsets = [p.committed_offset for t in group.topics for p in t.partitions]
        found.append((KafkaErrorCode(group.error_code), offsets[0] if offsets else -1))
    return found


async def find(admit: Any, *groups: str) -> list[tuple[int, str, int, KafkaErrorCode]]:
    response = await call(
        admit, PEER, FIND_COORDINATOR, 4, key_type=i16(0), coordinator_keys=groups
    )
    return [
        (int(c.node_id), c.host, int(c.port), KafkaErrorCode(c.error_code))
        for c in response.coordinators
    ]


def group_on(brokers: Brokers, node_id: int, prefix: str) -> tuple[str, int]:
    """A group id whose coordinator partition is placed on ``node_id``, and that partition."""
    image = brokers.node.view.image
    for n in range(1000):
        group = f"{prefix}-{n}"
        index = coordinator_partition(group, PARTITIONS)
        if sm.assigned_broker(image, CONSUMER_OFFSETS_TOPIC, index) == node_id:
            return group, index
    raise AssertionError(f"no group on broker {node_id}")


async def test_a_group_moves_with_its_coordinator_partition(brokers: Brokers) -> None:
    node, admit, other_admit = brokers.node, brokers.node.front_end.admit, brokers.other_admit
    me = node.config.node_id
    await node.topics.create_topic("read", 1, {})
    # The first group request creates __consumer_offsets, placed over both brokers.
    assert (await find(admit, "probe"))[0][3] is KafkaErrorCode.NONE
    image = node.view.image
    owners = {sm.assigned_broker(image, CONSUMER_OFFSETS_TOPIC, i) for i in range(PARTITIONS)}
    assert owners == {me, OTHER}
    group, index = group_on(brokers, me, "moving")

    # Coordinated here: served here, refused at broker 2, found here by both.
    assert await commit(admit, group, 5) is KafkaErrorCode.NONE
    assert await fetched(admit, group) == [(KafkaErrorCode.NONE, 5)]
    assert await fetched(other_admit, group) == [(KafkaErrorCode.NOT_COORDINATOR, -1)]
    assert await commit(other_admit, group, 6) is KafkaErrorCode.NOT_COORDINATOR
    here = (me, node.advertised_address[0], node.advertised_address[1], KafkaErrorCode.NONE)
    assert await find(admit, group) == await find(other_admit, group) == [here]

    # A JoinGroup of another group of the same partition waits out the initial delay...
    waiting_group = next(
        f"waiting-{n}"
        for n in range(1000)
        if coordinator_partition(f"waiting-{n}", PARTITIONS) == index
    )
    joining = asyncio.ensure_future(
        call(
            admit,
            PEER,
            JOIN,
            5,
            group_id=waiting_group,
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=30),
            member_id="",
            group_instance_id="static-0",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
    )
    await asyncio.sleep(0.2)
    assert not joining.done()

    # ... when the partition moves to broker 2: answered NOT_COORDINATOR, and the group's
    # offsets are read there, from the same log.
    moved = await node.client.submit(sm.ReassignPartition(CONSUMER_OFFSETS_TOPIC, index, OTHER))
    assert moved.ok
    assert int((await asyncio.wait_for(joining, 20)).error_code) == (
        KafkaErrorCode.NOT_COORDINATOR.value
    )

    async def served_there() -> None:
        while (await fetched(other_admit, group))[0][0] is not KafkaErrorCode.NONE:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(served_there(), 20)
    assert await fetched(other_admit, group) == [(KafkaErrorCode.NONE, 5)]
    assert await fetched(admit, group) == [(KafkaErrorCode.NOT_COORDINATOR, -1)]
    there = (OTHER, *OTHER_ADDRESS, KafkaErrorCode.NONE)
    assert await find(admit, group) == await find(other_admit, group) == [there]
    # One OffsetFetch for groups of both brokers: each group answered on its own.
    stay, _ = group_on(brokers, me, "staying")
    assert await commit(admit, stay, 1) is KafkaErrorCode.NONE
    assert await fetched(admit, stay, group) == [
        (KafkaErrorCode.NONE, 1),
        (KafkaErrorCode.NOT_COORDINATOR, -1),
    ]

    # Committed there, and back here: the newest offset comes along.
    assert await commit(other_admit, group, 9) is KafkaErrorCode.NONE
    assert (await node.client.submit(sm.ReassignPartition(CONSUMER_OFFSETS_TOPIC, index, me))).ok

    async def served_here() -> None:
        while (await fetched(admit, group))[0][0] is not KafkaErrorCode.NONE:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(served_here(), 20)
    assert await fetched(admit, group) == [(KafkaErrorCode.NONE, 9)]
    assert await fetched(other_admit, group) == [(KafkaErrorCode.NOT_COORDINATOR, -1)]


async def test_each_broker_lists_the_groups_it_coordinates(brokers: Brokers) -> None:
    node, admit, other_admit = brokers.node, brokers.node.front_end.admit, brokers.other_admit
    await node.topics.create_topic("read", 1, {})
    await find(admit, "probe")
    mine, _ = group_on(brokers, node.config.node_id, "mine")
    theirs, _ = group_on(brokers, OTHER, "theirs")
    await until(lambda: len(brokers.other_groups._shards) == PARTITIONS // 2)

    async def committed_there() -> bool:
        return await commit(other_admit, theirs, 1) is KafkaErrorCode.NONE

    async with asyncio.timeout(20):
        while not await committed_there():
            await asyncio.sleep(0.01)
    assert await commit(admit, mine, 1) is KafkaErrorCode.NONE

    async def listed(at: Any) -> list[str]:
        response = await call(at, PEER, 16, 4, states_filter=())
        assert response.error_code == 0
        return [g.group_id for g in response.groups]

    assert await listed(admit) == [mine]
    assert await listed(other_admit) == [theirs]
    described = await call(
        admit, PEER, 15, 5, groups=(mine, theirs), include_authorized_operations=False
    )
    assert [(g.group_id, g.error_code, g.group_state) for g in described.groups] == [
        (mine, 0, "Empty"),
        (theirs, KafkaErrorCode.NOT_COORDINATOR.value, ""),
    ]
    deleted = await call(admit, PEER, 42, 2, groups_names=(theirs, mine, mine))
    assert [(g.group_id, g.error_code) for g in deleted.results] == [
        (theirs, KafkaErrorCode.NOT_COORDINATOR.value),
        (mine, 0),
    ]
    assert await listed(admit) == []


async def test_compaction_keeps_the_latest_offsets_and_drops_deleted_groups(
    brokers: Brokers,
) -> None:
    node, admit = brokers.node, brokers.node.front_end.admit
    me = node.config.node_id
    await node.topics.create_topic("read", 1, {})
    await find(admit, "probe")
    kept, index = group_on(brokers, me, "kept")
    gone = next(
        f"gone-{n}" for n in range(1000) if coordinator_partition(f"gone-{n}", PARTITIONS) == index
    )
    for offset in (1, 2, 3):
        assert await commit(admit, kept, offset) is KafkaErrorCode.NONE
    assert await commit(admit, gone, 7) is KafkaErrorCode.NONE
    deleted = await call(admit, PEER, 42, 2, groups_names=(gone,))
    assert [g.error_code for g in deleted.results] == [0]
    partition = node.topics.partitions[(CONSUMER_OFFSETS_TOPIC, index)]

    async def log() -> list[tuple[Any, bytes | None]]:
        found = []
        async with partition.maintenance:
            stored = partition.read_stored(partition.log_start_offset, partition.high_watermark)
            async for batch in stored:
                for view in stored_batches(batch.payload):
                    for record in view.records():
                        assert record.key is not None
                        found.append((orec.decode_key(record.key), record.value))
        return found

    offset_key = orec.OffsetKey(kept, "read", 0)
    # Each commit a record; the deletion tombstones the group's offset and its group key.
    assert [key for key, _ in await log()] == [
        offset_key,
        offset_key,
        offset_key,
        orec.OffsetKey(gone, "read", 0),
        orec.OffsetKey(gone, "read", 0),
        orec.GroupKey(gone),
    ]
    # The topic is compacted: a clean keeps each key's latest, and the tombstones until their
    # horizon (delete.retention.ms, 0 here) has passed.
    assert node.topics.topic_config(
        node.topics.topics[CONSUMER_OFFSETS_TOPIC], "cleanup.policy"
    ) == ("compact")
    cleaner = CleanerConfig(delete_retention_ms=0, min_cleanable_dirty_ratio=0.0)
    now = SystemClock().now_ms()
    assert await clean_partition(partition, now, cleaner) is not None
    found = await log()
    assert found[0][0] == offset_key
    assert orec.decode_offset_value(found[0][1] or b"").offset == 3
    assert [key for key, value in found[1:]] == [
        orec.OffsetKey(gone, "read", 0),
        orec.GroupKey(gone),
    ]
    # Another commit makes the log dirty again; the next clean is past the horizon.
    assert await commit(admit, kept, 4) is KafkaErrorCode.NONE
    assert await clean_partition(partition, now + 1000, cleaner) is not None
    assert [key for key, _ in await log()] == [offset_key]

    # Replayed by the partition's next broker: the latest offset, and nothing of the deleted.
    assert (await node.client.submit(sm.ReassignPartition(CONSUMER_OFFSETS_TOPIC, index, OTHER))).ok

    async def served_there() -> list[tuple[KafkaErrorCode, int]]:
        while True:
            found = await fetched(brokers.other_admit, kept, gone)
            if found[0][0] is KafkaErrorCode.NONE:
                return found
            await asyncio.sleep(0.01)

    assert await asyncio.wait_for(served_there(), 20) == [
        (KafkaErrorCode.NONE, 4),
        (KafkaErrorCode.NONE, -1),
    ]


async def test_the_internal_topic_is_listed_and_protected(tmp_path: Path) -> None:
    node = await start_node(config(tmp_path))
    admit = node.front_end.admit
    try:
        # Not there before the first group request.
        listed = await call(
            admit,
            PEER,
            3,
            12,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        assert [t.name for t in listed.topics] == []
        assert (await find(admit, "g"))[0][3] is KafkaErrorCode.NONE
        listed = await call(
            admit,
            PEER,
            3,
            12,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        (topic,) = listed.topics
        assert (topic.name, topic.is_internal, len(topic.partitions)) == (
            CONSUMER_OFFSETS_TOPIC,
            True,
            PARTITIONS,
        )

        produced = await call(
            admit,
            PEER,
            0,
            9,
            transactional_id=None,
            acks=i16(-1),
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                TopicProduceData(
                    name=TopicName(CONSUMER_OFFSETS_TOPIC),
                    partition_data=(
                        PartitionProduceData(
                            index=i32(0), records=Records(build_record_batch([(b"k", b"v")]))
                        ),
                    ),
                ),
            ),
        )
        error = produced.responses[0].partition_responses[0].error_code
        assert error == KafkaErrorCode.INVALID_TOPIC_EXCEPTION.value

        deleted = await call(
            admit,
            PEER,
            20,
            6,
            topics=(DeleteTopicState(name=TopicName(CONSUMER_OFFSETS_TOPIC), topic_id=None),),
            timeout=datetime.timedelta(seconds=5),
        )
        assert deleted.responses[0].error_code == KafkaErrorCode.INVALID_REQUEST.value
        grown = await call(
            admit,
            PEER,
            37,
            3,
            topics=(
                CreatePartitionsTopic(
                    name=TopicName(CONSUMER_OFFSETS_TOPIC), count=i32(8), assignments=None
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
            validate_only=False,
        )
        assert grown.results[0].error_code == KafkaErrorCode.INVALID_REQUEST.value
        trimmed = await call(
            admit,
            PEER,
            21,
            2,
            topics=(
                DeleteRecordsTopic(
                    name=TopicName(CONSUMER_OFFSETS_TOPIC),
                    partitions=(DeleteRecordsPartition(partition_index=i32(0), offset=i64(-1)),),
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
        )
        error = trimmed.topics[0].partitions[0].error_code
        assert error == KafkaErrorCode.INVALID_TOPIC_EXCEPTION.value
        created = await call(
            admit,
            PEER,
            19,
            5,
            topics=(
                CreatableTopic(
                    name=TopicName(CONSUMER_OFFSETS_TOPIC),
                    num_partitions=i32(1),
                    replication_factor=i16(1),
                    assignments=(),
                    configs=(),
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
            validate_only=False,
        )
        assert created.topics[0].error_code == KafkaErrorCode.TOPIC_ALREADY_EXISTS.value
        assert node.topics.topics[CONSUMER_OFFSETS_TOPIC].partitions == PARTITIONS
    finally:
        await node.shutdown()


async def test_old_offsets_streams_are_imported_once_and_deleted(tmp_path: Path) -> None:
    """A data directory of an earlier version: its offsets stream (and a cluster broker's)."""
    node = await start_node(config(tmp_path))
    offsets = {
        "old-a": (("read", 0, 11), ("read", 1, 12)),
        "old-b": (("read", 0, 21),),
        "old-gone": (("read", 0, 31),),
    }
    try:
        await node.topics.create_topic("read", 2, {})
        streams = {}
        olds: tuple[tuple[str, list[gc.DurableRecord]], ...] = (
            (
                OFFSETS_STREAM_KEY,
                [
                    gc.PersistOffsets(
                        -1,
                        "old-a",
                        tuple(gc.OffsetRecord(t, p, o, -1, "m", 1) for t, p, o in offsets["old-a"]),
                    ),
                    gc.PersistOffsets(
                        -1,
                        "old-gone",
                        tuple(
                            gc.OffsetRecord(t, p, o, -1, "", 1) for t, p, o in offsets["old-gone"]
                        ),
                    ),
                    gc.PersistGroupDeletion(-1, ("old-gone",)),
                ],
            ),
            (
                node_offsets_stream_key(2),
                [
                    gc.PersistOffsets(
                        -1,
                        "old-b",
                        tuple(gc.OffsetRecord(t, p, o, 3, "", 1) for t, p, o in offsets["old-b"]),
                    )
                ],
            ),
        )
        for key, records in olds:
            stream_id = await node.storage.create_stream()
            await node.storage.open_stream(stream_id, 0)
            for record in records:
                await node.storage.append(stream_id, 0, encode_record(record), 1)
            await node.storage.close_stream(stream_id, 0)
            assert (await node.client.submit(sm.PutKV(key, encode_kv_integer(stream_id), False))).ok
            streams[key] = stream_id
    finally:
        await node.shutdown()

    # The next start creates the topic at once and imports both streams before serving.
    node = await start_node(config(tmp_path))
    try:
        image = node.view.image
        assert CONSUMER_OFFSETS_TOPIC in node.topics.topics
        assert not [key for key in image.kv if key.startswith(OFFSETS_IMPORTED_PREFIX)]
        assert OFFSETS_STREAM_KEY not in image.kv and node_offsets_stream_key(2) not in image.kv
        assert not set(streams.values()) & set(image.streams)
        found = await fetched(node.front_end.admit, "old-a", "old-b", "old-gone")
        assert found == [
            (KafkaErrorCode.NONE, 11),
            (KafkaErrorCode.NONE, 21),
            (KafkaErrorCode.NONE, -1),
        ]
    finally:
        await node.shutdown()
    # Imported once: a restart replays the partitions, with nothing left to import.
    node = await start_node(config(tmp_path))
    try:
        response = await call(
            node.front_end.admit,
            PEER,
            OFFSET_FETCH,
            8,
            groups=(OffsetFetchRequestGroup(group_id=GroupId("old-a"), topics=None),),
            require_stable=False,
        )
        (group,) = response.groups
        assert [
            (t.name, p.partition_index, p.committed_offset, p.metadata)
            for t in group.topics
            for p in t.partitions
        ] == [("read", 0, 11, "m"), ("read", 1, 12, "m")]
    finally:
        await node.shutdown()


async def test_a_loading_shard_answers_load_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard loading answers COORDINATOR_LOAD_IN_PROGRESS (clients retry), FindCoordinator
    names its broker meanwhile, and an empty group id is INVALID_GROUP_ID wherever it is sent."""
    released = asyncio.Event()
    replay = GroupShard.replay

    async def slow_replay(shard: GroupShard) -> None:
        await released.wait()
        await replay(shard)

    monkeypatch.setattr(GroupShard, "replay", slow_replay)
    monkeypatch.setattr(groups_module, "CREATE_WAIT_S", 0.2)
    node = await start_node(config(tmp_path))
    admit = node.front_end.admit
    try:
        await node.topics.create_topic("read", 1, {})
        me = (node.config.node_id, *node.advertised_address, KafkaErrorCode.NONE)
        assert await find(admit, "loading") == [me]
        v1 = await call(admit, PEER, FIND_COORDINATOR, 1, key="loading", key_type=i16(0))
        assert (v1.error_code, v1.node_id) == (0, node.config.node_id)
        assert await commit(admit, "loading", 1) is KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        listed = await call(admit, PEER, 16, 4, states_filter=())
        assert listed.error_code == KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS.value
        joined = await call(
            admit,
            PEER,
            JOIN,
            5,
            group_id="",
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=30),
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        assert joined.error_code == KafkaErrorCode.INVALID_GROUP_ID.value
        released.set()

        async def loaded() -> None:
            while await commit(admit, "loading", 1) is not KafkaErrorCode.NONE:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(loaded(), 20)
        assert await fetched(admit, "loading") == [(KafkaErrorCode.NONE, 1)]
    finally:
        released.set()
        await node.shutdown()
