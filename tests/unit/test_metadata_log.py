"""FileMetadataLog: appends, reads, snapshots, recovery from torn tails and interrupted installs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from automq_ref.io.metadata import file_metadata_log, metadata_log_format
from automq_ref.io.metadata.metadata_log import (
    BATCH_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    SNAPSHOT_FILE_NAME,
    FileMetadataLog,
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLog,
    MetadataLogClosed,
    MetadataLogCorrupt,
    MetadataLogError,
    MetadataLogLocked,
    Snapshot,
    encode_batch,
)
from tests.waiting import PATIENCE_S

# Three batches; the torn-tail and bit-flip tests damage the last or the middle one.
BATCHES = [
    [b"alpha", b"beta"],
    [b"gamma", b"", b"delta-" * 5],
    [b"epsilon", b"zeta" * 3, b"eta"],
]
RECORDS = [payload for batch in BATCHES for payload in batch]


def segment_path(directory: Path) -> Path:
    return max(directory.glob("segment-*.log"))


def entries(first_index: int, payloads: list[bytes]) -> list[LogEntry]:
    return [LogEntry(first_index + offset, payload) for offset, payload in enumerate(payloads)]


async def append_batches(log: FileMetadataLog) -> list[int]:
    """Append BATCHES; return the segment size after each one."""
    sizes: list[int] = []
    for batch in BATCHES:
        await log.append(batch, expected_next_index=log.next_index)
        sizes.append(segment_path(log.directory).stat().st_size)
    return sizes


async def write_batches(directory: Path) -> list[int]:
    async with FileMetadataLog(directory) as log:
        return await append_batches(log)


def flipped(image: bytes, position: int, mask: int) -> bytes:
    damaged = bytearray(image)
    damaged[position] ^= mask
    return bytes(damaged)


async def open_corrupt(directory: Path, match: str | None = None) -> MetadataLogCorrupt:
    """Opening ``directory`` must fail as corrupt; the error."""
    with pytest.raises(MetadataLogCorrupt, match=match) as caught:
        await FileMetadataLog.open(directory)
    return caught.value


async def reopen_and_read(directory: Path) -> tuple[int, int, list[LogEntry]]:
    async with FileMetadataLog(directory) as log:
        return log.first_index, log.next_index, await log.read(log.first_index)


# ------------------------------------------------------------------ basic contract


async def test_append_read_round_trip_and_reopen(tmp_path: Path) -> None:
    log = await FileMetadataLog.open(tmp_path)
    assert isinstance(log, MetadataLog)
    assert (log.first_index, log.next_index) == (0, 0)
    assert await log.read(0) == []
    next_index = 0
    for batch in BATCHES:
        next_index = await log.append(batch, expected_next_index=next_index)
    assert next_index == log.next_index == len(RECORDS)
    assert await log.read(0) == entries(0, RECORDS)
    assert await log.snapshot() is None
    await log.close()
    assert await reopen_and_read(tmp_path) == (0, len(RECORDS), entries(0, RECORDS))


async def test_expected_next_index_conflict_changes_nothing(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        await log.append([b"a", b"b"], expected_next_index=0)
        for wrong in (0, 1, 3, 100):
            with pytest.raises(LogIndexConflict) as caught:
                await log.append([b"x"], expected_next_index=wrong)
            assert caught.value.next_index == 2
            assert caught.value.expected_next_index == wrong
        with pytest.raises(LogIndexConflict):
            await log.append([], expected_next_index=1)
        assert await log.append([], expected_next_index=2) == 2
        size = segment_path(tmp_path).stat().st_size
    assert size == 2 * (RECORD_HEADER_SIZE + 1) + BATCH_HEADER_SIZE
    assert await reopen_and_read(tmp_path) == (0, 2, entries(0, [b"a", b"b"]))


async def test_concurrent_appends_at_the_same_index_one_wins(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        outcomes = await asyncio.gather(
            *(log.append([bytes([n]) * 3], expected_next_index=0) for n in range(5)),
            return_exceptions=True,
        )
        winners = [outcome for outcome in outcomes if outcome == 1]
        conflicts = [outcome for outcome in outcomes if isinstance(outcome, LogIndexConflict)]
        assert len(winners) == 1 and len(conflicts) == 4
        assert all(conflict.next_index == 1 for conflict in conflicts)
        assert await log.read(0) == [LogEntry(0, b"\x00" * 3)]


async def test_read_ranges_and_max_records(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        await append_batches(log)
        count = len(RECORDS)
        for start in range(count + 2):
            for limit in (None, 0, 1, 2, 3, count + 5):
                stop = count if limit is None else min(count, start + limit)
                expected = entries(start, RECORDS[start:stop]) if start < count else []
                assert await log.read(start, limit) == expected, (start, limit)
        with pytest.raises(ValueError):
            await log.read(-1)
        with pytest.raises(ValueError):
            await log.read(0, -1)


async def test_oversized_record_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_metadata_log, "MAX_PAYLOAD_BYTES", 8)
    async with FileMetadataLog(tmp_path) as log:
        with pytest.raises(ValueError):
            await log.append([b"ok", b"x" * 9], expected_next_index=0)
        assert log.next_index == 0
        assert await log.append([b"x" * 8], expected_next_index=0) == 1


async def test_wait_for_wakes_on_append_and_on_close(tmp_path: Path) -> None:
    log = await FileMetadataLog.open(tmp_path)
    waiter = asyncio.create_task(log.wait_for(2))
    await log.append([b"a", b"b"], expected_next_index=0)
    await asyncio.sleep(0)
    assert not waiter.done()
    await log.append([b"c"], expected_next_index=2)
    assert await asyncio.wait_for(waiter, timeout=PATIENCE_S) == 3
    assert await log.wait_for(0) == 3
    late = asyncio.create_task(log.wait_for(10))
    await asyncio.sleep(0)
    await log.close()
    with pytest.raises(MetadataLogClosed):
        await asyncio.wait_for(late, timeout=PATIENCE_S)


async def test_a_follower_replays_the_log_as_it_grows(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:

        async def follow(count: int) -> list[bytes]:
            seen: list[bytes] = []
            while len(seen) < count:
                await log.wait_for(len(seen))
                seen.extend(entry.payload for entry in await log.read(len(seen), 2))
            return seen

        follower = asyncio.create_task(follow(len(RECORDS)))
        for batch in BATCHES:
            await asyncio.sleep(0)
            await log.append(batch, expected_next_index=log.next_index)
        assert await asyncio.wait_for(follower, timeout=PATIENCE_S) == RECORDS


async def test_open_creates_missing_directories(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    async with FileMetadataLog(directory) as log:
        await log.append([b"x"], expected_next_index=0)
    assert sorted(path.name for path in directory.iterdir()) == [
        "LOCK",
        "segment-00000000000000000000.log",
    ]


async def test_operations_after_close_are_refused(tmp_path: Path) -> None:
    log = await FileMetadataLog.open(tmp_path)
    await log.close()
    await log.close()
    for operation in (
        log.append([b"a"], expected_next_index=0),
        log.read(0),
        log.snapshot(),
        log.install_snapshot(0, b""),
        log.wait_for(0),
    ):
        with pytest.raises(MetadataLogClosed):
            await operation
    with pytest.raises(MetadataLogClosed):
        await FileMetadataLog(tmp_path).read(0)


# ----------------------------------------------------------------------- snapshots


async def test_snapshot_truncates_and_reads_below_raise(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        await append_batches(log)
        await log.install_snapshot(3, b"state up to 3")  # in the middle of the second batch
        assert (log.first_index, log.next_index) == (3, len(RECORDS))
        assert await log.snapshot() == Snapshot(3, b"state up to 3")
        for below in range(3):
            with pytest.raises(LogTruncated) as caught:
                await log.read(below)
            assert caught.value.snapshot_index == 3
        assert await log.read(3) == entries(3, RECORDS[3:])
        assert await log.read(4, 1) == entries(4, RECORDS[4:5])
        await log.append([b"after"], expected_next_index=len(RECORDS))
    assert [path.name for path in tmp_path.glob("segment-*")] == [
        "segment-00000000000000000003.log"
    ]
    assert await reopen_and_read(tmp_path) == (
        3,
        len(RECORDS) + 1,
        entries(3, [*RECORDS[3:], b"after"]),
    )


async def test_snapshot_bounds_and_repeated_installs(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        await log.append([b"a", b"b", b"c"], expected_next_index=0)
        with pytest.raises(ValueError):
            await log.install_snapshot(4, b"beyond the end")
        await log.install_snapshot(0, b"empty")
        assert (await log.snapshot(), log.first_index) == (Snapshot(0, b"empty"), 0)
        await log.install_snapshot(2, b"two")
        with pytest.raises(ValueError):
            await log.install_snapshot(1, b"backwards")
        await log.install_snapshot(2, b"two again")
        await log.install_snapshot(3, b"everything")
        assert (log.first_index, log.next_index) == (3, 3)
        assert await log.read(3) == []
        assert await log.append([b"d"], expected_next_index=3) == 4
    async with FileMetadataLog(tmp_path) as log:
        assert await log.snapshot() == Snapshot(3, b"everything")
        assert await log.read(3) == [LogEntry(3, b"d")]


async def test_snapshot_payload_larger_than_a_copy_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both the segment copy and the snapshot read go chunk by chunk.
    monkeypatch.setattr(file_metadata_log, "COPY_CHUNK_BYTES", 7)
    monkeypatch.setattr(metadata_log_format, "COPY_CHUNK_BYTES", 7)
    payload = bytes(range(256)) * 3
    async with FileMetadataLog(tmp_path) as log:
        await log.append([b"x" * 50, b"y" * 40, b"z" * 30], expected_next_index=0)
        await log.install_snapshot(1, payload)
    async with FileMetadataLog(tmp_path) as log:
        assert await log.snapshot() == Snapshot(1, payload)
        assert await log.read(1) == entries(1, [b"y" * 40, b"z" * 30])


DURABILITY_STEPS = ("_fsync_file", "_fsync_directory", "_replace_file", "_remove_file")


@contextlib.contextmanager
def failing_step(fail_at: int | None) -> Iterator[list[str]]:
    """Within the block, every durability step (file fsync, rename, delete, directory fsync) is
    recorded in the list yielded, and the ``fail_at``-th raises EIO: a crash there."""
    steps: list[str] = []
    originals = {name: getattr(file_metadata_log, name) for name in DURABILITY_STEPS}

    def wrap(name: str, original: Callable[..., None]) -> Callable[..., None]:
        def step(*args: Any) -> None:
            steps.append(name)
            if len(steps) == fail_at:
                raise OSError(5, f"injected failure at {name}")
            original(*args)

        return step

    try:
        for name, original in originals.items():
            setattr(file_metadata_log, name, wrap(name, original))
        yield steps
    finally:
        for name, original in originals.items():
            setattr(file_metadata_log, name, original)


INSTALL_STEPS = [
    "_fsync_file",  # snapshot.tmp
    "_replace_file",  # -> snapshot
    "_fsync_directory",
    "_fsync_file",  # segment-S.log.tmp
    "_replace_file",  # -> segment-S.log
    "_fsync_directory",
    "_remove_file",  # the old segment
    "_fsync_directory",
]


async def prepare_for_install(directory: Path) -> None:
    async with FileMetadataLog(directory) as log:
        await append_batches(log)
        await log.install_snapshot(1, b"old snapshot")


async def test_install_snapshot_steps(tmp_path: Path) -> None:
    await prepare_for_install(tmp_path)
    async with FileMetadataLog(tmp_path) as log:
        with failing_step(None) as steps:
            await log.install_snapshot(4, b"new snapshot")
        assert steps == INSTALL_STEPS


@pytest.mark.parametrize("fail_at", range(1, len(INSTALL_STEPS) + 1))
async def test_crash_during_install_snapshot_recovers_old_or_new(
    tmp_path: Path, fail_at: int
) -> None:
    await prepare_for_install(tmp_path)
    log = await FileMetadataLog.open(tmp_path)
    with failing_step(fail_at):
        with pytest.raises(MetadataLogError) as caught:
            await log.install_snapshot(4, b"new snapshot")
        assert isinstance(caught.value.__cause__, OSError)
        # The log refuses writes until reopened, but what it acknowledged stays readable.
        with pytest.raises(MetadataLogError):
            await log.append([b"more"], expected_next_index=len(RECORDS))
        assert await log.read(4) == entries(4, RECORDS[4:])
        await log.close()

    async with FileMetadataLog(tmp_path) as log:
        snapshot = await log.snapshot()
        assert snapshot in (Snapshot(1, b"old snapshot"), Snapshot(4, b"new snapshot"))
        assert snapshot is not None and log.first_index == snapshot.index
        # Once the snapshot rename has happened (step 2), only the new state may come back.
        assert (snapshot.index == 4) == (fail_at > 2)
        assert log.next_index == len(RECORDS)
        assert await log.read(log.first_index) == entries(
            log.first_index, RECORDS[log.first_index :]
        )
        await log.append([b"more"], expected_next_index=len(RECORDS))
    assert len(list(tmp_path.glob("segment-*"))) == 1
    assert not list(tmp_path.glob("*.tmp"))
    first_index, next_index, read = await reopen_and_read(tmp_path)
    assert read == entries(first_index, [*RECORDS, b"more"][first_index:])
    assert next_index == len(RECORDS) + 1


async def test_leftover_temp_files_and_superseded_segment_are_removed(tmp_path: Path) -> None:
    await prepare_for_install(tmp_path)
    old_segment = segment_path(tmp_path).read_bytes()
    async with FileMetadataLog(tmp_path) as log:
        await log.install_snapshot(4, b"new")
    # A crash after the new segment's rename left the old one, and temp files, behind.
    (tmp_path / "segment-00000000000000000001.log").write_bytes(old_segment)
    (tmp_path / "snapshot.tmp").write_bytes(b"half a snapshot")
    (tmp_path / "segment-00000000000000000009.log.tmp").write_bytes(b"half a segment")
    assert await reopen_and_read(tmp_path) == (4, len(RECORDS), entries(4, RECORDS[4:]))
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "LOCK",
        "segment-00000000000000000004.log",
        "snapshot",
    ]


async def test_newest_segment_wins_over_one_whose_deletion_was_lost(tmp_path: Path) -> None:
    """The old segment's unlink was not durable, but appends to the new one were."""
    await prepare_for_install(tmp_path)
    old_segment = segment_path(tmp_path).read_bytes()
    async with FileMetadataLog(tmp_path) as log:
        await log.install_snapshot(4, b"new")
        await log.append([b"after", b"install"], expected_next_index=len(RECORDS))
    (tmp_path / "segment-00000000000000000001.log").write_bytes(old_segment)
    assert await reopen_and_read(tmp_path) == (
        4,
        len(RECORDS) + 2,
        entries(4, [*RECORDS[4:], b"after", b"install"]),
    )


