"""Object compaction: the planning rules (pure), and the compactor end to end over a directory
object store and an in-process controller: reads unchanged, sources reclaimed, object counts
bounded over a long produce."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.config import BrokerConfig
from automq_ref.formats.object_file import (
    find,
    parse_data_block,
    parse_footer,
    parse_index,
    slice_index_from_tail,
    tail_read_size,
)
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.storage.compaction import (
    CompactionSettings,
    ObjectCompactor,
    retry_compacted_away,
)
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, NotFound, ObjectStore
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import object_compaction as oc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import object_key
from tests.storage_fixtures import NODE_ID, RunningStorage, start_storage

NS = "_kafka_test"
KIND = oc.StreamObjectCompactionKind

# ------------------------------------------------------------------------- planning rules


def so(object_id: int, start: int, end: int, size: int = 100) -> oc.StreamObjectInfo:
    return oc.StreamObjectInfo(object_id, start, end, size)


def test_cleanup_takes_only_objects_wholly_below_the_start_in_batches() -> None:
    objects = [so(i, 10 * i, 10 * i + 10) for i in range(5)]
    assert oc.cleanup_batches(objects, 25) == [[0, 1]]
    assert oc.cleanup_batches(objects, 30, batch=2) == [[0, 1], [2]]
    assert oc.cleanup_batches(objects, 0) == []


def test_merge_groups_are_contiguous_within_the_threshold_and_never_single() -> None:
    objects = [so(1, 0, 10), so(2, 10, 20), so(3, 20, 30), so(4, 40, 50), so(5, 50, 60)]
    # A gap at 30..40 cuts the groups.
    assert oc.plan_stream_object_groups(objects, 0, 1000) == [
        (objects[0], objects[1], objects[2]),
        (objects[3], objects[4]),
    ]
    # A hard threshold: the object that would cross it starts the next group.
    assert oc.plan_stream_object_groups(objects[:3], 0, 250) == [(objects[0], objects[1])]
    # Objects above the threshold are left alone; so are objects below the start.
    big = [so(1, 0, 10, 500), so(2, 10, 20), so(3, 20, 30)]
    assert oc.plan_stream_object_groups(big, 0, 400) == [(big[1], big[2])]
    assert oc.plan_stream_object_groups(objects[:3], 10, 1000) == [(objects[1], objects[2])]


def test_merge_groups_respect_object_count_parts_and_span() -> None:
    objects = [so(i, i, i + 1) for i in range(7)]
    groups = oc.plan_stream_object_groups(objects, 0, 10_000, max_objects=3)
    assert [len(g) for g in groups] == [3, 3]
    assert [len(g) for g in oc.plan_stream_object_groups(objects, 0, 10_000, max_parts=2)] == [
        2,
        2,
        2,
    ]
    wide = [so(1, 0, 2**30), so(2, 2**30, 2**31), so(3, 2**31, 2**31 + 5)]
    assert oc.plan_stream_object_groups(wide, 0, 10_000) == [(wide[1], wide[2])]
    assert oc.parts(0) == 1 and oc.parts(oc.PART_BYTES + 1) == 2


def test_after_a_pass_neighbouring_groups_exceed_the_threshold() -> None:
    rng = random.Random(7)
    offset, objects = 0, []
    for i in range(200):
        count = rng.randint(1, 5)
        objects.append(so(i, offset, offset + count, rng.randint(1, 300)))
        offset += count
    threshold = 1000
    groups = oc.plan_stream_object_groups(objects, 0, threshold)
    merged = {o.object_id for g in groups for o in g}
    sizes = [sum(o.size_bytes for o in g) for g in groups]
    sizes += [o.size_bytes for o in objects if o.object_id not in merged]
    assert all(size <= threshold for size in sizes)
    total = sum(o.size_bytes for o in objects)
    assert len(sizes) <= 2 * total / threshold + 1


def block(object_id: int, stream: int, start: int, end: int, size: int = 100) -> oc.BlockRef:
    return oc.BlockRef(object_id, stream, start, end, start * 1000 + stream, size)


def sso(object_id: int, data_time: int, *blocks: oc.BlockRef) -> oc.SetObjectInfo:
    return oc.SetObjectInfo(object_id, data_time, tuple(blocks))


def test_live_blocks_drop_deleted_streams_and_blocks_below_the_start() -> None:
    blocks = [block(1, 1, 0, 10), block(1, 1, 10, 20), block(1, 2, 0, 10), block(1, 3, 0, 10)]
    assert oc.live_blocks(blocks, {1: 10, 2: 5}) == (blocks[1], blocks[2])


def test_old_objects_are_force_split_and_the_rest_merged_with_split_runs() -> None:
    old = sso(1, 0, block(1, 1, 0, 10), block(1, 2, 0, 10))
    a = sso(2, 500, block(2, 1, 10, 20), block(2, 2, 10, 20), block(2, 3, 0, 5, 900))
    b = sso(3, 600, block(3, 1, 20, 30), block(3, 2, 30, 40), block(3, 3, 5, 9, 900))
    plan = oc.plan_stream_set_compaction(
        [old, a, b], now_ms=1000, force_split_ms=800, split_bytes=1000
    )
    assert plan.force_split == (old,)
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in oc.split_runs(old.blocks)] == [
        (1, 0, 10),
        (2, 0, 10),
    ]
    assert plan.compact is not None and not plan.remaining
    assert set(plan.compact.sources) == {2, 3}
    # Stream 1 is contiguous and small: into the SSO. Stream 2 has a gap: each run split.
    # Stream 3 is contiguous but larger than the split size: split.
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in plan.compact.compact] == [
        (1, 10, 30)
    ]
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in plan.compact.split] == [
        (2, 10, 20),
        (2, 30, 40),
        (3, 0, 9),
    ]


def test_a_merge_takes_the_newest_objects_within_the_limits() -> None:
    objects = [sso(i, i, block(i, 1, 10 * i, 10 * i + 10)) for i in range(1, 8)]
    plan = oc.plan_stream_set_compaction(objects, now_ms=100, max_objects=3)
    assert plan.compact is not None and plan.remaining
    assert plan.compact.sources == (7, 6, 5)
    plan = oc.plan_stream_set_compaction(objects, now_ms=100, cache_bytes=250)
    assert plan.compact is not None and plan.compact.sources == (7, 6) and plan.remaining
    # Too many stream objects for one commit: the oldest objects wait for a later pass.
    gaps = [sso(i, i, block(i, 1, 10 * i, 10 * i + 5)) for i in range(1, 8)]
    plan = oc.plan_stream_set_compaction(gaps, now_ms=100, max_stream_objects=4)
    assert plan.compact is not None and plan.remaining
    assert plan.compact.sources == (7, 6, 5, 4)


def test_objects_sharing_no_stream_are_not_merged_but_empty_ones_are_dropped() -> None:
    a = sso(1, 10, block(1, 1, 0, 10))
    b = sso(2, 20, block(2, 2, 0, 10))
    assert oc.plan_stream_set_compaction([a, b], now_ms=30).compact is None
    empty = sso(3, 25)
    plan = oc.plan_stream_set_compaction([a, b, empty], now_ms=30)
    assert plan.compact is not None and plan.compact.sources == (3,)
    assert not plan.compact.compact and not plan.compact.split


# ---------------------------------------------------------------------- end to end


class ManualClock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def monotonic_s(self) -> float:
        return self.now / 1000


class CrashingClient:
    """Drops the next compaction commit (raising, as a node dying after the PUT would never
    send it), when armed."""

    def __init__(self, client: ControllerClient) -> None:
        self._client = client
        self.armed = False
        self.crashed = 0
        self.lost: list[sm.StreamMetadataEvent] = []

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        compaction = isinstance(event, sm.CommitStreamObject) or (
            isinstance(event, sm.CommitStreamSetObject) and bool(event.compacted_object_ids)
        )
        if self.armed and compaction:
            self.armed = False
            self.crashed += 1
            self.lost.append(event)
            raise ConnectionError("crashed between upload and commit")
        return await self._client.submit(event)


async def read_objects(
    store: ObjectStore, image: sm.StreamMetadataImage, stream_id: int, start: int, end: int
) -> list[tuple[int, int, bytes]]:
    """What objects hold of ``[start, end)`` of the stream, read the way a broker finds it:
    the image's objects, their indexes, their blocks; (base offset, count, payload) each."""
    error, slices = sm.get_objects(image, stream_id, start, end, limit=1 << 30)
    assert error is sm.StreamErrorCode.NONE
    found: list[tuple[int, int, bytes]] = []
    cursor = start
    for piece in slices:
        size = image.objects[piece.object_id].object_size
        key = object_key(NS, piece.object_id)
        tail = await store.get_range(key, size - tail_read_size(size), size)
        location = parse_footer(tail, size)
        index_bytes = slice_index_from_tail(tail, size, location)
        if index_bytes is None:
            index_bytes = memoryview(await store.get(key))[
                location.start_position : location.start_position + location.length_bytes
            ]
        indexes = parse_index(index_bytes, index_start_position=location.start_position)
        for entry in find(indexes, stream_id, cursor, end, 1 << 40):
            data = await store.get_range(key, entry.start_position, entry.end_position)
            for batch in parse_data_block(data, entry):
                if batch.last_offset <= cursor or batch.base_offset >= end:
                    continue
                assert batch.base_offset <= cursor, f"gap at {cursor} in object {piece.object_id}"
                found.append((batch.base_offset, batch.count, bytes(batch.payload)))
                cursor = batch.last_offset
    return found


