"""Log compaction (automq_ref/state_machines/compaction.py) against a model: a dict of key ->
last record, with tombstones kept ``delete.retention.ms`` past the clean that first kept them.

A log grows in rounds; after each round the whole log (what earlier cleans left plus the new
batches) is cleaned at a later time, as the broker cleans from the log start to the clean end.
After every clean: the surviving records are exactly the model's (every key's last record,
unless it is a tombstone whose retention has passed; nothing invented, no keyless record);
offsets, timestamps and headers unchanged and increasing; each batch keeps its base offset,
lastOffsetDelta and producer fields; an empty batch only for a producer's last batch, and every
producer's last batch kept; and cleaning the result again at the same instant changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from automq_ref.formats.codecs import CompressionType
from automq_ref.formats.compacted_batch import delete_horizon, stored_timestamp
from automq_ref.formats.record_batch import (
    RecordBatchView,
    RecordInput,
    build_record_batch,
    iter_batches,
)
from automq_ref.state_machines.compaction import (
    BatchSpan,
    CleanerConfig,
    compact,
    plan_clean,
)

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
class Round:
    batches: list[NewBatch]
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
rounds = st.lists(
    st.builds(Round, st.lists(new_batches, max_size=4), st.integers(0, 150)),
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


def survivors_of(log: list[bytes]) -> list[Produced]:
    found = []
    for batch in log:
        view = RecordBatchView.parse(batch, compacted=True)
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


@given(rounds, st.sampled_from([0, 50, 100_000]))
def test_compaction_keeps_the_last_record_of_every_key(
    plan: list[Round], retention_ms: int
) -> None:
    model = Model(retention_ms)
    log: list[bytes] = []
    shapes: dict[int, tuple[int, int, int, int, int]] = {}  # base offset -> produced header
    next_offset = 0
    sequences = {7: 0, 8: 0}
    last_of_producer: dict[int, int] = {}
    now = T0
    for round_ in plan:
        for batch in round_.batches:
            inputs = [RecordInput(key, value, hs, T0 + ts) for key, value, ts, hs in batch.records]
            producer = batch.producer
            built = build_record_batch(
                inputs,
                base_offset=next_offset,
                compression=batch.codec,
                producer_id=-1 if producer is None else producer,
                producer_epoch=-1 if producer is None else 0,
                base_sequence=-1 if producer is None else sequences[producer],
            )
            if producer is not None:
                sequences[producer] += len(inputs)
                last_of_producer[producer] = next_offset
            log.append(built)
            shapes[next_offset] = headers_of([built])[0]
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
        now += round_.advance_ms
        keep = frozenset(last_of_producer.values())
        log = compact(
            (RecordBatchView.parse(b, compacted=True) for b in log),
            now_ms=now,
            delete_retention_ms=retention_ms,
            producer_last_batches=keep,
        )
        expected = model.clean(now)
        found = survivors_of(log)
        # Exactly the model's survivors: nothing lost, nothing invented or changed.
        assert set(found) == expected
        assert len(found) == len(expected)
        offsets = [record.offset for record in found]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        # Every batch keeps its place in the log and its producer fields.
        bases = []
        for stored in log:
            view = RecordBatchView.parse(stored, compacted=True)
            assert headers_of([stored])[0] == shapes[view.base_offset]
            for kept in view.records():
                assert view.base_offset <= kept.offset <= view.last_offset
            if view.records_count == 0:
                assert view.base_offset in keep
            bases.append(view.base_offset)
            horizon = delete_horizon(view.header())
            if any(kept.value is None for kept in view.records()):
                assert horizon is not None and horizon >= now - retention_ms
        assert bases == sorted(bases) and len(set(bases)) == len(bases)
        assert keep <= set(bases)
        # Idempotent: the same clean at the same instant changes nothing.
        again = compact(
            (RecordBatchView.parse(b, compacted=True) for b in log),
            now_ms=now,
            delete_retention_ms=retention_ms,
            producer_last_batches=keep,
        )
        assert again == log


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
