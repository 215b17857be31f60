"""The object-store contract: the :class:`ObjectStore` interface, its errors and values, the
portable key rules, and the payload helpers both backends share.

Every byte AutoMQ keeps for longer than a WAL record lives in an object store: StreamObjects,
StreamSetObjects, S3 WAL objects, reservation objects and router-channel packs. The rest of the
shell holds an :class:`ObjectStore` and never learns which backend it is
(``local_object_store.py``: a directory; ``s3_object_store.py``: S3 over aiobotocore;
``object_store.py`` builds either from a URI and re-exports all of them).

Theory of operation
-------------------

The contract (identical on both backends, checked by one test suite run against each):

- ``put(key, data)`` stores ``data`` (one bytes-like object or a sequence of chunks, written in
  order) under ``key``, replacing any previous object, and returns its :class:`ObjectInfo`. A reader
  sees either the old object or the new one, never a mix or a prefix.
- ``put_if_absent(key, data)`` does the same only if no object exists under ``key``; otherwise it
  raises :class:`PreconditionFailed`. Of several concurrent ``put_if_absent`` calls on one key, at
  most one succeeds (see each backend's caveats in its module).
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
  except the S3 store's ambiguity check (``s3_object_store.py``), which falls back to comparing
  bytes.)
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
"""

from __future__ import annotations

import abc
import builtins
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Self

from automq_ref.errors import KafkaError, KafkaErrorCode

Chunk = bytes | bytearray | memoryview
Payload = Chunk | Sequence[Chunk]

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 255
# The local store's staging directory; the key rules reserve it on both backends.
STAGING_DIR_NAME = ".automq-staging"


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


def check_range(start: int, end_exclusive: int) -> None:
    if not isinstance(start, int) or not isinstance(end_exclusive, int):
        raise ValueError("range bounds must be integers")
    if start < 0:
        raise ValueError(f"range start {start} is negative")
    if end_exclusive < start:
        raise ValueError(f"range end {end_exclusive} is before its start {start}")


def as_chunks(data: Payload) -> builtins.list[memoryview]:
    """View ``data`` as a list of byte-format memoryviews, without copying."""
    if isinstance(data, bytes | bytearray | memoryview):
        return [memoryview(data).cast("B")]
    chunks: builtins.list[memoryview] = []
    for chunk in data:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise TypeError(f"a chunk must be bytes-like, not {type(chunk).__name__}")
        chunks.append(memoryview(chunk).cast("B"))
    return chunks


def md5_hex(chunks: Iterable[Chunk]) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


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
