"""The cold-read process's server: the read path from objects, serving one broker over a socket.

Started by :mod:`automq_ref.io.storage.cold_read_child` on ``FD``, this end of the socket pair
the broker made, with a :class:`ColdReadSettings` as JSON. It opens the store,
builds the read path (:class:`~automq_ref.io.storage.cold_reads.ObjectReads` over the read image
the broker's deltas build, :mod:`automq_ref.io.storage.read_image`), answers ``READY`` and then
serves frames (:mod:`automq_ref.io.storage.cold_read_process`) until ``CLOSE`` or the end of the
connection: each read in a task of its own, answered with its batches or how it failed, a
cancelled one dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import operator
import pickle
import socket
from typing import Final

from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.io.network_limiter import LimiterClosed
from automq_ref.io.storage.block_cache import BlockCacheStats
from automq_ref.io.storage.cold_read_process import (
    NO_REQUEST,
    READ_REQUEST,
    SOCKET_BUFFER_BYTES,
    STATS,
    TOKENS_REQUEST,
    ColdReadSettings,
    Kind,
    ReadFailure,
    frame,
    read_frame,
    tune,
)
from automq_ref.io.storage.cold_reads import ObjectReads
from automq_ref.io.storage.object_store import NotFound, ObjectStoreError, open_object_store
from automq_ref.io.storage.read_image import ReadImageMirror
from automq_ref.io.storage.stream_objects import StreamReadError
from automq_ref.state_machines.network_limiter import Priority

log = logging.getLogger(__name__)
# A BlockCacheStats' fields as a tuple, in order (it goes with every answer: dataclasses'
# astuple took 9 µs, this 0.2).
_stats_fields = operator.attrgetter(*(field.name for field in dataclasses.fields(BlockCacheStats)))

STATS_INTERVAL_S: Final = 1.0


class _Tokens:
    """The broker's inbound limiter, asked over the connection (``consume`` as the limiter's)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[None]] = {}

    async def consume(self, size_bytes: int, priority: Priority) -> None:
        request_id = next(self._ids)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = granted
        body = TOKENS_REQUEST.pack(size_bytes, priority)
        self._writer.writelines((frame(Kind.TOKENS, request_id, len(body)), body))
        try:
            await granted
        finally:
            self.waiting.pop(request_id, None)

    def answer(self, kind: Kind, request_id: int, body: bytes) -> None:
        granted = self.waiting.get(request_id)
        if granted is None or granted.done():
            return
        if kind is Kind.GRANTED:
            granted.set_result(None)
        else:
            granted.set_exception(LimiterClosed(body.decode()))

    def fail_all(self) -> None:
        for granted in self.waiting.values():
            if not granted.done():
                granted.set_exception(LimiterClosed("the broker closed the connection"))


