"""The composition root: one broker node built from a :class:`BrokerConfig`.

:func:`start_node` opens, in this order, the metadata log and the controller, and makes the two
seams everything above reaches it through: the controller client (requests) and the metadata
view (the image and its changes). Without ``metadata.etcd.endpoints`` that is the embedded file
log under ``log.dirs`` and the controller in this process; with it, the node is a broker of a
cluster (:class:`~automq_ref.io.metadata.cluster.ClusterMetadata`: the log on etcd, the
controller election, this node's replica of the image, the controller RPC).

It binds the listener's address (accepting nothing yet), registers the node through the client
with that address (proposing the clock's time as the node epoch; the controller grants one above
any it stored), opens the WAL at the granted epoch, the object store and S3Storage over them,
then the group coordinator and the topic registry (the partitions placed on this broker opened;
the coordinator hears of each ``__consumer_offsets`` partition taken and given up), the
producer-id allocator, the retention and cleaner tasks, with ``automq.zonerouter.channels`` the
zone router's storage (:class:`ZoneRouterParts`: the channels' stores, a reader of every
node's channel, which WAL recovery resolves link records through, and this broker's own
RouterChannel following the route epochs), for a cluster the crash failover (the
controller's failover round in its ticks, and this broker's
:class:`~automq_ref.io.storage.failover_runner.FailoverRunner`, which takes over a dead broker's
WAL, an object WAL or one on a WAL device process, when the controller names it: each broker
publishes where its WAL lives at registration), and the Kafka front end
(:class:`automq_ref.kafka.dispatch.Dispatcher`); nothing else constructs them.
:meth:`Node.listen` starts serving the listener (:mod:`automq_ref.kafka.server`);
:meth:`Node.shutdown` closes it all gracefully, uploading what the WAL holds;
:meth:`Node.abandon` stops a fenced node (or one whose storage failed) at once, and :func:`serve`
then starts a new one.

What a test or a checker wants to replace is injected through :class:`Seams`, not imported by
the production modules: the clock every part reads time from, the WAL opener, and a hook run
before anything is opened.

:func:`serve` checks that the listener's address can be bound before it opens anything, so a
port already taken is refused (:class:`ListenerUnavailable`) with nothing written to the data
directory. A start that finds no controller (etcd answering without one, or, after the first
start, etcd not answering) is tried again after a pause that doubles up to
:data:`START_RETRY_MAX_S`, until it succeeds or the process is stopped
(:func:`_start_when_answered`); a start that fails half way stops what it had opened.

What the node logs at INFO, as ``key=value`` fields: what start-up recovery replayed from the WAL
(``WAL recovered``), the node once it is open (``node started``); what its storage uploaded and
read from objects is summed by :mod:`automq_ref.io.storage.storage_log` (``uploaded``, ``read
objects``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from automq_ref.config import BrokerConfig
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.heap import HeapFreezer, HeapSettings
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.broker_session import BrokerSession, ControllerTicks, SessionError
from automq_ref.io.metadata.client import (
    ControllerClient,
    Registration,
    connect_in_process,
    register_node,
)
from automq_ref.io.metadata.controller import Controller, ControllerError
from automq_ref.io.metadata.failover_contexts import FailoverSettings
from automq_ref.io.metadata.failover_trace import FailoverTrace, TracingClient, open_trace
from automq_ref.io.metadata.metadata_log import FileMetadataLog, MetadataLogError
from automq_ref.io.metadata.route_epoch_trace import open_trace as open_route_epoch_trace
from automq_ref.io.metadata.route_epochs import RouteEpochSettings
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.metrics import BrokerMetrics, MetricsEndpoint
from automq_ref.io.network_limiter import NetworkLimiters, network_limiters
from automq_ref.io.storage.cold_read_process import InChildProcess
from automq_ref.io.storage.cold_reads import ColdReads
from automq_ref.io.storage.compaction import CompactionTotals, compact_forever
from automq_ref.io.storage.failover_runner import FailoverRunner, FailoverTarget
from automq_ref.io.storage.object_store import (
    MeasuredStore,
    ObjectStore,
    RequestShaping,
    ThrottledStore,
    open_object_store,
)
from automq_ref.io.storage.route_epoch_node import IndexedSubmit, RouteEpochNode
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.storage_log import log_storage_forever, log_uploads
from automq_ref.io.storage.storage_metrics import measure_storage
from automq_ref.io.storage.wal import MeasuredWal, WriteAheadLog
from automq_ref.kafka.acls import ClusterAcls
from automq_ref.kafka.broker_metrics import BrokerState
from automq_ref.kafka.compaction import cleaner_forever
from automq_ref.kafka.dispatch import Dispatcher
from automq_ref.kafka.groups import GroupCoordinator
from automq_ref.kafka.listeners import ListenerUnavailable as ListenerUnavailable
from automq_ref.kafka.listeners import (
    advertised_endpoints,
    check_listener_free,
    on_bound_ports,
)
from automq_ref.kafka.producer_expiry import producer_expiry_forever
from automq_ref.kafka.producer_ids import ProducerIdAllocator
from automq_ref.kafka.quotas import ClientQuotas
from automq_ref.kafka.request import Context
from automq_ref.kafka.retention import retention_forever
from automq_ref.kafka.server import CloseConnection, KafkaServer, Peer, Reply
from automq_ref.kafka.tls import server_ssl_context
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.kafka.transactions import MarkersHook, TransactionCoordinator
from automq_ref.node_wal import open_wal as open_wal  # re-exported: tests open a node's WAL
from automq_ref.node_wal import take_over_wal
from automq_ref.node_zones import ZoneRouterParts, start_snapshot_reads
from automq_ref.state_machines import failover as fo
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.network_limiter import Priority
from automq_ref.state_machines.placement import BalanceParams
from automq_ref.vocabulary.naming import NAMESPACE

if TYPE_CHECKING:
    from automq_ref.io.metadata.cluster import ClusterSettings

log = logging.getLogger(__name__)

# serve's pauses between starts while no controller answers: doubling from the first, bounded.
START_RETRY_BASE_S = 0.5
START_RETRY_MAX_S = 10.0

# (config, granted node epoch) -> the opened WAL.
WalOpener = Callable[[BrokerConfig, int], Awaitable[WriteAheadLog]]


@dataclass(frozen=True)
class Seams:
    """What :func:`start_node` lets a caller replace."""

    clock: Clock = field(default_factory=SystemClock)
    open_wal: WalOpener | None = None  # None: :func:`open_wal`
    before_open: Callable[[BrokerConfig], None] | None = None  # run before anything is opened
    # run before a transaction's Prepare* decision is appended (transactions.MarkersHook)
    before_decision: MarkersHook | None = None


@dataclass(frozen=True)
class NodeMetadata:
    """The node's metadata: the controller (in a cluster, this node's replica of it, deciding
    only while elected), the client and view everything above uses, and how to close them."""

    controller: Controller
    client: ControllerClient
    view: MetadataView
    close: Callable[[], Awaitable[None]]
    # Whether this node's controller is the active one (always, embedded; elected, in a cluster).
    is_active: Callable[[], bool] = lambda: True
    # The active controller's node id as this node last saw it (None: embedded, or unknown).
    active_controller: Callable[[], int | None] = lambda: None
    # The client's submit that also answers the log index just past the decision.
    submit_indexed: IndexedSubmit | None = None


def cluster_settings(
    config: BrokerConfig, now_ms: Callable[[], int] | None = None
) -> ClusterSettings:
    from automq_ref.io.metadata.cluster import ClusterSettings
    from automq_ref.io.metadata.etcd_metadata_log import EtcdLimits

    rpc_host, rpc_port = config.controller_rpc_address
    return ClusterSettings(
        endpoints=config.etcd_endpoints,
        cluster_id=config.cluster_id,
        node_id=config.node_id,
        rpc_host=rpc_host,
        rpc_port=rpc_port,
        lease_ttl_ms=config.controller_lease_ttl_ms,
        request_timeout_ms=config.controller_request_timeout_ms,
        snapshot_bytes=config.metadata_log_max_record_bytes_between_snapshots,
        limits=EtcdLimits(max_request_bytes=config.metadata_etcd_max_request_bytes),
        params=stream_metadata_params(config),
        now_ms=now_ms,
    )


def stream_metadata_params(config: BrokerConfig) -> sm.StreamMetadataParams:
    """The controller's settings from the broker's (sessions and the autobalancer)."""
    return sm.StreamMetadataParams(
        broker_session_timeout_ms=config.broker_session_timeout_ms,
        autobalancer_metrics_delay_ms=config.autobalancer_controller_metrics_delay_ms,
        autobalancer=BalanceParams(
            network_in_avg_deviation=(
                config.autobalancer_controller_network_in_distribution_detect_avg_deviation
            ),
            network_out_avg_deviation=(
                config.autobalancer_controller_network_out_distribution_detect_avg_deviation
            ),
            network_in_threshold_bytes_per_sec=(
                config.autobalancer_controller_network_in_usage_distribution_detect_threshold
            ),
            network_out_threshold_bytes_per_sec=(
                config.autobalancer_controller_network_out_usage_distribution_detect_threshold
            ),
            max_moves=config.autobalancer_controller_execution_steps,
        ),
    )


async def open_metadata(
    config: BrokerConfig, now_ms: Callable[[], int] | None = None
) -> NodeMetadata:
    """The embedded file log and its controller, or, with ``metadata.etcd.endpoints``, this
    broker's part of the cluster's metadata; ``now_ms`` is the clock the controller times
    heartbeats with (the node's, which its session ticks use)."""
    if config.etcd_endpoints:
        # Imported here: the embedded default never loads etcd's client (gRPC).
        from automq_ref.io.metadata.cluster import ClusterMetadata

        try:
            cluster = await ClusterMetadata.start(cluster_settings(config, now_ms))
        except MetadataLogError as error:
            reason = str(error.__cause__ or error)
            raise MetadataUnavailable(config.etcd_endpoints, reason) from error

        def is_active() -> bool:
            return cluster.election is not None and cluster.election.is_leader

        def active_controller() -> int | None:
            leader = cluster.election.leader if cluster.election is not None else None
            return None if leader is None else leader.node_id

        return NodeMetadata(
            cluster.controller,
            cluster.client,
            cluster.view,
            cluster.close,
            is_active,
            active_controller,
            cluster.client.submit_indexed,
        )
    metadata_log = await FileMetadataLog.open(config.data_dir / "metadata")
    try:
        controller = await Controller.open(metadata_log, stream_metadata_params(config), now_ms)
    except BaseException:
        await metadata_log.close()
        raise
    client, view = connect_in_process(controller)
    return NodeMetadata(
        controller, client, view, metadata_log.close, submit_indexed=client.submit_indexed
    )


class MetadataUnavailable(Exception):
    """The cluster's metadata quorum (etcd at ``metadata.etcd.endpoints``) did not answer at
    start; nothing was opened."""

    def __init__(self, endpoints: tuple[str, ...], reason: str) -> None:
        super().__init__(f"cannot reach etcd at {','.join(endpoints)}: {reason}")
        self.endpoints, self.reason = endpoints, reason


class Node:
    """A running node: its parts, the task it runs, and the listener once it listens."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        metadata: NodeMetadata,
        store: ObjectStore,
        storage: S3Storage,
        topics: TopicRegistry,
        groups: GroupCoordinator,
        transactions: TransactionCoordinator,
        producer_ids: ProducerIdAllocator,
        session: BrokerSession,
        ticks: ControllerTicks,
        server: KafkaServer,
        bound: dict[str, tuple[str, int]],
        failover: FailoverRunner | None = None,
        route_epochs: RouteEpochNode | None = None,
        zone_router: ZoneRouterParts | None = None,
        limiters: NetworkLimiters,
    ) -> None:
        self.config = config
        specs = config.listener_specs
        self.limiters = limiters
        self.zone_router = zone_router
        self.failover = failover
        # The zone router's route epochs on this broker (None: the router is off).
        self.route_epochs = route_epochs
        self.session = session
        self.ticks = ticks
        self.clock = clock
        self.metadata = metadata
        self.controller = metadata.controller
        self.client = metadata.client
        self.view = metadata.view
        self.storage = storage
        self.topics = topics
        self.groups = groups
        self.transactions = transactions
        self.producer_ids = producer_ids
        self._store = store
        advertised = {e.name: (e.host, e.port) for e in advertised_endpoints(specs, bound)}
        authorizer = config.authorizer
        self.context = Context(
            config=config,
            topics=topics,
            groups=groups,
            producer_ids=producer_ids,
            clock=clock,
            controller_client=metadata.client,
            view=metadata.view,
            advertised_host=advertised[config.inter_broker_listener.name][0],
            advertised_port=advertised[config.inter_broker_listener.name][1],
            advertised_listeners=advertised,
            active_controller=metadata.active_controller,
            network=limiters,
            transactions=transactions,
            quotas=ClientQuotas(metadata.view, clock),
            acls=ClusterAcls(metadata.view, authorizer) if authorizer.enabled else None,
        )
        if config.zone_router_enabled and config.etcd_endpoints:
            start_snapshot_reads(
                self.context, config, metadata.view, storage, topics, clock, zone_router
            )
        if zone_router is not None:
            zone_router.serve(self.context, config, metadata.view, route_epochs)
        self.front_end = Dispatcher(self.context)
        server.handler = self.front_end
        self._retention_task = asyncio.create_task(
            retention_forever(topics, config.log_retention_check_interval_ms, clock)
        )
        self._producer_expiry_task = asyncio.create_task(
            producer_expiry_forever(topics, config.producer_id_expiration_check_interval_ms)
        )
        self._upload_log_task = asyncio.create_task(log_storage_forever(storage, clock))
        node, props = (storage.node_id, storage.node_epoch), config.model_dump(by_alias=True)
        # Compaction's GETs and PUTs wait their turn (COMPACTION) when the bandwidth runs short.
        compacted = ThrottledStore(store, limiters, Priority.COMPACTION)
        totals = CompactionTotals()  # what compaction did, for the metrics
        compaction = compact_forever(
            compacted, NAMESPACE, self.client, self.view, node, clock, props, totals
        )
        self._compaction_task = asyncio.create_task(compaction)  # io/storage/compaction.py
        self._cleaner_task: asyncio.Task[None] | None = None
        if config.log_cleaner_enable:
            self._cleaner_task = asyncio.create_task(cleaner_forever(topics, config, clock))
        self._server: KafkaServer | None = server
        self.bound_listeners = bound  # listener name -> bound host and port
        self.metrics = server.metrics  # None: no exporter (s3.telemetry.metrics.exporter.uri)
        self.metrics_endpoint = None if self.metrics is None else MetricsEndpoint(self.metrics)
        if self.metrics is not None:
            self.metrics.register(BrokerState(self.context))
            measure_storage(self.metrics, storage, totals)  # caches, upload stages, compaction

    @property
    def advertised_address(self) -> tuple[str, int]:
        """Where the first listener's clients are told to connect (``advertised.listeners``,
        else the bound address)."""
        first = self.config.listener_specs[0].name
        return self.context.advertised_for(first) or self.bound_listeners[first]

    async def listen(self) -> tuple[str, int]:
        """Accept connections on the addresses bound at start (``listeners``; port 0 picked a
        free one); return the first listener's (all are in :attr:`bound_listeners`). Clients
        are told to connect to ``advertised.listeners``, else the bound addresses: what this
        broker registered."""
        assert self._server is not None, "the node was shut down"
        await self._server.serve()
        exporter, endpoint = self.config.metrics_exporter, self.metrics_endpoint
        if endpoint is not None and exporter is not None and endpoint.address is None:
            await endpoint.start(exporter.host, exporter.port)
        return self.bound_listeners[self.config.listener_specs[0].name]

    async def abandon(self) -> None:
        """Stop at once, uploading and closing nothing: the controller fenced this broker (its
        session lapsed), so every request of this incarnation is refused. Its partitions went
        to other brokers; the WAL's records wait for the next start (:func:`serve` starts the
        node again), whose recovery uploads them and closes the streams, so the partitions'
        new brokers can open them."""
        await self._stop_serving()
        await self._stop_loops()
        await self._close_background()
        for partition in self.topics.partitions.values():
            partition.wake_waiters()
        await self.groups.abandon()
        await self.transactions.close()
        try:
            await self.storage.abandon()
        finally:
            await self._close_last(stop_heartbeats=True)

    async def shutdown(self) -> None:
        """Graceful (a controlled shutdown): the partitions are handed over while the listener
        still answers, then everything closes and the WAL's data is uploaded.

        The controller hears of the stop first (``ControlledShutdown``) and moves this broker's
        partitions away in batches; the topic registry, still following the image, gives each
        up as its move is decided: it answers ``NOT_LEADER_OR_FOLLOWER`` from then on (clients
        move to the new broker), its appends in flight become durable, its streams are uploaded
        and closed, and its new broker opens them. Once none is left here (or after
        ``controlled.shutdown.timeout.ms``) the listener closes and what remains closes."""
        # The loops stop first: a clean cut short here is discarded by the next open
        # (automq_ref/kafka/compaction.py).
        await self._stop_loops()
        # The controller hears of the stop before the partitions close: it moves them now, and
        # this broker still closes their streams at its epoch.
        held = len(self.topics.partitions)
        accepted = await self.session.shutdown()
        if accepted and self.config.etcd_endpoints and self._server is not None:
            await self._hand_over(held)
        await self._stop_serving()
        await self._close_background()
        # With those whose give-up the stop cut short: none may stay open.
        partitions = self.topics.unclosed()
        for partition in partitions:
            partition.wake_waiters()
        try:
            # The coordinators' shards stop first: nothing appends to their partitions any more.
            await self.groups.close()
            await self.transactions.close()
            # Together: the first close seals the block holding everyone's data, the others
            # wait for that same upload.
            await asyncio.gather(*(partition.close() for partition in partitions))
            await self.storage.shutdown()
            log_uploads(self.storage.take_upload_totals(), during="shutdown")
        finally:
            # The controlled shutdown already stopped the heartbeats.
            await self._close_last(stop_heartbeats=False)

    # The steps abandon and shutdown share, in the order each takes them.

    async def _stop_loops(self) -> None:
        """Cancel retention, producer expiry, log uploads, the cleaner and compaction."""
        loops = (
            self._retention_task,
            self._producer_expiry_task,
            self._upload_log_task,
            self._cleaner_task,
            self._compaction_task,
        )
        for task in loops:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _stop_serving(self) -> None:
        """Close the listener and stop following the image."""
        if self._server is not None:
            await self._server.close()
            self._server = None
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.close()
        await self.topics.stop_following()

    async def _close_background(self) -> None:
        """Close the failover runner, the route-epoch node and the snapshot reads and sessions."""
        if self.failover is not None:
            await self.failover.close()
        if self.route_epochs is not None:
            await self.route_epochs.close()
        if self.context.snapshot_reads is not None:
            await self.context.snapshot_reads.close()
        if self.context.snapshot_sessions is not None:
            await self.context.snapshot_sessions.close()

    async def _close_last(self, *, stop_heartbeats: bool) -> None:
        """Close the zone router and the ticks, stop the heartbeats (``stop_heartbeats``), close
        the metadata and the store."""
        if self.zone_router is not None:
            await self.zone_router.close()
        await self.ticks.close()
        if stop_heartbeats:
            await self.session.stop_heartbeats()
        await self.metadata.close()
        await self._store.close()
        self.limiters.close()

    async def _hand_over(self, held: int) -> None:
        """Until the controller has moved every partition off this broker and the registry has
        given each up (closed), at most ``controlled.shutdown.timeout.ms``; ``held`` partitions
        were here before."""
        began_s = self.clock.monotonic_s()
        timeout_s = self.config.controlled_shutdown_timeout_ms / 1000
        handed_over = await self.topics.wait_handed_over(timeout_s)
        left = len(self.topics.partitions)
        log.log(
            logging.INFO if handed_over else logging.WARNING,
            "controlled shutdown done %s",
            fields(
                node_id=self.config.node_id,
                handed_over=held - left,
                left=left,
                timed_out=not handed_over,
                seconds=round(self.clock.monotonic_s() - began_s, 3),
            ),
        )


async def start_node(config: BrokerConfig, seams: Seams = Seams()) -> Node:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    if seams.before_open is not None:
        seams.before_open(config)
    metadata = await open_metadata(config, seams.clock.now_ms)
    try:
        return await _start_on(config, seams, metadata)
    except BaseException:
        await metadata.close()
        raise


async def _start_on(config: BrokerConfig, seams: Seams, metadata: NodeMetadata) -> Node:
    # Bound before the registration (served once open): with port 0 it registers its port.
    metrics = BrokerMetrics() if config.metrics_exporter is not None else None
    server = KafkaServer(
        _NotServing(), max_request_bytes=config.socket_request_max_bytes, metrics=metrics
    )
    bound: dict[str, tuple[str, int]] = {}
    for listener in config.listener_specs:
        bound[listener.name] = await server.bind(
            listener.host, listener.port, server_ssl_context(listener), listener=listener.name
        )
    try:
        return await _start_bound(config, seams, metadata, server, bound)
    except BaseException:
        await server.close()
        raise


class _NotServing:
    """The listener's handler until the node is open (it accepts nothing before then)."""

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        raise CloseConnection("the broker is starting")


