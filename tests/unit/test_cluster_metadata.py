"""Brokers' metadata on one etcd, in one process: the election, requests sent to the controller
over its RPC (and seen in the sender's own image before submit returns), failover, a deposed
controller fenced out, snapshots for new brokers, and the RPC's codec and failures."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from automq_ref.io.metadata.cluster import (
    ClusterMetadata,
    ClusterSettings,
    ControllerUnavailable,
)
from automq_ref.io.metadata.controller import ControllerError
from automq_ref.io.metadata.election import ControllerInfo, election_key
from automq_ref.io.metadata.etcd_client import EtcdClient, Put
from automq_ref.io.metadata.etcd_metadata_log import NotController
from automq_ref.io.metadata.metadata_log import MetadataLogError
from automq_ref.state_machines import stream_metadata as sm
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id

pytestmark = pytest.mark.asyncio(loop_scope="module")

TTL_MS = 2000
# A request lost across an election after an etcd outage is tried again this often at most.
RESUME_TRIES = 3
StartNode = Callable[..., Awaitable[ClusterMetadata]]


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def cluster(etcd: EtcdServer) -> AsyncIterator[StartNode]:
    """Start brokers' metadata on one cluster id: ``await cluster(node_id, **settings)``."""
    cluster_id = unique_cluster_id("cluster")
    started: list[ClusterMetadata] = []

    async def start(node_id: int, **overrides: Any) -> ClusterMetadata:
        values: dict[str, Any] = {
            "lease_ttl_ms": TTL_MS,
            "request_timeout_ms": 10_000,
            "etcd_request_timeout_ms": 2000,
        }
        values.update(overrides)
        metadata = await ClusterMetadata.start(
            ClusterSettings((etcd.endpoint,), cluster_id, node_id, **values)
        )
        started.append(metadata)
        return metadata

    yield start
    for metadata in started:
        await metadata.close()


