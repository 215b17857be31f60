"""The proxy's side of snapshot reads (automq_ref/kafka/snapshot_read.py) against a main made of
the real sessions (automq_ref/kafka/snapshot_sessions.py), a real object WAL and a real
RouterChannel in a local directory, with fake partitions and a fake committed-object reader:
the snapshot-read partition follows deltas, the main's WAL objects (read-only, when the delta
overflowed) and link records (resolved through the channel); replays of records already held
change nothing; a gap no replay filled waits for committed objects; a main restart takes back
nothing a fetch returned; the main's LSO travels with the end it describes and holds committed
reads, the aborted entries of what each answer adds are held, and a copy that began past an
entry asks the main for the ones a read overlaps, over a connection of its own. Each
partition's ConfirmWal machine checks its invariants after every step, and the trace of a run
is validated against specs/ConfirmWal.tla by TLC."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from automq_ref.formats.control_batch import build_marker_batch
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.zone_router import LinkRecord
from automq_ref.io.clock import SystemClock
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectStore
from automq_ref.io.storage.router_channel import (
    ChannelLinkResolver,
    RouterChannel,
    RouterChannelReader,
)
from automq_ref.io.storage.storage_errors import StorageError
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.kafka.partition_transactions import PartitionTransactions
from automq_ref.kafka.snapshot_read import (
    MainSubscriber,
    SnapshotPartition,
    SnapshotReads,
    read_wal_records,
)
from automq_ref.kafka.snapshot_sessions import SnapshotSessions
from automq_ref.protocol.partition_snapshot import decode_request_frame, encode_response_frame

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.waiting import wait_until_async

NS = "_kafka_snapread"
MAIN, PROXY, ROUTER = 1, 2, 3
STREAM = 100
TOPIC = uuid.UUID(int=9)
CONFIG = ObjectWalConfig(
    batch_interval_ms=5, max_bytes_in_batch=4096, retry_base_s=0.001, retry_max_s=0.01
)


@dataclass
class Led:
    topic_id: uuid.UUID
    index: int
    epoch: int
    data_stream_id: int
    end: int = 0
    transactions: PartitionTransactions = field(default_factory=lambda: PartitionTransactions(0))

    @property
    def high_watermark(self) -> int:
        return self.end

    @property
    def log_start_offset(self) -> int:
        return 0

    def stable_offset(self, high_watermark: int) -> int:
        return self.transactions.stable_offset(high_watermark, self.log_start_offset)


class Committed:
    """The committed objects of the main's streams, as any reader sees them."""

    def __init__(self) -> None:
        self.batches: list[StreamRecordBatch] = []
        self.reads = 0

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        self.reads += 1
        found = []
        cursor = start_offset
        for batch in sorted(self.batches, key=lambda b: b.base_offset):
            if batch.stream_id == stream_id and batch.base_offset <= cursor < batch.last_offset:
                if cursor >= end_offset:
                    break
                found.append(batch)
                cursor = batch.last_offset
        return found


class Main:
    """Node 1: one partition led here, its object WAL and the snapshot sessions."""

    def __init__(self, store: ObjectStore, wal: ObjectWal, epoch: int = 1) -> None:
        self.store = store
        self.wal = wal
        self.led = Led(TOPIC, 0, epoch, STREAM)
        self.appended: list[StreamRecordBatch] = []  # the data, as the LogCache holds it
        self.committed = Committed()
        self.sessions = SnapshotSessions(
            partitions=lambda: [self.led],
            commit=self.commit,
            wal_epoch=lambda: wal.node_epoch,
            wal_config="object WAL",
            clock=SystemClock(),
        )

    async def commit(self, linger_s: float) -> None:
        others = [b for b in self.committed.batches if b.stream_id != STREAM]
        self.committed.batches = [*others, *self.appended]

    async def append_batches(self, *batches: bytes) -> None:
        """Kafka batches of one record each, as one stored record at the partition's end; the
        transactional ones go into its transaction state as the partition's append puts them."""
        for batch in batches:
            view = RecordBatchView(batch)
            if view.is_transactional:
                self.led.transactions.add(view)
        await self.append(b"".join(batches), count=len(batches))

    async def append(self, payload: bytes, link: LinkRecord | None = None, count: int = 1) -> None:
        base = self.led.end
        data = StreamRecordBatch(STREAM, self.led.epoch, base, count, payload)
        written = (
            data
            if link is None
            else StreamRecordBatch(STREAM, self.led.epoch, base, -1, link.encode())
        )
        encoded = written.encode()
        result = await self.wal.append(encoded)
        self.led.end += count
        self.appended.append(data)
        self.sessions.on_append(encoded, result.record_offset, result.next_offset)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    async with LocalDirectoryObjectStore(tmp_path / "objects", fsync=False) as opened:
        yield opened


