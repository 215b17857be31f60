"""``kafka.isolation.level`` for the Spark sources, without Spark or a broker.

The option's values; and the two ways the sources hide what ``read_committed`` must not return,
checked against a model over generated logs (interleaved transactional producers, plain
batches, commits, aborts, markers with no data before them, transactions left open): the
objects source's replay (from the log start, or from a checkpoint taken anywhere and the
batches after it) must find the model's last stable offset and aborted ranges, and the data
batches it keeps are the model's committed ones; the Kafka source's filter over a Fetch answer
from any offset, with the aborted list a broker answers (its index entries ending at or after
the fetch offset and beginning before the LSO), keeps exactly the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from automq_ref.formats.control_batch import build_marker_batch
from automq_ref.formats.partition_checkpoint import (
    PartitionCheckpoint,
    TransactionRow,
    decode_checkpoint,
    encode_checkpoint,
)
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.spark.isolation import (
    TransactionReplay,
    aborted_within,
    checkpoint_mismatch,
    drop_aborted,
    parse_isolation_level,
)
from automq_ref.state_machines.compaction import aborted_ranges, in_aborted

PRODUCERS = (7, 8, 9)
PLAIN = -1  # a batch without a producer id
IDEMPOTENT = 5  # a producer id that never writes transactionally


class BadOption(ValueError):
    pass


def test_the_option_takes_kafkas_two_values_and_defaults_to_read_uncommitted() -> None:
    assert parse_isolation_level(None, BadOption) is False
    assert parse_isolation_level("read_uncommitted", BadOption) is False
    assert parse_isolation_level(" read_committed ", BadOption) is True
    for bad in ("READ_COMMITTED", "committed", "", "read-committed"):
        with pytest.raises(
            BadOption,
            match=r"kafka.isolation.level must be read_uncommitted \(the default\) or "
            "read_committed, not",
        ):
            parse_isolation_level(bad, BadOption)


# ------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Written:
    """The log as written, and what read_committed must make of it."""

    batches: list[RecordBatchView]
    committed: list[int]  # base offsets of the data batches a read_committed reader gets
    stable_offset: int
    aborted: list[tuple[int, int, int]]  # (producer id, first offset, marker offset)


# One step: (kind, producer, records): kind "data" (transactional unless the producer is PLAIN
# or IDEMPOTENT), "commit" or "abort" (a marker of that producer, with or without data first).
steps = st.lists(
    st.tuples(
        st.sampled_from(["data", "data", "data", "commit", "abort"]),
        st.sampled_from([*PRODUCERS, *PRODUCERS[:2], PLAIN, IDEMPOTENT]),
        st.integers(1, 3),
    ),
    max_size=30,
)


def write(plan: list[tuple[str, int, int]]) -> Written:
    raw: list[bytes] = []
    offset = 0
    open_batches: dict[int, list[int]] = {}  # producer -> base offsets of its open data
    decided: dict[int, bool] = {}  # base offset -> committed?
    aborted: list[tuple[int, int, int]] = []
    sequences: dict[int, int] = {}
    for kind, producer, count in plan:
        transactional = producer in PRODUCERS
        if kind == "data" or not transactional:
            sequence = sequences.get(producer, 0)
            sequences[producer] = sequence + count
            raw.append(
                build_record_batch(
                    [(f"k{offset + i}".encode(), b"v") for i in range(count)],
                    base_offset=offset,
                    base_timestamp=1_700_000_000_000,
                    producer_id=producer,
                    producer_epoch=0 if producer >= 0 else -1,
                    base_sequence=sequence if producer >= 0 else -1,
                    is_transactional=transactional,
                )
            )
            if transactional:
                open_batches.setdefault(producer, []).append(offset)
            else:
                decided[offset] = True
            offset += count
            continue
        commit = kind == "commit"
        raw.append(
            build_marker_batch(producer, 0, 0, commit, 1_700_000_000_000, base_offset=offset)
        )
        pending = open_batches.pop(producer, [])
        for base in pending:
            decided[base] = commit
        if pending and not commit:
            aborted.append((producer, pending[0], offset))
        offset += 1
    stable = min((bases[0] for bases in open_batches.values()), default=offset)
    batches = [view for chunk in raw for view in iter_batches(chunk)]
    committed = [
        view.base_offset
        for view in batches
        if not view.is_control and view.base_offset < stable and decided.get(view.base_offset)
    ]
    return Written(batches, committed, stable, aborted)


def data_kept(views: list[RecordBatchView]) -> list[int]:
    return [view.base_offset for view in views if not view.is_control]


def checkpoint_of(replay: TransactionReplay, end: int) -> PartitionCheckpoint:
    """What a partition's checkpoint holds of ``replay``, through its JSON layout."""
    rows = [
        TransactionRow(producer_id, entry.epoch, entry.first_offset, entry.coordinator_epoch, -1)
        for producer_id, entry in sorted(replay.entries.items())
    ]
    return decode_checkpoint(encode_checkpoint(3, None, end, [], [], rows, replay.aborted))


