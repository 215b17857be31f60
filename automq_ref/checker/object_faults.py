"""Fault injection for object stores: a wrapper that answers 503, lies about PUTs, slows down and
crashes on cue, in process.

Test code only (under ``automq_ref.checker``, which no production module imports). The S3 fault
proxy (:mod:`automq_ref.checker.proxies`) does the same to real HTTP traffic; this wrapper works
on any :class:`ObjectStore` (a local directory in the property tests, where thousands of
operations must stay fast and every decision must come from one seeded random source).

:class:`FaultyObjectStore` passes every call to the store it wraps, except:

- ``unavailable_rate``: the call fails with :class:`ObjectStoreUnavailable` *before* reaching the
  store (a 503 ``SlowDown`` the store's own retries did not get past): nothing happened.
- ``ambiguous_rate``: the call reaches the store and takes effect, then fails with
  :class:`ObjectStoreUnavailable` (a PUT that succeeded but was answered with an error, or whose
  answer was lost).
- ``delay_s``: every call waits this long first (a slow store).
- ``crash_after_operations``: a countdown of calls; when it reaches zero the process "dies":
  that call and every later one raise :class:`StoreCrashedError`, and a call already under way
  when the crash comes takes effect but answers :class:`StoreCrashedError` (its answer never
  reached the dead process). A crash between an upload and the check that follows it is a
  countdown that ends right after the upload.

Faults apply to the operations named in ``operations`` (all by default). The wrapped store is
what survives the crash: a test wraps it again for the next incarnation. Closing the wrapper does
not close the wrapped store.
"""

from __future__ import annotations

import asyncio
import builtins
import random
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TypeVar

from automq_ref.io.storage.object_store import (
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    Payload,
)

T = TypeVar("T")

ALL_OPERATIONS = frozenset(
    {"put", "put_if_absent", "get", "get_range", "head", "list", "delete", "delete_many"}
)


class StoreCrashedError(ObjectStoreError):
    """The simulated process died: this and every later call fail."""


class FaultyObjectStore(ObjectStore):
    """Wraps ``store``; see the module docstring for the faults."""

    def __init__(self, store: ObjectStore, *, seed: int = 0) -> None:
        self.store = store
        self._random = random.Random(seed)
        self.unavailable_rate = 0.0
        self.ambiguous_rate = 0.0
        self.delay_s = 0.0
        self.operations: Collection[str] = ALL_OPERATIONS
        self.crash_after_operations: int | None = None
        self.crashed = False
        self.calls: dict[str, int] = {}
        self.injected = {"unavailable": 0, "ambiguous": 0}

    def set_faults(
        self,
        *,
        unavailable_rate: float = 0.0,
        ambiguous_rate: float = 0.0,
        delay_s: float = 0.0,
        operations: Collection[str] = ALL_OPERATIONS,
    ) -> None:
        unknown = set(operations) - ALL_OPERATIONS
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}")
        self.unavailable_rate = unavailable_rate
        self.ambiguous_rate = ambiguous_rate
        self.delay_s = delay_s
        self.operations = frozenset(operations)

    def heal(self) -> None:
        self.set_faults()

    def crash(self) -> None:
        """Die now: every later call raises :class:`StoreCrashedError`."""
        self.crashed = True

    async def _call(self, name: str, key: str | None, action: Callable[[], Awaitable[T]]) -> T:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.crashed:
            raise StoreCrashedError("the process died", key=key)
        if self.crash_after_operations is not None:
            if self.crash_after_operations <= 0:
                self.crashed = True
                raise StoreCrashedError("the process died", key=key)
            self.crash_after_operations -= 1
        faulty = name in self.operations
        if faulty and self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        if faulty and self.unavailable_rate and self._random.random() < self.unavailable_rate:
            self.injected["unavailable"] += 1
            raise ObjectStoreUnavailable(f"{name}: 503 SlowDown (injected)", key=key, attempts=1)
        ambiguous = (
            faulty and self.ambiguous_rate > 0 and self._random.random() < self.ambiguous_rate
        )
        result = await action()
        if self.crashed:
            raise StoreCrashedError("the process died before the answer came", key=key)
        if ambiguous:
            self.injected["ambiguous"] += 1
            raise ObjectStoreUnavailable(
                f"{name}: done, but answered 500 (injected)", key=key, attempts=1
            )
        return result

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        return await self._call("put", key, lambda: self.store.put(key, data))

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        return await self._call("put_if_absent", key, lambda: self.store.put_if_absent(key, data))

    async def get(self, key: str) -> bytes:
        return await self._call("get", key, lambda: self.store.get(key))

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        return await self._call(
            "get_range", key, lambda: self.store.get_range(key, start, end_exclusive)
        )

    async def head(self, key: str) -> ObjectInfo:
        return await self._call("head", key, lambda: self.store.head(key))

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        return await self._call("list", None, lambda: self.store.list(prefix))

    async def delete(self, key: str) -> None:
        await self._call("delete", key, lambda: self.store.delete(key))

    async def delete_many(self, keys: Iterable[str]) -> None:
        listed = builtins.list(keys)
        await self._call("delete_many", None, lambda: self.store.delete_many(listed))

    async def close(self) -> None:
        """The wrapped store stays open: it outlives this incarnation."""
