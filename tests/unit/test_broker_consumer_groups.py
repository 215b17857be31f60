"""The KIP-848 handlers in process (``kafka/handlers/consumer_groups.py``): ConsumerGroupHeartbeat
and ConsumerGroupDescribe through the node's front end, with the topics named by id on the wire.

Two members share a topic: the first joins and is told every partition by the topic's id; the
second joins and is told nothing until the first has given up what its new target lacks; owned
partitions of a topic id the broker does not know are left out rather than refused; a v0 member
without an id is given one, a v1 member without one is ``INVALID_REQUEST``; the interval answered
is ``group.consumer.heartbeat.interval.ms``; ConsumerGroupDescribe names each member's
partitions by id and name, an empty id is ``INVALID_GROUP_ID`` and a classic group
``GROUP_ID_NOT_FOUND``; an OffsetCommit with another epoch than the member's is
``STALE_MEMBER_EPOCH``.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.consumer_group_heartbeat.v1.request import TopicPartitions
from kio.schema.join_group.v5.request import JoinGroupRequestProtocol
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode as E
from automq_ref.kafka.server import Peer
from automq_ref.node import start_node
from tests.unit.test_broker_node import call, create_topic

PEER = Peer(3, "10.0.0.7:40000")
HEARTBEAT = 68
DESCRIBE = 69
TOPIC = "cg-topic"
INTERVAL_MS = 250


@pytest.fixture
async def admit(tmp_path: Path) -> AsyncIterator[Any]:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            "listeners=PLAINTEXT://127.0.0.1:0",
            f"group.consumer.heartbeat.interval.ms={INTERVAL_MS}",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        await create_topic(node.front_end.admit, PEER, TOPIC, 4)
        yield node.front_end.admit
    finally:
        await node.shutdown()


async def topic_id(admit: Any, name: str) -> uuid.UUID:
    answer = await call(
        admit,
        PEER,
        3,  # Metadata
        12,
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(name)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    found: uuid.UUID | None = answer.topics[0].topic_id
    assert found is not None
    return found


async def heartbeat(
    admit: Any,
    member_id: str,
    epoch: int,
    owned: tuple[TopicPartitions, ...] | None,
    *,
    version: int = 1,
    group: str = "g",
    joining: bool = False,
) -> Any:
    return await call(
        admit,
        PEER,
        HEARTBEAT,
        version,
        group_id=group,
        member_id=member_id,
        member_epoch=i32(epoch),
        rebalance_timeout=datetime.timedelta(seconds=30 if joining else -0.001),
        subscribed_topic_names=(TopicName(TOPIC),) if joining else None,
        topic_partitions=owned,
    )


def told(answer: Any) -> dict[uuid.UUID | None, set[int]]:
    assert answer.assignment is not None
    return {
        tp.topic_id: {int(p) for p in tp.partitions} for tp in answer.assignment.topic_partitions
    }


def owning(topic: uuid.UUID, partitions: set[int]) -> tuple[TopicPartitions, ...]:
    return (TopicPartitions(topic_id=topic, partitions=tuple(i32(p) for p in sorted(partitions))),)


async def test_two_members_share_the_topic_by_id_one_after_the_other(admit: Any) -> None:
    tid = await topic_id(admit, TOPIC)
    first = await heartbeat(admit, "m1", 0, (), joining=True)
    assert first.error_code == E.NONE and first.member_id == "m1"
    assert int(first.member_epoch) == 1
    assert first.heartbeat_interval == datetime.timedelta(milliseconds=INTERVAL_MS)
    assert told(first) == {tid: {0, 1, 2, 3}}

    second = await heartbeat(admit, "m2", 0, (), joining=True)
    assert second.error_code == E.NONE and int(second.member_epoch) == 2
    assert told(second) == {}  # every partition is still the first member's

    # The first member is told what it keeps, and stays at its epoch until it owns only that;
    # meanwhile the rest is still its own.
    shrunk = await heartbeat(admit, "m1", 1, owning(tid, {0, 1, 2, 3}))
    kept = told(shrunk)[tid]
    assert len(kept) == 2 and int(shrunk.member_epoch) == 1
    still = await heartbeat(admit, "m2", 2, ())
    assert still.assignment is None or told(still) == {}

    released = await heartbeat(admit, "m1", 1, owning(tid, kept))
    assert released.error_code == E.NONE and int(released.member_epoch) == 2
    given = await heartbeat(admit, "m2", 2, ())
    assert told(given) == {tid: {0, 1, 2, 3} - kept}


async def test_owned_partitions_of_an_unknown_topic_id_are_left_out(admit: Any) -> None:
    tid = await topic_id(admit, TOPIC)
    await heartbeat(admit, "m1", 0, (), joining=True)
    stranger = uuid.uuid4()
    answer = await heartbeat(
        admit, "m1", 1, owning(tid, {0, 1, 2, 3}) + owning(stranger, {0}), joining=True
    )
    assert answer.error_code == E.NONE and int(answer.member_epoch) == 1
    assert told(answer) == {tid: {0, 1, 2, 3}}


async def test_member_ids_are_drawn_for_v0_and_required_from_v1(admit: Any) -> None:
    drawn = await heartbeat(admit, "", 0, (), version=0, joining=True)
    assert drawn.error_code == E.NONE
    assert uuid.UUID(drawn.member_id)  # a UUID the broker drew
    refused = await heartbeat(admit, "", 0, (), version=1, group="other", joining=True)
    assert refused.error_code == E.INVALID_REQUEST and refused.error_message


async def test_describe_names_partitions_by_id_and_name(admit: Any) -> None:
    tid = await topic_id(admit, TOPIC)
    await heartbeat(admit, "m1", 0, (), joining=True)
    await call(
        admit,
        PEER,
        11,  # JoinGroup: a classic group beside it
        5,
        group_id="classic",
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
    )
    described = await call(
        admit,
        PEER,
        DESCRIBE,
        0,
        group_ids=("g", "", "classic"),
        include_authorized_operations=False,
    )
    group, empty, classic = described.groups
    assert group.error_code == E.NONE and group.group_state == "Stable"
    assert int(group.group_epoch) == 1 and int(group.assignment_epoch) == 1
    (member,) = group.members
    assert (member.member_id, member.client_host) == ("m1", "/10.0.0.7")
    assert member.subscribed_topic_names == (TOPIC,)
    for assignment in (member.assignment, member.target_assignment):
        (partitions,) = assignment.topic_partitions
        assert (partitions.topic_id, partitions.topic_name) == (tid, TOPIC)
        assert sorted(partitions.partitions) == [0, 1, 2, 3]
    assert empty.error_code == E.INVALID_GROUP_ID
    assert classic.error_code == E.GROUP_ID_NOT_FOUND


async def test_a_commit_with_another_epoch_is_stale(admit: Any) -> None:
    await heartbeat(admit, "m1", 0, (), joining=True)

    async def commit(epoch: int) -> E:
        answer = await call(
            admit,
            PEER,
            8,  # OffsetCommit
            9,
            group_id="g",
            generation_id_or_member_epoch=i32(epoch),
            member_id="m1",
            group_instance_id=None,
            topics=(
                OffsetCommitRequestTopic(
                    name=TopicName(TOPIC),
                    partitions=(
                        OffsetCommitRequestPartition(
                            partition_index=i32(0),
                            committed_offset=i64(5),
                            committed_leader_epoch=i32(-1),
                            committed_metadata="",
                        ),
                    ),
                ),
            ),
        )
        return E(answer.topics[0].partitions[0].error_code)

    assert await commit(0) == E.STALE_MEMBER_EPOCH
    assert await commit(1) == E.NONE
