"""Cold reads in a child process: the read path from objects outside the broker's interpreter.

Each test writes a stream through S3Storage into local objects, then reads it through a
:class:`ColdReadProcess` over the same storage's metadata view: the child knows only what the
deltas of the read image told it, and its GETs ask the broker's limiter first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from automq_ref.io.network_limiter import NetworkBandwidthLimiter
from automq_ref.io.storage.cold_read_process import (
    CHILD_MODULE,
    ColdReadProcess,
    ColdReadSettings,
    ColdReadsFailed,
    InChildProcess,
    Kind,
    read_frame,
)
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, NotFound
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import network_limiter as nl
from tests.storage_fixtures import RunningStorage, start_storage
from tests.unit.test_s3stream import PARAMS, WalMedium, payload
from tests.waiting import PATIENCE_S, wait_until_async

NAMESPACE = "_kafka_test"
RECORDS = 120


@dataclass
class Written:
    running: RunningStorage
    storage: S3Storage
    stream_id: int
    payloads: list[bytes]
    objects: Path


async def append(storage: S3Storage, stream_id: int, payloads: list[bytes], first: int) -> None:
    for offset in range(first, first + len(payloads)):
        await storage.append(stream_id, 0, payloads[offset - first], 1)


@pytest.fixture
async def written(tmp_path: Path) -> AsyncIterator[Written]:
    """A stream of ``RECORDS`` records, all uploaded, in a storage left running."""
    medium = WalMedium("block", tmp_path)
    objects = tmp_path / "objects"
    running = await start_storage(
        tmp_path,
        await medium.open(1),
        LocalDirectoryObjectStore(objects, fsync=False),
        params=PARAMS,
    )
    storage = running.storage
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    payloads = [payload(stream_id, offset) for offset in range(RECORDS)]
    await append(storage, stream_id, payloads, 0)
    await storage.force_upload(lc.ALL_STREAMS)
    try:
        yield Written(running, storage, stream_id, payloads, objects)
    finally:
        await running.stop()
        await medium.close()


def cold_process(
    written: Written, limiter: NetworkBandwidthLimiter | None = None
) -> ColdReadProcess:
    settings = ColdReadSettings(written.objects.as_uri(), NAMESPACE, 1 << 20, name="cold-test")
    return ColdReadProcess(settings, lambda: written.running.view.image, limiter)


async def read_all(cold: ColdReadProcess, stream_id: int, start: int, end: int) -> list[bytes]:
    got: list[bytes] = []
    while start + len(got) < end:
        found = await cold.read(stream_id, start + len(got), end, 900)
        assert found, start + len(got)
        got.extend(bytes(batch.payload) for batch in found)
    return got


def pid_of(cold: ColdReadProcess) -> int:
    assert cold.pid is not None
    return cold.pid


def exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie until reaped: the parent's asyncio child watcher reaps it.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1].startswith("Z")


async def test_reads_in_the_child_return_what_was_written(written: Written) -> None:
    cold = cold_process(written)
    try:
        assert cold.pid is None  # started by the first read, not before
        got = await read_all(cold, written.stream_id, 0, RECORDS)
        assert got == written.payloads
        assert cold.starts == 1
        stats = cold.stats()
        assert stats.readers == 1  # the sequential reader, kept for the next read
        assert stats.gets > 0 and stats.fetched_bytes > 0
        gets, get_bytes = cold.counts.take()
        assert gets > 0 and get_bytes >= sum(len(data) for data in written.payloads)
        assert cold.counts.take() == (0, 0)
        # From the middle, as a consumer that seeks.
        assert await read_all(cold, written.stream_id, 70, RECORDS) == written.payloads[70:]
    finally:
        await cold.close()


async def test_an_answer_larger_than_a_frame_comes_in_parts(written: Written) -> None:
    settings = ColdReadSettings(written.objects.as_uri(), NAMESPACE, 1 << 20, answer_part_bytes=500)
    cold = ColdReadProcess(settings, lambda: written.running.view.image)
    try:
        found = await cold.read(written.stream_id, 0, RECORDS, 1 << 20)
        assert [bytes(batch.payload) for batch in found] == written.payloads
        assert [batch.base_offset for batch in found] == list(range(RECORDS))
    finally:
        await cold.close()


async def test_objects_committed_after_the_child_started_reach_it(written: Written) -> None:
    cold = cold_process(written)
    try:
        assert await read_all(cold, written.stream_id, 0, RECORDS) == written.payloads
        more = [payload(written.stream_id, offset) for offset in range(RECORDS, 2 * RECORDS)]
        await append(written.storage, written.stream_id, more, RECORDS)
        await written.storage.force_upload(lc.ALL_STREAMS)
        got = await read_all(cold, written.stream_id, RECORDS, 2 * RECORDS)
        assert got == more
        assert cold.starts == 1
    finally:
        await cold.close()


async def test_an_object_gone_fails_the_read_as_not_found(written: Written) -> None:
    cold = cold_process(written)
    try:
        await cold.read(written.stream_id, 0, 1, 1)  # the child runs
        for path in written.objects.rglob("*"):
            if path.is_file():
                path.unlink()
        with pytest.raises(NotFound):
            await read_all(cold, written.stream_id, 60, RECORDS)
    finally:
        await cold.close()


async def test_a_child_killed_fails_the_reads_it_held(written: Written) -> None:
    cold = cold_process(written)
    try:
        await cold.read(written.stream_id, 0, 1, 1)
        pid = pid_of(cold)
        os.kill(pid, signal.SIGSTOP)  # the next read stays unanswered
        reading = asyncio.ensure_future(cold.read(written.stream_id, 1, RECORDS, 900))
        await asyncio.sleep(0.1)
        assert not reading.done()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ColdReadsFailed):
            await asyncio.wait_for(reading, PATIENCE_S)
    finally:
        await cold.close()


async def test_after_a_crash_the_next_read_starts_a_new_child(written: Written) -> None:
    cold = cold_process(written)
    try:
        assert await read_all(cold, written.stream_id, 0, 10) == written.payloads[:10]
        first = pid_of(cold)
        os.kill(first, signal.SIGKILL)
        await wait_until_async(lambda: cold.pid is None, "the broker sees its child gone")
        # The new child is sent the whole read image again, and reads from anywhere.
        assert await read_all(cold, written.stream_id, 10, RECORDS) == written.payloads[10:]
        assert cold.starts == 2 and pid_of(cold) != first
    finally:
        await cold.close()


async def test_the_childs_gets_take_their_bytes_from_the_brokers_limiter(
    written: Written,
) -> None:
    limiter = NetworkBandwidthLimiter(nl.LimiterParams.for_bandwidth(1 << 30, 1 << 30))
    cold = cold_process(written, limiter)
    try:
        assert await read_all(cold, written.stream_id, 0, RECORDS) == written.payloads
        granted = sum(limiter.granted_bytes.values())
        _, get_bytes = cold.counts.take()
        assert granted >= sum(len(data) for data in written.payloads)
        assert granted <= get_bytes  # the index reads are not throttled, the blocks are
    finally:
        await cold.close()
        limiter.close()


async def test_close_ends_the_child_and_refuses_later_reads(written: Written) -> None:
    cold = cold_process(written)
    await cold.read(written.stream_id, 0, 1, 1)
    pid = pid_of(cold)
    await cold.close()
    await cold.close()  # again: nothing more to do
    assert exited(pid)
    with pytest.raises(ColdReadsFailed):
        await cold.read(written.stream_id, 0, 1, 1)


async def test_the_child_exits_when_the_broker_side_of_the_connection_goes(
    written: Written,
) -> None:
    """As when the broker is killed outright: its end of the socket pair closes."""
    ours, theirs = socket.socketpair()
    settings = ColdReadSettings(written.objects.as_uri(), NAMESPACE, 1 << 20, limited=False)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        CHILD_MODULE,
        str(theirs.fileno()),
        settings.to_json(),
        pass_fds=(theirs.fileno(),),
    )
    theirs.close()
    try:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        kind, _, _ = await asyncio.wait_for(read_frame(reader), PATIENCE_S)
        assert kind is Kind.READY
        writer.close()
        assert await asyncio.wait_for(child.wait(), PATIENCE_S) == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_a_storage_in_child_process_mode_reads_and_its_shutdown_ends_the_child(
    tmp_path: Path,
) -> None:
    medium = WalMedium("block", tmp_path)
    objects = tmp_path / "objects"
    running = await start_storage(
        tmp_path, await medium.open(1), LocalDirectoryObjectStore(objects), params=PARAMS
    )
    stream_id = await running.storage.create_stream()
    await running.storage.open_stream(stream_id, 0)
    payloads = [payload(stream_id, offset) for offset in range(RECORDS)]
    await append(running.storage, stream_id, payloads, 0)
    await running.storage.close_stream(stream_id, 0)
    await running.stop()  # everything uploaded: the next storage reads objects only
    running = await start_storage(
        tmp_path,
        await medium.open(2),
        LocalDirectoryObjectStore(objects),
        params=PARAMS,
        node_epoch=2,
        cold_reads=InChildProcess(objects.as_uri(), "cold-test", niceness=5),
    )
    storage = running.storage
    children: list[int] = []
    try:
        await storage.open_stream(stream_id, 1)
        first = await storage.read(stream_id, 0, 1, 1)  # the first read starts the child
        # It lowers its priority first thing.
        base = os.getpriority(os.PRIO_PROCESS, 0)
        await wait_until_async(
            lambda: any(_priority(pid) >= base + 5 for pid in _children(os.getpid())),
            "a child five nicer than the broker",
        )
        children = _children(os.getpid())
        got = [bytes(batch.payload) for batch in first]
        while len(got) < RECORDS:
            found = await storage.read(stream_id, len(got), RECORDS, 900)
            assert found
            got.extend(bytes(batch.payload) for batch in found)
        assert got == payloads
        assert storage.block_cache_stats().readers == 1
        gets, _ = storage.reads.take()
        assert gets > 0
    finally:
        await running.stop()
        await medium.close()
    await wait_until_async(lambda: all(exited(pid) for pid in children), "the child exits")


def _priority(pid: int) -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except ProcessLookupError:
        return -100


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the children a test's other storages left are
    gone or zombies)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(child) for child in (task / "children").read_text().split())
    return [child for child in found if not exited(child)]


def test_reads_in_the_child_on_the_brokers_event_loop(tmp_path: Path) -> None:
    """``automq-ref serve`` runs on uvloop, whose transports are not asyncio's classes."""
    import uvloop

    async def body() -> None:
        medium = WalMedium("block", tmp_path)
        objects = tmp_path / "objects"
        running = await start_storage(
            tmp_path, await medium.open(1), LocalDirectoryObjectStore(objects), params=PARAMS
        )
        try:
            stream_id = await running.storage.create_stream()
            await running.storage.open_stream(stream_id, 0)
            payloads = [payload(stream_id, offset) for offset in range(RECORDS)]
            await append(running.storage, stream_id, payloads, 0)
            await running.storage.force_upload(lc.ALL_STREAMS)
            written = Written(running, running.storage, stream_id, payloads, objects)
            cold = cold_process(written)
            try:
                assert await read_all(cold, stream_id, 0, RECORDS) == payloads
            finally:
                await cold.close()
        finally:
            await running.stop()
            await medium.close()

    uvloop.run(body())
