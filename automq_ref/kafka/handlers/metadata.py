"""Metadata, DescribeTopicPartitions and DescribeCluster: the cluster's brokers, its topics and
their partitions' leaders.

Both answer from this broker's metadata view: the brokers are the live ones (unfenced, not
shutting down) and those still handing partitions over, with their rack and the listener they
registered, this broker always among them (it answers, so it serves). Handing over are a broker
in controlled shutdown that still leads a partition or holds a stream open (Kafka lists a broker
until its controlled shutdown ends), and a broker fenced by its session (in a cluster) while a
crash failover is about to close its streams (still OPENED on it, past the failover grace, on a
WAL a survivor can take over:
:func:`~automq_ref.io.metadata.failover_contexts.awaiting_failover`) and for two seconds after
this broker first saw it fenced (:mod:`automq_ref.kafka.fenced_brokers`). A client that saw a
broker it was producing to vanish from the list in the same answer that moved its partitions
away would drop them from that connection and find them again only at its next periodic leader
query (librdkafka parks them on its internal broker: up to a second more, measured after a
crash). A partition's leader is the
broker placement assigned it to, at its leader epoch (``LEADER_NOT_AVAILABLE`` while no broker
is live to take it), whether or not that broker has opened it yet: a request sent there early is
held for the open (up to ``partition.open.wait.ms``), else answered ``NOT_LEADER_OR_FOLLOWER``
and retried.

The controller Metadata names is this broker: clients send it their admin requests (CreateTopics
and the like), and every broker takes those and hands them to the active controller. Naming the
active controller's broker instead would send clients to a broker that may have died: its
election key and its session outlive it by seconds, and a client told so keeps sending there
(librdkafka's admin client waits for that broker until its own request timeout) while another
broker has long taken over. DescribeCluster, an operator's question, names the active
controller's broker while it is live (this one, embedded).

Metadata creates an unknown topic (``num.partitions`` partitions) when
``auto.create.topics.enable`` is on and the client allows it (v4+ asks; older versions always
allow); ``__consumer_offsets`` is created as the group coordinator creates it (its partitions
and configs). Internal topics are listed with ``is_internal``.

With an authorizer (Kafka's ``KafkaApis`` rules): a topic the principal may not DESCRIBE is left
out of an answer of every topic, and answered TOPIC_AUTHORIZATION_FAILED when named (by id:
without its name); a named topic that does not exist is created only with CREATE on the cluster
or on it, else TOPIC_AUTHORIZATION_FAILED. Authorized operations, when asked, are what the
principal may do on each topic and, for the cluster, 0 without DESCRIBE on it (every operation
without an authorizer). DescribeCluster answers everyone (its operations the same way);
DescribeTopicPartitions hides and refuses topics as Metadata does.

With the zone router on (``automq.zonerouter.channels``), Metadata answers each client for its
zone (:mod:`automq_ref.kafka.zones`: declared in its client id, else by its address): a client
in a zone the main/proxy mapping covers is told that each partition's leader is the leader's
proxy in its zone (replicas and ISR that proxy alone; the leader itself when it is in the
client's zone), so that it talks only to brokers of its zone; any other client is told the
real leaders, with the leader and its proxies as replicas and ISR (the brokers that can serve
its reads). Leader epochs, the brokers list and the controller are the same for every client.
FindCoordinator and DescribeCluster are not rewritten.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic
from automq_ref.io.metadata.failover_contexts import FailoverSettings, awaiting_failover
from automq_ref.kafka import responses as r
from automq_ref.kafka.acl_operations import TOPIC_OPERATIONS
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    cluster_allowed,
    denied,
    operations,
)
from automq_ref.kafka.listeners import endpoint_of
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
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.kafka.topics import TopicError, check_topic_name
from automq_ref.kafka.zones import (
    ProxyMapping,
    client_leader,
    client_replicas,
    client_zone,
    proxy_mapping,
)
from automq_ref.protocol.metadata import encode_metadata_response
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.acl import CLUSTER_NAME
from automq_ref.vocabulary.naming import is_internal_topic


async def handle_metadata(context: Context, request: Request) -> Reply:
    body = request.body
    version = request.api_version
    config = context.config
    registry = context.topics
    auto_create = config.auto_create_topics_enable and (
        version < 4 or body.allow_auto_topic_creation
    )
    include_operations = getattr(body, "include_topic_authorized_operations", False)

    def topic_operations(name: str | None) -> int:
        if not include_operations:
            return AUTHORIZED_OPERATIONS_OMITTED
        return operations(context, request, TOPIC, name or "")

    zoning = _zoning(context, request)
    results: list[MetadataTopic] = []
    every = body.topics is None or (version == 0 and not body.topics)
    if every:
        wanted = [(name, None) for name in sorted(registry.topics)]
    else:
        wanted = [(t.name, getattr(t, "topic_id", None)) for t in body.topics]
    hidden = denied(context, request, DESCRIBE, TOPIC, (_name(registry, n, i) for n, i in wanted))
    uncreatable = frozenset[str]()
    if auto_create and not cluster_allowed(context, request, AclOperation.CREATE):
        absent = (n for n, _ in wanted if n is not None and n not in registry.topics)
        uncreatable = denied(context, request, AclOperation.CREATE, TOPIC, absent)
    for name, topic_id in wanted:
        topic: Topic | None = None
        if hidden and _name(registry, name, topic_id) in hidden:
            if not every:
                denial = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
                results.append(_error(name, denial, topic_id, AUTHORIZED_OPERATIONS_OMITTED))
            continue
        if name is None and topic_id is not None:
            topic = registry.topic_by_id(topic_id)
        elif name is not None:
            topic = registry.topics.get(name)
            if topic is None and name in uncreatable:
                denial = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
                results.append(_error(name, denial, None, AUTHORIZED_OPERATIONS_OMITTED))
                continue
            if topic is None and auto_create and is_internal_topic(name):
                await context.groups.topic_created()
                topic = registry.topics.get(name)
            elif topic is None and auto_create:
                try:
                    topic = await registry.create_topic(name, config.num_partitions, {})
                except TopicError as error:
                    if error.code is not KafkaErrorCode.TOPIC_ALREADY_EXISTS:
                        results.append(_error(name, error.code, None, topic_operations(name)))
                        continue
                    topic = registry.topics.get(name)
        if topic is None:
            code = (
                KafkaErrorCode.UNKNOWN_TOPIC_ID
                if name is None
                else KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
            results.append(_error(name, code, topic_id, topic_operations(name)))
            continue
        results.append(_topic(context, topic, topic_operations(topic.name), zoning))
    brokers = _brokers(context, request.peer.listener)
    # By hand, not through kio: at 1,000 partitions kio's path was 30-50 ms of the loop.
    return encode_metadata_response(
        request.api_version,
        request.correlation_id,
        MetadataResponse(
            brokers=[MetadataBroker(b.node_id, b.host, b.port, b.rack) for b in brokers],
            cluster_id=config.cluster_id,
            # This broker takes admin requests for the controller (the module docstring).
            controller_id=config.node_id,
            topics=results,
            # Only v8-v10 have the cluster's operations (later versions: DescribeCluster).
            cluster_authorized_operations=_cluster_operations(
                context, request, getattr(body, "include_cluster_authorized_operations", False)
            ),
        ),
    )


DESCRIBE = AclOperation.DESCRIBE
TOPIC = ResourceType.TOPIC


def _name(registry: TopicRegistry, name: str | None, topic_id: uuid.UUID | None) -> str | None:
    """The topic's name (of its id when only that is given; None for an id not known)."""
    if name is None and topic_id is not None:
        found = registry.topic_by_id(topic_id)
        return None if found is None else found.name
    return name