async def _start_bound(
    config: BrokerConfig,
    seams: Seams,
    metadata: NodeMetadata,
    server: KafkaServer,
    bound: dict[str, tuple[str, int]],
) -> Node:
    client, view = metadata.client, metadata.view
    # One registration per start, before the WAL: the WAL and every request carry the epoch the
    # controller granted, not the one proposed.
    restarted = config.node_id in view.image.nodes  # for the failover trace: not the first start
    registration = await register_node(
        client,
        config.node_id,
        seams.clock.now_ms(),
        rack=config.broker_rack,
        listeners=advertised_endpoints(config.listener_specs, bound),
        wal_config=config.wal_location,
    )
    trace = open_trace(
        config.failover_trace_dir,
        f"node{config.node_id}-{registration.node_epoch}",
        lambda: metadata.controller.applied_index,
    )
    if trace is not None:
        client = TracingClient(client, trace)  # records the opens the controller grants
        if restarted:
            trace.record(fo.Restart(config.node_id), committed=True)
    limiters = network_limiters(
        config.s3_network_baseline_bandwidth, config.s3_network_limiter_mode
    )
    open_own_wal = seams.open_wal or functools.partial(open_wal, limiters=limiters)
    opened = _Opened(await open_own_wal(config, registration.node_epoch))
    store = open_object_store(config.object_store_uri)
    if server.metrics is not None:
        store = MeasuredStore(store, server.metrics)
    try:
        await store.__aenter__()
        return await _start_on_wal(
            limiters,
            config,
            seams,
            metadata,
            server,
            bound,
            client=client,
            registration=registration,
            trace=trace,
            restarted=restarted,
            store=store,
            opened=opened,
        )
    except BaseException:
        # A start that failed half way (no controller answered, say) leaves nothing running:
        # serve may start again in this process, on the same WAL.
        with contextlib.suppress(Exception):
            await opened.abandon()
        with contextlib.suppress(Exception):
            await store.close()
        raise


