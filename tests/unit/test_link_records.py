"""Link records in S3Storage: data a proxy routed through its RouterChannel is acknowledged with
only a link record in the leader's WAL, the full data in its LogCache and so in its uploads;
recovery after a crash and a failover takeover turn the link records back into the data through
the channel, at the offsets the leader assigned; without a way to read the channel, recovery
refuses rather than drop them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.stream_record_batch import decode as decode_batch
from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE, WalObjectHeader
from automq_ref.formats.wal_record import WAL_RECORD_HEADER_SIZE, decode_wal_record
from automq_ref.formats.zone_router import LinkRecord
from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata.client import (
    InProcessControllerClient,
    connect_in_process,
    register_node,
)
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import StoredContext
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.failover_runner import FailoverTarget, take_over_failed_node
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectStore
from automq_ref.io.storage.router_channel import (
    ChannelLinkResolver,
    RouterChannel,
    RouterChannelReader,
)
from automq_ref.io.storage.s3stream import LinkResolver, S3Storage, StorageError
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import parse_wal_object_key, wal_objects_prefix

NS = "_kafka_test"
PROXY = 3
PARAMS = lc.LogCacheParams(upload_threshold_bytes=1 << 30, upload_interval_ms=-1)
WAL_CONFIG = ObjectWalConfig(batch_interval_ms=5)
SESSION_MS = sm.DEFAULT_PARAMS.broker_session_timeout_ms


@dataclass
class Cluster:
    controller: Controller
    client: InProcessControllerClient
    view: ImageView
    wal: ObjectStore
    data: ObjectStore
    channel_store: ObjectStore
    wal_dir: Path

    def reader(self) -> RouterChannelReader:
        return RouterChannelReader({0: self.channel_store}, NS)

    def resolver(self) -> LinkResolver:
        return ChannelLinkResolver(self.reader())


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    log = await FileMetadataLog.open(tmp_path / "meta")
    controller = await Controller.open(log)
    client, view = connect_in_process(controller)
    wal = LocalDirectoryObjectStore(tmp_path / "wal", fsync=False)
    data = LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)
    channel = LocalDirectoryObjectStore(tmp_path / "channels", fsync=False)
    yield Cluster(controller, client, view, wal, data, channel, tmp_path / "wal")
    for store in (wal, data, channel):
        await store.close()
    await log.close()


async def start_node(
    cluster: Cluster, node_id: int, proposed_epoch: int, resolver: LinkResolver | None
) -> S3Storage:
    registration = await register_node(cluster.client, node_id, proposed_epoch)
    wal = await ObjectWal.open(
        cluster.wal,
        namespace=NS,
        node_id=node_id,
        node_epoch=registration.node_epoch,
        config=WAL_CONFIG,
    )
    try:
        return await S3Storage.start(
            wal=wal,
            store=cluster.data,
            client=cluster.client,
            view=cluster.view,
            registration=registration,
            namespace=NS,
            params=PARAMS,
            runs_lifecycle=lambda: False,
            link_resolver=resolver,
        )
    except BaseException:
        await wal.close()
        raise


async def open_channel(cluster: Cluster) -> RouterChannel:
    return await RouterChannel.open(
        cluster.channel_store,
        namespace=NS,
        node_id=PROXY,
        node_epoch=1,
        channel_id=0,
        route_epoch=0,
        config=WAL_CONFIG,
    )


def data(index: int) -> bytes:
    return f"batch-{index:04d}|".encode() * 30


async def append_some(
    storage: S3Storage, channel: RouterChannel, stream_id: int, count: int
) -> list[tuple[int, bytes]]:
    """``count`` appends of two offsets each, every third one direct, the others routed."""
    written: list[tuple[int, bytes]] = []
    for index in range(count):
        payload = data(index)
        base = storage.next_offset(stream_id, 0)
        if index % 3 == 2:
            assert await storage.append(stream_id, 0, payload, 2) == base
        else:
            _, offset = await channel.append(storage.node_id, index % 7, payload)
            link = LinkRecord(base + 1, 0, 1_000 + index, 0, offset)
            assert await storage.append(stream_id, 0, payload, 2, link=link) == base
        written.append((base, payload))
    return written


async def wal_batches(store: ObjectStore, node_id: int) -> list[StreamRecordBatch]:
    """Every batch in node ``node_id``'s WAL objects, read raw."""
    batches = []
    prefix = wal_objects_prefix(NS, node_id)
    listed = [
        (parse_wal_object_key(prefix, info.key), info.key) for info in await store.list(prefix)
    ]
    for _, key in sorted(listed):
        blob = await store.get(key)
        header = WalObjectHeader.decode(blob)
        position = WAL_OBJECT_HEADER_SIZE
        while position < WAL_OBJECT_HEADER_SIZE + header.data_length:
            offset = header.start_offset + position - WAL_OBJECT_HEADER_SIZE
            record, body = decode_wal_record(blob, position, offset)
            if record.body_length:
                batches.append(decode_batch(bytes(body))[0])
            position += WAL_RECORD_HEADER_SIZE + record.body_length
    return batches


