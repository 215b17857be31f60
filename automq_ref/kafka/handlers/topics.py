"""CreateTopics, DeleteTopics and CreatePartitions: the topic admin APIs, each topic answered on
its own (one topic's error does not fail the others).

Replication is shared storage's: a topic has one copy, so a replication factor other than 1 (or
-1, the default) is refused, and a manual replica assignment must give each partition exactly one
replica, a live broker (:func:`automq_ref.kafka.topics.check_replica_assignment`), where the
controller then places it.

``__consumer_offsets`` may be created like any topic (it exists once a broker has started:
``TOPIC_ALREADY_EXISTS``), but not deleted nor grown: its partitions are the groups'
coordinators, and a group's partition is its id's hash modulo their count, so either would lose
every group's offsets. Both are answered ``INVALID_REQUEST`` in the words of Kafka's topic tool,
which refuses both (Kafka's broker leaves them to authorization).

With an authorizer, as Kafka's ``KafkaApis``: a topic is created with CREATE on the cluster or
on the topic, its configs answered with DESCRIBE_CONFIGS on it (else none, and
``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED); deleted with DESCRIBE and DELETE on it;
grown with ALTER on it; the others are TOPIC_AUTHORIZATION_FAILED (before any other check).

The changes themselves, and their ordering against the controller's KV, are the registry's
(:mod:`automq_ref.kafka.topic_registry`).
"""

from __future__ import annotations

import uuid
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    cluster_allowed,
    denied,
)
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.responses import (
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    ZERO_UUID,
    CreatableTopicConfig,
    CreatableTopicResult,
    CreatePartitionsResponse,
    CreatePartitionsTopicResult,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsResponse,
    respond,
)
from automq_ref.kafka.server import Reply
from automq_ref.kafka.topic_configs import TOPIC_CONFIGS
from automq_ref.kafka.topics import TopicError, check_replica_assignment
from automq_ref.vocabulary.naming import is_internal_topic

TOPIC = ResourceType.TOPIC
AUTHORIZATION_FAILED = "Authorization failed."


def _refused(hidden: frozenset[str], name: str | None) -> None:
    """TOPIC_AUTHORIZATION_FAILED for a topic the principal may not act on."""
    if name in hidden:
        raise TopicError(KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED)


async def handle_create_topics(context: Context, request: Request) -> Reply:
    body = request.body
    results = []
    names = [creatable.name for creatable in body.topics]
    hidden = frozenset[str]()
    if not cluster_allowed(context, request, AclOperation.CREATE):
        hidden = denied(context, request, AclOperation.CREATE, TOPIC, names)
    unconfigured = denied(context, request, AclOperation.DESCRIBE_CONFIGS, TOPIC, names)
    for creatable in body.topics:
        try:
            _refused(hidden, creatable.name)
            topic = await _create(context, creatable, bool(body.validate_only))
        except TopicError as error:
            results.append(
                CreatableTopicResult(
                    creatable.name, error_code=error.code, error_message=str(error)
                )
            )
            continue
        configured = creatable.name not in unconfigured
        results.append(
            CreatableTopicResult(
                creatable.name,
                topic_id=topic.topic_id,
                topic_config_error_code=(
                    0 if configured else KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED.value
                ),
                num_partitions=topic.partitions,
                replication_factor=1,
                configs=[_config(context, topic, name) for name in TOPIC_CONFIGS]
                if configured
                else [],
            )
        )
    return respond(request, CreateTopicsResponse(results))


def _config(context: Context, topic: Topic, name: str) -> CreatableTopicConfig:
    source = CONFIG_SOURCE_DYNAMIC_TOPIC if name in topic.configs else CONFIG_SOURCE_DEFAULT
    return CreatableTopicConfig(name, context.topics.topic_config(topic, name), source)


async def _create(context: Context, creatable: Any, validate_only: bool) -> Topic:
    replication = int(creatable.replication_factor)
    count = int(creatable.num_partitions)
    brokers: list[int] = []
    if creatable.assignments:
        # The assignment says both counts, so the request must leave them to it (-1).
        for field, value in (("replication factor", replication), ("num_partitions", count)):
            if value != -1:
                raise TopicError(
                    KafkaErrorCode.INVALID_REQUEST,
                    f"a manual replica assignment was given with {field} {value} (use -1)",
                )
        given = [(int(a.partition_index), list(a.broker_ids)) for a in creatable.assignments]
        check_replica_assignment(given, 0, context.topics.live_brokers())
        count = len(given)
        # One replica each (checked), in partition order: the broker the controller places
        # each partition on.
        brokers = [replicas[0] for _, replicas in sorted(given)]
    elif replication not in (-1, 1):
        raise TopicError(
            KafkaErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication}: this broker keeps one copy in "
            "shared storage (use 1 or -1)",
        )
    count = context.config.num_partitions if count == -1 else count
    configs = {config.name: config.value for config in creatable.configs}
    return await context.topics.create_topic(
        creatable.name, count, configs, validate_only, assignments=brokers
    )


async def handle_delete_topics(context: Context, request: Request) -> Reply:
    body = request.body
    registry = context.topics
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if request.api_version >= 6:
        wanted = [(state.name, state.topic_id) for state in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    results = []
    resolved: list[tuple[str | None, uuid.UUID | None, str | None]] = []
    for name, topic_id in wanted:
        if name is None and topic_id is not None:
            found = registry.topic_by_id(topic_id)
            resolved.append((name, topic_id, found.name if found is not None else None))
        else:
            resolved.append((name, topic_id, name))
    names = [name for _, _, name in resolved]
    hidden = denied(context, request, AclOperation.DESCRIBE, TOPIC, names) | denied(
        context, request, AclOperation.DELETE, TOPIC, names
    )
    for name, topic_id, name_or_none in resolved:
        try:
            if name_or_none is None:
                raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_ID, f"no topic {topic_id}")
            _refused(hidden, name_or_none)
            if is_internal_topic(name_or_none):
                raise TopicError(
                    KafkaErrorCode.INVALID_REQUEST,
                    f"Topic {name_or_none} is a kafka internal topic and is not allowed to be "
                    "marked for deletion.",
                )
            topic = await registry.delete_topic(name_or_none)
        except TopicError as error:
            results.append(
                DeletableTopicResult(
                    name,
                    topic_id=topic_id or ZERO_UUID,
                    error_code=error.code,
                    error_message=str(error),
                )
            )
            continue
        results.append(DeletableTopicResult(name_or_none, topic_id=topic.topic_id))
    return respond(request, DeleteTopicsResponse(results))


async def handle_create_partitions(context: Context, request: Request) -> Reply:
    body = request.body
    results = []
    hidden = denied(context, request, AclOperation.ALTER, TOPIC, (t.name for t in body.topics))
    for asked in body.topics:
        try:
            _refused(hidden, asked.name)
            if is_internal_topic(asked.name):
                raise TopicError(
                    KafkaErrorCode.INVALID_REQUEST,
                    "The number of partitions for the offsets topic cannot be changed.",
                )
            assignments = asked.assignments
            await context.topics.add_partitions(
                asked.name,
                int(asked.count),
                assignments=(
                    None if assignments is None else [list(a.broker_ids) for a in assignments]
                ),
                validate_only=bool(body.validate_only),
            )
        except TopicError as error:
            results.append(
                CreatePartitionsTopicResult(
                    asked.name, error_code=error.code, error_message=str(error)
                )
            )
            continue
        results.append(CreatePartitionsTopicResult(asked.name))
    return respond(request, CreatePartitionsResponse(results))
