"""The Kafka listener: framing, per-connection ordering, pipelining and back-pressure.

Wire: every request and response is a 4-byte big-endian size followed by that many bytes. A
connection may send many requests before reading a response (pipelining); responses go back in
request order, as Kafka clients require (they match responses to requests by position as much
as by correlation id).

Each connection has two halves:

- *admission*, serial: requests are handed to the handler one at a time, in arrival order. The
  handler does what must happen in order (for Produce: validate, assign offsets, queue the WAL
  write) and returns either the response, ``None`` (no response: Produce with acks=0), or an
  awaitable of the response (the part that may overlap with later requests: waiting for the WAL
  sync, a Fetch long poll);
- *writing*, in order: the responses are awaited in request order and written with
  ``transport.writelines`` (record batches are passed through as the chunks they are).

Back-pressure: reading pauses while a connection has ``max_in_flight`` requests admitted but not
answered, or while the transport's write buffer is above its high-water mark, and resumes below.
A frame larger than ``max_request_bytes`` (Kafka's ``socket.request.max.bytes``) or with a
negative size closes the connection at once: the stream cannot be resynchronised. A handler that
raises :class:`CloseConnection` closes the connection after the responses before it are written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import typing
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 64

Chunks = Sequence[bytes | bytearray | memoryview]
Reply = Chunks | None | Awaitable[Chunks | None]


class CloseConnection(Exception):
    """Raised by a handler: the request cannot be answered; close after earlier responses."""


@dataclass(frozen=True, slots=True)
class Peer:
    connection_id: int
    address: str


class RequestHandler(Protocol):
    async def admit(self, frame: bytes, peer: Peer) -> Reply:
        """Take one request (the bytes after the size prefix). Return the response chunks
        (without the size prefix), None for no response, or an awaitable of either."""
        ...


class _Connection(asyncio.Protocol):
    def __init__(self, server: KafkaServer, connection_id: int) -> None:
        self._server = server
        self._connection_id = connection_id
        self._transport: asyncio.Transport | None = None
        self._peer = Peer(connection_id, "?")
        self._buffer = bytearray()
        self._frames: collections.deque[bytes] = collections.deque()
        self._replies: asyncio.Queue[Reply | _Closing] = asyncio.Queue()
        self._in_flight = 0
        self._reading_paused = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._frame_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = typing.cast(asyncio.Transport, transport)
        peername = self._transport.get_extra_info("peername")
        address = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._peer = Peer(self._connection_id, address)
        self._server._connections.add(self)
        self._tasks = [
            asyncio.create_task(self._admit_forever()),
            asyncio.create_task(self._write_forever()),
        ]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        limit = self._server.max_request_bytes
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "big", signed=True)
            if size < 0 or size > limit:
                log.warning(
                    "connection %s: frame of %d bytes (limit %d): closing",
                    self._peer.address,
                    size,
                    limit,
                )
                self._abort()
                return
            if len(self._buffer) < 4 + size:
                break
            self._frames.append(bytes(self._buffer[4 : 4 + size]))
            del self._buffer[: 4 + size]
            self._in_flight += 1
        if self._frames:
            self._frame_ready.set()
        self._update_reading()

    def eof_received(self) -> bool | None:
        return False  # close our side too once the peer has closed its

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server._connections.discard(self)
        for task in self._tasks:
            task.cancel()
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._can_write.set()
        self._update_reading()

    # ------------------------------------------------------------------------- the halves

    async def _admit_forever(self) -> None:
        handler = self._server.handler
        while not self._closed:
            if not self._frames:
                self._frame_ready.clear()
                await self._frame_ready.wait()
                continue
            frame = self._frames.popleft()
            try:
                reply = await handler.admit(frame, self._peer)
            except CloseConnection as error:
                log.info("connection %s: closing: %s", self._peer.address, error)
                await self._replies.put(_Closing())
                return
            except Exception:
                log.exception("connection %s: handler failed; closing", self._peer.address)
                await self._replies.put(_Closing())
                return
            await self._replies.put(reply)

    async def _write_forever(self) -> None:
        while not self._closed:
            reply = await self._replies.get()
            if isinstance(reply, _Closing):
                self._close()
                return
            chunks: Chunks | None
            try:
                chunks = await reply if isinstance(reply, Awaitable) else reply
            except CloseConnection as error:
                log.info("connection %s: closing: %s", self._peer.address, error)
                self._close()
                return
            except Exception:
                log.exception("connection %s: request failed; closing", self._peer.address)
                self._close()
                return
            self._in_flight -= 1
            if chunks is not None and self._transport is not None and not self._closed:
                size = sum(len(chunk) for chunk in chunks)
                self._transport.writelines([size.to_bytes(4, "big"), *chunks])
                await self._can_write.wait()
            self._update_reading()

    # --------------------------------------------------------------------------- helpers

    def _update_reading(self) -> None:
        if self._transport is None or self._closed:
            return
        busy = self._in_flight >= self._server.max_in_flight or not self._can_write.is_set()
        if busy and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not busy and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()


class _Closing:
    """Queued after the last reply of a connection that must close."""


class KafkaServer:
    """Listens on ``host:port`` and feeds every connection's requests to ``handler``."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.max_in_flight = max_in_flight
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._next_connection_id = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Start listening; return the bound address (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, host, port)
        address = self._server.sockets[0].getsockname()
        return address[0], address[1]

    def _new_connection(self) -> _Connection:
        self._next_connection_id += 1
        return _Connection(self, self._next_connection_id)

    async def close(self) -> None:
        """Stop accepting, close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection._close()
        for connection in list(self._connections):
            for task in connection._tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._server is not None:
            await self._server.wait_closed()
