"""A controller request whose answer is lost: the storage fails, and a new incarnation recovers.

The controller client sends a resendable request again after its answer was lost
(``tests/unit/test_cluster_metadata.py``); when even that does not settle it (no controller
answered in time), the request fails with its outcome unknown. Here a client in front of the
controller loses one answer, after the controller decided (or before it did): the storage fails
(``failed`` set, appends refused), and a new incarnation over the same WAL and metadata log (what
``node.serve`` starts after abandoning the failed one) recovers the WAL, closes the streams, and
every acknowledged record reads back exactly once. Last, ``node.serve`` itself: a broker whose
storage failed is abandoned and started again in its process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from automq_ref import node as node_module
from automq_ref.config import BrokerConfig, load_config
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore
from automq_ref.io.storage.s3stream import S3Storage, StorageError
from automq_ref.node import Node, Seams, serve, start_node
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from tests.storage_fixtures import RunningStorage, start_storage
from tests.unit.test_s3stream import WalMedium, payload

PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=1 << 20,
    upload_interval_ms=-1,
    stream_object_split_bytes=1 << 20,
    capacity_bytes=1 << 22,
)
RECORDS = 10


class LosingClient:
    """Passes requests through; once ``armed``, the next request of type ``lose`` gets no
    answer: decided first (``decided``) or not, it fails with its outcome unknown, as the
    cluster's client fails when no controller answered it again in time."""

    def __init__(self, inner: ControllerClient, lose: type, *, decided: bool) -> None:
        self._inner = inner
        self._lose = lose
        self._decided = decided
        self.armed = False
        self.lost: list[sm.StreamMetadataEvent] = []

    async def submit(self, event: sm.StreamMetadataEvent) -> sm.Response:
        if not (self.armed and isinstance(event, self._lose)):
            return await self._inner.submit(event)
        self.armed = False
        self.lost.append(event)
        if self._decided:
            await self._inner.submit(event)
        raise ControllerError(
            f"{type(event).__name__}: sent to controller 9, no answer (its outcome is unknown)"
        )


async def _start(
    tmp_path: Path, medium: WalMedium, node_epoch: int, client: list[LosingClient], lose: type
) -> RunningStorage:
    decided = "undecided" not in tmp_path.name

    def wrap(inner: ControllerClient) -> ControllerClient:
        client.append(LosingClient(inner, lose, decided=decided))
        return client[-1]

    return await start_storage(
        tmp_path,
        await medium.open(node_epoch),
        LocalDirectoryObjectStore(tmp_path / "objects"),
        params=PARAMS,
        node_epoch=node_epoch,
        wrap_client=wrap,
    )


async def _restart(running: RunningStorage) -> None:
    """What ``node.serve`` does with a failed incarnation: abandon it (nothing uploaded, the
    WAL left for the next start) and close its metadata."""
    assert running.storage.failed.is_set()
    await running.storage.abandon()
    await running.metadata_log.close()


async def _read_all(storage: S3Storage, stream_id: int) -> list[tuple[int, bytes]]:
    got = await storage.read(stream_id, 0, 10**6, 10**9)
    return [(batch.base_offset, bytes(batch.payload)) for batch in got]


@pytest.mark.parametrize("decided", ["decided", "undecided"])
@pytest.mark.parametrize("lose", [sm.CommitStreamSetObject, sm.PrepareObject])
async def test_an_upload_request_with_no_answer_restarts_the_storage_and_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory, lose: type, decided: str
) -> None:
    tmp_path = tmp_path_factory.mktemp(f"{lose.__name__}-{decided}")
    medium = WalMedium("block", tmp_path)
    clients: list[LosingClient] = []
    running = await _start(tmp_path, medium, 1, clients, lose)
    storage = running.storage
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    acknowledged = [
        (await storage.append(stream_id, 0, payload(stream_id, i), 1), payload(stream_id, i))
        for i in range(RECORDS)
    ]
    clients[0].armed = True
    with pytest.raises(StorageError, match="outcome is unknown"):
        await storage.force_upload(stream_id)
    assert clients[0].lost and storage.failed.is_set()
    with pytest.raises(StorageError, match="storage failed"):
        await storage.append(stream_id, 0, b"refused", 1)
    await _restart(running)

    running = await _start(tmp_path, medium, 2, clients, lose)
    storage = running.storage
    committed_before = lose is sm.CommitStreamSetObject and decided == "decided"
    # A commit decided before its answer was lost is in objects: recovery skips those records.
    assert storage.recovered.records == (0 if committed_before else RECORDS)
    # Recovery closed the stream: it reopens at a newer epoch with every offset.
    assert await storage.open_stream(stream_id, 1) == (0, RECORDS)
    assert await _read_all(storage, stream_id) == acknowledged
    image = running.view.image
    if lose is sm.PrepareObject and decided == "decided":
        # The lost answer's ids were never used: they stay prepared until they expire.
        prepared = [o for o in image.objects.values() if o.state is sm.S3ObjectState.PREPARED]
        assert len(prepared) == 1
    await storage.shutdown()
    await running.metadata_log.close()
    await running.store.close()
    await medium.close()


