"""Object WAL: batching into aligned objects, recovery by listing, trim, reset, the reservation
and fencing, the takeover, and faults of the store (503s, ambiguous PUTs, crashes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from automq_ref.checker.object_faults import FaultyObjectStore
from automq_ref.checker.proxies import S3FaultProxy
from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE, Reservation, WalObjectHeader
from automq_ref.formats.wal_record import WAL_RECORD_HEADER_SIZE
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectStore
from automq_ref.io.storage.wal import (
    AppendResult,
    RecoveredRecord,
    WalFencedError,
    WalIOError,
    WalOverCapacityError,
    WalRecordTooLargeError,
    WalStateError,
    WriteAheadLog,
)
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_object import (
    DATA_ALIGN_BYTES,
    ObjectWal,
    ObjectWalConfig,
    OpenMode,
)
from automq_ref.vocabulary.naming import wal_object_key, wal_objects_prefix, wal_reservation_key
from tests.conftest import MotoS3
from tests.unit.test_object_store import fresh_bucket, moto_store
from tests.waiting import PATIENCE_S

NAMESPACE = "_kafka_test"
NODE_ID = 3
CONFIG = ObjectWalConfig(
    batch_interval_ms=5,
    max_bytes_in_batch=4096,
    max_inflight_uploads=4,
    retry_base_s=0.001,
    retry_max_s=0.01,
)
MIB = 1024 * 1024


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    async with LocalDirectoryObjectStore(tmp_path / "objects", fsync=False) as opened:
        yield opened


async def open_wal(
    store: ObjectStore,
    epoch: int,
    *,
    config: ObjectWalConfig = CONFIG,
    mode: OpenMode = OpenMode.READ_WRITE,
) -> tuple[ObjectWal, list[RecoveredRecord]]:
    wal = await ObjectWal.open(
        store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=epoch, config=config, mode=mode
    )
    return wal, [record async for record in wal.recover()]


async def ready(store: ObjectStore, epoch: int, **options: object) -> ObjectWal:
    wal, _ = await open_wal(store, epoch, **options)  # type: ignore[arg-type]
    await wal.reset()
    return wal


def body(index: int, size: int = 1000) -> bytes:
    return index.to_bytes(4, "big") * (size // 4)


async def keys(store: ObjectStore) -> list[str]:
    return [info.key for info in await store.list(wal_objects_prefix(NAMESPACE, NODE_ID))]


def key(epoch: int, start: int) -> str:
    return wal_object_key(NAMESPACE, NODE_ID, epoch, start, start + DATA_ALIGN_BYTES)


def _both_wals_satisfy_the_interface(block: BlockWal, objects: ObjectWal) -> list[WriteAheadLog]:
    return [block, objects]  # checked by mypy


# ------------------------------------------------------------------------- layout


async def test_appends_batch_into_objects_at_64_mib_boundaries(store: ObjectStore) -> None:
    wal = await ready(store, 1)
    results = await asyncio.gather(*(wal.append(body(i)) for i in range(10)))
    # maxBytesInBatch 4096: a bulk is sealed once it holds more, so five records per object.
    record = WAL_RECORD_HEADER_SIZE + 1000
    assert results[:5] == [
        AppendResult(0, record),
        AppendResult(record, 2 * record),
        AppendResult(2 * record, 3 * record),
        AppendResult(3 * record, 4 * record),
        AppendResult(4 * record, DATA_ALIGN_BYTES),  # the last record ends at the boundary
    ]
    assert results[5] == AppendResult(DATA_ALIGN_BYTES, DATA_ALIGN_BYTES + record)
    assert results[9].next_offset == 2 * DATA_ALIGN_BYTES
    assert await keys(store) == [key(1, 0), key(1, DATA_ALIGN_BYTES)]
    data = await store.get(key(1, 0))
    header = WalObjectHeader.decode(data)
    assert header == WalObjectHeader(0, 5 * record, NODE_ID, 1, 0)
    assert len(data) == WAL_OBJECT_HEADER_SIZE + 5 * record
    assert wal.confirm_offset == 2 * DATA_ALIGN_BYTES
    await wal.close()

    wal, recovered = await open_wal(store, 2)
    assert [(r.record_offset, r.next_offset) for r in recovered] == [
        (r.record_offset, r.next_offset) for r in results
    ]
    assert [r.body for r in recovered] == [body(i) for i in range(10)]
    await wal.reset()
    await wal.close()
    wal, recovered = await open_wal(store, 3)
    assert recovered == []
    await wal.close()


async def test_the_wal_object_key_is_automq_s(store: ObjectStore) -> None:
    assert wal_object_key("_kafka_c", 1, 7, 0, DATA_ALIGN_BYTES) == (
        "C4CA4238A0B923820DCC509A6F75849B/_kafka_c/1/7/wal/0-67108864"  # MD5("1")
    )
    assert wal_reservation_key("_kafka_c", 1) == "reservation/_kafka_c/1"


async def test_appends_of_one_tick_share_one_object(store: ObjectStore) -> None:
    wal = await ready(store, 1, config=ObjectWalConfig(batch_interval_ms=60_000))
    futures = [wal.submit(body(i, 100)) for i in range(20)]
    await asyncio.gather(*futures)
    assert wal.put_count == 1  # one object (a fresh WAL's reset writes nothing)
    assert wal.verify_count == 1
    await wal.close()


async def test_a_bulk_never_crosses_64_mib(store: ObjectStore) -> None:
    config = ObjectWalConfig(batch_interval_ms=60_000, max_bytes_in_batch=128 * MIB)
    wal = await ready(store, 1, config=config)
    results = await asyncio.gather(*(wal.append(body(i, 40 * MIB)) for i in range(2)))
    assert [r.record_offset for r in results] == [0, DATA_ALIGN_BYTES]
    with pytest.raises(WalRecordTooLargeError):
        wal.submit(bytes(DATA_ALIGN_BYTES))
    with pytest.raises(ValueError):
        wal.submit(b"")
    await wal.close()


async def test_the_reservation_holds_node_epoch_and_mode(store: ObjectStore) -> None:
    wal = await ready(store, 5)
    reservation = await store.get(wal_reservation_key(NAMESPACE, NODE_ID))
    assert Reservation.decode(reservation) == Reservation(NODE_ID, 5, False)
    survivor = await ObjectWal.take_over(store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=5)
    reservation = await store.get(wal_reservation_key(NAMESPACE, NODE_ID))
    assert Reservation.decode(reservation) == Reservation(NODE_ID, 5, True)
    assert survivor.mode is OpenMode.FAILOVER
    await survivor.close()
    await wal.close()


# -------------------------------------------------------------------------- trim


async def test_trim_deletes_whole_objects_below_and_survives_a_restart(store: ObjectStore) -> None:
    wal = await ready(store, 1)
    results = await asyncio.gather(*(wal.append(body(i)) for i in range(15)))
    assert len(await keys(store)) == 3
    await wal.trim(results[2].next_offset)  # inside the first object: nothing deleted
    assert key(1, 0) in await keys(store)
    await wal.trim(results[4].next_offset)  # the first object's end
    assert key(1, 0) not in await keys(store)
    await wal.trim(results[7].next_offset)
    await wal.trim(results[7].next_offset)  # again: nothing to do
    await wal.trim(results[6].next_offset)  # backwards: nothing to do
    with pytest.raises(ValueError):
        await wal.trim(wal.confirm_offset + 1)
    await wal.close()
    wal, recovered = await open_wal(store, 2)
    assert [r.body for r in recovered] == [body(i) for i in range(8, 15)]
    assert [r.record_offset for r in recovered] == [r.record_offset for r in results[8:]]
    await wal.reset()
    # Reset trimmed everything; only the newest object (the anchor) stays.
    assert await keys(store) == [key(2, wal.confirm_offset - DATA_ALIGN_BYTES)]
    next_start = wal.confirm_offset
    await wal.close()
    wal, recovered = await open_wal(store, 3)
    assert recovered == []
    assert wal.next_offset == next_start  # offsets keep growing across restarts
    await wal.close()


# ---------------------------------------------------------------------- recovery


async def test_recovery_stops_at_a_missing_object(store: ObjectStore) -> None:
    wal = await ready(store, 1)
    await asyncio.gather(*(wal.append(body(i)) for i in range(15)))
    await wal.close()
    await store.delete(key(1, DATA_ALIGN_BYTES))
    wal, recovered = await open_wal(store, 2)
    assert [r.body for r in recovered] == [body(i) for i in range(5)]
    await wal.close()


@pytest.mark.parametrize("damage", ["flip-body", "flip-header", "truncate", "bad-object-header"])
async def test_recovery_stops_at_the_first_damaged_record(store: ObjectStore, damage: str) -> None:
    wal = await ready(store, 1)
    await asyncio.gather(*(wal.append(body(i)) for i in range(15)))
    await wal.close()
    data = bytearray(await store.get(key(1, DATA_ALIGN_BYTES)))
    record = WAL_RECORD_HEADER_SIZE + 1000
    third = WAL_OBJECT_HEADER_SIZE + 2 * record
    if damage == "flip-body":
        data[third + WAL_RECORD_HEADER_SIZE + 10] ^= 1
    elif damage == "flip-header":
        data[third + 5] ^= 1
    elif damage == "truncate":
        data = data[: third + 100]
    else:
        data[0] ^= 1
    await store.put(key(1, DATA_ALIGN_BYTES), bytes(data))
    wal, recovered = await open_wal(store, 2)
    survivors = 5 if damage == "bad-object-header" else 7
    assert [r.body for r in recovered] == [body(i) for i in range(survivors)]
    await wal.reset()  # past everything, damaged or not
    await wal.close()
    wal, recovered = await open_wal(store, 3)
    assert recovered == []
    await wal.close()


async def test_recovery_reads_many_objects_ahead(store: ObjectStore) -> None:
    config = ObjectWalConfig(batch_interval_ms=5, max_bytes_in_batch=1, readahead_bytes=3000)
    wal = await ready(store, 1, config=config)
    for index in range(12):  # one object each
        await wal.append(body(index))
    await wal.close()
    wal, recovered = await open_wal(store, 2, config=config)
    assert [r.body for r in recovered] == [body(i) for i in range(12)]
    await wal.close()


async def test_recover_then_reset_then_append_in_order(store: ObjectStore) -> None:
    wal = await ObjectWal.open(store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=1)
    with pytest.raises(WalStateError):
        wal.submit(b"x")
    with pytest.raises(WalStateError):
        await wal.reset()
    assert [r async for r in wal.recover()] == []
    with pytest.raises(WalStateError):
        [r async for r in wal.recover()]
    await wal.reset()
    await wal.close()
    with pytest.raises(WalStateError):
        wal.submit(b"x")


# ----------------------------------------------------------------------- fencing


async def test_a_newer_epoch_fences_the_old_writer(store: ObjectStore) -> None:
    old = await ready(store, 1)
    acknowledged = await old.append(body(0))
    newer, recovered = await open_wal(store, 2)
    assert [r.body for r in recovered] == [body(0)]
    with pytest.raises(WalFencedError):
        await old.append(body(1))
    assert old.fenced
    with pytest.raises(WalFencedError):
        old.submit(body(2))
    with pytest.raises(WalFencedError):
        await old.trim(acknowledged.next_offset)
    await old.close()
    # The old epoch can no longer open its WAL.
    with pytest.raises(WalFencedError):
        await ObjectWal.open(store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=1)
    await newer.reset()
    await newer.close()


async def test_a_takeover_fences_the_writer_and_recovers_what_it_acknowledged(
    store: ObjectStore,
) -> None:
    writer = await ready(store, 7)
    acknowledged = await asyncio.gather(*(writer.append(body(i)) for i in range(8)))
    survivor = await ObjectWal.take_over(
        store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=7, config=CONFIG
    )
    # The zombie keeps appending: nothing it writes after the takeover is acknowledged.
    zombie = await asyncio.gather(
        *(writer.append(body(100 + i)) for i in range(6)), return_exceptions=True
    )
    assert all(isinstance(outcome, WalFencedError) for outcome in zombie), zombie
    recovered = [record async for record in survivor.recover()]
    assert [(r.record_offset, r.next_offset, r.body) for r in recovered] == [
        (a.record_offset, a.next_offset, body(i)) for i, a in enumerate(acknowledged)
    ]
    await survivor.reset()
    await survivor.close()
    await writer.close()
    # The failed epoch cannot reopen its WAL; a restart at a newer epoch starts clean.
    with pytest.raises(WalFencedError):
        await ObjectWal.open(store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=7)
    restarted, recovered = await open_wal(store, 8)
    assert [r.body for r in recovered if r.body in {body(i) for i in range(8)}] == []
    await restarted.reset()
    await restarted.close()
    # ... and a late takeover of the old epoch is refused: the node runs a newer one.
    with pytest.raises(WalFencedError):
        await ObjectWal.take_over(store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=7)


async def test_late_writes_of_a_fenced_epoch_are_deleted_at_open(store: ObjectStore) -> None:
    old = await ready(store, 1)
    await old.append(body(0))
    newer = await ready(store, 2)  # starts at the old epoch's end
    assert newer.confirm_offset == 2 * DATA_ALIGN_BYTES
    with pytest.raises(WalFencedError):
        await old.append(body(1))  # its object lands at 64 MiB under epoch 1, past epoch 2's start
    assert key(1, DATA_ALIGN_BYTES) in await keys(store)
    await newer.close()
    await old.close()
    newest, recovered = await open_wal(store, 3)
    assert key(1, DATA_ALIGN_BYTES) not in await keys(store)
    assert recovered == []
    await newest.close()


# ------------------------------------------------------------------ store faults


async def test_503s_and_ambiguous_puts_are_retried_and_nothing_is_lost(
    store: ObjectStore,
) -> None:
    faulty = FaultyObjectStore(store, seed=3)
    wal = await ready(faulty, 1)
    faulty.set_faults(unavailable_rate=0.4, ambiguous_rate=0.3, operations={"put", "get"})
    results = await asyncio.gather(*(wal.append(body(i)) for i in range(40)))
    assert faulty.injected["unavailable"] > 0 and faulty.injected["ambiguous"] > 0
    faulty.heal()
    await wal.close()
    wal, recovered = await open_wal(store, 2)
    assert [(r.record_offset, r.body) for r in recovered] == [
        (result.record_offset, body(i)) for i, result in enumerate(results)
    ]
    await wal.close()


async def test_a_crash_between_the_upload_and_the_check_acknowledges_nothing(
    store: ObjectStore,
) -> None:
    faulty = FaultyObjectStore(store)
    wal = await ready(faulty, 1)
    puts = faulty.calls["put"]
    faulty.crash_after_operations = 1  # the PUT lands, then the process dies
    with pytest.raises(WalIOError):
        await wal.append(body(0))
    assert faulty.calls["put"] == puts + 1
    with pytest.raises(WalIOError):
        wal.submit(body(1))
    await wal.close()
    # The record landed without being acknowledged: recovery may return it, and does here.
    wal, recovered = await open_wal(store, 2)
    assert [r.body for r in recovered] == [body(0)]
    await wal.close()


async def test_a_store_error_fails_the_wal(store: ObjectStore) -> None:
    faulty = FaultyObjectStore(store)
    wal = await ready(faulty, 1)
    faulty.crash()
    outcomes = await asyncio.gather(
        *(wal.append(body(i)) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(outcome, WalIOError) for outcome in outcomes), outcomes
    await wal.close()


async def test_too_much_unflushed_data_is_refused(store: ObjectStore) -> None:
    faulty = FaultyObjectStore(store)
    config = ObjectWalConfig(batch_interval_ms=5, max_unflushed_bytes=2500)
    wal = await ready(faulty, 1, config=config)
    faulty.set_faults(delay_s=0.05, operations={"put"})
    first = [wal.submit(body(i)) for i in range(2)]
    with pytest.raises(WalOverCapacityError):
        wal.submit(body(2))
    await asyncio.gather(*first)
    await wal.append(body(2))  # room again once the uploads landed
    await wal.close()


async def test_close_uploads_what_is_queued(store: ObjectStore) -> None:
    wal = await ready(store, 1, config=ObjectWalConfig(batch_interval_ms=60_000))
    await wal.append(body(0))  # the first bulk lingers 10 ms only
    futures = [wal.submit(body(i)) for i in range(1, 4)]
    await asyncio.wait_for(wal.close(), PATIENCE_S)
    assert all(future.done() and not future.exception() for future in futures)
    wal, recovered = await open_wal(store, 2)
    assert [r.body for r in recovered] == [body(i) for i in range(4)]
    await wal.close()


# ---------------------------------------------------------------------------- S3


async def test_the_object_wal_on_s3(moto_s3: MotoS3) -> None:
    store = await moto_store(moto_s3)
    try:
        wal = await ready(store, 1)
        results = await asyncio.gather(*(wal.append(body(i)) for i in range(12)))
        await wal.trim(results[4].next_offset)
        await wal.close()
        survivor = await ObjectWal.take_over(
            store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=1, config=CONFIG
        )
        recovered = [record async for record in survivor.recover()]
        assert [r.body for r in recovered] == [body(i) for i in range(5, 12)]
        await survivor.reset()
        await survivor.close()
        wal, recovered = await open_wal(store, 2)
        assert recovered == []
        await wal.close()
    finally:
        await store.close()


async def test_the_object_wal_through_the_s3_fault_proxy(moto_s3: MotoS3) -> None:
    """503 SlowDowns, PUTs that land but answer 500 or are cut, and latency, on the wire: every
    append is acknowledged once its object landed, and recovery returns each exactly once."""
    proxy = S3FaultProxy(moto_s3.endpoint_url, seed=11)
    proxy.start()
    bucket = fresh_bucket()
    proxied = await moto_store(
        moto_s3, bucket, endpoint_url=proxy.url, max_attempts=2, path_style=True
    )
    try:
        wal = await ready(proxied, 1)
        proxy.set_faults(error_rate=0.3, ambiguous_rate=0.2, latency_s=0.01)
        results = await asyncio.gather(*(wal.append(body(i)) for i in range(30)))
        stats = proxy.stats
        assert stats["errors_injected"] > 0 and stats["ambiguous_injected"] > 0, stats
        proxy.heal()
        await wal.close()
    finally:
        await proxied.close()
        proxy.stop()
    direct = await moto_store(moto_s3, bucket)
    try:
        wal, recovered = await open_wal(direct, 2)
        assert [(r.record_offset, r.body) for r in recovered] == [
            (result.record_offset, body(i)) for i, result in enumerate(results)
        ]
        await wal.close()
    finally:
        await direct.close()


async def test_a_directory_shared_by_two_brokers(tmp_path: Path) -> None:
    """Two brokers' WALs in one directory (as on a shared file system: each broker has its own
    store over the same root); the second takes the first's WAL over after it died."""
    shared = tmp_path / "shared-wal"
    first_store = LocalDirectoryObjectStore(shared)
    second_store = LocalDirectoryObjectStore(shared)
    try:
        first = await ObjectWal.open(first_store, namespace=NAMESPACE, node_id=1, node_epoch=3)
        second = await ObjectWal.open(second_store, namespace=NAMESPACE, node_id=2, node_epoch=4)
        for wal in (first, second):
            assert [r async for r in wal.recover()] == []
            await wal.reset()
        acknowledged = await asyncio.gather(*(first.append(body(i)) for i in range(6)))
        await second.append(body(99))
        # The first broker dies (nothing more reaches the directory); the second takes over.
        survivor = await ObjectWal.take_over(
            second_store, namespace=NAMESPACE, node_id=1, node_epoch=3
        )
        recovered = [r async for r in survivor.recover()]
        assert [(r.record_offset, r.body) for r in recovered] == [
            (a.record_offset, body(i)) for i, a in enumerate(acknowledged)
        ]
        await survivor.reset()
        await survivor.close()
        with pytest.raises(WalFencedError):
            await first.append(body(7))
        await first.close()
        await second.close()
    finally:
        await first_store.close()
        await second_store.close()
