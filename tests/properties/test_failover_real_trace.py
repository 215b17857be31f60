"""Trace validation of a real crash failover: what the shell did, recorded as it ran, is a
behaviour of specs/Failover.tla.

Three brokers in one process (an in-process controller on a file metadata log, object WALs and
objects in local directories, as tests/unit/test_crash_failover.py) run a crash failover with
recording on (docs/trace_validation.md, "Failover traces from real runs"): each broker's
controller client records the opens the controller granted, the failover round records the
session it saw lapse and the context it assigned and later forgot, broker 2's failover runner
records the steps its projection of the machine took (``FenceWal``, ``RecoverFailedWal``,
``CloseFailedStreams``), and the test, which crashes and restarts broker 1 and produces its
records, records ``Crash``, ``Restart``, ``RecoverOwnWal`` and each acknowledged record
(``AppendRecord``, ``AckAppend``). The per-process files are merged into one behaviour by
metadata log index, replayed through the machine, mapped by ``tla_state``, and validated by TLC
together with a corrupted copy (the streams closed before the WAL was recovered), which must be
rejected at the line that breaks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata import failover_trace as ft
from automq_ref.io.metadata.client import connect_in_process, register_node
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import FailoverSettings, run_failover_round
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage.failover_runner import FailoverRunner, FailoverTarget
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.wal_object import ObjectWal
from automq_ref.state_machines import failover as fo
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import FAILOVER_CONTEXTS_KEY
from tests.unit.test_crash_failover import (
    NS,
    PARAMS,
    SESSION_MS,
    WAL_CONFIG,
    Metadata,
    Stores,
    take_over_from,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

LATE = 10 * SESSION_MS  # the controller's clock once broker 1 missed its heartbeats


@contextlib.asynccontextmanager
async def in_process(root: Path) -> AsyncIterator[tuple[Metadata, Stores]]:
    """An in-process controller and the WAL and object directories of the brokers."""
    meta_log = await FileMetadataLog.open(root / "meta")
    controller = await Controller.open(meta_log)
    client, image_view = connect_in_process(controller)
    wal = LocalDirectoryObjectStore(root / "wal", fsync=False)
    data = LocalDirectoryObjectStore(root / "objects", fsync=False)
    try:
        yield Metadata(controller, client, image_view), Stores(wal, data, root / "wal")
    finally:
        await wal.close()
        await data.close()
        await meta_log.close()


class Recorded:
    """Three brokers with recording on (one trace file per process under ``directory``) and
    broker 2's failover runner (not started)."""

    def __init__(self, metadata: Metadata, stores: Stores, directory: Path) -> None:
        self.metadata = metadata
        self.stores = stores
        self.directory = directory
        self.test = self.trace("test")  # whoever crashes and restarts brokers
        self.controller = self.trace("controller")
        self.traces = {node_id: self.trace(f"node{node_id}") for node_id in (1, 2, 3)}
        self.clients = {n: ft.TracingClient(metadata.client, t) for n, t in self.traces.items()}
        self.brokers: dict[int, S3Storage] = {}
        self.streams: dict[int, int] = {}
        self.settings = FailoverSettings(grace_ms=0, wal_config=f"0@dir://{stores.wal_dir}")
        self.runner: FailoverRunner | None = None

    def trace(self, process: str) -> ft.FailoverTrace:
        opened = ft.open_trace(
            self.directory, process, lambda: self.metadata.controller.applied_index
        )
        assert opened is not None
        return opened

    async def start(self, node_id: int, proposed: int) -> S3Storage:
        client = self.clients[node_id]
        registration = await register_node(client, node_id, proposed)
        restarted = node_id in self.brokers
        if restarted:
            self.test.record(fo.Restart(node_id), committed=True)
        wal = await ObjectWal.open(
            self.stores.wal, namespace=NS, node_id=node_id,
            node_epoch=registration.node_epoch, config=WAL_CONFIG,
        )  # fmt: skip
        broker = await S3Storage.start(
            wal=wal,
            store=self.stores.data,
            client=client,
            view=self.metadata.view,
            registration=registration,
            namespace=NS,
            params=PARAMS,
            runs_lifecycle=lambda: False,
        )
        if restarted:
            closed = frozenset(s.stream_id for s in registration.opening_streams)
            self.test.record(fo.RecoverOwnWal(node_id), closed=closed)
        self.brokers[node_id] = broker
        return broker

    async def heartbeat(self, node_id: int, at_ms: int) -> None:
        broker = self.brokers[node_id]
        event = sm.BrokerHeartbeat(node_id, broker.node_epoch, at_ms, ())
        assert (await self.metadata.client.submit(event)).ok

    async def round(self, now_ms: int) -> None:
        image = self.metadata.controller.image
        await run_failover_round(
            self.metadata.client, image, now_ms, self.settings, self.controller
        )

    async def three_brokers_with_a_stream_each(self, acked: list[bytes]) -> None:
        """Broker 1's stream holds ``acked``, in its WAL only."""
        for node_id in (1, 2, 3):
            await self.start(node_id, 1_000 * node_id)
        self.runner = FailoverRunner(
            FailoverTarget(
                take_over_wal=take_over_from(self.stores),
                store=self.stores.data,
                client=self.clients[2],
                view=self.metadata.view,
                node_id=2,
                node_epoch=self.brokers[2].node_epoch,
                namespace=NS,
                params=PARAMS,
                clock=SystemClock(),
            ),
            retry_base_s=0.05,
            trace=self.traces[2],
        )
        for node_id, broker in self.brokers.items():
            await self.heartbeat(node_id, 0)
            self.streams[node_id] = await broker.create_stream()
            await broker.open_stream(self.streams[node_id], 0)
        for payload in acked:
            offset = await self.brokers[1].append(self.streams[1], 0, payload, 1)
            # The producer (this test) saw the acknowledgement.
            self.test.record_acknowledged(1, self.streams[1], offset)

    async def crash_and_assign(self) -> None:
        """Broker 1 is killed; its session lapses; the round assigns it to broker 2."""
        self.test.record(fo.Crash(1))  # kill -9: what it acknowledged lives in its WAL only
        await self.brokers[1].abandon()
        for node_id in (2, 3):
            await self.heartbeat(node_id, LATE)
        assert (await self.metadata.client.submit(sm.ExpireSessions(LATE))).ok
        await self.round(LATE)
        assert FAILOVER_CONTEXTS_KEY in self.metadata.controller.image.kv

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
        for node_id in (2, 3):
            await self.brokers[node_id].shutdown()