@dataclass
class _Opened:
    """The WAL of a start in progress, and the storage over it once it runs: what to stop if
    the start fails after them (nothing uploaded: the next start recovers the WAL)."""

    wal: WriteAheadLog
    storage: S3Storage | None = None
    cold_reads: ColdReads | None = None  # the storage's once it runs (it closes them)

    async def abandon(self) -> None:
        if self.storage is not None:
            await self.storage.abandon()
            return
        try:
            await self.wal.close()
        finally:
            if self.cold_reads is not None:
                await self.cold_reads.close()


async def _start_on_wal(
    limiters: NetworkLimiters,
    config: BrokerConfig,
    seams: Seams,
    metadata: NodeMetadata,
    server: KafkaServer,
    bound: dict[str, tuple[str, int]],
    *,
    client: ControllerClient,
    registration: Registration,
    trace: FailoverTrace | None,
    restarted: bool,
    store: ObjectStore,
    opened: _Opened,
) -> Node:
    view = metadata.view
    wal = opened.wal
    recovery_started_s = seams.clock.monotonic_s()
    params = lc.LogCacheParams(
        upload_threshold_bytes=config.upload_threshold_bytes,
        upload_interval_ms=config.s3_wal_upload_interval_ms,
        stream_object_split_bytes=config.s3_stream_object_split_size,
        capacity_bytes=config.s3_wal_cache_size,
    )
    # The zone router: link records in the WAL are resolved through the channels' buckets.
    zone_router = ZoneRouterParts(config) if config.zone_router_enabled else None
    cold_reads: ColdReads | InChildProcess | None = None
    if config.cold_read_mode == "thread":
        cold_reads = opened.cold_reads = await ColdReads.start(
            lambda: open_object_store(config.object_store_uri), f"cold-reads-{config.node_id}"
        )
    elif config.cold_read_mode == "process":
        cold_reads = InChildProcess(
            config.object_store_uri,
            f"cold-reads-{config.node_id}",
            config.cold_read_process_nice,
        )
    storage = await S3Storage.start(
        link_resolver=None if zone_router is None else zone_router.link_resolver,
        wal=wal if server.metrics is None else MeasuredWal(wal, server.metrics),
        store=store,
        client=client,
        view=view,
        registration=registration,
        namespace=NAMESPACE,
        params=params,
        clock=seams.clock,
        block_cache_bytes=config.s3_block_cache_size,
        runs_lifecycle=metadata.is_active,
        cold_reads=cold_reads,
        limiters=limiters,
        request_shaping=RequestShaping(merge_window_ms=config.s3_object_read_merge_window_ms),
    )
    opened.storage = storage
    recovered = storage.recovered
    if trace is not None and restarted:
        closed = frozenset(s.stream_id for s in registration.opening_streams)
        trace.record(fo.RecoverOwnWal(config.node_id), closed=closed)
    log.info(
        "WAL recovered %s",
        fields(
            records=recovered.records,
            bytes=recovered.bytes,
            streams=recovered.streams,
            refused=recovered.refused,
            links=recovered.links,
            seconds=seams.clock.monotonic_s() - recovery_started_s,
        ),
    )
    # The image caught up with the registration (the client returns once it shows it): the
    # first heartbeat makes this broker live, so partitions can be placed on it.
    session = BrokerSession(
        client,
        config.node_id,
        registration.node_epoch,
        seams.clock,
        config.broker_heartbeat_interval_ms,
    )
    # Crash failover runs in every cluster: each broker published its WAL at registration, and
    # the round fails over only the nodes whose WAL a survivor can reach (failover_contexts).
    in_cluster = bool(config.etcd_endpoints)
    # Route epochs run with the zone router, in a cluster; off, nothing of them is written.
    route_epochs_on = in_cluster and bool(config.automq_zonerouter_channels.strip())
    route_trace = (
        open_route_epoch_trace(
            config.automq_zonerouter_route_epoch_trace_dir,
            f"node{config.node_id}-{registration.node_epoch}",
            lambda: metadata.controller.applied_index,
        )
        if route_epochs_on
        else None
    )
    ticks = ControllerTicks(
        metadata.controller,
        metadata.is_active,
        seams.clock,
        heartbeat_interval_ms=config.broker_heartbeat_interval_ms,
        balance_interval_ms=(
            config.autobalancer_controller_anomaly_detect_interval_ms
            if config.autobalancer_controller_enable
            else None
        ),
        failover=(
            # A registration that names no WAL (written before brokers published theirs) is
            # taken to share this controller's object WAL, as every broker then did.
            FailoverSettings(
                config.failover_new_epoch_grace_ms,
                config.s3_wal_path if config.object_wal is not None else "",
            )
            if in_cluster
            else None
        ),
        trace=trace,
        route_epochs=(
            RouteEpochSettings(config.automq_zonerouter_route_epoch_bump_interval_ms)
            if route_epochs_on
            else None
        ),
        route_epoch_trace=route_trace,
    )
    await session.heartbeat()
    groups = GroupCoordinator(storage, client, view, config, seams.clock)
    producer_ids = ProducerIdAllocator(client, config.node_id, registration.node_epoch)
    transactions = TransactionCoordinator(
        view, config, seams.clock, producer_ids, seams.before_decision
    )
    topics = await TopicRegistry.open(
        storage, client, view, config, listeners=(groups, transactions), clock=seams.clock
    )
    session.report_loads(topics.loads)
    groups.start(topics)
    transactions.start(topics)
    if not config.etcd_endpoints:
        # A single node coordinates every group: it serves them from its first request, as
        # it did when its groups' offsets were one stream of its own.
        await groups.ready()
    log.info(
        "node started %s",
        fields(
            node_id=config.node_id,
            node_epoch=registration.node_epoch,
            topics=len(topics.topics),
            partitions=len(topics.partitions),
            data_dir=config.data_dir,
            objects=config.object_store_uri,
        ),
    )
    # The loops start once nothing of the start can fail any more (Node.shutdown stops them).
    session.start()
    # Sessions expire only in a cluster: a node alone has no one to hand its partitions to, and
    # fencing itself (its epoch bumped) would only stop its own uploads until a restart.
    if config.etcd_endpoints:
        ticks.start()
    # Partitions come and go with placement (and one that would not open is tried again).
    topics.follow()
    failover = None
    if in_cluster:

        async def take_over(wal_path: str, node_id: int, node_epoch: int) -> WriteAheadLog:
            return await take_over_wal(config, wal_path, node_id, node_epoch)

        failover = FailoverRunner(
            FailoverTarget(
                take_over_wal=take_over,
                store=store,
                client=client,
                view=view,
                node_id=config.node_id,
                node_epoch=registration.node_epoch,
                namespace=NAMESPACE,
                params=params,
                clock=seams.clock,
                link_resolver=None if zone_router is None else zone_router.link_resolver,
            ),
            trace=trace,
        )
        failover.start()
    route_epochs = None
    if route_epochs_on:
        assert metadata.submit_indexed is not None
        linger_s = config.automq_zonerouter_route_epoch_commit_linger_ms / 1000
        route_epochs = RouteEpochNode(
            node_id=config.node_id,
            view=view,
            index=lambda: metadata.controller.applied_index,
            submit=metadata.submit_indexed,
            commit=lambda: storage.commit_appended(linger_s),
            interval_ms=config.automq_zonerouter_route_epoch_commit_interval_ms,
            trace=route_trace,
        )
    if zone_router is not None:
        if route_epochs is not None:
            route_epochs.learn_latest()
        route_epoch = 0 if route_epochs is None else route_epochs.current_epoch
        await zone_router.open_channel(config, registration.node_epoch, route_epoch, seams.clock)
        if route_epochs is not None:
            zone_router.follow(route_epochs)
    if route_epochs is not None:
        route_epochs.start()
    return Node(
        config=config,
        clock=seams.clock,
        metadata=metadata,
        store=store,
        storage=storage,
        topics=topics,
        groups=groups,
        transactions=transactions,
        producer_ids=producer_ids,
        session=session,
        ticks=ticks,
        server=server,
        bound=bound,
        failover=failover,
        route_epochs=route_epochs,
        zone_router=zone_router,
        limiters=limiters,
    )


