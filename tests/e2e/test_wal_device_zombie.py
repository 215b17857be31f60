"""A broker on a WAL device, paused past a survivor's takeover of its WAL, then resumed: the
device refuses its writes, so nothing it is asked to store afterwards is acknowledged, and the
survivor found every record acknowledged before the pause.

The broker is a real process (``s3.wal.path=0@device://...``); the device is served by this
test process; the survivor is :meth:`BlockWal.take_over` here, at the node epoch the device
reports as the reservation's holder.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.io.storage.block_device import open_device
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_device import DeviceServer
from tests.e2e.conftest import BrokerProcess
from tests.waiting import PATIENCE_S

DEVICE_BYTES = 64 * 1024 * 1024
NODE_ID = 0  # the broker's default node.id


def produce(bootstrap: str, topic: str, values: list[bytes]) -> dict[bytes, object]:
    """Each value's delivery outcome: None when acknowledged, else the error."""
    outcomes: dict[bytes, object] = {}
    lock = threading.Lock()

    def delivered(error: object, message: object) -> None:
        with lock:
            outcomes[message.value()] = error  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": "none",
            "message.timeout.ms": 8000,
        }
    )
    for value in values:
        producer.produce(topic, value=value, on_delivery=delivered)
    producer.flush(PATIENCE_S)
    return outcomes


def test_a_resumed_zombie_acknowledges_nothing(tmp_path: Path) -> None:
    server = DeviceServer(
        open_device(tmp_path / "device-wal", DEVICE_BYTES), str(tmp_path / "wal.sock")
    ).start()
    broker = BrokerProcess(
        tmp_path / "data",
        f"s3.wal.path=0@device://{server.address}",
        f"s3.wal.capacity={DEVICE_BYTES}",
        # No upload while the test runs: what was acknowledged is in the WAL only.
        "s3.wal.upload.interval.ms=600000",
    )
    broker.start()
    try:
        topic = "zombie"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
        before = [b"before-%04d" % i for i in range(200)]
        outcomes = produce(broker.bootstrap, topic, before)
        assert all(outcomes[value] is None for value in before), outcomes

        broker.pause()
        holder = server.reservations.holder
        assert holder is not None and holder.node_id == NODE_ID and not holder.failover

        async def take_over() -> list[bytes]:
            wal = await BlockWal.take_over(
                server.address, node_id=NODE_ID, node_epoch=holder.node_epoch
            )
            bodies = [record.body async for record in wal.recover()]
            await wal.reset()
            await wal.close()
            return bodies

        recovered = b"".join(asyncio.run(take_over()))
        assert all(value in recovered for value in before), "an acknowledged record is lost"
        broker.resume()

        after = [b"after-%04d" % i for i in range(50)]
        outcomes = produce(broker.bootstrap, topic, after)
        acknowledged = [value for value in after if outcomes.get(value, "undelivered") is None]
        assert acknowledged == [], f"the zombie acknowledged {len(acknowledged)} records"
        assert "fenced" in broker.log_path.read_text().lower()
    finally:
        if broker.alive():
            broker.resume()
            broker.kill()
        server.stop()