# --------------------------------------------------------------------------- checks


# A producer's aborted transaction, then its committed one, beside another's aborted one and a
# plain batch; then a transaction left open, and a plain batch past it.
EXAMPLE = [
    ("data", 7, 2),
    ("data", 8, 1),
    ("abort", 7, 1),
    ("data", PLAIN, 1),
    ("data", 7, 3),
    ("abort", 8, 1),
    ("commit", 7, 1),
    ("data", 9, 1),
    ("data", IDEMPOTENT, 2),
]


@given(steps, st.integers(0, 1000))
@example(EXAMPLE, 0)
@example(EXAMPLE, 4)
def test_the_replay_finds_the_stable_offset_and_the_aborted_ranges(
    plan: list[tuple[str, int, int]], cut: int
) -> None:
    written = write(plan)
    end = written.batches[-1].next_offset if written.batches else 0
    whole = TransactionReplay()
    for view in written.batches:
        whole.add(view)
    assert whole.stable_offset(0, end) == written.stable_offset
    assert whole.aborted_from(0) == tuple(written.aborted)
    ranges = aborted_ranges(whole.aborted)
    kept = [v for v in written.batches if v.base_offset < written.stable_offset]
    assert data_kept([v for v in kept if not in_aborted(v, ranges)]) == written.committed
    # From a checkpoint taken after any batch, then the batches after it: the same state.
    cut %= len(written.batches) + 1  # the checkpoint is taken after this many batches
    before = TransactionReplay()
    for view in written.batches[:cut]:
        before.add(view)
    at = written.batches[cut - 1].next_offset if cut else 0
    resumed = TransactionReplay()
    resumed.restore(checkpoint_of(before, at))
    for view in written.batches[cut:]:
        resumed.add(view)
    assert resumed.stable_offset(0, end) == written.stable_offset
    assert resumed.aborted_from(0) == tuple(written.aborted)


@given(steps, st.integers(0, 1000))
@example(EXAMPLE, 0)  # from the start
@example(EXAMPLE, 1)  # inside 7's aborted transaction
@example(EXAMPLE, 5)  # between 7's aborted transaction and its committed one
def test_a_fetch_answer_from_any_offset_keeps_exactly_the_committed_batches(
    plan: list[tuple[str, int, int]], fetch_offset: int
) -> None:
    written = write(plan)
    stable = written.stable_offset
    fetch_offset %= max(stable, 1)
    # The broker answers the batches from the one holding the fetch offset up to the LSO,
    # and its aborted index entries ending at or after the fetch offset, beginning before it.
    answer = [
        v for v in written.batches if v.last_offset >= fetch_offset and v.base_offset < stable
    ]
    listed = [(pid, first) for pid, first, last in written.aborted if last >= fetch_offset]
    listed = [(pid, first) for pid, first in listed if first < stable]
    expected = [
        base
        for base in written.committed
        if next(v for v in written.batches if v.base_offset == base).last_offset >= fetch_offset
    ]
    assert data_kept(list(drop_aborted(answer, listed))) == expected
    # What the objects source hands one Spark task of [fetch offset, LSO): the same.
    within = aborted_ranges(aborted_within(written.aborted, fetch_offset, stable))
    assert data_kept([v for v in answer if not in_aborted(v, within)]) == expected


def test_a_checkpoint_that_describes_another_log_is_not_used() -> None:
    checkpoint = decode_checkpoint(encode_checkpoint(3, None, 40, [], []))
    assert checkpoint_mismatch(checkpoint, 3, None, 0, 40) is None
    assert checkpoint_mismatch(checkpoint, 3, None, 40, 90) is None
    assert "data stream 3, not 4" in str(checkpoint_mismatch(checkpoint, 4, None, 0, 90))
    assert "cleaned stream" in str(checkpoint_mismatch(checkpoint, 3, (5, 10), 0, 90))
    assert "past the committed end 39" in str(checkpoint_mismatch(checkpoint, 3, None, 0, 39))
    assert "below the log start 41" in str(checkpoint_mismatch(checkpoint, 3, None, 41, 90))


def test_the_model_on_the_example() -> None:
    """EXAMPLE's offsets: 7's data 0-1, 8's data 2, 7's ABORT 3, plain 4, 7's data 5-7, 8's
    ABORT 8, 7's COMMIT 9, 9's data 10 (left open), the idempotent producer's 11-12."""
    written = write(EXAMPLE)
    assert [v.base_offset for v in written.batches] == [0, 2, 3, 4, 5, 8, 9, 10, 11]
    assert written.committed == [4, 5]
    assert written.stable_offset == 10
    assert written.aborted == [(7, 0, 3), (8, 2, 8)]
