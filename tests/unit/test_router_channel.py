"""RouterChannel: appends acknowledged once durable, reads by a ranged GET without listing (the
owner's fresh records from its cache), route epochs and trim, fencing by reservation, a
restart that keeps the channel, and the errors of a trimmed or damaged record; on a local
directory and on S3 (moto)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from automq_ref.formats.wal_object import WAL_OBJECT_HEADER_SIZE
from automq_ref.formats.wal_record import WAL_RECORD_HEADER_SIZE
from automq_ref.formats.zone_router import ChannelOffset, LinkRecord, RecordOffset
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectStore
from automq_ref.io.storage.router_channel import (
    ChannelLinkResolver,
    ChannelRecordCorruptError,
    ChannelRecordGoneError,
    RouterChannel,
    RouterChannelError,
    RouterChannelReader,
    channel_object_key,
)
from automq_ref.io.storage.wal import WalFencedError
from automq_ref.io.storage.wal_object import DATA_ALIGN_BYTES, ObjectWal, ObjectWalConfig
from automq_ref.vocabulary.naming import (
    ROUTER_CHANNEL_WAL_TYPE,
    wal_object_key,
    wal_objects_prefix,
    wal_reservation_key,
)
from tests.conftest import MotoS3
from tests.unit.test_object_store import moto_store

NAMESPACE = "_kafka_test"
NODE_ID = 2
CHANNEL_ID = 0
CONFIG = ObjectWalConfig(
    batch_interval_ms=5, max_bytes_in_batch=4096, retry_base_s=0.001, retry_max_s=0.01
)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def now_ms(self) -> int:
        return int(self.now_s * 1000)

    def monotonic_s(self) -> float:
        return self.now_s


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    async with LocalDirectoryObjectStore(tmp_path / "objects", fsync=False) as opened:
        yield opened


async def open_channel(
    store: ObjectStore,
    epoch: int = 1,
    *,
    clock: FakeClock | None = None,
    with_reader: RouterChannelReader | None = None,
    cache_max_bytes: int = 1 << 20,
    route_epoch: int = 0,
) -> RouterChannel:
    return await RouterChannel.open(
        store,
        namespace=NAMESPACE,
        node_id=NODE_ID,
        node_epoch=epoch,
        channel_id=CHANNEL_ID,
        config=CONFIG,
        clock=clock,
        reader=with_reader,
        cache_max_bytes=cache_max_bytes,
        route_epoch=route_epoch,
    )


def reader(store: ObjectStore) -> RouterChannelReader:
    return RouterChannelReader({CHANNEL_ID: store}, NAMESPACE)


def payload(index: int, size: int = 300) -> bytes:
    return bytes([index % 251]) * size


async def channel_keys(store: ObjectStore) -> list[str]:
    prefix = wal_objects_prefix(NAMESPACE, NODE_ID, ROUTER_CHANNEL_WAL_TYPE)
    return [info.key for info in await store.list(prefix)]


# ------------------------------------------------------------------------------- layout


def test_channel_keys_carry_the_type_and_data_wal_keys_do_not_change() -> None:
    assert wal_object_key("_kafka_c", 1, 7, 0, DATA_ALIGN_BYTES, "rc") == (
        "C4CA4238A0B923820DCC509A6F75849B/_kafka_c/1_rc/7/wal/0-67108864"  # MD5("1")
    )
    assert wal_object_key("_kafka_c", 1, 7, 0, DATA_ALIGN_BYTES) == (
        "C4CA4238A0B923820DCC509A6F75849B/_kafka_c/1/7/wal/0-67108864"
    )
    assert wal_reservation_key("_kafka_c", 1, "rc") == "reservation/_kafka_c/1_rc"
    assert wal_reservation_key("_kafka_c", 1) == "reservation/_kafka_c/1"
    offset = RecordOffset(7, DATA_ALIGN_BYTES + 99, 50)
    assert channel_object_key("_kafka_c", 1, offset) == wal_object_key(
        "_kafka_c", 1, 7, DATA_ALIGN_BYTES, 2 * DATA_ALIGN_BYTES, "rc"
    )
    with pytest.raises(ValueError, match="WAL type"):
        wal_objects_prefix("_kafka_c", 1, "r/c")


async def test_append_returns_the_epoch_and_a_channel_offset_another_node_reads(
    store: ObjectStore, tmp_path: Path
) -> None:
    channel = await open_channel(store, epoch=3)
    results = await asyncio.gather(*(channel.append(5, i, payload(i)) for i in range(12)))
    for index, (epoch, offset) in enumerate(results):
        assert epoch == 0
        assert (offset.channel_id, offset.order_hint, offset.channel_owner) == (0, index, NODE_ID)
        assert offset.target_node_id == 5
        assert offset.record_offset.epoch == 3
        # The WAL record: its header and a StreamRecordBatch (33 bytes) carrying the payload.
        assert offset.record_offset.size == WAL_RECORD_HEADER_SIZE + 33 + 300
        assert ChannelOffset.decode(offset.encode()) == offset
    assert all(k.split("/")[2] == f"{NODE_ID}_rc" for k in await channel_keys(store))
    # Another node: its own store over the same bucket, no reservation taken, no listing.
    async with LocalDirectoryObjectStore(tmp_path / "objects", fsync=False) as other_store:
        other = reader(other_store)
        read = await asyncio.gather(*(other.read(offset) for _, offset in results))
        assert read == [payload(i) for i in range(12)]
        assert other.get_count == 12
    assert await store.get(wal_reservation_key(NAMESPACE, NODE_ID, "rc"))
    await channel.close()


async def test_the_owner_reads_fresh_records_from_its_cache(store: ObjectStore) -> None:
    clock = FakeClock()
    counting = reader(store)
    channel = await open_channel(store, clock=clock, with_reader=counting)
    _, offset = await channel.append(4, 1, payload(1))
    assert await channel.read(offset) == payload(1)
    assert counting.get_count == 0
    clock.now_s += 10.0  # the payload stays cached for 10 s
    assert await channel.read(offset) == payload(1)
    assert counting.get_count == 1
    await channel.close()


async def test_the_cache_is_bounded_in_bytes(store: ObjectStore) -> None:
    counting = reader(store)
    channel = await open_channel(store, with_reader=counting, cache_max_bytes=1000)
    offsets = [(await channel.append(4, 0, payload(i)))[1] for i in range(5)]
    assert [await channel.read(o) for o in offsets] == [payload(i) for i in range(5)]
    assert counting.get_count == 2  # 5 x 300 bytes in a 1000-byte cache: the oldest two went
    await channel.close()


# ------------------------------------------------------------------------ epochs, trim


async def test_trim_removes_the_epochs_every_node_committed(store: ObjectStore) -> None:
    channel = await open_channel(store)
    by_epoch: dict[int, list[ChannelOffset]] = {}
    for route_epoch in (1, 2, 3):
        channel.next_epoch(route_epoch)
        for i in range(3):
            epoch, offset = await channel.append(7, i, payload(i, 2000))
            assert epoch == route_epoch
            by_epoch.setdefault(epoch, []).append(offset)
    channel.next_epoch(2)  # an older epoch changes nothing
    assert channel.route_epoch == 3
    assert sorted(channel.epoch_ends) == [1, 2, 3]
    await channel.trim(0)  # nothing of epoch 0
    assert sorted(channel.epoch_ends) == [1, 2, 3]
    await channel.trim(2)
    assert sorted(channel.epoch_ends) == [3]
    other = reader(store)
    for offset in by_epoch[1] + by_epoch[2]:
        with pytest.raises(ChannelRecordGoneError, match="trimmed"):
            await other.read(offset)
    assert [await other.read(o) for o in by_epoch[3]] == [payload(i, 2000) for i in range(3)]
    await channel.close()


async def test_a_restart_keeps_the_channel_until_its_epoch_is_committed(
    store: ObjectStore,
) -> None:
    channel = await open_channel(store, epoch=1)
    channel.next_epoch(4)
    _, old = await channel.append(7, 0, payload(0))
    await channel.close()
    # The new incarnation knows route epoch 5; it appends before it learns a newer one.
    restarted = await open_channel(store, epoch=2, route_epoch=5)
    assert await reader(store).read(old) == payload(0)
    epoch, new = await restarted.append(7, 0, payload(1))
    assert epoch == 5
    assert new.record_offset.epoch == 2 and new.record_offset.offset > old.record_offset.offset
    await restarted.trim(4)  # what it inherited counts as of epoch 5: kept
    assert await reader(store).read(old) == payload(0)
    restarted.next_epoch(6)
    await restarted.append(7, 0, payload(2))
    await restarted.trim(5)
    with pytest.raises(ChannelRecordGoneError):
        await reader(store).read(old)
    with pytest.raises(ChannelRecordGoneError):
        await reader(store).read(new)
    await restarted.close()


async def test_a_lagging_restart_cannot_trim_what_it_inherited(store: ObjectStore) -> None:
    """An earlier incarnation wrote under route epoch 5; the new one opens knowing 5 but its
    first appends are tagged 5 too, never lower: committed 3 trims nothing."""
    channel = await open_channel(store, epoch=1, route_epoch=5)
    _, old = await channel.append(7, 0, payload(0))
    await channel.close()
    restarted = await open_channel(store, epoch=2, route_epoch=5)
    restarted.next_epoch(3)  # a stale epoch changes nothing
    assert (await restarted.append(7, 0, payload(1)))[0] == 5
    await restarted.trim(3)
    assert await reader(store).read(old) == payload(0)
    await restarted.close()


# --------------------------------------------------------------------------- fencing


async def test_a_newer_epoch_of_the_node_fences_the_channel_not_the_data_wal(
    store: ObjectStore,
) -> None:
    data_wal = await ObjectWal.open(
        store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=1, config=CONFIG
    )
    assert [r async for r in data_wal.recover()] == []
    await data_wal.reset()
    old = await open_channel(store, epoch=1)
    _, acknowledged = await old.append(7, 0, payload(0))
    newer = await open_channel(store, epoch=2)
    with pytest.raises(WalFencedError):
        await old.append(7, 0, payload(1))
    # What the old writer acknowledged stays readable; the data WAL is untouched.
    assert await newer.read(acknowledged) == payload(0)
    await data_wal.append(b"still mine")
    with pytest.raises(WalFencedError):
        await open_channel(store, epoch=1)
    await old.close()
    await newer.close()
    await data_wal.close()


# ---------------------------------------------------------------------------- errors


async def test_damaged_or_misplaced_records_are_refused(store: ObjectStore) -> None:
    channel = await open_channel(store)
    (_, offset), (_, second) = await asyncio.gather(
        channel.append(7, 0, payload(0)), channel.append(7, 0, payload(1))
    )
    await channel.close()
    other = reader(store)
    where = offset.record_offset
    with pytest.raises(ChannelRecordCorruptError, match="333 body bytes, the offset says 334"):
        await other.read(replace(offset, record_offset=replace(where, size=where.size + 1)))
    with pytest.raises(ChannelRecordCorruptError, match=r"body offset|CRC"):
        await other.read(replace(offset, record_offset=replace(where, offset=where.offset + 1)))
    with pytest.raises(ChannelRecordCorruptError, match="for node 7"):
        await other.read(replace(offset, target_node_id=8))
    with pytest.raises(ChannelRecordGoneError):
        await other.read(replace(offset, record_offset=replace(where, epoch=9)))
    with pytest.raises(ChannelRecordCorruptError, match="past the end"):
        far = replace(where, offset=where.offset + 10_000)
        await other.read(replace(offset, record_offset=far))
    with pytest.raises(RouterChannelError, match="no channel with id 3"):
        await other.read(replace(offset, channel_id=3))
    key = channel_object_key(NAMESPACE, NODE_ID, where)
    data = bytearray(await store.get(key))
    data[WAL_OBJECT_HEADER_SIZE + where.offset % DATA_ALIGN_BYTES + 40] ^= 0xFF
    await store.put(key, bytes(data))
    with pytest.raises(ChannelRecordCorruptError, match="CRC"):
        await other.read(offset)
    assert await other.read(second) == payload(1)  # its own CRC still checks


async def test_the_link_resolver_reads_the_link_s_channel_record(store: ObjectStore) -> None:
    channel = await open_channel(store)
    _, offset = await channel.append(7, 0, payload(3))
    link = LinkRecord(9, 0, 1234, 5, offset)
    assert await ChannelLinkResolver(reader(store)).resolve(link) == payload(3)
    assert await ChannelLinkResolver(channel).resolve(link) == payload(3)
    await channel.close()


# --------------------------------------------------------------------------------- S3


async def test_the_channel_on_s3(moto_s3: MotoS3) -> None:
    store = await moto_store(moto_s3)
    try:
        channel = await open_channel(store)
        channel.next_epoch(1)
        first = [await channel.append(3, i, payload(i, 3000)) for i in range(3)]
        channel.next_epoch(2)
        second = [await channel.append(3, i, payload(i, 3000)) for i in range(3)]
        other = reader(store)
        assert [await other.read(o) for _, o in first + second] == [
            payload(i, 3000) for i in (0, 1, 2, 0, 1, 2)
        ]
        await channel.trim(1)
        for _, offset in first:
            with pytest.raises(ChannelRecordGoneError):
                await other.read(offset)
        assert [await other.read(o) for _, o in second] == [payload(i, 3000) for i in range(3)]
        await channel.close()
    finally:
        await store.close()