@dataclass
class Harness:
    running: RunningStorage
    store: LocalDirectoryObjectStore
    clock: ManualClock
    client: CrashingClient
    compactor: ObjectCompactor
    epoch: int = 1
    streams: list[int] = field(default_factory=list)
    # Per stream: acknowledged appends (base offset, count, payload), and the start.
    written: dict[int, list[tuple[int, int, bytes]]] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)

    @property
    def image(self) -> sm.StreamMetadataImage:
        return self.running.view.image

    async def add_stream(self) -> int:
        stream_id = await self.running.storage.create_stream()
        await self.running.storage.open_stream(stream_id, self.epoch)
        self.streams.append(stream_id)
        self.written[stream_id] = []
        self.starts[stream_id] = 0
        return stream_id

    async def append(self, stream_id: int, size: int, count: int = 1) -> None:
        payload = bytes([len(self.written[stream_id]) % 251]) * size
        base = await self.running.storage.append(stream_id, self.epoch, payload, count)
        self.written[stream_id].append((base, count, payload))

    async def upload(self) -> None:
        await self.running.storage.force_upload(lc.ALL_STREAMS)

    async def trim(self, stream_id: int, new_start: int) -> None:
        await self.running.storage.trim_stream(stream_id, self.epoch, new_start)
        self.starts[stream_id] = max(self.starts[stream_id], new_start)

    async def reclaim(self) -> None:
        """Time passes beyond the retention and prepared deadlines; the lifecycle deletes."""
        self.clock.now += 25 * 3600 * 1000
        await self.running.storage.run_object_lifecycle()
        await self.running.storage.run_object_lifecycle()

    def expected(self, stream_id: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
        return [w for w in self.written[stream_id] if w[0] + w[1] > start and w[0] < end]

    async def check_reads(self, rng: random.Random, samples: int = 3) -> None:
        """Every stream's committed offsets read back as written, from the start and from a few
        offsets inside; S3Storage reads the same."""
        image = self.image
        for stream_id in self.streams:
            start, end = self.starts[stream_id], image.streams[stream_id].end_offset
            if start >= end:
                continue
            froms = [start] + [rng.randrange(start, end) for _ in range(samples)]
            for offset in froms:
                until = rng.randint(offset + 1, end)
                got = await read_objects(self.store, image, stream_id, offset, until)
                assert got == self.expected(stream_id, offset, until)
                batches = await self.running.storage.read(stream_id, offset, until, 1 << 30)
                assert [(b.base_offset, b.count, bytes(b.payload)) for b in batches] == (
                    self.expected(stream_id, offset, until)
                )

    def stream_objects(self, stream_id: int) -> int:
        return len(self.image.streams[stream_id].stream_objects)

    def set_objects(self) -> int:
        node = self.image.nodes[NODE_ID]
        return len(node.stream_set_objects)


SETTINGS = CompactionSettings(
    open_grace_ms=0,
    stream_set_split_bytes=4000,
    stream_set_cache_bytes=1 << 20,
    block_size_threshold_bytes=1024,
)


async def open_harness(tmp_path: Path, settings: CompactionSettings = SETTINGS) -> Harness:
    """A node's storage (block WAL in memory, objects in ``tmp_path``) and its compactor."""
    clock = ManualClock(1_000_000)
    wal = await BlockWal.open(
        MemoryBlockDevice(4 << 20), node_id=NODE_ID, node_epoch=1, max_write_bytes=64 * 1024
    )
    store = LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)
    crashing: list[CrashingClient] = []

    def wrap(client: ControllerClient) -> ControllerClient:
        crashing.append(CrashingClient(client))
        return crashing[0]

    params = lc.LogCacheParams(
        upload_threshold_bytes=1 << 30, upload_interval_ms=-1, stream_object_split_bytes=3000
    )
    running = await start_storage(
        tmp_path,
        wal,
        store,
        params=params,
        clock=clock,
        wrap_client=wrap,
        block_size_threshold_bytes=1024,
        runs_lifecycle=lambda: False,
    )
    compactor = ObjectCompactor(
        store=store,
        namespace=NS,
        client=crashing[0],
        view=running.view,
        node_id=NODE_ID,
        node_epoch=running.storage.node_epoch,
        clock=clock,
        settings=settings,
    )
    return Harness(running, store, clock, crashing[0], compactor)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    opened = await open_harness(tmp_path)
    yield opened
    await opened.running.stop(close_store=True)


