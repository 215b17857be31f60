"""The local-directory object store, the embedded default: one file per object under a root.

:class:`LocalDirectoryObjectStore` (the embedded default) maps key ``a/b/c`` to ``<root>/a/b/c``.

- ``put`` writes a temporary file in ``<root>/.automq-staging/`` (syncing its data every
  ``SYNC_STEP_BYTES`` as it goes, so a large object never leaves the disk one long flush), fsyncs
  it, renames it over the final path with ``os.replace`` (atomic on POSIX) and fsyncs the final
  directory (and the parents of any directory it created), so an acknowledged put survives a
  crash and a crash leaves either the old object or the new one.
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
- Blocking file I/O runs in small dedicated thread pools (one for reads, one for writes, each of
  ``io_threads``, so queued reads never delay a put), never on the event loop. On the machine
  this was written on, the hop costs about 0.15 ms per call: a 4 KiB read takes 9 us inline and
  about 190 us through the pool, a fsynced 4 KiB put 0.7 ms inline and 1.0 ms through the pool.
  That price is paid because a read that misses the page cache or an fsync can stall for
  milliseconds, which on the event loop would stall every Kafka connection of the broker.
- A cancelled call stops waiting, but the thread finishes the operation: like an S3 request whose
  response was lost, a cancelled put may still land.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from automq_ref.io.storage.object_store_contract import (
    STAGING_DIR_NAME,
    DeleteManyError,
    InvalidKey,
    NotFound,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    Payload,
    PreconditionFailed,
    RangeNotSatisfiable,
    as_chunks,
    check_range,
    validate_key,
    validate_prefix,
)

T = TypeVar("T")

ETAG_XATTR_NAME = "user.automq_ref.etag"

_PUBLISH_ATTEMPTS = 8
# With fsync on, a put makes what it wrote durable each time this much more is written, so its
# final fsync flushes at most this much: a large object's dirty pages flushed at once held the
# write-ahead log's fdatasync on the same disk for tens of milliseconds (docs/benchmarks.md,
# Transactions).
SYNC_STEP_BYTES = 4 * 2**20
_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
# The operations that run on the write pool; the others run on the read pool.
_WRITES = frozenset({"put", "put_if_absent", "delete", "delete_many"})


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
        # Reads and writes on pools of their own: a burst of reads queued in one pool cannot
        # hold up a put (shaped_store.py keeps each side's requests in flight bounded).
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="object-store-read")
        self._write_executor = ThreadPoolExecutor(
            io_threads, thread_name_prefix="object-store-write"
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"LocalDirectoryObjectStore({self._root!r}, fsync={self._fsync})"

    @property
    def root(self) -> Path:
        return Path(self._root)

    # -- the interface ---------------------------------------------------------------------

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        return await self._run("put", key, self._put_sync, key, as_chunks(data), False)

    async def put_if_absent(self, key: str, data: Payload) -> ObjectInfo:
        validate_key(key)
        return await self._run("put_if_absent", key, self._put_sync, key, as_chunks(data), True)

    async def get(self, key: str) -> bytes:
        validate_key(key)
        return await self._run("get", key, self._get_sync, key)

    async def get_range(self, key: str, start: int, end_exclusive: int) -> bytes:
        check_range(start, end_exclusive)
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
        await asyncio.to_thread(self._write_executor.shutdown, True)

    # -- plumbing ----------------------------------------------------------------------------

    async def _run(
        self, operation: str, key: str | None, function: Callable[..., T], *args: Any
    ) -> T:
        if self._closed:
            raise ObjectStoreError(f"{operation}: {self!r} is closed", key=key)
        loop = asyncio.get_running_loop()
        try:
            executor = self._write_executor if operation in _WRITES else self._executor
            return await loop.run_in_executor(executor, functools.partial(function, *args))
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
                unsynced = 0
                for chunk in chunks:
                    digest.update(chunk)
                    rest = chunk
                    while rest:
                        piece = rest[: SYNC_STEP_BYTES - unsynced]
                        _write_all(descriptor, piece)
                        rest = rest[len(piece) :]
                        unsynced += len(piece)
                        if unsynced == SYNC_STEP_BYTES:
                            if self._fsync:
                                _fdatasync(descriptor)
                            unsynced = 0
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
                    # Gone if a concurrent delete of this key pruned it: that delete syncs what
                    # remains, as deletes do.
                    with contextlib.suppress(FileNotFoundError):
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
