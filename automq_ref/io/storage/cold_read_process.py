"""Cold reads in a process of their own: the read path from objects outside the broker's
interpreter.

On a second thread (:mod:`automq_ref.io.storage.cold_reads`) a catch-up's reads still share the
broker's interpreter lock with the event loop and the WAL's I/O thread: measured in a
1,000-partition catch-up, a produce's WAL write and sync waited for the lock the cold-read
thread held (docs/benchmarks.md, "The interpreter lock"). Here the whole read path (a store of
its own, the index and block caches, the stream readers) runs in a child process
(:mod:`automq_ref.io.storage.cold_read_child`), started at the first read that misses the
LogCache; the broker sends it reads and gets back the batches' bytes.

What the child knows of the metadata it learns from the broker, on the same connection as the
reads and before them: the changes of the read image since the last read
(:mod:`automq_ref.io.storage.read_image`), so a read is served from the image the broker read
it under, or a newer one. A read that hits an object a compaction deleted fails as it would in
the broker (``NotFound``, ``StreamReadError``) and the broker's retry sends it again with the
image of that moment. The child's GETs take their bytes from the broker's inbound bandwidth
limiter: before each GET it asks the broker (``TOKENS``) and waits for the grant, so the
limiter's one bucket still shapes everything the broker reads.

The connection is a socket pair; each frame is a header (body length, kind, request id) and a
body. A child that exits (a crash, a kill) fails the reads it held with
:class:`ColdReadsFailed`, which the storage answers as a storage error; the next read starts a
new child (at most one start per ``RESTART_BACKOFF_S``) and sends it the whole read image again.
The child exits when the broker closes the connection, so a broker killed outright leaves no
child behind. Stats (the block cache's bytes, readers, GETs) come with every answer and once a
second while the child reads ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import itertools
import json
import logging
import pickle
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from automq_ref.formats.stream_record_batch import StreamRecordBatch, iter_stream_record_batches
from automq_ref.io.network_limiter import LimiterClosed, NetworkBandwidthLimiter
from automq_ref.io.storage.block_cache import BlockCacheStats
from automq_ref.io.storage.object_store import NotFound, ObjectStoreError
from automq_ref.io.storage.read_image import ReadImageSender
from automq_ref.io.storage.shaped_store import RequestShaping
from automq_ref.io.storage.stream_objects import StreamReadError
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines.network_limiter import Priority

log = logging.getLogger(__name__)

CHILD_MODULE: Final = "automq_ref.io.storage.cold_read_child"
RESTART_BACKOFF_S: Final = 1.0
CLOSE_TIMEOUT_S: Final = 5.0
START_TIMEOUT_S: Final = 60.0  # from the spawn to READY: the interpreter, imports, the store
SOCKET_BUFFER_BYTES: Final = 4 * 1024 * 1024
# An answer's batches go in frames of about this size (BATCHES_PART, then BATCHES): the broker
# allocates each frame's buffer at once, and a buffer of a whole Fetch's budget (50 MiB) took
# the broker's loop tens of milliseconds to allocate and zero, in which no produce was answered.
ANSWER_PART_BYTES: Final = 1024 * 1024

FRAME: Final = struct.Struct(">IBQ")  # body length, kind, request id
READ_REQUEST: Final = struct.Struct(">qqqq")  # stream id, start, end, max bytes
TOKENS_REQUEST: Final = struct.Struct(">qB")  # bytes, priority
STATS: Final = struct.Struct(">11q")  # BlockCacheStats, then the store's GETs and bytes
NO_REQUEST: Final = 0


class Kind(enum.IntEnum):
    """A frame's kind; the direction is in the comment."""

    READY = 1  # child -> broker: the store is open
    START_FAILED = 2  # child -> broker: the store did not open (message)
    IMAGE = 3  # broker -> child: a ReadImageDelta (pickled)
    READ = 4  # broker -> child: READ_REQUEST
    CANCEL = 5  # broker -> child: the read of this id is no longer wanted
    BATCHES = 6  # child -> broker: STATS, then the batches encoded back to back
    ERROR = 7  # child -> broker: STATS, the ReadFailure, then the message
    TOKENS = 8  # child -> broker: TOKENS_REQUEST, before a GET
    GRANTED = 9  # broker -> child: the tokens of this id are granted
    REFUSED = 10  # broker -> child: they never will be (the limiter closed; message)
    STATS = 11  # child -> broker: STATS
    CLOSE = 12  # broker -> child: close the read path and exit
    BATCHES_PART = 13  # child -> broker: batches of an answer that goes on (no STATS)


