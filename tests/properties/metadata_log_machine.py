"""The MetadataLog contract as a hypothesis state machine, shared by every implementation.

:class:`MetadataLogContractMachine` drives one log through append (at the right index and at
stale ones), read, install_snapshot, wait_for and reopen, against a model: the list of
acknowledged records (a record's index is its position) and the snapshot (index and payload).
After every step the log must report the model's next index and snapshot index, and every
acknowledged record from the snapshot on must read back at its index with its payload.

An implementation's machine subclasses it and says how its log is opened (``open_log``) and
closed for good (``discard``); it may add rules of its own (the file log's crashes). The hooks
``before_append`` / ``appended`` and ``snapshot_installed`` let it follow what it needs to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from automq_ref.io.metadata.metadata_log import (
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLog,
    Snapshot,
)

_T = TypeVar("_T")

payloads = st.binary(max_size=40)
batches = st.lists(payloads, min_size=1, max_size=5)
WAIT_TIMEOUT_S = 10


class MetadataLogContractMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = self.event_loop()
        self.log: MetadataLog | None = None
        self.records: list[bytes] = []
        self.snapshot = Snapshot(0, b"")
        self.has_snapshot = False

    # ------------------------------------------------------------ what a subclass says

    async def open_log(self) -> MetadataLog:
        """Open the log under test (again, after a close: the same durable state)."""
        raise NotImplementedError

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the example runs on: a fresh one, closed at teardown, unless the subclass
        hands out a shared one (``owns_loop`` False), as gRPC clients need."""
        return asyncio.new_event_loop()

    owns_loop = True

    def discard(self) -> None:
        """Remove whatever the log kept (after the last close)."""

    async def closing(self) -> None:
        """Release what else the machine opened, before the log is closed for good."""

    def before_append(self) -> object:
        """Called before a good append; its result is handed to ``appended``."""
        return None

    def appended(self, batch: list[bytes], token: object) -> None:
        """A good, non-empty append of ``batch`` was acknowledged."""

    def snapshot_installed(self) -> None:
        """A snapshot was installed."""

    # ------------------------------------------------------------------- plumbing

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coroutine)

    @property
    def opened(self) -> MetadataLog:
        assert self.log is not None
        return self.log

    def reopen_log(self) -> None:
        self.log = self.run(self.open_log())

    @initialize()
    def open_first(self) -> None:
        self.reopen_log()

    # ---------------------------------------------------------------------- rules

    def append_acknowledged(self, batch: list[bytes]) -> None:
        token = self.before_append()
        next_index = self.run(self.opened.append(batch, expected_next_index=len(self.records)))
        self.records.extend(batch)
        assert next_index == len(self.records)
        if batch:
            self.appended(batch, token)

    @rule(batch=st.lists(payloads, max_size=5), stale_by=st.sampled_from([0, 0, 0, 1, 2, -1]))
    def append(self, batch: list[bytes], stale_by: int) -> None:
        if stale_by == 0:
            self.append_acknowledged(batch)
            return
        expected_next_index = len(self.records) - stale_by
        try:
            self.run(self.opened.append(batch, expected_next_index=expected_next_index))
        except LogIndexConflict as conflict:
            assert conflict.next_index == len(self.records)
            assert conflict.expected_next_index == expected_next_index
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

    def draw_snapshot_index(self, data: st.DataObject) -> int:
        """A snapshot index, often strictly inside the log (hypothesis favours the minimum)."""
        low, high = self.snapshot.index, len(self.records)
        back = data.draw(st.integers(min_value=0, max_value=high - low))
        return high - back if data.draw(st.booleans()) else low + back

    @rule(data=st.data(), payload=payloads)
    def install_snapshot(self, data: st.DataObject, payload: bytes) -> None:
        index = self.draw_snapshot_index(data)
        event(f"install_snapshot covers {min(index - self.snapshot.index, 3)}+ new records")
        self.run(self.opened.install_snapshot(index, payload))
        self.snapshot = Snapshot(index, payload)
        self.has_snapshot = True
        self.snapshot_installed()
        self.check_snapshot()

    @rule(batch=batches, ahead=st.integers(min_value=0, max_value=2))
    def wait_for(self, batch: list[bytes], ahead: int) -> None:
        """A waiter for a record not yet there wakes once an append brings it (or waits on, if
        the append does not reach it); one for an existing record returns at once."""
        log = self.opened
        if self.records:
            existing = len(self.records) - 1
            assert self.run(log.wait_for(existing)) == len(self.records)
        index = len(self.records) + ahead

        async def append_while_waiting() -> int | None:
            waiter = asyncio.ensure_future(log.wait_for(index))
            await asyncio.sleep(0)
            assert not waiter.done()
            token = self.before_append()
            await log.append(batch, expected_next_index=len(self.records))
            self.records.extend(batch)
            self.appended(batch, token)
            if len(self.records) <= index:
                await asyncio.sleep(0.01)
                assert not waiter.done()
                waiter.cancel()
                return None
            return await asyncio.wait_for(waiter, WAIT_TIMEOUT_S)

        woke = self.run(append_while_waiting())
        event(f"wait_for: {'woke' if woke is not None else 'still waiting'}")
        assert woke is None or woke == len(self.records)

    @rule()
    def reopen(self) -> None:
        self.run(self.opened.close())
        self.reopen_log()
        self.check_snapshot()

    def check_snapshot(self) -> None:
        """The snapshot changes only in the rules that call this: it must be the model's."""
        expected = self.snapshot if self.has_snapshot else None
        assert self.run(self.opened.snapshot()) == expected

    # ----------------------------------------------------------------- invariants

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
            self.run(self.closing())
            if self.log is not None:
                self.run(self.log.close())
        finally:
            if self.owns_loop:
                self.loop.close()
            self.discard()
