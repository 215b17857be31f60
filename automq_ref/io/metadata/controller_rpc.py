"""The controller's RPC: how a broker hands a StreamMetadata request to the active controller.

Each broker of a cluster runs a :class:`ControllerServer` (a small TCP listener; its address is
published in the controller election key, see :mod:`automq_ref.io.metadata.election`); brokers
that are not the controller send their requests to the one that is, over a
:class:`ControllerConnection`.

Wire format: frames of a 4-byte big-endian length and a JSON body. A request is
``{"id": n, "type": "<event class name>", "event": {...}}``; the event's fields are those of the
machine's frozen dataclass (``automq_ref/state_machines/stream_metadata/events.py``), encoded by
pydantic (bytes in base64), and decoded back into that dataclass: only the event types of the
machine's union are accepted, and nothing is ever unpickled. The reply is
``{"id": n, "response": {...}, "index": i}``, where ``i`` is the log index the controller's
image had reached right after deciding (the requester waits until its own image reaches it,
so it sees its request's effect before it goes on), or ``{"id": n, "error": kind, "message":
...}`` with ``kind`` one of:

* ``not_controller``: this node does not hold the election (or lost it while deciding): nothing
  was decided, the requester asks the new controller;
* ``unknown``: the controller could not get its decision onto the log (etcd unreachable): its
  outcome is unknown;
* ``failed``: the controller decided nothing (the log kept moving ahead, a malformed request).

A connection carries any number of requests at once, matched to replies by ``id``. A
connection lost while requests are in flight fails them as :class:`ReplyLost`: sent, maybe
decided, answer unknown (the cluster's client sends such a request again when the machine
answers its repeat alike: ``automq_ref/io/metadata/cluster.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from automq_ref.io.metadata.background import stop
from automq_ref.state_machines import stream_metadata as sm

log = logging.getLogger(__name__)

MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")
_WIRE: Final = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64", frozen=True)

ErrorKind = Literal["not_controller", "unknown", "failed"]


class ControllerRpcError(Exception):
    """A request to a remote controller failed."""


class NotSent(ControllerRpcError):
    """The request never left this node (no connection): nothing was decided."""


class ReplyLost(ControllerRpcError):
    """The request was sent but no answer came back (connection lost, timeout): it may have
    been decided."""


class RemoteError(ControllerRpcError):
    """The controller answered with an error (``kind``: see the module)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


# -------------------------------------------------------------------------------- codec

EVENT_TYPES: Final[dict[str, type[Any]]] = {
    event_type.__name__: event_type for event_type in get_args(sm.StreamMetadataEvent)
}


def _tag(name: str) -> Any:
    """``Literal[name]`` for a name known only at run time."""
    return Literal[name]


# One frame model per event type, tagged by the type's name: the dataclass as a field of a
# model that carries the wire config (a stdlib dataclass takes it from the model it sits in).
_REQUEST_FRAMES: Final[dict[str, type[BaseModel]]] = {
    name: create_model(
        f"{name}Request",
        __config__=_WIRE,
        type=(_tag(name), ...),
        id=(int, ...),
        event=(event_type, ...),
    )
    for name, event_type in EVENT_TYPES.items()
}
_REQUEST_UNION: Any = Union[tuple(_REQUEST_FRAMES.values())]  # noqa: UP007
_REQUEST: Final = TypeAdapter[Any](Annotated[_REQUEST_UNION, Field(discriminator="type")])


class _Reply(BaseModel):
    model_config = _WIRE

    id: int
    response: sm.Response | None = None
    index: int | None = None
    error: ErrorKind | None = None
    message: str = ""


def encode_request(request_id: int, event: sm.StreamMetadataEvent) -> bytes:
    name = type(event).__name__
    frame = _REQUEST_FRAMES.get(name)
    if frame is None:
        raise TypeError(f"{name} is not a StreamMetadata event")
    return frame(type=name, id=request_id, event=event).model_dump_json().encode()


def decode_request(data: bytes) -> tuple[int, sm.StreamMetadataEvent]:
    """A request's id and event; ValueError when it is not one."""
    try:
        decoded = _REQUEST.validate_json(data)
    except ValidationError as error:
        raise ValueError(f"not a controller request: {error}") from None
    event: sm.StreamMetadataEvent = decoded.event
    return int(decoded.id), event


def encode_reply(
    request_id: int,
    response: sm.Response | None = None,
    index: int | None = None,
    error: ErrorKind | None = None,
    message: str = "",
) -> bytes:
    reply = _Reply(id=request_id, response=response, index=index, error=error, message=message)
    return reply.model_dump_json().encode()


