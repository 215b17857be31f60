"""The zone router's part of the composition root (:mod:`automq_ref.node`): what a broker
opens and starts when ``automq.zonerouter.channels`` is set.

:class:`ZoneRouterParts` holds the router's storage on this broker: the stores of the
channels' buckets, a read-only reader of every node's RouterChannel on them (WAL recovery, the
crash failover and snapshot reads resolve link records through it), this broker's own
RouterChannel, which follows the route epochs (each new epoch tags later appends, each committed
one trims), and the links to other brokers its proxy side sends AutomqZoneRouter requests on;
:meth:`ZoneRouterParts.serve` gives the front end the router's two sides (RouterIn as a main,
RouterOut as a proxy). :func:`start_snapshot_reads` starts the reads in the client's zone: the
sessions this broker answers its proxies with as a main, and the snapshot-read copies of its
mains' partitions it keeps as a proxy. Only :mod:`automq_ref.node` calls them; nothing else
constructs these parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from automq_ref.config import BrokerConfig, ObjectWalSettings
from automq_ref.formats.zone_router import ChannelOffset
from automq_ref.io.clock import Clock
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.object_store import ObjectStore, open_object_store
from automq_ref.io.storage.route_epoch_node import RouteEpochNode
from automq_ref.io.storage.router_channel import (
    ChannelLinkResolver,
    RouterChannel,
    RouterChannelReader,
)
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.wal_object import ObjectWalConfig
from automq_ref.kafka.broker_link import BrokerLink
from automq_ref.kafka.listeners import inter_broker_address, link_connect
from automq_ref.kafka.request import Context
from automq_ref.kafka.snapshot_read import MainSubscriber, SnapshotReads
from automq_ref.kafka.snapshot_sessions import WAL_TRIM_DELAY_S, SnapshotSessions
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.kafka.zone_router_in import (
    ProduceLinkResolver,
    RouterIn,
    admit_routed,
    verify_routed,
)
from automq_ref.kafka.zone_router_out import RouterOut, link_sender
from automq_ref.kafka.zones import proxy_mapping
from automq_ref.vocabulary.naming import NAMESPACE

log = logging.getLogger(__name__)

# How long closing the zone router's channel may take (it uploads what it queued).
CHANNEL_CLOSE_TIMEOUT_S = 10.0


def object_wal_config(settings: ObjectWalSettings) -> ObjectWalConfig:
    """The object WAL's settings as the WAL takes them (the data WAL's and the channels')."""
    return ObjectWalConfig(
        batch_interval_ms=settings.batch_interval_ms,
        max_bytes_in_batch=settings.max_bytes_in_batch,
        max_unflushed_bytes=settings.max_unflushed_bytes,
        max_inflight_uploads=settings.max_inflight_uploads,
        readahead_bytes=settings.readahead_bytes,
    )


class ZoneRouterParts:
    """The zone router's storage on this broker (``automq.zonerouter.channels``): the stores
    of the channels' buckets, a read-only reader of every node's channel on them (recovery's
    link resolver reads through it), this broker's own RouterChannel (on the first channel,
    opened once the node epoch is granted) following the route epochs, and the links to other
    brokers its proxy side sends on."""

    def __init__(self, config: BrokerConfig) -> None:
        self.settings = config.zone_router_channels
        self.stores = {c.channel_id: open_object_store(c.wal.store_uri) for c in self.settings}
        self.reader = RouterChannelReader(self.stores, NAMESPACE)
        self.channel: RouterChannel | None = None
        self.links: dict[int, BrokerLink] = {}
        self._trim: asyncio.Task[None] | None = None
        self._trim_to: int | None = None

    @property
    def link_resolver(self) -> ProduceLinkResolver:
        return ProduceLinkResolver(self.read)

    async def read(self, offset: ChannelOffset) -> bytes:
        """A channel payload: this broker's own from its cache, any from the buckets."""
        if self.channel is not None:
            return await self.channel.read(offset)
        return await self.reader.read(offset)

    async def open_channel(
        self, config: BrokerConfig, node_epoch: int, route_epoch: int, clock: Clock
    ) -> None:
        """Open this broker's own channel; ``route_epoch`` is the cluster's current one (what
        an earlier run of the broker left in the channel counts as of it)."""
        first = self.settings[0]
        self.channel = await RouterChannel.open(
            self.stores[first.channel_id],
            namespace=NAMESPACE,
            node_id=config.node_id,
            node_epoch=node_epoch,
            channel_id=first.channel_id,
            config=object_wal_config(first.wal),
            reader=self.reader,
            clock=clock,
            route_epoch=route_epoch,
        )

    def follow(self, route_epochs: RouteEpochNode) -> None:
        """Tag appends with each new route epoch; trim to each committed one (one at a time,
        to the latest)."""
        channel = self.channel
        assert channel is not None
        route_epochs.subscribe(on_new_epoch=channel.next_epoch, on_committed=self._trim_later)

    def _trim_later(self, committed: int) -> None:
        self._trim_to = committed
        if self._trim is None or self._trim.done():
            self._trim = asyncio.get_running_loop().create_task(self._trim_forward())

    async def _trim_forward(self) -> None:
        while self._trim_to is not None and self.channel is not None:
            committed, self._trim_to = self._trim_to, None
            try:
                await self.channel.trim(committed)
            except Exception as error:  # the next committed epoch trims again
                log.warning("router channel trim to epoch %d failed: %s", committed, error)

    def serve(
        self,
        context: Context,
        config: BrokerConfig,
        view: MetadataView,
        route_epochs: RouteEpochNode | None,
    ) -> None:
        """Give the front end the router's two sides: RouterIn answers AutomqZoneRouter as a
        main, RouterOut carries a zoned client's produce as a proxy."""
        if self.channel is None:
            return
        router_in = RouterIn(
            admit_routed(context), self.read, route_epochs, verify=verify_routed(context)
        )
        context.router_in = router_in
        context.router_out = RouterOut(
            node_id=config.node_id,
            zone=config.broker_rack,
            local_write_mode=config.automq_zonerouter_local_write_mode,
            channel=self.channel,
            router_in=router_in,
            route_epochs=route_epochs,
            sender=link_sender(
                self.links,
                lambda: view.image,
                config.node_id,
                functools.partial(inter_broker_address, config=config),
                link_connect(config, f"automq-ref-router-{config.node_id}"),
            ),
            links=self.links,
        )

    async def close(self) -> None:
        if self._trim is not None:
            self._trim.cancel()
            with contextlib.suppress(BaseException):
                await self._trim
        for link in self.links.values():
            await link.close()
        if self.channel is not None:
            # Bounded: a fenced node's channel may not upload any more.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.channel.close(), CHANNEL_CLOSE_TIMEOUT_S)
        for store in self.stores.values():
            await store.close()


