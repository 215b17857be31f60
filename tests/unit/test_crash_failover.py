"""Crash failover in one process: the controller's decisions (the Failover machine's projection),
the contexts in the KV, and the target's takeover of a failed node's object WAL against a local
object store and an in-process controller on a file metadata log.

The end-to-end story, with two nodes: node 1 acknowledges appends into its object WAL and stops
heartbeating; its session lapses (``ExpireSessions`` fences it, bumping its node epoch); the
round assigns node 2; node 2 takes the WAL over, uploads it as node 1 and closes its stream;
node 1, still running (a zombie), gets no append acknowledged any more; node 2 opens the stream
and reads every acknowledged record, in order, once; node 1 restarted starts clean.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata.client import (
    InProcessControllerClient,
    connect_in_process,
    register_node,
)
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import (
    FailoverSettings,
    StoredContext,
    decode_contexts,
    encode_contexts,
    node_views,
    run_failover_round,
    stored_contexts,
    traced_session,
)
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.failover_runner import (
    FailoverRunner,
    FailoverTarget,
    take_over_failed_node,
)
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.s3stream import S3Storage, StorageError
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.failover import FailoverContext, Session
from automq_ref.state_machines.failover.controller import (
    NodeView,
    abort_failover,
    failover_round,
    in_grace,
    target_order,
)
from automq_ref.vocabulary.naming import (
    FAILOVER_CONTEXTS_KEY,
    object_key,
    parse_wal_object_key,
    wal_object_key,
    wal_objects_prefix,
    wal_reservation_key,
)

NS = "_kafka_test"
# Nothing uploads by itself: what node 1 acknowledged stays in its WAL until the failover.
PARAMS = lc.LogCacheParams(upload_threshold_bytes=1 << 30, upload_interval_ms=-1)
WAL_CONFIG = ObjectWalConfig(batch_interval_ms=5)
SESSION_MS = sm.DEFAULT_PARAMS.broker_session_timeout_ms


def view(node_id: int, session: Session, *, epoch: int = 5, grace: bool = False, streams=()):  # type: ignore[no-untyped-def]
    return NodeView(node_id, epoch, session, grace, frozenset(streams))


# ------------------------------------------------------------------ the controller's decisions


def test_a_fenced_node_with_open_streams_gets_the_next_live_node_round_robin() -> None:
    nodes = [
        view(1, Session.ACTIVE),
        view(2, Session.FENCED, streams=[10, 11]),
        view(3, Session.ACTIVE),
    ]
    decided = failover_round(nodes, [])
    assert decided.assigned == (FailoverContext(2, 5, 3),)
    assert decided.contexts == {FailoverContext(2, 5, 3)}
    # The last node wraps around to the first.
    nodes = [view(1, Session.ACTIVE), view(2, Session.ACTIVE), view(3, Session.FENCED, streams=[1])]
    assert failover_round(nodes, []).assigned == (FailoverContext(3, 5, 1),)


def test_no_failover_in_grace_without_streams_or_without_a_target() -> None:
    assert not failover_round(
        [view(1, Session.ACTIVE), view(2, Session.FENCED, grace=True, streams=[1])], []
    ).assigned
    assert not failover_round([view(1, Session.ACTIVE), view(2, Session.FENCED)], []).assigned
    assert not failover_round(
        [view(1, Session.FENCED, streams=[1]), view(2, Session.STOPPED)], []
    ).assigned
    # A node that shut down gracefully is never failed over.
    assert not failover_round(
        [view(1, Session.ACTIVE), view(2, Session.STOPPED, streams=[1])], []
    ).assigned


def test_at_most_one_failover_in_flight() -> None:
    nodes = [
        view(1, Session.ACTIVE),
        view(2, Session.FENCED, streams=[1]),
        view(3, Session.FENCED, streams=[2]),
    ]
    decided = failover_round(nodes, [])
    assert decided.assigned == (FailoverContext(2, 5, 1),)
    again = failover_round(nodes, decided.contexts)
    assert not again.assigned and not again.cleared
    # Once node 2's streams are closed its context goes and node 3's failover starts.
    nodes[1] = view(2, Session.FENCED)
    later = failover_round(nodes, decided.contexts)
    assert later.cleared == (FailoverContext(2, 5, 1),)
    assert later.assigned == (FailoverContext(3, 5, 1),)


def test_a_context_goes_when_the_node_restarts_or_the_target_leaves() -> None:
    context = FailoverContext(2, 5, 1)
    restarted = [view(1, Session.ACTIVE), view(2, Session.FENCED, epoch=9, grace=True, streams=[1])]
    assert failover_round(restarted, [context]).cleared == (context,)
    target_gone = [
        view(1, Session.FENCED, streams=[3]),
        view(2, Session.FENCED, streams=[1]),
        view(3, Session.ACTIVE),
    ]
    decided = failover_round(target_gone, [context])
    assert decided.cleared == (context,)
    assert decided.assigned == (FailoverContext(1, 5, 2),) or decided.assigned == (
        FailoverContext(1, 5, 3),
    )


def test_target_order_and_grace() -> None:
    assert target_order([1, 2, 3, 4], 2) == [3, 4, 1]
    assert target_order([1, 2, 3], 3) == [1, 2]
    assert in_grace(1_000, 1_500, 1_000) and not in_grace(1_000, 2_000, 1_000)


def test_contexts_round_trip_as_json() -> None:
    contexts = [StoredContext(3, 77, 1, "0@s3://b?region=r"), StoredContext(1, 5, 2, "0@dir:///x")]
    assert decode_contexts(encode_contexts(contexts)) == sorted(
        contexts, key=lambda c: c.failed_node_id
    )
    assert decode_contexts(b"not json") == [] and decode_contexts(None) == []


def test_wal_keys_of_nodes_and_data_objects_never_collide() -> None:
    keys: set[str] = set()
    for node_id in range(0, 200):
        prefix = wal_objects_prefix(NS, node_id)
        key = wal_object_key(NS, node_id, 7, 0, 64 << 20)
        assert parse_wal_object_key(prefix, key) == (7, 0, 64 << 20)
        for other in (node_id + 1, node_id * 10 + 1, node_id * 10):
            if other != node_id:
                assert parse_wal_object_key(wal_objects_prefix(NS, other), key) is None
        keys |= {key, wal_reservation_key(NS, node_id), object_key(NS, node_id)}
    assert len(keys) == 600


# ------------------------------------------------------------------------- in one process


@dataclass
class Metadata:
    controller: Controller
    client: InProcessControllerClient
    view: ImageView


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[Metadata]:
    log = await FileMetadataLog.open(tmp_path / "meta")
    controller = await Controller.open(log)
    client, image_view = connect_in_process(controller)
    yield Metadata(controller, client, image_view)
    await log.close()


@dataclass
class Stores:
    wal: LocalDirectoryObjectStore
    data: LocalDirectoryObjectStore
    wal_dir: Path


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Stores]:
    wal = LocalDirectoryObjectStore(tmp_path / "wal", fsync=False)
    data = LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)
    yield Stores(wal, data, tmp_path / "wal")
    await wal.close()
    await data.close()


async def start_node(
    metadata: Metadata, stores: Stores, node_id: int, proposed_epoch: int
) -> S3Storage:
    registration = await register_node(metadata.client, node_id, proposed_epoch)
    wal = await ObjectWal.open(
        stores.wal,
        namespace=NS,
        node_id=node_id,
        node_epoch=registration.node_epoch,
        config=WAL_CONFIG,
    )
    return await S3Storage.start(
        wal=wal,
        store=stores.data,
        client=metadata.client,
        view=metadata.view,
        registration=registration,
        namespace=NS,
        params=PARAMS,
        runs_lifecycle=lambda: False,
    )


def take_over_from(stores: Stores):  # type: ignore[no-untyped-def]
    async def take_over(wal_config: str, node_id: int, node_epoch: int) -> WriteAheadLog:
        assert wal_config == f"0@dir://{stores.wal_dir}"
        return await ObjectWal.take_over(
            stores.wal, namespace=NS, node_id=node_id, node_epoch=node_epoch, config=WAL_CONFIG
        )

    return take_over


def target(metadata: Metadata, stores: Stores, node_epoch: int) -> FailoverTarget:
    """Node 2 (at ``node_epoch``) as the failover target."""
    return FailoverTarget(
        take_over_wal=take_over_from(stores),
        store=stores.data,
        client=metadata.client,
        view=metadata.view,
        node_id=2,
        node_epoch=node_epoch,
        namespace=NS,
        params=PARAMS,
        clock=SystemClock(),
    )


async def fence_node_one(metadata: Metadata, one: S3Storage, two: S3Storage) -> int:
    """Both heartbeat at 0; only node 2 later: node 1's session lapses. Its bumped epoch."""
    for storage in (one, two):
        heartbeat = sm.BrokerHeartbeat(storage.node_id, storage.node_epoch, 0, ())
        assert (await metadata.client.submit(heartbeat)).ok
    late = 10 * SESSION_MS
    assert (await metadata.client.submit(sm.BrokerHeartbeat(2, two.node_epoch, late, ()))).ok
    assert (await metadata.client.submit(sm.ExpireSessions(late))).ok
    image = metadata.controller.image
    assert image.brokers[1].fenced and not image.brokers[2].fenced
    return image.nodes[1].node_epoch