async def open_wal(store: ObjectStore, epoch: int) -> ObjectWal:
    wal = await ObjectWal.open(store, namespace=NS, node_id=MAIN, node_epoch=epoch, config=CONFIG)
    # A restart's recovery replays what an earlier epoch wrote (committed by then), then resets.
    _ = [record async for record in wal.recover()]
    await wal.reset()
    return wal


def subscriber(
    main: Main, *, wal_readable: bool = True, address: tuple[str, int] | None = None
) -> MainSubscriber:
    return MainSubscriber(
        MAIN,
        address=lambda node: address,
        topic_name=lambda topic_id: "t" if topic_id == TOPIC else None,
        committed=main.committed,
        resolver=ChannelLinkResolver(RouterChannelReader({0: main.store}, NS)),
        wal_store=lambda config: main.store if wal_readable and config else None,
        namespace=NS,
        sources=lambda: frozenset({MAIN, PROXY, ROUTER}),
        node_id=PROXY,
        record_trace=True,
    )


async def poll(sub: MainSubscriber, main: Main) -> None:
    request = sub.next_request()
    await sub.apply(await main.sessions.handle(request, 2))


async def everything(partition: SnapshotPartition) -> list[bytes]:
    payloads = await partition.read(partition.log_start_offset, 1 << 30)
    return [bytes(p) for p in payloads]


def trace_of(partition: SnapshotPartition) -> list[tv.TraceLine]:
    return [tv.TraceLine(action, state) for action, state in partition.trace]


async def test_deltas_links_wal_objects_and_duplicates(store: ObjectStore) -> None:
    main = Main(store, await open_wal(store, 1))
    channel = await RouterChannel.open(
        store,
        namespace=NS,
        node_id=ROUTER,
        node_epoch=1,
        channel_id=0,
        config=CONFIG,
        route_epoch=0,
    )
    sub = subscriber(main)
    await poll(sub, main)  # the session's first answer adds the partition, empty
    partition = sub.partitions[("t", 0)]
    assert partition.exposed == 0
    expected = [b"a0", b"a1"]
    for payload in expected:
        await main.append(payload)
    _, where = await channel.append(MAIN, 0, b"routed through node 3")
    await main.append(b"", LinkRecord(2, 0, 0, 1, where))
    expected.append(b"routed through node 3")
    await poll(sub, main)
    assert sub.delta_answers == 1 and partition.exposed == 3
    assert await everything(partition) == expected
    # More than the main's 32 KiB delta between two polls: the proxy reads its WAL objects.
    big = [bytes([n]) * 3000 for n in range(15)]
    for payload in big:
        await main.append(payload)
    expected += big
    await poll(sub, main)
    assert sub.wal_reads == 1 and partition.exposed == len(expected)
    assert await everything(partition) == expected
    # Replaying records the cache holds (an answer seen twice) changes nothing.
    end = main.wal.confirm_offset
    again = await read_wal_records(store, NS, MAIN, 1, 0, end)
    await partition.ingest([b for b in again if b.stream_id == STREAM])
    assert partition.steps["ReplayDuplicate"] == len(expected)
    assert await everything(partition) == expected
    assert partition.steps["ResolveLink"] == 1 and partition.steps["ServeRead"] > 0
    # From the middle of the log: whole batches from the one holding the offset.
    assert [bytes(p) for p in await partition.read(4, 1)] == [expected[4]]
    assert main.committed.reads == 0  # everything came from the cache
    await channel.close()
    await main.wal.close()
    if shutil.which("java") is not None:
        lines = trace_of(partition)
        verdict = tv.validate(lines, "ConfirmWal")
        assert verdict.accepted, verdict.message
        # The same run with the partition applied one record further than its answer said:
        # TLC rejects it at that line.
        apply = next(n for n, line in enumerate(lines) if line.action == "ApplySnapshot")
        state = dict(lines[apply].state)
        assert isinstance(state["exposed"], int)
        state["exposed"] += 1
        broken = [*lines[:apply], tv.TraceLine("ApplySnapshot", state)]
        verdict = tv.validate(broken, "ConfirmWal")
        assert not verdict.accepted and verdict.matched == apply, verdict.message


