"""The partition checkpoint (automq_ref/kafka/partition.py,
automq_ref/formats/partition_checkpoint.py): a partition closed cleanly and opened again answers
every index and producer-state question exactly as one that scanned its whole log, scans nothing
past a clean close, and a checkpoint that does not describe the log found (corrupt, past the
log's end, trimmed past, a clean since) is ignored for the full scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.meta_stream import latest_records, replay
from automq_ref.formats.partition_checkpoint import decode_checkpoint, encode_checkpoint
from automq_ref.formats.record_batch import build_record_batch
from automq_ref.kafka import log_state
from automq_ref.kafka import partition as partition_module
from automq_ref.kafka.compaction import clean_partition
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.partition_streams import read_meta
from automq_ref.node import Node, start_node
from tests.unit import test_broker_compaction as compaction_tests

PRODUCER = 7
NOW, EAGER, config_for = compaction_tests.NOW, compaction_tests.EAGER, compaction_tests.config_for
# The compaction tests' broker (embedded; cleans driven by the test), shared as their fixture.
node = compaction_tests.node


async def topic(node: Node, name: str, policy: str = "delete") -> Partition:
    await node.topics.create_topic(name, 1, {"cleanup.policy": policy})
    return node.topics.partitions[(name, 0)]


def batch(
    records: int,
    timestamp: int,
    sequence: int | None = None,
    key: bytes = b"k",
    epoch: int = 0,
    producer: int = PRODUCER,
) -> bytes:
    options: dict[str, Any] = {}
    if sequence is not None:
        options = {"producer_id": producer, "producer_epoch": epoch, "base_sequence": sequence}
    return build_record_batch(
        [(key + b"%d" % i, b"v" * 50, (), timestamp + i) for i in range(records)], **options
    )


async def append(partition: Partition, data: bytes) -> int:
    result = partition.append_nowait(data, 1 << 20)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    return result.base_offset


async def fill(
    partition: Partition, start_ms: int = NOW, batches: int = 12, producer: int = PRODUCER
) -> None:
    """Batches of varied sizes and timestamps (some out of order), some idempotent (sequences
    from 0: one call per producer), and one append holding two batches."""
    sequence = 0
    for i in range(batches):
        records = 1 + i % 4
        timestamp = start_ms + (i * 1000 if i % 5 else -5000)
        if i % 3 == 0:
            await append(partition, batch(records, timestamp, sequence, producer=producer))
            sequence += records
        else:
            await append(partition, batch(records, timestamp))
    await append(partition, batch(2, start_ms + 99_000) + batch(3, start_ms + 98_000))


@dataclass
class Answers:
    """What the index and the producer state answer."""

    start: int
    end: int
    index: list[tuple[int, int, int, int, bool]]
    producers: dict[int, tuple[int, list[tuple[int, int, int]]]]
    by_timestamp: list[tuple[int, int] | None]
    max_timestamp: tuple[int, int] | None
    retention: list[int]
    last_batches: frozenset[int]
    reads: list[list[bytes]]


async def answers(partition: Partition) -> Answers:
    start, end = partition.log_start_offset, partition.high_watermark
    return Answers(
        start,
        end,
        [
            (e.base_offset, e.end_offset, e.max_timestamp, e.size_bytes, e.empty)
            for e in partition.batches
            if e.end_offset > start
        ],
        {pid: (s.epoch, list(s.batches)) for pid, s in partition.producers.items()},
        [partition.offset_for_timestamp(NOW + delta) for delta in range(-10_000, 120_000, 500)],
        partition.max_timestamp_offset(),
        [
            partition.retention_trim_point(NOW + 200_000, retention_ms, retention_bytes)
            for retention_ms, retention_bytes in [(-1, 700), (-1, 0), (150_000, -1), (1, 10)]
        ],
        partition.producer_last_batches(),
        [
            [bytes(chunk) for chunk in await partition.read(offset, 300)]
            for offset in range(start, end)
        ],
    )


async def reopen(node: Node, partition: Partition) -> Partition:
    """Close the partition (as a move's old broker does) and open it again (as the new; at
    the same leader epoch, the one placement assigns)."""
    await partition.close()
    return await open_again(node, partition)


async def open_again(node: Node, partition: Partition) -> Partition:
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
    node.topics.partitions[(partition.topic, partition.index)] = opened
    return opened


async def full_scan_answers(
    node: Node, partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> tuple[Partition, Answers]:
    """Reopen with the checkpoint ignored: what the whole log's scan answers."""
    with monkeypatch.context() as patch:
        patch.setattr(Partition, "_load_checkpoint", lambda self, value: None)
        partition = await reopen(node, partition)
    assert not partition.checkpoint_used and partition.scanned_from == partition.log_start_offset
    return partition, await answers(partition)