@pytest.mark.parametrize("decided", ["decided", "undecided"])
async def test_an_open_with_no_answer_restarts_the_storage_and_the_stream_opens_again(
    tmp_path_factory: pytest.TempPathFactory, decided: str
) -> None:
    """An open whose outcome is unknown may have left the stream open here: the storage fails,
    and the new incarnation closes what the old one held, so the stream opens again."""
    tmp_path = tmp_path_factory.mktemp(f"open-{decided}")
    medium = WalMedium("block", tmp_path)
    clients: list[LosingClient] = []
    running = await _start(tmp_path, medium, 1, clients, sm.OpenStream)
    storage = running.storage
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    acknowledged = [(await storage.append(stream_id, 0, b"first", 1), b"first")]
    await storage.close_stream(stream_id, 0)
    clients[0].armed = True
    with pytest.raises(ControllerError, match="outcome is unknown"):
        await storage.open_stream(stream_id, 1)
    assert storage.failed.is_set()
    state = running.view.image.streams[stream_id].state
    assert state is (sm.StreamState.OPENED if decided == "decided" else sm.StreamState.CLOSED)
    await _restart(running)

    running = await _start(tmp_path, medium, 2, clients, sm.OpenStream)
    storage = running.storage
    assert running.view.image.streams[stream_id].state is sm.StreamState.CLOSED
    assert await storage.open_stream(stream_id, 2) == (0, 1)
    assert await _read_all(storage, stream_id) == acknowledged
    await storage.shutdown()
    await running.metadata_log.close()
    await running.store.close()
    await medium.close()


async def test_a_close_answered_stream_fenced_is_a_close(tmp_path: Path) -> None:
    """A close decided, its answer lost, and the stream opened by a newer owner before the
    close is sent again: the repeat is refused ``STREAM_FENCED``, which the storage takes as
    closed (the newer owner holds it), as AutoMQ's client does."""
    medium = WalMedium("block", tmp_path)
    clients: list[LosingClient] = []
    running = await _start(tmp_path, medium, 1, clients, sm.CloseStream)
    storage = running.storage
    stream_id = await storage.create_stream()
    await storage.open_stream(stream_id, 0)
    await storage.append(stream_id, 0, b"first", 1)
    await storage.force_upload(stream_id)
    # The first close, decided; then another node opens the stream at a newer epoch.
    assert (await running.client.submit(sm.CloseStream(1, storage.node_epoch, stream_id, 0))).ok
    other = await running.client.submit(sm.RegisterNode(2, 1))
    assert other.node_epoch is not None
    assert (await running.client.submit(sm.OpenStream(2, other.node_epoch, stream_id, 1))).ok
    await storage.close_stream(stream_id, 0)
    assert not storage.failed.is_set()
    with pytest.raises(StorageError):
        storage.next_offset(stream_id, 0)
    await storage.shutdown()
    await running.metadata_log.close()
    await running.store.close()
    await medium.close()


async def test_serve_restarts_a_broker_whose_storage_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``node.serve`` abandons an incarnation whose storage failed and starts a new one in the
    same process, at a new node epoch, on the same port; SIGTERM then stops it gracefully."""
    caplog.set_level(logging.INFO, logger="automq_ref.node")
    started: list[Node] = []

    async def recording_start(config: BrokerConfig, seams: Seams) -> Node:
        started.append(await start_node(config, seams))
        return started[-1]

    monkeypatch.setattr(node_module, "start_node", recording_start)
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "listeners=PLAINTEXT://127.0.0.1:0",
        ],
        environment={},
    )
    serving = asyncio.ensure_future(serve(config, Seams()))
    loop = asyncio.get_running_loop()
    try:
        await _until(lambda: len(started) == 1 and started[0].storage is not None)
        first = started[0]
        await asyncio.sleep(0.2)  # serve waits on the storage by now
        first.storage._fail("a test", ControllerError("CommitStreamSetObject: outcome unknown"))
        await _until(lambda: len(started) == 2)
        second = started[1]
        assert second.session.node_epoch > first.session.node_epoch
        assert second.advertised_address[1] == first.advertised_address[1]
        assert "broker restarting: its storage failed" in caplog.text
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 30) == 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if not serving.done():
            serving.cancel()


async def _until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)
