"""Fault-injecting proxies for the history checker: one for Kafka's TCP, one for S3's HTTP.

Both run their own asyncio event loop on a daemon thread, so the nemesis (another thread) drives
them with plain method calls, and both forward everything untouched while healed.

:class:`TcpProxy` sits between Kafka clients and a broker (the broker advertises the proxy's
address through ``advertised.listeners``, so clients never learn the real port). Each accepted
connection gets one upstream connection and two pumps, one per direction. A pump reads a chunk,
stamps it with ``now + delay`` and queues it; a writer per direction sends each chunk when its
time comes, so a delay shifts the stream in time but never reorders it. The faults:

- ``set_delay(s)``: every chunk, both directions, leaves ``s`` seconds after it arrived.
- ``set_drop(True)``: a black hole. Bytes read from either side are counted and thrown away;
  connections stay open, so peers see silence, not an error (a partition, as far as TCP can
  tell). New connections are accepted and black-holed too. Healing stops the discarding, but a
  Kafka connection that lost bytes mid-frame is useless; clients recover by timing out and
  reconnecting, which is the point.
- ``set_stall(True)``: a partition that heals. Nothing is forwarded, nothing is lost: bytes
  wait in the proxy and flow, in order, once the stall ends (as TCP retransmits across a short
  partition). Peers see silence; a client that times out meanwhile reconnects.
- ``reset_all()``: every open connection is aborted on both sides with ``SO_LINGER`` 0, so each
  peer gets an RST (``ConnectionResetError``) rather than an orderly EOF.
- ``set_cut(predicate)``: a partition of some connections only, chosen by the Kafka client id
  of the first request each connection carries (read from its header: size, API key, version,
  correlation id, then the client id as an int16-length string in every header version):
  those the predicate accepts are stalled as by ``set_stall`` (their bytes held and delivered
  in order once the cut ends), the others flow. A connection whose first request has not
  arrived yet is not cut. The zone-partition nemesis cuts a zone off with it.

:class:`S3FaultProxy` is an HTTP/1.1 reverse proxy (aiohttp server and client, keep-alive on both
legs) in front of an S3 endpoint. A request is forwarded with its method, raw path and query,
and headers, including ``Host`` and the SigV4 ``Authorization`` (a server checking signatures
sees exactly what the client signed); the body is read whole and sent with a ``Content-Length``
(hop-by-hop headers, ``Expect`` and ``Transfer-Encoding`` are the proxy's own business per
leg). The response goes back with its status (206 for ranged GETs), headers and raw body (no
decompression). The faults, drawn per request from a seeded random source:

- ``error_rate``: the request is answered ``503 SlowDown`` with S3's XML error body and never
  forwarded: the write did not happen, and the client knows it may retry.
- ``latency_s``: the request waits this long before it is forwarded.
- ``ambiguous_rate``: the request is forwarded (a PUT lands) but the caller gets
  ``500 InternalError`` or, for every other such request, a connection cut after the upstream
  answered: the classic ambiguous success, which a client must treat as "may have happened".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

__all__ = ["S3FaultProxy", "TcpProxy"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK_BYTES = 65536
_CONTROL_TIMEOUT_S = 10.0


_STALL_POLL_S = 0.01
# How much of a connection's first bytes the proxy keeps looking for its client id in.
_HEADER_LIMIT = 65536


class _LoopThread:
    """An event loop running forever on a daemon thread; coroutines are submitted to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = _CONTROL_TIMEOUT_S) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            coroutine, self.loop
        )
        return future.result(timeout)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_CONTROL_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close at once with an RST: SO_LINGER on with a zero timeout, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# ---------------------------------------------------------------------------------------------
# TCP