# ------------------------------------------------------------------------ recovery


async def test_torn_tail_at_every_offset_of_the_last_batch(tmp_path: Path) -> None:
    sizes = await write_batches(tmp_path)
    path = segment_path(tmp_path)
    image = path.read_bytes()
    kept = len(BATCHES[0]) + len(BATCHES[1])
    for cut in range(sizes[1], sizes[2]):
        path.write_bytes(image[:cut])
        async with FileMetadataLog(tmp_path) as log:
            assert log.next_index == kept, cut
            assert await log.read(0) == entries(0, RECORDS[:kept])
            assert path.stat().st_size == sizes[1]
            await log.append([b"new", b"batch"], expected_next_index=kept)
        assert await reopen_and_read(tmp_path) == (
            0,
            kept + 2,
            entries(0, [*RECORDS[:kept], b"new", b"batch"]),
        )


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 4096, b"\xff" * 3, encode_batch(8, [b"x"])[:-1], encode_batch(8, [b"x"])[:20]],
    ids=["zeros", "ones", "unfinished-batch", "half-header"],
)
async def test_garbage_after_the_last_batch_is_cut(tmp_path: Path, garbage: bytes) -> None:
    sizes = await write_batches(tmp_path)
    with segment_path(tmp_path).open("ab") as file:
        file.write(garbage)
    assert await reopen_and_read(tmp_path) == (0, len(RECORDS), entries(0, RECORDS))
    assert segment_path(tmp_path).stat().st_size == sizes[-1]


