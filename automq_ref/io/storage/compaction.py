"""Object compaction: a node merging its objects so that their number stays bounded.

Uploads only add objects; this shell carries out the decisions of
:mod:`automq_ref.state_machines.object_compaction` against the object store and the controller:

* Stream objects, per stream opened on this node (:meth:`ObjectCompactor.compact_stream`):
  CLEANUP drops the objects wholly below the stream's start (``CommitStreamObject`` without a
  new object); MINOR and MAJOR read each group of contiguous objects, write their blocks (those
  not wholly below the start) into one new object, PUT it under a freshly prepared id and commit
  it with ``CommitStreamObject`` naming the group as its sources.
* Stream set objects, this node's (:meth:`ObjectCompactor.compact_stream_set_objects`): every
  committed SSO's index is read, old ones are force split into stream objects, the others are
  merged into one SSO plus stream objects for their SPLIT runs; each result is one
  ``CommitStreamSetObject`` with ``compacted_object_ids``.

Every output is PUT before its commit and is read by nobody until the commit is in the image.
A crash (or a refusal) between the two leaves a prepared object nobody names: the lifecycle
(:mod:`automq_ref.io.storage.object_lifecycle`) expires it at its deadline and deletes it, and
a later pass compacts the same sources again under new ids. The sources a commit replaces become
MARK_DESTROYED in the same decision and are deleted by the lifecycle once the retention has
passed, so a read that found them just before still completes; one that comes later finds the
new objects in the image (S3Storage's read retries once the image moved on).

:meth:`ObjectCompactor.run_forever` schedules both as AutoMQ does: stream objects every minute
with up to 20 s of jitter (MAJOR when its interval has passed, else MINOR when 5 minutes have,
else CLEANUP), skipping streams opened here less than a minute ago; stream set objects every
interval (sooner when a pass left objects over). Objects are built in memory, so every merge is
bounded by the compaction cache size (AutoMQ copies large stream objects part by part instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from automq_ref.formats.object_file import (
    DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES,
    DataBlockIndex,
    ObjectWriter,
    WrittenObject,
    parse_data_block,
)
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.object_store import NotFound, ObjectStore
from automq_ref.io.storage.stream_objects import ObjectIndexCache, StreamReadError, read_blocks
from automq_ref.state_machines import object_compaction as oc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import object_key

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
# Compaction outputs stay prepared this long at most (AutoMQ: 24 h for compaction's objects).
COMPACTION_OBJECT_TTL_MS = 24 * 60 * MINUTE_MS
# The largest ranged GET a compaction read issues.
MAX_READ_BYTES = 16 * oc.MIB
MINOR_INTERVAL_MS = 5 * MINUTE_MS
STREAM_OBJECT_CHECK_MS = MINUTE_MS
STREAM_OBJECT_JITTER_MS = 20_000
MIN_STREAM_SET_DELAY_MS = 10_000
# Reads that found an object compacted away are tried again this many times (AutoMQ: 2).
READ_RETRIES = 2

T = TypeVar("T")


async def retry_compacted_away(
    view: MetadataView,
    read: Callable[[sm.StreamMetadataImage], Awaitable[T]],
    retries: int = READ_RETRIES,
) -> T:
    """``read(image)`` with the view's image, read afresh and tried again (up to ``retries``
    more times) while it fails as a read of objects a compaction replaced does: the object is
    gone (``NotFound``) or the objects the image named no longer chain up
    (``StreamReadError``); a retry follows the new objects, as AutoMQ's StreamReader does."""
    for _ in range(retries):
        try:
            return await read(view.image)
        except (NotFound, StreamReadError) as error:
            log.debug("read of compacted-away objects, reading again: %s", error)
    return await read(view.image)