class ReadFailure(enum.IntEnum):
    """How a read failed in the child, so the broker raises what the read path would."""

    NOT_FOUND = 1  # the message is the key
    STREAM_READ = 2
    OBJECT_STORE = 3
    OTHER = 4


class ColdReadsFailed(Exception):
    """The cold-read process could not serve a read: it is not running, exited or was closed."""


@dataclass(frozen=True, slots=True)
class ColdReadSettings:
    """What the child needs to build the read path: the store, the namespace of its keys, the
    block cache's size, the request shaping, whether GETs ask the broker's limiter first."""

    store_uri: str
    namespace: str
    block_cache_bytes: int
    shaping: RequestShaping = dataclasses.field(default_factory=RequestShaping)
    limited: bool = True
    name: str = "cold-reads"
    niceness: int = 0
    answer_part_bytes: int = ANSWER_PART_BYTES

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ColdReadSettings:
        raw: dict[str, Any] = json.loads(text)
        raw["shaping"] = RequestShaping(**raw["shaping"])
        return cls(**raw)


@dataclass(frozen=True, slots=True)
class InChildProcess:
    """Where a storage's read path from objects runs: a child process over ``store_uri``, named
    ``name`` in its log lines."""

    store_uri: str
    name: str = "cold-reads"
    niceness: int = 0


def frame(kind: Kind, request_id: int, body_length: int) -> bytes:
    return FRAME.pack(body_length, kind, request_id)


async def read_frame(reader: asyncio.StreamReader) -> tuple[Kind, int, bytes]:
    """The next frame; ``asyncio.IncompleteReadError`` at the end of the connection."""
    length, kind, request_id = FRAME.unpack(await reader.readexactly(FRAME.size))
    body = await reader.readexactly(length) if length else b""
    return Kind(kind), request_id, body


def tune(sock: socket.socket) -> None:
    """Large socket buffers: an answer is up to a Fetch's partition budget."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


class ReportedReads:
    """The GETs and bytes the child's store returned since the last :meth:`take` (the
    ``CountingReads`` of the in-process read path, from the totals the child reports)."""

    def __init__(self) -> None:
        self.gets = 0
        self.get_bytes = 0
        self._seen = (0, 0)

    def take(self) -> tuple[int, int]:
        taken = (self.gets, self.get_bytes)
        self.gets = self.get_bytes = 0
        return taken

    def report(self, total_gets: int, total_bytes: int) -> None:
        """The child's totals since it started (:meth:`restarted` when a new one starts)."""
        gets, get_bytes = self._seen
        self.gets += total_gets - gets
        self.get_bytes += total_bytes - get_bytes
        self._seen = (total_gets, total_bytes)

    def restarted(self) -> None:
        self._seen = (0, 0)


