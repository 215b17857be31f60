"""The MetadataLog contract against both implementations, and the file log's crashes.

The contract (``metadata_log_machine.py``): append / read / install_snapshot / wait_for / reopen
against a model of the acknowledged records and the snapshot. ``MetadataLogMachine`` runs it on
the file log and adds crashes and media corruption; ``EtcdMetadataLogMachine`` runs it on the
etcd log, against a real etcd started for the module (fewer examples: every step is a round
trip to etcd).

Crashes of the file log: ``close`` writes nothing (every acknowledged byte is already synced),
so closing the log leaves exactly the files a crash at that moment would. The crash rules make a
durability step fail (the append's fsync, or one step of ``install_snapshot``), close the failed
log, and then damage what a power loss could damage: the bytes written after the last
acknowledged append, which the page cache held but no fsync covered. They are cut at a random
point and may get a hole of zeros (pages written back out of order). The batch in flight must
then come back entirely when its bytes survived intact, and not at all otherwise.

Media corruption (``flip_acknowledged_bit``): a bit flipped before the last batch must make
open refuse with MetadataLogCorrupt and change nothing; a bit flipped in the last batch makes
that batch count as torn and drop out of the model (the module's documented choice).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from automq_ref.io.metadata.etcd_metadata_log import EtcdMetadataLog
from automq_ref.io.metadata.metadata_log import (
    FileMetadataLog,
    LogIndexConflict,
    MetadataLog,
    MetadataLogCorrupt,
    MetadataLogError,
    Snapshot,
)
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.properties.metadata_log_machine import MetadataLogContractMachine, batches, payloads
from tests.unit.test_metadata_log import failing_step

# The steps of install_snapshot: 3 for the snapshot file, 5 more when the segment is rewritten.
INSTALL_STEP_COUNT = 8
SNAPSHOT_RENAME_STEP = 2
# Memory-backed when there is one: the crashes here are simulated, so a disk's fsync adds nothing.
SCRATCH_DIRECTORY = "/dev/shm" if Path("/dev/shm").is_dir() else None
# Each step of the etcd machine is a few round trips to a real server.
ETCD_EXAMPLES = 40
ETCD_STEPS = 30


class MetadataLogMachine(MetadataLogContractMachine):
    """The contract on the file log, plus crashes and media corruption."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="metadata-log-", dir=SCRATCH_DIRECTORY))
        # Where the segment's last batch starts and how many records it holds, while known
        # (rewriting the segment for a snapshot moves batches).
        self.last_batch: tuple[int, int] | None = None

    @property
    def opened(self) -> FileMetadataLog:
        assert isinstance(self.log, FileMetadataLog)
        return self.log

    async def open_log(self) -> MetadataLog:
        return await FileMetadataLog.open(self.directory)

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def before_append(self) -> object:
        return self.segment_path().stat().st_size

    def appended(self, batch: list[bytes], token: object) -> None:
        assert isinstance(token, int)
        self.last_batch = (token, len(batch))

    def snapshot_installed(self) -> None:
        self.last_batch = None

    def segment_path(self) -> Path:
        return max(self.directory.glob("segment-*.log"))

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
        self.check_snapshot()

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
        index = self.draw_snapshot_index(data)
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


TestMetadataLogMachine = MetadataLogMachine.TestCase


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    loop = asyncio.new_event_loop()
    with running_etcd() as server:
        EtcdMetadataLogMachine.endpoint = server.endpoint
        EtcdMetadataLogMachine.shared_loop = loop
        try:
            yield server
        finally:
            loop.close()


@settings(max_examples=ETCD_EXAMPLES, stateful_step_count=ETCD_STEPS)
class EtcdMetadataLogMachine(MetadataLogContractMachine):
    """The contract on the etcd log; each example on a cluster id of its own."""

    endpoint = ""
    # One loop for every example: gRPC's asyncio client outlives a loop badly.
    shared_loop: asyncio.AbstractEventLoop | None = None
    owns_loop = False

    def event_loop(self) -> asyncio.AbstractEventLoop:
        assert self.shared_loop is not None
        return self.shared_loop

    def __init__(self) -> None:
        super().__init__()
        self.cluster_id = unique_cluster_id("contract")
        self.rival: EtcdMetadataLog | None = None

    async def open_log(self) -> MetadataLog:
        return await EtcdMetadataLog.connect([self.endpoint], self.cluster_id)

    @rule(batch=batches)
    def rival_appends(self, batch: list[bytes]) -> None:
        """Another broker's log on the same cluster appends; ours follows through wait_for,
        and its next append at the old index conflicts."""
        if self.rival is None:
            self.rival = self.run(EtcdMetadataLog.connect([self.endpoint], self.cluster_id))
        stale = len(self.records)
        self.run(self.rival.append(batch, expected_next_index=stale))
        self.records.extend(batch)
        assert self.run(self.opened.wait_for(stale)) == len(self.records)
        with pytest.raises(LogIndexConflict) as conflict:
            self.run(self.opened.append([b"late"], expected_next_index=stale))
        assert conflict.value.next_index == len(self.records)

    async def closing(self) -> None:
        if self.rival is not None:
            await self.rival.close()


TestEtcdMetadataLogMachine = pytest.mark.usefixtures("etcd_server")(EtcdMetadataLogMachine.TestCase)
