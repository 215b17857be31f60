"""The object lifecycle (io/storage) over the controller's seams: orphans expire, destroyed
objects are deleted from the store and then forgotten; committed objects stay."""

from __future__ import annotations

from pathlib import Path

from automq_ref.io.metadata.client import connect_in_process
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage.object_lifecycle import run_object_lifecycle
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import StreamErrorCode
from automq_ref.vocabulary.naming import object_key
from tests.unit.test_controller import write_some


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
