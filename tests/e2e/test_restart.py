"""Broker restarts in the middle of a stream: nothing acknowledged is lost.

A producer (acks=all, idempotent) writes while the broker is stopped gracefully or killed with
SIGKILL and started again on the same data directory; every value whose delivery was
acknowledged must be read back afterwards, at most once per acknowledgement and in order per
partition. The WAL is the block WAL file (the default), the block WAL on a WAL device served by
this test process (``s3.wal.path=0@device://...``: the device outlives the killed broker, and
the broker's next epoch preempts its dead registration), or the object WAL on S3 (moto) or in a
directory (``s3.wal.path=0@s3://...`` / ``0@dir://...``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.io.storage.block_device import open_device
from automq_ref.io.storage.wal_device import DeviceServer
from tests.conftest import MotoS3
from tests.e2e.conftest import BrokerProcess
from tests.unit.test_object_store import fresh_bucket, moto_store
from tests.waiting import PATIENCE_S, wait_until

PARTITIONS = 3
DEVICE_BYTES = 256 * 1024 * 1024


def read_everything(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, index, 0) for index in range(PARTITIONS)])
    values: dict[int, list[bytes]] = {index: [] for index in range(PARTITIONS)}
    at_end: set[int] = set()
    deadline = time.monotonic() + PATIENCE_S
    while len(at_end) < PARTITIONS and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        partition = message.partition()
        assert partition is not None
        if error is not None:
            if error.code() == -191:  # _PARTITION_EOF
                at_end.add(partition)
                continue
            raise AssertionError(error)
        value = message.value()
        assert value is not None
        values[partition].append(value)
    consumer.close()
    assert len(at_end) == PARTITIONS, "did not reach the end of every partition"
    return values


def wal_broker(tmp_path: Path, wal: str, request: pytest.FixtureRequest) -> BrokerProcess:
    """A broker on the block WAL file or a WAL device, or on the object WAL on S3 (moto) or in
    a directory."""
    if wal == "block":
        return BrokerProcess(tmp_path / "data")
    if wal == "device":
        server = DeviceServer(
            open_device(tmp_path / "device-wal", DEVICE_BYTES), str(tmp_path / "wal.sock")
        ).start()
        request.addfinalizer(server.stop)
        return BrokerProcess(
            tmp_path / "data",
            f"s3.wal.path=0@device://{server.address}",
            f"s3.wal.capacity={DEVICE_BYTES}",
        )
    if wal == "dir":
        return BrokerProcess(tmp_path / "data", f"s3.wal.path=0@dir://{tmp_path / 'wal'}")
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    bucket = fresh_bucket()

    async def create() -> None:
        store = await moto_store(moto, bucket)
        await store.close()

    asyncio.run(create())
    path = f"0@s3://{bucket}?region={moto.region}&endpoint={moto.endpoint_url}&batchInterval=250"
    credentials = {
        "AWS_ACCESS_KEY_ID": moto.access_key_id,
        "AWS_SECRET_ACCESS_KEY": moto.secret_access_key,
    }
    return BrokerProcess(tmp_path / "data", f"s3.wal.path={path}", env=credentials)


@pytest.mark.parametrize(
    ("how", "wal"),
    [
        ("graceful", "block"),
        ("sigkill", "block"),
        ("graceful", "s3"),
        ("sigkill", "s3"),
        ("sigkill", "dir"),
        ("sigkill", "device"),
    ],
)
def test_no_acknowledged_record_is_lost_across_a_restart(
    tmp_path: Path, how: str, wal: str, request: pytest.FixtureRequest
) -> None:
    broker = wal_broker(tmp_path, wal, request)
    broker.start()
    topic = f"restart-{how}"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
        acknowledged: dict[int, list[bytes]] = {index: [] for index in range(PARTITIONS)}
        lock = threading.Lock()

        def delivered(error: object, message: object) -> None:
            if error is None:
                with lock:
                    acknowledged[message.partition()].append(message.value())  # type: ignore[attr-defined]

        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 60000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        stop = threading.Event()

        def produce() -> None:
            index = 0
            while not stop.is_set():
                try:
                    producer.produce(
                        topic,
                        value=f"value-{index}".encode(),
                        partition=index % PARTITIONS,
                        on_delivery=delivered,
                    )
                except BufferError:  # the queue is full (the broker is down, or slow): wait
                    producer.poll(0.1)
                    continue
                producer.poll(0)
                index += 1
                if index % 200 == 0:
                    time.sleep(0.01)

        def total() -> int:
            with lock:
                return sum(len(values) for values in acknowledged.values())

        thread = threading.Thread(target=produce)
        thread.start()
        # Stopped mid-stream once it has carried something (on a busy machine that can take
        # longer than the 1.5 s).
        time.sleep(1.5)
        wait_until(lambda: total() > 100, "more than 100 acknowledgements")
        if how == "graceful":
            assert broker.stop() == 0
        else:
            broker.kill()
        time.sleep(0.5)
        broker.start()
        time.sleep(1.5)
        stop.set()
        thread.join()
        assert producer.flush(PATIENCE_S) == 0
        read = read_everything(broker.bootstrap, topic)
        assert total() > 100, f"only {total()} acknowledged: the test did not exercise much"
        for index in range(PARTITIONS):
            got = read[index]
            missing = set(acknowledged[index]) - set(got)
            assert not missing, f"partition {index}: {len(missing)} acknowledged values lost"
            assert len(got) == len(set(got)), f"partition {index}: duplicates"
            order = {value: position for position, value in enumerate(got)}
            positions = [order[value] for value in acknowledged[index]]
            assert positions == sorted(positions), f"partition {index}: out of order"
    finally:
        if broker.alive():
            broker.stop()