async def test_a_survivor_takes_the_wal_over_uploads_it_and_the_zombie_acks_nothing(
    metadata: Metadata, stores: Stores
) -> None:
    one = await start_node(metadata, stores, 1, 1_000)
    two = await start_node(metadata, stores, 2, 2_000)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    acked = [f"record-{i}".encode() for i in range(40)]
    for index, payload in enumerate(acked):
        assert await one.append(stream_id, 0, payload, 1) == index
    assert metadata.controller.image.streams[stream_id].end_offset == 0  # all in the WAL only

    failed_epoch = await fence_node_one(metadata, one, two)
    settings = FailoverSettings(grace_ms=0, wal_config=f"0@dir://{stores.wal_dir}")
    image = metadata.controller.image
    await run_failover_round(metadata.client, image, 10 * SESSION_MS, settings)
    (context,) = stored_contexts(metadata.controller.image)
    assert context == StoredContext(1, failed_epoch, 2, settings.wal_config)

    result = await take_over_failed_node(context, target(metadata, stores, two.node_epoch))
    assert (result.streams, result.records) == (1, len(acked))
    image = metadata.controller.image
    stream = image.streams[stream_id]
    assert stream.state is sm.StreamState.CLOSED and stream.end_offset == len(acked)
    assert image.nodes[1].failover_mode

    # The zombie: its next append lands in its WAL but its reservation check fails.
    with pytest.raises(StorageError):
        await asyncio.wait_for(one.append(stream_id, 0, b"zombie", 1), 10)
    # Its requests to the controller are refused too.
    refused = await metadata.client.submit(sm.CreateStream(1, one.node_epoch, sm.NO_TOPIC, -1))
    assert refused.error is sm.StreamErrorCode.NODE_EPOCH_EXPIRED
    await one.abandon()

    # The context is forgotten at the next round.
    image = metadata.controller.image
    await run_failover_round(metadata.client, image, 10 * SESSION_MS, settings)
    assert FAILOVER_CONTEXTS_KEY not in metadata.controller.image.kv

    # The survivor opens the stream one epoch up and reads every acknowledged record once.
    assert await two.open_stream(stream_id, 1) == (0, len(acked))
    batches = await two.read(stream_id, 0, len(acked), 1 << 20)
    assert [bytes(b.payload) for b in batches] == acked
    assert await two.append(stream_id, 1, b"after", 1) == len(acked)

    # Node 1 restarted starts clean: its own reservation, nothing to recover.
    restarted = await start_node(metadata, stores, 1, 3_000)
    assert restarted.node_epoch > failed_epoch
    assert restarted.recovered.records == 0
    await restarted.shutdown()
    await two.shutdown()