async def test_a_clean_close_reopens_with_the_same_answers_and_no_scan(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "same")
    await fill(partition)
    live = await answers(partition)
    partition = await reopen(node, partition)
    assert partition.checkpoint_used
    assert partition.scanned_bytes == 0 and partition.scanned_from == live.end
    assert await answers(partition) == live
    partition, scanned = await full_scan_answers(node, partition, monkeypatch)
    assert partition.scanned_bytes > 0
    assert scanned == live


def producer_answers(partition: Partition) -> list[tuple[KafkaErrorCode, int]]:
    """How a retried batch, a sequence gap and a stale epoch are answered (none appends)."""
    end = partition.log_end_offset
    results = [
        partition.append_nowait(data, 1 << 20)
        for data in (
            batch(2, NOW, 0),  # a retry of one of the last five batches
            batch(3, NOW, 2),  # a retry of the last one
            batch(1, NOW, 9),  # a gap
            batch(1, NOW, 5, epoch=-1),  # an older epoch
        )
    ]
    assert partition.log_end_offset == end
    return [(result.error, result.base_offset) for result in results]


async def test_producer_state_survives_the_checkpoint(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "idempotent")
    first = await append(partition, batch(2, NOW, 0))
    second = await append(partition, batch(3, NOW, 2))
    await append(partition, batch(1, NOW))  # not idempotent
    live = producer_answers(partition)
    assert live == [
        (KafkaErrorCode.NONE, first),
        (KafkaErrorCode.NONE, second),
        (KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1),
        (KafkaErrorCode.INVALID_PRODUCER_EPOCH, -1),
    ]
    partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert producer_answers(partition) == live
    partition, _ = await full_scan_answers(node, partition, monkeypatch)
    assert producer_answers(partition) == live
    end = partition.log_end_offset
    assert await append(partition, batch(1, NOW, 5)) == end  # the next sequence goes on


async def test_records_past_the_checkpoint_are_scanned(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after more appends: the open loads the checkpoint and scans only what follows."""
    partition = await topic(node, "crashed")
    await fill(partition)
    partition = await reopen(node, partition)
    checkpoint_end = partition.high_watermark
    await fill(partition, NOW + 500_000, batches=5, producer=PRODUCER + 1)
    await append(partition, batch(1, NOW, 10))  # the producer's next batch, past the checkpoint
    live = await answers(partition)
    with monkeypatch.context() as patch:  # no checkpoint at this close: as after a crash
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_from == checkpoint_end
    assert partition.scanned_bytes > 0
    assert await answers(partition) == live
    _, scanned = await full_scan_answers(node, partition, monkeypatch)
    assert scanned == live


async def _no_checkpoint(self: Partition, end: int) -> None:
    return None


async def test_a_running_partition_checkpoints_periodically(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CHECKPOINT_INTERVAL_BYTES appended (when all appends are durable) a checkpoint is
    written: an open after a crash scans only past the last one."""
    partition = await topic(node, "periodic")
    monkeypatch.setattr(partition_module, "CHECKPOINT_INTERVAL_BYTES", 1000)
    await fill(partition)
    task = partition._checkpointing
    if task is not None:
        await task
    recorded = replay(await read_meta(node.storage, partition.meta_stream_id))
    checkpoint_end = decode_checkpoint(recorded.checkpoint).end
    assert 0 < checkpoint_end <= partition.high_watermark
    live = await answers(partition)
    with monkeypatch.context() as patch:  # a crash: no checkpoint at the close
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_from == checkpoint_end
    assert await answers(partition) == live


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda value: {**value, "version": 99}, id="other version"),
        pytest.param(lambda value: {**value, "batches": {**value["batches"], "crc": 1}}, id="crc"),
        pytest.param(lambda value: {**value, "end": value["end"] + 5}, id="past the log end"),
        pytest.param(lambda value: {**value, "data": value["data"] + 1000}, id="other stream"),
        pytest.param(lambda value: {**value, "producers": [[1, 2]]}, id="bad producers"),
        pytest.param(lambda value: "not a checkpoint", id="not an object"),
    ],
)
async def test_a_checkpoint_that_does_not_fit_falls_back_to_the_scan(
    node: Node, monkeypatch: pytest.MonkeyPatch, spoil: Any, caplog: pytest.LogCaptureFixture
) -> None:
    partition = await topic(node, "spoiled")
    await fill(partition)
    live = await answers(partition)
    encode = encode_checkpoint
    with monkeypatch.context() as patch:
        patch.setattr(log_state, "encode_checkpoint", lambda *args: spoil(encode(*args)))
        await partition.close()
    partition = await open_again(node, partition)
    assert not partition.checkpoint_used
    assert partition.scanned_from == partition.log_start_offset and partition.scanned_bytes > 0
    assert "checkpoint ignored" in caplog.text
    assert await answers(partition) == live
    # The open replaced it at once with what its scan rebuilt: an open after a crash (no
    # checkpoint at the close) scans nothing.
    with monkeypatch.context() as patch:
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert await answers(partition) == live