def start_snapshot_reads(
    context: Context,
    config: BrokerConfig,
    view: MetadataView,
    storage: S3Storage,
    topics: TopicRegistry,
    clock: Clock,
    zone_router: ZoneRouterParts | None,
) -> None:
    """The zone router's reads in the client's zone: this broker answers its proxies as a
    main and keeps snapshot-read copies of its mains' partitions as a proxy
    (kafka/snapshot_sessions.py, kafka/snapshot_read.py)."""
    sessions = SnapshotSessions(
        partitions=lambda: list(topics.partitions.values()),
        commit=storage.commit_appended,
        wal_epoch=lambda: storage.node_epoch,
        wal_config=config.s3_wal_path if config.object_wal is not None else "",
        clock=clock,
    )
    storage.append_listeners.append(sessions.on_append)
    storage.wal_trim_delay_s = WAL_TRIM_DELAY_S
    # Link records in a main's WAL are routed produce requests in a channel: the same resolver
    # as WAL recovery's (the batches re-stamped as the main appended them).
    resolver = (
        zone_router.link_resolver
        if zone_router is not None
        else ChannelLinkResolver(RouterChannelReader({}, NAMESPACE))
    )
    wal_stores: dict[str, ObjectStore | None] = {}

    def wal_store(wal_config: str) -> ObjectStore | None:
        if wal_config not in wal_stores:
            settings = (
                config.model_copy(update={"s3_wal_path": wal_config}).object_wal
                if wal_config
                else None
            )
            wal_stores[wal_config] = (
                open_object_store(settings.store_uri) if settings is not None else None
            )
        return wal_stores[wal_config]

    def address(node: int) -> tuple[str, int] | None:
        broker = view.image.brokers.get(node)
        return None if broker is None else inter_broker_address(broker, config)

    def mains() -> set[int]:
        mapping = proxy_mapping(view.image.brokers.values())
        return {
            main
            for main, proxy in mapping.by_zone.get(config.broker_rack, {}).items()
            if proxy == config.node_id and main != config.node_id
        }

    trace_dir = (
        Path(config.automq_zonerouter_snapshot_read_trace_dir)
        if config.automq_zonerouter_snapshot_read_trace_dir
        else None
    )
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)

    def subscriber(main: int, on_cache: Callable[[int], None]) -> MainSubscriber:
        return MainSubscriber(
            main,
            address=address,
            topic_name=lambda topic_id: (
                None if (t := topics.topic_by_id(topic_id)) is None else t.name
            ),
            committed=storage,
            resolver=resolver,
            wal_store=wal_store,
            namespace=NAMESPACE,
            sources=lambda: frozenset(view.image.brokers),
            node_id=config.node_id,
            trace_dir=trace_dir,
            on_cache_change=on_cache,
            connect=link_connect(config, f"snapshot-read-{config.node_id}"),
        )

    reads = SnapshotReads(node_id=config.node_id, mains=mains, subscriber=subscriber)
    reads.start()
    context.snapshot_sessions = sessions
    context.snapshot_reads = reads
