"""S3StorageMachine: append, read, trim, force upload, crash and restart against an atomic log.

The model is, per stream, the list of acknowledged appends (offset, payload). A crash kills the
storage at an arbitrary point: effects in flight are cancelled (so a crash can fall between an
upload and its commit), and the WAL device keeps a random subset of what it had not synced.
After every restart, each acknowledged append must be readable exactly once, in order, at its
offset from the stream's start; no read may return a record that was not acknowledged or that lies
past the stream's end, and a read below the start is refused.

``S3StorageOnObjectWalMachine`` runs the same rules over the object WAL (its objects in a
directory behind :class:`FaultyObjectStore`, which dies with the process), plus a crash between a
WAL upload and the reservation check that would have acknowledged it: that append is in doubt,
and after the restart it is either absent or, once recovery replayed it, there for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.checker.object_faults import FaultyObjectStore
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.metadata.view import ImageView
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.s3stream import (
    OBJECT_TTL_MS,
    LinkResolver,
    OffsetOutOfRangeError,
    S3Storage,
    StorageError,
)
from automq_ref.io.storage.stream_objects import object_key
from automq_ref.io.storage.wal import WriteAheadLog
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from tests.storage_fixtures import NODE_ID, start_storage

STREAMS = 2
NAMESPACE = "_kafka_test"
PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=2000,
    upload_interval_ms=-1,
    stream_object_split_bytes=1500,
    capacity_bytes=6000,
    max_blocks=4,
)


class HoldingClient:
    """A controller client that can hold commits back (they wait forever), so that a crash
    lands between an upload and its commit."""

    def __init__(self, client: ControllerClient) -> None:
        self._client = client
        self.hold_commits = False

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        if self.hold_commits and isinstance(event, sm.CommitStreamSetObject):
            await asyncio.Event().wait()
        return await self._client.submit(event)


class ManualClock:
    """The storage's clock: only the test moves it."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms_value = now_ms

    def now_ms(self) -> int:
        return self.now_ms_value

    def monotonic_s(self) -> float:
        return self.now_ms_value / 1000


