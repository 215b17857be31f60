"""The main's side of snapshot reads (automq_ref/kafka/snapshot_sessions.py) with fakes: a
session's first answer adds every partition led here and names the WAL; later answers carry only
changes (PATCH, REMOVE, ADD); the WAL delta rides along while it fits in 32 KiB and is null
(read the WAL) once it overflowed; the long poll ends early when the WAL grows; an unknown
session or a wrong epoch starts a new session; idle sessions expire after 60 s; requestCommit
uploads before a new session's first answer and lazily (1 s) otherwise; a partition's facts
carry its last stable offset, an ADD where its older aborted entries end and a PATCH the
entries of the offsets it adds; aborted-transaction queries are answered at once from the
index (only entries below the high watermark), outside any session. And the two storage
hooks it uses, on a real S3Storage: the append listeners and the delayed WAL trims."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.control_batch import build_marker_batch
from automq_ref.formats.record_batch import RecordBatchView
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.formats.stream_record_batch import decode as decode_batch
from automq_ref.formats.zone_router import RecordOffset
from automq_ref.io.clock import SystemClock
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.kafka import snapshot_sessions as ss
from automq_ref.kafka.partition_transactions import PartitionTransactions
from automq_ref.protocol.partition_snapshot import (
    QUERY_SESSION_ID,
    AbortedAnswer,
    AbortedQuery,
    AbortedRange,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
    LogOffset,
    PartitionSnapshot,
    SnapshotOperation,
)
from tests.storage_fixtures import NODE_ID, start_storage
from tests.unit.test_s3stream import PARAMS

TOPIC = uuid.UUID(int=7)


@dataclass
class Led:
    topic_id: uuid.UUID
    index: int
    epoch: int
    data_stream_id: int
    end: int = 0
    start: int = 0
    transactions: PartitionTransactions = field(default_factory=lambda: PartitionTransactions(0))

    @property
    def high_watermark(self) -> int:
        return self.end

    @property
    def log_start_offset(self) -> int:
        return self.start

    def stable_offset(self, high_watermark: int) -> int:
        return self.transactions.stable_offset(high_watermark, self.log_start_offset)


class Clock(SystemClock):
    def __init__(self) -> None:
        self.offset_s = 0.0

    def monotonic_s(self) -> float:
        return time.monotonic() + self.offset_s


class Main:
    def __init__(self) -> None:
        self.led = {0: Led(TOPIC, 0, 3, 100), 1: Led(TOPIC, 1, 3, 101)}
        self.commits: list[float] = []
        self.clock = Clock()
        self.sessions = ss.SnapshotSessions(
            partitions=lambda: list(self.led.values()),
            commit=self.commit,
            wal_epoch=lambda: 5,
            wal_config="0@dir:///wal",
            clock=self.clock,
        )
        self.wal_end = 0

    async def commit(self, linger_s: float) -> None:
        self.commits.append(linger_s)

    def append(self, index: int, size: int) -> bytes:
        encoded = bytes([index]) * size
        self.led[index].end += 1
        self.sessions.on_append(encoded, self.wal_end, self.wal_end + size)
        self.wal_end += size
        return encoded

    async def ask(
        self, session: int = 0, epoch: int = 0, commit: bool = False, version: int = 2
    ) -> GetPartitionSnapshotResponse:
        return await self.sessions.handle(
            GetPartitionSnapshotRequest(session, epoch, commit), version
        )


def operations(response: GetPartitionSnapshotResponse) -> dict[int, tuple[SnapshotOperation, int]]:
    return {
        p.partition_index: (
            p.operation,
            p.log_end_offset.message_offset if p.log_end_offset else -1,
        )
        for topic in response.topics
        for p in topic.partitions
    }


def wal_end(response: GetPartitionSnapshotResponse) -> int:
    return RecordOffset.decode(response.confirm_wal_end_offset).offset


async def test_a_first_answer_adds_everything_then_only_changes() -> None:
    main = Main()
    main.append(0, 10)
    first = await main.ask()
    assert operations(first) == {0: (SnapshotOperation.ADD, 1), 1: (SnapshotOperation.ADD, 0)}
    assert first.confirm_wal_config == "0@dir:///wal" and wal_end(first) == 10
    assert RecordOffset.decode(first.confirm_wal_end_offset).epoch == 5
    snapshot = first.topics[0].partitions[0]
    assert snapshot.log_metadata is not None
    assert snapshot.log_metadata.stream_map == (("log", 100),) and snapshot.leader_epoch == 3
    data = main.append(1, 20)
    second = await main.ask(first.session_id, first.session_epoch)
    assert operations(second) == {1: (SnapshotOperation.PATCH, 1)}
    assert second.confirm_wal_config == "" and wal_end(second) == 30
    assert second.confirm_wal_delta_data == data
    del main.led[0]
    main.led[2] = Led(TOPIC, 2, 4, 102, end=9)
    third = await main.ask(second.session_id, second.session_epoch)
    assert operations(third) == {0: (SnapshotOperation.REMOVE, 1), 2: (SnapshotOperation.ADD, 9)}
    assert third.confirm_wal_delta_data == b""  # nothing new in the WAL, but not "read it"


async def test_the_delta_is_null_once_it_overflowed_and_syncs_again() -> None:
    main = Main()
    first = await main.ask()
    for _ in range(5):
        main.append(0, 10_000)  # 50 KB > 32 KiB
    second = await main.ask(first.session_id, first.session_epoch)
    assert second.confirm_wal_delta_data is None and wal_end(second) == 50_000
    # That answer's end covers what overflowed (the proxy reads the WAL up to it); what comes
    # after it is buffered again.
    small = main.append(1, 100)
    third = await main.ask(second.session_id, second.session_epoch)
    assert third.confirm_wal_delta_data == small and wal_end(third) == 50_100
    data = main.append(1, 100)
    fourth = await main.ask(third.session_id, third.session_epoch)
    assert fourth.confirm_wal_delta_data == data and wal_end(fourth) == 50_200
    # v1 has no delta field at all.
    main.append(0, 10)
    fifth = await main.ask(fourth.session_id, fourth.session_epoch, version=1)
    assert fifth.confirm_wal_delta_data is None and wal_end(fifth) == 50_210


async def test_the_long_poll_ends_when_the_wal_grows() -> None:
    main = Main()
    first = await main.ask()
    started = time.monotonic()
    idle = await main.ask(first.session_id, first.session_epoch)
    assert operations(idle) == {} and time.monotonic() - started >= ss.LONG_POLL_S * 0.9
    asking = asyncio.ensure_future(main.ask(idle.session_id, idle.session_epoch))
    await asyncio.sleep(0.01)
    assert not asking.done()
    main.append(0, 5)
    answer = await asyncio.wait_for(asking, ss.LONG_POLL_S)
    assert operations(answer) == {0: (SnapshotOperation.PATCH, 1)}


async def test_unknown_sessions_and_wrong_epochs_start_a_new_session() -> None:
    main = Main()
    first = await main.ask()
    wrong = await main.ask(first.session_id, first.session_epoch + 3)
    assert wrong.session_id != first.session_id
    assert {op for op, _ in operations(wrong).values()} == {SnapshotOperation.ADD}
    unknown = await main.ask(999, 1)
    assert unknown.session_id not in (999, wrong.session_id)


async def test_idle_sessions_expire() -> None:
    main = Main()
    first = await main.ask()
    assert first.session_id in main.sessions.sessions
    main.clock.offset_s += ss.SESSION_EXPIRY_S + 1
    other = await main.ask()
    assert set(main.sessions.sessions) == {other.session_id}


async def test_request_commit_uploads_at_once_for_a_new_session_else_lazily() -> None:
    main = Main()
    first = await main.ask(commit=True)
    assert main.commits == [0.0]  # before the answer was returned
    await main.ask(first.session_id, first.session_epoch, commit=True)
    await asyncio.sleep(0)
    assert main.commits == [0.0, ss.LAZY_COMMIT_S]


PRODUCER, OTHER = 42, 43


def land(main: Main, index: int, batch: bytes | None = None) -> None:
    """One record at partition ``index``'s end, durable: a Kafka batch (transactional, or a
    marker) goes into its transaction state as the partition's append puts it there."""
    led = main.led[index]
    if batch is not None:
        led.transactions.add(RecordBatchView(batch))
    main.append(index, 10)


