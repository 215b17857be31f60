"""Trace validation of a real crash failover: what the shell did, recorded as it ran, is a
behaviour of specs/Failover.tla.

Three brokers in one process (an in-process controller on a file metadata log, object WALs and
objects in local directories, as tests/unit/test_crash_failover.py) run a crash failover with
recording on (docs/trace_validation.md, "Failover traces from real runs"): each broker's
controller client records the opens the controller granted, the failover round records the
session it saw lapse and the context it assigned and later forgot, broker 2's failover runner
records the steps its projection of the machine took (``FenceWal``, ``RecoverFailedWal``,
``CloseFailedStreams``), and the test, which crashes and restarts broker 1, records ``Crash``,
``Restart`` and ``RecoverOwnWal``. The per-process files are merged into one behaviour by
metadata log index, replayed through the machine, mapped by ``tla_state``, and validated by TLC
together with a corrupted copy (the streams closed before the WAL was recovered), which must be
rejected at the line that breaks it.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from automq_ref.io.clock import SystemClock
from automq_ref.io.metadata import failover_trace as ft
from automq_ref.io.metadata.client import ControllerClient, connect_in_process, register_node
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.failover_contexts import FailoverSettings, run_failover_round
from automq_ref.io.metadata.metadata_log import FileMetadataLog
from automq_ref.io.storage.failover_runner import FailoverRunner
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


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Metadata, Stores]]:
    """The in-process controller and the WAL and object directories of the brokers."""
    meta_log = await FileMetadataLog.open(tmp_path / "meta")
    controller = await Controller.open(meta_log)
    client, image_view = connect_in_process(controller)
    wal = LocalDirectoryObjectStore(tmp_path / "wal", fsync=False)
    data = LocalDirectoryObjectStore(tmp_path / "objects", fsync=False)
    yield Metadata(controller, client, image_view), Stores(wal, data, tmp_path / "wal")
    await wal.close()
    await data.close()
    await meta_log.close()


async def start_broker(
    metadata: Metadata, stores: Stores, node_id: int, proposed: int, client: ControllerClient
) -> S3Storage:
    registration = await register_node(client, node_id, proposed)
    wal = await ObjectWal.open(
        stores.wal, namespace=NS, node_id=node_id, node_epoch=registration.node_epoch,
        config=WAL_CONFIG,
    )  # fmt: skip
    return await S3Storage.start(
        wal=wal,
        store=stores.data,
        client=client,
        view=metadata.view,
        registration=registration,
        namespace=NS,
        params=PARAMS,
        runs_lifecycle=lambda: False,
    )


async def heartbeat(metadata: Metadata, storage: S3Storage, at_ms: int) -> None:
    event = sm.BrokerHeartbeat(storage.node_id, storage.node_epoch, at_ms, ())
    assert (await metadata.client.submit(event)).ok


async def run_crash_failover(metadata: Metadata, stores: Stores, directory: Path) -> None:
    """The run, recorded under ``directory``."""

    def index() -> int:
        return metadata.controller.applied_index

    def trace(process: str) -> ft.FailoverTrace:
        opened = ft.open_trace(directory, process, index)
        assert opened is not None
        return opened

    test, controller = trace("test"), trace("controller")
    traces = {node_id: trace(f"node{node_id}") for node_id in (1, 2, 3)}
    clients = {n: ft.TracingClient(metadata.client, t) for n, t in traces.items()}
    brokers = {n: await start_broker(metadata, stores, n, 1_000 * n, clients[n]) for n in traces}
    settings = FailoverSettings(grace_ms=0, wal_config=f"0@dir://{stores.wal_dir}")
    runner = FailoverRunner(
        take_over_wal=take_over_from(stores),
        store=stores.data,
        client=clients[2],
        view=metadata.view,
        node_id=2,
        node_epoch=brokers[2].node_epoch,
        namespace=NS,
        params=PARAMS,
        clock=SystemClock(),
        retry_base_s=0.05,
        trace=traces[2],
    )
    runner.start()
    try:
        for broker in brokers.values():
            await heartbeat(metadata, broker, 0)
        streams = {}
        for node_id, broker in brokers.items():
            streams[node_id] = await broker.create_stream()
            await broker.open_stream(streams[node_id], 0)
        acked = [b"r%d" % i for i in range(20)]
        for payload in acked:
            await brokers[1].append(streams[1], 0, payload, 1)

        test.record(fo.Crash(1))  # kill -9: what it acknowledged lives in its WAL only
        await brokers[1].abandon()
        for node_id in (2, 3):
            await heartbeat(metadata, brokers[node_id], LATE)
        assert (await metadata.client.submit(sm.ExpireSessions(LATE))).ok
        await run_failover_round(
            metadata.client, metadata.controller.image, LATE, settings, controller
        )
        for _ in range(400):
            if runner.completed:
                break
            await asyncio.sleep(0.05)
        assert [r.records for _, r in runner.completed] == [len(acked)]
        await run_failover_round(
            metadata.client, metadata.controller.image, LATE, settings, controller
        )
        assert FAILOVER_CONTEXTS_KEY not in metadata.controller.image.kv

        # Broker 1's partition reopens on broker 3 with every acknowledged record.
        assert await brokers[3].open_stream(streams[1], 1) == (0, len(acked))

        # Broker 1 restarts: a new epoch, its WAL taken over and reset, nothing to recover.
        registration = await register_node(clients[1], 1, LATE + 1_000)
        test.record(fo.Restart(1), committed=True)
        wal = await ObjectWal.open(
            stores.wal, namespace=NS, node_id=1, node_epoch=registration.node_epoch,
            config=WAL_CONFIG,
        )  # fmt: skip
        restarted = await S3Storage.start(
            wal=wal,
            store=stores.data,
            client=clients[1],
            view=metadata.view,
            registration=registration,
            namespace=NS,
            params=PARAMS,
            runs_lifecycle=lambda: False,
        )
        assert restarted.recovered.records == 0
        test.record(fo.RecoverOwnWal(1))
        await heartbeat(metadata, restarted, LATE + 1)
        await run_failover_round(
            metadata.client, metadata.controller.image, LATE + 1, settings, controller
        )
        await restarted.shutdown()
    finally:
        await runner.close()
        for node_id in (2, 3):
            await brokers[node_id].shutdown()


EXPECTED = [
    "OpenStream",
    "OpenStream",
    "OpenStream",
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


def swapped(lines: list[tv.TraceLine], first: int) -> list[tv.TraceLine]:
    """The trace with lines ``first`` and ``first + 1`` (1-based) in the other order."""
    broken = list(lines)
    broken[first - 1], broken[first] = lines[first], lines[first - 1]
    return broken


async def test_a_recorded_crash_failover_is_a_behaviour_of_the_spec(
    cluster: tuple[Metadata, Stores], tmp_path: Path
) -> None:
    metadata, stores = cluster
    directory = tmp_path / "trace"
    await run_crash_failover(metadata, stores, directory)

    steps = ft.merge(ft.read_steps(directory))
    events = [step.event for step in steps]
    assert [type(event).__name__ for event in events] == EXPECTED, steps
    replayed = ft.replay(events)
    # The one refusal: the round forgets the context the machine dropped when the target
    # closed the streams (the spec's CloseFailedStreams removes it at once): a stutter.
    assert [(type(e).__name__, error) for _, e, error in replayed.refused] == [
        ("ClearFailover", fo.FailoverError.NO_FAILOVER_TASK)
    ]
    final = replayed.states[-1]
    assert final.completed == frozenset({fo.Completion(1, 0, False)})
    assert final.nodes[1].phase is fo.Phase.SERVING and final.nodes[1].node_epoch == 1

    lines = [tv.TraceLine(action, state) for action, state in ft.tla_lines(replayed)]
    recover = 1 + EXPECTED.index("RecoverFailedWal") + 1  # 1-based, after the Init line
    broken = swapped(lines, recover)  # CloseFailedStreams before RecoverFailedWal
    good_verdict, broken_verdict = tv.validate_many([lines, broken], "Failover")
    assert good_verdict.accepted, f"{good_verdict}\n{good_verdict.log_tail}"
    assert good_verdict.matched == len(lines)
    assert not broken_verdict.accepted, broken_verdict
    assert broken_verdict.matched == recover - 1, broken_verdict
