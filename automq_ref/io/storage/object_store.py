"""Object storage: one async interface, a local-directory backend and an S3 backend.

Every byte AutoMQ keeps for longer than a WAL record lives in an object store: StreamObjects,
StreamSetObjects, S3 WAL objects, reservation objects and router-channel packs. This module is the
only place the project talks to one. The rest of the shell holds an :class:`ObjectStore` and never
learns which backend it is.

Theory of operation
-------------------

The contract (identical on both backends, checked by one test suite run against each):

- ``put(key, data)`` stores ``data`` (one bytes-like object or a sequence of chunks, written in
  order) under ``key``, replacing any previous object, and returns its :class:`ObjectInfo`. A reader
  sees either the old object or the new one, never a mix or a prefix.
- ``put_if_absent(key, data)`` does the same only if no object exists under ``key``; otherwise it
  raises :class:`PreconditionFailed`. Of several concurrent ``put_if_absent`` calls on one key, at
  most one succeeds (see the per-backend caveats below).
- ``get(key)`` returns the whole object; ``get_range(key, start, end_exclusive)`` returns exactly
  ``end_exclusive - start`` bytes or raises. Arguments with ``start < 0`` or
  ``end_exclusive < start`` are a programming error (:class:`ValueError`). A range that does not
  lie inside the object (``end_exclusive > size``) raises :class:`RangeNotSatisfiable` carrying the
  object's size; it is never silently clamped, so a reader with a wrong index cannot mistake a short
  read for data. An empty range ``[s, s)`` with ``s <= size`` returns ``b""`` (and still raises
  :class:`NotFound` if the object is missing).
- ``head(key)`` returns size, etag and last-modified time; ``list(prefix)`` returns every object
  whose key starts with ``prefix`` (a plain string prefix, not a directory), sorted by key.
- ``delete(key)`` is idempotent: deleting a missing key succeeds. ``delete_many(keys)`` deletes
  all of them (in batches of at most 1000 on S3) and raises :class:`DeleteManyError` listing every
  key it could not delete.
- The etag is the lowercase hex MD5 of the content, without quotes, the same value S3 reports for a
  single-part PUT, so the two backends report equal etags for equal content. (S3 buckets with
  SSE-KMS report other etags; nothing in the project compares an etag with a digest it computed
  except the ambiguity check described below, which falls back to comparing bytes.)
- ``put`` returns ``last_modified=None``; ``head`` and ``list`` fill it in (UTC).
- Buffers passed to ``put`` are read while the call runs (on another thread for the local store):
  the caller must not modify them until the call returns.
- Keys follow one portable rule set on both backends (:func:`validate_key`): non-empty, at most
  1024 UTF-8 bytes, '/'-separated segments that are non-empty, not '.' or '..', at most 255 bytes,
  no NUL, no leading '/', and not under the local store's reserved staging directory.
  A key that breaks them raises :class:`InvalidKey` before any I/O.
- Errors are :class:`ObjectStoreError` subclasses (which are :class:`KafkaError` with code
  ``KAFKA_STORAGE_ERROR``). No botocore, aiohttp or ``OSError`` exception escapes: each is mapped
  and chained as ``__cause__``.

:class:`LocalDirectoryObjectStore` (the embedded default) maps key ``a/b/c`` to ``<root>/a/b/c``.

- ``put`` writes a temporary file in ``<root>/.automq-staging/``, fsyncs it, renames it over the
  final path with ``os.replace`` (atomic on POSIX) and fsyncs the final directory (and the parents
  of any directory it created), so an acknowledged put survives a crash and a crash leaves either
  the old object or the new one.
- ``put_if_absent`` writes and fsyncs the temporary file the same way, then publishes it with
  ``os.link(temp, final)``, which the kernel refuses with ``EEXIST`` if the final name exists. The
  check and the creation are one system call, so the guarantee holds across threads and processes
  sharing the directory (on a local filesystem; NFS hard links are not reliable for this).
- The etag is computed while writing and stored in the ``user.automq_ref.etag`` extended attribute
  of the temporary file, so it is published atomically with the content. Where extended attributes
  are unavailable the store computes the MD5 on demand from the file.
- ``delete`` unlinks the file, then removes directories it left empty (stopping at the first
  non-empty one) and fsyncs the surviving parent. A put racing with that pruning re-creates the
  directories and retries, a bounded number of times.
- Leftovers of a crash during a put stay in the staging directory, which ``list`` never shows.
- Limitation: a name cannot be both an object and a directory, so ``a`` and ``a/b`` cannot coexist
  (S3 allows it). Writing the second raises :class:`InvalidKey`. AutoMQ's keys never collide so.
- Blocking file I/O runs in a small dedicated thread pool, never on the event loop. On the machine
  this was written on, the hop costs about 0.15 ms per call: a 4 KiB read takes 9 us inline and
  about 190 us through the pool, a fsynced 4 KiB put 0.7 ms inline and 1.0 ms through the pool.
  That price is paid because a read that misses the page cache or an fsync can stall for
  milliseconds, which on the event loop would stall every Kafka connection of the broker.
- A cancelled call stops waiting, but the thread finishes the operation: like an S3 request whose
  response was lost, a cancelled put may still land.

:class:`S3ObjectStore` talks to S3 or an S3-compatible endpoint through aiobotocore. One client is
opened on first use and kept until :meth:`close`.

- ``put_if_absent`` is a PUT with ``If-None-Match: *``; 412 means the key exists. The atomicity is
  the server's: real S3 guarantees a single winner, but moto (used in tests) checks the condition
  without a lock, so concurrent conditional puts against moto can both succeed.
- botocore's own retries are off (one attempt); this module retries. Throttling (429, 503
  ``SlowDown``, ``Throttling``, ``RequestLimitExceeded``...), other 5xx answers, S3's retryable
  400/409 codes (``RequestTimeout``, ``ConditionalRequestConflict``) and connection or timeout
  errors are retried up to ``max_attempts`` attempts in total, waiting
  ``rand(0..backoff_jitter_ms) + min(backoff_base_ms * 2**min(n, 16), backoff_max_ms)`` before retry
  ``n`` (``n = 0`` for the first retry), as AutoMQ's ``AbstractObjectStorage`` does (defaults
  1000 ms, 60 s, 1000 ms). When they are exhausted the call raises
  :class:`ObjectStoreUnavailable`. Every other 4xx answer fails at once. The random source and the
  sleep function are parameters, so tests check the schedule without sleeping.
- A retried conditional put is ambiguous: the attempt that failed may have landed, and the retry
  then sees 412 for the store's own write. When a 412 follows an earlier failed attempt of the same
  call, the store reads the object back; if its content equals what was being written (size and
  MD5, or bytes when the etag is not an MD5) the put is reported as successful, otherwise
  :class:`PreconditionFailed`. A different writer that stored byte-identical content at the same
  moment is indistinguishable and counted as ours; AutoMQ's conditional objects (reservations,
  fencing records) carry the writer's node id and epoch, so competing writers never write equal
  bytes.

:func:`open_object_store` builds a store from a URI: ``file:///path`` or
``s3://bucket?region=...&endpoint=...&pathStyle=true``, optionally with AutoMQ's ``<id>@`` bucket
prefix, which is ignored.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
import functools
import hashlib
import logging
import os
import random
import re
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from automq_ref.errors import KafkaError, KafkaErrorCode

__all__ = [
    "DeleteManyError",
    "InvalidKey",
    "LocalDirectoryObjectStore",
    "NotFound",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "Payload",
    "PreconditionFailed",
    "RangeNotSatisfiable",
    "S3ObjectStore",
    "backoff_delay_ms",
    "open_object_store",
    "validate_key",
    "validate_prefix",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

Chunk = bytes | bytearray | memoryview
Payload = Chunk | Sequence[Chunk]

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 255
S3_DELETE_BATCH_LIMIT = 1000
S3_LIST_PAGE_LIMIT = 1000
STAGING_DIR_NAME = ".automq-staging"
ETAG_XATTR_NAME = "user.automq_ref.etag"

_PUBLISH_ATTEMPTS = 8
_BACKOFF_EXPONENT_CAP = 16


# ---------------------------------------------------------------------------------------------
# Errors


class ObjectStoreError(KafkaError):
    """Base of every error an object store raises; a broker answers ``KAFKA_STORAGE_ERROR``."""

    code = KafkaErrorCode.KAFKA_STORAGE_ERROR

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotFound(ObjectStoreError):
    """No object exists under the key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object under key {key!r}", key=key)