class CompactionError(Exception):
    """The controller refused a compaction's request; its outputs are left to expire."""


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """AutoMQ's compaction settings (``s3.stream.set.object.compaction.*``,
    ``s3.stream.object.compaction.*``) and this node's object block size."""

    stream_set_interval_ms: int = 5 * MINUTE_MS
    stream_set_cache_bytes: int = oc.STREAM_SET_CACHE_BYTES
    stream_set_split_bytes: int = oc.STREAM_SET_SPLIT_BYTES
    force_split_ms: int = oc.FORCE_SPLIT_MS
    stream_set_max_objects: int = oc.STREAM_SET_MAX_OBJECTS
    stream_object_major_interval_ms: int = 30 * MINUTE_MS
    stream_object_max_bytes: int = 10 * 1024 * oc.MIB
    open_grace_ms: int = MINUTE_MS
    block_size_threshold_bytes: int = DEFAULT_BLOCK_SIZE_THRESHOLD_BYTES

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> CompactionSettings:
        """The settings under AutoMQ's property names (a broker config dumped by alias)."""
        defaults = cls()

        def get(name: str, default: int, scale: int = 1) -> int:
            value = properties.get(name)
            return default if value is None else int(value) * scale

        prefix = "s3.stream.set.object.compaction."
        return cls(
            stream_set_interval_ms=get(
                prefix + "interval.minutes", defaults.stream_set_interval_ms, MINUTE_MS
            ),
            stream_set_cache_bytes=get(prefix + "cache.size", defaults.stream_set_cache_bytes),
            stream_set_split_bytes=get(
                prefix + "stream.split.size", defaults.stream_set_split_bytes
            ),
            force_split_ms=get(prefix + "force.split.minutes", defaults.force_split_ms, MINUTE_MS),
            stream_set_max_objects=get(prefix + "max.num", defaults.stream_set_max_objects),
            stream_object_major_interval_ms=get(
                "s3.stream.object.compaction.interval.minutes",
                defaults.stream_object_major_interval_ms,
                MINUTE_MS,
            ),
            stream_object_max_bytes=get(
                "s3.stream.object.compaction.max.size.bytes", defaults.stream_object_max_bytes
            ),
            block_size_threshold_bytes=get(
                "s3.object.block.size", defaults.block_size_threshold_bytes
            ),
        )


@dataclass(slots=True)
class CompactionTotals:
    """What passes did: source objects replaced, objects written (and their bytes), objects
    dropped without a successor."""

    replaced: int = 0
    written: int = 0
    written_bytes: int = 0
    cleaned: int = 0

    def add(self, other: CompactionTotals) -> None:
        self.replaced += other.replaced
        self.written += other.written
        self.written_bytes += other.written_bytes
        self.cleaned += other.cleaned


def _build(batches: Iterable[StreamRecordBatch], block_size_threshold_bytes: int) -> WrittenObject:
    writer = ObjectWriter(block_size_threshold_bytes)
    for batch in batches:
        writer.write(batch)
    return writer.close()


