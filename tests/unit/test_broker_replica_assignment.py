"""Manual replica assignments in process: CreateTopics and CreatePartitions accept assignments
that give each partition one replica, this node; what is really invalid is answered
INVALID_REPLICA_ASSIGNMENT with a message (an assignment next to counts other than -1:
INVALID_REQUEST)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_partitions.v3.request import (
    CreatePartitionsAssignment,
    CreatePartitionsTopic,
)
from kio.schema.create_topics.v5.request import CreatableReplicaAssignment, CreatableTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i16, i32

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.server import Peer
from automq_ref.kafka.topics import TopicError, check_replica_assignment
from automq_ref.node import start_node
from tests.unit.test_broker_node import call, node_config

PEER = Peer(1, "127.0.0.1:1")
CREATE_TOPICS, CREATE_PARTITIONS = 19, 37
INVALID = KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT


@pytest.mark.parametrize(
    ("assignments", "first", "message"),
    [
        ([(0, [0]), (0, [0])], 0, "more than once"),
        ([(0, [])], 0, "no replica"),
        ([(0, [0, 0])], 0, "broker 0 more than once"),
        ([(0, [7])], 0, "broker 7, which is not registered"),
        ([(0, [0]), (2, [0])], 0, "not the consecutive"),
        ([(1, [0])], 0, "not the consecutive"),
        ([(3, [0])], 2, "not the consecutive"),
    ],
)
def test_invalid_assignments(
    assignments: list[tuple[int, list[int]]], first: int, message: str
) -> None:
    with pytest.raises(TopicError, match=message) as raised:
        check_replica_assignment(assignments, first, [0])
    assert raised.value.code is INVALID


def test_more_than_one_replica_is_refused_even_of_known_brokers() -> None:
    with pytest.raises(TopicError, match="exactly one replica") as raised:
        check_replica_assignment([(0, [0, 1])], 0, [0, 1])
    assert raised.value.code is INVALID


def test_valid_assignments() -> None:
    check_replica_assignment([(1, [0]), (0, [0])], 0, [0])
    check_replica_assignment([(2, [0])], 2, [0])


def creatable(name: str, partitions: int, factor: int, lists: list[list[int]]) -> CreatableTopic:
    return CreatableTopic(
        name=TopicName(name),
        num_partitions=i32(partitions),
        replication_factor=i16(factor),
        assignments=tuple(
            CreatableReplicaAssignment(
                partition_index=i32(index), broker_ids=tuple(BrokerId(b) for b in brokers)
            )
            for index, brokers in enumerate(lists)
        ),
        configs=(),
    )


async def create(admit: Any, *topics: CreatableTopic) -> list[Any]:
    response = await call(
        admit,
        PEER,
        CREATE_TOPICS,
        5,
        topics=topics,
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    return list(response.topics)


async def grow(admit: Any, name: str, count: int, lists: list[list[int]] | None) -> Any:
    response = await call(
        admit,
        PEER,
        CREATE_PARTITIONS,
        3,
        topics=(
            CreatePartitionsTopic(
                name=TopicName(name),
                count=i32(count),
                assignments=None
                if lists is None
                else tuple(
                    CreatePartitionsAssignment(broker_ids=tuple(BrokerId(b) for b in brokers))
                    for brokers in lists
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    (result,) = response.results
    return result


async def test_create_topics_and_partitions_with_assignments(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    admit = node.front_end.admit
    try:
        made, wrong_factor, wrong_count, unknown = await create(
            admit,
            creatable("assigned", -1, -1, [[0], [0]]),
            creatable("with-factor", -1, 1, [[0]]),
            creatable("with-count", 1, -1, [[0]]),
            creatable("elsewhere", -1, -1, [[0], [3]]),
        )
        assert made.error_code == 0 and made.num_partitions == 2
        assert made.replication_factor == 1
        assert node.context.topics.topics["assigned"].partitions == 2
        for refused, field in (
            (wrong_factor, "replication factor 1"),
            (wrong_count, "num_partitions 1"),
        ):
            assert refused.error_code == KafkaErrorCode.INVALID_REQUEST
            assert field in refused.error_message
        assert unknown.error_code == INVALID and "broker 3" in unknown.error_message
        assert "elsewhere" not in node.context.topics.topics

        assert (await grow(admit, "assigned", 4, [[0], [0]])).error_code == 0
        assert node.context.topics.topics["assigned"].partitions == 4
        too_few = await grow(admit, "assigned", 6, [[0]])
        assert too_few.error_code == INVALID and "2 partitions are added" in too_few.error_message
        two = await grow(admit, "assigned", 5, [[0, 1]])
        assert two.error_code == INVALID and two.error_message
        assert (await grow(admit, "assigned", 5, None)).error_code == 0
        assert node.context.topics.topics["assigned"].partitions == 5
    finally:
        await node.shutdown()