def _cluster_operations(context: Context, request: Request, asked: bool) -> int:
    """The cluster's authorized operations as Kafka answers them: omitted unless asked, 0
    without DESCRIBE on the cluster."""
    if not asked:
        return AUTHORIZED_OPERATIONS_OMITTED
    if not cluster_allowed(context, request, DESCRIBE):
        return 0
    return operations(context, request, ResourceType.CLUSTER, CLUSTER_NAME)


def _error(
    name: str | None, code: KafkaErrorCode, topic_id: uuid.UUID | None, operations: int
) -> MetadataTopic:
    return MetadataTopic(
        name=name,
        topic_id=topic_id or ZERO_UUID,
        error_code=code,
        topic_authorized_operations=operations,
    )


@dataclass(frozen=True, slots=True)
class _Zoning:
    """The zone router's view for one client: the mapping and the client's zone (None: none)."""

    mapping: ProxyMapping
    zone: str | None


def _zoning(context: Context, request: Request) -> _Zoning | None:
    """None when the zone router is off: leaders are answered as they are."""
    config = context.config
    if not config.zone_router_enabled:
        return None
    return _Zoning(
        proxy_mapping(context.topics.view.image.brokers.values()),
        client_zone(request.client_id, request.peer.host, config.zone_cidr_blocks),
    )


