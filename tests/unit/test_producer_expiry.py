"""Producer state expiry (automq_ref/kafka/producer_expiry.py, the rule in
automq_ref/kafka/partition_transactions.py): on a clock the test moves, a partition forgets a
producer id idle for ``producer.id.expiration.ms`` and not sooner, keeps one whose last batch is
inside the window, never forgets one whose transaction is open (and does once it has been idle
since its marker), answers a forgotten producer as a new one, lists it no more in
DescribeProducers; the last timestamp survives a checkpoint and a reopen, whose open runs the
pass; a checkpoint written before the timestamp existed still loads (the timestamp then taken
as the open's); the broker runs the pass every ``producer.id.expiration.check.interval.ms``; the
two settings parse and refuse 0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.describe_producers.v0.request import TopicRequest
from kio.schema.types import TopicName
from kio.static.primitive import i32

from automq_ref.config import ConfigError, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.json_document import Json
from automq_ref.formats.meta_stream import replay
from automq_ref.formats.partition_checkpoint import (
    NO_TIMESTAMP,
    ProducerRow,
    decode_checkpoint,
    encode_checkpoint,
)
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.clock import SystemClock
from automq_ref.kafka import log_state
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.partition_streams import read_meta
from automq_ref.kafka.producer_expiry import expire_producers
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, Seams, start_node
from tests.unit.test_broker_node import call
from tests.unit.test_partition_checkpoint import full_scan_answers, open_again, reopen

NOW = 1_700_000_000_000
EXPIRATION = 3_600_000  # producer.id.expiration.ms of these tests: one hour
PRODUCER = 42
OTHER = 43
PEER = Peer(1, "127.0.0.1:1")


class ManualClock:
    """Wall time the test moves; monotonic time runs (sleeps and long polls still end)."""

    def __init__(self) -> None:
        self.now = NOW

    def now_ms(self) -> int:
        return self.now

    def monotonic_s(self) -> float:
        return SystemClock().monotonic_s()


def overrides(tmp_path: Path, *more: str) -> list[str]:
    return [
        f"log.dirs={tmp_path}",
        "s3.wal.capacity=16777216",
        "log.cleaner.enable=false",
        f"producer.id.expiration.ms={EXPIRATION}",
        *more,
    ]


async def start(tmp_path: Path, clock: ManualClock, *more: str) -> Node:
    config = load_config(overrides=overrides(tmp_path, *more), environment={})
    return await start_node(config, Seams(clock))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def node(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Node]:
    node = await start(tmp_path, clock)
    try:
        yield node
    finally:
        await node.shutdown()


async def topic(node: Node, name: str) -> Partition:
    await node.topics.create_topic(name, 1, {})
    return node.topics.partitions[(name, 0)]


def batch(
    sequence: int,
    timestamp: int,
    records: int = 1,
    producer: int = PRODUCER,
    transactional: bool = False,
) -> bytes:
    """One idempotent (or transactional) batch whose records, and so its max timestamp, are
    all at ``timestamp``."""
    return build_record_batch(
        [(b"k%d" % (sequence + i), b"v", (), timestamp) for i in range(records)],
        producer_id=producer,
        producer_epoch=0,
        base_sequence=sequence,
        is_transactional=transactional,
    )


def produce(partition: Partition, data: bytes, guard: int = 0) -> log_state.ProduceResult:
    return partition.append_nowait(data, 1 << 20, verification_guard=guard)


async def append(partition: Partition, data: bytes, guard: int = 0) -> int:
    result = produce(partition, data, guard)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    return result.base_offset


def known(partition: Partition) -> list[int]:
    """The producer ids DescribeProducers lists (the partition's own answer)."""
    return [described.producer_id for described in partition.describe_producers()]


# --------------------------------------------------------------------------- idempotent


async def test_an_idle_producer_is_forgotten_after_the_expiration_and_not_before(
    node: Node, clock: ManualClock
) -> None:
    partition = await topic(node, "idle")
    await append(partition, batch(0, NOW, records=2))  # sequences 0-1
    clock.now = NOW + EXPIRATION - 1
    assert expire_producers(node.topics) == 0
    assert known(partition) == [PRODUCER]
    gap = produce(partition, batch(9, clock.now))
    assert gap.error is KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # still known

    clock.now = NOW + EXPIRATION  # now - last timestamp >= expiration: Kafka's rule
    assert expire_producers(node.topics) == 1
    assert known(partition) == [] and partition.producers == {}
    # A forgotten producer is a new one (as Kafka since 2.5): any sequence lands, and starts
    # its state afresh.
    end = partition.log_end_offset
    assert await append(partition, batch(9, clock.now)) == end
    assert await append(partition, batch(10, clock.now)) == end + 1
    assert produce(partition, batch(5, clock.now)).error is (
        KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert known(partition) == [PRODUCER]


async def test_a_batch_inside_the_window_keeps_its_producer(node: Node, clock: ManualClock) -> None:
    partition = await topic(node, "active")
    await append(partition, batch(0, NOW))
    await append(partition, batch(0, NOW, producer=OTHER))
    await append(partition, batch(1, NOW + EXPIRATION // 2))  # PRODUCER active again
    clock.now = NOW + EXPIRATION
    assert partition.expire_producers() == [OTHER]
    assert known(partition) == [PRODUCER]
    (described,) = partition.describe_producers()
    assert (described.last_sequence, described.last_timestamp) == (1, NOW + EXPIRATION // 2)
    clock.now = NOW + EXPIRATION // 2 + EXPIRATION
    assert partition.expire_producers() == [PRODUCER]
    assert known(partition) == []


async def test_describe_producers_lists_no_expired_producer(node: Node, clock: ManualClock) -> None:
    partition = await topic(node, "described")
    await append(partition, batch(0, NOW))
    await append(partition, batch(0, NOW + 1000, producer=OTHER))

    async def described() -> list[tuple[int, int]]:
        answer = await call(
            node.front_end.admit,
            PEER,
            61,  # DescribeProducers
            0,
            topics=(TopicRequest(name=TopicName("described"), partition_indexes=(i32(0),)),),
        )
        (topic_answer,) = answer.topics
        (partition_answer,) = topic_answer.partitions
        assert partition_answer.error_code == KafkaErrorCode.NONE
        return [
            (int(state.producer_id), int(state.last_timestamp))
            for state in partition_answer.active_producers
        ]

    assert await described() == [(PRODUCER, NOW), (OTHER, NOW + 1000)]
    clock.now = NOW + EXPIRATION
    expire_producers(node.topics)
    assert await described() == [(OTHER, NOW + 1000)]


# ------------------------------------------------------------------------- transactions


async def begin(partition: Partition, data: bytes) -> int:
    """The first transactional batch at the partition, verified as the produce handler does."""
    guard = partition.begin_transaction_verification(PRODUCER, 0)
    return await append(partition, data, guard)


async def test_an_open_transaction_is_never_expired_and_goes_once_idle_after_its_marker(
    node: Node, clock: ManualClock
) -> None:
    partition = await topic(node, "transactional")
    first = await begin(partition, batch(0, NOW, transactional=True))
    clock.now = NOW + 100 * EXPIRATION
    assert partition.expire_producers() == []
    (described,) = partition.describe_producers()
    assert described.current_txn_start_offset == first
    assert partition.last_stable_offset == first  # the transaction still holds the LSO
    # Its marker still finds the transaction (the coordinator writes it however late).
    assert await partition.write_marker(PRODUCER, 0, 0, commit=True) is KafkaErrorCode.NONE
    assert partition.last_stable_offset == partition.high_watermark
    marker_time = clock.now  # the marker's timestamp: the partition's clock
    (described,) = partition.describe_producers()
    assert (described.current_txn_start_offset, described.last_timestamp) == (-1, marker_time)
    clock.now = marker_time + EXPIRATION - 1
    assert partition.expire_producers() == []
    clock.now = marker_time + EXPIRATION
    assert partition.expire_producers() == [PRODUCER]
    assert known(partition) == [] and partition.transactions.entries == {}
    # Forgotten, the producer's next transaction begins as a new one's: verified first.
    assert partition.transaction_needs_verification(PRODUCER, 0)
    assert produce(partition, batch(1, clock.now, transactional=True)).error is (
        KafkaErrorCode.INVALID_TXN_STATE
    )
    await begin(partition, batch(1, clock.now, transactional=True))
    assert known(partition) == [PRODUCER]


async def test_a_verification_in_flight_keeps_an_idle_producer(
    node: Node, clock: ManualClock
) -> None:
    partition = await topic(node, "verifying")
    await begin(partition, batch(0, NOW, transactional=True))
    assert await partition.write_marker(PRODUCER, 0, 0, commit=True) is KafkaErrorCode.NONE
    clock.now = NOW + 10 * EXPIRATION
    guard = partition.begin_transaction_verification(PRODUCER, 0)  # begun now, not yet landed
    clock.now += EXPIRATION - 1
    assert partition.expire_producers() == []
    await append(partition, batch(1, NOW, transactional=True), guard)  # its guard still holds
    assert await partition.write_marker(PRODUCER, 0, 0, commit=False) is KafkaErrorCode.NONE
    clock.now += EXPIRATION  # idle since the marker
    assert partition.expire_producers() == [PRODUCER]


# ---------------------------------------------------------------------------- checkpoint


async def checkpoint_of(node: Node, partition: Partition) -> Json:
    """The last CHECKPOINT value in the partition's MetaStream."""
    return replay(await read_meta(node.storage, partition.meta_stream_id)).checkpoint


async def test_expiry_survives_a_checkpoint_and_a_reopen(
    node: Node, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "reopened")
    await append(partition, batch(0, NOW))
    await append(partition, batch(0, NOW + 5000, producer=OTHER))
    partition = await reopen(node, partition)
    assert partition.checkpoint_used
    (row, other) = decode_checkpoint(await checkpoint_of(node, partition)).producers
    assert (row.producer_id, row.last_timestamp) == (PRODUCER, NOW)
    assert (other.producer_id, other.last_timestamp) == (OTHER, NOW + 5000)
    assert {pid: state.last_timestamp for pid, state in partition.producers.items()} == {
        PRODUCER: NOW,
        OTHER: NOW + 5000,
    }
    clock.now = NOW + EXPIRATION  # PRODUCER is due, OTHER not yet; nothing ran the pass
    partition = await reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert known(partition) == [OTHER]  # the open ran the pass
    await append(partition, batch(7, clock.now))  # a new producer: any sequence
    # An open that scans the log (no checkpoint) rebuilds the timestamps and runs it too.
    clock.now = NOW + 5000 + EXPIRATION
    partition, _ = await full_scan_answers(node, partition, monkeypatch)
    assert known(partition) == [PRODUCER]  # the batch of sequence 7, stamped just now


def old_format(value: Json) -> Json:
    """``value`` as a checkpoint written before producers had a last timestamp: rows of three."""
    assert isinstance(value, dict) and isinstance(value["producers"], list)
    rows: list[Json] = [row[:3] for row in value["producers"] if isinstance(row, list)]
    return {**value, "producers": rows}


def test_an_old_format_checkpoint_decodes_with_the_timestamp_unknown() -> None:
    rows = [ProducerRow(PRODUCER, 0, ((0, 3, 0),), NOW), ProducerRow(OTHER, 2, ((5, 5, 9),))]
    value = encode_checkpoint(1, None, 10, [(0, 10, NOW, 100, False)], rows)
    assert decode_checkpoint(value).producers == tuple(rows)
    assert rows[1].last_timestamp == NO_TIMESTAMP
    old = old_format(value)
    text = json.dumps(old)
    assert "[42, 0, [[0, 3, 0]]]" in text  # what the earlier version wrote
    decoded = decode_checkpoint(json.loads(text))
    assert [(row.producer_id, row.last_timestamp) for row in decoded.producers] == [
        (PRODUCER, NO_TIMESTAMP),
        (OTHER, NO_TIMESTAMP),
    ]
    assert decoded.producers[0].batches == ((0, 3, 0),)


async def test_an_old_checkpoints_producer_is_kept_until_idle_after_the_open(
    node: Node, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "old")
    ancient = NOW - 50 * EXPIRATION  # long expired, had the checkpoint said so
    await append(partition, batch(0, ancient, records=2))
    written = log_state.checkpoint_value
    with monkeypatch.context() as patch:
        patch.setattr(log_state, "checkpoint_value", lambda *a, **k: old_format(written(*a, **k)))
        await partition.close()
    clock.now = NOW + 1000
    partition = await open_again(node, partition)
    assert partition.checkpoint_used
    (row,) = decode_checkpoint(await checkpoint_of(node, partition)).producers
    assert row.last_timestamp == NO_TIMESTAMP  # what it loaded
    # Unknown: taken as last active at the open, so kept, with its state.
    (described,) = partition.describe_producers()
    assert (described.producer_id, described.last_timestamp) == (PRODUCER, NOW + 1000)
    assert produce(partition, batch(9, clock.now)).error is (
        KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    clock.now = NOW + 1000 + EXPIRATION - 1
    assert partition.expire_producers() == []
    clock.now = NOW + 1000 + EXPIRATION
    assert partition.expire_producers() == [PRODUCER]


async def test_a_producer_seen_again_after_an_old_checkpoint_takes_its_batch_timestamp(
    node: Node, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "seen")
    await append(partition, batch(0, NOW))
    written = log_state.checkpoint_value
    with monkeypatch.context() as patch:
        patch.setattr(log_state, "checkpoint_value", lambda *a, **k: old_format(written(*a, **k)))
        await partition.close()
    clock.now = NOW + 10 * EXPIRATION
    partition = await open_again(node, partition)
    await append(partition, batch(1, NOW + 10 * EXPIRATION - 5))
    (described,) = partition.describe_producers()
    assert described.last_timestamp == NOW + 10 * EXPIRATION - 5
    clock.now = NOW + 11 * EXPIRATION - 5
    assert partition.expire_producers() == [PRODUCER]


# ------------------------------------------------------------------------- the broker


async def test_the_broker_expires_producers_every_check_interval(tmp_path: Path) -> None:
    clock = ManualClock()
    node = await start(tmp_path, clock, "producer.id.expiration.check.interval.ms=20")
    try:
        partition = await topic(node, "periodic")
        await append(partition, batch(0, NOW))
        await asyncio.sleep(0.1)  # rounds ran: nothing is due
        assert known(partition) == [PRODUCER]
        clock.now = NOW + EXPIRATION
        for _ in range(250):
            if not known(partition):
                break
            await asyncio.sleep(0.02)
        assert known(partition) == []
    finally:
        await node.shutdown()


def test_the_settings_parse_and_refuse_zero(tmp_path: Path) -> None:
    defaults = load_config(overrides=[f"log.dirs={tmp_path}"], environment={})
    assert defaults.producer_id_expiration_ms == 86_400_000
    assert defaults.producer_id_expiration_check_interval_ms == 600_000
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "producer.id.expiration.ms=5000",
            "producer.id.expiration.check.interval.ms=250",
        ],
        environment={},
    )
    assert (config.producer_id_expiration_ms, config.producer_id_expiration_check_interval_ms) == (
        5000,
        250,
    )
    from_env = load_config(
        overrides=[f"log.dirs={tmp_path}"],
        environment={"AUTOMQ_PRODUCER_ID_EXPIRATION_MS": "7"},
    )
    assert from_env.producer_id_expiration_ms == 7
    for name in ("producer.id.expiration.ms", "producer.id.expiration.check.interval.ms"):
        with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
            load_config(overrides=[f"log.dirs={tmp_path}", f"{name}=0"], environment={})
