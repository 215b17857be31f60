"""A broker's Kafka-protocol connection to another broker: how the zone router's proxy sends
``AutomqZoneRouterRequest`` to a partition's leader (:meth:`BrokerLink.call`), and a transaction
coordinator ``WriteTxnMarkers`` to the leaders of a transaction's partitions
(:meth:`BrokerLink.request`, any request kio has the schema of), on the target's inter-broker
listener (``inter.broker.listener.name``), speaking its protocol (:mod:`.listeners`).

One :class:`BrokerLink` per target broker carries any number of requests at once. Requests are
written in the order :meth:`BrokerLink.call` is called (a FIFO lock around connecting and
writing), so the target admits them in that order: the router's per-hint order relies on it.
Responses come back in request order (Kafka's rule, which the listener keeps) and are matched
by correlation id. A connection that fails fails every request in flight on it with
:class:`BrokerLinkError`; the next call connects again. The bytes written and read, frames
with their size prefixes, are counted (``bytes_out``, ``bytes_in``) for the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any, Final, TypeVar

from automq_ref.kafka.listeners import Connect
from automq_ref.protocol.kio_codec import decode_response, encode_request
from automq_ref.protocol.zone_router import (
    ZoneRouterRequest,
    ZoneRouterResponse,
    decode_zone_router_response,
    encode_zone_router_request,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 10.0
REQUEST_TIMEOUT_S: Final = 30.0
_SIZE: Final = struct.Struct(">i")
MAX_RESPONSE_BYTES: Final = 100 * 1024 * 1024
T = TypeVar("T")


class BrokerLinkError(Exception):
    """No answer came from the target broker (not connected, connection lost, timed out)."""


class BrokerLink:
    """Requests to the broker listening on ``host:port`` (module docstring)."""

    def __init__(
        self, host: str, port: int, client_id: str, connect: Connect | None = None
    ) -> None:
        self.host = host
        self.port = port
        # How it connects (kafka/listeners.py: TLS and SASL as the inter-broker listener
        # speaks them); None: a plain TCP connection.
        self._connect = connect
        self._client_id = client_id
        self._lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        # Per correlation id: how its response decodes, and who waits for it.
        self._waiting: dict[int, tuple[Callable[[bytes], Any], asyncio.Future[Any]]] = {}
        self._correlation = itertools.count(1)
        self._closed = False
        self.bytes_out = 0
        self.bytes_in = 0

    async def call(self, version: int, request: ZoneRouterRequest) -> ZoneRouterResponse:
        """Send ``request`` (written after every earlier call's) and wait for its answer."""
        return await self._exchange(
            lambda correlation_id: encode_zone_router_request(
                version, correlation_id, self._client_id, request
            ),
            lambda frame: decode_zone_router_response(frame, version)[1],
        )

    async def request(self, api_key: int, version: int, body: Any) -> Any:
        """Send the kio request ``body`` of ``api_key`` at ``version``; its kio response."""
        return await self._exchange(
            lambda correlation_id: encode_request(
                api_key, version, correlation_id, self._client_id, body
            ),
            lambda frame: decode_response(api_key, version, frame)[1],
        )

    async def _exchange(self, encode: Callable[[int], bytes], decode: Callable[[bytes], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        async with self._lock:
            writer = await self._connected()
            correlation_id = next(self._correlation) & 0x7FFFFFFF
            frame = encode(correlation_id)
            self._waiting[correlation_id] = (decode, future)
            writer.write(_SIZE.pack(len(frame)) + frame)
            self.bytes_out += _SIZE.size + len(frame)
        try:
            return await asyncio.wait_for(asyncio.shield(future), REQUEST_TIMEOUT_S)
        except TimeoutError as error:
            self._waiting.pop(correlation_id, None)
            raise BrokerLinkError(
                f"no answer from broker {self.host}:{self.port} in {REQUEST_TIMEOUT_S} s"
            ) from error

    async def _connected(self) -> asyncio.StreamWriter:
        if self._closed:
            raise BrokerLinkError("the link is closed")
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        try:
            connecting = (
                asyncio.open_connection(self.host, self.port)
                if self._connect is None
                else self._connect(self.host, self.port)
            )
            reader, writer = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as error:
            raise BrokerLinkError(f"cannot connect to {self.host}:{self.port}: {error}") from error
        self._writer = writer
        self._reader_task = asyncio.get_running_loop().create_task(
            self._read_replies(reader, writer), name=f"broker-link {self.host}:{self.port}"
        )
        return writer

    async def _read_replies(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        error: BaseException = BrokerLinkError(f"broker {self.host}:{self.port} closed the link")
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                if not 0 <= size <= MAX_RESPONSE_BYTES:
                    raise BrokerLinkError(f"a response of {size} bytes")
                frame = await reader.readexactly(size)
                self.bytes_in += _SIZE.size + size
                (correlation_id,) = _SIZE.unpack_from(frame, 0)
                waiting = self._waiting.pop(correlation_id, None)
                if waiting is None:
                    continue  # its caller gave up waiting
                decode, future = waiting
                if future.done():
                    continue
                try:
                    response = decode(frame)
                except Exception as decode_error:
                    future.set_exception(BrokerLinkError(f"undecodable response: {decode_error}"))
                    continue
                future.set_result(response)
        except (asyncio.IncompleteReadError, OSError, BrokerLinkError) as caught:
            if not isinstance(caught, asyncio.IncompleteReadError):
                error = BrokerLinkError(f"broker {self.host}:{self.port}: {caught}")
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            left, self._waiting = self._waiting, {}
            for _, future in left.values():
                if not future.done():
                    future.set_exception(error)

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task