async def produce_round(h: Harness, rng: random.Random, appends: int = 6) -> None:
    for _ in range(appends):
        stream_id = rng.choice(h.streams)
        await h.append(stream_id, rng.randint(1, 1500), rng.randint(1, 3))
    await h.upload()
    h.clock.now += 1000


async def test_compaction_keeps_reads_and_reclaims_its_sources(harness: Harness) -> None:
    h, rng = harness, random.Random(3)
    for _ in range(3):
        await h.add_stream()
    for _ in range(8):
        await produce_round(h, rng)
    # One stream alone in a block: a stream object per upload.
    for _ in range(4):
        await h.append(h.streams[0], 500)
        await h.upload()
    before = set(h.image.objects)
    await h.check_reads(rng)
    sets_before = h.set_objects()
    totals, _ = await h.compactor.compact_stream_set_objects()
    assert totals.replaced == sets_before > 1
    assert h.set_objects() <= 1
    await h.check_reads(rng)
    await h.compactor.compact_stream_objects(KIND.MINOR)
    assert h.stream_objects(h.streams[0]) < 4
    await h.check_reads(rng)
    # Force split: the merged SSO is old now.
    h.compactor.settings = CompactionSettings(
        open_grace_ms=0, force_split_ms=0, block_size_threshold_bytes=1024
    )
    h.clock.now += 10
    await h.compactor.compact_stream_set_objects()
    assert h.set_objects() == 0
    await h.check_reads(rng)
    # Trim, then clean up the objects below the start.
    stream_id = h.streams[1]
    await h.trim(stream_id, h.image.streams[stream_id].end_offset - 1)
    await h.compactor.compact_stream_objects(KIND.CLEANUP)
    await h.check_reads(rng)
    await h.reclaim()
    await h.check_reads(rng)
    assert not before & set(h.image.objects) - {
        o for s in h.image.streams.values() for o in s.stream_objects
    }
    keys = {info.key for info in await h.store.list("")}
    assert keys == {object_key(NS, object_id) for object_id in h.image.objects}


