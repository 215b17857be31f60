"""A small typed door to etcd's v3 API, over the asyncio client ``aetcd``.

The metadata log and the controller election need a handful of etcd calls, and need more of
them than ``aetcd``'s convenience methods expose: a transaction's header revision, ranges with a
``limit``, a sort order and a ``revision``, reads inside a transaction. This module speaks to
etcd's KV service with its protobuf messages directly (``aetcd.rpc``) and keeps ``aetcd`` for what
it does well (the channel and its stubs). Everything above sees typed values: :class:`KeyValue`,
the compares (:class:`ValueIs`, :class:`VersionIs`, :class:`CreateRevisionIs`,
:class:`ModRevisionIs`), the operations (:class:`Put`, :class:`Get`, :class:`DeleteRange`),
:class:`TxnResult` and :class:`RangeResult`.

Errors. Every failure arrives as an :class:`EtcdError` with the cause chained:
:class:`EtcdUnavailable` when etcd could not be reached or did not answer in time (the outcome of
a write is then unknown), :class:`EtcdRejected` when etcd refused the request as it stands (too
many operations in a transaction, a request above ``--max-request-bytes``: nothing was applied),
:class:`EtcdCompacted` when a read or watch asked for a revision that compaction removed.

Leases and watches use etcd's streams directly too, one stream per watch (cancelling the call
ends it), rather than ``aetcd``'s shared watch stream with its locks and queues: leaving a watch,
or cancelling the task in it, never waits on etcd.

Endpoints. :meth:`EtcdClient.connect` takes one or more ``host:port`` endpoints of one etcd
cluster; after a call fails as unreachable, the next call goes to the next endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_S: Final = 5.0
# Replies may be large (a page of log batches, snapshot chunks); requests are bounded by etcd.
_CHANNEL_OPTIONS: Final = {
    "grpc.max_receive_message_length": -1,
    "grpc.max_send_message_length": -1,
    # A member that stops answering (paused, partitioned) is noticed on idle streams too.
    # etcd refuses pings more often than every 5 s by default.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


class EtcdError(Exception):
    """A call to etcd failed; the cause is chained."""


class EtcdUnavailable(EtcdError):
    """etcd could not be reached or did not answer in time: a write's outcome is unknown."""


class EtcdRejected(EtcdError):
    """etcd refused the request as it stands (too many operations, too large): nothing applied."""


class EtcdCompacted(EtcdError):
    """The revision asked for is below etcd's compaction point."""


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class RangeResult:
    kvs: tuple[KeyValue, ...]
    more: bool
    revision: int  # the store's revision the read saw


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    # One entry per operation of the branch taken: a RangeResult for a Get, None otherwise.
    results: tuple[RangeResult | None, ...]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    deleted: bool  # a DELETE (else a PUT)
    kv: KeyValue  # for a DELETE, the key with its deletion's revision as mod_revision


# -------------------------------------------------------------------------- compares


@dataclass(frozen=True, slots=True)
class ValueIs:
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class VersionIs:
    """``version == 0`` holds exactly when the key is absent."""

    key: bytes
    version: int


@dataclass(frozen=True, slots=True)
class CreateRevisionIs:
    """Holds while the key is the very one created at ``revision`` (not deleted and re-made)."""

    key: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class ModRevisionIs:
    key: bytes
    revision: int  # 0: the key is absent


Compare = ValueIs | VersionIs | CreateRevisionIs | ModRevisionIs


# ------------------------------------------------------------------------ operations


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Get:
    """``key`` alone, or the range ``[key, range_end)``; ``limit`` 0 is no limit."""

    key: bytes
    range_end: bytes | None = None
    limit: int = 0
    descending: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRange:
    key: bytes
    range_end: bytes | None = None