def data(producer: int, offset: int) -> bytes:
    return build_record_batch(
        [(b"k", b"v", (), 0)],
        base_offset=offset,
        producer_id=producer,
        producer_epoch=0,
        base_sequence=offset,
        is_transactional=True,
    )


def snapshot_of(response: GetPartitionSnapshotResponse, index: int) -> PartitionSnapshot:
    [found] = [p for t in response.topics for p in t.partitions if p.partition_index == index]
    return found


async def test_answers_carry_the_lso_and_the_aborted_entries_of_the_offsets_they_add() -> None:
    """A partition's facts carry its LSO; an ADD says where the entries ending below its end
    end, never the entries; a PATCH carries the entries whose markers lie in the offsets it
    adds."""
    main = Main()
    land(main, 0, data(PRODUCER, 0))  # 0: PRODUCER's transaction
    land(main, 0, build_marker_batch(PRODUCER, 0, 0, False, 0, base_offset=1))  # 1: aborted
    land(main, 0, data(OTHER, 2))  # 2: OTHER's, open
    first = await main.ask()
    added = snapshot_of(first, 0)
    assert added.operation is SnapshotOperation.ADD
    assert added.first_unstable_offset == LogOffset(2) and added.log_end_offset == LogOffset(3)
    assert added.aborted == () and added.aborted_below == 2
    quiet = snapshot_of(first, 1)  # no transaction: the LSO is the end, nothing ended below it
    assert quiet.first_unstable_offset == quiet.log_end_offset == LogOffset(0)
    assert quiet.aborted_below == 0
    land(main, 0, build_marker_batch(OTHER, 0, 0, False, 0, base_offset=3))  # 3: aborted
    land(main, 0)  # 4: a plain record
    second = await main.ask(first.session_id, first.session_epoch)
    patched = snapshot_of(second, 0)
    assert patched.operation is SnapshotOperation.PATCH and patched.aborted_below is None
    assert patched.aborted == (AbortedRange(OTHER, 2, 3),)
    assert patched.first_unstable_offset == patched.log_end_offset == LogOffset(5)
    land(main, 0)  # 5: nothing aborted in what the next answer adds
    third = await main.ask(second.session_id, second.session_epoch)
    assert snapshot_of(third, 0).aborted == ()


