"""Route epochs in the shell: the controller's round on an in-process controller, a broker's
RouteEpochNode on a hand-made image (the fence check, in-flight counts, the report after the
commit, the waiting-epoch fix, the callbacks), and the record's bytes.

The controller's round is driven tick by tick with the clock given to it; the node's loop by
calling ``report_once`` (the loop only calls it once a second)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from automq_ref.formats.route_epoch_record import (
    RouteEpochRecord,
    decode_route_epoch_record,
    encode_node_committed_epoch,
    encode_route_epoch_record,
)
from automq_ref.io.metadata.client import connect_in_process, register_node
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.metadata.route_epochs import (
    RouteEpochSettings,
    run_route_epoch_round,
    stored_record,
)
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.route_epoch_node import RouteEpochFenced, RouteEpochNode
from automq_ref.state_machines import route_epoch as re_
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.route_epoch_projections import (
    NodeView,
    controller_round,
    epoch_to_report,
)
from automq_ref.vocabulary.naming import ROUTE_EPOCH_KEY, node_committed_route_epoch_key

SETTINGS = RouteEpochSettings(bump_interval_ms=10_000)


def test_the_record_round_trips_as_four_avro_longs() -> None:
    record = RouteEpochRecord(-3, -2, 0, 1_700_000_000_000)
    raw = encode_route_epoch_record(record)
    assert raw[:3] == bytes([5, 3, 0])  # zigzag: -3 -> 5, -2 -> 3, 0 -> 0
    assert decode_route_epoch_record(raw) == record
    with pytest.raises(ValueError):
        decode_route_epoch_record(raw + b"\x00")


# ------------------------------------------------------------------------- the projection


def test_controller_round_bumps_and_publishes_by_the_machine() -> None:
    first = re_.EpochRecord(route=0, fenced=-2, committed=-3)
    views = [NodeView(1, True, True, -2), NodeView(2, True, True, None)]
    # Node 2 never reported: the minimum is undefined, a bump keeps committed.
    bump = controller_round(first, views, bump_due=True)
    assert bump is not None and isinstance(bump.event, re_.BumpRouteEpoch)
    assert bump.record == re_.EpochRecord(route=1, fenced=-1, committed=-3)
    assert controller_round(first, views, bump_due=False) is None
    # Node 2 is fenced with no stream open: not counted; node 1's report is published.
    views[1] = NodeView(2, False, False, None)
    publish = controller_round(first, views, bump_due=False)
    assert publish is not None and isinstance(publish.event, re_.PublishCommittedEpoch)
    assert publish.record.committed == -2
    # Fenced but with streams open: counted, and it never reported.
    views[1] = NodeView(2, False, True, None)
    assert controller_round(first, views, bump_due=False) is None


def test_the_waiting_epoch_waits_for_every_earlier_epoch() -> None:
    """TLC's counterexample to AutoMQ's rule as read: a slow request of epoch 0 in flight, a
    finished one of epoch 1, fenced 1. AutoMQ's loop reports 1; the fixed rule reports -1."""
    view = re_.EpochRecord(route=3, fenced=1, committed=-3)
    assert epoch_to_report(view, {0: 1, 1: 0}, None) == -1
    assert re_.waiting_epoch(1, [0], [1], None, wait_earlier_epochs=False) == 1  # AutoMQ's
    assert epoch_to_report(view, {0: 1}, -1) is None  # nothing new
    assert epoch_to_report(view, {}, -1) == 1
    assert epoch_to_report(view, {2: 3}, -1) == 1  # requests above fenced hold nothing back


# ------------------------------------------------------------------ the controller's round


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    meta_log = await FileMetadataLog.open(tmp_path / "meta")
    try:
        yield await Controller.open(meta_log)
    finally:
        await meta_log.close()


async def test_the_round_creates_bumps_and_publishes(controller: Controller) -> None:
    client, _ = connect_in_process(controller)
    for node_id in (1, 2):
        await register_node(client, node_id, 1_000)
        assert (await client.submit(sm.BrokerHeartbeat(node_id, 1_000, 1_000, ()))).ok
    await run_route_epoch_round(controller, 5_000, SETTINGS)
    assert stored_record(controller.image) == RouteEpochRecord(-3, -2, 0, 5_000)
    await run_route_epoch_round(controller, 9_000, SETTINGS)  # not due, nobody reported
    assert stored_record(controller.image) == RouteEpochRecord(-3, -2, 0, 5_000)
    await run_route_epoch_round(controller, 15_000, SETTINGS)
    assert stored_record(controller.image) == RouteEpochRecord(-3, -1, 1, 15_000)
    for node_id, epoch in ((1, -1), (2, -2)):
        key = node_committed_route_epoch_key(node_id)
        await client.submit(sm.PutKV(key, encode_node_committed_epoch(epoch), True))
    await run_route_epoch_round(controller, 16_000, SETTINGS)  # published between bumps
    assert stored_record(controller.image) == RouteEpochRecord(-2, -1, 1, 15_000)
    await run_route_epoch_round(controller, 25_000, SETTINGS)
    assert stored_record(controller.image) == RouteEpochRecord(-2, 0, 2, 25_000)