class S3StorageMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="s3storage-"))
        self.device = MemoryBlockDevice(256 * 1024)
        self.node_epoch = 0
        self.stream_epoch = -1
        self.serial = 0
        self.acknowledged: dict[int, list[tuple[int, bytes]]] = {}
        # Appends whose outcome a crash left unknown, per stream, in order.
        self.in_doubt: dict[int, list[bytes]] = {}
        self.start_offsets: dict[int, int] = {}
        self.storage: S3Storage | None = None
        self.client: HoldingClient | None = None
        self.view: ImageView | None = None
        self.metadata_log: FileMetadataLog | None = None
        self.store = LocalDirectoryObjectStore(self.directory / "objects", fsync=False)
        # Appends since the last full upload or restart (a deterministic stand-in for "the
        # cache holds something to upload": preconditions must not depend on task timing).
        self.appended_since_upload = False
        # The storage's clock: only the expire_orphans rule moves it.
        self.clock = ManualClock(1_000_000_000)
        # How recovery reads link records back (a subclass routes appends through a channel).
        self.link_resolver: LinkResolver | None = None

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    async def _open_wal(self) -> WriteAheadLog:
        return await BlockWal.open(
            self.device, node_id=NODE_ID, node_epoch=self.node_epoch, max_write_bytes=16 * 1024
        )

    def _cut_wal_power(self) -> None:
        """The process dies: its WAL writes nothing more."""
        self.device.crash_after_operations = 0

    def _reboot_wal(self, seed: int) -> None:
        """What the WAL's storage holds after the crash."""
        self.device = self.device.crash(random.Random(seed))

    async def _start(self) -> None:
        self.appended_since_upload = False
        self.node_epoch += 1
        wal = await self._open_wal()
        running = await start_storage(
            self.directory,
            wal,
            self.store,
            params=PARAMS,
            node_epoch=self.node_epoch,
            namespace=NAMESPACE,
            wrap_client=HoldingClient,
            block_size_threshold_bytes=512,
            clock=self.clock,
            link_resolver=self.link_resolver,
        )
        assert isinstance(running.client, HoldingClient)
        self.storage, self.client, self.view = running.storage, running.client, running.view
        self.metadata_log = running.metadata_log
        self.stream_epoch += 1
        for stream_id, acknowledged in self.acknowledged.items():
            start, next_offset = await self.storage.open_stream(stream_id, self.stream_epoch)
            # Appends in doubt are either gone or, replayed by recovery, there for good.
            doubt = self.in_doubt.pop(stream_id, [])
            recovered = next_offset - len(acknowledged)
            assert 0 <= recovered <= len(doubt), (next_offset, len(acknowledged), len(doubt))
            if recovered:
                event("an append in doubt was recovered")
            acknowledged += [(len(acknowledged) + i, doubt[i]) for i in range(recovered)]
            assert start == self.start_offsets[stream_id]

    @initialize()
    def start(self) -> None:
        self.run(self._start())
        assert self.storage is not None
        for _ in range(STREAMS):
            stream_id = self.run(self.storage.create_stream())
            self.run(self.storage.open_stream(stream_id, self.stream_epoch))
            self.acknowledged[stream_id] = []
            self.start_offsets[stream_id] = 0

    @rule(
        stream_id=st.integers(min_value=0, max_value=STREAMS - 1),
        sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=6),
    )
    def append(self, stream_id: int, sizes: list[int]) -> None:
        assert self.storage is not None
        storage = self.storage

        async def append_all() -> list[int]:
            bases = []
            for size in sizes:
                self.serial += 1
                data = self.serial.to_bytes(4, "big") * (size // 4 + 1)
                base = await storage.append(stream_id, self.stream_epoch, data[:size], 1)
                self.acknowledged[stream_id].append((base, data[:size]))
                self.appended_since_upload = True
                bases.append(base)
            return bases

        self.run(append_all())

    @rule(
        stream_id=st.integers(min_value=0, max_value=STREAMS - 1),
        start=st.integers(min_value=0, max_value=40),
        max_bytes=st.sampled_from([1, 500, 10**9]),
    )
    def read(self, stream_id: int, start: int, max_bytes: int) -> None:
        assert self.storage is not None
        expected = self.acknowledged[stream_id]
        if start < self.start_offsets[stream_id]:
            with pytest.raises(OffsetOutOfRangeError):
                self.run(self.storage.read(stream_id, start, 10**9, max_bytes))
            return
        got = self.run(self.storage.read(stream_id, start, 10**9, max_bytes))
        if start >= len(expected):
            assert got == []
            return
        assert got, f"nothing read at {start} of {len(expected)}"
        assert got[0].base_offset == start
        for batch in got:
            assert (batch.base_offset, bytes(batch.payload)) == expected[batch.base_offset]

    @rule(stream_id=st.integers(min_value=0, max_value=STREAMS - 1), data=st.data())
    def trim(self, stream_id: int, data: st.DataObject) -> None:
        assert self.storage is not None
        low = self.start_offsets[stream_id]
        new_start = data.draw(st.integers(low, len(self.acknowledged[stream_id])))
        self.run(self.storage.trim_stream(stream_id, self.stream_epoch, new_start))
        self.start_offsets[stream_id] = new_start

    @rule(stream_id=st.sampled_from([lc.ALL_STREAMS, 0, 1]))
    def force_upload(self, stream_id: int) -> None:
        assert self.storage is not None
        self.run(self.storage.force_upload(stream_id))
        if stream_id == lc.ALL_STREAMS:
            self.appended_since_upload = False

    @precondition(lambda self: self.storage is not None)
    @rule(seed=st.integers(min_value=0, max_value=2**32), settle=st.booleans())
    def crash_and_restart(self, seed: int, settle: bool) -> None:
        """Kill the node (maybe while uploads or commits are in flight), then restart it."""
        assert self.storage is not None and self.metadata_log is not None
        if settle:
            self.run(asyncio.sleep(0.01))  # let some effects run part of the way
        self.run(self._kill(self.storage))
        self.run(self.metadata_log.close())
        self._reboot_wal(seed)
        self.run(self._start())

    @precondition(lambda self: self.storage is not None)
    @rule()
    def expire_orphans(self) -> None:
        """Settle, move the clock past every deadline and the retention, run the lifecycle:
        objects a crash left uploaded but uncommitted are expired and deleted; what remains in
        the store is exactly the committed objects."""
        assert self.storage is not None
        storage = self.storage
        self.run(storage.force_upload(lc.ALL_STREAMS))
        self.appended_since_upload = False
        self.clock.now_ms_value += OBJECT_TTL_MS + 1
        expired, _ = self.run(storage.run_object_lifecycle())
        self.clock.now_ms_value += sm.DEFAULT_PARAMS.object_retention_ms + 1
        _, removed = self.run(storage.run_object_lifecycle())
        assert removed >= expired
        if expired:
            event("orphaned objects expired and deleted")
        assert self.view is not None
        image = self.view.image
        committed = {
            object_key(NAMESPACE, o.object_id)
            for o in image.objects.values()
            if o.state is sm.S3ObjectState.COMMITTED
        }
        stored = {info.key for info in self.run(self.store.list())}
        assert stored == committed, (stored - committed, committed - stored)

    @precondition(lambda self: self.storage is not None and self.appended_since_upload)
    @rule(seed=st.integers(min_value=0, max_value=2**32))
    def crash_between_upload_and_commit(self, seed: int) -> None:
        """Hold commits, force an upload, crash once its objects are in the store, restart."""
        assert self.storage is not None and self.client is not None
        assert self.metadata_log is not None
        storage = self.storage
        self.client.hold_commits = True

        async def upload_until_stored() -> None:
            before = {info.key for info in await self.store.list()}
            task = asyncio.ensure_future(storage.force_upload(lc.ALL_STREAMS))
            for _ in range(200):
                if task.done() or {info.key for info in await self.store.list()} - before:
                    break
                await asyncio.sleep(0.001)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

        self.run(upload_until_stored())
        self.run(self._kill(storage))
        self.run(self.metadata_log.close())
        self._reboot_wal(seed)
        self.run(self._start())

    async def _kill(self, storage: S3Storage) -> None:
        tasks = [*storage._tasks, *([storage._ticker] if storage._ticker else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._cut_wal_power()
        with contextlib.suppress(BaseException):
            await storage._wal.close()

    @invariant()
    def every_acknowledged_append_reads_back_once_in_order(self) -> None:
        if self.storage is None:
            return
        for stream_id, expected in self.acknowledged.items():
            start = self.start_offsets[stream_id]
            got = self.run(self.storage.read(stream_id, start, 10**9, 10**9))
            assert [(b.base_offset, bytes(b.payload)) for b in got] == expected[start:]

    def teardown(self) -> None:
        try:
            if self.storage is not None:
                with contextlib.suppress(StorageError):
                    self.run(self._kill(self.storage))
            if self.metadata_log is not None:
                self.run(self.metadata_log.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


S3StorageMachine.TestCase.settings = settings(
    S3StorageMachine.TestCase.settings, max_examples=30, stateful_step_count=25
)
TestS3StorageMachine = S3StorageMachine.TestCase


class S3StorageOnObjectWalMachine(S3StorageMachine):
    """The same rules over the object WAL, plus a crash between a WAL upload and its check."""

    def __init__(self) -> None:
        super().__init__()
        self.wal_objects = LocalDirectoryObjectStore(self.directory / "wal", fsync=False)
        self.wal_store = FaultyObjectStore(self.wal_objects)

    async def _open_wal(self) -> WriteAheadLog:
        self.wal_store = FaultyObjectStore(self.wal_objects, seed=self.node_epoch)
        return await ObjectWal.open(
            self.wal_store,
            namespace=NAMESPACE,
            node_id=NODE_ID,
            node_epoch=self.node_epoch,
            config=ObjectWalConfig(batch_interval_ms=5, max_bytes_in_batch=2000),
        )

    def _cut_wal_power(self) -> None:
        self.wal_store.crash()

    def _reboot_wal(self, seed: int) -> None:
        pass  # what landed in the WAL's objects stays there

    @precondition(lambda self: self.storage is not None)
    @rule(
        stream_id=st.integers(min_value=0, max_value=STREAMS - 1),
        size=st.integers(min_value=1, max_value=700),
    )
    def crash_between_wal_upload_and_check(self, stream_id: int, size: int) -> None:
        """The WAL object of an append lands, the process dies before the reservation check:
        the append fails (never acknowledged) and is in doubt until the restart."""
        assert self.storage is not None and self.metadata_log is not None
        storage = self.storage
        self.serial += 1
        data = (self.serial.to_bytes(4, "big") * (size // 4 + 1))[:size]
        self.wal_store.crash_after_operations = 1
        with pytest.raises(StorageError):
            self.run(storage.append(stream_id, self.stream_epoch, data, 1))
        self.in_doubt.setdefault(stream_id, []).append(data)
        self.run(self._kill(storage))
        self.run(self.metadata_log.close())
        self.run(self._start())

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            asyncio.run(self.wal_objects.close())


S3StorageOnObjectWalMachine.TestCase.settings = settings(
    S3StorageOnObjectWalMachine.TestCase.settings, max_examples=30, stateful_step_count=25
)
TestS3StorageOnObjectWalMachine = S3StorageOnObjectWalMachine.TestCase
