"""A partition's side of Kafka transactions (automq_ref/kafka/partition_transactions.py, driven
through automq_ref/kafka/partition.py): transactional batches land only once verified, markers
end transactions, the last stable offset holds at the oldest open transaction, the
aborted-transactions index answers by Kafka's rule and is trimmed with the log, all of it is
rebuilt by a reopen (from the checkpoint and by a scan), a READ_COMMITTED Fetch stops at the LSO,
so does a READ_COMMITTED ListOffsets by timestamp, and the control batch codec round-trips."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8, i32, i64

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.control_batch import (
    ControlType,
    Marker,
    batch_marker,
    build_marker_batch,
    decode_marker,
    encode_marker_key,
    encode_marker_value,
)
from automq_ref.formats.errors import FormatError
from automq_ref.formats.partition_checkpoint import (
    TransactionRow,
    decode_checkpoint,
    encode_checkpoint,
)
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.compaction import clean_partition
from automq_ref.kafka.handlers.offsets import _list_offset
from automq_ref.kafka.log_state import Producers, ProducerState, remember_batch
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.partition_transactions import PartitionTransactions
from automq_ref.kafka.server import Peer
from automq_ref.node import Node
from tests.unit import test_broker_compaction as compaction_tests
from tests.unit import test_partition_checkpoint as checkpoint_tests
from tests.unit.test_broker_node import call

NOW, EAGER = compaction_tests.NOW, compaction_tests.EAGER
node = compaction_tests.node  # an embedded broker, cleaner off (cleans driven here)
PEER = Peer(1, "127.0.0.1:1")
PRODUCER = 42
OTHER = 43


async def topic(node: Node, name: str, policy: str = "delete") -> Partition:
    await node.topics.create_topic(name, 1, {"cleanup.policy": policy})
    return node.topics.partitions[(name, 0)]


def txn_batch(
    sequence: int,
    records: int = 1,
    producer: int = PRODUCER,
    epoch: int = 0,
    key: bytes = b"k",
) -> bytes:
    return build_record_batch(
        [(key + b"%d" % (sequence + i), b"v%d" % (sequence + i), (), NOW) for i in range(records)],
        producer_id=producer,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=True,
    )


def plain_batch(records: int = 1, key: bytes = b"p") -> bytes:
    return build_record_batch([(key + b"%d" % i, b"plain", (), NOW) for i in range(records)])


async def append(partition: Partition, data: bytes, guard: int = 0) -> int:
    result = partition.append_nowait(data, 1 << 20, verification_guard=guard)
    assert result.error is KafkaErrorCode.NONE, result.message
    assert result.durable is not None
    await result.durable
    return result.base_offset


async def begin(partition: Partition, data: bytes) -> int:
    """The first batch of a transaction, verified as the produce handler does."""
    view = RecordBatchView(data)
    producer, epoch = view.producer_id, view.producer_epoch
    assert partition.transaction_needs_verification(producer, epoch)
    guard = partition.begin_transaction_verification(producer, epoch)
    return await append(partition, data, guard)


def state(partition: Partition) -> tuple[Any, ...]:
    """What the transaction state answers."""
    return (
        partition.last_stable_offset,
        partition.high_watermark,
        partition.aborted_transactions(0, 1 << 62),
        partition.describe_producers(),
    )


# ------------------------------------------------------------------------------ the codec


def test_the_marker_batch_round_trips() -> None:
    for commit, control_type in ((True, ControlType.COMMIT), (False, ControlType.ABORT)):
        data = build_marker_batch(PRODUCER, 3, 7, commit, NOW, base_offset=11)
        view = RecordBatchView(data)  # validates, CRC included
        header = view.header()
        assert view.is_control and view.is_transactional
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
            PRODUCER,
            3,
            -1,
        )
        assert (header.base_offset, header.records_count, header.max_timestamp) == (11, 1, NOW)
        marker = batch_marker(view)
        assert marker == Marker(control_type, 7) and marker.commit is commit
        record = view.records()[0]
        assert record.key == b"\x00\x00\x00" + bytes([control_type])
        assert record.value == b"\x00\x00\x00\x00\x00\x07"
    assert batch_marker(RecordBatchView(plain_batch())) is None
    assert decode_marker(encode_marker_key(ControlType.ABORT), encode_marker_value(-1)) == Marker(
        ControlType.ABORT, -1
    )
    # A later version's extra bytes are tolerated; an unknown type or short fields are not.
    assert (
        decode_marker(b"\x00\x01\x00\x01xx", b"\x00\x01\x00\x00\x00\x02yy").coordinator_epoch == 2
    )
    for key, value in (
        (b"\x00\x00\x00\x05", b"\x00" * 6),
        (b"\x00", b"\x00" * 6),
        (b"\x00" * 4, b""),
    ):
        with pytest.raises(FormatError):
            decode_marker(key, value)


def test_a_checkpoint_without_transactions_loads_as_none() -> None:
    plain = encode_checkpoint(5, None, 10, [(0, 10, NOW, 100, False)], [])
    assert isinstance(plain, dict) and "transactions" not in plain
    decoded = decode_checkpoint(plain)
    assert decoded.transactions == () and decoded.aborted == ()
    row = TransactionRow(PRODUCER, 2, 4, 1, NOW)
    value = encode_checkpoint(5, None, 10, [(0, 10, NOW, 100, False)], [], [row], [(OTHER, 1, 3)])
    decoded = decode_checkpoint(value)
    assert decoded.transactions == (row,) and decoded.aborted == ((OTHER, 1, 3),)
    assert isinstance(value, dict) and isinstance(value["transactions"], dict)
    value["transactions"]["aborted"] = [[OTHER, 5, 6], [OTHER, 1, 3]]  # out of order
    with pytest.raises(FormatError):
        decode_checkpoint(value)


# ------------------------------------------------------------------ verification and data


async def test_a_transactional_batch_lands_only_once_verified(node: Node) -> None:
    partition = await topic(node, "verify")
    refused = partition.append_nowait(txn_batch(0), 1 << 20)
    assert refused.error is KafkaErrorCode.INVALID_TXN_STATE
    assert partition.log_end_offset == 0
    guard = partition.begin_transaction_verification(PRODUCER, 0)
    wrong = partition.append_nowait(txn_batch(0), 1 << 20, verification_guard=guard + 1)
    assert wrong.error is KafkaErrorCode.INVALID_TXN_STATE
    # A guard left for another epoch does not do either.
    other = partition.begin_transaction_verification(OTHER, 1)
    assert other != guard
    assert (
        partition.append_nowait(
            txn_batch(0, producer=OTHER), 1 << 20, verification_guard=other
        ).error
        is KafkaErrorCode.INVALID_TXN_STATE
    )
    assert await append(partition, txn_batch(0), guard) == 0
    # The transaction is open: later batches need no verification.
    assert not partition.transaction_needs_verification(PRODUCER, 0)
    assert await append(partition, txn_batch(1, records=2)) == 1
    # Still idempotent: a retry is a duplicate, a gap is refused.
    retried = partition.append_nowait(txn_batch(1, records=2), 1 << 20)
    assert (retried.error, retried.base_offset) == (KafkaErrorCode.NONE, 1)
    gap = partition.append_nowait(txn_batch(9), 1 << 20)
    assert gap.error is KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # A non-transactional batch of the producer while its transaction is open is refused.
    idempotent = build_record_batch(
        [(b"x", b"y")], producer_id=PRODUCER, producer_epoch=0, base_sequence=3
    )
    assert partition.append_nowait(idempotent, 1 << 20).error is KafkaErrorCode.INVALID_TXN_STATE
    assert partition.log_end_offset == 3


async def test_a_marker_ends_the_transaction_and_moves_the_lso(node: Node) -> None:
    partition = await topic(node, "lso")
    await append(partition, plain_batch(2))  # 0-1
    assert partition.last_stable_offset == partition.high_watermark == 2
    first = await begin(partition, txn_batch(0))  # 2
    await append(partition, plain_batch())  # 3
    await append(partition, txn_batch(1))  # 4
    assert first == 2 and partition.high_watermark == 5
    assert partition.last_stable_offset == 2
    (described,) = partition.describe_producers()
    assert (described.producer_id, described.producer_epoch, described.last_sequence) == (
        PRODUCER,
        0,
        1,
    )
    assert (described.current_txn_start_offset, described.last_timestamp) == (2, NOW)
    assert await partition.write_marker(PRODUCER, 0, 5, commit=True) is KafkaErrorCode.NONE
    assert partition.high_watermark == 6  # the marker took offset 5
    assert partition.last_stable_offset == 6
    assert partition.aborted_transactions(0, 100) == []
    (described,) = partition.describe_producers()
    assert (described.current_txn_start_offset, described.coordinator_epoch) == (-1, 5)
    # The next transaction must be verified again.
    assert partition.transaction_needs_verification(PRODUCER, 0)
    assert partition.append_nowait(txn_batch(2), 1 << 20).error is KafkaErrorCode.INVALID_TXN_STATE


def test_the_lso_counts_a_transaction_until_its_marker_is_durable() -> None:
    transactions = PartitionTransactions(leader_epoch=3)
    transactions.add(RecordBatchView(txn_batch(0, records=2)))  # 0-1
    transactions.add(RecordBatchView(build_marker_batch(PRODUCER, 0, 0, True, NOW, base_offset=2)))
    assert transactions.unstable
    # The marker at 2 is not durable while the high watermark is at or below it.
    assert transactions.stable_offset(2, 0) == 0
    assert transactions.stable_offset(3, 0) == 3
    assert not transactions.unstable
    # Never below the log start, never above the high watermark.
    transactions.add(RecordBatchView(txn_batch(2, records=1), 0))
    assert transactions.stable_offset(9, 0) == 0 and transactions.stable_offset(9, 4) == 4
    # A guard carries the leader epoch; verifications at one epoch share it until a batch of
    # the producer lands; one for another epoch, or after a batch, gets a number never used.
    guard = transactions.begin_verification(OTHER, 0)
    assert guard >> 32 == 3 and transactions.begin_verification(OTHER, 0) == guard
    bumped = transactions.begin_verification(OTHER, 1)
    assert bumped != guard and transactions.begin_verification(OTHER, 1) == bumped
    transactions.add(RecordBatchView(build_marker_batch(OTHER, 1, 0, False, NOW, base_offset=3)))
    after = transactions.begin_verification(OTHER, 1)
    assert after not in (guard, bumped)
    assert PartitionTransactions(leader_epoch=4).begin_verification(OTHER, 1) not in (
        guard,
        bumped,
        after,
    )


def test_expiry_forgets_the_idle_keeps_the_open_and_the_unknown() -> None:
    """PartitionTransactions.expire (Kafka's isProducerExpired), on batches landed in order."""
    day = 86_400_000
    transactions = PartitionTransactions(leader_epoch=1)
    producers: Producers = {}
    views = [
        RecordBatchView(bytearray(txn_batch(0))),  # PRODUCER's transaction opens at NOW
        RecordBatchView(bytearray(txn_batch(0, producer=OTHER))),
        RecordBatchView(bytearray(build_marker_batch(OTHER, 0, 0, True, NOW + 10))),
    ]
    for offset, view in enumerate(views):
        view.set_base_offset(offset)
        remember_batch([], producers, view)
        transactions.add(view)
    remember_batch([], producers, RecordBatchView(plain_batch()))  # no producer: nothing
    producers[99] = ProducerState(0)  # a last timestamp unknown
    assert sorted(producers) == [PRODUCER, OTHER, 99]
    assert transactions.expire(producers, NOW + 10 + day - 1, day) == []
    # OTHER's marker at NOW + 10 was its last batch; PRODUCER's transaction is open.
    assert transactions.expire(producers, NOW + 10 + day, day) == [OTHER]
    assert sorted(producers) == [PRODUCER, 99] and OTHER not in transactions.entries
    assert transactions.expire(producers, NOW + 1000 * day, day) == []
    assert [d.producer_id for d in transactions.describe(producers)] == [PRODUCER, 99]
    # Its marker lands (however late): idle from the marker's timestamp on, it goes.
    later = NOW + 1000 * day
    marker = RecordBatchView(build_marker_batch(PRODUCER, 0, 0, False, later, base_offset=3))
    transactions.add(marker)
    assert transactions.expire(producers, later + day - 1, day) == []
    assert transactions.expire(producers, later + day, day) == [PRODUCER]
    assert sorted(producers) == [99] and transactions.entries == {}
    assert transactions.aborted == [(PRODUCER, 0, 3)]  # the index is the log's, not a producer's


async def test_a_pending_marker_holds_the_lso(node: Node) -> None:
    partition = await topic(node, "pending")
    await begin(partition, txn_batch(0))
    task = asyncio.ensure_future(partition.write_marker(PRODUCER, 0, 0, commit=True))
    await asyncio.sleep(0)  # the marker's offset is assigned
    assert partition.log_end_offset == 2
    assert partition.last_stable_offset == (0 if partition.high_watermark < 2 else 2)
    assert await task is KafkaErrorCode.NONE
    assert partition.last_stable_offset == partition.high_watermark == 2


async def test_an_abort_is_indexed_by_kafkas_rule(node: Node) -> None:
    partition = await topic(node, "abort")
    await append(partition, plain_batch())  # 0
    await begin(partition, txn_batch(0, records=2))  # 1-2
    await begin(partition, txn_batch(0, producer=OTHER))  # 3
    await append(partition, txn_batch(2))  # 4
    assert partition.last_stable_offset == 1
    assert await partition.write_marker(PRODUCER, 0, 0, commit=False) is KafkaErrorCode.NONE  # 5
    assert partition.last_stable_offset == 3  # OTHER's transaction still open
    assert await partition.write_marker(OTHER, 0, 0, commit=True) is KafkaErrorCode.NONE  # 6
    assert partition.last_stable_offset == partition.high_watermark == 7
    # (producer id, first offset) for every one with last offset >= fetch offset and first
    # offset < upper bound.
    assert partition.aborted_transactions(0, 7) == [(PRODUCER, 1)]
    assert partition.aborted_transactions(5, 7) == [(PRODUCER, 1)]
    assert partition.aborted_transactions(6, 7) == []
    assert partition.aborted_transactions(0, 1) == []
    assert partition.aborted_transactions(0, 2) == [(PRODUCER, 1)]
    # An empty transaction (no data here) is not indexed.
    assert await partition.write_marker(PRODUCER, 0, 0, commit=False) is KafkaErrorCode.NONE
    assert partition.aborted_transactions(0, 100) == [(PRODUCER, 1)]


async def test_stale_markers_are_refused(node: Node) -> None:
    partition = await topic(node, "fenced")
    # A marker with no open transaction is written and records the epoch.
    assert await partition.write_marker(PRODUCER, 2, 3, commit=False) is KafkaErrorCode.NONE
    assert partition.high_watermark == 1
    end = partition.log_end_offset
    assert (
        await partition.write_marker(PRODUCER, 1, 3, True) is KafkaErrorCode.INVALID_PRODUCER_EPOCH
    )
    fenced = await partition.write_marker(PRODUCER, 2, 2, True)
    assert fenced is KafkaErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert partition.log_end_offset == end
    # Data of the older epoch is fenced too.
    assert not partition.transaction_needs_verification(PRODUCER, 1)
    old = partition.append_nowait(txn_batch(0, epoch=1), 1 << 20)
    assert old.error is KafkaErrorCode.INVALID_PRODUCER_EPOCH
    assert await begin(partition, txn_batch(0, epoch=2)) == 1


# ------------------------------------------------------------------------- durable state


async def fill(partition: Partition) -> None:
    """An aborted, a committed and an open transaction, between plain batches."""
    await append(partition, plain_batch())
    await begin(partition, txn_batch(0))
    await append(partition, txn_batch(1))
    await partition.write_marker(PRODUCER, 0, 1, commit=False)
    await begin(partition, txn_batch(0, producer=OTHER))
    await partition.write_marker(OTHER, 0, 1, commit=True)
    await append(partition, plain_batch())
    await begin(partition, txn_batch(2))
    await append(partition, plain_batch())


async def test_the_state_is_rebuilt_by_a_reopen(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = await topic(node, "reopen")
    await fill(partition)
    live = state(partition)
    assert live[0] == 7 and live[2] == [(PRODUCER, 1)]
    partition = await checkpoint_tests.reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes == 0
    assert state(partition) == live
    partition, _ = await checkpoint_tests.full_scan_answers(node, partition, monkeypatch)
    assert partition.scanned_bytes > 0
    assert state(partition) == live
    # A checkpoint written before the last batches: the scan past it rebuilds the rest.
    await partition.close()
    partition = await checkpoint_tests.open_again(node, partition)
    await append(partition, txn_batch(3))
    await partition.write_marker(PRODUCER, 0, 1, commit=True)
    await begin(partition, txn_batch(1, producer=OTHER))
    later = state(partition)
    with monkeypatch.context() as patch:  # a crash: no checkpoint at the close
        patch.setattr(Partition, "_write_checkpoint", lambda self, end: _nothing())
        partition = await checkpoint_tests.reopen(node, partition)
    assert partition.checkpoint_used and partition.scanned_bytes > 0
    assert state(partition)[2:] == later[2:]
    assert state(partition)[0] == later[0]
    # And the reopened partition goes on: the open transaction commits.
    assert await partition.write_marker(OTHER, 0, 1, commit=True) is KafkaErrorCode.NONE
    assert partition.last_stable_offset == partition.high_watermark


async def _nothing() -> None:
    return None


async def test_a_trim_drops_the_aborted_entries_below_the_log_start(node: Node) -> None:
    partition = await topic(node, "trim")
    await begin(partition, txn_batch(0))  # 0
    await partition.write_marker(PRODUCER, 0, 0, commit=False)  # 1
    await begin(partition, txn_batch(1))  # 2
    await partition.write_marker(PRODUCER, 0, 0, commit=False)  # 3
    await append(partition, plain_batch())  # 4
    assert partition.aborted_transactions(0, 5) == [(PRODUCER, 0), (PRODUCER, 2)]
    await partition.trim(1)  # the first one's last offset (its marker) is still there
    assert partition.aborted_transactions(0, 5) == [(PRODUCER, 0), (PRODUCER, 2)]
    await partition.trim(2)
    assert partition.aborted_transactions(0, 5) == [(PRODUCER, 2)]
    partition = await checkpoint_tests.reopen(node, partition)
    assert partition.aborted_transactions(0, 5) == [(PRODUCER, 2)]
    await partition.trim(4)
    assert partition.aborted_transactions(0, 5) == []


# ----------------------------------------------------------------------------- reading


async def fetch(
    node: Node, name: str, offset: int, isolation: int, max_bytes: int = 1 << 20
) -> Any:
    """One Fetch (v12) of partition 0 of ``name`` at ``offset``: its partition answer."""
    response: Any = await call(
        node.front_end.admit,
        PEER,
        1,  # Fetch
        12,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=isolation,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=TopicName(name),
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(offset),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(max_bytes),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    (answer,) = response.responses[0].partitions
    assert int(answer.error_code) == 0
    return answer


def offsets(answer: Any) -> list[int]:
    return [view.base_offset for view in iter_batches(bytes(answer.records or b""))]


async def test_a_read_committed_fetch_stops_at_the_lso(node: Node) -> None:
    partition = await topic(node, "committed")
    await append(partition, plain_batch())  # 0
    await begin(partition, txn_batch(0))  # 1
    await partition.write_marker(PRODUCER, 0, 0, commit=False)  # 2
    await append(partition, plain_batch())  # 3
    # One append holding a plain batch (4) and the first of an open transaction (5).
    guard = partition.begin_transaction_verification(OTHER, 0)
    await append(partition, plain_batch() + txn_batch(0, producer=OTHER), guard)
    await append(partition, plain_batch())  # 6
    assert (partition.last_stable_offset, partition.high_watermark) == (5, 7)

    committed = await fetch(node, "committed", 0, isolation=1)
    assert offsets(committed) == [0, 1, 2, 3, 4]
    assert (int(committed.high_watermark), int(committed.last_stable_offset)) == (7, 5)
    aborted = [(int(a.producer_id), int(a.first_offset)) for a in committed.aborted_transactions]
    assert aborted == [(PRODUCER, 1)]
    uncommitted = await fetch(node, "committed", 0, isolation=0)
    assert offsets(uncommitted) == [0, 1, 2, 3, 4, 5, 6]
    assert int(uncommitted.last_stable_offset) == 5
    assert uncommitted.aborted_transactions is None
    # At the LSO a committed read has nothing yet (and does not wait past max_wait 0).
    assert offsets(await fetch(node, "committed", 5, isolation=1)) == []
    assert await _list_offset(partition, -1, committed=True) == (5, -1)
    assert await _list_offset(partition, -1) == (7, -1)
    # The partition's own read path, too.
    read = await partition.read(4, 1 << 20, upper=5)
    assert [view.base_offset for chunk in read for view in iter_batches(chunk)] == [4]
    cached = partition.read_now(4, 1 << 20, upper=5)
    assert cached is None or [view.base_offset for c in cached for view in iter_batches(c)] == [4]

    assert await partition.write_marker(OTHER, 0, 0, commit=True) is KafkaErrorCode.NONE  # 7
    released = await fetch(node, "committed", 5, isolation=1)
    assert offsets(released) == [4, 5, 6, 7]  # the stored record holding 5 starts at 4
    assert int(released.last_stable_offset) == 8
    assert [(int(a.producer_id), int(a.first_offset)) for a in released.aborted_transactions] == []


async def test_a_read_committed_answer_lists_the_aborted_transactions_its_records_overlap(
    node: Node,
) -> None:
    """Kafka's rule: the entries whose last offset is at or past the fetch offset and whose
    first offset lies below the end of the last batch answered, not every one up to the LSO."""
    partition = await topic(node, "overlap")
    await append(partition, plain_batch())  # 0
    await begin(partition, txn_batch(0))  # 1
    await partition.write_marker(PRODUCER, 0, 0, commit=False)  # 2
    await append(partition, plain_batch())  # 3

    def aborted(answer: Any) -> list[tuple[int, int]]:
        return [(int(a.producer_id), int(a.first_offset)) for a in answer.aborted_transactions]

    first = await fetch(node, "overlap", 0, isolation=1, max_bytes=1)  # batch 0 alone
    assert offsets(first) == [0] and aborted(first) == []
    whole = await fetch(node, "overlap", 0, isolation=1)
    assert offsets(whole) == [0, 1, 2, 3] and aborted(whole) == [(PRODUCER, 1)]
    middle = await fetch(node, "overlap", 2, isolation=1, max_bytes=1)  # the marker alone
    assert offsets(middle) == [2] and aborted(middle) == [(PRODUCER, 1)]
    after = await fetch(node, "overlap", 3, isolation=1)
    assert offsets(after) == [3] and aborted(after) == []
    nothing = await fetch(node, "overlap", 4, isolation=1)
    assert offsets(nothing) == [] and aborted(nothing) == []


async def list_offset(node: Node, name: str, timestamp: int, isolation: int) -> tuple[int, ...]:
    """One ListOffsets (v7) of partition 0 of ``name``: (offset, timestamp, leader epoch)."""
    response: Any = await call(
        node.front_end.admit,
        PEER,
        2,  # ListOffsets
        7,
        replica_id=-1,
        isolation_level=i8(isolation),
        topics=(
            ListOffsetsTopic(
                name=TopicName(name),
                partitions=(
                    ListOffsetsPartition(
                        partition_index=i32(0),
                        current_leader_epoch=i32(-1),
                        timestamp=i64(timestamp),
                    ),
                ),
            ),
        ),
    )
    (answer,) = response.topics[0].partitions
    assert int(answer.error_code) == 0
    return int(answer.offset), int(answer.timestamp), int(answer.leader_epoch)


async def test_a_read_committed_timestamp_lookup_stops_at_the_lso(node: Node) -> None:
    """Kafka's rule: a record a timestamp (or -3, the largest) finds at or past the last
    fetchable offset, the LSO for READ_COMMITTED, is answered as none (-1, -1, epoch -1)."""
    partition = await topic(node, "by-time")
    at = (NOW - 3_000, NOW - 2_000, NOW - 1_000)

    def timed(timestamp: int, **fields: Any) -> bytes:
        return build_record_batch([(b"k", b"v", (), timestamp)], **fields)

    await append(partition, timed(at[0]))  # 0
    guard = partition.begin_transaction_verification(OTHER, 0)
    txn = timed(at[1], producer_id=OTHER, producer_epoch=0, base_sequence=0, is_transactional=True)
    await append(partition, txn, guard)  # 1: a transaction left open
    await append(partition, timed(at[2]))  # 2
    assert (partition.last_stable_offset, partition.high_watermark) == (1, 3)
    epoch = partition.epoch
    none = (-1, -1, -1)

    assert await list_offset(node, "by-time", at[0], 1) == (0, at[0], epoch)  # below the LSO
    assert await list_offset(node, "by-time", at[0] + 1, 1) == none  # finds 1, the open one
    assert await list_offset(node, "by-time", at[2], 1) == none  # finds 2, past the LSO
    assert await list_offset(node, "by-time", -3, 1) == none  # the largest is 2
    assert await list_offset(node, "by-time", -1, 1) == (1, -1, epoch)
    # READ_UNCOMMITTED finds them all (below the high watermark).
    assert await list_offset(node, "by-time", at[0] + 1, 0) == (1, at[1], epoch)
    assert await list_offset(node, "by-time", at[2], 0) == (2, at[2], epoch)
    assert await list_offset(node, "by-time", -3, 0) == (2, at[2], epoch)
    assert await list_offset(node, "by-time", NOW, 0) == none  # nothing that late

    assert await partition.write_marker(OTHER, 0, 0, commit=True) is KafkaErrorCode.NONE  # 3
    assert partition.last_stable_offset == 4
    assert await list_offset(node, "by-time", at[0] + 1, 1) == (1, at[1], epoch)
    assert await list_offset(node, "by-time", at[2], 1) == (2, at[2], epoch)


async def test_a_clean_keeps_markers_drops_aborted_records_and_stops_at_the_lso(
    node: Node,
) -> None:
    partition = await topic(node, "compacted", policy="compact")
    await append(partition, plain_batch(key=b"a"))  # 0: a0 committed (plain)
    await begin(partition, txn_batch(0, key=b"a"))  # 1: a0 of an aborted transaction
    await partition.write_marker(PRODUCER, 0, 0, commit=False)  # 2
    await begin(partition, txn_batch(0, producer=OTHER, key=b"b"))  # 3: open
    await append(partition, plain_batch(key=b"b"))  # 4
    result = await clean_partition(partition, NOW, EAGER)
    assert result is not None and result.end <= 3  # not past the LSO
    kept = []
    async for stored in partition.read_stored(partition.log_start_offset, partition.high_watermark):
        for view in iter_batches(stored.payload, verify_crc=False, compacted=True):
            records = [] if view.is_control else view.records()
            kept.append((view.base_offset, view.is_control, [r.key for r in records]))
    # a0 (plain, offset 0) survives: the aborted a0 does not supersede it; the marker stays.
    assert (0, False, [b"a0"]) in kept
    assert (2, True, []) in kept
    assert all(not (offset == 1 and keys) for offset, _, keys in kept)
    assert partition.aborted_transactions(0, 10) == [(PRODUCER, 1)]
