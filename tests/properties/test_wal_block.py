"""BlockWalMachine: append / trim / crash / recover against a model of what must survive.

The model keeps the acknowledged records that are not trimmed (``live``, with their offsets) and,
after a crash in the middle of a batch, the records whose outcome is unknown (``in_doubt``, in
append order). After any crash, recovery must return exactly ``live`` followed by a prefix of
``in_doubt``. When a bit of the disk is flipped, recovery may stop early, and if the bit lands
in the newest header it may start from the older header and return records trimmed or reset
away since; but every record it returns must be one that was written, intact, at that offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.io.storage.wal_block import (
    RING_START_BYTES,
    BlockWal,
    RecoveredRecord,
    WalIOError,
    WalOverCapacityError,
)

CAPACITY_BYTES = RING_START_BYTES + 96 * 1024
MAX_WRITE_BYTES = 16 * 1024
record_sizes = st.lists(st.integers(min_value=8, max_value=6000), min_size=1, max_size=12)


class BlockWalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.device = MemoryBlockDevice(CAPACITY_BYTES)
        self.epoch = 0
        self.serial = 0
        self.live: list[tuple[int, int, bytes]] = []
        self.written: set[tuple[int, int, bytes]] = set()
        # Bodies are unique (they start with a serial number), so a body identifies its record.
        self.ever_in_doubt: set[bytes] = set()
        self.in_doubt: list[bytes] = []
        self.wal: BlockWal | None = None
        self.device_dead = False

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def next_body(self, size: int) -> bytes:
        self.serial += 1
        return self.serial.to_bytes(8, "big") + b"#" * (size - 8)

    async def _open(self) -> tuple[BlockWal, list[RecoveredRecord]]:
        self.epoch += 1
        wal = await BlockWal.open(
            self.device, node_id=1, node_epoch=self.epoch, max_write_bytes=MAX_WRITE_BYTES
        )
        return wal, [record async for record in wal.recover()]

    @initialize()
    def start(self) -> None:
        wal, recovered = self.run(self._open())
        assert recovered == []
        self.run(wal.reset())
        self.wal = wal

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.device_dead)
    @rule(sizes=record_sizes)
    def append(self, sizes: list[int]) -> None:
        assert self.wal is not None
        bodies = [self.next_body(size) for size in sizes]
        outcomes = self.run(self._append_all(bodies))
        for data, outcome in zip(bodies, outcomes, strict=True):
            if isinstance(outcome, WalOverCapacityError):
                continue
            assert not isinstance(outcome, BaseException), outcome
            self.live.append((outcome.record_offset, outcome.next_offset, data))
            self.written.add(self.live[-1])

    async def _append_all(self, bodies: list[bytes]) -> list[Any]:
        assert self.wal is not None
        return await asyncio.gather(
            *(self.wal.append(data) for data in bodies), return_exceptions=True
        )

    @precondition(lambda self: not self.device_dead)
    @rule(sizes=record_sizes, operations_before_crash=st.integers(min_value=0, max_value=3))
    def append_and_crash(self, sizes: list[int], operations_before_crash: int) -> None:
        """The device dies after a few more writes or syncs, in the middle of the batch."""
        assert self.wal is not None
        bodies = [self.next_body(size) for size in sizes]
        self.device.crash_after_operations = operations_before_crash
        outcomes = self.run(self._append_all(bodies))
        for data, outcome in zip(bodies, outcomes, strict=True):
            if isinstance(outcome, WalOverCapacityError):
                continue
            if isinstance(outcome, WalIOError):
                self.in_doubt.append(data)
                self.ever_in_doubt.add(data)
            else:
                assert not isinstance(outcome, BaseException), outcome
                assert not self.in_doubt, "an append succeeded after an earlier one failed"
                self.live.append((outcome.record_offset, outcome.next_offset, data))
                self.written.add(self.live[-1])
        self.device_dead = self.device.crashed
        if not self.device_dead:
            self.device.crash_after_operations = None

    @precondition(lambda self: not self.device_dead and len(self.live) > 0)
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        assert self.wal is not None
        index = data.draw(st.integers(min_value=0, max_value=len(self.live) - 1))
        self.run(self.wal.trim(self.live[index][1]))
        del self.live[: index + 1]

    @rule(seed=st.integers(min_value=0, max_value=2**32), keep=st.sampled_from([0.0, 0.5, 1.0]))
    def crash_and_recover(self, seed: int, keep: float) -> None:
        self._abandon_wal()
        self.device = self.device.crash(random.Random(seed), keep_probability=keep)
        self._recover_and_check(exact=True)

    @rule(seed=st.integers(min_value=0, max_value=2**32), data=st.data())
    def flip_bit_crash_and_recover(self, seed: int, data: st.DataObject) -> None:
        self._abandon_wal()
        self.device = self.device.crash(random.Random(seed))
        position = data.draw(st.integers(min_value=0, max_value=CAPACITY_BYTES - 1))
        self.device.flip_bit(position, data.draw(st.integers(min_value=0, max_value=7)))
        self._recover_and_check(exact=False)

    @precondition(lambda self: not self.device_dead)
    @rule()
    def close_and_reopen(self) -> None:
        assert self.wal is not None
        self.run(self.wal.close())
        wal, recovered = self.run(self._open())
        assert [(r.record_offset, r.next_offset, r.body) for r in recovered] == self.live
        self.live = []
        self.run(wal.reset())
        self.wal = wal

    def _recover_and_check(self, *, exact: bool) -> None:
        try:
            wal, recovered = self.run(self._open())
        except Exception as error:
            # Only a corrupted header may refuse to open, and only with the typed error.
            assert not exact, error
            assert type(error).__name__ in {"WalHeaderCorruptError", "WalFencedError"}, error
            self._reformat()
            return
        bodies = [record.body for record in recovered]
        if exact:
            assert bodies[: len(self.live)] == [body for _, _, body in self.live], "lost a record"
            assert [(r.record_offset, r.next_offset) for r in recovered[: len(self.live)]] == [
                (start, end) for start, end, _ in self.live
            ]
            assert bodies[len(self.live) :] == self.in_doubt[: len(bodies) - len(self.live)]
        else:
            for record in recovered:
                entry = (record.record_offset, record.next_offset, record.body)
                assert entry in self.written or record.body in self.ever_in_doubt, entry
            offsets = [record.record_offset for record in recovered]
            assert offsets == sorted(set(offsets))
        for record in recovered:
            self.written.add((record.record_offset, record.next_offset, record.body))
        self.run(wal.reset())
        self.wal = wal
        self.live = []
        self.in_doubt = []
        self.device_dead = False

    def _abandon_wal(self) -> None:
        """The process dies: release the old WAL object without writing anything more."""
        if self.wal is not None:
            self.device.crash_after_operations = 0
            self.device.crashed = True
            with contextlib.suppress(WalIOError):
                self.run(self.wal.close())
            self.wal = None

    def _reformat(self) -> None:
        self.device = MemoryBlockDevice(CAPACITY_BYTES)
        self.epoch = 0
        self.live = []
        self.written = set()
        self.in_doubt = []
        self.device_dead = False
        self.start()

    # -------------------------------------------------------------- invariants

    @invariant()
    def offsets_are_ordered_and_inside_the_window(self) -> None:
        if self.wal is None or self.device_dead:
            return
        assert self.wal.start_offset <= self.wal.confirm_offset
        previous_end = self.wal.start_offset
        for start, end, _ in self.live:
            assert previous_end <= start < end <= self.wal.confirm_offset
            previous_end = end

    def teardown(self) -> None:
        try:
            if self.wal is not None and not self.device_dead:
                self.run(self.wal.close())
        finally:
            self.loop.close()


TestBlockWalMachine = BlockWalMachine.TestCase