async def test_a_restart_before_the_takeover_wins_and_nothing_is_uploaded_twice(
    metadata: Metadata, stores: Stores
) -> None:
    one = await start_node(metadata, stores, 1, 1_000)
    two = await start_node(metadata, stores, 2, 2_000)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    for index in range(10):
        assert await one.append(stream_id, 0, b"x%d" % index, 1) == index
    failed_epoch = await fence_node_one(metadata, one, two)
    await one.abandon()
    context = StoredContext(1, failed_epoch, 2, f"0@dir://{stores.wal_dir}")
    # The node comes back first: it recovers and uploads its own WAL.
    restarted = await start_node(metadata, stores, 1, 3_000)
    assert restarted.recovered.records == 10
    with pytest.raises(Exception):  # noqa: B017 - the WAL or the controller refuses
        await take_over_failed_node(context, target(metadata, stores, two.node_epoch))
    assert metadata.controller.image.streams[stream_id].end_offset == 10
    await restarted.shutdown()
    await two.shutdown()


async def test_the_runner_follows_the_contexts_to_its_task(
    metadata: Metadata, stores: Stores
) -> None:
    one = await start_node(metadata, stores, 1, 1_000)
    two = await start_node(metadata, stores, 2, 2_000)
    stream_id = await one.create_stream()
    await one.open_stream(stream_id, 0)
    for index in range(5):
        await one.append(stream_id, 0, b"y%d" % index, 1)
    failed_epoch = await fence_node_one(metadata, one, two)
    await one.abandon()
    runner = FailoverRunner(target(metadata, stores, two.node_epoch), retry_base_s=0.05)
    runner.start()
    try:
        settings = FailoverSettings(grace_ms=0, wal_config=f"0@dir://{stores.wal_dir}")
        image = metadata.controller.image
        await run_failover_round(metadata.client, image, 10 * SESSION_MS, settings)
        for _ in range(200):
            if runner.completed:
                break
            await asyncio.sleep(0.05)
        ((context, result),) = runner.completed
        assert (context.failed_node_id, context.node_epoch, result.records) == (1, failed_epoch, 5)
        assert metadata.controller.image.streams[stream_id].state is sm.StreamState.CLOSED
        # Forgotten, then assigned here again: it runs again (and finds nothing left to do).
        image = metadata.controller.image
        await run_failover_round(metadata.client, image, 10 * SESSION_MS, settings)
        assert FAILOVER_CONTEXTS_KEY not in metadata.controller.image.kv
        again = sm.PutKV(FAILOVER_CONTEXTS_KEY, encode_contexts([context]), True)
        assert (await metadata.client.submit(again)).ok
        for _ in range(200):
            if len(runner.completed) == 2:
                break
            await asyncio.sleep(0.05)
        assert [(c, r.streams, r.records) for c, r in runner.completed[1:]] == [(context, 0, 0)]
    finally:
        await runner.close()
        await two.shutdown()


