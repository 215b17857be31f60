"""Log compaction over streams in process (automq_ref/kafka/compaction.py): a clean keeps every
key's last record at its offset, reads run across the cleaned and the live stream, and a
restart, or a clean cut short at any step, finds the same log.

The node runs with ``log.cleaner.enable=false``; each test drives the cleans itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from automq_ref.config import BrokerConfig, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import build_record_batch, iter_batches
from automq_ref.kafka.compaction import clean_partition, clean_round
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.retention import enforce_retention
from automq_ref.node import Node, start_node
from automq_ref.state_machines.compaction import CleanerConfig

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
