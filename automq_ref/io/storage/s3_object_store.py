"""The S3 object store: one bucket through aiobotocore, with AutoMQ's retry schedule.

:class:`S3ObjectStore` talks to S3 or an S3-compatible endpoint through aiobotocore. One client is
opened on entering the store (``async with``), or else on first use, and kept until
:meth:`close`. Opening one (botocore's service models, the endpoint, the credentials) takes about
0.1 s of CPU, 0.5 s on a busy machine: a broker pays it at start rather than in the first request
that needs the store, which can be the open of the first partition moved to it.

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
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self, TypeVar

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

from automq_ref.io.storage.object_store_contract import (
    DeleteManyError,
    NotFound,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    Payload,
    PreconditionFailed,
    RangeNotSatisfiable,
    as_chunks,
    check_range,
    md5_hex,
    validate_key,
    validate_prefix,
)
from automq_ref.io.storage.shaped_store import default_requests_in_flight

log = logging.getLogger(__name__)

T = TypeVar("T")

S3_DELETE_BATCH_LIMIT = 1000
S3_LIST_PAGE_LIMIT = 1000

_BACKOFF_EXPONENT_CAP = 16


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
        max_pool_connections: int | None = None,
        list_page_size: int = S3_LIST_PAGE_LIMIT,
        delete_batch_size: int = S3_DELETE_BATCH_LIMIT,
        random_unit: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        client: Any = None,
    ) -> None:
        """``client``: an already open S3 client to use instead of creating one (the store
        does not close it); tests pass fakes here. ``max_pool_connections`` by default holds
        both in-flight limits of a shaped store over this one (``shaped_store.py``), so reads
        in flight never leave a PUT waiting for a connection. ``random_unit`` draws the
        jitter in [0, 1); ``sleep`` waits that many seconds."""
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
        self._max_pool_connections = max_pool_connections or 2 * default_requests_in_flight()
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
        check_range(start, end_exclusive)
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

    async def __aenter__(self) -> Self:
        await self._get_client()
        return self

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
            existing.etag == md5_hex([body]) or await self.get(key) == body
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
    chunks = as_chunks(data)
    if (
        len(chunks) == 1
        and isinstance(chunks[0].obj, bytes)
        and len(chunks[0]) == len(chunks[0].obj)
    ):
        return chunks[0].obj  # already an immutable bytes object: no copy
    return b"".join(chunks)


def _etag_or_digest(response: dict[str, Any], body: bytes) -> str:
    etag = _etag_from(response)
    return etag if etag else md5_hex([body])


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
