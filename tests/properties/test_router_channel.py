"""RouterChannelMachine: appends, route epochs, trims by committed epoch and restarts of the
channel's node, against a model of what was appended under which epoch.

The trim rule is the one safety rests on (the RouteEpoch machine's ``TrimSafe``): a record
tagged with a route epoch above every committed epoch the channel was trimmed to must stay
readable, by any node, with the bytes appended; a record at or below may be gone, and then its
read says so (``ChannelRecordGoneError``), never returns other bytes. Restarts matter because
the new incarnation does not know the epochs of what it inherited.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from automq_ref.formats.zone_router import ChannelOffset
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.router_channel import (
    ChannelRecordGoneError,
    RouterChannel,
    RouterChannelReader,
)
from automq_ref.io.storage.wal_object import ObjectWalConfig

NAMESPACE = "_kafka_test"
NODE = 4
T = TypeVar("T")
CONFIG = ObjectWalConfig(batch_interval_ms=2, max_bytes_in_batch=1500)


class RouterChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="router-channel-"))
        self.store = LocalDirectoryObjectStore(self.directory, fsync=False)
        self.reader = RouterChannelReader({0: self.store}, NAMESPACE)
        self.node_epoch = 1
        self.route_epoch = 0  # the newest route epoch the node knows
        self.committed = -1  # the highest committed epoch the channel was trimmed to
        self.records: list[tuple[int, ChannelOffset, bytes]] = []
        self.serial = 0
        self.channel = self.run(self._open())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    async def _open(self) -> RouterChannel:
        return await RouterChannel.open(
            self.store,
            namespace=NAMESPACE,
            node_id=NODE,
            node_epoch=self.node_epoch,
            channel_id=0,
            config=CONFIG,
            route_epoch=self.route_epoch,
        )

    @rule(node=st.integers(0, 3), sizes=st.lists(st.integers(1, 900), min_size=1, max_size=5))
    def append(self, node: int, sizes: list[int]) -> None:
        async def append_all() -> list[tuple[int, ChannelOffset]]:
            return list(
                await asyncio.gather(*(self.channel.append(node, 0, data) for data in payloads))
            )

        payloads = []
        for size in sizes:
            self.serial += 1
            payloads.append((self.serial.to_bytes(4, "big") * size)[:size])
        for (epoch, offset), data in zip(self.run(append_all()), payloads, strict=True):
            assert epoch == self.route_epoch
            assert offset.target_node_id == node
            self.records.append((epoch, offset, data))

    @rule(step=st.integers(-1, 2))
    def next_epoch(self, step: int) -> None:
        """The node learns a route epoch (a stale one changes nothing)."""
        self.channel.next_epoch(self.route_epoch + step)
        self.route_epoch = max(self.route_epoch, self.route_epoch + step)
        assert self.channel.route_epoch == self.route_epoch

    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        """Every node committed an epoch below the current one: the channel trims to it."""
        committed = data.draw(st.integers(-1, self.route_epoch - 1))
        self.run(self.channel.trim(committed))
        self.committed = max(self.committed, committed)

    @rule()
    def restart(self) -> None:
        """The node restarts at a new node epoch, knowing the current route epoch."""
        self.run(self.channel.close())
        self.node_epoch += 1
        self.channel = self.run(self._open())

    @invariant()
    def every_record_above_the_committed_epoch_reads_back(self) -> None:
        async def read(offset: ChannelOffset) -> bytes | None:
            try:
                return await self.reader.read(offset)
            except ChannelRecordGoneError:
                return None

        async def read_all() -> list[bytes | None]:
            return list(await asyncio.gather(*(read(offset) for _, offset, _ in self.records)))

        got = self.run(read_all())
        for (epoch, offset, data), read_back in zip(self.records, got, strict=True):
            if epoch > self.committed:
                assert read_back == data, (epoch, self.committed, offset)
            else:
                assert read_back in (None, data)

    def teardown(self) -> None:
        try:
            self.run(self.channel.close())
            self.run(self.store.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


RouterChannelMachine.TestCase.settings = settings(
    RouterChannelMachine.TestCase.settings, max_examples=30, stateful_step_count=30
)
TestRouterChannelMachine = RouterChannelMachine.TestCase
