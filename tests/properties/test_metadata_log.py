"""MetadataLogMachine: append / read / install_snapshot / crash / reopen against a model.

The model is the list of acknowledged records (a record's index is its position) and the
snapshot (index and payload). After every step the log must report the model's next index and
snapshot index, and every acknowledged record from the snapshot on must read back at its index
with its payload.

Crashes: ``close`` writes nothing (every acknowledged byte is already synced), so closing the
log leaves exactly the files a crash at that moment would. The crash rules make a durability
step fail (the append's fsync, or one step of ``install_snapshot``), close the failed log, and
then damage what a power loss could damage: the bytes written after the last acknowledged
append, which the page cache held but no fsync covered. They are cut at a random point and
may get a hole of zeros (pages written back out of order). The batch in flight must then come
back entirely when its bytes survived intact, and not at all otherwise.

Media corruption (``flip_acknowledged_bit``): a bit flipped before the last batch must make
open refuse with MetadataLogCorrupt and change nothing; a bit flipped in the last batch makes
that batch count as torn and drop out of the model (the module's documented choice).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from automq_ref.io.metadata.metadata_log import (
    FileMetadataLog,
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLogCorrupt,
    MetadataLogError,
    Snapshot,
)
from tests.unit.test_metadata_log import failing_step

_T = TypeVar("_T")

payloads = st.binary(max_size=40)
batches = st.lists(payloads, min_size=1, max_size=5)
# The steps of install_snapshot: 3 for the snapshot file, 5 more when the segment is rewritten.
INSTALL_STEP_COUNT = 8
SNAPSHOT_RENAME_STEP = 2
# Memory-backed when there is one: the crashes here are simulated, so a disk's fsync adds nothing.
SCRATCH_DIRECTORY = "/dev/shm" if Path("/dev/shm").is_dir() else None


class MetadataLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="metadata-log-", dir=SCRATCH_DIRECTORY))
        self.log: FileMetadataLog | None = None
        self.records: list[bytes] = []
        self.snapshot = Snapshot(0, b"")
        self.has_snapshot = False
        # Where the segment's last batch starts and how many records it holds, while known
        # (rewriting the segment for a snapshot moves batches).
        self.last_batch: tuple[int, int] | None = None

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coroutine)

    @property
    def opened(self) -> FileMetadataLog:
        assert self.log is not None
        return self.log

    def segment_path(self) -> Path:
        return max(self.directory.glob("segment-*.log"))

    @initialize()
    def open_log(self) -> None:
        self.log = self.run(FileMetadataLog.open(self.directory))

    # ------------------------------------------------------------------ rules

    @rule(batch=st.lists(payloads, max_size=5), stale_by=st.sampled_from([0, 0, 0, 1, 2, -1]))
    def append(self, batch: list[bytes], stale_by: int) -> None:
        expected_next_index = len(self.records) - stale_by
        if stale_by == 0:
            size = self.segment_path().stat().st_size
            next_index = self.run(
                self.opened.append(batch, expected_next_index=expected_next_index)
            )
            self.records.extend(batch)
            assert next_index == len(self.records)
            if batch:
                self.last_batch = (size, len(batch))
            return
        try:
            self.run(self.opened.append(batch, expected_next_index=expected_next_index))
        except LogIndexConflict as conflict:
            assert conflict.next_index == len(self.records)
        else:
            raise AssertionError(f"append at stale index {expected_next_index} succeeded")

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        from_index = data.draw(st.integers(min_value=0, max_value=len(self.records) + 2))
        max_records = data.draw(st.none() | st.integers(min_value=0, max_value=6))
        if from_index < self.snapshot.index:
            try:
                self.run(self.opened.read(from_index, max_records))
            except LogTruncated as truncated:
                assert truncated.snapshot_index == self.snapshot.index
                return
            raise AssertionError(f"read below the snapshot from {from_index} succeeded")
        stop = len(self.records) if max_records is None else from_index + max_records
        expected = [
            LogEntry(index, self.records[index])
            for index in range(from_index, min(stop, len(self.records)))
        ]
        assert self.run(self.opened.read(from_index, max_records)) == expected

    def _draw_snapshot_index(self, data: st.DataObject) -> int:
        """A snapshot index, often strictly inside the log (hypothesis favours the minimum)."""
        low, high = self.snapshot.index, len(self.records)
        back = data.draw(st.integers(min_value=0, max_value=high - low))
        return high - back if data.draw(st.booleans()) else low + back

    @rule(data=st.data(), payload=payloads)
    def install_snapshot(self, data: st.DataObject, payload: bytes) -> None:
        index = self._draw_snapshot_index(data)
        event(f"install_snapshot covers {min(index - self.snapshot.index, 3)}+ new records")
        self.run(self.opened.install_snapshot(index, payload))
        self.snapshot = Snapshot(index, payload)
        self.has_snapshot = True
        self.last_batch = None
        self._check_snapshot()

    @rule(kind=st.sampled_from(["append", "install_snapshot", "garbage"]), data=st.data())
    def crash(self, kind: str, data: st.DataObject) -> None:
        """The process dies; the next incarnation opens the directory."""
        match kind:
            case "append":
                self._crash_during_append(data.draw(batches), data)
            case "install_snapshot":
                self._crash_during_install_snapshot(data)
            case _:
                self.run(self.opened.close())
                garbage = data.draw(st.binary(min_size=1, max_size=64))
                zeros = data.draw(st.sampled_from([0, 0, 4096]))
                with self.segment_path().open("ab") as file:
                    file.write(garbage + bytes(zeros))
        self.log = self.run(FileMetadataLog.open(self.directory))
        self._check_snapshot()

    def _crash_during_append(self, batch: list[bytes], data: st.DataObject) -> None:
        """The append's fsync fails; a random part of its unsynced bytes reaches the disk."""
        acknowledged_size = self.segment_path().stat().st_size
        with failing_step(1):
            try:
                self.run(self.opened.append(batch, expected_next_index=len(self.records)))
            except MetadataLogError:
                pass
            else:
                raise AssertionError("append succeeded although its fsync failed")
        self.run(self.opened.close())
        if self._damage_unsynced_tail(acknowledged_size, data):
            event("crash during append: in-flight batch intact, kept")
            self.records.extend(batch)
            self.last_batch = (acknowledged_size, len(batch))
        else:
            event("crash during append: in-flight batch damaged, dropped")

    def _damage_unsynced_tail(self, acknowledged_size: int, data: st.DataObject) -> bool:
        """Cut (and maybe hole) the unsynced bytes; whether the in-flight batch is intact."""
        path = self.segment_path()
        image = path.read_bytes()
        assert len(image) > acknowledged_size
        if data.draw(st.booleans()):
            cut = len(image)  # every page reached the disk (or holes only)
        else:
            cut = data.draw(st.integers(min_value=acknowledged_size, max_value=len(image)))
        damaged = bytearray(image[:cut])
        if cut > acknowledged_size and data.draw(st.booleans()):
            start = data.draw(st.integers(min_value=acknowledged_size, max_value=cut - 1))
            end = data.draw(st.integers(min_value=start + 1, max_value=cut))
            damaged[start:end] = bytes(end - start)
        path.write_bytes(damaged)
        return bytes(damaged) == image

    def _crash_during_install_snapshot(self, data: st.DataObject) -> None:
        """One durability step of install_snapshot fails; the files stay as they are then."""
        index = self._draw_snapshot_index(data)
        payload = data.draw(payloads)
        fail_at = data.draw(st.integers(min_value=1, max_value=INSTALL_STEP_COUNT))
        with failing_step(fail_at) as steps:
            try:
                self.run(self.opened.install_snapshot(index, payload))
            except MetadataLogError:
                failed = True
            else:
                failed = False
        assert failed == (fail_at <= len(steps)), steps
        event(f"crash during install_snapshot: step {fail_at if failed else 'none'} failed")
        if not failed or fail_at > SNAPSHOT_RENAME_STEP:
            self.snapshot = Snapshot(index, payload)
            self.has_snapshot = True
        self.last_batch = None
        self.run(self.opened.close())

    @precondition(lambda self: self.last_batch is not None)
    @rule(data=st.data(), bit=st.integers(min_value=0, max_value=7))
    def flip_acknowledged_bit(self, data: st.DataObject, bit: int) -> None:
        """Media corruption: one bit of an acknowledged batch flips while the log is closed."""
        assert self.last_batch is not None
        last_batch_offset, last_batch_records = self.last_batch
        self.run(self.opened.close())
        path = self.segment_path()
        image = path.read_bytes()
        position = data.draw(st.integers(min_value=0, max_value=len(image) - 1))
        damaged = bytearray(image)
        damaged[position] ^= 1 << bit
        path.write_bytes(damaged)
        event(f"flipped bit in the {'middle' if position < last_batch_offset else 'last batch'}")
        if position < last_batch_offset:
            # Acknowledged batches follow the damage: open refuses and changes nothing.
            try:
                self.run(FileMetadataLog.open(self.directory))
            except MetadataLogCorrupt as corrupt:
                assert corrupt.path == path
            else:
                raise AssertionError(f"opened with a flipped bit at {position}")
            assert path.read_bytes() == damaged
            path.write_bytes(image)
        else:
            # Damage to the last batch looks like a torn tail, and the batch goes (by design).
            del self.records[len(self.records) - last_batch_records :]
            self.last_batch = None
        self.log = self.run(FileMetadataLog.open(self.directory))

    @rule()
    def reopen(self) -> None:
        self.run(self.opened.close())
        self.log = self.run(FileMetadataLog.open(self.directory))
        self._check_snapshot()

    def _check_snapshot(self) -> None:
        """The snapshot changes only in the rules that call this: it must be the model's."""
        expected = self.snapshot if self.has_snapshot else None
        assert self.run(self.opened.snapshot()) == expected

    # -------------------------------------------------------------- invariants

    @invariant()
    def log_matches_the_model(self) -> None:
        """next_index and first_index are the model's; every acknowledged record reads back."""
        assert self.opened.next_index == len(self.records)
        assert self.opened.first_index == self.snapshot.index
        first_index = self.snapshot.index
        expected = [
            LogEntry(index, payload)
            for index, payload in enumerate(self.records[first_index:], start=first_index)
        ]
        assert self.run(self.opened.read(first_index)) == expected

    def teardown(self) -> None:
        try:
            if self.log is not None:
                self.run(self.log.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


TestMetadataLogMachine = MetadataLogMachine.TestCase