class PreconditionFailed(ObjectStoreError):
    """A conditional write found the key already present."""

    def __init__(self, key: str) -> None:
        super().__init__(f"an object already exists under key {key!r}", key=key)


class RangeNotSatisfiable(ObjectStoreError):
    """The requested byte range does not lie inside the object."""

    def __init__(self, key: str, start: int, end_exclusive: int, size_bytes: int | None) -> None:
        known = "unknown" if size_bytes is None else str(size_bytes)
        super().__init__(
            f"range [{start}, {end_exclusive}) of {key!r} is outside the object (size {known})",
            key=key,
        )
        self.start = start
        self.end_exclusive = end_exclusive
        self.size_bytes = size_bytes


class ObjectStoreUnavailable(ObjectStoreError):
    """Every attempt failed with a retryable error; ``__cause__`` is the last one."""

    def __init__(self, message: str, *, key: str | None = None, attempts: int) -> None:
        super().__init__(message, key=key)
        self.attempts = attempts


class InvalidKey(ObjectStoreError, ValueError):
    """The key (or list prefix) breaks the portable key rules, or collides with a directory."""


class DeleteManyError(ObjectStoreError):
    """``delete_many`` could not delete some keys; ``failures`` maps each to the reason."""

    def __init__(self, failures: dict[str, str]) -> None:
        shown = ", ".join(f"{key!r} ({reason})" for key, reason in list(failures.items())[:10])
        more = f" and {len(failures) - 10} more" if len(failures) > 10 else ""
        super().__init__(f"could not delete {len(failures)} object(s): {shown}{more}")
        self.failures = failures


