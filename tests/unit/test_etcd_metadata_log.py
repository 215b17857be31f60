"""EtcdMetadataLog beyond the shared contract: etcd's limits, chunked snapshots, compaction, two
writers, the controller fence, and etcd unreachable. Against real etcd members started for the
module (one with etcd's default limits, one with a small request limit)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from automq_ref.io.metadata import etcd_metadata_log
from automq_ref.io.metadata.etcd_client import (
    DeleteRange,
    EtcdClient,
    EtcdCompacted,
    EtcdRejected,
    EtcdUnavailable,
    Get,
    prefix_end,
)
from automq_ref.io.metadata.etcd_metadata_log import (
    BatchTooLarge,
    EtcdLimits,
    EtcdMetadataLog,
    LeaderFence,
    NotController,
    decode_batch_value,
    encode_batch_value,
)
from automq_ref.io.metadata.metadata_log import (
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLogClosed,
    MetadataLogCorrupt,
    MetadataLogError,
    Snapshot,
)
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id

pytestmark = pytest.mark.asyncio(loop_scope="module")

SMALL_REQUEST_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


@pytest.fixture(scope="module")
def small_etcd() -> Iterator[EtcdServer]:
    """A member that refuses requests above 64 KiB."""
    with running_etcd("--max-request-bytes", str(SMALL_REQUEST_BYTES)) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def metadata_log(etcd: EtcdServer) -> AsyncIterator[EtcdMetadataLog]:
    log = await EtcdMetadataLog.connect([etcd.endpoint], unique_cluster_id())
    yield log
    await log.close()


async def test_batch_values_round_trip_and_refuse_damage() -> None:
    for records in ([], [b""], [b"a", b"", b"xyz" * 100]):
        assert decode_batch_value(encode_batch_value(records), "k") == records
    value = encode_batch_value([b"abc", b"de"])
    for damaged in (value[:3], value[:-1], value + b"\0", value[:6]):
        with pytest.raises(MetadataLogCorrupt):
            decode_batch_value(damaged, "k")


async def test_a_new_reader_sees_the_snapshot_then_the_records(etcd: EtcdServer) -> None:
    cluster = unique_cluster_id()
    writer = await EtcdMetadataLog.connect([etcd.endpoint], cluster)
    try:
        await writer.append([b"a", b"b", b"c"], expected_next_index=0)
        await writer.append([b"d", b"e"], expected_next_index=3)
        await writer.install_snapshot(4, b"image at 4")
        await writer.append([b"f"], expected_next_index=5)
    finally:
        await writer.close()
    reader = await EtcdMetadataLog.connect([etcd.endpoint], cluster)
    try:
        assert (reader.first_index, reader.next_index) == (4, 6)
        assert await reader.snapshot() == Snapshot(4, b"image at 4")
        assert await reader.read(4) == [LogEntry(4, b"e"), LogEntry(5, b"f")]
        with pytest.raises(LogTruncated) as truncated:
            await reader.read(3)
        assert truncated.value.snapshot_index == 4
    finally:
        await reader.close()


async def test_a_snapshot_deletes_covered_batches_and_compacts_history(
    metadata_log: EtcdMetadataLog,
) -> None:
    client = metadata_log.client
    for index in range(6):
        await metadata_log.append([b"r%d" % index], expected_next_index=index)
    old_revision = (await client.range(Get(metadata_log.batch_key(0)))).revision
    await metadata_log.install_snapshot(4, b"image")
    batches = metadata_log.batch_key(0)[: -etcd_metadata_log.INDEX_DIGITS]
    left = await client.range(Get(batches, prefix_end(batches)))
    assert [kv.key for kv in left.kvs] == [metadata_log.batch_key(4), metadata_log.batch_key(5)]
    # The history below the snapshot's revision is gone.
    with pytest.raises(EtcdCompacted):
        await client.range(Get(metadata_log.batch_key(0)), revision=old_revision)
    # A second snapshot replaces the first one's chunks.
    await metadata_log.install_snapshot(6, b"image 2")
    assert await metadata_log.snapshot() == Snapshot(6, b"image 2")
    chunks = metadata_log.batch_key(0).replace(b"batches/" + b"0" * 20, b"snapshot-chunks/")
    assert len((await client.range(Get(chunks, prefix_end(chunks)))).kvs) == 1


async def test_a_snapshot_inside_a_batch_keeps_that_batch(metadata_log: EtcdMetadataLog) -> None:
    await metadata_log.append([b"a", b"b", b"c"], expected_next_index=0)
    await metadata_log.append([b"d"], expected_next_index=3)
    await metadata_log.install_snapshot(1, b"up to 1")
    assert await metadata_log.read(1) == [
        LogEntry(1, b"b"),
        LogEntry(2, b"c"),
        LogEntry(3, b"d"),
    ]
    assert await metadata_log.read(2, 1) == [LogEntry(2, b"c")]
    with pytest.raises(ValueError, match="outside"):
        await metadata_log.install_snapshot(0, b"behind")
    with pytest.raises(ValueError, match="outside"):
        await metadata_log.install_snapshot(5, b"ahead")


async def test_reads_page_through_many_batches(
    metadata_log: EtcdMetadataLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(etcd_metadata_log, "READ_PAGE_BATCHES", 3)
    expected = []
    for index in range(0, 20, 2):
        await metadata_log.append([b"%d" % index, b"%d" % (index + 1)], expected_next_index=index)
        expected += [LogEntry(index, b"%d" % index), LogEntry(index + 1, b"%d" % (index + 1))]
    assert await metadata_log.read(0) == expected
    assert await metadata_log.read(5) == expected[5:]
    assert await metadata_log.read(5, 9) == expected[5:14]
    assert await metadata_log.read(20) == []


async def test_big_snapshots_are_chunked(metadata_log: EtcdMetadataLog) -> None:
    """A snapshot over etcd's request limit (5 MiB against 1.5 MiB) goes in chunks."""
    payload = bytes(range(256)) * (5 * 1024 * 1024 // 256) + b"tail"
    await metadata_log.append([b"x"], expected_next_index=0)
    await metadata_log.install_snapshot(1, payload)
    assert await metadata_log.snapshot() == Snapshot(1, payload)


async def test_limits_below_etcds_split_snapshots_and_refuse_big_batches(
    small_etcd: EtcdServer,
) -> None:
    limits = EtcdLimits(max_request_bytes=SMALL_REQUEST_BYTES)
    log = await EtcdMetadataLog.connect([small_etcd.endpoint], unique_cluster_id(), limits=limits)
    try:
        payload = b"0123456789abcdef" * (1024 * 1024 // 16)
        await log.install_snapshot(0, payload)
        assert await log.snapshot() == Snapshot(0, payload)
        with pytest.raises(BatchTooLarge, match="max-request-bytes"):
            await log.append([b"x" * SMALL_REQUEST_BYTES], expected_next_index=0)
        assert await log.read(0) == [] and log.next_index == 0
        # Records spread over many small ones still need one request: the sum counts.
        with pytest.raises(BatchTooLarge):
            await log.append([b"y" * 1024] * 64, expected_next_index=0)
        assert await log.append([b"y" * 1024] * 32, expected_next_index=0) == 32
    finally:
        await log.close()


async def test_etcd_refusing_a_request_is_an_error_with_nothing_applied(
    small_etcd: EtcdServer,
) -> None:
    """A log that believes etcd's default limit, against a member with a smaller one."""
    log = await EtcdMetadataLog.connect([small_etcd.endpoint], unique_cluster_id())
    try:
        with pytest.raises(MetadataLogError, match="nothing was applied") as refused:
            await log.append([b"z" * (SMALL_REQUEST_BYTES * 2)], expected_next_index=0)
        assert isinstance(refused.value.__cause__, EtcdRejected)
        assert await log.append([b"small"], expected_next_index=0) == 1
    finally:
        await log.close()


async def test_two_writers_one_wins_each_index(etcd: EtcdServer) -> None:
    cluster = unique_cluster_id()
    logs = [await EtcdMetadataLog.connect([etcd.endpoint], cluster) for _ in range(3)]
    try:
        outcomes = await asyncio.gather(
            *(log.append([b"w%d" % n], expected_next_index=0) for n, log in enumerate(logs)),
            return_exceptions=True,
        )
        winners = [outcome for outcome in outcomes if outcome == 1]
        losers = [outcome for outcome in outcomes if isinstance(outcome, LogIndexConflict)]
        assert len(winners) == 1 and len(losers) == 2
        assert all(loser.next_index == 1 for loser in losers)
        [entry] = await logs[1].read(0)
        assert entry.payload == b"w%d" % outcomes.index(1)
    finally:
        for log in logs:
            await log.close()


async def test_wait_for_follows_another_writer_and_ends_at_close(etcd: EtcdServer) -> None:
    cluster = unique_cluster_id()
    writer = await EtcdMetadataLog.connect([etcd.endpoint], cluster)
    follower = await EtcdMetadataLog.connect([etcd.endpoint], cluster)
    try:
        waiter = asyncio.ensure_future(follower.wait_for(1))
        await writer.append([b"a"], expected_next_index=0)
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await writer.append([b"b", b"c"], expected_next_index=1)
        assert await asyncio.wait_for(waiter, 5) == 3
        assert follower.next_index == 3
        blocked = asyncio.ensure_future(follower.wait_for(10))
        await asyncio.sleep(0.05)
        await follower.close()
        with pytest.raises(MetadataLogClosed):
            await asyncio.wait_for(blocked, 5)
        with pytest.raises(MetadataLogClosed):
            await follower.read(0)
    finally:
        await writer.close()
        await follower.close()


async def test_fenced_writes_need_the_election_key(metadata_log: EtcdMetadataLog) -> None:
    client = metadata_log.client
    key = f"/automq-ref/{metadata_log.cluster_id}/controller".encode()
    fenced = EtcdMetadataLog(client, metadata_log.cluster_id, fenced_writes=True)
    with pytest.raises(NotController):
        await fenced.append([b"a"], expected_next_index=0)
    with pytest.raises(NotController):
        await fenced.install_snapshot(0, b"")
    revision = await client.put(key, b"me")
    fenced.fence = LeaderFence(key, revision)
    assert await fenced.append([b"a"], expected_next_index=0) == 1
    # A stale index under a held fence is a plain conflict.
    with pytest.raises(LogIndexConflict):
        await fenced.append([b"b"], expected_next_index=0)
    # The key deleted (its lease expired) and made again by another node: fenced out.
    await client.txn((), (DeleteRange(key),))
    await client.put(key, b"someone else")
    with pytest.raises(NotController, match="election was lost"):
        await fenced.append([b"b"], expected_next_index=1)
    with pytest.raises(NotController):
        await fenced.install_snapshot(1, b"image")
    assert await metadata_log.read(0) == [LogEntry(0, b"a")]
    assert await metadata_log.snapshot() is None


async def test_unreachable_etcd_is_a_metadata_log_error() -> None:
    with running_etcd() as server:
        endpoint = server.endpoint
    with pytest.raises(MetadataLogError) as caught:
        log = await EtcdMetadataLog.connect([endpoint], unique_cluster_id(), request_timeout_s=1)
        await log.close()
    assert isinstance(caught.value.__cause__, EtcdUnavailable)


async def test_a_paused_etcd_fails_the_append_with_unknown_outcome(etcd: EtcdServer) -> None:
    """The request may wait in the stopped member's socket and be applied once it resumes, or
    not: the writer learns which from its next guarded append (a conflict at the old index
    means it landed), and the batch is there entirely or not at all."""
    log = await EtcdMetadataLog.connect([etcd.endpoint], unique_cluster_id(), request_timeout_s=1)
    try:
        await log.append([b"a"], expected_next_index=0)
        etcd.pause()
        try:
            with pytest.raises(MetadataLogError, match="outcome of a write is unknown") as caught:
                await log.append([b"b", b"c"], expected_next_index=1)
            assert isinstance(caught.value.__cause__, EtcdUnavailable)
        finally:
            etcd.resume()
        try:
            await log.append([b"d"], expected_next_index=1)
        except LogIndexConflict as conflict:
            assert conflict.next_index == 3
            landed = [b"a", b"b", b"c"]
        else:
            landed = [b"a", b"d"]
        assert [entry.payload for entry in await log.read(0)] == landed
    finally:
        await log.close()


async def test_a_client_with_several_endpoints_moves_to_the_next(etcd: EtcdServer) -> None:
    with running_etcd() as gone:
        dead = gone.endpoint
    client = EtcdClient([dead, etcd.endpoint], request_timeout_s=1)
    try:
        with pytest.raises(EtcdUnavailable):
            await client.get(b"/absent")
        assert await client.get(b"/absent") is None
        assert client.endpoint == etcd.endpoint
    finally:
        await client.close()