class ObjectCompactor:
    """Compacts one node's objects (see the module docstring)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        namespace: str,
        client: ControllerClient,
        view: MetadataView,
        node_id: int,
        node_epoch: int,
        clock: Clock | None = None,
        settings: CompactionSettings = CompactionSettings(),
        rng: random.Random | None = None,
        totals: CompactionTotals | None = None,
    ) -> None:
        self._store = store
        self._namespace = namespace
        # Object ids are never reused: an index cached here stays true until its object goes.
        self._indexes = ObjectIndexCache(store, namespace)
        self._client = client
        self._view = view
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._clock = clock or SystemClock()
        self.settings = settings
        self._rng = rng or random.Random()
        # (stream, epoch) -> when this node first saw it opened here.
        self._opened_at: dict[tuple[int, int], int] = {}
        self.totals = CompactionTotals() if totals is None else totals  # every pass's, summed

    # ------------------------------------------------------------------------- reading

    async def _index(self, object_id: int) -> tuple[DataBlockIndex, ...]:
        return await self._indexes.get(object_id, self._view.image.objects[object_id].object_size)

    async def _read(
        self, object_id: int, blocks: Sequence[DataBlockIndex]
    ) -> dict[int, list[StreamRecordBatch]]:
        """Block position -> its batches, for ``blocks`` (in position order): one GET per run
        of adjacent blocks of at most ``MAX_READ_BYTES``, the runs concurrently."""
        data = await read_blocks(self._store, self._namespace, object_id, blocks, MAX_READ_BYTES)
        return {
            block.start_position: parse_data_block(piece, block)
            for block, piece in zip(blocks, data, strict=True)
        }

    async def _put(self, object_id: int, batches: list[StreamRecordBatch]) -> int:
        batches.sort(key=lambda b: (b.stream_id, b.base_offset))
        written = await asyncio.to_thread(_build, batches, self.settings.block_size_threshold_bytes)
        await self._store.put(object_key(self._namespace, object_id), written.chunks)
        return written.size_bytes

    async def _prepare(self, count: int) -> int:
        response = await self._client.submit(
            sm.PrepareObject(
                self._node_id,
                self._node_epoch,
                count,
                COMPACTION_OBJECT_TTL_MS,
                self._clock.now_ms(),
            )
        )
        if not response.ok or response.first_object_id is None:
            raise CompactionError(f"prepare {count} objects: {response.error.value}")
        return response.first_object_id

    async def _submit(self, event: sm.StreamMetadataEvent, what: str) -> None:
        response = await self._client.submit(event)
        if not response.ok and response.error is not sm.StreamErrorCode.REDUNDANT_OPERATION:
            raise CompactionError(f"{what}: {response.error.value}: {response.message}")

    # ---------------------------------------------------------------- stream objects

    def opened_streams(self, now_ms: int | None = None) -> list[int]:
        """Streams opened on this node for at least the open grace (the stream-object pass's
        candidates), oldest first seen first."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        image = self._view.image
        seen: dict[tuple[int, int], int] = {}
        for stream in image.streams.values():
            current = stream.current_range
            if (
                stream.state is sm.StreamState.OPENED
                and current
                and current.node_id == self._node_id
            ):
                key = (stream.stream_id, stream.epoch)
                seen[key] = self._opened_at.get(key, now)
        self._opened_at = seen
        grace = self.settings.open_grace_ms
        return [stream_id for (stream_id, _), at in seen.items() if now - at >= grace]

    async def compact_stream_objects(
        self, kind: oc.StreamObjectCompactionKind, stream_ids: Iterable[int] | None = None
    ) -> CompactionTotals:
        """One pass of ``kind`` over ``stream_ids`` (default: :meth:`opened_streams`). A stream
        whose compaction fails is logged and skipped."""
        totals = CompactionTotals()
        for stream_id in self.opened_streams() if stream_ids is None else stream_ids:
            try:
                totals.add(await self.compact_stream(stream_id, kind))
            except Exception as error:
                log.warning("stream %d: %s compaction failed: %s", stream_id, kind.value, error)
        return totals

    async def compact_stream(
        self, stream_id: int, kind: oc.StreamObjectCompactionKind
    ) -> CompactionTotals:
        """CLEANUP, then (MINOR, MAJOR) merge the stream's groups of contiguous objects."""
        totals = CompactionTotals()
        image = self._view.image
        stream = image.streams.get(stream_id)
        if stream is None:
            return totals
        infos = [
            oc.StreamObjectInfo(
                object_id, r.start_offset, r.end_offset, image.objects[object_id].object_size
            )
            for object_id, r in stream.stream_objects.items()
            if object_id in image.objects
        ]
        for batch in oc.cleanup_batches(infos, stream.start_offset):
            await self._submit(
                sm.CommitStreamObject(
                    self._node_id,
                    self._node_epoch,
                    stream_id,
                    stream.epoch,
                    sm.NO_OBJECT,
                    0,
                    0,
                    0,
                    tuple(batch),
                    self._clock.now_ms(),
                ),
                f"stream {stream_id}: cleanup",
            )
            totals.cleaned += len(batch)
        if kind is oc.StreamObjectCompactionKind.CLEANUP:
            self.totals.add(totals)
            return totals
        limit = (
            oc.MINOR_GROUP_BYTES
            if kind is oc.StreamObjectCompactionKind.MINOR
            else self.settings.stream_object_max_bytes
        )
        limit = min(limit, self.settings.stream_set_cache_bytes)
        for group in oc.plan_stream_object_groups(infos, stream.start_offset, limit):
            batches: list[StreamRecordBatch] = []
            for info in group:
                indexes = await self._index(info.object_id)
                wanted = [
                    block
                    for block in indexes
                    if block.stream_id == stream_id and block.end_offset > stream.start_offset
                ]
                read = await self._read(info.object_id, wanted)
                batches.extend(b for block in wanted for b in read[block.start_position])
            object_id = await self._prepare(1)
            size = await self._put(object_id, batches)
            await self._submit(
                sm.CommitStreamObject(
                    self._node_id,
                    self._node_epoch,
                    stream_id,
                    stream.epoch,
                    object_id,
                    group[0].start_offset,
                    group[-1].end_offset,
                    size,
                    tuple(info.object_id for info in group),
                    self._clock.now_ms(),
                ),
                f"stream {stream_id}: merge into object {object_id}",
            )
            totals.replaced += len(group)
            totals.written += 1
            totals.written_bytes += size
        self.totals.add(totals)
        return totals

    # ----------------------------------------------------------- stream set objects

    async def _set_objects(
        self,
    ) -> tuple[list[oc.SetObjectInfo], dict[tuple[int, int], DataBlockIndex]]:
        image = self._view.image
        node = image.nodes.get(self._node_id)
        if node is None:
            return [], {}
        starts = {stream_id: s.start_offset for stream_id, s in image.streams.items()}
        infos: list[oc.SetObjectInfo] = []
        entries: dict[tuple[int, int], DataBlockIndex] = {}
        for sso in sorted(node.stream_set_objects.values(), key=lambda o: o.order_id):
            s3_object = image.objects.get(sso.object_id)
            if s3_object is None or s3_object.state is not sm.S3ObjectState.COMMITTED:
                continue
            refs = []
            for block in await self._index(sso.object_id):
                if block.block_size_bytes > self.settings.stream_set_cache_bytes:
                    raise CompactionError(f"object {sso.object_id}: a block above the cache size")
                entries[(sso.object_id, block.start_position)] = block
                refs.append(
                    oc.BlockRef(
                        sso.object_id,
                        block.stream_id,
                        block.start_offset,
                        block.end_offset,
                        block.start_position,
                        block.block_size_bytes,
                    )
                )
            blocks = oc.live_blocks(refs, starts)
            infos.append(oc.SetObjectInfo(sso.object_id, sso.data_time_ms, blocks))
        return infos, entries

    async def _read_runs(
        self, runs: Sequence[oc.Run], entries: dict[tuple[int, int], DataBlockIndex]
    ) -> list[list[StreamRecordBatch]]:
        """Each run's batches, in offset order."""
        by_object: dict[int, list[DataBlockIndex]] = {}
        for run in runs:
            for ref in run.blocks:
                by_object.setdefault(ref.object_id, []).append(
                    entries[(ref.object_id, ref.position)]
                )
        read: dict[int, dict[int, list[StreamRecordBatch]]] = {}
        for object_id, blocks in by_object.items():
            blocks.sort(key=lambda b: b.start_position)
            read[object_id] = await self._read(object_id, blocks)
        return [
            [batch for ref in run.blocks for batch in read[ref.object_id][ref.position]]
            for run in runs
        ]

    async def _commit_set(
        self,
        sources: tuple[int, ...],
        compact: Sequence[oc.Run],
        split: Sequence[oc.Run],
        entries: dict[tuple[int, int], DataBlockIndex],
    ) -> CompactionTotals:
        """Write the merged SSO (of ``compact``) and one stream object per ``split`` run, then
        commit them in place of ``sources``."""
        totals = CompactionTotals(replaced=len(sources))
        count = len(split) + (1 if compact else 0)
        first = await self._prepare(count) if count else sm.NO_OBJECT
        set_object_id = first if compact else sm.NO_OBJECT
        set_size = 0
        if compact:
            merged = [b for run in await self._read_runs(compact, entries) for b in run]
            set_size = await self._put(set_object_id, merged)
        stream_objects: list[sm.CommitStreamObjectEntry] = []
        split_batches = await self._read_runs(split, entries) if split else []
        for number, (run, batches) in enumerate(zip(split, split_batches, strict=True)):
            object_id = first + (1 if compact else 0) + number
            size = await self._put(object_id, batches)
            stream_objects.append(
                sm.CommitStreamObjectEntry(
                    object_id, run.stream_id, run.start_offset, run.end_offset, size
                )
            )
            totals.written_bytes += size
        ranges = tuple(
            sm.CommitRange(run.stream_id, sm.ANY_STREAM_EPOCH, run.start_offset, run.end_offset)
            for run in compact
        )
        await self._submit(
            sm.CommitStreamSetObject(
                self._node_id,
                self._node_epoch,
                set_object_id,
                sm.NO_OBJECT,
                set_size,
                ranges,
                tuple(stream_objects),
                sources,
                False,
                self._clock.now_ms(),
            ),
            f"compaction of objects {list(sources)}",
        )
        totals.written = count
        totals.written_bytes += set_size
        return totals

    async def compact_stream_set_objects(self) -> tuple[CompactionTotals, bool]:
        """One pass over this node's SSOs; returns its totals and whether objects were left
        over for another pass."""
        totals = CompactionTotals()
        infos, entries = await self._set_objects()
        settings = self.settings
        plan = oc.plan_stream_set_compaction(
            infos,
            self._clock.now_ms(),
            force_split_ms=settings.force_split_ms,
            split_bytes=settings.stream_set_split_bytes,
            max_objects=settings.stream_set_max_objects,
            cache_bytes=settings.stream_set_cache_bytes,
        )
        for old in plan.force_split:
            runs = oc.split_runs(old.blocks)
            totals.add(await self._commit_set((old.object_id,), (), runs, entries))
        if plan.compact is not None:
            merge = plan.compact
            totals.add(await self._commit_set(merge.sources, merge.compact, merge.split, entries))
        self.totals.add(totals)
        return totals, plan.remaining

    # ---------------------------------------------------------------------- schedule

    async def run_forever(self) -> None:
        """Both schedules, until cancelled (see the module docstring)."""
        await asyncio.gather(self._stream_objects_forever(), self._stream_set_objects_forever())

    async def _stream_objects_forever(self) -> None:
        started = self._clock.now_ms()
        last_major = last_minor = started
        while True:
            jitter = self._rng.uniform(0, STREAM_OBJECT_JITTER_MS)
            await asyncio.sleep((STREAM_OBJECT_CHECK_MS + jitter) / 1000)
            now = self._clock.now_ms()
            kind = oc.StreamObjectCompactionKind.CLEANUP
            if now - last_major >= self.settings.stream_object_major_interval_ms:
                kind, last_major, last_minor = oc.StreamObjectCompactionKind.MAJOR, now, now
            elif now - last_minor >= MINOR_INTERVAL_MS:
                kind, last_minor = oc.StreamObjectCompactionKind.MINOR, now
            with contextlib.suppress(Exception):  # each stream logs its own failure
                await self.compact_stream_objects(kind)

    async def _stream_set_objects_forever(self) -> None:
        interval = self.settings.stream_set_interval_ms
        delay_ms = interval
        while True:
            await asyncio.sleep(delay_ms / 1000)
            started = self._clock.now_ms()
            remaining = False
            try:
                totals, remaining = await self.compact_stream_set_objects()
                if totals.replaced:
                    log.info(
                        "stream set objects compacted replaced=%d written=%d bytes=%d",
                        totals.replaced,
                        totals.written,
                        totals.written_bytes,
                    )
            except Exception as error:  # the next pass tries again; nothing is lost
                log.warning("stream set object compaction failed: %s", error)
            elapsed = self._clock.now_ms() - started
            delay_ms = (
                MIN_STREAM_SET_DELAY_MS
                if remaining
                else max(MIN_STREAM_SET_DELAY_MS, interval - elapsed)
            )


async def compact_forever(
    store: ObjectStore,
    namespace: str,
    client: ControllerClient,
    view: MetadataView,
    node: tuple[int, int],
    clock: Clock,
    properties: Mapping[str, Any],
    totals: CompactionTotals | None = None,
) -> None:
    """A node's compaction (``node``: its id and epoch), with the settings named in
    ``properties`` (AutoMQ's names), until cancelled; what its passes did is summed into
    ``totals``."""
    compactor = ObjectCompactor(
        store=store,
        namespace=namespace,
        client=client,
        view=view,
        node_id=node[0],
        node_epoch=node[1],
        clock=clock,
        settings=CompactionSettings.from_properties(properties),
        totals=totals,
    )
    await compactor.run_forever()