def _topic(
    context: Context, topic: Topic, operations: int, zoning: _Zoning | None
) -> MetadataTopic:
    image = context.topics.view.image
    held = context.topics.partitions
    partitions = []
    for index in range(topic.partitions):
        assignment = sm.partition_assignment(image, topic.name, index)
        partition = held.get((topic.name, index))
        if assignment is None:
            # Not placed (written before placement, not placed yet): led where it is open.
            leader, epoch = (
                (-1, -1) if partition is None else (context.config.node_id, partition.epoch)
            )
        else:
            leader, epoch = assignment.leader, assignment.leader_epoch
            if partition is not None and leader == context.config.node_id:
                # Streams written before placement open above their epoch: the epoch served.
                epoch = partition.epoch
        if leader == sm.NO_LEADER or leader < 0:
            partitions.append(
                MetadataPartition(
                    partition_index=index,
                    leader_id=-1,
                    leader_epoch=max(epoch, -1),
                    replica_nodes=[],
                    isr_nodes=[],
                    error_code=KafkaErrorCode.LEADER_NOT_AVAILABLE,
                )
            )
            continue
        replicas = [leader]
        if zoning is not None:
            replicas = list(client_replicas(zoning.mapping, zoning.zone, leader))
            leader = client_leader(zoning.mapping, zoning.zone, leader)
        partitions.append(
            MetadataPartition(
                partition_index=index,
                leader_id=leader,
                leader_epoch=epoch,
                replica_nodes=replicas,
                isr_nodes=replicas,
            )
        )
    return MetadataTopic(
        name=topic.name,
        topic_id=topic.topic_id,
        partitions=partitions,
        is_internal=is_internal_topic(topic.name),
        topic_authorized_operations=operations,
    )


@dataclass(frozen=True, slots=True)
class _Broker:
    node_id: int
    host: str
    port: int
    rack: str | None


def _brokers(context: Context, listener: str) -> list[_Broker]:
    """The live brokers with their endpoint of ``listener`` (the request's), by id; this broker
    as it advertises itself there (live or not: it answers). A broker with no endpoint of that
    name is left out, as Kafka leaves it."""
    node_id = context.config.node_id
    found = []
    here = context.advertised_for(listener)
    if here is not None:
        found.append(_Broker(node_id, *here, context.config.broker_rack or None))
    image = context.topics.view.image
    for broker in [*sm.live_brokers(image), *_handing_over(image, _failing_over(context, image))]:
        endpoint = endpoint_of(broker, listener)
        if broker.node_id == node_id or endpoint is None:
            continue
        found.append(_Broker(broker.node_id, endpoint.host, endpoint.port, broker.rack or None))
    return sorted(found, key=lambda b: b.node_id)


def _handing_over(
    image: sm.StreamMetadataImage, failing_over: frozenset[int] = frozenset()
) -> list[sm.BrokerRegistration]:
    """Brokers in controlled shutdown that still lead a partition or hold a stream open, and
    those in ``failing_over`` (fenced, their streams about to be closed by a failover)."""
    return [
        broker
        for broker in image.brokers.values()
        if (
            broker.in_controlled_shutdown
            and (
                sm.broker_partitions(image, broker.node_id)
                or sm.opening_streams(image, broker.node_id)
            )
        )
        or (not broker.live and broker.node_id in failing_over)
    ]


def _failing_over(context: Context, image: sm.StreamMetadataImage) -> frozenset[int]:
    """The brokers fenced by their session that stay listed (a cluster only): those whose
    streams a crash failover is about to close, and those this broker first saw fenced less
    than :data:`~automq_ref.kafka.fenced_brokers.FENCED_LINGER_S` ago."""
    config = context.config
    if not config.etcd_endpoints or not any(
        broker.fenced and not broker.in_controlled_shutdown for broker in image.brokers.values()
    ):
        return frozenset()  # the common case, answered without looking at the streams
    settings = FailoverSettings(
        config.failover_new_epoch_grace_ms,
        config.s3_wal_path if config.object_wal is not None else "",
    )
    lingering = context.recently_fenced.lingering(image, context.clock.monotonic_s())
    return lingering | awaiting_failover(image, context.clock.now_ms(), settings)


def _controller_id(context: Context, brokers: list[_Broker]) -> int:
    """The active controller's broker, if it is one of ``brokers`` (clients send it admin
    requests), else this broker (every broker serves them)."""
    active = context.active_controller()
    if active is not None and any(b.node_id == active for b in brokers):
        return active
    return context.config.node_id


