"""Object storage: one async interface, a local-directory backend and an S3 backend.

This module is the one door the shell uses: it re-exports the contract
(``object_store_contract.py``: :class:`ObjectStore`, its errors and values, the key rules) and
both backends (``local_object_store.py``, ``s3_object_store.py``) and the request shaping over
either (``shaped_store.py``: merged ranged reads, read/write isolation, the read timeout), and
builds a store from a URI. Each of those modules' docstrings states its part of the contract.

:class:`CountingReads` wraps a store and counts the GETs made through it and the bytes they
returned, whichever the backend: the storage reads objects through one, under its shaped store,
so that the GETs the store really sees and the bytes a catch-up fetches from it can be set beside
the bytes it delivers (the node logs them). :class:`ThrottledStore` puts a store's GETs and PUTs
through the network bandwidth limiter (:mod:`automq_ref.io.network_limiter`) at one priority:
the object WAL's and object compaction's stores are wrapped in one. :class:`MeasuredStore` times
every request into the node's Prometheus metrics (:mod:`automq_ref.io.metrics`).

:func:`open_object_store` builds a store from a URI: ``file:///path`` or
``s3://bucket?region=...&endpoint=...&pathStyle=true``, optionally with AutoMQ's ``<id>@`` bucket
prefix, which is ignored.
"""

from __future__ import annotations

import builtins
import contextlib
import re
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

from automq_ref.io.metrics import S3_REQUEST, BrokerMetrics
from automq_ref.io.network_limiter import NetworkLimiters
from automq_ref.io.storage.local_object_store import ETAG_XATTR_NAME, LocalDirectoryObjectStore
from automq_ref.io.storage.object_store_contract import (
    STAGING_DIR_NAME,
    DeleteManyError,
    InvalidKey,
    NotFound,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    Payload,
    PreconditionFailed,
    RangeNotSatisfiable,
    as_chunks,
    validate_key,
    validate_prefix,
)
from automq_ref.io.storage.shaped_store import RequestShaping, ShapedObjectStore
from automq_ref.state_machines.network_limiter import Priority

__all__ = [
    "ETAG_XATTR_NAME",
    "STAGING_DIR_NAME",
    "CountingReads",
    "DeleteManyError",
    "ForwardingStore",
    "InvalidKey",
    "LocalDirectoryObjectStore",
    "MeasuredStore",
    "NotFound",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "Payload",
    "PreconditionFailed",
    "RangeNotSatisfiable",
    "RequestShaping",
    "S3ObjectStore",
    "ShapedObjectStore",
    "ThrottledStore",
    "backoff_delay_ms",
    "open_object_store",
    "validate_key",
    "validate_prefix",
]

if TYPE_CHECKING:
    from automq_ref.io.storage.s3_object_store import S3ObjectStore, backoff_delay_ms

_BUCKET_ID_PREFIX = re.compile(r"^\d+@")
_S3_NAMES = ("S3ObjectStore", "backoff_delay_ms")


def __getattr__(name: str) -> Any:
    """The S3 backend's names, imported at their first use: its libraries (aiobotocore,
    aiohttp) take a third of a second of CPU to import, which a process that only reads a
    directory (the cold-read process of ``make run``) need not spend."""
    if name in _S3_NAMES:
        from automq_ref.io.storage import s3_object_store

        return getattr(s3_object_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_object_store(uri: str, **options: Any) -> ObjectStore:
    """Build a store from ``file:///path`` or ``s3://bucket?region=..&endpoint=..&pathStyle=..``.

    AutoMQ's bucket-id prefix (``0@s3://...``) is accepted and ignored. Query parameters
    ``accessKey`` and ``secretKey`` are honoured; other parameters (such as the WAL's
    ``batchInterval``) are ignored. ``options`` go to the backend's constructor and override the
    URI (credentials, retry settings, ``fsync``...). The returned store is not yet connected; use it
    as an async context manager or call :meth:`ObjectStore.close` when done.
    """
    parts = urlsplit(_BUCKET_ID_PREFIX.sub("", uri.strip(), count=1))
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names a host; use file:///absolute/path")
        path = unquote(parts.path)
        if not path:
            raise ValueError(f"file URI {uri!r} has no path")
        return LocalDirectoryObjectStore(Path(path), **options)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"s3 URI {uri!r} has no bucket")
        arguments: dict[str, Any] = {}
        if "region" in query:
            arguments["region"] = query["region"]
        if "endpoint" in query:
            arguments["endpoint_url"] = query["endpoint"]
        if "pathStyle" in query:
            arguments["path_style"] = query["pathStyle"].lower() == "true"
        if "accessKey" in query:
            arguments["access_key_id"] = query["accessKey"]
        if "secretKey" in query:
            arguments["secret_access_key"] = query["secretKey"]
        arguments.update(options)
        from automq_ref.io.storage.s3_object_store import S3ObjectStore

        return S3ObjectStore(parts.netloc, **arguments)
    raise ValueError(f"unsupported object store URI {uri!r}: expected file:// or s3://")