class _Connection:
    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []
        self.reset = False
        self.client_id: str | None = None  # its first request's, once read (set_cut)
        self._header = b""  # the first request's bytes until its client id is complete

    def read_client_id(self, chunk: bytes) -> None:
        """Take the client id from the first request's header (``chunk`` is the next bytes
        the client sent); until it is complete, keep what came."""
        if self.client_id is not None or len(self._header) > _HEADER_LIMIT:
            return
        self._header += chunk
        if len(self._header) < 14:
            return
        (length,) = struct.unpack_from(">h", self._header, 12)
        if length < 0:
            self.client_id = ""
        elif len(self._header) >= 14 + length:
            self.client_id = self._header[14 : 14 + length].decode("utf-8", "replace")
        if self.client_id is not None:
            self._header = b""

    def abort(self) -> None:
        self.reset = True
        _abort_with_rst(self.client)
        _abort_with_rst(self.upstream)


class TcpProxy:
    """Clients -> proxy -> target. Runs its own asyncio loop on a daemon thread."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.port = listen_port
        self._delay_s = 0.0
        self._drop = False
        self._stall = False
        self._cut: Callable[[str], bool] | None = None
        self._held_ids: set[str] = set()
        self._connections: set[_Connection] = set()
        self._stats_lock = threading.Lock()
        self._stats = {
            "connections": 0,
            "bytes_up": 0,
            "bytes_down": 0,
            "dropped_bytes": 0,
            "resets": 0,
        }
        self._loop_thread: _LoopThread | None = None
        self._server: asyncio.Server | None = None

    def __repr__(self) -> str:
        return f"TcpProxy({self.listen_host}:{self.port} -> {self.target_host}:{self.target_port})"

    @property
    def stats(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    # -- control (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        if self._loop_thread is not None:
            raise RuntimeError(f"{self!r} already started")
        self._loop_thread = _LoopThread(f"tcp-proxy-{self.target_port}")
        self._loop_thread.start()
        self._server = self._loop_thread.call(self._listen())
        self.port = int(self._server.sockets[0].getsockname()[1])

    def set_delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"delay must not be negative, not {seconds}")
        self._delay_s = float(seconds)

    def set_drop(self, drop: bool) -> None:
        self._drop = bool(drop)

    def set_stall(self, stall: bool) -> None:
        self._stall = bool(stall)

    def set_cut(self, predicate: Callable[[str], bool] | None) -> None:
        """Stall the connections whose first request's client id ``predicate`` accepts (open
        ones and new ones) until called again with None (module docstring)."""
        self._cut = predicate

    def held_client_ids(self) -> set[str]:
        """The client ids of the connections the cut held bytes of since the last call."""
        held, self._held_ids = self._held_ids, set()
        return held

    def _held(self, connection: _Connection) -> bool:
        cut = self._cut
        if self._stall:
            return True
        if cut is None or connection.client_id is None or not cut(connection.client_id):
            return False
        self._held_ids.add(connection.client_id)
        return True

    def reset_all(self) -> int:
        """Abort every open connection with an RST on both sides; return how many."""
        assert self._loop_thread is not None, "start() first"
        return self._loop_thread.call(self._reset_all())

    def heal(self) -> None:
        self._delay_s = 0.0
        self._drop = False
        self._stall = False
        self._cut = None

    def stop(self) -> None:
        if self._loop_thread is None:
            return
        with contextlib.suppress(Exception):
            self._loop_thread.call(self._shutdown())
        self._loop_thread.stop()
        self._loop_thread = None

    # -- the loop's side ----------------------------------------------------------------------

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, self.listen_host, self.port)

    async def _reset_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        self._count("resets", len(connections))
        return len(connections)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
            for task in connection.tasks:
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count("connections")
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError as error:
            log.info("%r: cannot reach the target: %s", self, error)
            _abort_with_rst(writer)
            return
        connection = _Connection(writer, upstream_writer)
        self._connections.add(connection)
        try:
            connection.tasks = [
                asyncio.create_task(self._pump(connection, reader, upstream_writer, "bytes_up")),
                asyncio.create_task(self._pump(connection, upstream_reader, writer, "bytes_down")),
            ]
            await asyncio.gather(*connection.tasks, return_exceptions=True)
        finally:
            self._connections.discard(connection)
            for side in (writer, upstream_writer):
                side.transport.abort() if connection.reset else side.close()

    async def _pump(
        self,
        connection: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        """One direction: read, stamp, queue; a writer task sends each chunk at its time."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(connection, queue, writer, counter))
        try:
            while True:
                try:
                    chunk = await reader.read(_CHUNK_BYTES)
                except OSError:
                    break
                if not chunk:
                    break
                if counter == "bytes_up":
                    connection.read_client_id(chunk)
                if self._drop:
                    self._count("dropped_bytes", len(chunk))
                    continue
                queue.put_nowait((time.monotonic() + self._delay_s, chunk))
            queue.put_nowait((0.0, b""))  # end of stream: half-close the other side
            await sender
        except BaseException:
            sender.cancel()
            raise
        finally:
            if not sender.done():
                sender.cancel()
            # A direction that ended in an error (not an orderly EOF) takes the other with it.
            if connection.reset or not reader.at_eof():
                connection.abort()

    async def _send(
        self,
        connection: _Connection,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        while True:
            due, chunk = await queue.get()
            while self._cut is not None and self._held(connection):  # a FIN waits too
                await asyncio.sleep(_STALL_POLL_S)
            if not chunk:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            while self._held(connection):
                await asyncio.sleep(_STALL_POLL_S)
            if self._drop:  # went black while the chunk was queued
                self._count("dropped_bytes", len(chunk))
                continue
            writer.write(chunk)
            # Counted once handed to the socket, before the drain: the peer may read the bytes
            # (and a test the stats) before this task runs again.
            self._count(counter, len(chunk))
            try:
                await writer.drain()
            except OSError:
                return


# ---------------------------------------------------------------------------------------------
# S3 over HTTP

# Per-leg headers: each leg of the proxy has its own connection and framing.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)


def _s3_error(status: int, code: str, message: str, resource: str) -> web.Response:
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>automq-ref-s3-fault-proxy</HostId></Error>"
    )
    return web.Response(
        status=status,
        body=body.encode(),
        content_type="application/xml",
        headers={"x-amz-request-id": request_id},
    )


