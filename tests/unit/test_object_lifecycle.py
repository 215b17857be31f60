"""The object lifecycle (io/storage) over the controller's seams: orphans expire, destroyed
objects are deleted from the store and then forgotten; committed objects stay."""

from __future__ import annotations

from pathlib import Path

import pytest

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.io.metadata.client import connect_in_process
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage import s3stream
from automq_ref.io.storage.object_lifecycle import run_object_lifecycle
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import StreamErrorCode
from automq_ref.vocabulary.naming import object_key
from tests.storage_fixtures import NODE_ID, start_storage
from tests.unit.test_controller import write_some
from tests.waiting import wait_until_async


async def test_orphaned_objects_expire_and_are_deleted(tmp_path: Path) -> None:
    params = sm.StreamMetadataParams(object_retention_ms=1_000)
    async with (
        FileMetadataLog(tmp_path / "meta") as metadata_log,
        LocalDirectoryObjectStore(tmp_path / "objects") as store,
    ):
        controller = await Controller.open(metadata_log, params)
        client, view = connect_in_process(controller)
        stream_id = await write_some(controller)
        prepared = await client.submit(sm.PrepareObject(1, 5, 1, 100, 2_000))
        orphan = prepared.first_object_id
        assert orphan is not None
        # The upload happened, the commit never came (the node died in between).
        await store.put(object_key("ns", orphan), b"orphan bytes")

        async def lifecycle(now_ms: int) -> tuple[int, int]:
            return await run_object_lifecycle(client, view, store, "ns", now_ms, params=params)

        assert await lifecycle(2_050) == (0, 0)
        assert await lifecycle(2_101) == (1, 0)
        error, slices = sm.get_objects(view.image, stream_id, 0, 10, 10)
        assert error is StreamErrorCode.NONE
        assert orphan not in {s.object_id for s in slices}
        assert await lifecycle(3_200) == (0, 1)
        assert orphan not in view.image.objects
        assert [info.key for info in await store.list("")] == []
        # Committed objects are untouched by the lifecycle.
        assert view.image.streams[stream_id].end_offset == 10
        assert view.image == controller.image


async def test_the_storage_runs_the_lifecycle_only_while_its_broker_is_the_active_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a cluster only the active controller's broker reclaims objects (``runs_lifecycle``
    is asked before each round); the others' ticks skip it."""
    rounds: list[int] = []
    asked: list[bool] = []
    active = False

    async def counted(*args: object, **kwargs: object) -> tuple[int, int]:
        rounds.append(1)
        return 0, 0

    def runs_lifecycle() -> bool:
        asked.append(active)
        return active

    monkeypatch.setattr(s3stream, "run_object_lifecycle", counted)
    wal = await BlockWal.open(
        MemoryBlockDevice(1 << 20), node_id=NODE_ID, node_epoch=1, max_write_bytes=64 * 1024
    )
    params = lc.LogCacheParams(upload_threshold_bytes=1 << 20)
    running = await start_storage(
        tmp_path,
        wal,
        LocalDirectoryObjectStore(tmp_path / "objects"),
        params=params,
        runs_lifecycle=runs_lifecycle,
    )
    try:
        await wait_until_async(lambda: len(asked) >= 2, "two lifecycle ticks")
        assert not rounds
        active = True
        await wait_until_async(lambda: bool(rounds), "a lifecycle round once active")
    finally:
        await running.stop(close_store=True)