# ---------------------------------------------------------------------------------------------
# Values and shared helpers


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object. ``etag`` is hex MD5 of the content, unquoted."""

    key: str
    size_bytes: int
    etag: str
    last_modified: datetime | None = None


def validate_key(key: str) -> None:
    """Raise :class:`InvalidKey` unless ``key`` follows the portable rules (module docstring)."""
    if not isinstance(key, str):
        raise InvalidKey(f"a key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey("a key must not be empty", key=key)
    _check_common(key, "key")
    segments = key.split("/")
    for segment in segments:
        _check_segment(key, segment, "key")
    if segments[0] == STAGING_DIR_NAME:
        raise InvalidKey(f"key {key!r} is under the reserved {STAGING_DIR_NAME!r}", key=key)


def validate_prefix(prefix: str) -> None:
    """Raise :class:`InvalidKey` unless ``prefix`` could begin a valid key ('' lists everything)."""
    if not isinstance(prefix, str):
        raise InvalidKey(f"a prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        return
    _check_common(prefix, "prefix")
    complete_segments = prefix.split("/")[:-1]
    for segment in complete_segments:
        _check_segment(prefix, segment, "prefix")
    if complete_segments and complete_segments[0] == STAGING_DIR_NAME:
        raise InvalidKey(f"prefix {prefix!r} is under the reserved {STAGING_DIR_NAME!r}")


def _check_common(text: str, what: str) -> None:
    if "\x00" in text:
        raise InvalidKey(f"{what} {text!r} contains NUL", key=text)
    if text.startswith("/"):
        raise InvalidKey(f"{what} {text!r} is absolute", key=text)
    try:
        encoded_bytes = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise InvalidKey(f"{what} {text!r} is not valid UTF-8", key=text) from error
    if encoded_bytes > MAX_KEY_BYTES:
        raise InvalidKey(f"{what} is {encoded_bytes} bytes, more than {MAX_KEY_BYTES}", key=text)


def _check_segment(text: str, segment: str, what: str) -> None:
    if segment in ("", ".", ".."):
        raise InvalidKey(f"{what} {text!r} has an empty, '.' or '..' segment", key=text)
    if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
        raise InvalidKey(f"{what} {text!r} has a segment over {MAX_SEGMENT_BYTES} bytes", key=text)


def _check_range(start: int, end_exclusive: int) -> None:
    if not isinstance(start, int) or not isinstance(end_exclusive, int):
        raise ValueError("range bounds must be integers")
    if start < 0:
        raise ValueError(f"range start {start} is negative")
    if end_exclusive < start:
        raise ValueError(f"range end {end_exclusive} is before its start {start}")


def _as_chunks(data: Payload) -> builtins.list[memoryview]:
    """View ``data`` as a list of byte-format memoryviews, without copying."""
    if isinstance(data, bytes | bytearray | memoryview):
        return [memoryview(data).cast("B")]
    chunks: builtins.list[memoryview] = []
    for chunk in data:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise TypeError(f"a chunk must be bytes-like, not {type(chunk).__name__}")
        chunks.append(memoryview(chunk).cast("B"))
    return chunks


def _md5_hex(chunks: Iterable[Chunk]) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def backoff_delay_ms(
    retry_index: int,
    *,
    random_unit: float,
    backoff_base_ms: int = 1000,
    backoff_max_ms: int = 60_000,
    backoff_jitter_ms: int = 1000,
) -> float:
    """AutoMQ's retry delay before retry ``retry_index`` (0 for the first retry).

    ``rand(0..jitter) + min(base * 2**min(n, 16), max)``; ``random_unit`` is the random draw in
    [0, 1).
    """
    if retry_index < 0:
        raise ValueError(f"retry_index {retry_index} is negative")
    exponential_ms = backoff_base_ms * (1 << min(retry_index, _BACKOFF_EXPONENT_CAP))
    return random_unit * backoff_jitter_ms + min(exponential_ms, backoff_max_ms)


# ---------------------------------------------------------------------------------------------
# The interface


class ObjectStore(abc.ABC):
    """An async object store; see the module docstring for the contract."""

    @abc.abstractmethod
    async def put(self, key: str, data: Payload) -> ObjectInfo:
        """Store ``data`` under ``key``, replacing any previous object."""

    @abc.abstractmethod
    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        """Store ``data`` under ``key`` only if absent, else raise :class:`PreconditionFailed`."""

    @abc.abstractmethod
    async def get(self, key: str) -> bytes:
        """Return the whole object, or raise :class:`NotFound`."""

    @abc.abstractmethod
    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        """Return bytes ``[start, end_exclusive)`` exactly, or raise."""

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo:
        """Return size, etag and last-modified time, or raise :class:`NotFound`."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""

    @abc.abstractmethod
    async def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every key; raise :class:`DeleteManyError` listing those that failed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the store's resources; later calls raise :class:`ObjectStoreError`."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


# ---------------------------------------------------------------------------------------------
# Local directory backend


