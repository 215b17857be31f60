"""Log compaction over streams in process (automq_ref/kafka/compaction.py): a clean keeps every
key's last record at its offset, reads run across the cleaned and the live stream, and a
restart, or a clean cut short at any step, finds the same log. Transaction markers go as
Kafka's cleaner removes them (a horizon once their transaction's data is gone, then a clean
past it), aborted-index entries with their transaction's data, and a reopen, from the
checkpoint or by a scan, finds the same transaction state.

The node runs with ``log.cleaner.enable=false``; each test drives the cleans itself.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from automq_ref.config import BrokerConfig, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.compacted_batch import delete_horizon
from automq_ref.formats.control_batch import batch_marker
from automq_ref.formats.record_batch import build_record_batch, iter_batches
from automq_ref.kafka.compaction import clean_partition, clean_round
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.retention import enforce_retention
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.state_machines.compaction import CleanerConfig
from tests.unit.test_broker_node import call

NOW = 1_700_000_000_000
EAGER = CleanerConfig(min_cleanable_dirty_ratio=0.0)  # any dirty byte makes a clean due

Log = list[tuple[int, bytes | None, bytes | None]]


def config_for(tmp_path: Path) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "log.cleaner.enable=false",
            "log.cleaner.min.cleanable.ratio=0",
            # The records are stamped NOW (2023): by the machine's clock their producers are
            # long idle, and would be forgotten at every open (producer expiry's own tests run
            # on a clock of their own: tests/unit/test_producer_expiry.py).
            f"producer.id.expiration.ms={100 * 365 * 86_400_000}",
        ],
        environment={},
    )


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await start_node(config_for(tmp_path))
    try:
        yield node
    finally:
        await node.shutdown()


async def topic(node: Node, name: str, policy: str = "compact", **configs: str) -> Partition:
    await node.topics.create_topic(name, 1, {"cleanup.policy": policy, **configs})
    return node.topics.partitions[(name, 0)]


async def produce(
    partition: Partition, records: Sequence[tuple[bytes | None, bytes | None]], **options: Any
) -> int:
    """One batch; returns its base offset once durable."""
    batch = build_record_batch([(key, value, (), NOW) for key, value in records], **options)
    result = partition.append_nowait(batch, 1 << 20, require_keys=True)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    return result.base_offset


async def read_log(partition: Partition) -> Log:
    """Every record from the log start to the high watermark, as a consumer reads them."""
    offset = partition.log_start_offset
    found: Log = []
    while offset < partition.high_watermark:
        chunks = await partition.read(offset, 1 << 20)
        assert chunks, f"nothing read at {offset}"
        for chunk in chunks:
            for view in iter_batches(chunk, compacted=True):
                found.extend(
                    (r.offset, r.key, r.value) for r in view.records() if r.offset >= offset
                )
                offset = max(offset, view.next_offset)
    return found


async def overwrite_log(partition: Partition) -> None:
    await produce(partition, [(b"a", b"1"), (b"b", b"1")])  # 0-1
    await produce(partition, [(b"a", b"2"), (b"c", b"1")])  # 2-3
    await produce(partition, [(b"b", None)])  # 4: tombstone
    await produce(partition, [(b"c", b"2"), (b"c", b"3")])  # 5-6


COMPACTED: Log = [(2, b"a", b"2"), (4, b"b", None), (6, b"c", b"3")]


async def test_a_clean_keeps_each_keys_last_record_at_its_offset(node: Node) -> None:
    partition = await topic(node, "kept")
    await overwrite_log(partition)
    result = await clean_partition(partition, NOW, EAGER)
    assert result is not None and (result.start, result.end) == (0, 7)
    assert await read_log(partition) == COMPACTED
    assert (partition.log_start_offset, partition.high_watermark) == (0, 7)
    assert partition.cleaned_end == 7
    # Nothing is due again until new records come.
    assert await clean_partition(partition, NOW, EAGER) is None
    # New records land in the live stream, past the cleaned end; the next clean covers them
    # and the previous cleaned stream goes.
    first_cleaned = partition.cleaned_stream_id
    await produce(partition, [(b"a", b"3"), (b"d", b"1")])  # 7-8
    assert await read_log(partition) == [*COMPACTED, (7, b"a", b"3"), (8, b"d", b"1")]
    assert await clean_partition(partition, NOW, EAGER) is not None
    assert await read_log(partition) == [
        (4, b"b", None),
        (6, b"c", b"3"),
        (7, b"a", b"3"),
        (8, b"d", b"1"),
    ]
    assert first_cleaned not in node.view.image.streams
    # ListOffsets by timestamp and the index read across the parts.
    assert partition.offset_for_timestamp(NOW) is not None


async def test_a_tombstone_goes_after_delete_retention(node: Node) -> None:
    partition = await topic(node, "tombstones")
    await overwrite_log(partition)
    config = CleanerConfig(delete_retention_ms=1000, min_cleanable_dirty_ratio=0.0)
    await clean_partition(partition, NOW, config)
    await produce(partition, [(b"e", b"1")])  # dirty again: a clean is due
    await clean_partition(partition, NOW + 1000, config)  # at the horizon: kept
    assert (4, b"b", None) in await read_log(partition)
    await produce(partition, [(b"e", b"2")])
    await clean_partition(partition, NOW + 1001, config)
    assert await read_log(partition) == [(2, b"a", b"2"), (6, b"c", b"3"), (8, b"e", b"2")]


async def test_a_restart_reads_the_same_log(tmp_path: Path) -> None:
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "restarted")
        await overwrite_log(partition)
        await clean_partition(partition, NOW, EAGER)
        await produce(partition, [(b"d", b"1")])
        before = await read_log(partition)
    finally:
        await node.shutdown()
    node = await start_node(config_for(tmp_path))
    try:
        partition = node.topics.partitions[("restarted", 0)]
        assert await read_log(partition) == before
        assert partition.cleaned_end == 7
        assert [entry.base_offset for entry in partition.batches] == [2, 4, 5, 7]
    finally:
        await node.shutdown()


async def test_a_clean_cut_short_before_its_commit_is_discarded(tmp_path: Path) -> None:
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "cut")
        await overwrite_log(partition)
        before = await read_log(partition)
        # Steps 1-3 of a clean, then a shutdown before the CLEANED record.
        async with partition.maintenance:
            stream_id = await partition.begin_clean(partition.log_start_offset)
            batch = build_record_batch([(b"z", b"never")], base_offset=0)
            await partition.append_cleaned(stream_id, batch, 1)
        assert await read_log(partition) == before
    finally:
        await node.shutdown()
    node = await start_node(config_for(tmp_path))
    try:
        partition = node.topics.partitions[("cut", 0)]
        assert stream_id not in node.view.image.streams
        assert partition.cleaned_stream_id is None
        assert await read_log(partition) == before
        assert await clean_partition(partition, NOW, EAGER) is not None
        assert await read_log(partition) == COMPACTED
    finally:
        await node.shutdown()


async def test_a_clean_that_fails_leaves_the_log_and_no_stream(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "failed")
    await overwrite_log(partition)
    before = await read_log(partition)
    created: list[int] = []
    begin = Partition.begin_clean

    async def remember(self: Partition, start: int) -> int:
        created.append(await begin(self, start))
        return created[-1]

    def refuse(self: Partition, stream_id: int, payload: bytes, end: int) -> Any:
        raise OSError("injected")

    monkeypatch.setattr(Partition, "begin_clean", remember)
    monkeypatch.setattr(Partition, "append_cleaned", refuse)
    with pytest.raises(OSError):
        await clean_partition(partition, NOW, EAGER)
    assert await read_log(partition) == before
    assert created and created[0] not in node.view.image.streams


async def test_a_committed_clean_is_finished_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "unsettled")
        await overwrite_log(partition)
        await clean_partition(partition, NOW, EAGER)
        replaced = partition.cleaned_stream_id
        await produce(partition, [(b"a", b"3")])  # 7
        # Commit, then stop before the live stream is trimmed and the old stream deleted.
        settle = Partition.settle

        async def skipped(self: Partition) -> None:
            return None

        monkeypatch.setattr(Partition, "settle", skipped)
        await clean_partition(partition, NOW, EAGER)
        after = await read_log(partition)
        assert after == [(4, b"b", None), (6, b"c", b"3"), (7, b"a", b"3")]
        assert replaced in node.view.image.streams
        assert node.storage.start_offset(partition.data_stream_id) == 7  # trimmed by clean 1
        monkeypatch.setattr(Partition, "settle", settle)
    finally:
        await node.shutdown()
    node = await start_node(config_for(tmp_path))
    try:
        partition = node.topics.partitions[("unsettled", 0)]
        assert replaced not in node.view.image.streams
        assert node.storage.start_offset(partition.data_stream_id) == 8
        assert await read_log(partition) == after
    finally:
        await node.shutdown()


async def test_trims_reach_into_the_cleaned_stream(node: Node) -> None:
    partition = await topic(node, "trimmed", "compact,delete")
    await overwrite_log(partition)
    await clean_partition(partition, NOW, EAGER)  # cleaned: 2, 4, 6; cleaned end 7
    await produce(partition, [(b"d", b"1")])  # 7
    await partition.trim(3)
    assert partition.log_start_offset == 3
    assert await read_log(partition) == [(4, b"b", None), (6, b"c", b"3"), (7, b"d", b"1")]
    await partition.trim(7)  # past the cleaned stream's end
    assert partition.log_start_offset == 7
    assert await read_log(partition) == [(7, b"d", b"1")]
    await produce(partition, [(b"d", b"2")])  # 8
    assert await clean_partition(partition, NOW, EAGER) is not None
    assert await read_log(partition) == [(8, b"d", b"2")]
    assert partition.log_start_offset == 7


async def test_retention_applies_to_compact_delete_only(node: Node) -> None:
    compacted = await topic(node, "only-compact", **{"retention.ms": "1"})
    both = await topic(node, "compact-delete", "compact,delete", **{"retention.ms": "1"})
    for partition in (compacted, both):
        await produce(partition, [(b"a", b"1")])
        await produce(partition, [(b"b", b"1")])
    await enforce_retention(node.topics, NOW + 10_000)
    assert compacted.log_start_offset == 0
    assert both.log_start_offset == 1  # never the last batch


async def test_keyless_records_are_refused_and_idempotent_state_survives(tmp_path: Path) -> None:
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "keys")
        keyless = build_record_batch([(b"k", b"v"), (None, b"v")])
        refused = partition.append_nowait(keyless, 1 << 20, require_keys=True)
        assert refused.error is KafkaErrorCode.INVALID_RECORD
        assert refused.message is not None and "without key" in refused.message
        # A producer whose every record is superseded keeps an empty last batch.
        await produce(partition, [(b"a", b"1")], producer_id=5, producer_epoch=0, base_sequence=0)
        await produce(partition, [(b"a", b"2")])
        await clean_partition(partition, NOW, EAGER)
        assert await read_log(partition) == [(1, b"a", b"2")]
        assert partition.batches[0].empty and partition.batches[0].base_offset == 0
    finally:
        await node.shutdown()
    node = await start_node(config_for(tmp_path))
    try:
        partition = node.topics.partitions[("keys", 0)]
        # A retry of that batch is still known as a duplicate after the restart, and the
        # producer's next sequence is still the one expected.
        retry = build_record_batch(
            [(b"a", b"1", (), NOW)], producer_id=5, producer_epoch=0, base_sequence=0
        )
        assert partition.append_nowait(retry, 1 << 20).base_offset == 0
        gap = build_record_batch(
            [(b"a", b"3", (), NOW)], producer_id=5, producer_epoch=0, base_sequence=2
        )
        assert partition.append_nowait(gap, 1 << 20).error is (
            KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        )
    finally:
        await node.shutdown()


async def test_the_cleaner_round_cleans_compacted_topics_only(node: Node) -> None:
    compacted = await topic(node, "round-compact")
    plain = await topic(node, "round-delete", "delete")
    for partition in (compacted, plain):
        await overwrite_log(partition)
    assert await clean_round(node.topics, node.config, node.clock) == 1
    assert await read_log(compacted) == COMPACTED
    assert len(await read_log(plain)) == 7


async def test_a_read_at_any_offset_finds_the_next_survivor(tmp_path: Path) -> None:
    """Enough data for the clean to write several stream records: wherever a consumer starts,
    in a gap or not, the first record it gets at or after its offset is the next survivor."""
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "gaps")
        last: dict[bytes, tuple[int, bytes]] = {}
        for batch in range(40):
            records = [
                (f"k{(batch * 7 + i) % 23}".encode(), bytes([batch]) * 3000) for i in range(5)
            ]
            base = await produce(partition, records)
            for delta, (key, value) in enumerate(records):
                last[key] = (base + delta, value)
        await clean_partition(partition, NOW, EAGER)
        assert partition.cleaned_stream_id is not None
        assert len(await node.storage.read(partition.cleaned_stream_id, 0, 200, 1 << 30)) > 1
        survivors = sorted((offset, key, value) for key, (offset, value) in last.items())
        assert await read_log(partition) == survivors
        for offset in range(partition.log_start_offset, partition.high_watermark):
            chunks = await partition.read(offset, 1)
            first = next(
                (r.offset, r.key, r.value)
                for chunk in chunks
                for view in iter_batches(chunk, compacted=True)
                for r in view.records()
                if r.offset >= offset
            )
            assert first == next(s for s in survivors if s[0] >= offset)
    finally:
        await node.shutdown()


# ------------------------------------------------------------------- transaction markers

TXN = 42  # a transactional producer id


async def produce_txn(
    partition: Partition, records: Sequence[tuple[bytes, bytes]], sequence: int
) -> int:
    """One transactional batch of TXN (verified first when it begins a transaction, as the
    produce handler does); returns its base offset once durable."""
    batch = build_record_batch(
        [(key, value, (), NOW) for key, value in records],
        producer_id=TXN,
        producer_epoch=0,
        base_sequence=sequence,
        is_transactional=True,
    )
    guard = 0
    if partition.transaction_needs_verification(TXN, 0):
        guard = partition.begin_transaction_verification(TXN, 0)
    result = partition.append_nowait(batch, 1 << 20, require_keys=True, verification_guard=guard)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    return result.base_offset


async def end_txn(partition: Partition, commit: bool) -> int:
    """TXN's marker; returns its offset."""
    offset = partition.log_end_offset
    assert await partition.write_marker(TXN, 0, 0, commit) is KafkaErrorCode.NONE
    return offset