# --------------------------------------------------------------------------- a broker's side


class FakeCluster:
    """An image with the route-epoch record that the test writes; the node's reports land in
    it through ``submit``; ``commit`` counts LogCache commits and can be held."""

    def __init__(self) -> None:
        self.view = ImageView(sm.EMPTY_IMAGE)
        self.index = 1
        self.commits = 0
        self.hold: asyncio.Event | None = None

    def put(self, record: re_.EpochRecord) -> None:
        stored = RouteEpochRecord(record.committed, record.fenced, record.route, 0)
        self._write(ROUTE_EPOCH_KEY, encode_route_epoch_record(stored))

    def _write(self, key: str, value: bytes) -> None:
        image = self.view.image
        self.index += 1
        self.view.publish(dataclasses.replace(image, kv={**image.kv, key: value}))

    async def submit(self, event: sm.StreamMetadataEvent) -> tuple[sm.Response, int]:
        assert isinstance(event, sm.PutKV)
        self._write(event.key, event.value)
        return sm.Response(), self.index

    async def commit(self) -> None:
        self.commits += 1
        if self.hold is not None:
            await self.hold.wait()

    def node(self) -> RouteEpochNode:
        return RouteEpochNode(
            node_id=1,
            view=self.view,
            index=lambda: self.index,
            submit=self.submit,
            commit=self.commit,
        )


def record(route: int) -> re_.EpochRecord:
    return re_.EpochRecord(route=route, fenced=route - 2, committed=route - 3)


async def test_a_node_fences_counts_and_reports_after_committing() -> None:
    cluster = FakeCluster()
    cluster.put(record(0))
    node = cluster.node()
    heard: list[tuple[str, int]] = []
    node.subscribe(lambda e: heard.append(("epoch", e)), lambda e: heard.append(("trim", e)))
    node.learn_latest()
    assert (node.current_epoch, node.record.fenced) == (0, -2)
    assert await node.report_once() == -2 and cluster.commits == 1
    assert cluster.view.image.kv[node_committed_route_epoch_key(1)] == b"-2"
    assert await node.report_once() is None and cluster.commits == 1  # nothing new
    assert node.begin(0, "a")  # in flight at epoch 0
    cluster.put(dataclasses.replace(record(2), committed=-2))
    node.learn_latest()
    assert heard == [("epoch", 0), ("trim", -3), ("epoch", 2), ("trim", -2)]
    assert not node.admit(0) and node.admit(1)  # fenced 0
    assert not node.begin(-1)
    with pytest.raises(RouteEpochFenced), node.in_flight(0):
        pass
    assert await node.report_once() == -1  # epoch 0 still in flight
    node.end(0, "a")
    assert await node.report_once() == 0
    assert node.in_flight_epochs() == {}


async def test_a_report_holds_learning_and_ends_until_it_is_written() -> None:
    """The machine's report is atomic: while the commit runs, a new record is not learned and
    an end stays counted; both apply once the report is written."""
    cluster = FakeCluster()
    cluster.put(record(3))
    node = cluster.node()
    node.learn_latest()
    assert node.begin(2, "slow")
    cluster.hold = asyncio.Event()
    reporting = asyncio.create_task(node.report_once())
    await asyncio.sleep(0)
    assert cluster.commits == 1
    cluster.put(record(4))
    assert not node.learn_latest()
    node.end(2, "slow")
    assert node.in_flight_epochs() == {2: 1} and node.current_epoch == 3
    cluster.hold.set()
    assert await reporting == 1
    assert node.in_flight_epochs() == {} and node.current_epoch == 4
    cluster.hold = None
    assert await node.report_once() == 2


async def test_the_loop_reports_once_a_record_arrives() -> None:
    cluster = FakeCluster()
    node = RouteEpochNode(
        node_id=1,
        view=cluster.view,
        index=lambda: cluster.index,
        submit=cluster.submit,
        commit=cluster.commit,
        interval_ms=10,
    )
    node.start()
    try:
        cluster.put(record(5))
        for _ in range(200):
            if node.state.reported == 3:
                break
            await asyncio.sleep(0.01)
        assert node.state.reported == 3 and node.current_epoch == 5
    finally:
        await node.close()
