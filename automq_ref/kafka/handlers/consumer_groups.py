"""KIP-848's consumer group APIs: ConsumerGroupHeartbeat (v0-1, what clients on
``group.protocol=consumer`` join, heartbeat, reconcile and leave with) and
ConsumerGroupDescribe (v0-1).

A heartbeat becomes the Group machine's ``ConsumerGroupHeartbeat``
(:mod:`automq_ref.state_machines.group.consumer_heartbeat`: its checks, errors and
reconciliation), stamped with the injected clock's time, and goes to the shard of the group's
coordinator partition like any group request (``NOT_COORDINATOR`` /
``COORDINATOR_LOAD_IN_PROGRESS`` when this broker does not serve the group now). The wire names
topics by id and the machine by name: the owned partitions are read through the cluster's
topics as this broker knows them (an id it does not know is left out, as a topic deleted
meanwhile), the answer's assignment is written back with their ids; the heartbeat also carries
every topic's partition count, from which the machine reads the group's subscription metadata.
A v0 member that sends no member id gets one drawn here (a random UUID, as Kafka's coordinator
draws it); from v1 the client generates it (KIP-1082). The heartbeat interval answered is
``group.consumer.heartbeat.interval.ms``; a member not heard from for
``group.consumer.session.timeout.ms`` is fenced.

ConsumerGroupDescribe answers each KIP-848 group with its state, epochs, assignor and members
(each with its assignment and target, topics named by id and name); a classic or unknown group
is ``GROUP_ID_NOT_FOUND`` (Kafka's admin client then describes it with DescribeGroups), an empty
id ``INVALID_GROUP_ID``, a group coordinated elsewhere ``NOT_COORDINATOR``.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable, Mapping

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka import responses as r
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    allowed,
    denied,
    operations,
)
from automq_ref.kafka.handlers.groups import client_host
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Chunks, Reply
from automq_ref.state_machines import group as gc

_MS = datetime.timedelta(milliseconds=1)


def _by_topic(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        by_topic.setdefault(topic, []).append(index)
    return by_topic


def _assignment(
    partitions: Iterable[tuple[str, int]], ids: Mapping[str, uuid.UUID]
) -> r.ConsumerGroupAssignment:
    return r.ConsumerGroupAssignment(
        [
            r.ConsumerGroupTopicPartitions(ids.get(t, r.ZERO_UUID), p)
            for t, p in _by_topic(partitions).items()
        ]
    )


def _described(
    partitions: Iterable[tuple[str, int]], ids: Mapping[str, uuid.UUID]
) -> r.ConsumerGroupDescribeAssignment:
    return r.ConsumerGroupDescribeAssignment(
        [
            r.ConsumerGroupDescribeTopicPartitions(ids.get(t, r.ZERO_UUID), t, p)
            for t, p in _by_topic(partitions).items()
        ]
    )


async def handle_consumer_group_heartbeat(context: Context, request: Request) -> Reply:
    body = request.body
    version = request.api_version
    topics = context.topics.topics
    counts = {name: topic.partitions for name, topic in topics.items()}
    ids = {name: topic.topic_id for name, topic in topics.items()}
    names = {topic_id: name for name, topic_id in ids.items()}
    owned = (
        None
        if body.topic_partitions is None
        else tuple(
            (names[tp.topic_id], int(p))
            for tp in body.topic_partitions
            if tp.topic_id in names
            for p in tp.partitions
        )
    )
    subscribed = body.subscribed_topic_names
    generated = str(uuid.uuid4()) if version == 0 and not body.member_id else ""
    host = client_host(request.peer)
    clock = context.clock

    def event(request_id: int, _now: int) -> gc.GroupEvent:
        return gc.ConsumerGroupHeartbeat(
            request_id,
            clock.now_ms(),
            body.group_id,
            body.member_id,
            int(body.member_epoch),
            instance_id=body.instance_id,
            rack_id=body.rack_id,
            rebalance_timeout_ms=round(body.rebalance_timeout / _MS),
            subscribed_topic_names=None if subscribed is None else tuple(subscribed),
            subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
            server_assignor=body.server_assignor,
            owned=owned,
            client_id=request.client_id or "",
            client_host=host,
            topics=counts,
            api_version=version,
            generated_member_id=generated,
        )

    refusal = _heartbeat_refusal(context, request)

    async def answer() -> Chunks:
        response = refusal or await context.groups.request(
            body.group_id, event, lambda error: gc.ConsumerGroupHeartbeatResponse(error)
        )
        assert isinstance(response, gc.ConsumerGroupHeartbeatResponse)
        assignment = response.assignment
        return r.respond(
            request,
            r.ConsumerGroupHeartbeatResponse(
                error_code=response.error_code,
                error_message=response.error_message,
                member_id=response.member_id,
                member_epoch=response.member_epoch,
                heartbeat_interval=response.heartbeat_interval_ms,
                assignment=None if assignment is None else _assignment(assignment, ids),
            ),
        )

    return answer()


def _heartbeat_refusal(
    context: Context, request: Request
) -> gc.ConsumerGroupHeartbeatResponse | None:
    """Kafka's checks before a heartbeat: READ on the group, DESCRIBE on every topic the
    member subscribes to by name."""
    body = request.body
    if not allowed(context, request, AclOperation.READ, ResourceType.GROUP, body.group_id):
        return gc.ConsumerGroupHeartbeatResponse(KafkaErrorCode.GROUP_AUTHORIZATION_FAILED)
    names = body.subscribed_topic_names or ()
    hidden = denied(context, request, AclOperation.DESCRIBE, ResourceType.TOPIC, names)
    if hidden:
        return gc.ConsumerGroupHeartbeatResponse(
            KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED,
            f"Unauthorized topics: {', '.join(sorted(hidden))}",
        )
    return None


async def handle_consumer_group_describe(context: Context, request: Request) -> Reply:
    """Each group as its shard describes it (see the module docstring): those the principal
    may DESCRIBE, the others GROUP_AUTHORIZATION_FAILED."""
    asked = tuple(request.body.group_ids)
    hidden = denied(context, request, AclOperation.DESCRIBE, ResourceType.GROUP, asked)
    include = bool(getattr(request.body, "include_authorized_operations", False))
    group_ids = tuple(g for g in asked if g not in hidden)
    named = tuple(g for g in group_ids if g)
    described = {
        g.group_id: g for g in (await context.groups.consumer_group_describe(named)).groups
    }
    ids = {name: topic.topic_id for name, topic in context.topics.topics.items()}
    groups = []
    for group_id in asked:
        if group_id in hidden:
            denial = KafkaErrorCode.GROUP_AUTHORIZATION_FAILED
            groups.append(r.ConsumerGroupDescribeGroup(group_id, denial))
            continue
        if not group_id:
            # Kafka sets a null id, which the schema does not allow: the id sent ("").
            groups.append(r.ConsumerGroupDescribeGroup("", KafkaErrorCode.INVALID_GROUP_ID))
            continue
        g = described[group_id]
        groups.append(
            r.ConsumerGroupDescribeGroup(
                group_id,
                g.error_code,
                g.error_message,
                g.group_state,
                g.group_epoch,
                g.assignment_epoch,
                g.assignor_name,
                [
                    r.ConsumerGroupDescribeMember(
                        m.member_id,
                        m.instance_id,
                        m.rack_id,
                        m.member_epoch,
                        m.client_id,
                        m.client_host,
                        list(m.subscribed_topic_names),
                        _described(m.assignment, ids),
                        _described(m.target_assignment, ids),
                    )
                    for m in g.members
                ],
                authorized_operations=(
                    operations(context, request, ResourceType.GROUP, group_id)
                    if include
                    else r.AUTHORIZED_OPERATIONS_OMITTED
                ),
            )
        )
    return r.respond(request, r.ConsumerGroupDescribeResponse(groups))