async def until(condition: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def leader_of(*nodes: ClusterMetadata) -> ClusterMetadata:
    [leader] = [node for node in nodes if node.election is not None and node.election.is_leader]
    return leader


async def test_one_controller_and_requests_from_the_others(cluster: StartNode) -> None:
    nodes = [await cluster(node_id) for node_id in (1, 2, 3)]
    await until(lambda: sum(bool(n.election and n.election.is_leader) for n in nodes) == 1)
    leader = leader_of(*nodes)
    assert leader.election is not None
    await until(lambda: all(n.election and n.election.leader == leader.election.me for n in nodes))
    for node in nodes:
        registered = await node.client.submit(sm.RegisterNode(node.settings.node_id, 7))
        assert registered.node_epoch == 7
        created = await node.client.submit(sm.CreateStream(node.settings.node_id, 7))
        assert created.stream_id is not None
        # Seen in this node's own image before submit returned.
        assert created.stream_id in node.view.image.streams
        assert node.view.image.nodes[node.settings.node_id].node_epoch == 7
    put = await nodes[0].client.submit(sm.PutKV("k", b"\xff\x00", False))
    assert put.ok
    refused = await nodes[1].client.submit(sm.PutKV("k", b"other", False))
    assert refused.error is sm.StreamErrorCode.KEY_EXIST and refused.value == b"\xff\x00"
    await until(lambda: all(n.view.image == leader.view.image for n in nodes))


async def test_a_resigning_controller_hands_over_at_once(cluster: StartNode) -> None:
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    assert (await second.client.submit(sm.RegisterNode(2, 1))).ok
    started = time.monotonic()
    await first.close()
    assert second.election is not None
    await until(lambda: second.election is not None and second.election.is_leader)
    assert time.monotonic() - started < 1.5
    assert (await second.client.submit(sm.CreateStream(2, 1))).ok


async def test_a_dead_controller_is_replaced_within_the_ttl(cluster: StartNode) -> None:
    """The controller stops keeping its lease alive (as a killed process does): another node
    is elected within the TTL plus a second, and requests sent meanwhile wait for it."""
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    assert (await second.client.submit(sm.RegisterNode(2, 1))).ok
    assert first.election is not None
    # Killed: its tasks stop, its listener goes, nothing is revoked.
    for task in first.election._tasks:
        task.cancel()
    await first.server.close()
    await first.follower.close()
    died = time.monotonic()
    request = asyncio.ensure_future(second.client.submit(sm.CreateStream(2, 1)))
    await until(lambda: second.election is not None and second.election.is_leader, 10)
    takeover = time.monotonic() - died
    assert takeover <= TTL_MS / 1000 + 1, takeover
    assert (await asyncio.wait_for(request, 10)).ok


async def test_a_deposed_controller_decides_nothing(cluster: StartNode, etcd: EtcdServer) -> None:
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    assert (await first.client.submit(sm.RegisterNode(1, 1))).ok
    before = first.metadata_log.next_index
    # Its lease is gone (expired while the process was paused, say): the key goes with it.
    assert first.election is not None and first.election._lease is not None
    await first.etcd.revoke_lease(first.election._lease)
    with pytest.raises(NotController):
        await first.controller.handle(sm.CreateStream(1, 1))
    await first.metadata_log.refresh()
    assert first.metadata_log.next_index == before
    await until(lambda: second.election is not None and second.election.is_leader)
    created = await first.client.submit(sm.CreateStream(1, 1))  # through the new one
    assert created.stream_id in first.view.image.streams
    await until(lambda: first.election is not None and first.election.leader is not None)


async def test_a_controller_elected_again_forgets_its_earlier_sessions(
    cluster: StartNode,
) -> None:
    """Found by ``automq-ref check --brokers 3``: a broker that had been the controller, then
    another took over (the heartbeats went there), then it was elected again, kept the session
    deadlines of its first term, and its first ExpireSessions fenced every broker. Elected
    again, it starts with no session: each live broker gets a whole one."""
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    epochs: dict[int, int] = {}
    for node in (first, second):
        node_id = node.settings.node_id
        registered = await node.client.submit(sm.RegisterNode(node_id, 1))
        assert registered.node_epoch is not None
        epochs[node_id] = registered.node_epoch
    timeout_ms = sm.DEFAULT_PARAMS.broker_session_timeout_ms
    for node_id, epoch in epochs.items():
        assert (await first.client.submit(sm.BrokerHeartbeat(node_id, epoch, 1_000))).ok
    # The second broker takes over; the heartbeats of a later time go to it.
    assert first.election is not None and first.election._lease is not None
    await first.etcd.revoke_lease(first.election._lease)
    await until(lambda: second.election is not None and second.election.is_leader)
    later_ms = 1_000 + 10 * timeout_ms
    for node_id, epoch in epochs.items():
        assert (await second.client.submit(sm.BrokerHeartbeat(node_id, epoch, later_ms))).ok
    # The first is elected again (the second resigns) and its clock ticks.
    await second.close()
    await until(lambda: first.election is not None and first.election.is_leader)
    assert (await first.client.submit(sm.ExpireSessions(later_ms + 1))).ok
    brokers = first.view.image.brokers
    assert not brokers[1].fenced and not brokers[2].fenced
    assert (await first.client.submit(sm.ExpireSessions(later_ms + timeout_ms + 2))).ok
    assert first.view.image.brokers[1].fenced  # whole sessions from the take-over, then none


async def test_a_new_broker_starts_from_the_snapshot(cluster: StartNode) -> None:
    first = await cluster(1, snapshot_bytes=1)
    await until(lambda: first.election is not None and first.election.is_leader)
    assert (await first.client.submit(sm.RegisterNode(1, 1))).ok
    for _ in range(5):
        assert (await first.client.submit(sm.CreateStream(1, 1))).ok
    await until(lambda: first.metadata_log.first_index > 0, 10)
    late = await cluster(2)
    assert late.metadata_log.first_index > 0
    assert late.view.image == first.view.image
    # And follows what comes after, through the snapshot when it fell below one.
    assert (await first.client.submit(sm.CreateStream(1, 1))).ok
    await until(lambda: late.view.image == first.view.image)


async def test_no_controller_within_the_timeout_is_unavailable(
    cluster: StartNode, etcd: EtcdServer
) -> None:
    """The election key names a listener nobody serves (its holder died, its lease lives)."""
    client = await EtcdClient.connect([etcd.endpoint])
    try:
        lease = await client.grant_lease(30)
        cluster_id = unique_cluster_id("unavailable")
        dead = ControllerInfo(9, "127.0.0.1:1")
        await client.txn((), (Put(election_key(cluster_id), dead.encode(), lease),))
        node = await ClusterMetadata.start(
            ClusterSettings((etcd.endpoint,), cluster_id, 5, request_timeout_ms=1000)
        )
        try:
            await until(lambda: node.election is not None and node.election.leader == dead)
            with pytest.raises(ControllerUnavailable, match="cannot reach the controller"):
                await node.client.submit(sm.CreateStream(5, 1))
            await client.revoke_lease(lease)
            await until(lambda: node.election is not None and node.election.is_leader)
            assert (await node.client.submit(sm.RegisterNode(5, 1))).ok
        finally:
            await node.close()
    finally:
        await client.close()


async def test_a_lost_reply_is_an_error_not_a_retry(cluster: StartNode) -> None:
    """The controller dies with the request in flight: the sender does not send it again
    (it may have been decided) and says the outcome is unknown."""
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    assert (await second.client.submit(sm.RegisterNode(2, 1))).ok
    gate = asyncio.Event()
    handle = first.controller.handle

    async def stuck(event: sm.StreamMetadataEvent) -> sm.Response:
        await gate.wait()
        return await handle(event)

    first.controller.handle = stuck  # type: ignore[method-assign]
    request = asyncio.ensure_future(second.client.submit(sm.CreateStream(2, 1)))
    await asyncio.sleep(0.1)
    await first.server.close()
    with pytest.raises(ControllerError, match="outcome is unknown"):
        await request
    gate.set()
    with contextlib.suppress(Exception):
        await first.close()


async def _decide_then_lose_the_answer(
    first: ClusterMetadata, second: ClusterMetadata, lost: sm.StreamMetadataEvent
) -> sm.Response:
    """``second`` sends ``lost`` to the controller ``first``, which decides it and dies before
    answering; ``second`` sends it again to the next controller (itself) and returns its
    answer."""
    decided = asyncio.Event()
    handle = first.controller.handle

    async def decide_and_hang(event: sm.StreamMetadataEvent) -> sm.Response:
        response = await handle(event)
        if event == lost:
            decided.set()
            await asyncio.Event().wait()  # the answer never leaves
        return response

    first.controller.handle = decide_and_hang  # type: ignore[method-assign]
    request = asyncio.ensure_future(second.client.submit(lost))
    await asyncio.wait_for(decided.wait(), 5)
    await first.close()  # the connection drops with the answer; the election goes
    return await asyncio.wait_for(request, 15)


@pytest.mark.parametrize(
    "kind",
    ["OpenStream", "CloseStream", "PrepareObject", "CommitStreamSetObject", "TrimStream"],
)
async def test_a_resendable_request_whose_answer_was_lost_is_sent_again(
    cluster: StartNode, kind: str
) -> None:
    """The controller decides a request and dies before answering: the sender sends it again
    to the next controller, whose answer says what the first decision did; nothing is applied
    twice (a retried open, a close of a closed stream, a redundant commit, a trim to the start;
    a second prepare gets new ids and the first ones stay prepared, to expire)."""
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2)
    epoch = (await second.client.submit(sm.RegisterNode(2, 1))).node_epoch
    assert epoch is not None
    submit = second.client.submit
    stream_id = (await submit(sm.CreateStream(2, epoch))).stream_id
    assert stream_id is not None
    assert (await submit(sm.OpenStream(2, epoch, stream_id, 0))).ok
    prepared = (await submit(sm.PrepareObject(2, epoch, 1, 60_000, 0))).first_object_id
    assert prepared is not None
    commit = sm.CommitStreamSetObject(
        2,
        epoch,
        prepared,
        sm.NO_OBJECT,
        100,
        (sm.CommitRange(stream_id, 0, 0, 10),),
        (),
        (),
        False,
        1,
    )
    events: dict[str, sm.StreamMetadataEvent] = {
        "OpenStream": sm.OpenStream(2, epoch, stream_id, 0),
        "CloseStream": sm.CloseStream(2, epoch, stream_id, 0),
        "PrepareObject": sm.PrepareObject(2, epoch, 2, 60_000, 0),
        "CommitStreamSetObject": commit,
        "TrimStream": sm.TrimStream(2, epoch, stream_id, 0, 5),
    }
    if kind == "TrimStream":
        assert (await submit(commit)).ok
    before = second.view.image
    event = events[kind]
    assert sm.resendable(event)
    response = await _decide_then_lose_the_answer(first, second, event)
    assert response.ok, response
    image = second.view.image
    stream = image.streams[stream_id]
    match kind:
        case "OpenStream":
            assert (response.start_offset, response.next_offset) == (0, 0)
            assert stream.state is sm.StreamState.OPENED and len(stream.ranges) == 1
        case "CloseStream":
            assert stream.state is sm.StreamState.CLOSED
        case "PrepareObject":
            # The resend's ids follow the lost answer's, which stay prepared (they expire).
            assert response.first_object_id == before.next_object_id + 2
            lost = [before.next_object_id, before.next_object_id + 1]
            assert all(image.objects[o].state is sm.S3ObjectState.PREPARED for o in lost)
        case "CommitStreamSetObject":
            assert response.error is sm.StreamErrorCode.REDUNDANT_OPERATION
            assert stream.end_offset == 10
            assert list(image.nodes[2].stream_set_objects) == [prepared]
        case "TrimStream":
            assert stream.start_offset == 5