async def test_a_crash_between_upload_and_commit_leaves_reads_unchanged(harness: Harness) -> None:
    h, rng = harness, random.Random(5)
    for _ in range(2):
        await h.add_stream()
    for _ in range(4):
        await produce_round(h, rng)
    sets = set(h.image.nodes[NODE_ID].stream_set_objects)
    h.client.armed = True
    with pytest.raises(ConnectionError):
        await h.compactor.compact_stream_set_objects()
    assert h.client.crashed == 1
    assert set(h.image.nodes[NODE_ID].stream_set_objects) == sets
    await h.check_reads(rng)
    await h.reclaim()  # the orphan expires and is deleted
    await h.check_reads(rng)
    totals, _ = await h.compactor.compact_stream_set_objects()
    assert totals.replaced == len(sets)
    await h.check_reads(rng)


async def test_object_counts_stay_bounded_over_a_long_produce(harness: Harness) -> None:
    h, rng = harness, random.Random(11)
    for _ in range(4):
        await h.add_stream()
    most_sets = 0
    most_stream_objects = 0
    for round_number in range(60):
        await produce_round(h, rng, appends=4)
        if round_number % 3 == 2:
            await h.compactor.compact_stream_set_objects()
            await h.compactor.compact_stream_objects(KIND.MINOR)
            await h.reclaim()
        most_sets = max(most_sets, h.set_objects())
        most_stream_objects = max(most_stream_objects, max(h.stream_objects(s) for s in h.streams))
    # Without compaction: one SSO per upload (60) and stream objects growing with the data.
    # With it: at most the uploads since the last pass plus the merged one, and per stream the
    # merged prefix (far below the 128 MiB group size here: one object) plus the new ones.
    assert most_sets <= 3 + 1
    assert most_stream_objects <= 1 + 3 * 2 + 8
    await h.check_reads(rng)