class LocalDirectoryObjectStore(ObjectStore):
    """Objects as files under ``root``; atomic puts by rename, atomic conditional puts by link."""

    def __init__(self, root: Path | str, *, fsync: bool = True, io_threads: int = 8) -> None:
        if io_threads < 1:
            raise ValueError(f"io_threads must be at least 1, not {io_threads}")
        self._root = os.path.abspath(os.fspath(root))
        self._staging = os.path.join(self._root, STAGING_DIR_NAME)
        self._fsync = fsync
        try:
            os.makedirs(self._staging, exist_ok=True)
        except OSError as error:
            raise ObjectStoreError(
                f"cannot create object store at {self._root}: {error}"
            ) from error
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="object-store")
        self._closed = False

    def __repr__(self) -> str:
        return f"LocalDirectoryObjectStore({self._root!r}, fsync={self._fsync})"

    @property
    def root(self) -> Path:
        return Path(self._root)

    # -- the interface ---------------------------------------------------------------------

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        return await self._run("put", key, self._put_sync, key, _as_chunks(data), False)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        return await self._run("put_if_absent", key, self._put_sync, key, _as_chunks(data), True)

    async def get(self, key: str) -> bytes:
        validate_key(key)
        return await self._run("get", key, self._get_sync, key)

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        _check_range(start, end_exclusive)
        validate_key(key)
        return await self._run("get_range", key, self._get_range_sync, key, start, end_exclusive)

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        return await self._run("head", key, self._head_sync, key)

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        validate_prefix(prefix)
        return await self._run("list", None, self._list_sync, prefix)

    async def delete(self, key: str) -> None:
        validate_key(key)
        await self._run("delete", key, self._delete_many_sync, [key])

    async def delete_many(self, keys: Iterable[str]) -> None:
        unique_keys = builtins.list(dict.fromkeys(keys))
        for key in unique_keys:
            validate_key(key)
        await self._run("delete_many", None, self._delete_many_sync, unique_keys)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Waits for operations already handed to the pool; off the loop because it blocks.
        await asyncio.to_thread(self._executor.shutdown, True)

    # -- plumbing ----------------------------------------------------------------------------

    async def _run(
        self, operation: str, key: str | None, function: Callable[..., T], *args: Any
    ) -> T:
        if self._closed:
            raise ObjectStoreError(f"{operation}: {self!r} is closed", key=key)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(function, *args))
        except ObjectStoreError:
            raise
        except OSError as error:
            target = f" {key!r}" if key is not None else ""
            raise ObjectStoreError(f"{operation}{target} failed: {error}", key=key) from error

    def _path(self, key: str) -> str:
        path = os.path.join(self._root, key)
        # validate_key already rules out escapes; this is a cheap lexical double check.
        if os.path.commonpath([self._root, os.path.normpath(path)]) != self._root:
            raise InvalidKey(f"key {key!r} escapes the store root", key=key)
        return path

    # -- blocking halves, run in the pool ------------------------------------------------------

    def _put_sync(self, key: str, chunks: builtins.list[memoryview], exclusive: bool) -> ObjectInfo:
        final = self._path(key)
        digest = hashlib.md5(usedforsecurity=False)
        size_bytes = 0
        descriptor, temp = tempfile.mkstemp(prefix="put-", suffix=".tmp", dir=self._staging)
        published = False
        try:
            try:
                for chunk in chunks:
                    digest.update(chunk)
                    _write_all(descriptor, chunk)
                    size_bytes += len(chunk)
                etag = digest.hexdigest()
                _store_etag(descriptor, etag)
                if self._fsync:
                    os.fsync(descriptor)
            finally:
                os.close(descriptor)
            self._publish(key, temp, final, exclusive)
            published = not exclusive  # a link leaves the temporary name behind
        finally:
            if not published:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
        return ObjectInfo(key=key, size_bytes=size_bytes, etag=etag)

    def _publish(self, key: str, temp: str, final: str, exclusive: bool) -> None:
        changed_dirs = {os.path.dirname(final)}
        for _ in range(_PUBLISH_ATTEMPTS):
            try:
                if exclusive:
                    os.link(temp, final)
                else:
                    os.replace(temp, final)
            except FileNotFoundError:
                # The key's directory does not exist yet, or a concurrent delete pruned it.
                with contextlib.suppress(FileNotFoundError):
                    changed_dirs.update(self._make_parent_dirs(key))
                continue
            except FileExistsError as error:
                if exclusive and not os.path.isdir(final):
                    raise PreconditionFailed(key) from error
                raise _directory_conflict(key) from error
            except (IsADirectoryError, NotADirectoryError) as error:
                raise _directory_conflict(key) from error
            if self._fsync:
                for directory in changed_dirs:
                    _fsync_directory(directory)
            return
        raise ObjectStoreError(
            f"could not publish {key!r}: its directory kept disappearing", key=key
        )

    def _make_parent_dirs(self, key: str) -> builtins.list[str]:
        """Create the key's missing directories; return the directories whose entries changed."""
        changed: builtins.list[str] = []
        current = self._root
        for segment in key.split("/")[:-1]:
            child = os.path.join(current, segment)
            try:
                os.mkdir(child)
            except FileExistsError:
                pass  # a file in the way shows up as NotADirectoryError on publish
            else:
                changed.append(current)
            current = child
        return changed

    def _get_sync(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as file:
                return file.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as error:
            raise NotFound(key) from error

    def _get_range_sync(self, key: str, start: int, end_exclusive: int) -> bytes:
        try:
            descriptor = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError) as error:
            raise NotFound(key) from error
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode):
                raise NotFound(key)
            if end_exclusive > status.st_size:
                raise RangeNotSatisfiable(key, start, end_exclusive, status.st_size)
            if start == end_exclusive:
                return b""
            parts: builtins.list[bytes] = []
            position = start
            while position < end_exclusive:
                part = os.pread(descriptor, end_exclusive - position, position)
                if not part:  # truncated under us; the store itself never truncates in place
                    raise RangeNotSatisfiable(key, start, end_exclusive, position)
                parts.append(part)
                position += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            os.close(descriptor)

    def _head_sync(self, key: str) -> ObjectInfo:
        try:
            descriptor = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError) as error:
            raise NotFound(key) from error
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode):
                raise NotFound(key)
            return ObjectInfo(
                key=key,
                size_bytes=status.st_size,
                etag=_load_etag(descriptor),
                last_modified=datetime.fromtimestamp(status.st_mtime, UTC),
            )
        finally:
            os.close(descriptor)

    def _list_sync(self, prefix: str) -> builtins.list[ObjectInfo]:
        dir_key, _, name_prefix = prefix.rpartition("/")
        start_dir = os.path.join(self._root, dir_key) if dir_key else self._root
        found: builtins.list[ObjectInfo] = []
        pending = [(start_dir, dir_key, name_prefix)]
        while pending:
            directory, directory_key, name_filter = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    listed = builtins.list(entries)
            except (FileNotFoundError, NotADirectoryError):
                continue  # no such prefix, or pruned by a concurrent delete
            for entry in listed:
                if not entry.name.startswith(name_filter):
                    continue
                if not directory_key and entry.name == STAGING_DIR_NAME:
                    continue
                key = f"{directory_key}/{entry.name}" if directory_key else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, key, ""))
                elif entry.is_file(follow_symlinks=False):
                    info = _entry_info(entry, key)
                    if info is not None:
                        found.append(info)
        found.sort(key=lambda info: info.key)
        return found

    def _delete_many_sync(self, keys: builtins.list[str]) -> None:
        failures: dict[str, str] = {}
        dirs_to_sync: set[str] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # already absent: deleting is idempotent
            except IsADirectoryError:
                continue  # a directory is not an object, so there is no object to delete
            except OSError as error:
                failures[key] = str(error)
                continue
            dirs_to_sync.add(self._prune_empty_dirs(key))
        if self._fsync:
            for directory in dirs_to_sync:
                with contextlib.suppress(FileNotFoundError):
                    _fsync_directory(directory)
        if failures:
            raise DeleteManyError(failures)

    def _prune_empty_dirs(self, key: str) -> str:
        """Remove directories the deletion left empty; return the deepest one that remains."""
        segments = key.split("/")[:-1]
        while segments:
            directory = os.path.join(self._root, *segments)
            try:
                os.rmdir(directory)
            except OSError:
                return directory  # not empty (or re-populated by a concurrent put)
            segments.pop()
        return self._root