async def test_a_gap_waits_for_committed_objects(store: ObjectStore) -> None:
    main = Main(store, await open_wal(store, 1))
    sub = subscriber(main, wal_readable=False)  # a block WAL, say
    await poll(sub, main)
    partition = sub.partitions[("t", 0)]
    payloads = [bytes([n]) * 3000 for n in range(15)]
    for payload in payloads:
        await main.append(payload)
    await poll(sub, main)  # the delta overflowed, the WAL cannot be read
    assert partition.exposed == 0 and partition.wants_commit
    assert sub.next_request().request_commit
    await main.commit(0)
    await poll(sub, main)
    assert partition.exposed == len(payloads) and not partition.wants_commit
    assert await everything(partition) == payloads
    await main.wal.close()


async def test_a_main_restart_takes_back_nothing_served(store: ObjectStore) -> None:
    main = Main(store, await open_wal(store, 1))
    sub = subscriber(main)
    await poll(sub, main)
    partition = sub.partitions[("t", 0)]
    for n in range(3):
        await main.append(b"before %d" % n)
    await poll(sub, main)
    served = await everything(partition)
    assert len(served) == 3
    # The main restarts: a new WAL epoch, new sessions, the partition reopened one epoch
    # higher; what was durable stays (committed at the restart), more is appended.
    await main.commit(0)
    await main.wal.close()
    restarted = Main(store, await open_wal(store, 2), epoch=2)
    restarted.led.end = main.led.end
    restarted.appended = list(main.appended)
    restarted.committed = main.committed
    sub._committed = restarted.committed  # the same objects, as any reader sees them
    await poll(sub, restarted)  # the old session is unknown: a first answer
    assert sub.partitions[("t", 0)] is partition and partition.epoch == 2
    await restarted.append(b"after")
    await poll(sub, restarted)
    assert partition.exposed == 4
    assert (await everything(partition))[:3] == served
    assert await everything(partition) == [*served, b"after"]
    # OffsetForLeaderEpoch: the current epoch ends at the applied end; an older one reports no
    # truncation (the copy keeps no epoch history, and nothing served is ever taken back).
    assert partition.end_offset_for_epoch(2) == (2, 4)
    assert partition.end_offset_for_epoch(1) == (1, 4)
    await restarted.wal.close()
    if shutil.which("java") is not None:
        verdict = tv.validate(trace_of(partition), "ConfirmWal")
        assert verdict.accepted, verdict.message


async def test_evicted_records_are_read_from_committed_objects(store: ObjectStore) -> None:
    main = Main(store, await open_wal(store, 1))
    sub = subscriber(main)
    await poll(sub, main)
    partition = sub.partitions[("t", 0)]
    payloads = [b"r%d" % n for n in range(6)]
    for payload in payloads:
        await main.append(payload)
    await poll(sub, main)
    assert partition.evict(0) == sum(map(len, payloads))
    assert partition.floor == 6 and partition.cached_bytes == 0
    # Not committed yet: nothing to serve, and the next poll asks the main for an upload.
    assert await everything(partition) == []
    assert sub.next_request().request_commit
    await main.commit(0)
    assert await everything(partition) == payloads
    assert [bytes(p) for p in await partition.read(3, 1)] == [payloads[3]]
    await main.wal.close()


