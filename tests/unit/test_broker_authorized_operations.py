"""Authorized operations (KIP-430) in process: asked for, Metadata, DescribeCluster and
DescribeGroups answer every operation the resource type supports (this broker has no
authorizer); not asked for, Kafka's "omitted" value."""

from __future__ import annotations

from pathlib import Path

from kio.schema.metadata.v8.request import MetadataRequestTopic
from kio.schema.metadata.v12.request import MetadataRequestTopic as TopicV12
from kio.schema.types import TopicName

from automq_ref.kafka.acl_operations import (
    CLUSTER_OPERATIONS,
    GROUP_OPERATIONS,
    TOPIC_OPERATIONS,
    AclOperation,
    bit_field,
)
from automq_ref.kafka.responses import AUTHORIZED_OPERATIONS_OMITTED
from automq_ref.kafka.server import Peer
from automq_ref.node import start_node
from tests.unit.test_broker_node import call, node_config

PEER = Peer(1, "127.0.0.1:1")
METADATA, DESCRIBE_GROUPS, DESCRIBE_CLUSTER = 3, 15, 60


def operations(field: int) -> set[str]:
    return {op.name for op in AclOperation if field & (1 << op.value)}


def test_the_sets_are_the_protocols() -> None:
    assert operations(TOPIC_OPERATIONS) == {
        "READ",
        "WRITE",
        "CREATE",
        "DELETE",
        "ALTER",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }
    assert bin(TOPIC_OPERATIONS).count("1") == 8
    assert operations(CLUSTER_OPERATIONS) == {
        "CREATE",
        "ALTER",
        "DESCRIBE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
    }
    assert operations(GROUP_OPERATIONS) == {
        "READ",
        "DELETE",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }  # Kafka 4.0's five
    assert bit_field([AclOperation.READ, AclOperation.DESCRIBE]) == (1 << 3) | (1 << 8)


async def test_answered_when_asked_omitted_otherwise(tmp_path: Path) -> None:
    node = await start_node(node_config(tmp_path))
    admit = node.front_end.admit
    try:
        for asked in (True, False):
            topic_ops = TOPIC_OPERATIONS if asked else AUTHORIZED_OPERATIONS_OMITTED
            cluster_ops = CLUSTER_OPERATIONS if asked else AUTHORIZED_OPERATIONS_OMITTED
            metadata = await call(
                admit,
                PEER,
                METADATA,
                8,
                topics=(MetadataRequestTopic(name=TopicName("auth-ops")),),
                allow_auto_topic_creation=True,
                include_cluster_authorized_operations=asked,
                include_topic_authorized_operations=asked,
            )
            (topic,) = metadata.topics
            assert topic.error_code == 0 and topic.topic_authorized_operations == topic_ops
            assert metadata.cluster_authorized_operations == cluster_ops
            cluster = await call(
                admit, PEER, DESCRIBE_CLUSTER, 0, include_cluster_authorized_operations=asked
            )
            assert cluster.cluster_authorized_operations == cluster_ops
            groups = await call(
                admit,
                PEER,
                DESCRIBE_GROUPS,
                5,
                groups=("no-such-group",),
                include_authorized_operations=asked,
            )
            (group,) = groups.groups
            assert group.authorized_operations == (
                GROUP_OPERATIONS if asked else AUTHORIZED_OPERATIONS_OMITTED
            )
        # Metadata v12 asks for the topic's operations only (the cluster's went to DescribeCluster).
        metadata = await call(
            admit,
            PEER,
            METADATA,
            12,
            topics=(TopicV12(topic_id=None, name=TopicName("missing-auth-ops")),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=True,
        )
        (topic,) = metadata.topics
        assert topic.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        assert topic.topic_authorized_operations == TOPIC_OPERATIONS
    finally:
        await node.shutdown()
