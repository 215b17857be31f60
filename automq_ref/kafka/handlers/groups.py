"""The classic consumer-group APIs (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete) and FindCoordinator; KIP-848's
ConsumerGroupHeartbeat and ConsumerGroupDescribe are in :mod:`.consumer_groups`.

Each group request is translated into an event of the Group machine
(:mod:`automq_ref.state_machines.group`), stamped with the injected clock's time, and handed to
the coordinator (:mod:`automq_ref.kafka.groups`), which routes it to the shard of the group's
coordinator partition; its response is translated back into the request's version. A group this
broker does not coordinate now is answered ``NOT_COORDINATOR`` (``COORDINATOR_LOAD_IN_PROGRESS``
while its shard loads) in the request's own shape, and the client asks FindCoordinator again.
Requests the machine may answer later (a JoinGroup waits for the rebalance, a commit for
durability) are answered in the awaitable returned, so that they do not hold up the
connection's later requests.

OffsetCommit and OffsetFetch serve KIP-848 groups too: a consumer-protocol member commits with
v9+ naming its member epoch as the generation, and OffsetFetch v9 names the member and its
epoch (the machine answers ``STALE_MEMBER_EPOCH`` for another epoch). ListGroups reports each
group's type (``classic`` or ``consumer``, v5); DescribeGroups answers a KIP-848 group
``GROUP_ID_NOT_FOUND`` (v6; Dead before), as Kafka does for a group that is not classic.

FindCoordinator answers, for each group, the broker placement assigns its coordinator partition,
at the listener that broker registered (this broker: what it advertises);
``COORDINATOR_NOT_AVAILABLE`` while the partition has no live broker, or while
``__consumer_offsets`` does not exist yet (the first group request creates it and waits for it,
:meth:`~automq_ref.kafka.groups.GroupCoordinator.topic_created`). For a transactional id (key
type 1) it answers the same way of the id's ``__transaction_state`` partition
(:mod:`automq_ref.kafka.transactions`); another key type is ``INVALID_REQUEST``.

With an authorizer (:mod:`.authorize`), Kafka's checks: a member's requests (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit) need READ on the group, OffsetCommit and
TxnOffsetCommit READ on each topic too (TxnOffsetCommit first WRITE on its transactional id);
OffsetFetch DESCRIBE on the group and on each topic (left out of an all-topics answer);
DescribeGroups DESCRIBE, DeleteGroups DELETE on each group; ListGroups lists the groups the
principal may DESCRIBE unless it may DESCRIBE the cluster; OffsetDelete DELETE on the group and
READ on each topic; FindCoordinator DESCRIBE on the group or transactional id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka import responses as r
from automq_ref.kafka.handlers.authorize import (
    REFUSAL,
    AclOperation,
    ResourceType,
    allowed,
    cluster_allowed,
    denied,
    operations,
)
from automq_ref.kafka.handlers.transactions import PRODUCE_MAX_VERSION, verify_produce
from automq_ref.kafka.listeners import endpoint_of
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Chunks, Peer, Reply
from automq_ref.state_machines import group as gc

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
GROUP = ResourceType.GROUP
TOPIC = ResourceType.TOPIC
TXN_ID = ResourceType.TRANSACTIONAL_ID
GROUP_DENIED = KafkaErrorCode.GROUP_AUTHORIZATION_FAILED
TOPIC_DENIED = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
TXN_DENIED = KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def _group(
    context: Context,
    request: Request,
    group_id: str,
    make_event: Callable[[int, int], gc.GroupEvent],
    refused: Callable[[KafkaErrorCode], gc.Response],
) -> gc.Response:
    """Step ``make_event(request_id, now_ms)`` in ``group_id``'s shard and await the machine's
    answer; ``refused(error)`` when this broker does not serve the group now, or
    GROUP_AUTHORIZATION_FAILED when the principal may not READ the group (a member's
    requests, Kafka's rule)."""
    if not allowed(context, request, AclOperation.READ, GROUP, group_id):
        return refused(GROUP_DENIED)
    clock = context.clock
    return await context.groups.request(
        group_id, lambda request_id, _: make_event(request_id, clock.now_ms()), refused
    )


def client_host(peer: Peer) -> str:
    """The member's host as Kafka reports it (``InetAddress.toString()``: ``/127.0.0.1``)."""
    return "/" + peer.host


async def handle_find_coordinator(context: Context, request: Request) -> Reply:
    body = request.body
    key_type = int(body.key_type) if request.api_version >= 1 else GROUP_KEY_TYPE

    async def answer() -> Chunks:
        if request.api_version >= 4:
            coordinators = []
            for key in body.coordinator_keys:
                node_id, host, port, error = await _coordinator(context, request, key, key_type)
                coordinators.append(r.Coordinator(key, node_id, host, port, error))
            return r.respond(request, r.FindCoordinatorResponse(coordinators=coordinators))
        node_id, host, port, error = await _coordinator(context, request, body.key, key_type)
        return r.respond(
            request,
            r.FindCoordinatorResponse(node_id=node_id, host=host, port=port, error_code=error),
        )

    # Answered in the awaitable: the first one may wait for __consumer_offsets to be created.
    return answer()


async def _coordinator(
    context: Context, request: Request, key: str, key_type: int
) -> tuple[int, str, int, KafkaErrorCode]:
    """(node id, host, port, error) of the coordinator of ``key`` (a group id, key type 0; a
    transactional id, key type 1) as FindCoordinator answers, its endpoint of the request's
    listener; the principal needs DESCRIBE on the group or transactional id."""
    if key_type in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        kind = GROUP if key_type == GROUP_KEY_TYPE else TXN_ID
        if not allowed(context, request, AclOperation.DESCRIBE, kind, key):
            return -1, "", -1, REFUSAL[kind]
    if key_type == GROUP_KEY_TYPE:
        found = await context.groups.coordinator(key)
    elif key_type == TRANSACTION_KEY_TYPE and context.transactions is not None:
        found = await context.transactions.coordinator(key)
    else:
        return -1, "", -1, KafkaErrorCode.INVALID_REQUEST
    listener = request.peer.listener
    if isinstance(found, KafkaErrorCode):
        return -1, "", -1, found
    if found == context.config.node_id:
        here = context.advertised_for(listener)
        if here is None:
            return -1, "", -1, KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
        return found, *here, KafkaErrorCode.NONE
    broker = context.view.image.brokers.get(found)
    endpoint = None if broker is None or not broker.live else endpoint_of(broker, listener)
    if endpoint is None:
        return -1, "", -1, KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
    return found, endpoint.host, endpoint.port, KafkaErrorCode.NONE


async def handle_join_group(context: Context, request: Request) -> Reply:
    body = request.body
    version = request.api_version
    session_ms = int(body.session_timeout.total_seconds() * 1000)
    rebalance_ms = (
        int(body.rebalance_timeout.total_seconds() * 1000) if version >= 1 else session_ms
    )
    protocols = tuple(gc.Protocol(p.name, bytes(p.metadata)) for p in body.protocols)
    host = client_host(request.peer)

    async def answer() -> Chunks:
        response = await _group(
            context,
            request,
            body.group_id,
            lambda request_id, now: gc.JoinGroup(
                request_id,
                now,
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                request.client_id or "",
                host,
                session_ms,
                rebalance_ms,
                body.protocol_type,
                protocols,
                version >= 4,
            ),
            _valid_group(body.group_id, gc.JoinGroupResponse),
        )
        assert isinstance(response, gc.JoinGroupResponse)
        return r.respond(
            request,
            r.JoinGroupResponse(
                error_code=response.error_code,
                generation_id=response.generation_id,
                protocol_type=response.protocol_type,
                protocol_name=response.protocol_name or ("" if version < 7 else None),
                leader=response.leader,
                member_id=response.member_id,
                members=[
                    r.JoinGroupMember(m.member_id, m.group_instance_id, m.metadata)
                    for m in response.members
                ],
            ),
        )

    return answer()


async def handle_sync_group(context: Context, request: Request) -> Reply:
    body = request.body
    assignments = tuple(
        gc.MemberAssignment(a.member_id, bytes(a.assignment)) for a in body.assignments
    )

    async def answer() -> Chunks:
        response = await _group(
            context,
            request,
            body.group_id,
            lambda request_id, now: gc.SyncGroup(
                request_id,
                now,
                body.group_id,
                int(body.generation_id),
                body.member_id,
                getattr(body, "group_instance_id", None),
                assignments,
                getattr(body, "protocol_type", None),
                getattr(body, "protocol_name", None),
            ),
            _valid_group(body.group_id, gc.SyncGroupResponse),
        )
        assert isinstance(response, gc.SyncGroupResponse)
        return r.respond(
            request,
            r.SyncGroupResponse(
                response.error_code,
                response.protocol_type,
                response.protocol_name,
                response.assignment,
            ),
        )

    return answer()


async def handle_heartbeat(context: Context, request: Request) -> Reply:
    body = request.body
    response = await _group(
        context,
        request,
        body.group_id,
        lambda request_id, now: gc.Heartbeat(
            request_id,
            now,
            body.group_id,
            int(body.generation_id),
            body.member_id,
            getattr(body, "group_instance_id", None),
        ),
        _valid_group(body.group_id, gc.HeartbeatResponse),
    )
    assert isinstance(response, gc.HeartbeatResponse)
    return r.respond(request, r.HeartbeatResponse(response.error_code))


async def handle_leave_group(context: Context, request: Request) -> Reply:
    body = request.body
    if request.api_version >= 3:
        members = tuple(gc.LeavingMember(m.member_id, m.group_instance_id) for m in body.members)
    else:
        members = (gc.LeavingMember(body.member_id),)
    response = await _group(
        context,
        request,
        body.group_id,
        lambda request_id, now: gc.LeaveGroup(request_id, now, body.group_id, members),
        _valid_group(body.group_id, gc.LeaveGroupResponse),
    )
    assert isinstance(response, gc.LeaveGroupResponse)
    error = response.error_code
    if request.api_version < 3 and error is KafkaErrorCode.NONE and response.members:
        error = response.members[0].error_code
    return r.respond(
        request,
        r.LeaveGroupResponse(
            error,
            [
                r.LeaveGroupMember(m.member_id, m.group_instance_id, m.error_code)
                for m in response.members
            ],
        ),
    )


def _every(topics: Any, error: KafkaErrorCode) -> list[tuple[str, int, KafkaErrorCode]]:
    return [(t.name, int(p.partition_index), error) for t in topics for p in t.partitions]


def _commit_entries(
    context: Context, request: Request, topics: Any, group_id: str
) -> tuple[list[gc.OffsetCommitEntry], list[tuple[str, int, KafkaErrorCode]]]:
    """A commit's offsets of partitions the cluster has, and the (topic, partition, error) of
    the others: any partition of the cluster's topics (led here or not: the coordinator of a
    group is rarely the leader of what it consumes), as Kafka checks its metadata cache. The
    principal needs READ on the group (else every partition is GROUP_AUTHORIZATION_FAILED) and
    on each topic (else its partitions are TOPIC_AUTHORIZATION_FAILED)."""
    if not allowed(context, request, AclOperation.READ, GROUP, group_id):
        return [], _every(topics, GROUP_DENIED)
    known = context.topics.topics
    hidden = denied(context, request, AclOperation.READ, TOPIC, (t.name for t in topics))
    unknown: list[tuple[str, int, KafkaErrorCode]] = []
    entries: list[gc.OffsetCommitEntry] = []
    for topic in topics:
        for p in topic.partitions:
            index = int(p.partition_index)
            found = known.get(topic.name)
            if topic.name in hidden:
                unknown.append((topic.name, index, TOPIC_DENIED))
                continue
            if found is None or not 0 <= index < found.partitions:
                unknown.append((topic.name, index, KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            entries.append(
                gc.OffsetCommitEntry(
                    topic.name,
                    index,
                    int(p.committed_offset),
                    int(getattr(p, "committed_leader_epoch", -1)),
                    p.committed_metadata or "",
                )
            )
    return entries, unknown


def _commit_topics(results: list[tuple[str, int, KafkaErrorCode]]) -> list[r.OffsetCommitTopic]:
    by_topic: dict[str, list[r.OffsetCommitPartition]] = {}
    for name, index, error in results:
        by_topic.setdefault(name, []).append(r.OffsetCommitPartition(index, error))
    return [r.OffsetCommitTopic(name, parts) for name, parts in by_topic.items()]


async def handle_offset_commit(context: Context, request: Request) -> Reply:
    body = request.body
    entries, unknown = _commit_entries(context, request, body.topics, body.group_id)

    async def answer() -> Chunks:
        results = list(unknown)
        if entries:
            response = await _group(
                context,
                request,
                body.group_id,
                lambda request_id, now: gc.OffsetCommit(
                    request_id,
                    now,
                    body.group_id,
                    int(body.generation_id_or_member_epoch),
                    body.member_id,
                    getattr(body, "group_instance_id", None),
                    tuple(entries),
                    request.api_version,
                ),
                lambda error: gc.OffsetCommitResponse(
                    tuple(
                        gc.OffsetCommitPartitionResult(t, p, error)
                        for t, p in dict.fromkeys((e.topic, e.partition) for e in entries)
                    )
                ),
            )
            assert isinstance(response, gc.OffsetCommitResponse)
            results += [(p.topic, p.partition, p.error_code) for p in response.partitions]
        topics = _commit_topics(results)
        return r.respond(request, r.OffsetCommitResponse(topics))

    return answer()


async def handle_txn_offset_commit(context: Context, request: Request) -> Reply:
    """Offsets committed inside a producer's transaction (``send_offsets_to_transaction``):
    the transactional append to the group's partition is verified as a Produce of the producer
    would be, and the offsets are shown once the transaction commits."""
    body = request.body
    if allowed(context, request, AclOperation.WRITE, TXN_ID, body.transactional_id):
        entries, unknown = _commit_entries(context, request, body.topics, body.group_id)
    else:
        entries, unknown = [], _every(body.topics, TXN_DENIED)
    producer_id, producer_epoch = int(body.producer_id), int(body.producer_epoch)

    def refused(error: KafkaErrorCode) -> gc.Response:
        keys = dict.fromkeys((e.topic, e.partition) for e in entries)
        return gc.OffsetCommitResponse(
            tuple(gc.OffsetCommitPartitionResult(t, p, error) for t, p in keys)
        )

    async def answer() -> Chunks:
        results = list(unknown)
        if entries:
            clock = context.clock
            response = await context.groups.request(
                body.group_id,
                lambda request_id, _: gc.TxnOffsetCommit(
                    request_id,
                    clock.now_ms(),
                    body.group_id,
                    producer_id,
                    producer_epoch,
                    int(getattr(body, "generation_id", -1)),
                    getattr(body, "member_id", "") or "",
                    getattr(body, "group_instance_id", None),
                    tuple(entries),
                ),
                refused,
                lambda partition: verify_produce(
                    context,
                    PRODUCE_MAX_VERSION,
                    body.transactional_id,
                    partition,
                    producer_id,
                    producer_epoch,
                ),
            )
            assert isinstance(response, gc.OffsetCommitResponse)
            results += [(p.topic, p.partition, p.error_code) for p in response.partitions]
        topics = _commit_topics(results)
        return r.respond(request, r.TxnOffsetCommitResponse(topics))

    return answer()


async def handle_offset_fetch(context: Context, request: Request) -> Reply:
    body = request.body

    def wanted(topics: Any) -> tuple[tuple[str, int], ...] | None:
        if topics is None:
            return None
        return tuple((t.name, int(i)) for t in topics for i in t.partition_indexes)

    if request.api_version >= 8:
        groups = tuple(
            gc.OffsetFetchGroup(
                g.group_id,
                wanted(g.topics),
                getattr(g, "member_id", None),
                int(getattr(g, "member_epoch", -1)),
            )
            for g in body.groups
        )
    else:
        groups = (gc.OffsetFetchGroup(body.group_id, wanted(body.topics)),)
    # v7+: a partition whose commit is not settled (in flight, or a transaction's offsets held
    # for its marker) is answered UNSTABLE_OFFSET_COMMIT, per partition; the client retries.
    require_stable = request.api_version >= 7 and bool(body.require_stable)
    response = await context.groups.offset_fetch(groups, require_stable)
    if context.acls is not None:
        visible = zip(response.groups, groups, strict=True)
        response = gc.OffsetFetchResponse(
            tuple(_fetch_allowed(context, request, g, a) for g, a in visible)
        )
    if request.api_version >= 8:
        return r.respond(
            request,
            r.OffsetFetchResponse(
                groups=[
                    r.OffsetFetchGroup(g.group_id, _fetched_topics(g), g.error_code)
                    for g in response.groups
                ]
            ),
        )
    first = response.groups[0]
    topics = _fetched_topics(first)
    if request.api_version < 2 and first.error_code is not KafkaErrorCode.NONE:
        # v0 and v1 have no top-level error: each partition asked for carries it.
        topics = [
            r.OffsetFetchTopic(
                t.name,
                [
                    r.OffsetFetchPartition(
                        int(i), gc.NO_OFFSET, gc.NO_LEADER_EPOCH, "", first.error_code
                    )
                    for i in t.partition_indexes
                ],
            )
            for t in body.topics or ()
        ]
    return r.respond(request, r.OffsetFetchResponse(topics=topics, error_code=first.error_code))


def _fetch_allowed(
    context: Context,
    request: Request,
    result: gc.OffsetFetchGroupResult,
    asked: gc.OffsetFetchGroup,
) -> gc.OffsetFetchGroupResult:
    """``result`` as the principal may see it (Kafka's rules): GROUP_AUTHORIZATION_FAILED
    without DESCRIBE on the group; the partitions of a topic it may not DESCRIBE left out when
    every topic was asked, TOPIC_AUTHORIZATION_FAILED when it was named."""
    if not allowed(context, request, AclOperation.DESCRIBE, GROUP, result.group_id):
        return gc.OffsetFetchGroupResult(result.group_id, GROUP_DENIED, ())
    topics = (p.topic for p in result.partitions)
    hidden = denied(context, request, AclOperation.DESCRIBE, TOPIC, topics)
    if not hidden:
        return result
    if asked.partitions is None:
        kept = tuple(p for p in result.partitions if p.topic not in hidden)
    else:
        kept = tuple(
            dataclasses.replace(
                p,
                offset=gc.NO_OFFSET,
                leader_epoch=gc.NO_LEADER_EPOCH,
                metadata="",
                error_code=TOPIC_DENIED,
            )
            if p.topic in hidden
            else p
            for p in result.partitions
        )
    return dataclasses.replace(result, partitions=kept)


def _fetched_topics(result: gc.OffsetFetchGroupResult) -> list[r.OffsetFetchTopic]:
    by_topic: dict[str, list[r.OffsetFetchPartition]] = {}
    for p in result.partitions:
        by_topic.setdefault(p.topic, []).append(
            r.OffsetFetchPartition(p.partition, p.offset, p.leader_epoch, p.metadata, p.error_code)
        )
    return [r.OffsetFetchTopic(name, parts) for name, parts in by_topic.items()]


async def handle_list_groups(context: Context, request: Request) -> Reply:
    body = request.body
    states = tuple(getattr(body, "states_filter", ()) or ())
    types = tuple(getattr(body, "types_filter", ()) or ())
    response = await context.groups.list_groups(states, types)
    # Without DESCRIBE on the cluster, only the groups the principal may DESCRIBE are listed.
    hidden: Collection[str] = ()
    if not cluster_allowed(context, request, AclOperation.DESCRIBE):
        ids = (g.group_id for g in response.groups)
        hidden = denied(context, request, AclOperation.DESCRIBE, GROUP, ids)
    listed = [
        r.ListedGroup(g.group_id, g.protocol_type, g.group_state, g.group_type)
        for g in response.groups
        if g.group_id not in hidden
    ]
    return r.respond(request, r.ListGroupsResponse(response.error_code, listed))


async def handle_describe_groups(context: Context, request: Request) -> Reply:
    asked = tuple(request.body.groups)
    hidden = denied(context, request, AclOperation.DESCRIBE, GROUP, asked)
    group_ids = tuple(g for g in asked if g not in hidden)
    response = await context.groups.describe_groups(group_ids)
    found = iter(response.groups)
    include = getattr(request.body, "include_authorized_operations", False)
    described = []
    for group_id in asked:
        if group_id in hidden:
            described.append(r.DescribedGroup(group_id, "", "", "", [], GROUP_DENIED))
            continue
        g = next(found)
        error = g.error_code
        if request.api_version < 6 and error is KafkaErrorCode.GROUP_ID_NOT_FOUND:
            error = KafkaErrorCode.NONE  # before v6 an unknown group is "Dead", no error
        members = [
            r.DescribedGroupMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.member_metadata,
                m.member_assignment,
            )
            for m in g.members
        ]
        described.append(
            r.DescribedGroup(
                g.group_id,
                g.group_state,
                g.protocol_type,
                g.protocol_data,
                members,
                error,
                authorized_operations=(
                    operations(context, request, GROUP, g.group_id)
                    if include
                    else r.AUTHORIZED_OPERATIONS_OMITTED
                ),
            )
        )
    return r.respond(request, r.DescribeGroupsResponse(described))


async def handle_delete_groups(context: Context, request: Request) -> Reply:
    asked = tuple(request.body.groups_names)
    hidden = denied(context, request, AclOperation.DELETE, GROUP, asked)
    group_ids = tuple(g for g in asked if g not in hidden)

    async def answer() -> Chunks:
        response = await context.groups.delete_groups(group_ids)
        results = [r.DeletableGroupResult(g, GROUP_DENIED) for g in asked if g in hidden]
        results += [r.DeletableGroupResult(g.group_id, g.error_code) for g in response.results]
        return r.respond(request, r.DeleteGroupsResponse(results))

    return answer()


def _valid_group(
    group_id: str, response: Callable[[KafkaErrorCode], gc.Response]
) -> Callable[[KafkaErrorCode], gc.Response]:
    """The answer of a membership request this broker does not serve: an empty group id is
    ``INVALID_GROUP_ID`` wherever it is sent (Kafka checks it before the coordinator), any other
    gets the routing's error."""

    def refused(error: KafkaErrorCode) -> gc.Response:
        return response(KafkaErrorCode.INVALID_GROUP_ID if not group_id else error)

    return refused


async def handle_offset_delete(context: Context, request: Request) -> Reply:
    """OffsetDelete (KIP-496): a group's offsets of some partitions deleted, as Kafka's
    ``handleOffsetDeleteRequest``: a topic the cluster lacks is ``UNKNOWN_TOPIC_OR_PARTITION``
    for each partition named, as is a partition it lacks; the others go to the group's
    coordinator (its errors: the machine's ``OffsetDelete``), even when none is left, so that
    the group's own error (``GROUP_ID_NOT_FOUND``, ``NOT_COORDINATOR``, ...) is answered. An
    empty group id is ``INVALID_GROUP_ID``."""
    body = request.body
    group_id = body.group_id
    if not allowed(context, request, AclOperation.DELETE, GROUP, group_id):
        return r.respond(request, r.OffsetDeleteResponse([], GROUP_DENIED))
    known = context.topics.topics
    hidden = denied(context, request, AclOperation.READ, TOPIC, (t.name for t in body.topics))
    errors: dict[tuple[str, int], KafkaErrorCode] = {}
    partitions: list[tuple[str, int]] = []
    for topic in body.topics:
        found = known.get(topic.name)
        for p in topic.partitions:
            key = (topic.name, int(p.partition_index))
            if topic.name in hidden:
                errors[key] = TOPIC_DENIED
            elif found is None or not 0 <= key[1] < found.partitions:
                errors[key] = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                partitions.append(key)

    async def answer() -> Chunks:
        error = KafkaErrorCode.NONE
        if not group_id:
            error = KafkaErrorCode.INVALID_GROUP_ID
        else:
            response = await context.groups.delete_offsets(group_id, tuple(partitions))
            error = response.error_code
            errors.update({(p.topic, p.partition): p.error_code for p in response.partitions})
        by_topic: dict[str, list[r.OffsetDeletePartition]] = {}
        for topic in body.topics:
            for p in topic.partitions:
                key = (topic.name, int(p.partition_index))
                if key in errors:
                    parts = by_topic.setdefault(topic.name, [])
                    if all(known.partition_index != key[1] for known in parts):
                        parts.append(r.OffsetDeletePartition(key[1], errors[key]))
        topics = [r.OffsetDeleteTopic(name, parts) for name, parts in by_topic.items()]
        return r.respond(request, r.OffsetDeleteResponse(topics, error))

    return answer()
