"""A Fetch's partition reads, run several at once, keep KIP-74's byte limits and progress.

The model is the reading one partition after another (each given whole batches within
``min(partition_max_bytes, what is left of max_bytes)``, the first partition with data its first
batch whatever its size). Reads at once, finishing in any order, must never answer more than the
limits allow, and must answer something whenever the model does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from automq_ref.errors import KafkaErrorCode
from automq_ref.io.storage.stream_objects import ReadOrigin
from automq_ref.kafka.handlers import fetch
from tests.unit.test_record_batch import make_batch

HEADER_BYTES = 61  # a batch's size without its records section


@dataclass
class FakeFetchPartition:
    partition_max_bytes: int
    fetch_offset: int = 0
    current_leader_epoch: int = -1


@dataclass
class FakePartition:
    """Batches of the given sizes at offsets 0, 1, ... (one record each); a read suspends
    ``pauses`` times."""

    sizes: list[int]
    pauses: int
    epoch: int = 0
    log_start_offset: int = 0
    reads: list[tuple[int, int, bool]] = field(default_factory=list)
    topic: str = "topic"
    index: int = 0

    def __post_init__(self) -> None:
        self.stored = [
            make_batch(
                b"\0" * (size - HEADER_BYTES),
                base_offset=offset,
                last_offset_delta=0,
                records_count=1,
            )
            for offset, size in enumerate(self.sizes)
        ]

    @property
    def high_watermark(self) -> int:
        return len(self.sizes)

    @property
    def log_end_offset(self) -> int:
        return len(self.sizes)

    def fetch_bounds(self) -> tuple[int, int, int]:
        return self.log_start_offset, self.high_watermark, self.log_end_offset

    async def read(
        self, offset: int, max_bytes: int, min_one: bool = True, upper: int | None = None
    ) -> list[bytes]:
        self.reads.append((offset, max_bytes, min_one))
        for _ in range(self.pauses):
            await asyncio.sleep(0)
        found: list[bytes] = []
        size = 0
        for batch in self.stored[offset:upper]:
            size += len(batch)
            if size > max_bytes and (found or not min_one):
                break
            found.append(batch)
        return found


def one_after_another(
    partitions: list[FakePartition], limits: list[FakeFetchPartition], budget: int
) -> list[int]:
    """The bytes each partition answers when read in order, one at a time (the model)."""
    answered: list[int] = []
    total = 0
    for partition, fetch_partition in zip(partitions, limits, strict=True):
        limit = min(fetch_partition.partition_max_bytes, budget - total)
        size = 0
        for taken, batch_size in enumerate(partition.sizes):
            if size + batch_size > limit and (taken or total > 0):
                break
            size += batch_size
        answered.append(size)
        total += size
    return answered


partitions_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(HEADER_BYTES, 600), max_size=6),  # batch sizes
        st.integers(0, 5),  # how long its read takes, in loop turns
        st.integers(1, 900),  # partition_max_bytes
    ),
    min_size=1,
    max_size=70,  # over READS_IN_FLIGHT: some reads wait for others
)


@settings(deadline=None, max_examples=200)
@given(partitions_strategy, st.integers(1, 3000))
def test_reads_at_once_keep_the_limits_and_progress(
    specs: list[tuple[list[int], int, int]], budget: int
) -> None:
    partitions = [FakePartition(sizes, pauses) for sizes, pauses, _ in specs]
    limits = [FakeFetchPartition(partition_max) for _, _, partition_max in specs]
    reads = list(zip(partitions, limits, strict=True))
    answered = asyncio.run(fetch._read_partitions(reads, budget, ReadOrigin()))  # type: ignore[arg-type]
    assert len(answered) == len(reads)
    sizes = []
    oversized = []
    for (partition, fetch_partition), (code, chunks) in zip(reads, answered, strict=True):
        assert code is KafkaErrorCode.NONE
        got = [len(chunk) for chunk in chunks]
        assert got == partition.sizes[: len(got)]  # whole batches from the fetch offset
        size = sum(got)
        sizes.append(size)
        if size > fetch_partition.partition_max_bytes:
            oversized.append(got)
    # Only one partition may pass its limits, and only by being its one first batch.
    assert len(oversized) <= 1
    assert all(len(got) == 1 for got in oversized)
    total = sum(sizes)
    assert total <= budget or (len(oversized) == 1 or sum(1 for size in sizes if size) == 1)
    if total > budget:
        first_with_data = next(size for size in sizes if size)
        assert total - first_with_data <= budget - min(first_with_data, budget)
    model = one_after_another(partitions, limits, budget)
    if sum(model) > 0:
        assert total > 0, "the model answers data, the reads at once answered none"
    # Min-one reads: only ever a partition every earlier one of which found nothing.
    for position, partition in enumerate(partitions):
        if any(min_one for _, _, min_one in partition.reads):
            assert all(size == 0 for size in sizes[:position])
    # As full as one read after another: no partition's next batch would still fit.
    for position, (partition, fetch_partition) in enumerate(reads):
        taken = len(answered[position][1])
        if taken < len(partition.sizes):
            room = min(fetch_partition.partition_max_bytes, budget - (total - sizes[position]))
            assert sizes[position] + partition.sizes[taken] > room, (position, sizes, room)


def test_a_slow_partition_does_not_hold_up_the_others() -> None:
    """Once the first partition has answered, a read that waits (on the store, say) does not
    hold up the reads after it (up to the limit in flight), which one after another would."""
    started: list[str] = []
    release = asyncio.Event()

    class Slow(FakePartition):
        async def read(
            self, offset: int, max_bytes: int, min_one: bool = True, upper: int | None = None
        ) -> list[bytes]:
            started.append("slow")
            await release.wait()
            return await super().read(offset, max_bytes, min_one)

    class Quick(FakePartition):
        async def read(
            self, offset: int, max_bytes: int, min_one: bool = True, upper: int | None = None
        ) -> list[bytes]:
            started.append("quick")
            if len(started) == fetch.READS_IN_FLIGHT + 1:
                release.set()
            return await super().read(offset, max_bytes, min_one)

    partitions: list[FakePartition] = [Quick([10], 0), Slow([10], 0)]
    partitions += [Quick([10], 0) for _ in range(fetch.READS_IN_FLIGHT * 2)]
    reads = [(partition, FakeFetchPartition(100)) for partition in partitions]
    answered = asyncio.run(fetch._read_partitions(reads, 10_000, ReadOrigin()))  # type: ignore[arg-type]
    assert all(chunks for _, chunks in answered)
    # The first alone, then the slow one and the next ones while it waits.
    expected = ["quick", "slow"] + ["quick"] * (fetch.READS_IN_FLIGHT - 1)
    assert started[: fetch.READS_IN_FLIGHT + 1] == expected