async def test_a_compacted_log_below_the_cleaned_end_comes_from_the_cleaned_stream(
    store: ObjectStore,
) -> None:
    main = Main(store, await open_wal(store, 1))
    for n in range(4):
        await main.append(b"live %d" % n)
    await main.commit(0)
    # A clean wrote offsets 0..3 compacted into one record of the cleaned stream 200.
    main.committed.batches.append(StreamRecordBatch(200, 1, 0, 4, b"compacted 0-3"))
    main.led.cleaned_stream_id = 200  # type: ignore[attr-defined]
    main.led.cleaned_end = 4  # type: ignore[attr-defined]
    sub = subscriber(main)
    await poll(sub, main)
    partition = sub.partitions[("t", 0)]
    assert partition.cleaned == (200, 4) and partition.exposed == 4
    await main.append(b"live 4")
    await poll(sub, main)
    assert await everything(partition) == [b"compacted 0-3", b"live 4"]
    await main.wal.close()


PRODUCER, OTHER = 42, 43


def txn(producer: int, offset: int) -> bytes:
    return build_record_batch(
        [(b"k", b"v", (), 0)],
        base_offset=offset,
        producer_id=producer,
        producer_epoch=0,
        base_sequence=offset,
        is_transactional=True,
    )


def plain(offset: int) -> bytes:
    return build_record_batch([(b"k", b"plain", (), 0)], base_offset=offset)


def abort(producer: int, offset: int) -> bytes:
    return build_marker_batch(producer, 0, 0, False, 0, base_offset=offset)


def offsets_of(payloads: list[bytes | memoryview]) -> list[int]:
    return [view.base_offset for payload in payloads for view in iter_batches(payload)]


@dataclass
class Wire:
    """What a listening main took and wrote, frames with their size prefixes; it answers the
    first ``answers`` polls only (None: every one)."""

    answers: int | None = None
    polls: int = 0
    taken: int = 0
    written: int = 0


@contextlib.asynccontextmanager
async def listening(main: Main, wire: Wire | None = None) -> AsyncIterator[tuple[str, int]]:
    """The main's AutomqGetPartitionSnapshot answered on a local port (as its listener does)."""
    wire = wire or Wire()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                version, correlation, _, request = decode_request_frame(
                    await reader.readexactly(size)
                )
                wire.polls += 1
                wire.taken += 4 + size
                if wire.answers is not None and wire.polls > wire.answers:
                    continue
                answer = await main.sessions.handle(request, version)
                frame = encode_response_frame(answer, version, correlation)
                writer.write(struct.pack(">i", len(frame)) + frame)
                wire.written += 4 + len(frame)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_copy_answers_read_committed_as_its_main(store: ObjectStore) -> None:
    """The main's LSO comes with the end it describes and holds a committed read below it (a
    stored record holding batches on both sides is cut there); the aborted entries of what
    each answer adds are held; a copy that began past an entry asks the main, over its own
    connection and several questions in one request, for the entries a read overlaps."""
    main = Main(store, await open_wal(store, 1))
    async with listening(main) as address:
        sub = subscriber(main, address=address)
        await poll(sub, main)
        partition = sub.partitions[("t", 0)]
        await main.append_batches(txn(PRODUCER, 0))  # 0: open
        await main.append_batches(plain(1))  # 1
        await poll(sub, main)
        assert (partition.exposed, partition.last_stable_offset) == (2, 0)
        assert await partition.read(0, 1 << 20, upper=partition.last_stable_offset) == []
        assert offsets_of(await partition.read(0, 1 << 20)) == [0, 1]
        await main.append_batches(abort(PRODUCER, 2))  # 2: PRODUCER's transaction aborted
        await main.append_batches(plain(3), txn(OTHER, 4))  # 3, and 4: OTHER's, open
        await poll(sub, main)
        assert (partition.exposed, partition.last_stable_offset) == (5, 4)
        assert offsets_of(await partition.read(0, 1 << 20, upper=4)) == [0, 1, 2, 3]
        assert partition.aborted_held(0, 4) == [(PRODUCER, 0)]
        assert partition.aborted_held(2, 4) == [(PRODUCER, 0)]
        assert partition.aborted_held(3, 4) == [] and partition.transactions.lookups == 0
        # A copy that begins now holds no entry, and knows one ended below its start (at 2).
        late = subscriber(main, address=address)
        await poll(late, main)
        copy = late.partitions[("t", 0)]
        assert copy.last_stable_offset == 4 and copy.aborted_held(3, 4) == []
        assert copy.aborted_held(0, 4) is None and copy.aborted_held(2, 4) is None
        asked = await asyncio.gather(
            copy.aborted_transactions(0, 4),
            copy.aborted_transactions(2, 3),
            copy.aborted_transactions(1, 1),  # first offset 0 < 1: it overlaps
            copy.aborted_transactions(0, 0),  # an empty read's range meets nothing
        )
        assert list(asked) == [[(PRODUCER, 0)], [(PRODUCER, 0)], [(PRODUCER, 0)], []]
        assert copy.transactions.lookups == 4
        assert late.queries.requests == 1  # one request for all four
        # OTHER's transaction aborts: both copies hold its entry from the answer.
        await main.append_batches(abort(OTHER, 5))
        await poll(sub, main)
        await poll(late, main)
        for held in (partition, copy):
            assert held.last_stable_offset == held.exposed == 6
            assert held.aborted_held(3, 6) == [(OTHER, 4)]
        assert await copy.aborted_transactions(0, 6) == [(PRODUCER, 0), (OTHER, 4)]
        await late.close()
        await sub.close()
    # The main no longer answers: a read that needs its entries fails, one that does not is
    # answered.
    gone = subscriber(main, address=address)
    await poll(gone, main)
    unreachable = gone.partitions[("t", 0)]
    assert unreachable.aborted_held(6, 6) == []  # at or past where the last entry ends
    with pytest.raises(StorageError, match="aborted transactions of node 1"):
        await unreachable.aborted_transactions(0, 6)
    await gone.close()
    await main.wal.close()


