"""Log compaction (automq_ref/state_machines/compaction.py) against a model: a dict of key ->
last committed record, with tombstones kept ``delete.retention.ms`` past the clean that first
kept them, and transaction markers kept while a batch of their transaction is, then
``delete.retention.ms`` past the clean that first found none, and for good when they are their
producer's last batch.

A log grows in rounds of plain and idempotent batches and whole transactions (committed or
aborted, of two transactional producers); after each round the whole log (what earlier cleans
left plus the new batches) is cleaned at a later time, as the broker cleans from the log start
to the clean end, with the aborted-transactions index the partition would hold (the last
clean's, plus the transactions aborted since). After every clean: the surviving records are
exactly the model's (every key's last committed record, unless it is a tombstone whose
retention has passed; nothing invented, no keyless record, no aborted record); offsets,
timestamps and headers unchanged and increasing; each batch keeps its base offset,
lastOffsetDelta and producer fields; an empty batch only for a producer's last batch, and every
producer's last batch kept; exactly the model's markers, with the model's horizons; the clean's
aborted index is the model's and what a scan of the cleaned log rebuilds, and so is each
transactional producer's epoch; and cleaning the result again at the same instant changes
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.codecs import CompressionType
from automq_ref.formats.compacted_batch import delete_horizon, stored_timestamp
from automq_ref.formats.control_batch import build_marker_batch
from automq_ref.formats.partition_checkpoint import AbortedRow
from automq_ref.formats.record_batch import (
    RecordBatchView,
    RecordInput,
    build_record_batch,
    iter_batches,
)
from automq_ref.state_machines.compaction import (
    BatchSpan,
    CleanerConfig,
    clean_range,
    compact,
    plan_clean,
)
from automq_ref.state_machines.transaction_partition import LogTransactions

KEYS = [b"a", b"b", b"c", b"d", None]
T0 = 1_700_000_000_000


@dataclass(frozen=True)
class Produced:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class NewBatch:
    records: list[tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]]
    producer: int | None  # an idempotent producer's id, or None
    codec: CompressionType


@dataclass(frozen=True)
class NewTransaction:
    # their producer is ignored: the transaction's is used; none: a transaction with no data
    # at this partition (its marker is written all the same)
    batches: list[NewBatch]
    producer: int  # a transactional producer's id
    commit: bool


@dataclass(frozen=True)
class Round:
    batches: list[NewBatch | NewTransaction]
    advance_ms: int  # the clean after this round runs this much later than the previous one


headers = st.lists(
    st.tuples(st.sampled_from(["h", "trace"]), st.none() | st.binary(max_size=3)), max_size=1
).map(tuple)
records = st.tuples(
    st.sampled_from(KEYS),
    st.none() | st.binary(max_size=4),
    st.integers(0, 500),
    headers,
)
new_batches = st.builds(
    NewBatch,
    st.lists(records, min_size=1, max_size=5),
    st.none() | st.sampled_from([7, 8]),
    st.sampled_from([CompressionType.NONE, CompressionType.GZIP, CompressionType.ZSTD]),
)
new_transactions = st.builds(
    NewTransaction,
    st.lists(new_batches, max_size=3),
    st.sampled_from([9, 10]),
    st.booleans(),
)
rounds = st.lists(
    st.builds(Round, st.lists(new_batches | new_transactions, max_size=4), st.integers(0, 150)),
    min_size=1,
    max_size=5,
)


@dataclass
class Model:
    """Every record ever produced, and when a clean first kept each tombstone."""

    retention_ms: int
    produced: list[Produced] = field(default_factory=list)
    first_kept: dict[int, int] = field(default_factory=dict)  # tombstone offset -> clean time

    def clean(self, now_ms: int) -> set[Produced]:
        last: dict[bytes, Produced] = {}
        for record in self.produced:
            if record.key is not None:
                last[record.key] = record
        survivors = set()
        for record in last.values():
            if record.value is None:
                kept_at = self.first_kept.setdefault(record.offset, now_ms)
                if now_ms > kept_at + self.retention_ms:
                    continue
            survivors.add(record)
        return survivors


@dataclass
class Transaction:
    """One transaction produced: its data batches' base offsets and end offsets, its
    marker's offset, and when a clean first found none of its batches left."""

    producer: int
    commit: bool
    batches: list[tuple[int, int]] = field(default_factory=list)
    marker: int = -1
    dataless_at: int | None = None