class FrameReceiver(asyncio.BufferedProtocol):
    """The broker's end of the connection: each frame's body read by the kernel straight into
    a buffer of its own (no stream buffer to grow, join and shift), handed to ``on_frame``
    whole, as a ``memoryview`` the batches then slice."""

    def __init__(self, on_frame: Callable[[Kind, int, memoryview], None]) -> None:
        self._on_frame = on_frame
        self._header = memoryview(bytearray(FRAME.size))
        self._target = self._header
        self._filled = 0
        self._frame: tuple[int, int] | None = None  # kind, request id: a body is being read
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._target):
            return
        if self._frame is None:
            length, kind, request_id = FRAME.unpack(self._header)
            self._frame = (kind, request_id)
            if length:
                self._target, self._filled = memoryview(bytearray(length)), 0
                return
            body = memoryview(b"")
        else:
            body = self._target
        (kind, request_id), self._frame = self._frame, None
        self._target, self._filled = self._header, 0
        try:
            known = Kind(kind)
        except ValueError:
            log.error("cold-read process sent a frame of unknown kind %d; closing", kind)
            if self.transport is not None:
                self.transport.abort()
            return
        self._on_frame(known, request_id, body)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class _Child:
    """One running child: its process, the connection and the reads it holds."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.receiver: FrameReceiver | None = None
        self.ready: asyncio.Future[tuple[Kind, bytes]] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, asyncio.Future[list[StreamRecordBatch]]] = {}
        self.parts: dict[int, list[StreamRecordBatch]] = {}  # of answers still coming
        self.grants: set[asyncio.Task[None]] = set()
        self.watching: asyncio.Task[None] | None = None
        self.exited = False

    def send(self, *chunks: bytes) -> None:
        """Queue ``chunks`` on the connection (dropped once it is closing)."""
        transport = None if self.receiver is None else self.receiver.transport
        if transport is not None and not transport.is_closing():
            transport.writelines(chunks)

    def close_connection(self) -> None:
        transport = None if self.receiver is None else self.receiver.transport
        if transport is not None:
            transport.close()


class ColdReadProcess:
    """The broker's side of cold reads in a child process (module docstring): ``read`` as
    :class:`~automq_ref.io.storage.cold_reads.ObjectReads` does, ``stats`` and ``counts`` from
    the child's reports, ``close`` ends the child. Used from the broker's event loop only."""

    def __init__(
        self,
        settings: ColdReadSettings,
        image: Callable[[], sm.StreamMetadataImage],
        limiter: NetworkBandwidthLimiter | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = dataclasses.replace(settings, limited=limiter is not None)
        self._image = image
        self._limiter = limiter
        self._clock = clock
        self._sender = ReadImageSender()
        self._child: _Child | None = None
        self._starting = asyncio.Lock()
        self._last_start_s = float("-inf")
        self._ids = itertools.count(1)
        self._closed = False
        self._stats = BlockCacheStats(0, 0, 0, 0, 0, 0, 0, 0, 0)
        self._peak_bytes = 0
        self.counts = ReportedReads()
        self.starts = 0

    # ---------------------------------------------------------------------------- reads

    async def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        child = await self._running()
        request_id = next(self._ids)
        answer: asyncio.Future[list[StreamRecordBatch]] = asyncio.get_running_loop().create_future()
        child.pending[request_id] = answer
        try:
            self._send_image(child)
            body = READ_REQUEST.pack(stream_id, start_offset, end_offset, max_bytes)
            child.send(frame(Kind.READ, request_id, len(body)), body)
            return await answer
        except asyncio.CancelledError:
            if not child.exited and request_id in child.pending:
                child.send(frame(Kind.CANCEL, request_id, 0))
            raise
        finally:
            child.pending.pop(request_id, None)
            child.parts.pop(request_id, None)

    def _send_image(self, child: _Child) -> None:
        delta = self._sender.delta(self._image())
        if delta is not None:
            body = pickle.dumps(delta, protocol=pickle.HIGHEST_PROTOCOL)
            child.send(frame(Kind.IMAGE, NO_REQUEST, len(body)), body)

    @property
    def pid(self) -> int | None:
        """The running child's process id; None before the first read and after it exits."""
        child = self._child
        return None if child is None or child.exited else child.process.pid

    def stats(self, *, take_peak: bool = True) -> BlockCacheStats:
        """As of the child's last report; ``peak_bytes`` the largest reported since the last
        call that took it (``take_peak``)."""
        peak = self._peak_bytes
        if take_peak:
            self._peak_bytes = 0
        return dataclasses.replace(self._stats, peak_bytes=max(peak, self._stats.resident_bytes))

    # ------------------------------------------------------------------------ the child

    async def _running(self) -> _Child:
        if self._closed:
            raise ColdReadsFailed("reads from objects are closed")
        child = self._child
        if child is not None and not child.exited:
            return child
        async with self._starting:
            child = self._child
            if child is not None and not child.exited:
                return child
            if self._closed:
                raise ColdReadsFailed("reads from objects are closed")
            wait_s = self._last_start_s + RESTART_BACKOFF_S - self._clock()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self._last_start_s = self._clock()
            self._child = await self._start()
            return self._child

    async def _start(self) -> _Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        tune(ours)
        tune(theirs)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                CHILD_MODULE,
                str(theirs.fileno()),
                self.settings.to_json(),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        child = _Child(process)
        try:
            _, child.receiver = await asyncio.get_running_loop().create_unix_connection(
                lambda: FrameReceiver(functools.partial(self._on_frame, child)), sock=ours
            )
        except BaseException:
            ours.close()
            await self._reap(child, kill=True)
            raise
        child.watching = asyncio.create_task(self._watch(child), name=f"{self.settings.name}-rx")
        try:
            kind, body = await asyncio.wait_for(asyncio.shield(child.ready), START_TIMEOUT_S)
        except TimeoutError:
            await self._reap(child, kill=True)
            raise ColdReadsFailed(
                f"the cold-read process did not start within {START_TIMEOUT_S:.0f} s"
            ) from None
        except ColdReadsFailed:
            await self._reap(child)
            raise ColdReadsFailed(
                f"the cold-read process exited as it started (code {process.returncode})"
            ) from None
        except BaseException:  # cancelled while it started: it goes at once
            await self._reap(child, kill=True)
            raise
        if kind is not Kind.READY:
            await self._reap(child)
            raise ColdReadsFailed(f"the cold-read process did not start: {body.decode()}")
        self.starts += 1
        self._sender.reset()
        self.counts.restarted()
        log.info("cold-read process %d started", process.pid)
        return child

    async def _watch(self, child: _Child) -> None:
        """Wait for the connection to end; then fail what the child held."""
        assert child.receiver is not None
        try:
            await child.receiver.lost
        finally:
            child.exited = True
            failure = ColdReadsFailed(
                "the cold-read process closed its connection"
                if self._closed
                else "the cold-read process exited"
            )
            if not child.ready.done():
                child.ready.set_exception(failure)
            for answer in child.pending.values():
                if not answer.done():
                    answer.set_exception(failure)
            for task in child.grants:
                task.cancel()
            if not self._closed and child.ready.exception() is None:
                log.error(
                    "cold-read process %d exited; the next read starts another", child.process.pid
                )
                asyncio.get_running_loop().create_task(self._reap(child))

    def _on_frame(self, child: _Child, kind: Kind, request_id: int, body: memoryview) -> None:
        if kind is Kind.BATCHES_PART:
            if request_id in child.pending:
                child.parts.setdefault(request_id, []).extend(iter_stream_record_batches(body))
        elif kind is Kind.BATCHES:
            self._report(body)
            batches = child.parts.pop(request_id, [])
            answer = child.pending.get(request_id)
            if answer is not None and not answer.done():
                batches.extend(iter_stream_record_batches(body[STATS.size :]))
                answer.set_result(batches)
        elif kind is Kind.ERROR:
            self._report(body)
            answer = child.pending.get(request_id)
            if answer is not None and not answer.done():
                message = bytes(body[STATS.size + 1 :]).decode()
                answer.set_exception(_failure(body[STATS.size], message))
        elif kind in (Kind.READY, Kind.START_FAILED):
            if not child.ready.done():
                child.ready.set_result((kind, bytes(body)))
        elif kind is Kind.STATS:
            self._report(body)
        elif kind is Kind.TOKENS:
            size, priority = TOKENS_REQUEST.unpack(body)
            task = asyncio.get_running_loop().create_task(
                self._grant(child, request_id, size, Priority(priority))
            )
            child.grants.add(task)
            task.add_done_callback(child.grants.discard)
        else:
            log.warning("cold-read process sent an unexpected %s frame", kind.name)

    async def _grant(self, child: _Child, request_id: int, size: int, priority: Priority) -> None:
        assert self._limiter is not None, "a child without a limiter asks for no tokens"
        try:
            await self._limiter.consume(size, priority)
        except (LimiterClosed, ValueError) as error:
            message = str(error).encode()
            child.send(frame(Kind.REFUSED, request_id, len(message)), message)
            return
        child.send(frame(Kind.GRANTED, request_id, 0))

    def _report(self, body: memoryview) -> None:
        *cache, counted, counted_bytes = STATS.unpack_from(body)
        self._stats = BlockCacheStats(*cache)
        peak = self._stats.peak_bytes
        self._peak_bytes = max(self._peak_bytes, peak)
        self.counts.report(counted, counted_bytes)

    async def _reap(self, child: _Child, *, kill: bool = False) -> None:
        """Close the connection and wait for the process, killing it if it lingers (or at
        once: ``kill``)."""
        child.exited = True
        child.close_connection()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
        try:
            await asyncio.wait_for(child.process.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()

    async def close(self) -> None:
        """Ask the child to close its read path, wait for it to exit. Idempotent."""
        if self._closed:
            return
        self._closed = True
        async with self._starting:
            child, self._child = self._child, None
        if child is None:
            return
        if not child.exited:
            child.send(frame(Kind.CLOSE, NO_REQUEST, 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.process.wait(), CLOSE_TIMEOUT_S)
        await self._reap(child)
        if child.watching is not None:
            await asyncio.gather(child.watching, return_exceptions=True)


def _failure(kind: int, message: str) -> Exception:
    if kind == ReadFailure.NOT_FOUND:
        return NotFound(message)
    if kind == ReadFailure.STREAM_READ:
        return StreamReadError(message)
    if kind == ReadFailure.OBJECT_STORE:
        return ObjectStoreError(message)
    return ColdReadsFailed(f"a read in the cold-read process failed: {message}")