Stored = list[tuple[int, bool, int | None]]


async def stored(partition: Partition) -> Stored:
    """(base offset, is a control batch, delete horizon) of every batch the log holds."""
    found: Stored = []
    async for record in partition.read_stored(partition.log_start_offset, partition.high_watermark):
        for view in iter_batches(record.payload, verify_crc=False, compacted=True):
            found.append((view.base_offset, view.is_control, delete_horizon(view.header())))
    return found


async def read_committed(node: Node, partition: Partition) -> Log:
    """Every record a READ_COMMITTED consumer gets from the log start on, by Fetch (v12):
    batches of the aborted transactions the answers list are skipped as a consumer does, up
    to their ABORT marker."""
    offset = partition.log_start_offset
    found: Log = []
    aborting: set[int] = set()
    while offset < partition.last_stable_offset:
        response: Any = await call(
            node.front_end.admit,
            Peer(1, "127.0.0.1:1"),
            1,  # Fetch
            12,
            replica_id=-1,
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=1,
            session_id=0,
            session_epoch=-1,
            topics=(
                FetchTopic(
                    topic=TopicName(partition.topic),
                    partitions=(
                        FetchPartition(
                            partition=i32(0),
                            current_leader_epoch=i32(-1),
                            fetch_offset=i64(offset),
                            last_fetched_epoch=i32(-1),
                            log_start_offset=i64(-1),
                            partition_max_bytes=i32(1 << 20),
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        (answer,) = response.responses[0].partitions
        assert int(answer.error_code) == 0
        listed = sorted(
            (int(entry.first_offset), int(entry.producer_id))
            for entry in answer.aborted_transactions or ()
        )
        views = list(iter_batches(bytes(answer.records or b""), compacted=True))
        assert views, f"nothing read at {offset}"
        for view in views:
            while listed and listed[0][0] <= view.last_offset:
                aborting.add(listed.pop(0)[1])
            if view.is_control:
                marker = batch_marker(view)
                if marker is not None and not marker.commit:
                    aborting.discard(view.producer_id)
            elif not (view.is_transactional and view.producer_id in aborting):
                found.extend(
                    (r.offset, r.key, r.value) for r in view.records() if r.offset >= offset
                )
            offset = max(offset, view.next_offset)
    return found


def transaction_state(partition: Partition) -> tuple[Any, ...]:
    return (
        partition.last_stable_offset,
        partition.high_watermark,
        partition.aborted_transactions(0, 1 << 62),
        partition.transactions.rows(),
        partition.describe_producers(),
    )


async def reopened(node: Node, partition: Partition, *, scan: bool) -> Partition:
    """The partition closed and opened again (as a move does), from its checkpoint or, with
    ``scan``, by a scan of the whole log (as after a crash)."""
    await partition.close()
    load = Partition._load_checkpoint
    if scan:
        Partition._load_checkpoint = lambda self, value: None  # type: ignore[method-assign]
    try:
        opened = await Partition.open(
            node.storage,
            node.client,
            node.view,
            partition.topic,
            partition.topic_id,
            partition.index,
            partition.epoch,
            node.topics.producer_expiry,
        )
    finally:
        Partition._load_checkpoint = load  # type: ignore[method-assign]
    assert opened.checkpoint_used is not scan
    node.topics.partitions[(partition.topic, partition.index)] = opened
    return opened


MARKERS = CleanerConfig(delete_retention_ms=1000, min_cleanable_dirty_ratio=0.0)


async def test_a_committed_transactions_marker_goes_a_clean_after_its_horizon(node: Node) -> None:
    partition = await topic(node, "committed-marker")
    await produce_txn(partition, [(b"a", b"1")], 0)  # 0
    await end_txn(partition, commit=True)  # 1
    await produce_txn(partition, [(b"b", b"1")], 1)  # 2: TXN's last data batch
    await end_txn(partition, commit=True)  # 3: TXN's last marker
    await produce(partition, [(b"a", b"2")])  # 4: supersedes the first transaction's a
    await clean_partition(partition, NOW, MARKERS)
    # The first transaction's batch went, so its marker got a horizon; the second's stays.
    assert await stored(partition) == [
        (1, True, NOW + 1000),
        (2, False, None),
        (3, True, None),
        (4, False, None),
    ]
    await produce(partition, [(b"c", b"1")])  # 5: dirty again
    await clean_partition(partition, NOW + 1000, MARKERS)  # at the horizon: kept
    assert (1, True, NOW + 1000) in await stored(partition)
    await produce(partition, [(b"c", b"2")])  # 6
    await clean_partition(partition, NOW + 1001, MARKERS)
    assert await stored(partition) == [
        (2, False, None),
        (3, True, None),
        (4, False, None),
        (6, False, None),
    ]
    assert await read_committed(node, partition) == [
        (2, b"b", b"1"),
        (4, b"a", b"2"),
        (6, b"c", b"2"),
    ]


async def test_a_transaction_with_a_record_left_keeps_its_marker(node: Node) -> None:
    partition = await topic(node, "kept-marker")
    await produce_txn(partition, [(b"a", b"1"), (b"b", b"1")], 0)  # 0-1
    await end_txn(partition, commit=True)  # 2
    await produce_txn(partition, [(b"c", b"1")], 2)  # 3
    await end_txn(partition, commit=True)  # 4
    await produce(partition, [(b"a", b"2")])  # 5: b=1 of the first transaction stays
    await clean_partition(partition, NOW, MARKERS)
    await produce(partition, [(b"d", b"1")])
    await clean_partition(partition, NOW + 10**9, MARKERS)  # long past any horizon
    assert await stored(partition) == [
        (0, False, None),
        (2, True, None),
        (3, False, None),
        (4, True, None),
        (5, False, None),
        (6, False, None),
    ]
    assert await read_committed(node, partition) == [
        (1, b"b", b"1"),
        (3, b"c", b"1"),
        (5, b"a", b"2"),
        (6, b"d", b"1"),
    ]


async def test_an_aborted_transaction_loses_its_data_its_index_entry_then_its_marker(
    node: Node,
) -> None:
    partition = await topic(node, "aborted-marker")
    await produce(partition, [(b"a", b"0")])  # 0
    await produce_txn(partition, [(b"a", b"1"), (b"b", b"1")], 0)  # 1-2: aborted
    await end_txn(partition, commit=False)  # 3
    await produce_txn(partition, [(b"c", b"1")], 2)  # 4: TXN's last data batch
    await end_txn(partition, commit=True)  # 5
    assert partition.aborted_transactions(0, 100) == [(TXN, 1)]
    await clean_partition(partition, NOW, MARKERS)
    # The aborted records went, and with them the index entry (a scan of this log finds no
    # aborted data); the marker waits for its horizon.
    assert await stored(partition) == [
        (0, False, None),
        (3, True, NOW + 1000),
        (4, False, None),
        (5, True, None),
    ]
    assert partition.aborted_transactions(0, 100) == []
    assert await read_committed(node, partition) == [(0, b"a", b"0"), (4, b"c", b"1")]
    await produce(partition, [(b"d", b"1")])  # 6
    await clean_partition(partition, NOW + 1001, MARKERS)
    assert await stored(partition) == [
        (0, False, None),
        (4, False, None),
        (5, True, None),
        (6, False, None),
    ]
    assert partition.aborted_transactions(0, 100) == []
    assert await read_committed(node, partition) == [
        (0, b"a", b"0"),
        (4, b"c", b"1"),
        (6, b"d", b"1"),
    ]


async def test_an_aborted_batch_kept_empty_keeps_its_marker_and_entry(node: Node) -> None:
    partition = await topic(node, "aborted-last")
    await produce_txn(partition, [(b"a", b"1")], 0)  # 0: aborted
    await produce_txn(partition, [(b"b", b"1")], 1)  # 1: aborted, TXN's last data batch
    await end_txn(partition, commit=False)  # 2
    await produce(partition, [(b"c", b"1")])  # 3
    await clean_partition(partition, NOW, MARKERS)
    await produce(partition, [(b"c", b"2")])
    await clean_partition(partition, NOW + 10**9, MARKERS)
    # Batch 1 stays, empty, for its producer's sake; so do the marker and the entry, which a
    # scan of this log rebuilds from that batch.
    assert await stored(partition) == [(1, False, None), (2, True, None), (4, False, None)]
    assert partition.aborted_transactions(0, 100) == [(TXN, 1)]
    assert await read_committed(node, partition) == [(4, b"c", b"2")]


async def test_a_reopen_after_a_clean_rebuilds_the_same_transaction_state(node: Node) -> None:
    partition = await topic(node, "reopened-markers")
    await produce_txn(partition, [(b"a", b"1")], 0)  # 0: aborted, gone in the clean
    await end_txn(partition, commit=False)  # 1
    await produce_txn(partition, [(b"d", b"1")], 1)  # 2
    await end_txn(partition, commit=True)  # 3
    await produce_txn(partition, [(b"c", b"1")], 2)  # 4: aborted, TXN's last data batch
    await end_txn(partition, commit=False)  # 5
    await produce(partition, [(b"b", b"1")])  # 6
    assert partition.aborted_transactions(0, 100) == [(TXN, 0), (TXN, 4)]
    await clean_partition(partition, NOW, MARKERS)
    await produce(partition, [(b"e", b"1")])  # 7
    await clean_partition(partition, NOW + 1001, MARKERS)
    log = await stored(partition)
    assert [(offset, control) for offset, control, _ in log] == [
        (2, False),
        (3, True),
        (4, False),  # empty, for its producer's sake
        (5, True),
        (6, False),
        (7, False),
    ]
    live = transaction_state(partition)
    assert live[2] == [(TXN, 4)]
    for scan in (False, True):
        partition = await reopened(node, partition, scan=scan)
        assert transaction_state(partition) == live
        assert await stored(partition) == log
    assert await read_committed(node, partition) == [
        (2, b"d", b"1"),
        (6, b"b", b"1"),
        (7, b"e", b"1"),
    ]


async def test_a_producers_last_marker_stays_with_its_epoch(node: Node) -> None:
    partition = await topic(node, "last-marker")
    await produce_txn(partition, [(b"a", b"1")], 0)  # 0: TXN's last data batch
    await end_txn(partition, commit=True)  # 1
    # A marker of a transaction with no data here, at a bumped epoch (as an abort on a
    # timeout writes): the last batch of TXN, whose epoch a scan can only find in it.
    assert await partition.write_marker(TXN, 1, 0, commit=False) is KafkaErrorCode.NONE  # 2
    await produce(partition, [(b"a", b"2")])  # 3
    await clean_partition(partition, NOW, MARKERS)
    await produce(partition, [(b"b", b"1")])  # 4
    await clean_partition(partition, NOW + 1001, MARKERS)
    # Past its horizon, but kept: the producer's last batch.
    assert await stored(partition) == [
        (0, False, None),  # empty, for its producer's sake, so marker 1 stays too
        (1, True, None),
        (2, True, NOW + 1000),
        (3, False, None),
        (4, False, None),
    ]
    live = transaction_state(partition)
    partition = await reopened(node, partition, scan=True)
    assert transaction_state(partition) == live
    (producer,) = partition.describe_producers()
    assert (producer.producer_id, producer.producer_epoch) == (TXN, 1)