async def test_a_request_to_a_deposed_controller_ends_when_it_loses_the_election(
    cluster: StartNode,
) -> None:
    """The controller stops answering (paused) and loses the election while a request waits on
    it: the wait ends then, not at the request timeout; a resendable request goes to the new
    controller, another fails with its outcome unknown (a heartbeat's loop then sends the
    next one to the new controller, before the session the new controller gave it ends)."""
    first = await cluster(1)
    await until(lambda: first.election is not None and first.election.is_leader)
    second = await cluster(2, request_timeout_ms=30_000)
    epoch = (await second.client.submit(sm.RegisterNode(2, 1))).node_epoch
    assert epoch is not None
    stream_id = (await second.client.submit(sm.CreateStream(2, epoch))).stream_id
    assert stream_id is not None

    async def paused(event: sm.StreamMetadataEvent) -> sm.Response:
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    first.controller.handle = paused  # type: ignore[method-assign]
    began = time.monotonic()
    opening = asyncio.ensure_future(second.client.submit(sm.OpenStream(2, epoch, stream_id, 0)))
    creating = asyncio.ensure_future(second.client.submit(sm.CreateStream(2, epoch)))
    await asyncio.sleep(0.2)
    assert first.election is not None
    await first.election.close()  # deposed; its listener still holds the connection
    assert (await asyncio.wait_for(opening, 15)).ok
    with pytest.raises(ControllerError, match="lost the election"):
        await asyncio.wait_for(creating, 15)
    assert time.monotonic() - began < 15
    assert second.election is not None and second.election.is_leader


