"""DeviceFailoverMachine: the block WAL on a WAL device process, its owner taken over by a
survivor (or by its own next epoch) while it keeps writing, against a model.

The block WAL machine's twin for failover. The owner appends and trims; it may be overtaken at
any time, with appends of its still queued or in flight (``in_doubt``), by a survivor's
``take_over`` (the same epoch, failover) or by the node's next epoch; the overtaken writer is a
zombie that keeps running on the same event loop, its I/O thread racing the preempt, and may
try to append again later. The device is an in-memory disk behind a real device server on a
Unix socket, so the only thing that stops the zombie is the device's reservation.

After a takeover, recovery must return exactly the acknowledged, untrimmed records, then a
prefix of the owner's appends in doubt; every one of those the zombie reports acknowledged,
even after the takeover returned, must be in that prefix (it was flushed before the preempt);
every other one, and every append a zombie tries later, fails with ``WalFencedError``. After a
survivor's reset, the node's next epoch recovers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.io.storage.wal import AppendResult
from automq_ref.io.storage.wal_block import (
    RING_START_BYTES,
    BlockWal,
    WalError,
    WalFencedError,
    WalOverCapacityError,
)
from automq_ref.io.storage.wal_device import DeviceServer

CAPACITY_BYTES = RING_START_BYTES + 128 * 1024
MAX_WRITE_BYTES = 8 * 1024  # small groups: several in doubt at once
NODE = 1
record_sizes = st.lists(st.integers(min_value=8, max_value=6000), min_size=1, max_size=8)


async def _settle(futures: list[asyncio.Future[AppendResult]]) -> list[Any]:
    return await asyncio.gather(*futures, return_exceptions=True)


class DeviceFailoverMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="wal-device-"))
        self.server = DeviceServer(
            MemoryBlockDevice(CAPACITY_BYTES), str(self.directory / "sock")
        ).start()
        self.epoch = 1
        self.serial = 0
        self.owner: BlockWal | None = None
        self.zombies: list[BlockWal] = []
        self.live: list[tuple[int, int, bytes]] = []

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def next_body(self, size: int) -> bytes:
        self.serial += 1
        return self.serial.to_bytes(8, "big") + b"#" * (size - 8)

    async def _open(self, epoch: int, *, failover: bool = False) -> tuple[BlockWal, list[Any]]:
        wal = await BlockWal.open_remote(
            self.server.address,
            node_id=NODE,
            node_epoch=epoch,
            failover=failover,
            max_write_bytes=MAX_WRITE_BYTES,
        )
        return wal, [(r.record_offset, r.next_offset, r.body) async for r in wal.recover()]

    @initialize()
    def start(self) -> None:
        wal, recovered = self.run(self._open(self.epoch))
        assert recovered == []
        self.run(wal.reset())
        self.owner = wal

    # ------------------------------------------------------------------ rules

    @rule(sizes=record_sizes)
    def append(self, sizes: list[int]) -> None:
        assert self.owner is not None
        bodies = [self.next_body(size) for size in sizes]
        outcomes = self.run(self._append_all(self.owner, bodies))
        for data, outcome in zip(bodies, outcomes, strict=True):
            if isinstance(outcome, WalOverCapacityError):
                continue
            assert isinstance(outcome, AppendResult), outcome
            self.live.append((outcome.record_offset, outcome.next_offset, data))

    async def _append_all(self, wal: BlockWal, bodies: list[bytes]) -> list[Any]:
        return await asyncio.gather(*(wal.append(data) for data in bodies), return_exceptions=True)

    @precondition(lambda self: len(self.live) > 0)
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        assert self.owner is not None
        index = data.draw(st.integers(min_value=0, max_value=len(self.live) - 1))
        self.run(self.owner.trim(self.live[index][1]))
        del self.live[: index + 1]

    @rule(
        sizes=st.lists(st.integers(min_value=2000, max_value=6000), max_size=12),
        spins=st.integers(min_value=0, max_value=6),
        failover=st.booleans(),
        paused=st.booleans(),
    )
    def take_over_while_the_owner_writes(
        self, sizes: list[int], spins: int, failover: bool, paused: bool
    ) -> None:
        """The owner has appends queued or in flight when a survivor (``failover``) or the
        node's next epoch takes its WAL; the owner becomes a zombie. A ``paused`` owner's event
        loop stands still while the taker, on a thread and loop of its own, takes the WAL and
        recovers it (a process stopped past its session), then resumes; otherwise the owner
        keeps running beside the taker on one loop."""
        zombie = self.owner
        assert zombie is not None
        bodies = [self.next_body(size) for size in sizes]
        futures = self.run(self._submit_and_spin(zombie, bodies, spins))
        bodies = bodies[: len(futures)]
        epoch = self.epoch if failover else self.epoch + 1
        if paused:
            with ThreadPoolExecutor(max_workers=1) as elsewhere:
                opened = elsewhere.submit(asyncio.run, self._open(epoch, failover=failover))
                taker, recovered = opened.result()
        else:
            taker, recovered = self.run(self._open(epoch, failover=failover))
        assert recovered[: len(self.live)] == self.live, "lost an acknowledged record"
        tail = recovered[len(self.live) :]
        assert [body for _, _, body in tail] == bodies[: len(tail)], "not a prefix in doubt"
        # Let the zombie's appends settle: those it acknowledges were flushed before the
        # preempt, so the survivor found them; all others are refused as fenced.
        outcomes = self.run(_settle(futures))
        for data, outcome in zip(bodies, outcomes, strict=True):
            if isinstance(outcome, AppendResult):
                assert (outcome.record_offset, outcome.next_offset, data) in tail, data
            else:
                assert isinstance(outcome, WalFencedError), outcome
        acknowledged = sum(isinstance(outcome, AppendResult) for outcome in outcomes)
        event(f"paused={paused} in doubt={len(bodies)} found={len(tail)} acks={acknowledged}")
        self.zombies.append(zombie)
        self.run(taker.reset())
        self.live = []
        if failover:
            # The survivor has uploaded what it recovered; the node comes back at a new epoch.
            self.run(taker.close())
            taker, recovered = self.run(self._open(epoch + 1))
            assert recovered == [], "the survivor's reset left records behind"
            self.run(taker.reset())
            epoch += 1
        self.epoch = epoch
        self.owner = taker

    async def _submit_and_spin(
        self, wal: BlockWal, bodies: list[bytes], spins: int
    ) -> list[asyncio.Future[AppendResult]]:
        futures: list[asyncio.Future[AppendResult]] = []
        for data in bodies:
            try:
                futures.append(wal.submit(data))
            except WalOverCapacityError:
                break
        for _ in range(spins):  # some groups reach the device, maybe not all
            await asyncio.sleep(0.0005)
        return futures

    @precondition(lambda self: len(self.zombies) > 0)
    @rule(data=st.data(), sizes=record_sizes)
    def zombie_appends(self, data: st.DataObject, sizes: list[int]) -> None:
        zombie = data.draw(st.sampled_from(self.zombies))
        for size in sizes:
            outcome = self.run(self._append_all(zombie, [self.next_body(size)]))[0]
            assert isinstance(outcome, WalFencedError), f"a zombie's append: {outcome}"
        assert zombie.fenced

    @rule()
    def close_and_reopen(self) -> None:
        assert self.owner is not None
        self.run(self.owner.close())
        self.epoch += 1
        wal, recovered = self.run(self._open(self.epoch))
        assert recovered == self.live
        self.run(wal.reset())
        self.live = []
        self.owner = wal

    # -------------------------------------------------------------- invariants

    @invariant()
    def the_owner_holds_the_reservation(self) -> None:
        if self.owner is not None:
            holder = self.server.reservations.holder
            assert holder is not None and (holder.node_id, holder.node_epoch) == (
                NODE,
                self.epoch,
            )

    def teardown(self) -> None:
        try:
            for wal in [*self.zombies, *([self.owner] if self.owner else [])]:
                with contextlib.suppress(WalError):
                    self.run(wal.close())
        finally:
            self.server.stop()
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


TestDeviceFailoverMachine = DeviceFailoverMachine.TestCase
# Each step crosses a socket and threads: fewer, shorter runs than the profile's.
_profile = settings.default
assert _profile is not None
TestDeviceFailoverMachine.settings = settings(
    _profile, stateful_step_count=20, max_examples=min(_profile.max_examples, 100)
)
