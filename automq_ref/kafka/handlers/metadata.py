"""Metadata and DescribeCluster: this node, its topics and their partitions.

One node leads every partition and is the whole cluster (and its controller). Metadata creates
an unknown topic (``num.partitions`` partitions) when ``auto.create.topics.enable`` is on and the
client allows it (v4+ asks; older versions always allow). Authorized operations, when asked,
are every operation (no authorizer: :mod:`automq_ref.kafka.acl_operations`).
"""

from __future__ import annotations

import uuid

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic
from automq_ref.kafka.acl_operations import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    AUTHORIZED_OPERATIONS_OMITTED,
    ZERO_UUID,
    DescribeClusterBroker,
    DescribeClusterResponse,
    MetadataBroker,
    MetadataPartition,
    MetadataResponse,
    MetadataTopic,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.kafka.topics import TopicError


async def handle_metadata(context: Context, request: Request) -> Reply:
    body = request.body
    version = request.api_version
    config = context.config
    registry = context.topics
    auto_create = config.auto_create_topics_enable and (
        version < 4 or body.allow_auto_topic_creation
    )
    topic_operations = (
        TOPIC_OPERATIONS
        if getattr(body, "include_topic_authorized_operations", False)
        else AUTHORIZED_OPERATIONS_OMITTED
    )
    results: list[MetadataTopic] = []
    if body.topics is None or (version == 0 and not body.topics):
        wanted = [(name, None) for name in sorted(registry.topics)]
    else:
        wanted = [(t.name, getattr(t, "topic_id", None)) for t in body.topics]
    for name, topic_id in wanted:
        topic: Topic | None = None
        if name is None and topic_id is not None:
            topic = registry.topic_by_id(topic_id)
        elif name is not None:
            topic = registry.topics.get(name)
            if topic is None and auto_create:
                try:
                    topic = await registry.create_topic(name, config.num_partitions, {})
                except TopicError as error:
                    if error.code is not KafkaErrorCode.TOPIC_ALREADY_EXISTS:
                        results.append(_error(name, error.code, None, topic_operations))
                        continue
                    topic = registry.topics.get(name)
        if topic is None:
            code = (
                KafkaErrorCode.UNKNOWN_TOPIC_ID
                if name is None
                else KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
            results.append(_error(name, code, topic_id, topic_operations))
            continue
        results.append(_topic(context, topic, topic_operations))
    broker = MetadataBroker(config.node_id, context.advertised_host, context.advertised_port)
    return respond(
        request,
        MetadataResponse(
            brokers=[broker],
            cluster_id=config.cluster_id,
            controller_id=config.node_id,
            topics=results,
            # Only v8-v10 have the cluster's operations (later versions: DescribeCluster).
            cluster_authorized_operations=(
                CLUSTER_OPERATIONS
                if getattr(body, "include_cluster_authorized_operations", False)
                else AUTHORIZED_OPERATIONS_OMITTED
            ),
        ),
    )


def _error(
    name: str | None, code: KafkaErrorCode, topic_id: uuid.UUID | None, operations: int
) -> MetadataTopic:
    return MetadataTopic(
        name=name,
        topic_id=topic_id or ZERO_UUID,
        error_code=code,
        topic_authorized_operations=operations,
    )


def _topic(context: Context, topic: Topic, operations: int) -> MetadataTopic:
    node = context.config.node_id
    partitions = context.topics.partitions
    return MetadataTopic(
        name=topic.name,
        topic_id=topic.topic_id,
        partitions=[
            MetadataPartition(
                partition_index=index,
                leader_id=node,
                leader_epoch=_leader_epoch(partitions.get((topic.name, index))),
                replica_nodes=[node],
                isr_nodes=[node],
            )
            for index in range(topic.partitions)
        ],
        topic_authorized_operations=operations,
    )


def _leader_epoch(held: Partition | None) -> int:
    """The partition's epoch if this broker holds it open, else -1 (unknown): in a cluster a
    topic's partitions may be open on another broker (until Metadata answers from placement)."""
    return -1 if held is None else held.epoch


async def handle_describe_cluster(context: Context, request: Request) -> Reply:
    config = context.config
    broker = DescribeClusterBroker(
        broker_id=config.node_id, host=context.advertised_host, port=context.advertised_port
    )
    return respond(
        request,
        DescribeClusterResponse(
            cluster_id=config.cluster_id,
            controller_id=config.node_id,
            brokers=[broker],
            cluster_authorized_operations=(
                CLUSTER_OPERATIONS
                if request.body.include_cluster_authorized_operations
                else AUTHORIZED_OPERATIONS_OMITTED
            ),
        ),
    )
