"""ObjectWalMachine: the object WAL's twin of BlockWalMachine, over a store that fails on cue.

The model keeps the acknowledged records that are not trimmed (``live``, with their offsets)
and, after a crash, the records whose outcome is unknown (``in_doubt``, in append order). The
store is a local directory behind :class:`FaultyObjectStore`: the directory is what outlives a
crash, the wrapper is one process's view of it (503s, PUTs that land but answer an error, a
crash after a chosen number of calls, so that a crash can fall between an upload and the
reservation check that must precede its acknowledgement).

After any crash, recovery must return exactly ``live`` followed by a prefix of ``in_doubt``:
uploads run concurrently, but a later object without an earlier one is never returned. After a
takeover (a survivor opens the WAL in failover mode while the writer still runs), nothing the
old writer appends is acknowledged, the survivor recovers exactly ``live``, and once it reset
the WAL, the node's next epoch recovers none of it (only, possibly, what the fenced writer wrote
after the takeover, which nobody acknowledged). When a bit of a stored object is flipped,
recovery may stop early, but every record it returns was written, intact, at that offset.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from automq_ref.checker.object_faults import FaultyObjectStore
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.wal import RecoveredRecord, WalFencedError, WalIOError
from automq_ref.io.storage.wal_object import ObjectWal, ObjectWalConfig
from automq_ref.vocabulary.naming import wal_objects_prefix

NAMESPACE = "_kafka_test"
NODE_ID = 1
CONFIG = ObjectWalConfig(
    batch_interval_ms=5,
    max_bytes_in_batch=3000,
    max_inflight_uploads=3,
    retry_base_s=0.001,
    retry_max_s=0.01,
)
record_sizes = st.lists(st.integers(min_value=8, max_value=2500), min_size=1, max_size=10)
FAULTY_OPERATIONS = {"put", "get", "delete_many"}


class ObjectWalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="object-wal-"))
        self.durable = LocalDirectoryObjectStore(self.directory, fsync=False)
        self.store = FaultyObjectStore(self.durable)
        self.epoch = 0
        self.serial = 0
        self.live: list[tuple[int, int, bytes]] = []
        self.written: set[tuple[int, int, bytes]] = set()
        self.in_doubt: list[bytes] = []
        self.ever_in_doubt: set[bytes] = set()
        # Written by a fenced writer after a takeover: never acknowledged, may be recovered.
        self.zombie_writes: set[bytes] = set()
        self.wal: ObjectWal | None = None
        self.dead = False

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def next_body(self, size: int) -> bytes:
        self.serial += 1
        return self.serial.to_bytes(8, "big") + b"#" * (size - 8)

    async def _open(self) -> tuple[ObjectWal, list[RecoveredRecord]]:
        self.epoch += 1
        self.store = FaultyObjectStore(self.durable, seed=self.epoch)
        wal = await ObjectWal.open(
            self.store, namespace=NAMESPACE, node_id=NODE_ID, node_epoch=self.epoch, config=CONFIG
        )
        return wal, [record async for record in wal.recover()]

    @initialize()
    def start(self) -> None:
        wal, recovered = self.run(self._open())
        assert recovered == []
        self.run(wal.reset())
        self.wal = wal

    async def _append_all(self, bodies: list[bytes]) -> list[Any]:
        assert self.wal is not None
        return await asyncio.gather(
            *(self.wal.append(data) for data in bodies), return_exceptions=True
        )

    def _acknowledged(self, data: bytes, outcome: Any) -> None:
        assert not isinstance(outcome, BaseException), outcome
        self.live.append((outcome.record_offset, outcome.next_offset, data))
        self.written.add(self.live[-1])

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.dead)
    @rule(sizes=record_sizes)
    def append(self, sizes: list[int]) -> None:
        bodies = [self.next_body(size) for size in sizes]
        for data, outcome in zip(bodies, self.run(self._append_all(bodies)), strict=True):
            self._acknowledged(data, outcome)

    @precondition(lambda self: not self.dead)
    @rule(
        sizes=record_sizes,
        unavailable=st.sampled_from([0.0, 0.3, 0.6]),
        ambiguous=st.sampled_from([0.0, 0.3, 0.6]),
    )
    def append_through_store_faults(
        self, sizes: list[int], unavailable: float, ambiguous: float
    ) -> None:
        """503s and PUTs that land but answer an error: retried; every append acknowledged."""
        bodies = [self.next_body(size) for size in sizes]
        self.store.set_faults(
            unavailable_rate=unavailable, ambiguous_rate=ambiguous, operations=FAULTY_OPERATIONS
        )
        outcomes = self.run(self._append_all(bodies))
        self.store.heal()
        for data, outcome in zip(bodies, outcomes, strict=True):
            self._acknowledged(data, outcome)

    @precondition(lambda self: not self.dead)
    @rule(sizes=record_sizes, calls_before_crash=st.integers(min_value=0, max_value=6))
    def append_and_crash(self, sizes: list[int], calls_before_crash: int) -> None:
        """The process dies after a few more store calls (1: the first PUT lands, and the
        process dies before the reservation check that would have acknowledged it), or, if the
        appends needed fewer, right after them."""
        bodies = [self.next_body(size) for size in sizes]
        self.store.crash_after_operations = calls_before_crash
        outcomes = self.run(self._append_all(bodies))
        for data, outcome in zip(bodies, outcomes, strict=True):
            if isinstance(outcome, WalIOError):
                self.in_doubt.append(data)
                self.ever_in_doubt.add(data)
            else:
                assert not self.in_doubt, "an append succeeded after an earlier one failed"
                self._acknowledged(data, outcome)
        if self.in_doubt:
            event(f"appends in doubt after a crash {calls_before_crash} store calls in")
        # Always dead afterwards: how many calls the WAL made depends on timing (how uploads
        # grouped), and the rules available next must not.
        self.store.crash()
        self.dead = True

    @precondition(lambda self: not self.dead and len(self.live) > 0)
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        assert self.wal is not None
        index = data.draw(st.integers(min_value=0, max_value=len(self.live) - 1))
        self.run(self.wal.trim(self.live[index][1]))
        del self.live[: index + 1]

    @rule()
    def crash_and_recover(self) -> None:
        self._abandon_wal()
        self._recover_and_check(exact=True)

    @rule(
        which=st.integers(min_value=0, max_value=2**16),
        position=st.integers(min_value=0, max_value=2**16),
        bit=st.integers(min_value=0, max_value=7),
    )
    def flip_bit_crash_and_recover(self, which: int, position: int, bit: int) -> None:
        """Flip one bit of one stored WAL object (chosen from numbers drawn up front: what the
        store holds depends on timing, and the draws must not)."""
        self._abandon_wal()
        objects = self.run(self.durable.list(wal_objects_prefix(NAMESPACE, NODE_ID)))
        if objects:
            target = objects[which % len(objects)].key
            content = bytearray(self.run(self.durable.get(target)))
            content[position % len(content)] ^= 1 << bit
            self.run(self.durable.put(target, bytes(content)))
        self._recover_and_check(exact=False)

    @precondition(lambda self: not self.dead)
    @rule()
    def close_and_reopen(self) -> None:
        assert self.wal is not None
        self.run(self.wal.close())
        wal, recovered = self.run(self._open())
        assert [(r.record_offset, r.next_offset, r.body) for r in recovered] == self.live
        self.live = []
        self.run(wal.reset())
        self.wal = wal

    @precondition(lambda self: not self.dead)
    @rule(zombie_sizes=record_sizes)
    def take_over_while_the_writer_runs(self, zombie_sizes: list[int]) -> None:
        """A survivor takes the WAL over; the old writer, a zombie, keeps appending."""
        assert self.wal is not None
        zombie = self.wal
        survivor_store = FaultyObjectStore(self.durable, seed=-self.epoch)
        survivor = self.run(
            ObjectWal.take_over(
                survivor_store,
                namespace=NAMESPACE,
                node_id=NODE_ID,
                node_epoch=self.epoch,
                config=CONFIG,
            )
        )
        bodies = [self.next_body(size) for size in zombie_sizes]
        for outcome in self.run(self._append_all(bodies)):
            assert isinstance(outcome, WalFencedError), f"a fenced writer acknowledged {outcome}"
        self.zombie_writes.update(bodies)
        recovered = self.run(self._recover(survivor))
        assert [(r.record_offset, r.next_offset, r.body) for r in recovered] == self.live
        self.run(survivor.reset())
        self.run(survivor.close())
        self.run(zombie.close())
        self.wal = None
        self.live = []
        # The node restarts at a newer epoch: what the survivor took over is gone.
        wal, recovered = self.run(self._open())
        assert {r.body for r in recovered} <= self.zombie_writes, "a taken-over record came back"
        if recovered:
            event("a fenced writer's late object was recovered (never acknowledged)")
        self.run(wal.reset())
        self.wal = wal

    async def _recover(self, wal: ObjectWal) -> list[RecoveredRecord]:
        return [record async for record in wal.recover()]

    def _recover_and_check(self, *, exact: bool) -> None:
        wal, recovered = self.run(self._open())
        bodies = [record.body for record in recovered]
        if exact:
            assert [(r.record_offset, r.next_offset, r.body) for r in recovered][
                : len(self.live)
            ] == self.live, "lost or moved an acknowledged record"
            assert bodies[len(self.live) :] == self.in_doubt[: len(bodies) - len(self.live)]
            if len(bodies) > len(self.live):
                event("recovered records that were never acknowledged")
        else:
            # A damaged length in an object's header may leave its last intact record ending
            # where its bytes end rather than at the object's aligned end: either is its end.
            written = {(start, data) for start, _, data in self.written}
            for record in recovered:
                assert (
                    (record.record_offset, record.body) in written
                    or record.body in self.ever_in_doubt
                    or record.body in self.zombie_writes
                ), record
                assert record.next_offset > record.record_offset + len(record.body)
            offsets = [record.record_offset for record in recovered]
            assert offsets == sorted(set(offsets))
        for record in recovered:
            self.written.add((record.record_offset, record.next_offset, record.body))
        self.run(wal.reset())
        self.wal = wal
        self.live = []
        self.in_doubt = []
        self.dead = False

    def _abandon_wal(self) -> None:
        """The process dies: nothing more reaches the store; release the old WAL object."""
        self.store.crash()
        if self.wal is not None:
            self.run(self.wal.close())
            self.wal = None

    # -------------------------------------------------------------- invariants

    @invariant()
    def acknowledged_offsets_are_ordered_and_durable(self) -> None:
        if self.wal is None or self.dead:
            return
        previous_end = self.wal.trim_offset
        for start, end, _ in self.live:
            assert previous_end <= start < end <= self.wal.confirm_offset
            previous_end = end

    def teardown(self) -> None:
        try:
            if self.wal is not None:
                self.run(self.wal.close())
            self.run(self.durable.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


ObjectWalMachine.TestCase.settings = settings(
    ObjectWalMachine.TestCase.settings, max_examples=150, stateful_step_count=25
)
TestObjectWalMachine = ObjectWalMachine.TestCase
