"""What a Kafka API handler is given: the decoded :class:`Request` and the node's :class:`Context`.

Every handler has the shape ``async def handle(context, request) -> Reply`` (see
:mod:`automq_ref.kafka.dispatch` for the table that routes API keys to them). A handler keeps the
listener's one rule for ordering (:mod:`automq_ref.kafka.server`): whatever must happen in
request order (offset assignment) happens before it returns; waiting (WAL sync, Fetch long poll,
a group rebalance) happens in the awaitable it returns.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from automq_ref.config import BrokerConfig
from automq_ref.io.clock import Clock
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.network_limiter import NetworkLimiters
from automq_ref.kafka.acls import ClusterAcls
from automq_ref.kafka.fenced_brokers import RecentlyFenced
from automq_ref.kafka.groups import GroupCoordinator
from automq_ref.kafka.notices import Notices
from automq_ref.kafka.producer_ids import ProducerIdAllocator
from automq_ref.kafka.server import Peer, Reply
from automq_ref.kafka.topic_registry import TopicRegistry

if TYPE_CHECKING:  # these modules import this one's neighbours, not this one
    from automq_ref.kafka.quotas import ClientQuotas
    from automq_ref.kafka.snapshot_read import SnapshotReads
    from automq_ref.kafka.snapshot_sessions import SnapshotSessions
    from automq_ref.kafka.transactions import TransactionCoordinator
    from automq_ref.kafka.zone_router_in import RouterIn
    from automq_ref.kafka.zone_router_out import RouterOut


class ApiKey(enum.IntEnum):
    """The Kafka API keys this broker answers (Kafka's ``ApiKeys`` ids)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    DESCRIBE_TOPIC_PARTITIONS = 75
    AUTOMQ_ZONE_ROUTER = 515  # AutoMQ's broker-to-broker zone router (on with its channels)
    AUTOMQ_GET_PARTITION_SNAPSHOT = 516


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request and the connection it came on."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # kio's request dataclass (Produce: automq_ref.protocol.ProduceRequest)
    peer: Peer


@dataclass(slots=True)
class Context:
    """The node's parts a handler may use. ``advertised_listeners`` (listener name -> host,
    port) is what Metadata, DescribeCluster and FindCoordinator tell the clients of each
    listener to connect to: the listener's bound address (or ``advertised.listeners``), set
    once it listens (:meth:`advertised_for`); ``advertised_host``/``advertised_port`` are the
    inter-broker listener's, the address the other brokers know this one by. ``notices`` logs what a
    handler refuses for lack of a feature once per client. ``controller_client`` and ``view``
    are the metadata seams (the controller's decisions asked for, and the image they made), for
    the handlers that reach placement directly (partition reassignments, leader elections)."""

    config: BrokerConfig
    topics: TopicRegistry
    groups: GroupCoordinator
    producer_ids: ProducerIdAllocator
    clock: Clock
    controller_client: ControllerClient
    view: MetadataView
    advertised_host: str
    advertised_port: int
    notices: Notices = field(default_factory=Notices)
    # Empty: one listener, advertised at advertised_host:advertised_port.
    advertised_listeners: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # The brokers Metadata keeps listing for a moment after their session lapsed.
    recently_fenced: RecentlyFenced = field(default_factory=RecentlyFenced)
    # The node id of the active controller's broker, as this broker last saw it (None: unknown).
    active_controller: Callable[[], int | None] = lambda: None
    # The zone router's snapshot reads (None: the router is off): the sessions this broker
    # answers as a main, and the snapshot-read partitions it serves as a proxy.
    snapshot_sessions: SnapshotSessions | None = None
    snapshot_reads: SnapshotReads | None = None
    # The zone router's proxy side (Produce) and main side (AutomqZoneRouter); None: off.
    router_out: RouterOut | None = None
    router_in: RouterIn | None = None
    # The network bandwidth limiter (Fetch responses consume outbound); None: not limited.
    network: NetworkLimiters | None = None
    # Client quotas (kafka/quotas.py; None: a context built without them: nothing throttled).
    quotas: ClientQuotas | None = None
    # The transaction coordinator (None: a context built without one, as some tests build it:
    # transactional requests are then answered COORDINATOR_NOT_AVAILABLE).
    transactions: TransactionCoordinator | None = None
    # The authorizer (kafka/acls.py: its settings and the cluster's ACLs; None: no authorizer,
    # Kafka's default of an empty authorizer.class.name: the ACL APIs answer SECURITY_DISABLED).
    acls: ClusterAcls | None = None

    def advertised_for(self, listener: str) -> tuple[str, int] | None:
        """This broker's address for the clients of ``listener`` (None: not advertised there)."""
        if not self.advertised_listeners or not listener:
            return self.advertised_host, self.advertised_port
        return self.advertised_listeners.get(listener.upper())


Handler: TypeAlias = Callable[[Context, Request], Awaitable[Reply]]