async def test_a_broker_that_died_draining_is_failed_over_after_the_grace(
    metadata: Metadata,
) -> None:
    epochs = {}
    for node_id in (1, 2):
        registration = await register_node(metadata.client, node_id, 1_000 * node_id)
        epochs[node_id] = registration.node_epoch
        heartbeat = sm.BrokerHeartbeat(node_id, registration.node_epoch, 0, ())
        assert (await metadata.client.submit(heartbeat)).ok
    created = await metadata.client.submit(sm.CreateStream(1, epochs[1], sm.NO_TOPIC, -1))
    assert created.stream_id is not None
    assert (await metadata.client.submit(sm.OpenStream(1, epochs[1], created.stream_id, 0))).ok
    assert (await metadata.client.submit(sm.ControlledShutdown(1, epochs[1]))).ok
    image = metadata.controller.image
    grace = 60_000
    draining = {v.node_id: v.session for v in node_views(image, grace - 1, grace)}
    assert draining == {1: Session.STOPPED, 2: Session.ACTIVE}
    dead = {v.node_id: v.session for v in node_views(image, grace + 1, grace)}
    assert dead == {1: Session.FENCED, 2: Session.ACTIVE}
    # Once its streams are closed it is stopped for good.
    assert (await metadata.client.submit(sm.CloseStream(1, epochs[1], created.stream_id, 0))).ok
    image = metadata.controller.image
    assert node_views(image, 10 * grace, grace)[0].session is Session.STOPPED


async def test_a_trace_records_a_starting_broker_active_and_an_expired_one_fenced(
    metadata: Metadata,
) -> None:
    """Registered and not yet heartbeaten, a broker is fenced in the image but starting for the
    trace (the CI run whose trace had its opens before the round's Heartbeat); once its session
    lapsed (node epoch bumped) it is fenced for both."""
    epochs = {}
    for node_id in (1, 2):
        registration = await register_node(metadata.client, node_id, 1_000 * node_id)
        epochs[node_id] = registration.node_epoch

    def sessions() -> dict[int, tuple[Session, Session]]:
        image = metadata.controller.image
        return {v.node_id: (v.session, traced_session(image, v)) for v in node_views(image, 0, 0)}

    assert sessions()[2] == (Session.FENCED, Session.ACTIVE)
    for node_id in (1, 2):
        heartbeat = sm.BrokerHeartbeat(node_id, epochs[node_id], 0, ())
        assert (await metadata.client.submit(heartbeat)).ok
    assert sessions() == {1: (Session.ACTIVE,) * 2, 2: (Session.ACTIVE,) * 2}
    late = 10 * SESSION_MS
    assert (await metadata.client.submit(sm.BrokerHeartbeat(2, epochs[2], late, ()))).ok
    assert (await metadata.client.submit(sm.ExpireSessions(late))).ok
    assert sessions()[1] == (Session.FENCED, Session.FENCED)


def test_a_target_aborts_only_when_the_failed_node_runs_another_epoch() -> None:
    context = FailoverContext(2, 5, 1)
    assert not abort_failover(1, context, 5)
    assert abort_failover(1, context, 9)