async def test_run_forever_can_be_cancelled(harness: Harness) -> None:
    task = asyncio.create_task(harness.compactor.run_forever())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class StaleView:
    """A view whose first images are stale (a broker's image behind the controller's)."""

    def __init__(self, *images: sm.StreamMetadataImage) -> None:
        self._images = list(images)
        self.reads = 0

    @property
    def image(self) -> sm.StreamMetadataImage:
        self.reads += 1
        return self._images.pop(0) if len(self._images) > 1 else self._images[0]

    @property
    def version(self) -> int:
        return self.reads

    async def wait_for_change(self, after_version: int) -> int:
        raise NotImplementedError


async def test_a_read_of_objects_compacted_away_reads_the_image_again(harness: Harness) -> None:
    h, rng = harness, random.Random(9)
    for _ in range(2):
        await h.add_stream()
    for _ in range(3):
        await produce_round(h, rng)
    stale = h.image
    totals, _ = await h.compactor.compact_stream_set_objects()
    assert totals.replaced > 1
    await h.reclaim()  # the sources are deleted from the store
    now = h.image.nodes[NODE_ID].stream_set_objects
    sources = [o for i, o in stale.nodes[NODE_ID].stream_set_objects.items() if i not in now]
    stream_id = min(r.stream_id for source in sources for r in source.ranges)
    end = h.image.streams[stream_id].end_offset

    def read(image: sm.StreamMetadataImage) -> Awaitable[list[tuple[int, int, bytes]]]:
        return read_objects(h.store, image, stream_id, 0, end)

    with pytest.raises(NotFound):
        await read(stale)
    view = StaleView(stale, stale, h.image)
    assert await retry_compacted_away(view, read) == h.expected(stream_id, 0, end)
    assert view.reads == 3
    # Two retries at most: a third stale image fails the read.
    with pytest.raises(NotFound):
        await retry_compacted_away(StaleView(stale, stale, stale, h.image), read)


async def test_streams_are_compacted_only_a_minute_after_they_were_seen_opened_here(
    harness: Harness,
) -> None:
    h = harness
    h.compactor.settings = CompactionSettings(open_grace_ms=60_000)
    first = await h.add_stream()
    assert h.compactor.opened_streams() == []
    h.clock.now += 30_000
    second = await h.add_stream()
    assert h.compactor.opened_streams() == []
    h.clock.now += 30_000
    assert h.compactor.opened_streams() == [first]
    h.clock.now += 30_000
    assert sorted(h.compactor.opened_streams()) == sorted([first, second])
    # Closed (or moved away): no longer a candidate; opened again, the minute starts again.
    await h.running.storage.close_stream(first, h.epoch)
    assert h.compactor.opened_streams() == [second]
    await h.running.storage.open_stream(first, h.epoch + 1)
    assert h.compactor.opened_streams() == [second]


def test_the_settings_are_read_from_the_broker_config_by_automq_names() -> None:
    config = BrokerConfig.model_validate(
        {
            "s3.stream.set.object.compaction.interval.minutes": 7,
            "s3.stream.set.object.compaction.cache.size": 64 * oc.MIB,
            "s3.stream.set.object.compaction.stream.split.size": 4 * oc.MIB,
            "s3.stream.set.object.compaction.force.split.minutes": 60,
            "s3.stream.set.object.compaction.max.num": 100,
            "s3.stream.object.compaction.interval.minutes": 15,
            "s3.stream.object.compaction.max.size.bytes": 512 * oc.MIB,
        }
    )
    settings = CompactionSettings.from_properties(config.model_dump(by_alias=True))
    assert settings == CompactionSettings(
        stream_set_interval_ms=7 * 60_000,
        stream_set_cache_bytes=64 * oc.MIB,
        stream_set_split_bytes=4 * oc.MIB,
        force_split_ms=60 * 60_000,
        stream_set_max_objects=100,
        stream_object_major_interval_ms=15 * 60_000,
        stream_object_max_bytes=512 * oc.MIB,
    )
    defaults = BrokerConfig.model_validate({}).model_dump(by_alias=True)
    assert CompactionSettings.from_properties(defaults) == CompactionSettings()
