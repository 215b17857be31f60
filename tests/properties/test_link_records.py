"""S3StorageWithLinksMachine: the object-WAL storage machine of ``test_s3stream`` with appends
routed through a proxy's RouterChannel, so that the leader's WAL holds link records.

Beside the inherited rules (direct appends, reads, trims, uploads, crashes anywhere, a crash
between a WAL upload and its check), a routed append puts the data in the channel, then appends
it with its link record; the crashes that matter to links are:

- between the channel append and the WAL append: the data is in the channel, nothing in the
  WAL; nothing was acknowledged and nothing may appear;
- between the WAL append and the upload (``crash_and_restart`` after routed appends): recovery
  must read every link back from the channel, at the offset the leader gave it;
- between the WAL upload of a link and its check: the append is in doubt, and after the
  restart either absent or there for good, with its data.

The proxy trims its channel only after the leader committed everything (the route-epoch rule:
a committed epoch is reported after the upload): recovery then meets only links it skips.
Throughout, every acknowledged append reads back once, in order, with the bytes appended.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from automq_ref.formats.zone_router import LinkRecord
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.router_channel import (
    ChannelLinkResolver,
    RouterChannel,
    RouterChannelReader,
)
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.io.storage.wal_object import ObjectWalConfig
from automq_ref.state_machines import log_cache as lc
from tests.properties.test_s3stream import NAMESPACE, STREAMS, S3StorageOnObjectWalMachine
from tests.storage_fixtures import NODE_ID

PROXY = 9


class S3StorageWithLinksMachine(S3StorageOnObjectWalMachine):
    def __init__(self) -> None:
        super().__init__()
        self.channel_store = LocalDirectoryObjectStore(self.directory / "channel", fsync=False)
        self.channel: RouterChannel = self.run(
            RouterChannel.open(
                self.channel_store,
                namespace=NAMESPACE,
                node_id=PROXY,
                node_epoch=1,
                channel_id=0,
                route_epoch=0,
                config=ObjectWalConfig(batch_interval_ms=5, max_bytes_in_batch=2000),
            )
        )
        reader = RouterChannelReader({0: self.channel_store}, NAMESPACE)
        self.link_resolver = ChannelLinkResolver(reader)
        self.route_epoch = 0

    async def _start(self) -> None:
        await super()._start()
        assert self.storage is not None
        if self.storage.recovered.links and currently_in_test_context():
            event("recovery resolved link records through the channel")

    def _data(self, size: int) -> bytes:
        self.serial += 1
        return (self.serial.to_bytes(4, "big") * (size // 4 + 1))[:size]

    async def _route(self, stream_id: int, data: bytes) -> LinkRecord:
        """The proxy's half: the data into its channel; the link the leader will write."""
        _, offset = await self.channel.append(NODE_ID, stream_id, data)
        assert self.storage is not None
        base = self.storage.next_offset(stream_id, self.stream_epoch)
        return LinkRecord(base, 0, 0, 0, offset)

    @rule(
        stream_id=st.integers(min_value=0, max_value=STREAMS - 1),
        sizes=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=6),
    )
    def append_routed(self, stream_id: int, sizes: list[int]) -> None:
        assert self.storage is not None
        storage = self.storage

        async def append_all() -> None:
            for size in sizes:
                data = self._data(size)
                link = await self._route(stream_id, data)
                base = await storage.append(stream_id, self.stream_epoch, data, 1, link=link)
                assert base == link.last_offset
                self.acknowledged[stream_id].append((base, data))
                self.appended_since_upload = True

        self.run(append_all())

    @precondition(lambda self: self.storage is not None)
    @rule(stream_id=st.integers(min_value=0, max_value=STREAMS - 1))
    def crash_between_channel_and_wal_append(self, stream_id: int) -> None:
        """The data reached the channel, the leader died before its WAL append: nothing was
        acknowledged, and the orphan in the channel must not appear."""
        assert self.storage is not None and self.metadata_log is not None
        self.run(self._route(stream_id, self._data(100)))
        self.run(self._kill(self.storage))
        self.run(self.metadata_log.close())
        self.run(self._start())

    @precondition(lambda self: self.storage is not None)
    @rule(
        stream_id=st.integers(min_value=0, max_value=STREAMS - 1),
        size=st.integers(min_value=1, max_value=700),
    )
    def crash_between_link_upload_and_check(self, stream_id: int, size: int) -> None:
        """The WAL object holding a link lands, the leader dies before its reservation check:
        the append is in doubt until the restart, whose recovery resolves it if it replays it."""
        assert self.storage is not None and self.metadata_log is not None
        storage = self.storage
        data = self._data(size)
        link = self.run(self._route(stream_id, data))
        self.wal_store.crash_after_operations = 1
        with pytest.raises(StorageError):
            self.run(storage.append(stream_id, self.stream_epoch, data, 1, link=link))
        self.in_doubt.setdefault(stream_id, []).append(data)
        self.run(self._kill(storage))
        self.run(self.metadata_log.close())
        self.run(self._start())

    @precondition(lambda self: self.storage is not None)
    @rule()
    def commit_then_trim_channel(self) -> None:
        """The leader uploads and commits everything (it may then report the epoch committed);
        the controller bumps the epoch; the proxy trims what the committed epoch covers."""
        assert self.storage is not None
        self.run(self.storage.force_upload(lc.ALL_STREAMS))
        self.appended_since_upload = False
        self.route_epoch += 1
        self.channel.next_epoch(self.route_epoch)
        self.run(self.channel.trim(self.route_epoch - 1))

    def teardown(self) -> None:
        try:
            with contextlib.suppress(Exception):
                self.run(self.channel.close())
            with contextlib.suppress(Exception):
                self.run(self.channel_store.close())
        finally:
            super().teardown()


S3StorageWithLinksMachine.TestCase.settings = settings(
    S3StorageWithLinksMachine.TestCase.settings, max_examples=30, stateful_step_count=25
)
TestS3StorageWithLinksMachine = S3StorageWithLinksMachine.TestCase


def test_the_machine_routes_through_a_channel() -> None:
    """A smoke run outside hypothesis: routed appends survive a crash before their upload."""
    machine = S3StorageWithLinksMachine()
    try:
        machine.start()
        machine.append_routed(0, [10, 20, 30])
        machine.append(1, [5])
        machine.crash_and_restart(seed=1, settle=False)
        assert machine.storage is not None and machine.storage.recovered.links == 3
        machine.every_acknowledged_append_reads_back_once_in_order()
        machine.commit_then_trim_channel()
        machine.crash_between_channel_and_wal_append(1)
        machine.every_acknowledged_append_reads_back_once_in_order()
    finally:
        machine.teardown()