def survivors_of(log: list[bytes]) -> list[Produced]:
    found = []
    for batch in log:
        view = RecordBatchView.parse(batch, compacted=True)
        if view.is_control:
            continue
        header = view.header()
        for record in view.records():
            found.append(
                Produced(
                    record.offset,
                    record.key,
                    record.value,
                    stored_timestamp(header, record),
                    record.headers,
                )
            )
    return found


def headers_of(log: list[bytes]) -> list[tuple[int, int, int, int, int]]:
    shapes = []
    for batch in log:
        view = RecordBatchView.parse(batch, compacted=True)
        shapes.append(
            (
                view.base_offset,
                view.last_offset_delta,
                view.producer_id,
                view.producer_epoch,
                view.base_sequence,
            )
        )
    return shapes


def expected_markers(
    transactions: list[Transaction],
    kept_data: set[int],
    last_batch: dict[int, int],
    now: int,
    retention_ms: int,
) -> tuple[dict[int, int | None], list[AbortedRow]]:
    """The model's markers after a clean at ``now`` (offset -> delete horizon) and its
    aborted index, given the data batches the clean keeps."""
    markers: dict[int, int | None] = {}
    aborted: list[AbortedRow] = []
    for txn in transactions:
        left = [base for base, _ in txn.batches if base in kept_data]
        if left:
            markers[txn.marker] = None
            if not txn.commit:
                aborted.append((txn.producer, left[0], txn.marker))
            continue
        if txn.dataless_at is None:
            txn.dataless_at = now
        horizon = txn.dataless_at + retention_ms
        if now <= horizon or last_batch[txn.producer] == txn.marker:
            markers[txn.marker] = horizon
    return markers, aborted


@given(rounds, st.sampled_from([0, 50, 100_000]))
def test_compaction_keeps_the_last_record_of_every_key(
    plan: list[Round], retention_ms: int
) -> None:
    model = Model(retention_ms)
    log: list[bytes] = []
    produced_log: list[bytes] = []
    shapes: dict[int, tuple[int, int, int, int, int]] = {}  # base offset -> produced header
    data_spans: list[tuple[int, int]] = []  # (base offset, end offset) of every data batch
    transactions: list[Transaction] = []
    index: list[AbortedRow] = []  # the partition's aborted-transactions index
    next_offset = 0
    sequences = {7: 0, 8: 0, 9: 0, 10: 0}
    last_of_producer: dict[int, int] = {}  # its last data batch
    last_batch: dict[int, int] = {}  # its last batch, a marker or not
    now = T0

    def append(batch: NewBatch, producer: int | None, txn: Transaction | None) -> None:
        nonlocal next_offset
        inputs = [RecordInput(key, value, hs, T0 + ts) for key, value, ts, hs in batch.records]
        built = build_record_batch(
            inputs,
            base_offset=next_offset,
            compression=batch.codec,
            producer_id=-1 if producer is None else producer,
            producer_epoch=-1 if producer is None else 0,
            base_sequence=-1 if producer is None else sequences[producer],
            is_transactional=txn is not None,
        )
        if producer is not None:
            sequences[producer] += len(inputs)
            last_of_producer[producer] = last_batch[producer] = next_offset
        log.append(built)
        produced_log.append(built)
        shapes[next_offset] = headers_of([built])[0]
        data_spans.append((next_offset, next_offset + len(inputs)))
        if txn is not None:
            txn.batches.append((next_offset, next_offset + len(inputs)))
        if txn is None or txn.commit:
            for delta, record in enumerate(inputs):
                assert record.timestamp is not None
                model.produced.append(
                    Produced(
                        next_offset + delta,
                        record.key,
                        record.value,
                        record.timestamp,
                        tuple(record.headers),
                    )
                )
        next_offset += len(inputs)

    for number, round_ in enumerate(plan):
        for item in round_.batches:
            if isinstance(item, NewBatch):
                append(item, item.producer, None)
                continue
            txn = Transaction(item.producer, item.commit)
            for batch in item.batches:
                append(batch, item.producer, txn)
            marker = build_marker_batch(
                item.producer, 0, number, item.commit, T0, base_offset=next_offset
            )
            txn.marker = last_batch[item.producer] = next_offset
            log.append(marker)
            produced_log.append(marker)
            shapes[next_offset] = headers_of([marker])[0]
            if not item.commit and txn.batches:  # one with no data here is not indexed
                index.append((item.producer, txn.batches[0][0], next_offset))
            transactions.append(txn)
            next_offset += 1
        now += round_.advance_ms
        keep = frozenset(last_of_producer.values())
        cleaned = clean_range(
            (RecordBatchView.parse(b, compacted=True) for b in log),
            now_ms=now,
            delete_retention_ms=retention_ms,
            producer_last_batches=keep,
            aborted=index,
        )
        log, index = cleaned.batches, cleaned.aborted
        expected = model.clean(now)
        found = survivors_of(log)
        # Exactly the model's survivors: nothing lost, nothing invented or changed.
        assert set(found) == expected
        assert len(found) == len(expected)
        offsets = [record.offset for record in found]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        # Every batch keeps its place in the log and its producer fields.
        bases = []
        markers: dict[int, int | None] = {}
        for stored in log:
            view = RecordBatchView.parse(stored, compacted=True)
            assert headers_of([stored])[0] == shapes[view.base_offset]
            for kept in view.records():
                assert view.base_offset <= kept.offset <= view.last_offset
            if view.records_count == 0:
                assert view.base_offset in keep
            bases.append(view.base_offset)
            horizon = delete_horizon(view.header())
            if view.is_control:
                markers[view.base_offset] = horizon
            elif any(kept.value is None for kept in view.records()):
                assert horizon is not None and horizon >= now - retention_ms
        assert bases == sorted(bases) and len(set(bases)) == len(bases)
        assert keep <= set(bases)
        # The data batches kept: those with a survivor, and each producer's last.
        survivor_offsets = {record.offset for record in expected}
        kept_data = {
            base
            for base, end in data_spans
            if base in keep or any(base <= offset < end for offset in survivor_offsets)
        }
        assert set(bases) - set(markers) == kept_data
        # Exactly the model's markers and horizons, and its aborted index, which is what a
        # scan of the cleaned log rebuilds; the producers' epochs survive the clean too.
        want_markers, want_aborted = expected_markers(
            transactions, kept_data, last_batch, now, retention_ms
        )
        assert markers == want_markers
        assert index == want_aborted
        scanned, original = LogTransactions(), LogTransactions()
        for stored in log:
            scanned.add(RecordBatchView.parse(stored, compacted=True))
        for stored in produced_log:
            original.add(RecordBatchView.parse(stored, compacted=True))
        assert scanned.aborted == index and not scanned.open
        assert scanned.entries == original.entries
        # Idempotent: the same clean at the same instant changes nothing.
        again = clean_range(
            (RecordBatchView.parse(b, compacted=True) for b in log),
            now_ms=now,
            delete_retention_ms=retention_ms,
            producer_last_batches=keep,
            aborted=index,
        )
        assert again.batches == log
        assert again.aborted == index