def _directory_conflict(key: str) -> InvalidKey:
    return InvalidKey(
        f"key {key!r} collides with a directory or file of another key in the local store",
        key=key,
    )


def _write_all(descriptor: int, chunk: memoryview) -> None:
    written = 0
    while written < len(chunk):
        written += os.write(descriptor, chunk[written:])


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _store_etag(descriptor: int, etag: str) -> None:
    if hasattr(os, "setxattr"):
        with contextlib.suppress(OSError):  # no xattr support: computed on demand instead
            os.setxattr(descriptor, ETAG_XATTR_NAME, etag.encode("ascii"))


def _load_etag(descriptor: int) -> str:
    if hasattr(os, "getxattr"):
        with contextlib.suppress(OSError):
            return os.getxattr(descriptor, ETAG_XATTR_NAME).decode("ascii")
    digest = hashlib.md5(usedforsecurity=False)
    position = 0
    while block := os.pread(descriptor, 1 << 20, position):
        digest.update(block)
        position += len(block)
    return digest.hexdigest()


def _entry_info(entry: os.DirEntry[str], key: str) -> ObjectInfo | None:
    try:
        descriptor = os.open(entry.path, os.O_RDONLY)
    except FileNotFoundError:
        return None  # deleted while listing
    try:
        status = os.fstat(descriptor)
        return ObjectInfo(
            key=key,
            size_bytes=status.st_size,
            etag=_load_etag(descriptor),
            last_modified=datetime.fromtimestamp(status.st_mtime, UTC),
        )
    finally:
        os.close(descriptor)


# ---------------------------------------------------------------------------------------------
# S3 backend

_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "ConditionalRequestConflict",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_RETRYABLE_RAW_ERRORS: tuple[type[BaseException], ...] = (
    BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
    ChecksumError,
    aiohttp.ClientError,
    OSError,  # includes TimeoutError, ConnectionResetError
    EOFError,  # includes asyncio.IncompleteReadError
)
_MAPPED_RAW_ERRORS: tuple[type[BaseException], ...] = (
    ClientError,
    BotoCoreError,
    *_RETRYABLE_RAW_ERRORS,
)
_CLIENT_OPEN_ERRORS: tuple[type[BaseException], ...] = (*_MAPPED_RAW_ERRORS, ValueError)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def _client_error_details(error: Any) -> tuple[int | None, str, str]:
    response = getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    details = response.get("Error", {})
    return status, str(details.get("Code", "")), str(details.get("Message", ""))