async def test_the_lso_moves_with_the_end_it_was_told_with(store: ObjectStore) -> None:
    """An answer whose records are not all there yet (a gap waits for committed objects) does
    not move the LSO: the copy answers the LSO and end it last applied, a pair its main had."""
    main = Main(store, await open_wal(store, 1))
    sub = subscriber(main, wal_readable=False)
    await poll(sub, main)
    partition = sub.partitions[("t", 0)]
    await main.append_batches(txn(PRODUCER, 0))
    await poll(sub, main)
    assert (partition.exposed, partition.last_stable_offset) == (1, 0)
    await main.append_batches(build_marker_batch(PRODUCER, 0, 0, True, 0, base_offset=1))
    for n in range(15):  # past the 32 KiB delta, and the WAL cannot be read
        await main.append(bytes([n]) * 3000)
    await poll(sub, main)
    assert partition.target_end == 17 and (partition.exposed, partition.last_stable_offset) == (
        1,
        0,
    )
    await main.commit(0)
    await poll(sub, main)
    assert (partition.exposed, partition.last_stable_offset) == (17, 17)
    await main.wal.close()


async def test_a_subscriber_counts_the_bytes_it_exchanges_with_its_main(store: ObjectStore) -> None:
    """Its polls and the main's answers, as the main's end saw them (the zone router's
    cross-zone bytes); a closed subscriber's stay in the node's totals."""
    main = Main(store, await open_wal(store, 1))
    wire = Wire(answers=2)
    async with listening(main, wire) as address:
        sub = subscriber(main, address=address)
        wanted = {MAIN}
        reads = SnapshotReads(node_id=PROXY, mains=lambda: wanted, subscriber=lambda m, c: sub)
        await reads.reconcile()
        try:
            await wait_until_async(lambda: wire.polls == 3, "a third poll, left unanswered")
            assert (sub.bytes_out, sub.bytes_in) == (wire.taken, wire.written)
            assert reads.traffic() == (wire.taken, wire.written) and wire.written > 0
        finally:
            wanted.clear()
            await reads.reconcile()  # the subscriber closed: its bytes stay counted
        assert reads.traffic() == (wire.taken, wire.written)
    await main.wal.close()