async def test_a_torn_batch_with_holes_is_dropped_whole(tmp_path: Path) -> None:
    """Pages of the batch in flight may reach the disk out of order: a hole, then the rest."""
    sizes = await write_batches(tmp_path)
    path = segment_path(tmp_path)
    image = bytearray(path.read_bytes())
    for hole_start in range(sizes[1], sizes[2], 7):
        damaged = bytearray(image)
        damaged[hole_start : hole_start + 9] = bytes(len(damaged[hole_start : hole_start + 9]))
        path.write_bytes(damaged)
        _, next_index, read = await reopen_and_read(tmp_path)
        assert next_index == len(BATCHES[0]) + len(BATCHES[1]), hole_start
        assert read == entries(0, RECORDS[:next_index])
        path.write_bytes(image)


async def test_flipped_byte_in_a_middle_batch_is_corruption(tmp_path: Path) -> None:
    sizes = await write_batches(tmp_path)
    path = segment_path(tmp_path)
    image = path.read_bytes()
    for position in range(sizes[0], sizes[1]):
        path.write_bytes(flipped(image, position, 0x40))
        error = await open_corrupt(tmp_path)
        assert error.path == path
        assert error.offset == sizes[0], position
        assert str(path) in str(error)
    path.write_bytes(image)
    # Nothing was truncated or rewritten on the way.
    assert await reopen_and_read(tmp_path) == (0, len(RECORDS), entries(0, RECORDS))


