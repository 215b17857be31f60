"""A broker's session in the embedded one-node mode: the node registers with its rack and
listener and is live once started; alone, it is never fenced (sessions expire only in a cluster:
there is no one to hand its partitions to), even with its heartbeats stopped past several session
timeouts; a restart registers again and is live again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from automq_ref.config import BrokerConfig, load_config
from automq_ref.node import start_node
from automq_ref.state_machines import stream_metadata as sm


def node_config(tmp_path: Path) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "broker.rack=az1",
            "advertised.listeners=PLAINTEXT://broker-1.example:9999",
            # Short, so the test sees sessions renewed past several timeouts.
            "broker.heartbeat.interval.ms=100",
            "broker.session.timeout.ms=1000",
        ],
        environment={},
    )


async def test_registered_live_kept_alive_and_shut_down(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    node = await start_node(config)
    try:
        broker = node.view.image.brokers[config.node_id]
        assert broker.rack == "az1"
        assert broker.listeners == (sm.Endpoint("PLAINTEXT", "broker-1.example", 9999),)
        assert [b.node_id for b in sm.live_brokers(node.view.image)] == [config.node_id]
        # Heartbeats stopped for three session timeouts: a node alone stays live and unfenced.
        await node.session.stop_heartbeats()
        await asyncio.sleep(3.2)
        assert [b.node_id for b in sm.live_brokers(node.view.image)] == [config.node_id]
        assert node.view.image.brokers[config.node_id].node_epoch == node.session.node_epoch
    finally:
        await node.shutdown()

    node = await start_node(config)
    try:
        image = node.view.image
        assert [b.node_id for b in sm.live_brokers(image)] == [config.node_id]
        assert image.brokers[config.node_id].node_epoch == node.session.node_epoch
    finally:
        await node.shutdown()
