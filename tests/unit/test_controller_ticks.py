"""The active controller's ticks (``ControllerTicks``): a broker whose session deadline passed is
fenced at the next check (every ``SESSION_CHECK_S``), not at the next once-a-second tick, and
the fence is logged; a broker still heartbeating is not fenced. Here the tick is pushed a
minute away, so only the check can fence.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata import broker_session
from automq_ref.io.metadata.broker_session import ControllerTicks
from automq_ref.io.metadata.client import InProcessControllerClient, register_node
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.state_machines import stream_metadata as sm

SESSION_MS = 400
HEARTBEAT_MS = 100


async def test_a_lapsed_session_is_fenced_between_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="automq_ref.io.metadata.broker_session")
    clock = SystemClock()
    metadata_log = await FileMetadataLog.open(tmp_path / "metadata")
    params = sm.StreamMetadataParams(broker_session_timeout_ms=SESSION_MS)
    controller = await Controller.open(metadata_log, params, clock.now_ms)
    client = InProcessControllerClient(controller)
    epochs = {}
    for node_id in (1, 2):
        registration = await register_node(client, node_id, clock.now_ms())
        epochs[node_id] = registration.node_epoch
        beat = sm.BrokerHeartbeat(node_id, epochs[node_id], clock.now_ms())
        assert (await client.submit(beat)).ok
    ticks = ControllerTicks(
        controller,
        lambda: True,
        clock,
        heartbeat_interval_ms=HEARTBEAT_MS,
        balance_interval_ms=None,
    )
    # No tick for a minute: whatever is fenced now, the check between ticks fenced.
    monkeypatch.setattr(broker_session, "EXPIRE_INTERVAL_S", 60.0)
    ticks.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        # Broker 2 keeps heartbeating; broker 1 stopped after its first.
        while not controller.image.brokers[1].fenced:
            assert loop.time() < deadline, "broker 1 never fenced"
            beat = sm.BrokerHeartbeat(2, epochs[2], clock.now_ms())
            assert (await client.submit(beat)).ok
            await asyncio.sleep(HEARTBEAT_MS / 1000)
    finally:
        await ticks.close()
        await metadata_log.close()
    assert not controller.image.brokers[2].fenced
    assert controller.image.nodes[1].node_epoch == epochs[1] + 1  # the fence bumped it
    expired = [r.getMessage() for r in caplog.records if "session expired" in r.getMessage()]
    assert len(expired) == 1 and f"node_id=1 node_epoch={epochs[1]} " in expired[0], expired