async def test_flipped_byte_in_the_last_batch_is_taken_for_a_torn_tail(tmp_path: Path) -> None:
    """By design: damage to the last batch looks exactly like a crash that tore it."""
    sizes = await write_batches(tmp_path)
    path = segment_path(tmp_path)
    image = path.read_bytes()
    kept = len(BATCHES[0]) + len(BATCHES[1])
    for position in range(sizes[1], sizes[2]):
        path.write_bytes(flipped(image, position, 0x01))
        assert await reopen_and_read(tmp_path) == (0, kept, entries(0, RECORDS[:kept]))
        assert path.stat().st_size == sizes[1]


@pytest.mark.parametrize(
    ("second_index", "kind"), [(2, "gap"), (0, "duplicate"), (3, "gap")], ids=str
)
@pytest.mark.parametrize("followed", [False, True], ids=["last", "middle"])
async def test_index_gap_or_duplicate_is_corruption(
    tmp_path: Path, second_index: int, kind: str, followed: bool
) -> None:
    image = encode_batch(0, [b"a"]) + encode_batch(second_index, [b"b", b"c"])
    if followed:
        image += encode_batch(second_index + 2, [b"d"])
    (tmp_path / "segment-00000000000000000000.log").write_bytes(image)
    assert (await open_corrupt(tmp_path, kind)).offset == len(encode_batch(0, [b"a"]))