Operation = Put | Get | DeleteRange


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes ``[prefix, range_end)`` every key starting with ``prefix``."""
    data = bytearray(prefix)
    for index in reversed(range(len(data))):
        if data[index] < 0xFF:
            data[index] += 1
            return bytes(data[: index + 1])
    return b"\0"


def operation_bytes(operation: Operation) -> int:
    """Roughly what an operation adds to a request (its keys and value, plus framing)."""
    size = len(operation.key) + 16
    if isinstance(operation, Put):
        size += len(operation.value)
    elif operation.range_end is not None:
        size += len(operation.range_end)
    return size


# ---------------------------------------------------------------------------- client


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        bytes(raw.key),
        bytes(raw.value),
        int(raw.create_revision),
        int(raw.mod_revision),
        int(raw.version),
        int(raw.lease),
    )


def _compare_message(compare: Compare) -> Any:
    message = rpc.Compare(key=compare.key, result=rpc.Compare.EQUAL)
    match compare:
        case ValueIs():
            message.target = rpc.Compare.VALUE
            message.value = compare.value
        case VersionIs():
            message.target = rpc.Compare.VERSION
            message.version = compare.version
        case CreateRevisionIs():
            message.target = rpc.Compare.CREATE
            message.create_revision = compare.revision
        case ModRevisionIs():
            message.target = rpc.Compare.MOD
            message.mod_revision = compare.revision
    return message


def _range_message(get: Get, revision: int = 0) -> Any:
    message = rpc.RangeRequest(key=get.key, limit=get.limit, revision=revision)
    if get.range_end is not None:
        message.range_end = get.range_end
    if get.descending:
        message.sort_order = rpc.RangeRequest.DESCEND
        message.sort_target = rpc.RangeRequest.KEY
    return message


def _operation_message(operation: Operation) -> Any:
    match operation:
        case Put():
            return rpc.RequestOp(
                request_put=rpc.PutRequest(
                    key=operation.key, value=operation.value, lease=operation.lease
                )
            )
        case Get():
            return rpc.RequestOp(request_range=_range_message(operation))
        case DeleteRange():
            request = rpc.DeleteRangeRequest(key=operation.key)
            if operation.range_end is not None:
                request.range_end = operation.range_end
            return rpc.RequestOp(request_delete_range=request)


def _range_result(raw: Any, revision: int) -> RangeResult:
    return RangeResult(tuple(_kv(kv) for kv in raw.kvs), bool(raw.more), revision)


def _translate(error: BaseException, what: str) -> EtcdError:
    """An etcd failure as one of this module's errors (the caller chains ``error``)."""
    if isinstance(error, EtcdError):
        return error
    if isinstance(error, aetcd.exceptions.RevisionCompactedError):
        return EtcdCompacted(f"{what}: {error}")
    code = error.code() if isinstance(error, rpc.AioRpcError) else None
    cause = error.__cause__
    if code is None and isinstance(cause, rpc.AioRpcError):
        code = cause.code()
    details = str(error.details()) if isinstance(error, rpc.AioRpcError) else str(error)
    if code is rpc.StatusCode.OUT_OF_RANGE or "compacted" in details:
        return EtcdCompacted(f"{what}: {details}")
    if code in (rpc.StatusCode.INVALID_ARGUMENT, rpc.StatusCode.RESOURCE_EXHAUSTED):
        return EtcdRejected(f"{what}: {details}")
    if isinstance(error, aetcd.exceptions.InvalidArgumentError):
        return EtcdRejected(f"{what}: {details}")
    return EtcdUnavailable(f"{what}: {details or type(error).__name__}")