async def create_stream_after_outage(node: ClusterMetadata) -> sm.Response:
    """A CreateStream from ``node`` once etcd is back. The outage may have cost the controller
    its lease, and a CreateStream in flight across the election that follows fails with its
    outcome unknown (it is not resendable: it might create a second stream); that one is
    tried again, up to :data:`RESUME_TRIES` times, as a broker would."""
    for _ in range(RESUME_TRIES - 1):
        with contextlib.suppress(ControllerError):
            return await node.client.submit(sm.CreateStream(node.settings.node_id, 1))
    return await node.client.submit(sm.CreateStream(node.settings.node_id, 1))


async def test_decisions_resume_after_etcd_restarts(cluster: StartNode, etcd: EtcdServer) -> None:
    """etcd stops for a moment and comes back (same data): one controller again, and every
    broker's requests are decided and seen in its image."""
    nodes = [await cluster(node_id, request_timeout_ms=20_000) for node_id in (1, 2)]
    await until(lambda: sum(bool(n.election and n.election.is_leader) for n in nodes) == 1)
    for node in nodes:
        assert (await node.client.submit(sm.RegisterNode(node.settings.node_id, 1))).ok
    await asyncio.to_thread(etcd.restart)
    for node in nodes:
        created = await create_stream_after_outage(node)
        assert created.stream_id in node.view.image.streams
    await until(lambda: sum(bool(n.election and n.election.is_leader) for n in nodes) == 1)
    await until(lambda: nodes[0].view.image == nodes[1].view.image)


async def test_decisions_resume_after_etcd_was_paused(cluster: StartNode, etcd: EtcdServer) -> None:
    """etcd stops answering for longer than the lease TTL: a request in flight fails (its
    outcome unknown) or waits; once etcd answers again, there is one controller and requests
    are decided."""
    nodes = [await cluster(node_id, request_timeout_ms=20_000) for node_id in (1, 2)]
    await until(lambda: sum(bool(n.election and n.election.is_leader) for n in nodes) == 1)
    for node in nodes:
        assert (await node.client.submit(sm.RegisterNode(node.settings.node_id, 1))).ok
    etcd.pause()
    try:
        during = asyncio.ensure_future(nodes[1].client.submit(sm.CreateStream(2, 1)))
        await asyncio.sleep(TTL_MS / 1000 + 1)
    finally:
        etcd.resume()
    with contextlib.suppress(ControllerError, MetadataLogError):
        await during
    for node in nodes:
        created = await create_stream_after_outage(node)
        assert created.stream_id in node.view.image.streams
    await until(lambda: sum(bool(n.election and n.election.is_leader) for n in nodes) == 1)
    await until(lambda: nodes[0].view.image == nodes[1].view.image)