def _is_retryable(error: BaseException) -> bool:
    if isinstance(error, ClientError):
        status, code, _ = _client_error_details(error)
        if code in _THROTTLING_CODES or code in _TRANSIENT_CODES:
            return True
        return status is not None and (status == 429 or (status >= 500 and status != 501))
    return isinstance(error, _RETRYABLE_RAW_ERRORS)


def _map_error(error: BaseException, operation: str, key: str | None) -> ObjectStoreError:
    """The final (non-retried) error for ``error``; the caller chains ``error`` as its cause."""
    target = f" {key!r}" if key is not None else ""
    if isinstance(error, ClientError):
        status, code, message = _client_error_details(error)
        if key is not None and (code in _NOT_FOUND_CODES or (status == 404 and not code)):
            return NotFound(key)
        if key is not None and status == 412:
            return PreconditionFailed(key)
        return ObjectStoreError(
            f"{operation}{target} failed: {code or 'error'} (HTTP {status}): {message}", key=key
        )
    return ObjectStoreError(f"{operation}{target} failed: {error!r}", key=key)


def _etag_from(response: dict[str, Any]) -> str:
    return str(response.get("ETag", "")).strip('"')


class S3ObjectStore(ObjectStore):
    """Objects in one S3 bucket, through aiobotocore, with AutoMQ's retry schedule."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        path_style: bool | None = None,
        max_attempts: int = 10,
        backoff_base_ms: int = 1000,
        backoff_max_ms: int = 60_000,
        backoff_jitter_ms: int = 1000,
        connect_timeout_ms: int = 10_000,
        read_timeout_ms: int = 60_000,
        max_pool_connections: int = 64,
        list_page_size: int = S3_LIST_PAGE_LIMIT,
        delete_batch_size: int = S3_DELETE_BATCH_LIMIT,
        random_unit: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        client: Any = None,
    ) -> None:
        """``client``: an already open S3 client to use instead of creating one (the store
        does not close it); tests pass fakes here. ``random_unit`` draws the jitter in [0, 1);
        ``sleep`` waits that many seconds."""
        if not bucket:
            raise ValueError("bucket must not be empty")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        if not 1 <= list_page_size <= S3_LIST_PAGE_LIMIT:
            raise ValueError(f"list_page_size must be in [1, {S3_LIST_PAGE_LIMIT}]")
        if not 1 <= delete_batch_size <= S3_DELETE_BATCH_LIMIT:
            raise ValueError(f"delete_batch_size must be in [1, {S3_DELETE_BATCH_LIMIT}]")
        self.bucket = bucket
        self._endpoint_url = endpoint_url
        self._region = region
        self._credentials = {
            "aws_access_key_id": access_key_id,
            "aws_secret_access_key": secret_access_key,
            "aws_session_token": session_token,
        }
        self._path_style = path_style
        self._max_attempts = max_attempts
        self._backoff_base_ms = backoff_base_ms
        self._backoff_max_ms = backoff_max_ms
        self._backoff_jitter_ms = backoff_jitter_ms
        self._connect_timeout_ms = connect_timeout_ms
        self._read_timeout_ms = read_timeout_ms
        self._max_pool_connections = max_pool_connections
        self._list_page_size = list_page_size
        self._delete_batch_size = delete_batch_size
        self._random_unit = random_unit
        self._sleep = sleep
        self._client: Any = client
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._client_lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={self._endpoint_url!r}" if self._endpoint_url else ""
        return f"S3ObjectStore({self.bucket!r}, region={self._region!r}{endpoint})"

    @property
    def region(self) -> str:
        return self._region

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    def retry_delay_ms(self, retry_index: int) -> float:
        """The wait before retry ``retry_index`` (0 for the first); draws one random number."""
        return backoff_delay_ms(
            retry_index,
            random_unit=self._random_unit(),
            backoff_base_ms=self._backoff_base_ms,
            backoff_max_ms=self._backoff_max_ms,
            backoff_jitter_ms=self._backoff_jitter_ms,
        )

    # -- the interface ---------------------------------------------------------------------

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        body = _join(data)

        async def attempt(client: Any, attempt_index: int) -> ObjectInfo:
            response = await client.put_object(Bucket=self.bucket, Key=key, Body=body)
            return ObjectInfo(key=key, size_bytes=len(body), etag=_etag_or_digest(response, body))

        return await self._with_retries("PutObject", key, attempt)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        body = _join(data)

        async def attempt(client: Any, attempt_index: int) -> ObjectInfo:
            try:
                response = await client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*"
                )
            except ClientError as error:
                if attempt_index > 0 and _client_error_details(error)[0] == 412:
                    return await self._resolve_ambiguous_conflict(key, body, error)
                raise
            return ObjectInfo(key=key, size_bytes=len(body), etag=_etag_or_digest(response, body))

        return await self._with_retries("PutObject(If-None-Match)", key, attempt)

    async def get(self, key: str) -> bytes:
        validate_key(key)

        async def attempt(client: Any, attempt_index: int) -> bytes:
            response = await client.get_object(Bucket=self.bucket, Key=key)
            async with response["Body"] as stream:
                return bytes(await stream.read())

        return await self._with_retries("GetObject", key, attempt)

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        _check_range(start, end_exclusive)
        validate_key(key)
        if start == end_exclusive:  # HTTP cannot express an empty range
            size_bytes = (await self.head(key)).size_bytes
            if start > size_bytes:
                raise RangeNotSatisfiable(key, start, end_exclusive, size_bytes)
            return b""

        async def attempt(client: Any, attempt_index: int) -> bytes:
            try:
                response = await client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end_exclusive - 1}"
                )
            except ClientError as error:
                status, code, _ = _client_error_details(error)
                if status == 416 or code == "InvalidRange":
                    size = error.response.get("Error", {}).get("ActualObjectSize")
                    size_bytes = int(size) if size is not None else None
                    raise RangeNotSatisfiable(key, start, end_exclusive, size_bytes) from error
                raise
            async with response["Body"] as stream:
                data = bytes(await stream.read())
            return _exact_range(key, start, end_exclusive, response.get("ContentRange"), data)

        return await self._with_retries("GetObject(Range)", key, attempt)

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)

        async def attempt(client: Any, attempt_index: int) -> ObjectInfo:
            response = await client.head_object(Bucket=self.bucket, Key=key)
            return ObjectInfo(
                key=key,
                size_bytes=int(response["ContentLength"]),
                etag=_etag_from(response),
                last_modified=response.get("LastModified"),
            )

        return await self._with_retries("HeadObject", key, attempt)

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        validate_prefix(prefix)
        found: builtins.list[ObjectInfo] = []
        continuation: str | None = None
        while True:
            page = await self._list_page(prefix, continuation)
            for item in page.get("Contents", []):
                found.append(
                    ObjectInfo(
                        key=item["Key"],
                        size_bytes=int(item["Size"]),
                        etag=_etag_from(item),
                        last_modified=item.get("LastModified"),
                    )
                )
            continuation = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not continuation:
                break
        found.sort(key=lambda info: info.key)
        return found

    async def delete(self, key: str) -> None:
        validate_key(key)

        async def attempt(client: Any, attempt_index: int) -> None:
            await client.delete_object(Bucket=self.bucket, Key=key)

        await self._with_retries("DeleteObject", key, attempt)

    async def delete_many(self, keys: Iterable[str]) -> None:
        unique_keys = builtins.list(dict.fromkeys(keys))
        for key in unique_keys:
            validate_key(key)
        failures: dict[str, str] = {}
        for first in range(0, len(unique_keys), self._delete_batch_size):
            batch = unique_keys[first : first + self._delete_batch_size]
            failures.update(await self._delete_batch(batch))
        if failures:
            raise DeleteManyError(failures)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            self._client = None
            try:
                await stack.aclose()
            except _MAPPED_RAW_ERRORS as error:
                log.warning("closing %r failed: %r", self, error)

    async def create_bucket_if_missing(self) -> None:
        """Create the bucket unless this account already owns it (tests, embedded setups)."""

        async def attempt(client: Any, attempt_index: int) -> None:
            arguments: dict[str, Any] = {"Bucket": self.bucket}
            if self._region != "us-east-1":
                arguments["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
            try:
                await client.create_bucket(**arguments)
            except ClientError as error:
                if _client_error_details(error)[1] != "BucketAlreadyOwnedByYou":
                    raise

        await self._with_retries("CreateBucket", None, attempt)

    # -- plumbing ----------------------------------------------------------------------------

    async def _get_client(self) -> Any:
        if self._closed:
            raise ObjectStoreError(f"{self!r} is closed")
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                try:
                    self._client = await stack.enter_async_context(self._create_client())
                except _CLIENT_OPEN_ERRORS as error:
                    await stack.aclose()
                    raise ObjectStoreError(f"cannot open an S3 client: {error}") from error
                self._exit_stack = stack
        return self._client

    def _create_client(self) -> Any:
        s3_options: dict[str, Any] = {}
        if self._path_style is not None:
            s3_options["addressing_style"] = "path" if self._path_style else "virtual"
        config = AioConfig(
            retries={"total_max_attempts": 1, "mode": "standard"},  # the retry policy is ours
            connect_timeout=self._connect_timeout_ms / 1000,
            read_timeout=self._read_timeout_ms / 1000,
            max_pool_connections=self._max_pool_connections,
            s3=s3_options,
        )
        return _shared_session().create_client(
            "s3",
            region_name=self._region,
            endpoint_url=self._endpoint_url,
            config=config,
            **{name: value for name, value in self._credentials.items() if value is not None},
        )

    async def _with_retries(
        self,
        operation: str,
        key: str | None,
        attempt: Callable[[Any, int], Awaitable[T]],
    ) -> T:
        client = await self._get_client()
        for attempt_index in range(self._max_attempts):
            try:
                return await attempt(client, attempt_index)
            except ObjectStoreError:
                raise
            except _MAPPED_RAW_ERRORS as error:
                if not _is_retryable(error):
                    raise _map_error(error, operation, key) from error
                target = f" {key!r}" if key is not None else ""
                if attempt_index + 1 >= self._max_attempts:
                    raise ObjectStoreUnavailable(
                        f"{operation}{target} failed {self._max_attempts} time(s); "
                        f"last error: {error!r}",
                        key=key,
                        attempts=self._max_attempts,
                    ) from error
                delay_ms = self.retry_delay_ms(attempt_index)
                log.warning(
                    "%s%s attempt %d/%d failed (%r); retrying in %.0f ms",
                    operation,
                    target,
                    attempt_index + 1,
                    self._max_attempts,
                    error,
                    delay_ms,
                )
                await self._sleep(delay_ms / 1000)
        raise AssertionError("unreachable: the loop returns or raises")

    async def _resolve_ambiguous_conflict(
        self, key: str, body: bytes, conflict: BaseException
    ) -> ObjectInfo:
        """412 on a retry: report success if the object is exactly what this call was writing."""
        try:
            existing = await self.head(key)
        except NotFound:
            raise PreconditionFailed(key) from conflict  # existed at 412 time, since deleted
        if existing.size_bytes == len(body) and (
            existing.etag == _md5_hex([body]) or await self.get(key) == body
        ):
            log.info("put_if_absent %r: 412 on retry, content is ours; earlier attempt landed", key)
            return ObjectInfo(key=key, size_bytes=len(body), etag=existing.etag)
        raise PreconditionFailed(key) from conflict

    async def _list_page(self, prefix: str, continuation: str | None) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": prefix,
            "MaxKeys": self._list_page_size,
        }
        if continuation is not None:
            arguments["ContinuationToken"] = continuation

        async def attempt(client: Any, attempt_index: int) -> dict[str, Any]:
            page: dict[str, Any] = await client.list_objects_v2(**arguments)
            return page

        return await self._with_retries("ListObjectsV2", None, attempt)

    def _delete_objects_attempt(
        self, keys: builtins.list[str]
    ) -> Callable[[Any, int], Awaitable[dict[str, Any]]]:
        objects = [{"Key": key} for key in keys]

        async def attempt(client: Any, attempt_index: int) -> dict[str, Any]:
            response: dict[str, Any] = await client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
            )
            return response

        return attempt

    async def _delete_batch(self, batch: builtins.list[str]) -> dict[str, str]:
        """Delete up to 1000 keys; per-key transient errors are retried on the same schedule."""
        failures: dict[str, str] = {}
        pending = batch
        for round_index in range(self._max_attempts):
            response = await self._with_retries(
                "DeleteObjects", None, self._delete_objects_attempt(pending)
            )
            retry_keys: builtins.list[str] = []
            last_round = round_index + 1 >= self._max_attempts
            for item in response.get("Errors", []):
                code = str(item.get("Code", ""))
                item_key = str(item.get("Key", ""))
                if not last_round and (code in _THROTTLING_CODES or code in _TRANSIENT_CODES):
                    retry_keys.append(item_key)
                else:
                    failures[item_key] = f"{code}: {item.get('Message', '')}"
            if not retry_keys:
                break
            delay_ms = self.retry_delay_ms(round_index)
            log.warning("DeleteObjects: %d key(s) failed transiently; retrying", len(retry_keys))
            await self._sleep(delay_ms / 1000)
            pending = retry_keys
        return failures


@functools.cache
def _shared_session() -> Any:
    """One aiobotocore session per process: building one loads botocore's models (~0.1 s).

    A session holds no event-loop state; each store still opens its own client.
    """
    return get_session()


def _join(data: Payload) -> bytes:
    chunks = _as_chunks(data)
    if (
        len(chunks) == 1
        and isinstance(chunks[0].obj, bytes)
        and len(chunks[0]) == len(chunks[0].obj)
    ):
        return chunks[0].obj  # already an immutable bytes object: no copy
    return b"".join(chunks)


def _etag_or_digest(response: dict[str, Any], body: bytes) -> str:
    etag = _etag_from(response)
    return etag if etag else _md5_hex([body])


def _exact_range(
    key: str, start: int, end_exclusive: int, content_range: str | None, data: bytes
) -> bytes:
    """Check a ranged GET's answer covers exactly ``[start, end_exclusive)``."""
    if content_range is None:  # the server ignored Range and sent the whole object
        size_bytes: int | None = len(data)
        data = data[start:end_exclusive]
    else:
        match = _CONTENT_RANGE.fullmatch(content_range.strip())
        total = match.group(3) if match else "*"
        size_bytes = int(total) if total != "*" else None
        if match is None or int(match.group(1)) != start:
            raise ObjectStoreError(
                f"GetObject(Range) {key!r}: unexpected Content-Range {content_range!r}", key=key
            )
    if len(data) != end_exclusive - start:
        raise RangeNotSatisfiable(key, start, end_exclusive, size_bytes)
    return data


# ---------------------------------------------------------------------------------------------
# Construction from a URI

_BUCKET_ID_PREFIX = re.compile(r"^\d+@")


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
        return S3ObjectStore(parts.netloc, **arguments)
    raise ValueError(f"unsupported object store URI {uri!r}: expected file:// or s3://")