def run(config: BrokerConfig, seams: Seams) -> int:
    """Serve in the foreground until SIGINT or SIGTERM (on uvloop when it is there)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio works too
        return asyncio.run(serve(config, seams))
    return uvloop.run(serve(config, seams))


async def serve(config: BrokerConfig, seams: Seams) -> int:
    """Start the node, print where it serves (the line test harnesses wait for), and shut it
    down gracefully at SIGINT or SIGTERM: the WAL's data is uploaded first, so the next start
    recovers nothing."""
    check_listener_free(config)
    if config.interpreter_switch_interval_us:
        # The process's threads hand the interpreter lock to a waiting one this often.
        sys.setswitchinterval(config.interpreter_switch_interval_us / 1_000_000)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    first = True
    heap: asyncio.Task[None] | None = None
    while True:
        started = await _start_when_answered(config, seams, stop, first=first)
        if started is None:
            log.info("stopped before the broker started")
            return 0
        node = started
        await node.listen()
        if first:
            if node.metrics_endpoint is not None and node.metrics_endpoint.address:
                print(f"automq-ref: metrics on {node.metrics_endpoint.url}", flush=True)
            _print_serving(node)
            first = False
            heap = _start_heap_freezer(config)
            # A broker fenced later starts again on the ports it serves now, not on other free
            # ones: its clients' bootstrap addresses stay good.
            config = on_bound_ports(config, node.bound_listeners)
        if not await _until_stopped_or_fenced(stop, node.session.expired, node.storage.failed):
            break
        # Fenced, or its storage failed (a commit refused, or a request whose outcome stayed
        # unknown): this incarnation can change nothing any more, or cannot tell what it
        # changed. A new one registers (a new node epoch), recovers the WAL (uploading what
        # is not committed yet), closes the streams this one held and takes partitions again.
        # A storage refused for its node epoch was fenced too, before its session noticed.
        fenced = node.session.expired.is_set() or node.storage.fenced
        log.error(
            "broker %s; starting again %s",
            "fenced: its session lapsed"
            if fenced
            else f"restarting: its storage failed ({node.storage.failure})",
            fields(node_id=config.node_id, node_epoch=node.session.node_epoch),
        )
        await node.abandon()
    log.info("shutting down: uploading the WAL's data, then closing")
    await node.shutdown()
    if heap is not None:
        heap.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heap
    print("automq-ref: stopped", flush=True)
    return 0


def _print_serving(node: Node) -> None:
    """One line per listener (the line harnesses wait for), the first listener's first; with
    several, each names its listener and protocol."""
    specs = node.config.listener_specs
    for listener in specs:
        host, port = node.bound_listeners[listener.name]
        advertised = node.context.advertised_for(listener.name)
        told = "not advertised" if advertised is None else f"bootstrap.servers={advertised[0]}:"
        told += "" if advertised is None else str(advertised[1])
        named = f"{listener.name}, {listener.protocol}, " if len(specs) > 1 else ""
        print(f"automq-ref: serving Kafka on {host}:{port} ({named}{told})", flush=True)


def _start_heap_freezer(config: BrokerConfig) -> asyncio.Task[None] | None:
    """The process's heap freezer (io/heap.py), started once the first node serves (its
    partitions, image and caches are what the freezes keep out of full collections); None when
    ``heap.freeze.interval.ms`` is 0."""
    if config.heap_freeze_interval_ms == 0:
        return None
    settings = HeapSettings(config.heap_freeze_interval_ms, config.heap_thaw_interval_ms)
    return asyncio.create_task(HeapFreezer(settings).run_forever())


async def _start_when_answered(
    config: BrokerConfig, seams: Seams, stop: asyncio.Event, *, first: bool
) -> Node | None:
    """:func:`start_node`, tried again while no controller answers (etcd up but no controller
    elected yet, or etcd unreachable for a while), after a pause that doubles from
    :data:`START_RETRY_BASE_S` up to :data:`START_RETRY_MAX_S`, each failure logged, until a
    start succeeds (the node) or ``stop`` is set (None; a start in progress is cancelled).

    On the process's ``first`` start an etcd that never answered is not waited for
    (:class:`MetadataUnavailable` is raised: most likely a wrong ``metadata.etcd.endpoints``,
    and ``automq-ref serve`` says so and exits); etcd answering without a controller is. A
    start again in the process (after a fence or a storage failure) waits for both."""
    attempt = 0
    while True:
        starting = asyncio.ensure_future(start_node(config, seams))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            return None
        try:
            return starting.result()
        except MetadataUnavailable as error:
            if first:
                raise
            reason = str(error)
        except (ControllerError, MetadataLogError, SessionError) as error:
            reason = f"{type(error).__name__}: {error}"
        pause_s = start_retry_pause_s(attempt)
        attempt += 1
        log.warning(
            "no controller answers; starting again %s",
            fields(node_id=config.node_id, attempt=attempt, pause_seconds=pause_s, reason=reason),
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause_s):
                await stop.wait()
        if stop.is_set():
            return None


def start_retry_pause_s(attempt: int) -> float:
    """The pause before start number ``attempt + 2`` (``attempt`` failures so far, from 0)."""
    return float(min(START_RETRY_BASE_S * 2.0 ** min(attempt, 30), START_RETRY_MAX_S))


async def _until_stopped_or_fenced(stop: asyncio.Event, *fenced: asyncio.Event) -> bool:
    """Wait for any; True if the broker was fenced or failed (and not asked to stop)."""
    waits = [asyncio.ensure_future(event.wait()) for event in (stop, *fenced)]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return any(event.is_set() for event in fenced) and not stop.is_set()