async def handle_describe_cluster(context: Context, request: Request) -> Reply:
    config = context.config
    brokers = _brokers(context, request.peer.listener)
    return respond(
        request,
        DescribeClusterResponse(
            cluster_id=config.cluster_id,
            controller_id=_controller_id(context, brokers),
            brokers=[
                DescribeClusterBroker(broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                for b in brokers
            ],
            cluster_authorized_operations=_cluster_operations(
                context, request, request.body.include_cluster_authorized_operations
            ),
        ),
    )


# Kafka's max.request.partition.size.limit (default 2000): the most partitions one
# DescribeTopicPartitions answer holds, whatever the request's limit.
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000


async def handle_describe_topic_partitions(context: Context, request: Request) -> Reply:
    """DescribeTopicPartitions (KIP-966), from Metadata's data (the same leaders, epochs,
    replicas, the client's zone). Kafka's ``DescribeTopicPartitionsRequestHandler``: the topics
    named (none: every topic) from the cursor's topic on, in name order, at most
    ``min(response_partition_limit, 2000)`` partitions (at least 1); where the limit stops the
    answer, ``next_cursor`` names the first partition left out (a topic's first when the
    previous topic ended the answer). A cursor whose topic the list does not name, or whose
    partition is negative, is ``INVALID_REQUEST`` for every topic named. A named topic the
    cluster lacks is ``UNKNOWN_TOPIC_OR_PARTITION`` (``INVALID_TOPIC_EXCEPTION`` for an
    invalid name); listing every topic skips none. No topic is created. The eligible leader
    replicas (KIP-966's ELR) are empty: every partition's one replica is its leader."""
    body = request.body
    registry = context.topics
    cursor = body.cursor
    cursor_name = "" if cursor is None else cursor.topic_name
    fetch_all = not body.topics
    if fetch_all:
        names = {name for name in registry.topics if name >= cursor_name}
    else:
        names = {t.name for t in body.topics if t.name >= cursor_name}
    hidden = denied(context, request, DESCRIBE, TOPIC, names)
    if (cursor is not None and not fetch_all and cursor.topic_name not in names) or (
        cursor is not None and cursor.partition_index < 0
    ):
        refused = [
            r.DescribeTopicPartitionsTopic(
                t.name, ZERO_UUID, error_code=KafkaErrorCode.INVALID_REQUEST
            )
            for t in body.topics
        ]
        return respond(request, r.DescribeTopicPartitionsResponse(refused))
    limit = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, int(body.response_partition_limit)), 1)
    zoning = _zoning(context, request)
    remaining = limit
    results: list[r.DescribeTopicPartitionsTopic] = []
    next_cursor: r.DescribeTopicPartitionsCursor | None = None
    for name in sorted(names):
        if remaining == 0:
            next_cursor = r.DescribeTopicPartitionsCursor(name, 0)
            break
        topic = registry.topics.get(name)
        if name in hidden:
            if not fetch_all:
                denial = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
                results.append(r.DescribeTopicPartitionsTopic(name, ZERO_UUID, error_code=denial))
            continue
        if topic is None:
            if not fetch_all:
                results.append(_unknown_topic(name))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor_name else 0
        topic_operations = operations(context, request, TOPIC, name)
        described = _topic(context, topic, topic_operations, zoning)
        upper = min(topic.partitions, start + remaining)
        partitions = [
            r.DescribeTopicPartitionsPartition(
                partition_index=p.partition_index,
                leader_id=p.leader_id,
                leader_epoch=p.leader_epoch,
                replica_nodes=p.replica_nodes,
                isr_nodes=p.isr_nodes,
                offline_replicas=p.offline_replicas,
            )
            for p in described.partitions[start:upper]
        ]
        results.append(
            r.DescribeTopicPartitionsTopic(
                name=topic.name,
                topic_id=topic.topic_id,
                partitions=partitions,
                is_internal=is_internal_topic(topic.name),
                topic_authorized_operations=topic_operations,
            )
        )
        if upper < topic.partitions:
            next_cursor = r.DescribeTopicPartitionsCursor(name, upper)
            break
        remaining -= len(partitions)
    return respond(request, r.DescribeTopicPartitionsResponse(results, next_cursor))


def _unknown_topic(name: str) -> r.DescribeTopicPartitionsTopic:
    try:
        check_topic_name(name)
        error = KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    except TopicError:
        error = KafkaErrorCode.INVALID_TOPIC_EXCEPTION
    return r.DescribeTopicPartitionsTopic(
        name,
        ZERO_UUID,
        is_internal=is_internal_topic(name),
        topic_authorized_operations=TOPIC_OPERATIONS,
        error_code=error,
    )