async def test_record_index_inside_a_batch_must_follow_the_batch(tmp_path: Path) -> None:
    batch = bytearray(encode_batch(0, [b"a", b"b"]))
    second_record = BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 1
    forged = encode_batch(5, [b"b"])[BATCH_HEADER_SIZE:]  # a valid frame with the wrong index
    batch[second_record:] = forged
    (tmp_path / "segment-00000000000000000000.log").write_bytes(bytes(batch))
    await open_corrupt(tmp_path, "index 5")


async def test_corrupt_or_short_snapshot_file_is_an_error(tmp_path: Path) -> None:
    await prepare_for_install(tmp_path)
    snapshot_path = tmp_path / SNAPSHOT_FILE_NAME
    image = snapshot_path.read_bytes()
    for position in range(len(image)):
        snapshot_path.write_bytes(flipped(image, position, 0x10))
        assert (await open_corrupt(tmp_path)).path == snapshot_path
    for damaged in (image[:0], image[:10], image[:-1], image + b"\x00"):
        snapshot_path.write_bytes(damaged)
        await open_corrupt(tmp_path)


async def test_missing_records_between_snapshot_and_segment_are_an_error(tmp_path: Path) -> None:
    await prepare_for_install(tmp_path)
    segment = segment_path(tmp_path)
    segment.rename(tmp_path / "segment-00000000000000000002.log")
    await open_corrupt(tmp_path, "missing")
    (tmp_path / "segment-00000000000000000002.log").unlink()
    await open_corrupt(tmp_path, "no segment")