async def test_queries_answer_the_entries_a_read_overlaps_at_once_and_touch_no_session() -> None:
    main = Main()
    land(main, 0, data(PRODUCER, 0))
    land(main, 0, build_marker_batch(PRODUCER, 0, 0, False, 0, base_offset=1))
    land(main, 0, data(OTHER, 2))
    land(main, 0, build_marker_batch(OTHER, 0, 0, False, 0, base_offset=3))
    # A third abort whose marker is not durable yet (past the high watermark, 4): never told.
    main.led[0].transactions.add(RecordBatchView(data(PRODUCER, 4)))
    main.led[0].transactions.add(
        RecordBatchView(build_marker_batch(PRODUCER, 0, 0, False, 0, base_offset=5))
    )
    queries = (
        AbortedQuery(TOPIC, 0, 0, 10, 3),  # last offset below 3
        AbortedQuery(TOPIC, 0, 0, 2, 100),  # first offset below 2
        AbortedQuery(TOPIC, 0, 2, 10, 100),  # last offset from 2 on, below the end (4)
        AbortedQuery(TOPIC, 9, 0, 10, 100),  # not led here
    )
    before = dict(main.sessions.sessions)
    started = time.monotonic()
    answer = await main.sessions.handle(
        GetPartitionSnapshotRequest(QUERY_SESSION_ID, -1, aborted_queries=queries), 2
    )
    assert time.monotonic() - started < ss.LONG_POLL_S  # no long poll
    assert dict(main.sessions.sessions) == before and answer.topics == ()
    assert answer.aborted_answers == (
        AbortedAnswer(TOPIC, 0, 0, (AbortedRange(PRODUCER, 0, 1),)),
        AbortedAnswer(TOPIC, 0, 0, (AbortedRange(PRODUCER, 0, 1),)),
        AbortedAnswer(TOPIC, 0, 0, (AbortedRange(OTHER, 2, 3),)),
        AbortedAnswer(TOPIC, 9, KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value),
    )
    # A session's request may ask too: the answer carries both.
    first = await main.sessions.handle(GetPartitionSnapshotRequest(aborted_queries=queries[:1]), 2)
    assert first.session_id in main.sessions.sessions and operations(first)
    assert first.aborted_answers == answer.aborted_answers[:1]


async def test_the_storage_reports_durable_records_and_delays_its_wal_trims(
    tmp_path: Path,
) -> None:
    """The two storage hooks snapshot reads use: every durable record goes to the append
    listeners in WAL order, as the WAL holds it; with a trim delay the WAL is trimmed that much
    after the commit that allows it (the main's WAL objects stay readable for proxies)."""
    objects = LocalDirectoryObjectStore(tmp_path / "wal", fsync=False)
    wal = await ObjectWal.open(
        objects,
        namespace="_kafka_test",
        node_id=NODE_ID,
        node_epoch=1,
        config=ObjectWalConfig(batch_interval_ms=5),
    )
    running = await start_storage(
        tmp_path, wal, LocalDirectoryObjectStore(tmp_path / "data", fsync=False), params=PARAMS
    )
    storage = running.storage
    heard: list[tuple[bytes, int, int]] = []
    storage.append_listeners.append(lambda *record: heard.append(record))
    storage.wal_trim_delay_s = 0.5
    stream = await storage.create_stream()
    await storage.open_stream(stream, 0)
    for n in range(3):
        await storage.append(stream, 0, b"record %d" % n, 1)
    decoded = [decode_batch(encoded)[0] for encoded, _, _ in heard]
    assert [(b.stream_id, b.base_offset, bytes(b.payload)) for b in decoded] == [
        (stream, n, b"record %d" % n) for n in range(3)
    ]
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(heard))
    await storage.force_upload(stream)
    await asyncio.sleep(0.1)
    assert wal.trim_offset == 0  # committed, not trimmed yet
    await asyncio.sleep(0.8)
    assert wal.trim_offset > 0
    await running.stop(close_store=True)
    await objects.close()