class _Server:
    def __init__(
        self,
        settings: ColdReadSettings,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.settings = settings
        self.reader = reader
        self.writer = writer
        self.mirror = ReadImageMirror()
        self.tokens = _Tokens(writer)
        self.reads: ObjectReads | None = None
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._last_stats: bytes = b""

    async def open(self) -> None:
        store = open_object_store(self.settings.store_uri)
        await store.__aenter__()
        self.reads = ObjectReads(
            store,
            self.settings.namespace,
            self.settings.block_cache_bytes,
            lambda: self.mirror.image,
            limiter=self.tokens if self.settings.limited else None,
            shaping=self.settings.shaping,
            owns_store=True,
        )

    def stats(self) -> bytes:
        assert self.reads is not None
        counts = self.reads.counts
        return STATS.pack(
            *_stats_fields(self.reads.stats()), counts.total_gets, counts.total_get_bytes
        )

    async def serve(self) -> None:
        reporting = asyncio.create_task(self._report_forever())
        try:
            while True:
                try:
                    kind, request_id, body = await read_frame(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if kind is Kind.IMAGE:
                    self.mirror.apply(pickle.loads(body))
                elif kind is Kind.READ:
                    task = asyncio.create_task(self._read(request_id, body))
                    self.tasks[request_id] = task
                    task.add_done_callback(functools.partial(self._forget, request_id))
                elif kind is Kind.CANCEL:
                    cancelled = self.tasks.get(request_id)
                    if cancelled is not None:
                        cancelled.cancel()
                elif kind in (Kind.GRANTED, Kind.REFUSED):
                    self.tokens.answer(kind, request_id, body)
                elif kind is Kind.CLOSE:
                    return
                else:
                    log.warning("%s: unexpected %s frame", self.settings.name, kind.name)
        finally:
            reporting.cancel()
            self.tokens.fail_all()
            for task in list(self.tasks.values()):
                task.cancel()
            await asyncio.gather(reporting, *self.tasks.values(), return_exceptions=True)
            if self.reads is not None:
                await self.reads.close()

    def _forget(self, request_id: int, _: asyncio.Task[None]) -> None:
        self.tasks.pop(request_id, None)

    async def _read(self, request_id: int, body: bytes) -> None:
        assert self.reads is not None
        stream_id, start, end, max_bytes = READ_REQUEST.unpack(body)
        try:
            batches = await self.reads.read(stream_id, start, end, max_bytes)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the broker raises it again, as the read path would
            self._send_error(request_id, error)
            return
        self._send_batches(request_id, batches)

    def _send_batches(self, request_id: int, batches: list[StreamRecordBatch]) -> None:
        """The batches in frames of about ``answer_part_bytes``: parts, then the last with
        the stats."""
        chunks: list[bytes | memoryview] = []
        length = 0
        for batch in batches:
            if length >= self.settings.answer_part_bytes:
                self.writer.writelines((frame(Kind.BATCHES_PART, request_id, length), *chunks))
                chunks, length = [], 0
            header, payload = batch.encoded_chunks()
            chunks += (header, payload)
            length += len(header) + len(payload)
        stats = self.stats()
        self._last_stats = stats
        self.writer.writelines(
            (frame(Kind.BATCHES, request_id, len(stats) + length), stats, *chunks)
        )

    def _send_error(self, request_id: int, error: Exception) -> None:
        if isinstance(error, NotFound):
            failure, message = ReadFailure.NOT_FOUND, error.key or str(error)
        elif isinstance(error, StreamReadError):
            failure, message = ReadFailure.STREAM_READ, str(error)
        elif isinstance(error, ObjectStoreError):
            failure, message = ReadFailure.OBJECT_STORE, str(error)
        else:
            log.exception("%s: a read failed", self.settings.name, exc_info=error)
            failure, message = ReadFailure.OTHER, f"{type(error).__name__}: {error}"
        stats = self.stats()
        self._last_stats = stats
        text = message.encode()
        self.writer.writelines(
            (
                frame(Kind.ERROR, request_id, len(stats) + 1 + len(text)),
                stats,
                bytes([failure]),
                text,
            )
        )

    async def _report_forever(self) -> None:
        """Stats once a second while they change (readahead goes on between reads)."""
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            stats = self.stats()
            if stats != self._last_stats:
                self._last_stats = stats
                self.writer.writelines((frame(Kind.STATS, NO_REQUEST, len(stats)), stats))


async def _main(fd: int, settings: ColdReadSettings) -> None:
    sock = socket.socket(fileno=fd)
    tune(sock)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=SOCKET_BUFFER_BYTES)
    server = _Server(settings, reader, writer)
    try:
        await server.open()
    except Exception as error:
        message = f"{type(error).__name__}: {error}".encode()
        writer.writelines((frame(Kind.START_FAILED, NO_REQUEST, len(message)), message))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        return
    writer.write(frame(Kind.READY, NO_REQUEST, 0))
    try:
        await server.serve()
    finally:
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


def serve(fd: int, settings_json: str) -> None:
    """Serve the broker on the socket ``fd`` until it closes the connection or says ``CLOSE``."""
    settings = ColdReadSettings.from_json(settings_json)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s %(levelname)s {settings.name} %(name)s: %(message)s",
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio works too
        asyncio.run(_main(fd, settings))
    else:
        uvloop.run(_main(fd, settings))
