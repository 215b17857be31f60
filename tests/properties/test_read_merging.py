"""The merge planning of ranged reads (``automq_ref/state_machines/read_merging.py``).

Random objects and random lists of ranged reads of them (overlapping, nested, adjacent, far
apart, duplicated), with random limits scaled to the objects: every read lands in exactly one
merged read, its slice of that GET's answer is the bytes a direct ranged read returns, every
merged read keeps both limits, and the planner is greedy (the read that opens a merged read could
not have joined the one before it).
"""

from __future__ import annotations

import itertools

from hypothesis import event, given
from hypothesis import strategies as st

from automq_ref.state_machines.read_merging import (
    RangeRead,
    can_join,
    member_slice,
    plan_merged_reads,
)

KEYS = ("a/1", "a/2", "b")


@st.composite
def objects_and_reads(draw: st.DrawFn) -> tuple[dict[str, bytes], list[RangeRead]]:
    objects = {
        key: draw(st.binary(min_size=1, max_size=400))
        for key in draw(st.sets(st.sampled_from(KEYS), min_size=1))
    }
    keys = sorted(objects)
    reads: list[RangeRead] = []
    for _ in range(draw(st.integers(0, 24))):
        key = draw(st.sampled_from(keys))
        size = len(objects[key])
        start = draw(st.integers(0, size - 1))
        end = draw(st.integers(start + 1, size))
        reads.append(RangeRead(key, start, end))
    if reads:
        duplicates = draw(st.lists(st.sampled_from(reads), max_size=4))
        reads.extend(duplicates)
        reads = draw(st.permutations(reads))
    return objects, reads


@given(
    objects_and_reads(),
    st.integers(1, 300),
    st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]),
)
def test_merged_reads_serve_every_read_once_within_the_limits(
    case: tuple[dict[str, bytes], list[RangeRead]], max_merged_bytes: int, max_sparsity: float
) -> None:
    objects, reads = case
    merged = plan_merged_reads(reads, max_merged_bytes=max_merged_bytes, max_sparsity=max_sparsity)

    served = sorted(index for one in merged for index in one.members)
    assert served == list(range(len(reads))), "a read left out or served twice"
    assert [(m.key, m.start) for m in merged] == sorted((m.key, m.start) for m in merged)
    for one in merged:
        members = [reads[index] for index in one.members]
        assert {read.key for read in members} == {one.key}
        assert one.start == min(read.start for read in members)
        assert one.end_exclusive == max(read.end_exclusive for read in members)
        answer = objects[one.key][one.start : one.end_exclusive]  # the merged GET
        for read in members:
            assert (
                answer[member_slice(one, read)]
                == objects[read.key][read.start : read.end_exclusive]
            )
        asked = set().union(*(range(read.start, read.end_exclusive) for read in members))
        assert one.unique_bytes == len(asked)
        assert one.span_bytes - one.unique_bytes <= max_sparsity * one.span_bytes
        longest = max(read.end_exclusive - read.start for read in members)
        assert one.span_bytes <= max(max_merged_bytes, longest)
        event(f"reads per GET: {min(len(members), 4)}{'+' if len(members) >= 4 else ''}")
    for before, after in itertools.pairwise(merged):
        if before.key == after.key:
            opener = reads[after.members[0]]
            assert not can_join(
                before, opener, max_merged_bytes=max_merged_bytes, max_sparsity=max_sparsity
            ), "the planner split reads it could have merged"


def test_adjacent_reads_merge_and_far_ones_do_not() -> None:
    adjacent = [RangeRead("k", 100, 200), RangeRead("k", 0, 100), RangeRead("k", 200, 250)]
    (one,) = plan_merged_reads(adjacent, max_merged_bytes=1000)
    assert (one.start, one.end_exclusive, one.members) == (0, 250, (1, 0, 2))

    far = [RangeRead("k", 0, 100), RangeRead("k", 300, 400)]  # 200 of 400 bytes unasked: 0.5
    assert len(plan_merged_reads(far, max_merged_bytes=1000)) == 1
    farther = [RangeRead("k", 0, 100), RangeRead("k", 301, 400)]  # 201 of 400: past 0.5
    assert len(plan_merged_reads(farther, max_merged_bytes=1000)) == 2
    too_long = [RangeRead("k", 0, 600), RangeRead("k", 600, 1001)]
    assert len(plan_merged_reads(too_long, max_merged_bytes=1000)) == 2
    other_objects = [RangeRead("k", 0, 100), RangeRead("l", 100, 200)]
    assert len(plan_merged_reads(other_objects, max_merged_bytes=1000)) == 2


def test_a_read_inside_a_long_one_shares_its_get() -> None:
    reads = [RangeRead("k", 0, 5000), RangeRead("k", 10, 20), RangeRead("k", 0, 5000)]
    (one,) = plan_merged_reads(reads, max_merged_bytes=1000)
    assert (one.span_bytes, sorted(one.members)) == (5000, [0, 1, 2])
