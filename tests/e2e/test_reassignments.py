"""Partition reassignments and leader elections with real clients: kafka-python's
``alter_partition_reassignments``, ``list_partition_reassignments`` and ``elect_leaders``, and
confluent-kafka's ``elect_leaders`` (it has no reassignment calls; kcat has none of these),
against a node in this process listening on a free port.

A second broker is registered on the node's controller by hand, the topic is written to the
controller directly (no broker opens its partitions on its own), and a move in flight is shown
by holding a partition's stream open on the second broker, as
``tests/unit/test_broker_reassignments.py`` does; the clients run in threads (they block)
while the node serves on the event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from confluent_kafka import ElectionType, KafkaError
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import (
    InvalidReplicationAssignmentError,
    ReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

from automq_ref.config import load_config
from automq_ref.node import start_node
from tests.unit.test_broker_reassignments import (
    assignment,
    controller_topic,
    hold_open,
    join_broker,
)

TOPIC = "client-moves"
ELECTION_NOT_NEEDED = 84


async def test_kafka_python_and_confluent_kafka(tmp_path: Path) -> None:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "listeners=PLAINTEXT://127.0.0.1:0",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        host, port = await node.listen()
        bootstrap = f"{host}:{port}"
        me = config.node_id
        other_epoch = await join_broker(node, 2)
        await controller_topic(node, TOPIC, 2)
        leaders = [assignment(node, TOPIC, i).leader for i in range(2)]
        assert sorted(leaders) == [me, 2]
        mine, theirs = leaders.index(me), leaders.index(2)

        # Broker 2 holds its partition's stream open: moving that one here is a move in flight.
        await hold_open(node, 2, other_epoch, TOPIC, theirs)

        def kafka_python() -> tuple[Any, Any, Any]:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                moved = admin.alter_partition_reassignments(
                    {TopicPartition(TOPIC, theirs): [me], TopicPartition(TOPIC, 7): [2]}
                )
                refused = admin.alter_partition_reassignments(
                    {TopicPartition(TOPIC, mine): [me, 2], TopicPartition(TOPIC, theirs): None}
                )
                listing = admin.list_partition_reassignments()
                return moved, refused, listing
            finally:
                admin.close()

        moved, refused, listing = await asyncio.to_thread(kafka_python)
        assert moved == {
            TopicPartition(TOPIC, theirs): None,
            TopicPartition(TOPIC, 7): UnknownTopicOrPartitionError,
        }
        # Two brokers for one partition; a cancel while broker 2 still holds the partition.
        assert refused == {
            TopicPartition(TOPIC, mine): InvalidReplicationAssignmentError,
            TopicPartition(TOPIC, theirs): ReassignmentInProgressError,
        }
        assert assignment(node, TOPIC, mine).leader == me
        assert assignment(node, TOPIC, theirs).leader == me
        # Broker 2 still holds the stream of the partition moved away from it.
        assert listing == {
            TopicPartition(TOPIC, theirs): {
                "replicas": [me, 2],
                "adding_replicas": [me],
                "removing_replicas": [2],
            }
        }

        def elections() -> tuple[Any, Any, Any]:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                kafka_python = admin.elect_leaders(0, {TOPIC: [0, 1]}, raise_errors=False)
            finally:
                admin.close()
            confluent = AdminClient({"bootstrap.servers": bootstrap})
            partitions = [CkTopicPartition(TOPIC, 0), CkTopicPartition(TOPIC, 1)]
            named = confluent.elect_leaders(ElectionType.PREFERRED, partitions).result(30)
            every = confluent.elect_leaders(ElectionType.UNCLEAN, None).result(30)
            return kafka_python, named, every

        kp_elected, ck_elected, ck_every = await asyncio.to_thread(elections)
        assert [
            (result.topic, p.partition_id, p.error_code)
            for result in kp_elected.replica_election_results
            for p in result.partition_result
        ] == [(TOPIC, 0, ELECTION_NOT_NEEDED), (TOPIC, 1, ELECTION_NOT_NEEDED)]
        assert sorted(tp.partition for tp in ck_elected) == [0, 1]
        for error in ck_elected.values():
            assert error is not None and error.code() == KafkaError.ELECTION_NOT_NEEDED
        # Every partition asked for: those that need no election are left out, as Kafka does.
        assert ck_every == {}
    finally:
        await node.shutdown()
