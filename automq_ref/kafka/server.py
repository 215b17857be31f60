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
Reading copies as little as it can: a large frame (a Produce request) is read from the socket
straight into a buffer of its own, which is handed to the handler (see ``_Connection``). A frame
larger than ``max_request_bytes`` (Kafka's ``socket.request.max.bytes``) or with a
negative size closes the connection at once: the stream cannot be resynchronised. A handler that
raises :class:`CloseConnection` closes the connection after the responses before it are written
(and after its own ``answer``, when it has one: a SASL authentication failure is answered, then
closed).

What the operator is told (see :mod:`automq_ref.kafka.notices`): a connection whose first bytes are
a TLS handshake (``0x16 0x03``: a client configured for SSL) or an HTTP request, rather than a
Kafka size prefix, is named as such and closed; that, an oversized frame and a connection closed
by a handler are logged at WARNING once per client and reason, at DEBUG afterwards (such clients
retry several times a second). New connections are logged per client host in bursts: the first
at once, then one line per :data:`CONNECTION_LOG_WINDOW_S` with how many more came, if any.

Metrics (when the node has them, :mod:`automq_ref.io.metrics`): each frame's bytes and API key
and its arrival time are noted as it is taken; when its answer has been written (or, acks=0,
found to be none) the request is counted, with its time, by API; the answers' bytes and the open
connections are counted too. An answer that is an :class:`Answer` says which error codes it
carries (its handler's results, not a walk of the bytes): each one but NONE is counted by API
and error name, read only with metrics on.

Closing: once a connection is closing (the peer went away, a request could not be answered, the
server stops) nothing more is admitted, and the answers admitted but not yet awaited are closed
(a coroutine) or cancelled (a future) rather than dropped: their work is not undone (a
Produce's records were appended at admission and become durable all the same; its producer,
which got no answer, retries), but nothing is left to be collected unawaited. While a
connection lives, every answer is awaited and written, in order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
import ssl
import time
import typing
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from automq_ref.errors import KafkaErrorCode
from automq_ref.io.logfmt import fields
from automq_ref.io.metrics import BrokerMetrics
from automq_ref.kafka.notices import Notices
from automq_ref.kafka.tls import certificate_principal
from automq_ref.protocol.kio_codec import api_name

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 64

Chunks = Sequence[bytes | bytearray | memoryview]
Reply = Chunks | None | Awaitable[Chunks | None]


class Answer(list[bytes | bytearray | memoryview]):
    """A response's chunks, and how to list the error codes it carries (top level and per
    entry, NONE among them): a function of what the handler answered, called by the listener
    only when it counts errors (:mod:`automq_ref.io.metrics`); without metrics an answer costs
    the list and the closure, a fraction of a microsecond."""

    __slots__ = ("error_codes",)

    def __init__(
        self,
        chunks: Iterable[bytes | bytearray | memoryview],
        error_codes: Callable[[], Iterable[int]],
    ) -> None:
        super().__init__(chunks)
        self.error_codes = error_codes


class CloseConnection(Exception):
    """Raised by a handler: the request cannot be answered; close after earlier responses.

    The listener logs the message once per client (``client_id`` and host) and ``reason`` (by
    default the message itself): a client that retries does not repeat the line."""

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        client_id: str | None = None,
        answer: Chunks | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.client_id = client_id
        self.answer = answer


class Session:
    """What a connection learns of its client as it goes, kept with its :class:`Peer` (so it goes
    when the connection goes): on a SASL listener, the exchange's step (``sasl_step``, see
    :mod:`automq_ref.kafka.sasl`) and ``principal``: ``User:<name>`` once SASL authenticated
    it, before that (and on a listener without SASL) the client certificate's subject
    (``User:CN=...``, :func:`automq_ref.kafka.tls.certificate_principal`) or
    ``User:ANONYMOUS``."""

    __slots__ = ("muted_until_s", "principal", "sasl_exchange", "sasl_step")

    def __init__(self) -> None:
        self.principal: str | None = None
        self.sasl_step = 0
        # A SCRAM login under way: its exchange (automq_ref.formats.scram's state; None for
        # PLAIN, or before the handshake).
        self.sasl_exchange: object | None = None
        # Throttled by a quota (kafka/quotas.py): no request is taken before this (monotonic).
        self.muted_until_s = 0.0


@dataclass(frozen=True, slots=True)
class Peer:
    connection_id: int
    address: str  # "host:port", or "?" when the socket did not say
    # The name of the listener the connection came to ("": a server with one unnamed listener).
    listener: str = ""
    session: Session = field(default_factory=Session, compare=False, repr=False)

    @property
    def host(self) -> str:
        host, colon, _ = self.address.rpartition(":")
        return host if colon else self.address


class RequestHandler(Protocol):
    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        """Take one request (the bytes after the size prefix: a ``bytearray`` for Produce, which
        the handler may patch in place, ``bytes`` otherwise). Return the response chunks
        (without the size prefix), None for no response, or an awaitable of either."""
        ...


# Reading: frames are read into a scratch buffer; a frame above _OWN_BUFFER_ABOVE (a Produce of
# record batches) gets a buffer of its own as soon as its size is known, and the socket reads the
# rest of it straight into that buffer (no copy of the bulk of the request). Small frames are
# copied out of the scratch buffer once. Produce frames are handed over as ``bytearray`` (the
# broker patches offsets and leader epochs into the record batches in place); other frames as
# ``bytes``.
SCRATCH_BYTES = 256 * 1024
_OWN_BUFFER_ABOVE = SCRATCH_BYTES // 4
# At most this much is read into the scratch buffer at once: a read that holds the start of a
# large frame copies no more than this of it.
_READ_WINDOW = SCRATCH_BYTES // 4
_PRODUCE_API_KEY = b"\x00\x00"
# What the first bytes of a connection that does not speak Kafka look like: a TLS record of type
# handshake (0x16) in TLS 1.x (0x03 ..), an HTTP request line.
_TLS_HANDSHAKE = b"\x16\x03"
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN")
# New connections from one host are summed over this window and logged once per window.
CONNECTION_LOG_WINDOW_S = 10.0


class _Connection(asyncio.BufferedProtocol):
    def __init__(self, server: KafkaServer, connection_id: int, listener: str = "") -> None:
        self._server = server
        self._connection_id = connection_id
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._peer = Peer(connection_id, "?", listener)
        self._scratch = bytearray(SCRATCH_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0  # the first byte of _scratch not yet taken as a frame
        self._end = 0  # the end of the bytes read into _scratch
        self._large: bytearray | None = None  # a frame being read into its own buffer
        self._large_view = memoryview(b"")
        self._large_filled = 0
        self._frames: collections.deque[bytes | bytearray] = collections.deque()
        self._replies: asyncio.Queue[Reply | _Closing] = asyncio.Queue()
        self._in_flight = 0
        self._reading_paused = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._frame_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._framed = False  # a frame was taken: the connection speaks Kafka
        # With metrics: (API key, arrival) of each frame taken and not yet answered, in order.
        self._metrics = server.metrics
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = typing.cast(asyncio.Transport, transport)
        peername = self._transport.get_extra_info("peername")
        address = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._peer = Peer(self._connection_id, address, self._listener)
        # TLS is done by now (asyncio calls this after the handshake): who the client is.
        ssl_object = self._transport.get_extra_info("ssl_object")
        self._peer.session.principal = certificate_principal(ssl_object)
        self._server._connections.add(self)
        self._server._connection_log.opened(self._peer)
        self._tasks = [
            asyncio.create_task(self._admit_forever()),
            asyncio.create_task(self._write_forever()),
        ]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return self._large_view[self._large_filled :]
        if SCRATCH_BYTES - self._end < _OWN_BUFFER_ABOVE:
            # Move the unfinished frame (at most _OWN_BUFFER_ABOVE + 3 bytes) to the front.
            pending = self._end - self._start
            self._scratch[:pending] = bytes(self._scratch_view[self._start : self._end])
            self._start, self._end = 0, pending
        return self._scratch_view[self._end : self._end + _READ_WINDOW]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled < len(self._large):
                return
            frame = self._large
            self._large, self._large_view = None, memoryview(b"")
            self._push(frame if frame[:2] == _PRODUCE_API_KEY else bytes(frame))
        else:
            self._end += nbytes
        self._take_frames()
        if self._frames:
            self._frame_ready.set()
        self._update_reading()

    def _take_frames(self) -> None:
        scratch, view = self._scratch, self._scratch_view
        start, end = self._start, self._end
        limit = self._server.max_request_bytes
        while end - start >= 4:
            if not self._framed and self._not_kafka(bytes(view[start : start + 4])):
                self._abort()
                return
            self._framed = True
            size = int.from_bytes(view[start : start + 4], "big", signed=True)
            if size < 0 or size > limit:
                self._server.notices.tell(
                    ("frame size", self._peer.host),
                    "closing a connection: a frame's size is out of bounds "
                    "(a client that is not Kafka, or a request above socket.request.max.bytes)",
                    size=size,
                    limit=limit,
                    client=self._peer.address,
                )
                self._abort()
                return
            begin = start + 4
            if end - begin >= size:
                stop = begin + size
                if scratch[begin : begin + 2] == _PRODUCE_API_KEY:
                    self._push(scratch[begin:stop])
                else:
                    self._push(bytes(view[begin:stop]))
                start = stop
            elif size > _OWN_BUFFER_ABOVE:
                have = end - begin
                large = bytearray(size)
                large[:have] = view[begin:end]
                self._large, self._large_view = large, memoryview(large)
                self._large_filled = have
                start = end
                break
            else:
                break
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def _not_kafka(self, first: bytes) -> bool:
        """Whether a connection's first bytes are TLS or HTTP (logged once per host)."""
        if first.startswith(_TLS_HANDSHAKE):
            self._server.notices.tell(
                ("tls", self._peer.host),
                "TLS handshake on a plaintext listener: configure the client with "
                "security.protocol=PLAINTEXT (SASL_PLAINTEXT on a SASL listener), not SSL",
                client=self._peer.address,
            )
            return True
        if first in _HTTP_METHODS:
            self._server.notices.tell(
                ("http", self._peer.host),
                "HTTP request on the Kafka listener: point a Kafka client at it "
                "(bootstrap.servers), not a browser or an HTTP client",
                client=self._peer.address,
            )
            return True
        return False

    def _push(self, frame: bytes | bytearray) -> None:
        self._frames.append(frame)
        self._in_flight += 1
        metrics = self._metrics
        if metrics is not None:
            metrics.network_in.inc(len(frame) + 4)
            self._arrivals.append((int.from_bytes(frame[:2], "big"), time.perf_counter()))

    def eof_received(self) -> bool | None:
        return False  # close our side too once the peer has closed its

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self in self._server._connections:
            self._server._connections.discard(self)
            self._server._connection_log.closed(self._peer)
        for task in self._tasks:
            task.cancel()
        self._can_write.set()
        self._discard_replies()

    def pause_writing(self) -> None:
        self._can_write.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._can_write.set()
        self._update_reading()

    # ------------------------------------------------------------------------- the halves

    async def _admit_forever(self) -> None:
        handler = self._server.handler
        while not self._closing:
            if not self._frames:
                self._frame_ready.clear()
                await self._frame_ready.wait()
                continue
            frame = self._frames.popleft()
            try:
                reply = await handler.admit(frame, self._peer)
            except CloseConnection as error:
                self._tell_closing(error)
                if error.answer is not None:
                    self._replies.put_nowait(error.answer)
                self._replies.put_nowait(_Closing())
                return
            except Exception:
                log.exception("connection %s: handler failed; closing", self._peer.address)
                self._replies.put_nowait(_Closing())
                return
            if self._closing:
                # Closed while this request was admitted: nobody will await its answer.
                _discard(reply)
                return
            self._replies.put_nowait(reply)

    async def _write_forever(self) -> None:
        try:
            await self._write_replies()
        finally:
            # However the writer ends (closing, cancelled with the connection), the answers
            # still queued will not be awaited.
            self._discard_replies()

    async def _write_replies(self) -> None:
        while not self._closed:
            reply = await self._replies.get()
            if isinstance(reply, _Closing):
                self._close()
                return
            chunks: Chunks | None
            try:
                chunks = await reply if isinstance(reply, Awaitable) else reply
            except CloseConnection as error:
                self._tell_closing(error)
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
                if self._metrics is not None:
                    self._metrics.network_out.inc(size + 4)
                await self._can_write.wait()
            if self._metrics is not None and self._arrivals:
                api_key, arrived = self._arrivals.popleft()
                api = _api_label(api_key)
                self._metrics.request_answered(api, (time.perf_counter() - arrived) * 1000)
                if isinstance(chunks, Answer):
                    for code in chunks.error_codes():
                        if code:
                            self._metrics.request_error(api, _error_label(code))
            self._update_reading()

    # --------------------------------------------------------------------------- helpers

    def _tell_closing(self, error: CloseConnection) -> None:
        self._server.notices.tell(
            ("close", error.reason, error.client_id, self._peer.host),
            f"closing a connection: {error}",
            client_id=error.client_id or "",
            client=self._peer.address,
        )

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

    @property
    def _closing(self) -> bool:
        return self._closed or (self._transport is not None and self._transport.is_closing())

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    def _discard_replies(self) -> None:
        while not self._replies.empty():
            _discard(self._replies.get_nowait())


def _discard(reply: Reply | _Closing) -> None:
    """An answer that will not be awaited: a coroutine is closed (it never ran, so nothing of it
    is undone and nothing warns that it was never awaited), a future cancelled."""
    if inspect.iscoroutine(reply):
        reply.close()
    elif isinstance(reply, asyncio.Future):
        reply.cancel()


class _Closing:
    """Queued after the last reply of a connection that must close."""


# AutoMQ's own APIs (kio has no schema for them), as its brokers name them.
_AUTOMQ_APIS = {515: "AutomqZoneRouter", 516: "AutomqGetPartitionSnapshot"}


@functools.cache
def _api_label(api_key: int) -> str:
    """The API a request's key names, as the metrics label it (``Produce``); ``unknown`` for a
    key neither Kafka nor AutoMQ defines."""
    name = _AUTOMQ_APIS.get(api_key) or api_name(api_key)
    return name if name.isidentifier() else "unknown"


@functools.cache
def _error_label(code: int) -> str:
    """An error code's name, as Kafka's ``ErrorsPerSec`` labels it; a code Kafka does not define
    is ``UNKNOWN_SERVER_ERROR``, as Kafka's ``Errors.forCode`` reads one."""
    try:
        return KafkaErrorCode(code).name
    except ValueError:
        return KafkaErrorCode.UNKNOWN_SERVER_ERROR.name


class KafkaServer:
    """Listens on one address per listener bound and feeds every connection's requests to
    ``handler``."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.max_in_flight = max_in_flight
        self.metrics = metrics
        self._servers: list[asyncio.Server] = []
        self._connections: set[_Connection] = set()
        if metrics is not None:
            metrics.connections.set_function(lambda: len(self._connections))
        self._next_connection_id = 0
        self.notices = Notices(log)
        self._connection_log = _ConnectionLog()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Start listening; return the bound address (port 0 picks a free port)."""
        address = await self.bind(host, port)
        await self.serve()
        return address

    async def bind(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        *,
        listener: str = "",
    ) -> tuple[str, int]:
        """Bind the address without accepting yet; return it (port 0 picks a free port). A
        broker binds before it registers, so the address it registers is the one it serves.
        With ``ssl_context`` (an SSL listener) every connection speaks TLS. Each call binds one
        more listener (its connections' peers carry ``listener``, its name)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            functools.partial(self._new_connection, listener),
            host,
            port,
            start_serving=False,
            ssl=ssl_context,
        )
        self._servers.append(server)
        address = server.sockets[0].getsockname()
        return address[0], address[1]

    async def serve(self) -> None:
        """Accept connections on the addresses :meth:`bind` bound."""
        assert self._servers, "bind first"
        for server in self._servers:
            await server.start_serving()

    def _new_connection(self, listener: str) -> _Connection:
        self._next_connection_id += 1
        return _Connection(self, self._next_connection_id, listener)

    async def close(self) -> None:
        """Stop accepting, close every connection."""
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection._close()
        for connection in list(self._connections):
            for task in connection._tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            connection._discard_replies()
        self._connection_log.close()
        for server in self._servers:
            await server.wait_closed()


class _ConnectionLog:
    """New connections per client host, logged in bursts (see the module docstring); each
    connection is logged at DEBUG."""

    def __init__(self, window_s: float | None = None) -> None:
        self._window_s = CONNECTION_LOG_WINDOW_S if window_s is None else window_s
        self._open: collections.Counter[str] = collections.Counter()
        # host -> connections since its last line, for the hosts with a window running
        self._since_line: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def opened(self, peer: Peer) -> None:
        host = peer.host
        self._open[host] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("connection opened %s", fields(client=peer.address, open=self._open[host]))
        if host in self._since_line:
            self._since_line[host] += 1
            return
        log.info("client connected %s", fields(client=peer.address, open=self._open[host]))
        self._since_line[host] = 0
        self._start_window(host)

    def closed(self, peer: Peer) -> None:
        host = peer.host
        self._open[host] -= 1
        if self._open[host] <= 0:
            del self._open[host]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("connection closed %s", fields(client=peer.address, open=self._open[host]))

    def _start_window(self, host: str) -> None:
        loop = asyncio.get_running_loop()
        self._timers[host] = loop.call_later(self._window_s, self._window_ended, host)

    def _window_ended(self, host: str) -> None:
        count = self._since_line.pop(host, 0)
        del self._timers[host]
        if count == 0:
            return  # quiet: the next connection is logged at once
        log.info(
            "client connections %s",
            fields(client=host, new=count, seconds=self._window_s, open=self._open[host]),
        )
        self._since_line[host] = 0
        self._start_window(host)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._since_line.clear()