@given(
    st.lists(
        st.tuples(st.integers(1, 1000), st.integers(0, 100), st.integers(1, 5_000)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 8),
    st.integers(0, 200),
    st.floats(0, 1),
)
def test_a_clean_is_planned_only_within_the_durable_and_lag_bounds(
    sizes: list[tuple[int, int, int]], cleaned_batches: int, lag_ms: int, ratio: float
) -> None:
    spans = []
    offset = 0
    for size, age, count in sizes:
        spans.append(BatchSpan(offset, offset + count, T0 - age, size))
        offset += count
    cleaned_end = spans[min(cleaned_batches, len(spans) - 1)].base_offset
    config = CleanerConfig(min_compaction_lag_ms=lag_ms, min_cleanable_dirty_ratio=ratio)
    end = plan_clean(spans, 0, cleaned_end, offset, T0, config)
    if end is None:
        return
    assert cleaned_end < end <= offset
    # Nothing younger than the lag is reached.
    for span in spans:
        if span.base_offset < end and span.base_offset >= cleaned_end:
            assert lag_ms == 0 or span.max_timestamp <= T0 - lag_ms


def test_keyless_records_and_superseded_values_go_and_offsets_stay() -> None:
    first = build_record_batch(
        [(b"k", b"1", (), T0), (None, b"x", (), T0), (b"j", b"1", (), T0)], base_offset=0
    )
    second = build_record_batch([(b"k", b"2", (), T0 + 1)], base_offset=3)
    (kept_first, kept_second) = compact(
        iter_batches(first + second), now_ms=T0 + 10, delete_retention_ms=0
    )
    view = RecordBatchView.parse(kept_first, compacted=True)
    assert (view.base_offset, view.last_offset_delta, view.records_count) == (0, 2, 1)
    assert [(r.offset, r.key, r.value) for r in view.records()] == [(2, b"j", b"1")]
    assert kept_second == second  # untouched batches keep their bytes