async def read_all(storage: S3Storage, stream_id: int) -> list[tuple[int, bytes]]:
    return [
        (b.base_offset, bytes(b.payload))
        for b in await storage.read(stream_id, 0, 1 << 30, 1 << 30)
    ]


async def test_linked_appends_keep_links_in_the_wal_and_data_in_uploads(cluster: Cluster) -> None:
    one = await start_node(cluster, 1, 1_000, None)
    channel = await open_channel(cluster)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    written = await append_some(one, channel, stream_id, 12)
    assert await read_all(one, stream_id) == written

    in_wal = [b for b in await wal_batches(cluster.wal, 1) if b.stream_id == stream_id]
    assert [b.base_offset for b in in_wal] == [base for base, _ in written]
    for index, batch in enumerate(in_wal):
        if index % 3 == 2:
            assert (batch.count, bytes(batch.payload)) == (2, data(index))
        else:
            link = LinkRecord.decode(batch.payload)
            assert batch.count == -2 and batch.last_offset == batch.base_offset + 2
            assert link.last_offset == batch.base_offset + 1
            assert await cluster.reader().read(link.channel_offset) == data(index)

    # Uploaded, closed, the channel gone: another node reads every record from the objects.
    await one.close_stream(stream_id, 0)
    await channel.close()
    for info in await cluster.channel_store.list():
        await cluster.channel_store.delete(info.key)
    two = await start_node(cluster, 2, 2_000, None)
    assert await two.open_stream(stream_id, 1) == (0, 24)
    assert await read_all(two, stream_id) == written
    await one.shutdown()
    await two.shutdown()


async def test_a_crash_recovers_linked_data_through_the_channel(cluster: Cluster) -> None:
    one = await start_node(cluster, 1, 1_000, None)
    channel = await open_channel(cluster)
    streams = [await one.create_stream() for _ in range(2)]
    written = {}
    for stream_id in streams:
        await one.open_stream(stream_id, 0)
        written[stream_id] = await append_some(one, channel, stream_id, 100)
    await one.abandon()  # the process dies: nothing uploaded, the WAL keeps the links

    # Without a channel reader the links cannot be resolved: refused, nothing dropped.
    with pytest.raises(StorageError, match=r"link record .* no channel reader"):
        await start_node(cluster, 1, 2_000, None)
    assert all(cluster.controller.image.streams[s].end_offset == 0 for s in streams)

    restarted = await start_node(cluster, 1, 3_000, cluster.resolver())
    assert restarted.recovered.records == 200
    assert restarted.recovered.links == 134
    for stream_id in streams:
        assert await restarted.open_stream(stream_id, 1) == (0, 200)
        assert await read_all(restarted, stream_id) == written[stream_id]
    await restarted.shutdown()
    await channel.close()


async def test_a_link_into_a_trimmed_channel_fails_recovery_clearly(cluster: Cluster) -> None:
    one = await start_node(cluster, 1, 1_000, None)
    channel = await open_channel(cluster)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    await append_some(one, channel, stream_id, 3)
    await one.abandon()
    await channel.close()
    for info in await cluster.channel_store.list():
        await cluster.channel_store.delete(info.key)
    with pytest.raises(StorageError, match=r"node 3's channel: .* is gone"):
        await start_node(cluster, 1, 2_000, cluster.resolver())


async def test_a_failover_takeover_restores_linked_data(cluster: Cluster) -> None:
    one = await start_node(cluster, 1, 1_000, None)
    two = await start_node(cluster, 2, 2_000, None)
    channel = await open_channel(cluster)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    written = await append_some(one, channel, stream_id, 30)
    await one.abandon()
    failed_epoch = one.node_epoch
    context = StoredContext(1, failed_epoch, 2, f"0@dir://{cluster.wal_dir}")

    async def take_over(wal_config: str, node_id: int, node_epoch: int) -> WriteAheadLog:
        return await ObjectWal.take_over(
            cluster.wal, namespace=NS, node_id=node_id, node_epoch=node_epoch, config=WAL_CONFIG
        )

    target = FailoverTarget(
        take_over_wal=take_over,
        store=cluster.data,
        client=cluster.client,
        view=cluster.view,
        node_id=2,
        node_epoch=two.node_epoch,
        namespace=NS,
        params=PARAMS,
        clock=SystemClock(),
        link_resolver=cluster.resolver(),
    )
    result = await take_over_failed_node(context, target)
    assert (result.streams, result.records) == (1, 30)
    assert await two.open_stream(stream_id, 1) == (0, 60)
    assert await read_all(two, stream_id) == written
    await two.shutdown()
    await channel.close()
