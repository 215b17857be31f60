"""Crash failover with WALs in different places: each broker publishes its WAL at registration,
the controller's round names the failed node's own WAL in its context, and skips (saying so
once) a node whose WAL no survivor can reach (a file or a raw device of its own).

An in-process controller on a file metadata log; brokers are registrations and heartbeats only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from automq_ref.config import load_config
from automq_ref.io.metadata.client import InProcessControllerClient, connect_in_process
from automq_ref.io.metadata.client import register_node as register
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import (
    FailoverSettings,
    StoredContext,
    run_failover_round,
    stored_contexts,
    survivors_can_take_over,
)
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.state_machines import stream_metadata as sm

SESSION_MS = sm.DEFAULT_PARAMS.broker_session_timeout_ms
LATE = 10 * SESSION_MS
DEVICE = "0@device://127.0.0.1:40001"
SOCKET = "0@device:///tmp/automq-ref-test/wal-2.sock"
FILE = "0@file:///var/lib/automq/wal"


@pytest.mark.parametrize(
    ("wal", "reachable"),
    [
        ("0@s3://bucket?region=r&endpoint=http://h:1", True),
        ("0@dir:///shared/wal", True),
        (DEVICE, True),
        (SOCKET, True),
        ("device://127.0.0.1:5", True),
        (FILE, False),
        ("/var/lib/automq/wal", False),
        ("0@/dev/nvme1n1", False),
        ("file:///dev/loop0", False),
        ("", False),
    ],
)
def test_which_wals_a_survivor_can_take_over(wal: str, reachable: bool) -> None:
    assert survivors_can_take_over(wal) is reachable


def test_a_broker_publishes_its_wal_setting_or_its_default_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_config(overrides=[f"s3.wal.path={DEVICE}"]).wal_location == DEVICE
    default = load_config(overrides=[f"log.dirs={tmp_path}"])
    assert default.wal_location == f"0@file://{(tmp_path / 'wal').resolve()}"
    assert not survivors_can_take_over(default.wal_location)


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[tuple[Controller, InProcessControllerClient]]:  # type: ignore[no-untyped-def]
    log = await FileMetadataLog.open(tmp_path / "meta")
    controller = await Controller.open(log)
    in_process, _ = connect_in_process(controller)
    yield controller, in_process
    await log.close()


async def start(client: InProcessControllerClient, wals: dict[int, str]) -> dict[int, int]:
    """Register every node with its WAL, make it live, and open one stream on each; their
    epochs."""
    epochs = {}
    for node_id, wal in wals.items():
        registration = await register(client, node_id, 1_000 * node_id, wal_config=wal)
        epochs[node_id] = registration.node_epoch
        heartbeat = sm.BrokerHeartbeat(node_id, registration.node_epoch, 0, ())
        assert (await client.submit(heartbeat)).ok
        created = await client.submit(sm.CreateStream(node_id, epochs[node_id], sm.NO_TOPIC, -1))
        assert created.stream_id is not None
        opened = sm.OpenStream(node_id, epochs[node_id], created.stream_id, 0)
        assert (await client.submit(opened)).ok
    return epochs


async def lapse(controller: Controller, client: InProcessControllerClient, *dead: int) -> None:
    """Every node but ``dead`` heartbeats late: the dead ones' sessions lapse."""
    for node_id, broker in controller.image.brokers.items():
        if node_id not in dead:
            heartbeat = sm.BrokerHeartbeat(node_id, broker.node_epoch, LATE, ())
            assert (await client.submit(heartbeat)).ok
    assert (await client.submit(sm.ExpireSessions(LATE))).ok
    assert all(controller.image.brokers[n].fenced for n in dead)


async def test_the_image_keeps_each_brokers_published_wal(
    client: tuple[Controller, InProcessControllerClient],
) -> None:
    controller, in_process = client
    await start(in_process, {1: DEVICE, 2: SOCKET, 3: FILE})
    published = {n: b.wal_config for n, b in controller.image.brokers.items()}
    assert published == {1: DEVICE, 2: SOCKET, 3: FILE}
    # The fence and the heartbeats keep it; a new registration replaces it.
    await lapse(controller, in_process, 1)
    assert controller.image.brokers[1].wal_config == DEVICE
    await register(in_process, 1, 50_000, wal_config="0@dir:///elsewhere")
    assert controller.image.brokers[1].wal_config == "0@dir:///elsewhere"


async def test_the_context_names_the_failed_nodes_own_wal(
    client: tuple[Controller, InProcessControllerClient],
) -> None:
    controller, in_process = client
    await start(in_process, {1: DEVICE, 2: SOCKET, 3: "0@dir:///shared/wal"})
    await lapse(controller, in_process, 2)
    # The controller's own WAL is another: the context still names node 2's.
    settings = FailoverSettings(grace_ms=0, wal_config="0@dir:///shared/wal")
    await run_failover_round(in_process, controller.image, LATE, settings)
    (context,) = stored_contexts(controller.image)
    assert context == StoredContext(2, controller.image.nodes[2].node_epoch, 3, SOCKET)


async def test_a_registration_without_a_wal_falls_back_to_the_controllers_object_wal(
    client: tuple[Controller, InProcessControllerClient],
) -> None:
    controller, in_process = client
    await start(in_process, {1: "", 2: ""})
    await lapse(controller, in_process, 1)
    settings = FailoverSettings(grace_ms=0, wal_config="0@dir:///shared/wal")
    await run_failover_round(in_process, controller.image, LATE, settings)
    (context,) = stored_contexts(controller.image)
    assert (context.failed_node_id, context.wal_config) == (1, "0@dir:///shared/wal")


async def test_a_node_no_survivor_can_reach_is_skipped_and_said_once(
    client: tuple[Controller, InProcessControllerClient], caplog: pytest.LogCaptureFixture
) -> None:
    controller, in_process = client
    # Node 1 (the lowest id, first in the machine's order) is on a file of its own: it must
    # not take the one failover in flight from node 2, whose WAL device survivors reach.
    await start(in_process, {1: FILE, 2: DEVICE, 3: ""})
    await lapse(controller, in_process, 1, 2)
    settings = FailoverSettings(grace_ms=0)
    with caplog.at_level(logging.WARNING, logger="automq_ref.io.metadata.failover_contexts"):
        for _ in range(3):
            await run_failover_round(in_process, controller.image, LATE, settings)
    (context,) = stored_contexts(controller.image)
    assert (context.failed_node_id, context.wal_config) == (2, DEVICE)
    impossible = [r.getMessage() for r in caplog.records if "failover impossible" in r.message]
    assert len(impossible) == 1, impossible
    assert "failed_node=1 " in impossible[0] and FILE in impossible[0]


async def test_a_node_that_published_no_wal_is_skipped_without_an_object_wal_to_fall_back_on(
    client: tuple[Controller, InProcessControllerClient], caplog: pytest.LogCaptureFixture
) -> None:
    controller, in_process = client
    await start(in_process, {1: "", 2: DEVICE})
    await lapse(controller, in_process, 1)
    with caplog.at_level(logging.WARNING, logger="automq_ref.io.metadata.failover_contexts"):
        await run_failover_round(in_process, controller.image, LATE, FailoverSettings(grace_ms=0))
    assert stored_contexts(controller.image) == []
    impossible = [r.getMessage() for r in caplog.records if "failover impossible" in r.message]
    assert len(impossible) == 1 and "failed_node=1 " in impossible[0]
    assert "none published" in impossible[0]