class EtcdClient:
    """One connection to an etcd cluster. Make it with :meth:`connect`; ``close`` ends it."""

    def __init__(
        self, endpoints: Sequence[str], request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = tuple(endpoints)
        self.request_timeout_s = request_timeout_s
        self._current = 0
        self._client: aetcd.Client | None = None
        self._watch_stub: Any = None
        self._closed = False

    @classmethod
    async def connect(
        cls, endpoints: Sequence[str], request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> EtcdClient:
        client = cls(endpoints, request_timeout_s)
        await client._aetcd()
        return client

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._current]

    async def _aetcd(self) -> aetcd.Client:
        if self._closed:
            raise EtcdUnavailable("the etcd client is closed")
        if self._client is None:
            host, _, port = self.endpoint.rpartition(":")
            client = aetcd.Client(
                host=host or "127.0.0.1",
                port=int(port),
                timeout=self.request_timeout_s,
                options=dict(_CHANNEL_OPTIONS),
            )
            try:
                await client.connect()
            except Exception as error:
                raise _translate(error, f"connecting to etcd at {self.endpoint}") from error
            self._client = client
        return self._client

    async def _failed(self, error: BaseException, what: str) -> EtcdError:
        """Translate ``error``; after an unreachable endpoint, the next call tries the next."""
        translated = _translate(error, f"{what} (etcd at {self.endpoint})")
        if isinstance(translated, EtcdUnavailable) and len(self.endpoints) > 1:
            client, self._client = self._client, None
            self._watch_stub = None
            self._current = (self._current + 1) % len(self.endpoints)
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        return translated

    async def close(self) -> None:
        self._closed = True
        self._watch_stub = None
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    # ------------------------------------------------------------------------- KV calls

    async def range(self, get: Get, *, revision: int = 0) -> RangeResult:
        """Read ``get``'s key or range, at ``revision`` (0: the newest)."""
        client = await self._aetcd()
        try:
            reply = await client.kvstub.Range(
                _range_message(get, revision),
                timeout=self.request_timeout_s,
                metadata=client.metadata,
            )
        except Exception as error:
            raise await self._failed(error, "range") from error
        return _range_result(reply, int(reply.header.revision))

    async def get(self, key: bytes) -> KeyValue | None:
        found = await self.range(Get(key))
        return found.kvs[0] if found.kvs else None

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        """If every compare holds, apply ``success`` atomically, else ``failure``."""
        client = await self._aetcd()
        request = rpc.TxnRequest(
            compare=[_compare_message(compare) for compare in compares],
            success=[_operation_message(operation) for operation in success],
            failure=[_operation_message(operation) for operation in failure],
        )
        try:
            reply = await client.kvstub.Txn(
                request, timeout=self.request_timeout_s, metadata=client.metadata
            )
        except Exception as error:
            raise await self._failed(error, "transaction") from error
        revision = int(reply.header.revision)
        results: list[RangeResult | None] = []
        for response in reply.responses:
            if response.WhichOneof("response") == "response_range":
                results.append(_range_result(response.response_range, revision))
            else:
                results.append(None)
        return TxnResult(bool(reply.succeeded), revision, tuple(results))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """An unconditional put; the revision it made."""
        return (await self.txn((), (Put(key, value, lease),))).revision

    async def compact(self, revision: int) -> None:
        """Drop the history of superseded values below ``revision``."""
        client = await self._aetcd()
        try:
            await client.compact(revision)
        except Exception as error:
            translated = await self._failed(error, f"compact to {revision}")
            if isinstance(translated, EtcdCompacted):
                return  # someone compacted at least as far already
            raise translated from error

    # --------------------------------------------------------------------------- leases

    async def grant_lease(self, ttl_s: int) -> int:
        client = await self._aetcd()
        try:
            reply = await client.leasestub.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s),
                timeout=self.request_timeout_s,
                metadata=client.metadata,
            )
        except Exception as error:
            raise await self._failed(error, "lease grant") from error
        if reply.error:
            raise EtcdRejected(f"lease grant: {reply.error}")
        return int(reply.ID)

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh the lease once; its remaining TTL in seconds (0 or less: it has expired)."""
        client = await self._aetcd()
        call = client.leasestub.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
            timeout=self.request_timeout_s,
            metadata=client.metadata,
        )
        try:
            reply = await call.read()
        except Exception as error:
            raise await self._failed(error, "lease keepalive") from error
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise EtcdUnavailable("lease keepalive: the stream ended without an answer")
        return int(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        """End the lease now: every key attached to it is deleted."""
        client = await self._aetcd()
        try:
            await client.leasestub.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id),
                timeout=self.request_timeout_s,
                metadata=client.metadata,
            )
        except Exception as error:
            translated = await self._failed(error, "lease revoke")
            if "lease not found" in str(translated):
                return  # expired already: the keys are gone all the same
            raise translated from error

    # -------------------------------------------------------------------------- watches

    @contextlib.asynccontextmanager
    async def watch(
        self, key: bytes, *, range_end: bytes | None = None, start_revision: int
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Watch ``key`` (or ``[key, range_end)``) from ``start_revision`` on, inclusive: the
        events, in revision order, until the block ends (the watch is then cancelled). A
        broken stream raises :class:`EtcdUnavailable` from the iterator; a start below the
        compaction point raises :class:`EtcdCompacted`.

        Each watch is a stream of its own on the connection, ended by cancelling the call, so
        that leaving the block (a cancelled task too) never waits on etcd."""
        client = await self._aetcd()
        if self._watch_stub is None:
            self._watch_stub = rpc.WatchStub(client.channel)
        create = rpc.WatchCreateRequest(key=key, start_revision=start_revision)
        if range_end is not None:
            create.range_end = range_end
        ended = asyncio.Event()

        async def requests() -> AsyncGenerator[Any, None]:
            yield rpc.WatchRequest(create_request=create)
            # Keep the sending side open: the watch lives until the call is cancelled.
            await ended.wait()

        call = self._watch_stub.Watch(requests(), metadata=client.metadata)
        try:
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    created = await call.read()
            except TimeoutError:
                raise EtcdUnavailable(f"watch: not created in {self.request_timeout_s} s") from None
            except Exception as error:
                raise await self._failed(error, "watch") from error
            self._check_watch_response(created)

            async def events() -> AsyncGenerator[WatchEvent, None]:
                while True:
                    try:
                        response = await call.read()
                    except Exception as error:
                        raise await self._failed(error, "watch") from error
                    self._check_watch_response(response)
                    for event in response.events:
                        yield WatchEvent(event.type == rpc.Event.DELETE, _kv(event.kv))

            iterator = events()
            try:
                yield iterator
            finally:
                await iterator.aclose()
        finally:
            ended.set()
            call.cancel()

    @staticmethod
    def _check_watch_response(response: Any) -> None:
        if response is grpc.aio.EOF:
            raise EtcdUnavailable("watch: the stream ended")
        if response.compact_revision:
            raise EtcdCompacted(f"watch: history compacted up to {response.compact_revision}")
        if response.canceled:
            raise EtcdUnavailable(f"watch: cancelled by etcd: {response.cancel_reason}")
