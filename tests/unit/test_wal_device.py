"""The WAL device process: its reservation rules, the fence it enforces on a preempted writer,
and the block WAL's failover over it (a survivor's takeover, a zombie's appends refused)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_ref.config import BrokerConfig, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.io.storage.block_device import FileBlockDevice, ReservationConflictError
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.io.storage.wal import AppendResult
from automq_ref.io.storage.wal_block import BlockWal, WalFencedError, WalIOError
from automq_ref.io.storage.wal_device import (
    Conflict,
    DeviceServer,
    RegistrantKey,
    RemoteBlockDevice,
    Reservations,
    serving,
)
from automq_ref.node import open_wal, start_node
from tests.waiting import PATIENCE_S

SIZE = 16 << 20
MAX_WRITE = 64 * 1024
OWNER = RegistrantKey(1, 5)
SURVIVOR = RegistrantKey(1, 5, failover=True)
NEXT_EPOCH = RegistrantKey(1, 6)


@pytest.fixture(params=["unix", "tcp"])
def device(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DeviceServer]:
    """A device server on a file, on a Unix socket or a free loopback port."""
    listen = str(tmp_path / "wal.sock") if request.param == "unix" else "127.0.0.1:0"
    with serving(tmp_path / "wal", SIZE, listen) as server:
        yield server


# ------------------------------------------------------------------- the rules, apart


def test_acquire_is_granted_to_one_registrant_at_a_time() -> None:
    rules = Reservations()
    with pytest.raises(Conflict, match="not a registrant"):
        rules.acquire(OWNER)
    rules.register(OWNER)
    rules.register(SURVIVOR)
    rules.acquire(OWNER)
    rules.acquire(OWNER)  # the holder acquiring again is granted
    with pytest.raises(Conflict, match="held by node 1 epoch 5"):
        rules.acquire(SURVIVOR)
    rules.check_write(OWNER)
    with pytest.raises(Conflict, match="does not hold"):
        rules.check_write(SURVIVOR)


def test_preempt_moves_the_reservation_and_removes_the_victim() -> None:
    rules = Reservations()
    rules.register(OWNER)
    rules.acquire(OWNER)
    rules.register(SURVIVOR)
    rules.preempt(SURVIVOR, OWNER)
    assert rules.report().holder == SURVIVOR
    assert rules.report().registrants == (SURVIVOR,)
    with pytest.raises(Conflict, match="no longer registered"):
        rules.check_write(OWNER)
    # A preempt naming a key that is gone is refused: it is a compare-and-swap.
    rules.register(NEXT_EPOCH)
    with pytest.raises(Conflict, match="not registered"):
        rules.preempt(NEXT_EPOCH, OWNER)
    assert rules.report().holder == SURVIVOR
    # Preempting a registrant that does not hold the reservation only removes it.
    rules.register(OWNER)
    rules.preempt(NEXT_EPOCH, OWNER)
    assert rules.report() == rules.report().__class__(SURVIVOR, (SURVIVOR, NEXT_EPOCH))


def test_release_and_unregister() -> None:
    rules = Reservations()
    rules.register(OWNER)
    rules.register(SURVIVOR)
    rules.acquire(OWNER)
    rules.release(SURVIVOR)  # not the holder: no effect
    assert rules.holder == OWNER
    rules.release(OWNER)
    assert rules.holder is None
    # Nobody holds it: this device then refuses every write (NVMe would let anyone write).
    with pytest.raises(Conflict, match="does not hold"):
        rules.check_write(OWNER)
    rules.acquire(SURVIVOR)
    rules.unregister(SURVIVOR)
    assert rules.holder is None and rules.report().registrants == (OWNER,)
    with pytest.raises(Conflict, match="an unregistered host"):
        rules.check_write(None)


# ------------------------------------------------------------------- over the socket


def test_a_preempted_writer_is_refused_but_still_reads(device: DeviceServer) -> None:
    owner = RemoteBlockDevice(device.address)
    survivor = RemoteBlockDevice(device.address)
    reader = RemoteBlockDevice(device.address)  # never registers
    try:
        assert owner.size_bytes == SIZE
        with pytest.raises(ReservationConflictError, match="unregistered"):
            owner.write([b"x" * 10], 0)
        owner.register(OWNER)
        owner.acquire()
        owner.write([b"abc", b"def"], 4096)
        owner.sync()
        survivor.register(SURVIVOR)
        with pytest.raises(ReservationConflictError, match="held by node 1 epoch 5"):
            survivor.acquire()
        with pytest.raises(ReservationConflictError):
            survivor.write([b"no"], 0)
        survivor.preempt(OWNER)
        assert survivor.report().holder == SURVIVOR
        with pytest.raises(ReservationConflictError, match="no longer registered"):
            owner.write([b"zombie"], 4096)
        with pytest.raises(ReservationConflictError):
            owner.sync()
        # Write Exclusive: everyone still reads, and the zombie's write did not land.
        assert owner.read(6, 4096) == b"abcdef"
        assert reader.read(6, 4096) == b"abcdef"
        survivor.write([b"ghi"], 4096)
        survivor.sync()
        assert reader.read(6, 4096) == b"ghidef"
        survivor.close()  # releases
        assert reader.report().holder is None
    finally:
        for client in (owner, survivor, reader):
            client.abandon()


def test_a_dead_owners_registration_outlives_its_connection(device: DeviceServer) -> None:
    owner = RemoteBlockDevice(device.address)
    owner.register(OWNER)
    owner.acquire()
    owner.abandon()  # the process died: nothing released
    survivor = RemoteBlockDevice(device.address)
    try:
        assert survivor.report().holder == OWNER
        survivor.register(SURVIVOR)
        survivor.preempt(OWNER)
        survivor.write([b"x"], 0)
    finally:
        survivor.close()


# ------------------------------------------------------------------- the block WAL on it


async def open_remote(
    server: DeviceServer, key: RegistrantKey, *, take_over: bool = False
) -> BlockWal:
    if take_over:
        assert key.failover
        return await BlockWal.take_over(
            server.address,
            node_id=key.node_id,
            node_epoch=key.node_epoch,
            max_write_bytes=MAX_WRITE,
        )
    return await BlockWal.open_remote(
        server.address,
        node_id=key.node_id,
        node_epoch=key.node_epoch,
        failover=key.failover,
        max_write_bytes=MAX_WRITE,
    )


async def ready(wal: BlockWal) -> list[bytes]:
    bodies = [record.body async for record in wal.recover()]
    await wal.reset()
    return bodies


async def test_a_survivor_takes_the_wal_over_and_the_zombie_acknowledges_nothing(
    device: DeviceServer,
) -> None:
    owner = await open_remote(device, OWNER)
    await ready(owner)
    acknowledged = [await owner.append(b"before-%d" % i) for i in range(20)]
    await owner.trim(acknowledged[4].next_offset)
    survivor = await open_remote(device, SURVIVOR, take_over=True)
    # The zombie resumes: its appends, queued or new, its trims and resets are all refused.
    queued = [owner.submit(b"zombie-%d" % i) for i in range(5)]
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert all(isinstance(result, WalFencedError) for result in results), results
    assert owner.fenced
    with pytest.raises(WalFencedError):
        owner.submit(b"later")
    with pytest.raises(WalFencedError):
        await owner.trim(acknowledged[-1].next_offset)
    # The survivor finds exactly the acknowledged, untrimmed records.
    assert await ready(survivor) == [b"before-%d" % i for i in range(5, 20)]
    await survivor.append(b"survivor")
    await survivor.close()
    await owner.close()
    # The node's next epoch finds only what was written after the survivor's reset.
    restarted = await open_remote(device, NEXT_EPOCH)
    assert await ready(restarted) == [b"survivor"]
    await restarted.close()


def test_a_paused_zombie_resumes_after_the_takeover_and_acknowledges_nothing_more(
    device: DeviceServer,
) -> None:
    """The owner's loop stands still (SIGSTOP) with ten appends queued, two groups in flight;
    a survivor takes over from another thread; the owner resumes."""
    loop = asyncio.new_event_loop()
    try:
        owner = loop.run_until_complete(open_remote(device, OWNER))
        loop.run_until_complete(ready(owner))
        bodies = [b"%d" % i * 30_000 for i in range(10)]  # two to a group

        async def submit() -> list[asyncio.Future[AppendResult]]:
            futures = [owner.submit(body) for body in bodies]
            await asyncio.sleep(0)  # the writer hands the first groups to its I/O thread
            return futures

        futures = loop.run_until_complete(submit())

        async def survive() -> list[bytes]:
            survivor = await open_remote(device, SURVIVOR, take_over=True)
            found = await ready(survivor)
            await survivor.close()
            return found

        found = asyncio.run(survive())  # the owner's loop is not running meanwhile

        async def settle() -> list[object]:
            return await asyncio.gather(*futures, return_exceptions=True)

        outcomes = loop.run_until_complete(settle())
        acknowledged = [
            b for b, o in zip(bodies, outcomes, strict=True) if not isinstance(o, Exception)
        ]
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert refused and all(isinstance(o, WalFencedError) for o in refused), outcomes
        # Whatever the zombie acknowledged was flushed before the preempt: the survivor has it.
        assert found[: len(acknowledged)] == acknowledged
        assert found == bodies[: len(found)]
        loop.run_until_complete(owner.close())
    finally:
        loop.close()


async def test_takeover_refusals(device: DeviceServer) -> None:
    owner = await open_remote(device, NEXT_EPOCH)
    await ready(owner)
    # The node already runs a newer epoch than the failover names.
    with pytest.raises(WalFencedError, match="newer than epoch 5"):
        await open_remote(device, SURVIVOR, take_over=True)
    with pytest.raises(WalFencedError, match="reserved by node 1"):
        await BlockWal.take_over(device.address, node_id=2, node_epoch=9)
    assert (await owner.append(b"still mine")).next_offset > 0
    await owner.close()
    # Taken over at epoch 7: the node itself may not come back at epoch 7, only later.
    survivor = await open_remote(device, RegistrantKey(1, 7, failover=True), take_over=True)
    await ready(survivor)
    with pytest.raises(WalFencedError, match="taken over at epoch 7"):
        await open_remote(device, RegistrantKey(1, 7))
    # A newer epoch of the node preempts the survivor, which is fenced in turn.
    restarted = await open_remote(device, RegistrantKey(1, 8))
    with pytest.raises(WalFencedError):
        await survivor.append(b"late survivor")
    await ready(restarted)
    await restarted.close()
    await survivor.close()


async def test_a_lost_device_fails_the_wal(tmp_path: Path) -> None:
    with pytest.raises(WalIOError, match="WAL device"):
        await BlockWal.open_remote(str(tmp_path / "absent.sock"), node_id=1, node_epoch=1)
    server = DeviceServer(FileBlockDevice(tmp_path / "wal", SIZE), str(tmp_path / "wal.sock"))
    server.start()
    wal = await open_remote(server, OWNER)
    await ready(wal)
    await wal.append(b"one")
    server.stop()
    with pytest.raises(WalIOError):
        await wal.append(b"two")
    assert not wal.fenced
    await wal.close()


# ------------------------------------------------------------------- s3.wal.path


@pytest.mark.parametrize(
    ("path", "address"),
    [
        ("0@device://127.0.0.1:7001", "127.0.0.1:7001"),
        ("0@device:///run/automq/wal.sock", "/run/automq/wal.sock"),
        ("0@file:///dev/loop7", None),
        ("/var/wal", None),
        ("", None),
    ],
)
def test_the_device_scheme_of_s3_wal_path(path: str, address: str | None) -> None:
    config = BrokerConfig.model_validate({"s3.wal.path": path, "log.dirs": "/data"})
    assert config.wal_device == address
    assert config.object_wal is None
    if address is not None:
        assert config.wal_file == Path("/data/wal")


@pytest.mark.parametrize(
    "path", ["0@device://127.0.0.1", "0@device://:80", "0@device://h:7?x=1", "0@tape://x"]
)
def test_a_bad_device_path_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"device|scheme"):
        BrokerConfig.model_validate({"s3.wal.path": path})


async def test_the_node_opens_its_wal_on_the_device(device: DeviceServer) -> None:
    path = "0@device://" + device.address  # 0@device:///SOCKET or 0@device://HOST:PORT
    config = BrokerConfig.model_validate(
        {"s3.wal.path": path, "node.id": 1, "s3.wal.capacity": SIZE}
    )
    wal = await open_wal(config, 3)
    assert isinstance(wal, BlockWal)
    async for _ in wal.recover():
        pass
    await wal.reset()
    await wal.append(b"node")
    assert device.reservations.report().holder == RegistrantKey(1, 3)
    await wal.close()


# ------------------------------------------------------------------- the process


def test_the_device_runs_as_a_process_and_outlives_its_owner(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "automq_ref.io.storage.wal_device",
            "--path",
            str(tmp_path / "wal"),
            "--size",
            str(SIZE),
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("wal-device listening 127.0.0.1:"), line
        address = line.split()[-1]

        async def scenario() -> None:
            owner = await BlockWal.open_remote(address, node_id=4, node_epoch=1)
            await ready(owner)
            done = [await owner.append(b"r%d" % i) for i in range(3)]
            assert done
            survivor = await BlockWal.take_over(address, node_id=4, node_epoch=1)
            with pytest.raises(WalFencedError):
                await owner.append(b"zombie")
            assert await ready(survivor) == [b"r0", b"r1", b"r2"]
            await survivor.close()
            await owner.close()

        asyncio.run(scenario())
        process.send_signal(signal.SIGTERM)
        assert process.wait(PATIENCE_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ------------------------------------------------------------------- a broker on it


async def test_a_fenced_partition_answers_a_retry_with_an_error_not_as_a_duplicate(
    tmp_path: Path,
) -> None:
    """The producer state remembers a batch when it is queued; once its WAL write is refused,
    the client's retry of that batch must not be answered with the batch's offset (which
    would acknowledge a record that was never durable)."""
    server = DeviceServer(FileBlockDevice(tmp_path / "wal", SIZE), str(tmp_path / "wal.sock"))
    server.start()
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path / 'data'}",
            f"s3.wal.path=0@device://{server.address}",
            f"s3.wal.capacity={SIZE}",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        await node.topics.create_topic("fenced", 1, {})
        partition = node.topics.partitions[("fenced", 0)]

        def batch(sequence: int) -> bytes:
            return build_record_batch(
                [(b"k", b"v%d" % sequence, (), 0)],
                producer_id=9,
                producer_epoch=0,
                base_sequence=sequence,
            )

        first = partition.append_nowait(batch(0), 1 << 20)
        assert first.error is KafkaErrorCode.NONE and first.durable is not None
        await first.durable
        holder = server.reservations.holder
        assert holder is not None
        survivor = RemoteBlockDevice(server.address)
        survivor.register(RegistrantKey(holder.node_id, holder.node_epoch, failover=True))
        survivor.preempt(holder)
        second = partition.append_nowait(batch(1), 1 << 20)
        assert second.durable is not None
        with pytest.raises(StorageError):
            await second.durable
        retry = partition.append_nowait(batch(1), 1 << 20)
        assert retry.error is KafkaErrorCode.KAFKA_STORAGE_ERROR, retry
        survivor.close()
    finally:
        with contextlib.suppress(Exception):
            await node.shutdown()
        server.stop()