async def test_disk_change_under_an_open_log_is_seen_by_read(tmp_path: Path) -> None:
    async with FileMetadataLog(tmp_path) as log:
        await log.append([b"payload"], expected_next_index=0)
        path = segment_path(tmp_path)
        damaged = bytearray(path.read_bytes())
        damaged[-1] ^= 0xFF
        path.write_bytes(damaged)
        with pytest.raises(MetadataLogCorrupt):
            await log.read(0)


async def test_failed_fsync_fails_the_append_and_the_batch_is_all_or_nothing(
    tmp_path: Path,
) -> None:
    log = await FileMetadataLog.open(tmp_path)
    await log.append([b"kept"], expected_next_index=0)
    acknowledged_size = segment_path(tmp_path).stat().st_size
    with failing_step(1):
        with pytest.raises(MetadataLogError) as caught:
            await log.append([b"in", b"doubt"], expected_next_index=1)
        assert isinstance(caught.value.__cause__, OSError)
        with pytest.raises(MetadataLogError, match="reopen"):
            await log.append([b"refused"], expected_next_index=1)
        with pytest.raises(MetadataLogError, match="reopen"):
            await log.install_snapshot(1, b"refused")
        assert await log.read(0) == [LogEntry(0, b"kept")]
        await log.close()
    path = segment_path(tmp_path)
    image = path.read_bytes()
    for cut in range(acknowledged_size, len(image) + 1):
        path.write_bytes(image[:cut])
        _, next_index, read = await reopen_and_read(tmp_path)
        expected = [b"kept", b"in", b"doubt"] if cut == len(image) else [b"kept"]
        assert read == entries(0, expected), cut
        assert next_index == len(expected)


# --------------------------------------------------------------------------- locking


async def test_second_opener_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    log = await FileMetadataLog.open(tmp_path)
    with pytest.raises(MetadataLogLocked, match=f"pid {os.getpid()}"):
        await FileMetadataLog.open(tmp_path)
    script = (
        "import asyncio, sys\n"
        "from automq_ref.io.metadata.metadata_log import FileMetadataLog, MetadataLogLocked\n"
        "try:\n"
        f"    asyncio.run(FileMetadataLog.open({str(tmp_path)!r}))\n"
        "except MetadataLogLocked:\n"
        "    sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert result.returncode == 3
    await log.close()
    async with FileMetadataLog(tmp_path) as reopened:
        assert reopened.next_index == 0