class S3FaultProxy:
    """An HTTP reverse proxy in front of an S3 endpoint (moto server in tests), injecting faults."""

    def __init__(
        self,
        target_url: str,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int = 0,
    ) -> None:
        self.target_url = target_url.rstrip("/")
        self.listen_host = listen_host
        self.port = listen_port
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._error_rate = 0.0
        self._latency_s = 0.0
        self._ambiguous_rate = 0.0
        self._ambiguous_count = 0
        self._methods: frozenset[str] | None = None
        self._stats = {"requests": 0, "errors_injected": 0, "ambiguous_injected": 0, "delayed": 0}
        self._loop_thread: _LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"S3FaultProxy({self.url} -> {self.target_url})"

    @property
    def url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    # -- control (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        if self._loop_thread is not None:
            raise RuntimeError(f"{self!r} already started")
        self._loop_thread = _LoopThread(f"s3-proxy-{self.target_url}")
        self._loop_thread.start()
        self.port = self._loop_thread.call(self._listen())

    def set_faults(
        self,
        *,
        error_rate: float = 0.0,
        latency_s: float = 0.0,
        ambiguous_rate: float = 0.0,
        methods: Collection[str] | None = None,
    ) -> None:
        """Faults from now on; ``methods`` (e.g. ``("PUT",)``) limits them to requests of those
        HTTP methods, the others pass untouched (None: every request)."""
        for name, rate in (("error_rate", error_rate), ("ambiguous_rate", ambiguous_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], not {rate}")
        if latency_s < 0:
            raise ValueError(f"latency_s must not be negative, not {latency_s}")
        with self._lock:
            self._error_rate = error_rate
            self._latency_s = latency_s
            self._ambiguous_rate = ambiguous_rate
            self._methods = None if methods is None else frozenset(m.upper() for m in methods)

    def heal(self) -> None:
        self.set_faults()

    def stop(self) -> None:
        if self._loop_thread is None:
            return
        with contextlib.suppress(Exception):
            self._loop_thread.call(self._shutdown())
        self._loop_thread.stop()
        self._loop_thread = None

    # -- the loop's side ----------------------------------------------------------------------

    async def _listen(self) -> int:
        # No automatic decompression: bodies pass through byte for byte.
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=1 << 31)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.listen_host, self.port).start()
        return int(self._runner.addresses[0][1])

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _decide(self, method: str) -> tuple[str, float]:
        """This request's fate: ("error" | "ambiguous-500" | "ambiguous-cut" | "pass", delay)."""
        with self._lock:
            self._stats["requests"] += 1
            if self._methods is not None and method.upper() not in self._methods:
                return "pass", 0.0
            latency = self._latency_s
            if latency > 0:
                self._stats["delayed"] += 1
            if self._error_rate > 0 and self._random.random() < self._error_rate:
                self._stats["errors_injected"] += 1
                return "error", latency
            if self._ambiguous_rate > 0 and self._random.random() < self._ambiguous_rate:
                self._stats["ambiguous_injected"] += 1
                self._ambiguous_count += 1
                fate = "ambiguous-cut" if self._ambiguous_count % 2 == 0 else "ambiguous-500"
                return fate, latency
            return "pass", latency

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fate, latency = self._decide(request.method)
        if latency > 0:
            await asyncio.sleep(latency)
        if fate == "error":
            return _s3_error(503, "SlowDown", "Please reduce your request rate.", request.path)
        assert self._session is not None
        headers = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _HOP_BY_HOP
        )
        try:
            async with self._session.request(
                request.method,
                URL(self.target_url + request.raw_path, encoded=True),
                headers=headers,
                data=body if body or request.method in ("PUT", "POST") else None,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Content-Type", "Accept", "Accept-Encoding"),
            ) as upstream:
                upstream_body = await upstream.read()
                if fate == "ambiguous-500":
                    return _s3_error(
                        500,
                        "InternalError",
                        "We encountered an internal error. Please try again.",
                        request.path,
                    )
                return await self._respond(
                    request, upstream, upstream_body, cut=fate == "ambiguous-cut"
                )
        except aiohttp.ClientError as error:
            log.warning("%r: upstream %s %s failed: %s", self, request.method, request.path, error)
            return _s3_error(503, "ServiceUnavailable", f"upstream failed: {error}", request.path)

    async def _respond(
        self, request: web.Request, upstream: aiohttp.ClientResponse, body: bytes, *, cut: bool
    ) -> web.StreamResponse:
        """Pass the upstream answer back; with ``cut``, promise one byte more than the body,
        send the rest and reset the connection, so the client sees a response cut short (an
        error it cannot mistake for success, and that its HTTP layer does not silently resend,
        as it would a request that got no answer at all on a reused connection)."""
        if cut and request.method == "HEAD":  # no body to cut short: cut before the answer
            if request.transport is not None:
                _abort_transport(request.transport)
            return web.Response(status=500)  # never sent
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                response.headers.add(name, value)
        # HEAD answers carry the object's length without a body.
        length = upstream.headers.get("Content-Length")
        response.content_length = (int(length) if length is not None else len(body)) + int(cut)
        await response.prepare(request)
        if body and request.method != "HEAD":
            await response.write(body)
        if cut:
            if request.transport is not None:
                _abort_transport(request.transport)
            return response
        await response.write_eof()
        return response


def _abort_transport(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if isinstance(transport, asyncio.Transport):
        transport.abort()
    else:
        transport.close()