async def wait_for(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not reached in 20 s")


async def takeover(root: Path) -> Path:
    """Broker 1 crashes and is failed over to broker 2; broker 3 reopens its stream; broker 1
    restarts clean and gets its session back. The trace directory."""
    directory = root / "trace"
    async with in_process(root) as (metadata, stores):
        run = Recorded(metadata, stores, directory)
        acked = [b"r%d" % i for i in range(RECORDS)]
        try:
            await run.three_brokers_with_a_stream_each(acked)
            assert run.runner is not None
            run.runner.start()
            await run.crash_and_assign()
            runner = run.runner
            await wait_for(lambda: bool(runner.completed))
            assert [r.records for _, r in runner.completed] == [len(acked)]
            await run.round(LATE)
            assert FAILOVER_CONTEXTS_KEY not in metadata.controller.image.kv
            # Broker 1's stream reopens on broker 3 with every acknowledged record.
            assert await run.brokers[3].open_stream(run.streams[1], 1) == (0, len(acked))
            # Broker 1 restarts: its WAL was taken over and reset, nothing to recover.
            restarted = await run.start(1, LATE + 1_000)
            assert restarted.recovered.records == 0
            await run.heartbeat(1, LATE + 1)
            await run.round(LATE + 1)
            await restarted.shutdown()
        finally:
            await run.close()
    return directory


async def restart_first(root: Path) -> Path:
    """Broker 1 crashes and is assigned to broker 2, but restarts before broker 2's runner
    starts: it recovers its WAL itself, broker 2's task is aborted, the round forgets the
    context, broker 3 reopens the stream. The trace directory."""
    directory = root / "trace"
    async with in_process(root) as (metadata, stores):
        run = Recorded(metadata, stores, directory)
        acked = [b"s%d" % i for i in range(RECORDS - 2)]
        try:
            await run.three_brokers_with_a_stream_each(acked)
            await run.crash_and_assign()
            restarted = await run.start(1, LATE + 1_000)
            assert restarted.recovered.records == len(acked)
            assert run.runner is not None
            run.runner.start()
            trace_file = run.traces[2].path
            await wait_for(
                lambda: trace_file.exists() and "AbortFailover" in trace_file.read_text()
            )
            await run.heartbeat(1, LATE + 1)
            await run.round(LATE + 1)
            assert FAILOVER_CONTEXTS_KEY not in metadata.controller.image.kv
            assert await run.brokers[3].open_stream(run.streams[1], 1) == (0, len(acked))
            await restarted.shutdown()
        finally:
            await run.close()
    return directory


RECORDS = 6  # acknowledged by broker 1 before its crash, in its WAL only
OPENED_AND_ACKED = ["OpenStream"] * 3 + ["AppendRecord", "AckAppend"] * RECORDS

TAKEOVER = [
    *OPENED_AND_ACKED,
    "Crash",
    "ExpireSession",
    "AssignFailover",
    "FenceWal",
    "RecoverFailedWal",
    "CloseFailedStreams",
    "ClearFailover",
    "OpenStream",
    "Restart",
    "RecoverOwnWal",
    "Heartbeat",
]

RESTART_FIRST = [
    *OPENED_AND_ACKED[: -2 * 2],
    "Crash",
    "ExpireSession",
    "AssignFailover",
    "Restart",
    # Both local steps after the restarted broker's last close: concurrent, merged in process
    # order (node2 before test); they commute in the spec.
    "AbortFailover",
    "RecoverOwnWal",
    "Heartbeat",
    "ClearFailover",
    "OpenStream",
]


def swapped(lines: list[tv.TraceLine], first: int) -> list[tv.TraceLine]:
    """The trace with lines ``first`` and ``first + 1`` (1-based) in the other order."""
    broken = list(lines)
    broken[first - 1], broken[first] = lines[first], lines[first - 1]
    return broken


def merged(directory: Path, expected: list[str]) -> ft.Replayed:
    steps = ft.merge(ft.read_steps(directory))
    events = ft.events_of(steps)
    assert [type(event).__name__ for event in events] == expected, steps
    replayed = ft.replay(events)
    assert ft.effect_mismatches(steps, replayed) == []
    return replayed


async def test_recorded_crash_failovers_are_behaviours_of_the_spec(tmp_path: Path) -> None:
    directory = await takeover(tmp_path / "takeover")
    replayed = merged(directory, TAKEOVER)
    # The one refusal: the round forgets the context the machine dropped when the target
    # closed the streams (the spec's CloseFailedStreams removes it at once): a stutter.
    assert [(type(e).__name__, error) for _, e, error in replayed.refused] == [
        ("ClearFailover", fo.FailoverError.NO_FAILOVER_TASK)
    ]
    final = replayed.states[-1]
    # Every record broker 1 acknowledged was uploaded by the takeover.
    assert final.completed == frozenset({fo.Completion(1, 0, True)})
    assert final.committed == frozenset(range(1, RECORDS + 1)) == final.acked_records()
    assert final.nodes[1].phase is fo.Phase.SERVING and final.nodes[1].node_epoch == 1

    aborted = merged(await restart_first(tmp_path / "restart"), RESTART_FIRST)
    assert aborted.refused == ()
    assert aborted.states[-1].completed == frozenset()
    assert aborted.states[-1].committed == frozenset(range(1, RECORDS - 1))  # by broker 1 itself
    assert all(node.task is None for node in aborted.states[-1].nodes.values())

    lines = [tv.TraceLine(action, state) for action, state in ft.tla_lines(replayed)]
    # The command line writes the same trace, for specs/trace_validate.py.
    assert ft.main([str(directory), str(tmp_path / "takeover.ndjson")]) == 0
    assert tv.read_ndjson(tmp_path / "takeover.ndjson") == lines
    restart_lines = [tv.TraceLine(action, state) for action, state in ft.tla_lines(aborted)]
    recover = 1 + TAKEOVER.index("RecoverFailedWal") + 1  # 1-based, after the Init line
    broken = swapped(lines, recover)  # CloseFailedStreams before RecoverFailedWal
    verdicts = tv.validate_many([lines, restart_lines, broken], "Failover")
    for trace, verdict in zip((lines, restart_lines), verdicts, strict=False):
        assert verdict.accepted, f"{verdict}\n{verdict.log_tail}"
        assert verdict.matched == len(trace)
    broken_verdict = verdicts[2]
    assert not broken_verdict.accepted, broken_verdict
    assert broken_verdict.matched == recover - 1, broken_verdict