class ForwardingStore(ObjectStore):
    """``store`` as it is: every call passed on (the base of the wrappers below)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def __aenter__(self) -> Self:
        await self.store.__aenter__()
        return self

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        return await self.store.put(key, data)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        return await self.store.put_if_absent(key, data)

    async def get(self, key: str) -> bytes:
        return await self.store.get(key)

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return await self.store.get_range(key, start, end_exclusive)

    async def head(self, key: str) -> ObjectInfo:
        return await self.store.head(key)

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        return await self.store.list(prefix)

    async def delete(self, key: str) -> None:
        await self.store.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> None:
        await self.store.delete_many(keys)

    async def close(self) -> None:
        await self.store.close()


class CountingReads(ForwardingStore):
    """``store`` as it is, counting ``get`` and ``get_range`` calls (``gets``) and the bytes
    they returned (``get_bytes``); :meth:`take` returns and resets both at once, also from
    another thread than the one reading (the cold reads' loop, ``cold_reads.py``)."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.gets = 0
        self.get_bytes = 0
        # Since the store was built, never reset: what a cold-read process reports.
        self.total_gets = 0
        self.total_get_bytes = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        """The GETs and bytes counted since the last take."""
        with self._lock:
            taken = (self.gets, self.get_bytes)
            self.gets = self.get_bytes = 0
        return taken

    def _count(self, data: bytes) -> None:
        with self._lock:
            self.gets += 1
            self.get_bytes += len(data)
            self.total_gets += 1
            self.total_get_bytes += len(data)

    async def get(self, key: str) -> bytes:
        data = await self.store.get(key)
        self._count(data)
        return data

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        data = await self.store.get_range(key, start, end_exclusive)
        self._count(data)
        return data


class ThrottledStore(ForwardingStore):
    """``store`` with its traffic through the network bandwidth limiter at one ``priority``:
    a GET's bytes from ``limiters.inbound`` (a ranged GET before it is sent, a whole one once
    its size is known), a PUT's to ``limiters.outbound`` before it is sent. BYPASS (the object
    WAL, uploads) never waits; COMPACTION (object compaction) waits its turn."""

    def __init__(self, store: ObjectStore, limiters: NetworkLimiters, priority: Priority) -> None:
        super().__init__(store)
        self._limiters = limiters
        self._priority = priority

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        await self._limiters.outbound.consume(_size(data), self._priority)
        return await self.store.put(key, data)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        await self._limiters.outbound.consume(_size(data), self._priority)
        return await self.store.put_if_absent(key, data)

    async def get(self, key: str) -> bytes:
        data = await self.store.get(key)
        await self._limiters.inbound.consume(len(data), self._priority)
        return data

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        await self._limiters.inbound.consume(max(end_exclusive - start, 0), self._priority)
        return await self.store.get_range(key, start, end_exclusive)


class MeasuredStore(ForwardingStore):
    """``store`` as it is, each request timed into ``metrics`` by operation (S3's names:
    ``PutObject``, ``GetObject``, ``HeadObject``, ``ListObjects``, ``DeleteObject``,
    ``DeleteObjects``) and outcome, and the bytes put and got counted. A missing key
    (``NotFound``) and a conditional put that lost (``PreconditionFailed``) are answers, so
    successes; anything else raised is a failure."""

    def __init__(self, store: ObjectStore, metrics: BrokerMetrics) -> None:
        super().__init__(store)
        self._metrics = metrics

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        ok = False
        try:
            yield
            ok = True
        except (NotFound, PreconditionFailed):
            ok = True
            raise
        finally:
            self._metrics.operation(S3_REQUEST, name, ok, time.perf_counter() - began)

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        with self._timed("PutObject"):
            info = await self.store.put(key, data)
        self._metrics.uploaded.inc(_size(data))
        return info

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        with self._timed("PutObject"):
            info = await self.store.put_if_absent(key, data)
        self._metrics.uploaded.inc(_size(data))
        return info

    async def get(self, key: str) -> bytes:
        with self._timed("GetObject"):
            data = await self.store.get(key)
        self._metrics.downloaded.inc(len(data))
        return data

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        with self._timed("GetObject"):
            data = await self.store.get_range(key, start, end_exclusive)
        self._metrics.downloaded.inc(len(data))
        return data

    async def head(self, key: str) -> ObjectInfo:
        with self._timed("HeadObject"):
            return await self.store.head(key)

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        with self._timed("ListObjects"):
            return await self.store.list(prefix)

    async def delete(self, key: str) -> None:
        with self._timed("DeleteObject"):
            await self.store.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> None:
        with self._timed("DeleteObjects"):
            await self.store.delete_many(keys)


def _size(data: Payload) -> int:
    return sum(chunk.nbytes for chunk in as_chunks(data))