def decode_reply(data: bytes) -> _Reply:
    try:
        return _Reply.model_validate_json(data)
    except ValidationError as error:
        raise ValueError(f"not a controller reply: {error}") from None


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, or None at a clean end of the stream."""
    try:
        header = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise ConnectionError("the stream ended inside a frame header") from None
        return None
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    return await reader.readexactly(length)


def _frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


# -------------------------------------------------------------------------------- server

# Decide an event: its response and the log index the image reached with it. Raises
# NotControllerError when this node may not decide, DecisionUnknown when its outcome is unknown.
Decide = Callable[[sm.StreamMetadataEvent], Awaitable[tuple[sm.Response, int]]]


class NotControllerError(Exception):
    """Raised by a server's ``decide``: this node is not the controller; nothing decided."""


class DecisionUnknown(Exception):
    """Raised by a server's ``decide``: the decision's outcome is unknown."""


class ControllerServer:
    """Serves ``decide`` on a TCP listener."""

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port)
        address = self._server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            # The connection's reader then ends, and its task with it.
            writer.close()
        if self._connections:
            await asyncio.wait(set(self._connections))
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(writer)
        handlers: set[asyncio.Task[None]] = set()
        lock = asyncio.Lock()
        try:
            while (data := await _read_frame(reader)) is not None:
                handler = asyncio.create_task(self._answer(data, writer, lock))
                handlers.add(handler)
                handler.add_done_callback(handlers.discard)
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            log.debug("controller RPC connection: %s", error)
        finally:
            for handler in list(handlers):
                handler.cancel()
            self._connections.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, data: bytes, writer: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        try:
            request_id, event = decode_request(data)
        except ValueError as error:
            log.warning("controller RPC: %s", error)
            request_id = _request_id_of(data)
            body = encode_reply(request_id, error="failed", message=str(error))
        else:
            try:
                response, index = await self._decide(event)
            except NotControllerError as error:
                body = encode_reply(request_id, error="not_controller", message=str(error))
            except DecisionUnknown as error:
                body = encode_reply(request_id, error="unknown", message=str(error))
            except Exception as error:
                log.exception("controller RPC: deciding %s", type(event).__name__)
                body = encode_reply(request_id, error="failed", message=str(error))
            else:
                body = encode_reply(request_id, response, index)
        async with lock:
            writer.write(_frame(body))
            with contextlib.suppress(ConnectionError):
                await writer.drain()


def _request_id_of(data: bytes) -> int:
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        return int(json.loads(data)["id"])
    return -1


# -------------------------------------------------------------------------------- client


class ControllerConnection:
    """One connection to a controller's RPC listener; ``call`` may be used concurrently."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[_Reply]] = {}
        self._next_id = 0
        self._connecting = asyncio.Lock()
        self.broken = False

    async def _connect(self, timeout_s: float) -> asyncio.StreamWriter:
        async with self._connecting:
            if self.broken:
                raise NotSent(f"the connection to the controller at {self.address} is closed")
            if self._writer is None:
                host, _, port = self.address.rpartition(":")
                try:
                    async with asyncio.timeout(timeout_s):
                        self._reader, self._writer = await asyncio.open_connection(host, int(port))
                except (OSError, TimeoutError, ValueError) as error:
                    self.broken = True
                    raise NotSent(
                        f"cannot reach the controller at {self.address}: {error}"
                    ) from error
                self._reading = asyncio.create_task(self._read_replies(self._reader))
            return self._writer

    async def call(
        self, event: sm.StreamMetadataEvent, timeout_s: float
    ) -> tuple[sm.Response, int]:
        """Send ``event``; the controller's response and the index its image reached."""
        writer = await self._connect(timeout_s)
        self._next_id += 1
        request_id = self._next_id
        reply: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            writer.write(_frame(encode_request(request_id, event)))
            try:
                async with asyncio.timeout(timeout_s):
                    await writer.drain()
                    answer = await reply
            except TimeoutError:
                raise ReplyLost(
                    f"no answer from the controller at {self.address} in {timeout_s:.1f} s"
                ) from None
            except ConnectionError as error:
                self._fail(error)
                raise ReplyLost(f"the controller at {self.address}: {error}") from error
        finally:
            self._pending.pop(request_id, None)
        if answer.error is not None:
            raise RemoteError(answer.error, answer.message)
        if answer.response is None or answer.index is None:
            raise RemoteError("failed", "a reply without a response")
        return answer.response, answer.index

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = ConnectionError("the controller closed the connection")
        try:
            while (data := await _read_frame(reader)) is not None:
                reply = decode_reply(data)
                waiter = self._pending.get(reply.id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(reply)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as failure:
            error = failure
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        self.broken = True
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ReplyLost(f"the controller at {self.address}: {error}"))
        self._pending.clear()

    async def close(self) -> None:
        self.broken = True
        reading, self._reading = self._reading, None
        await stop(reading)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        self._fail(ConnectionError("closed"))
