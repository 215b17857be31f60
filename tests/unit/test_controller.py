"""The controller shell over the file metadata log: durable decisions, replay, snapshots, races."""

from __future__ import annotations

import asyncio
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
from automq_ref.io.metadata.client import connect_in_process, register_node
from automq_ref.io.metadata.controller import MAX_CONFLICT_RETRIES, Controller, ControllerError
from automq_ref.io.metadata.metadata_log import FileMetadataLog, LogIndexConflict
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
    listeners = st.lists(
        st.builds(sm.Endpoint, st.text(max_size=4), st.text(max_size=4), ints), max_size=2
    ).map(tuple)
    overrides = {
        "state": st.sampled_from(list(sm.StreamState)),
        "ranges": ranges,
        "listeners": listeners,
        "failover_mode": st.booleans(),
        "fenced": st.booleans(),
        "in_controlled_shutdown": st.booleans(),
        "key": st.text(max_size=8),
        "topic_id": st.text(max_size=8),
        "name": st.text(max_size=8),
        "rack": st.text(max_size=8),
        "wal_config": st.text(max_size=12),
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
        b'{"type": "S3StreamRecord", "stream_id": 1, "epoch": 0, "range_index": 0, '
        b'"start_offset": 0, "state": 1, "topic_id": 7}',
        b'{"type": "S3StreamRecord", "stream_id": 1, "epoch": 0, "range_index": 0, "state": 1}',
        b'{"type": "RegisterBrokerRecord", "node_id": 1, "node_epoch": 0, "rack": "a", '
        b'"listeners": [["PLAINTEXT", "h", "9"]]}',
        b'{"type": "BrokerRegistrationChangeRecord", "node_id": 1, "node_epoch": 0, '
        b'"fenced": 0, "in_controlled_shutdown": false}',
    ],
)
def test_malformed_records_are_refused(payload: bytes) -> None:
    """A wrong type, an unknown type or field, a missing field without a default."""
    with pytest.raises(InvalidFieldError):
        decode_record(payload)


def test_a_stream_record_from_before_tags_decodes_untagged() -> None:
    """A log written before streams had tags still decodes: the tags take their defaults."""
    payload = (
        b'{"type": "S3StreamRecord", "stream_id": 1, "epoch": 0, "range_index": 0, '
        b'"start_offset": 0, "state": 1}'
    )
    record = decode_record(payload)
    assert record == sm.S3StreamRecord(1, 0, 0, 0, sm.StreamState.OPENED)
    assert (record.topic_id, record.partition) == (sm.NO_TOPIC, sm.NO_PARTITION)


def test_a_broker_registration_from_before_published_wals_decodes_without_one() -> None:
    """A registration written before brokers published their WAL decodes with none (empty);
    one with it keeps it through the codec and the image's snapshot."""
    old = (
        b'{"type": "RegisterBrokerRecord", "node_id": 1, "node_epoch": 7, "rack": "a", '
        b'"listeners": [["PLAINTEXT", "h", 9]]}'
    )
    record = decode_record(old)
    assert record == sm.RegisterBrokerRecord(1, 7, "a", (sm.Endpoint("PLAINTEXT", "h", 9),))
    assert isinstance(record, sm.RegisterBrokerRecord) and record.wal_config == ""
    published = sm.RegisterBrokerRecord(1, 7, "a", (), "0@device://127.0.0.1:4000")
    assert decode_record(encode_record(published)) == published
    image = sm.replay_all(sm.StreamMetadataImage(), [published])
    assert image.brokers[1].wal_config == "0@device://127.0.0.1:4000"
    assert sm.replay_all(sm.StreamMetadataImage(), sm.image_records(image)) == image
    with pytest.raises(InvalidFieldError):
        decode_record(old[:-1] + b', "wal_config": 3}')


async def test_the_view_follows_every_applied_batch(tmp_path: Path) -> None:
    """The view is told of the controller's own decisions and of what it replays from another
    writer; a refusal or a no-op changes nothing; a waiter wakes at the next change."""
    metadata_log = RacingLog(tmp_path)
    await metadata_log.__aenter__()
    try:
        controller = await Controller.open(metadata_log)
        client, view = connect_in_process(controller)
        assert (view.version, view.image) == (0, controller.image)
        waiter = asyncio.ensure_future(view.wait_for_change(0))
        registered = await register_node(client, 1, 5)
        assert (registered.node_id, registered.node_epoch, registered.opening_streams) == (1, 5, ())
        assert await waiter == 1 and view.image.nodes[1].node_epoch == 5
        assert (
            await client.submit(sm.CreateStream(1, 4))
        ).error is StreamErrorCode.NODE_EPOCH_EXPIRED
        assert (await client.submit(sm.DeleteKV("absent"))).ok
        assert view.version == 1
        # Another writer's record, replayed before our decision: two batches, both seen.
        metadata_log.rival_records = [encode_record(sm.KVRecord("rival", b"1"))]
        assert (await client.submit(sm.PutKV("ours", b"2", False))).ok
        assert view.version == 3
        assert view.image == controller.image
        assert dict(view.image.kv) == {"rival": b"1", "ours": b"2"}
        # A restart on a clock that went back is granted an epoch above the stored one.
        assert (await register_node(client, 1, 2)).node_epoch == 6
    finally:
        await metadata_log.close()


