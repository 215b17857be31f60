"""The controller shell over the file metadata log: durable decisions, replay, snapshots, races."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.metadata_record import (
    RECORD_TYPES,
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
)
from automq_ref.io.metadata.controller import MAX_CONFLICT_RETRIES, Controller, ControllerError
from automq_ref.io.metadata.metadata_log import FileMetadataLog, LogIndexConflict
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.stream_objects import object_key
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.stream_metadata import NO_OBJECT, CommitRange, StreamErrorCode


async def write_some(controller: Controller) -> int:
    assert (await controller.handle(sm.RegisterNode(1, 5))).ok
    created = await controller.handle(sm.CreateStream(1, 5))
    assert created.stream_id is not None
    stream_id = created.stream_id
    assert (await controller.handle(sm.OpenStream(1, 5, stream_id, 0))).ok
    prepared = await controller.handle(sm.PrepareObject(1, 5, 1, 60_000, 1_000))
    assert prepared.first_object_id is not None
    commit = sm.CommitStreamSetObject(
        1,
        5,
        prepared.first_object_id,
        NO_OBJECT,
        100,
        (CommitRange(stream_id, 0, 0, 10),),
        (),
        (),
        False,
        1_001,
    )
    assert (await controller.handle(commit)).error is StreamErrorCode.NONE
    assert (await controller.handle(commit)).error is StreamErrorCode.REDUNDANT_OPERATION
    assert (await controller.handle(sm.PutKV("topic/0", b"\x00\x01", False))).ok
    return stream_id


async def test_decisions_survive_reopen_and_snapshots(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as metadata_log:
        controller = await Controller.open(metadata_log)
        stream_id = await write_some(controller)
        image = controller.image
        assert image.streams[stream_id].end_offset == 10
    async with FileMetadataLog(tmp_path) as metadata_log:
        reopened = await Controller.open(metadata_log)
        assert reopened.image == image
        await reopened.snapshot()
        assert (await reopened.handle(sm.CloseStream(1, 5, stream_id, 0))).ok
        closed = reopened.image
    async with FileMetadataLog(tmp_path) as metadata_log:
        assert metadata_log.first_index > 0
        again = await Controller.open(metadata_log)
        assert again.image == closed
        # A rejected request writes nothing.
        before = metadata_log.next_index
        response = await again.handle(sm.OpenStream(1, 4, stream_id, 1))
        assert response.error is StreamErrorCode.NODE_EPOCH_EXPIRED
        assert metadata_log.next_index == before


class RacingLog(FileMetadataLog):
    """Another controller appends a record just before our first append lands."""

    rival_records: list[bytes] = []

    async def append(self, records: Sequence[bytes], *, expected_next_index: int) -> int:
        if self.rival_records:
            rival, self.rival_records = self.rival_records, []
            await super().append(rival, expected_next_index=self.next_index)
        return await super().append(records, expected_next_index=expected_next_index)


async def test_a_lost_race_is_replayed_and_decided_again(tmp_path: Path) -> None:
    metadata_log = RacingLog(tmp_path)
    await metadata_log.__aenter__()
    try:
        controller = await Controller.open(metadata_log)
        assert (await controller.handle(sm.RegisterNode(1, 1))).ok
        # The rival registered node 1 at a newer epoch: our request must now be refused.
        metadata_log.rival_records = [encode_record(sm.NodeWALMetadataRecord(1, 7, False))]
        response = await controller.handle(sm.CreateStream(1, 1))
        assert response.error is StreamErrorCode.NODE_EPOCH_EXPIRED
        assert controller.image.nodes[1].node_epoch == 7
        assert controller.applied_index == metadata_log.next_index
        with pytest.raises(LogIndexConflict):
            await metadata_log.append([b"{}"], expected_next_index=0)
    finally:
        await metadata_log.close()


class AlwaysRacingLog(FileMetadataLog):
    """Another writer always gets there first: every append of ours conflicts."""

    async def append(self, records: Sequence[bytes], *, expected_next_index: int) -> int:
        await super().append([records[0]], expected_next_index=self.next_index)
        return await super().append(records, expected_next_index=expected_next_index)


async def test_a_log_that_keeps_moving_ahead_fails_the_request(tmp_path: Path) -> None:
    metadata_log = AlwaysRacingLog(tmp_path)
    await metadata_log.__aenter__()
    try:
        controller = await Controller.open(metadata_log)
        with pytest.raises(ControllerError, match="kept moving ahead"):
            await controller.handle(sm.RegisterNode(1, 1))
        # Each try caught up with the rival's record (our registration, raced in) and decided
        # again on the newer image: one epoch above the rival's each time.
        assert controller.applied_index == metadata_log.next_index == MAX_CONFLICT_RETRIES
        assert controller.image.nodes[1].node_epoch == MAX_CONFLICT_RETRIES
    finally:
        await metadata_log.close()


def records() -> st.SearchStrategy[sm.MetadataRecord]:
    ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
    ranges = st.lists(st.builds(sm.StreamOffsetRange, ints, ints, ints), max_size=3).map(tuple)
    overrides = {
        "state": st.sampled_from(list(sm.StreamState)),
        "ranges": ranges,
        "failover_mode": st.booleans(),
        "key": st.text(max_size=8),
        "value": st.binary(max_size=8),
    }
    strategies: list[st.SearchStrategy[sm.MetadataRecord]] = []
    for record_type in RECORD_TYPES.values():
        kwargs: dict[str, st.SearchStrategy[object]] = {}
        for name, annotation in record_type.__annotations__.items():
            if name == "state":
                kwargs[name] = st.sampled_from(
                    list(sm.S3ObjectState if record_type is sm.S3ObjectRecord else sm.StreamState)
                )
            elif name in overrides:
                kwargs[name] = overrides[name]
            else:
                assert annotation == "int", (record_type, name, annotation)
                kwargs[name] = ints
        strategies.append(st.builds(record_type, **kwargs))
    return st.one_of(strategies)


@given(record=records())
def test_every_record_round_trips(record: sm.MetadataRecord) -> None:
    assert decode_record(encode_record(record)) == record


@given(batch=st.lists(records(), max_size=5))
def test_snapshots_round_trip(batch: list[sm.MetadataRecord]) -> None:
    assert decode_snapshot(encode_snapshot(batch)) == batch


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[]",
        b'{"type": "Nope"}',
        b'{"type": "RemoveKVRecord"}',
        b'{"type": "RemoveKVRecord", "key": 3}',
        b'{"type": "KVRecord", "key": "k", "value": "zz"}',
        b'{"type": "S3StreamRecord", "stream_id": 1, "epoch": 0, "range_index": 0, '
        b'"start_offset": 0, "state": 7}',
        b'{"type": "RemoveS3StreamRecord", "stream_id": true}',
    ],
)
def test_malformed_records_are_refused(payload: bytes) -> None:
    with pytest.raises(InvalidFieldError):
        decode_record(payload)


async def test_orphaned_objects_expire_and_are_deleted(tmp_path: Path) -> None:
    params = sm.StreamMetadataParams(object_retention_ms=1_000)
    async with (
        FileMetadataLog(tmp_path / "meta") as metadata_log,
        LocalDirectoryObjectStore(tmp_path / "objects") as store,
    ):
        controller = await Controller.open(metadata_log, params)
        stream_id = await write_some(controller)
        prepared = await controller.handle(sm.PrepareObject(1, 5, 1, 100, 2_000))
        orphan = prepared.first_object_id
        assert orphan is not None
        # The upload happened, the commit never came (the node died in between).
        await store.put(object_key("ns", orphan), b"orphan bytes")
        assert await controller.run_object_lifecycle(store, "ns", 2_050) == (0, 0)
        assert await controller.run_object_lifecycle(store, "ns", 2_101) == (1, 0)
        error, slices = sm.get_objects(controller.image, stream_id, 0, 10, 10)
        assert error is StreamErrorCode.NONE
        assert orphan not in {s.object_id for s in slices}
        assert await controller.run_object_lifecycle(store, "ns", 3_200) == (0, 1)
        assert orphan not in controller.image.objects
        assert [info.key for info in await store.list("")] == []
        # Committed objects are untouched by the lifecycle.
        assert controller.image.streams[stream_id].end_offset == 10