async def test_a_trim_after_the_checkpoint(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    partition = await topic(node, "trimmed")
    await fill(partition)
    partition = await reopen(node, partition)
    checkpoint_end = partition.high_watermark
    # Within the checkpoint: it is used, its entries below the new start dropped.
    await partition.trim(5)
    live = await answers(partition)
    with monkeypatch.context() as patch:
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert await answers(partition) == live
    # Past it (after more appends): ignored, the whole log scanned.
    partition = await reopen(node, partition)
    checkpoint_end = partition.high_watermark
    await fill(partition, NOW + 500_000, batches=4, producer=PRODUCER + 1)
    await partition.trim(checkpoint_end + 2)
    with monkeypatch.context() as patch:
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert not partition.checkpoint_used
    # The scan cannot know producers whose batches were all trimmed; the index agrees.
    scanned = await answers(partition)
    _, again = await full_scan_answers(node, partition, monkeypatch)
    assert scanned == again and scanned.start == checkpoint_end + 2


async def test_a_clean_after_the_checkpoint(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    partition = await topic(node, "cleaned", "compact")
    await fill(partition)
    partition = await reopen(node, partition)
    assert await clean_partition(partition, NOW + 200_000, EAGER) is not None
    with monkeypatch.context() as patch:  # a crash: the checkpoint names the old log
        patch.setattr(Partition, "_write_checkpoint", _no_checkpoint)
        partition = await reopen(node, partition)
    assert not partition.checkpoint_used
    scanned = await answers(partition)
    # A clean close after the clean checkpoints the cleaned log, and the next open uses it.
    partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert await answers(partition) == scanned


async def test_a_checkpoint_too_large_is_not_written(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "large")
    await fill(partition)
    partition = await reopen(node, partition)
    first_end = partition.high_watermark
    await fill(partition, NOW + 500_000, batches=4, producer=PRODUCER + 1)
    live = await answers(partition)
    monkeypatch.setattr(partition_module, "MAX_CHECKPOINT_BYTES", 10)
    partition = await reopen(node, partition)  # the older checkpoint, and a scan past it
    assert partition.checkpoint_used and partition.scanned_from == first_end
    assert await answers(partition) == live


async def test_a_lost_append_writes_no_checkpoint(node: Node) -> None:
    partition = await topic(node, "lost")
    await fill(partition, batches=3)
    partition._lost_append = True  # as a failed WAL write leaves it
    partition = await reopen(node, partition)
    assert not partition.checkpoint_used and partition.scanned_bytes > 0


async def test_the_metastream_stays_small_over_many_moves(node: Node) -> None:
    partition = await topic(node, "moved")
    await fill(partition)
    for _ in range(8):
        partition = await reopen(node, partition)
        assert partition.checkpoint_used and partition.scanned_bytes == 0
    payloads = await read_meta(node.storage, partition.meta_stream_id)
    assert node.storage.start_offset(partition.meta_stream_id) > 0
    latest = latest_records(payloads)
    assert sum(map(len, payloads)) <= 3 * sum(map(len, latest.values()))
    recorded = replay(payloads)
    assert recorded.data_stream_id == partition.data_stream_id
    assert recorded.leader_epochs == tuple(partition.leader_epochs)


async def test_a_restart_gives_the_same_answers(tmp_path: Path) -> None:
    """Through the node's shutdown and start. Whether the checkpoint is used depends on the
    shutdown: the controlled shutdown moves the partition away and the follower's close of it
    can be cut short when the follower stops (then the next open scans the whole log)."""
    node = await start_node(config_for(tmp_path))
    try:
        partition = await topic(node, "restarted")
        await fill(partition)
        live = await answers(partition)
    finally:
        await node.shutdown()
    node = await start_node(config_for(tmp_path))
    try:
        partition = node.topics.partitions[("restarted", 0)]
        assert await answers(partition) == live
    finally:
        await node.shutdown()