async def test_a_replica_below_a_snapshot_loads_it_then_follows(tmp_path: Path) -> None:
    """Two controllers over one log (as on a shared log): the one that decides installs a
    snapshot past what the other applied; the other's catch_up loads the snapshot, replays the
    records after it, and its waiters wake."""
    async with FileMetadataLog(tmp_path) as metadata_log:
        deciding = await Controller.open(metadata_log)
        replica = await Controller.open(metadata_log)
        waiter = asyncio.ensure_future(replica.wait_applied(3))
        stream_id = await write_some(deciding)
        await deciding.snapshot()
        assert metadata_log.first_index == deciding.applied_index > replica.applied_index
        assert (await deciding.handle(sm.CloseStream(1, 5, stream_id, 0))).ok
        assert not waiter.done()
        await replica.catch_up()
        await asyncio.wait_for(waiter, 1)
        assert replica.image == deciding.image
        assert replica.applied_index == deciding.applied_index == metadata_log.next_index
        assert replica.bytes_since_snapshot > 0


async def test_heartbeats_are_timed_by_the_controllers_clock(tmp_path: Path) -> None:
    """A heartbeat that reaches the controller long after the broker sent it (sent again
    through a failover, queued behind a decision stuck on the log) renews the session from when
    the controller decides it, on the clock of its ExpireSessions ticks: the broker is alive.
    Timed by what the broker put in it, the session would be over already."""
    now_ms = 1_000_000
    timeout_ms = sm.DEFAULT_PARAMS.broker_session_timeout_ms
    sent_ms = now_ms - 2 * timeout_ms  # the broker's time when it sent the heartbeat
    async with FileMetadataLog(tmp_path / "timed") as metadata_log:
        controller = await Controller.open(metadata_log, now_ms=lambda: now_ms)
        client, _ = connect_in_process(controller)
        registration = await register_node(client, 7, 1)
        assert (await client.submit(sm.BrokerHeartbeat(7, registration.node_epoch, sent_ms))).ok
        assert controller.image.sessions[7] == now_ms + timeout_ms
        await client.submit(sm.ExpireSessions(now_ms + 1))
        assert [b.node_id for b in sm.live_brokers(controller.image)] == [7]
    # Without a clock the controller takes the broker's time: the stale heartbeat's session
    # is over, and the broker is fenced.
    async with FileMetadataLog(tmp_path / "untimed") as metadata_log:
        controller = await Controller.open(metadata_log)
        client, _ = connect_in_process(controller)
        registration = await register_node(client, 7, 1)
        assert (await client.submit(sm.BrokerHeartbeat(7, registration.node_epoch, sent_ms))).ok
        await client.submit(sm.ExpireSessions(now_ms + 1))
        assert sm.live_brokers(controller.image) == []


async def test_a_controller_elected_again_forgets_its_old_sessions(tmp_path: Path) -> None:
    """Sessions a controller kept from an earlier term ended while another controller heard
    the heartbeats: elected again, it starts every live broker's session afresh rather than
    fence them all at its first tick."""
    now_ms = 1_000_000
    timeout_ms = sm.DEFAULT_PARAMS.broker_session_timeout_ms
    async with FileMetadataLog(tmp_path) as metadata_log:
        controller = await Controller.open(metadata_log, now_ms=lambda: now_ms)
        client, _ = connect_in_process(controller)
        registration = await register_node(client, 7, 1)
        assert (await client.submit(sm.BrokerHeartbeat(7, registration.node_epoch, now_ms))).ok
        assert controller.image.sessions == {7: now_ms + timeout_ms}
        # Much later (another controller decided meanwhile), this one is elected again.
        later_ms = now_ms + 10 * timeout_ms
        await controller.take_over()
        assert controller.image.sessions == {}
        await client.submit(sm.ExpireSessions(later_ms))
        assert [b.node_id for b in sm.live_brokers(controller.image)] == [7]
        assert controller.image.sessions == {7: later_ms + timeout_ms}
