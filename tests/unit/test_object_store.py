"""Object store contract: one suite, run against the local-directory and the S3 (moto) backends.

After the contract: what only the local backend can show (staging files, directory pruning,
etag fallback, races with pruning), then the S3 retry policy and error mapping, checked with
scripted fake clients and with a scripted HTTP server so that real aiobotocore exceptions are
involved, and finally the URI factory.
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from automq_ref.io.storage import local_object_store
from automq_ref.io.storage.object_store import (
    ETAG_XATTR_NAME,
    STAGING_DIR_NAME,
    CountingReads,
    DeleteManyError,
    InvalidKey,
    LocalDirectoryObjectStore,
    NotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    RangeNotSatisfiable,
    S3ObjectStore,
    ShapedObjectStore,
    backoff_delay_ms,
    open_object_store,
)
from tests.conftest import MotoS3
from tests.waiting import PATIENCE_S


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def fresh_bucket() -> str:
    return f"t-{uuid.uuid4().hex[:24]}"


async def no_sleep(seconds: float) -> None:
    return None


async def moto_store(moto_s3: MotoS3, bucket: str | None = None, **options: Any) -> S3ObjectStore:
    settings: dict[str, Any] = {
        "endpoint_url": moto_s3.endpoint_url,
        "region": moto_s3.region,
        "access_key_id": moto_s3.access_key_id,
        "secret_access_key": moto_s3.secret_access_key,
        # Small pages and batches so that every list and delete_many crosses page boundaries.
        "list_page_size": 7,
        "delete_batch_size": 7,
        "max_attempts": 3,
        "backoff_base_ms": 10,
        "backoff_max_ms": 100,
        "backoff_jitter_ms": 10,
    }
    settings.update(options)
    store = S3ObjectStore(bucket or fresh_bucket(), **settings)
    await store.create_bucket_if_missing()
    return store


async def assert_one_winner_per_key(
    stores: list[ObjectStore], *, rounds: int = 20, contenders: int = 20
) -> None:
    """Contenders race ``put_if_absent`` on one key per round, taking turns over ``stores``:
    exactly one wins, every other one gets PreconditionFailed, and the key holds the winner's."""
    for round_index in range(rounds):
        key = f"race/{round_index}"
        contents = [f"contender-{i}".encode() for i in range(contenders)]
        outcomes = await asyncio.gather(
            *(
                stores[i % len(stores)].put_if_absent(key, content)
                for i, content in enumerate(contents)
            ),
            return_exceptions=True,
        )
        winners = [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, Exception)]
        assert len(winners) == 1, outcomes
        losers = [outcome for i, outcome in enumerate(outcomes) if i != winners[0]]
        assert all(isinstance(outcome, PreconditionFailed) for outcome in losers), outcomes
        assert await stores[-1].get(key) == contents[winners[0]]


@pytest.fixture(params=["local", "s3", "shaped-local"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[ObjectStore]:
    created: ObjectStore
    if backend == "local":
        created = LocalDirectoryObjectStore(tmp_path / "objects")
    elif backend == "shaped-local":  # the contract holds through the request shaping too
        created = ShapedObjectStore(LocalDirectoryObjectStore(tmp_path / "objects"))
    else:
        created = await moto_store(request.getfixturevalue("moto_s3"))
    async with created:
        yield created


# ---------------------------------------------------------------------------------------------
# The contract, on both backends


@pytest.mark.parametrize("size_bytes", [0, 1, 4096, 3 * 1024 * 1024 + 7])
async def test_put_get_round_trip(store: ObjectStore, size_bytes: int) -> None:
    data = os.urandom(size_bytes)
    info = await store.put("stream/0001/object", data)
    assert (info.key, info.size_bytes, info.etag) == (
        "stream/0001/object",
        size_bytes,
        md5_hex(data),
    )
    assert info.last_modified is None
    assert await store.get("stream/0001/object") == data
    head = await store.head("stream/0001/object")
    assert (head.size_bytes, head.etag) == (size_bytes, md5_hex(data))
    assert isinstance(head.last_modified, datetime) and head.last_modified.tzinfo is not None


async def test_put_overwrites(store: ObjectStore) -> None:
    await store.put("k", b"first version")
    info = await store.put("k", b"second")
    assert await store.get("k") == b"second"
    assert (await store.head("k")).etag == info.etag == md5_hex(b"second")


async def test_put_accepts_chunks_and_buffer_types(store: ObjectStore) -> None:
    words = array.array("H", [1, 2, 3])
    chunks: list[bytes | bytearray | memoryview] = [
        b"ab",
        bytearray(b"cd"),
        memoryview(b"xefx")[1:3],
        memoryview(words),
        b"",
    ]
    expected = b"abcdef" + words.tobytes()
    info = await store.put("chunked", chunks)
    assert await store.get("chunked") == expected
    assert (info.size_bytes, info.etag) == (len(expected), md5_hex(expected))
    await store.put("sliced", memoryview(b"0123456789")[2:5])
    assert await store.get("sliced") == b"234"
    await store.put("no-chunks", [])
    assert await store.get("no-chunks") == b""


async def test_put_rejects_non_bytes_chunks(store: ObjectStore) -> None:
    with pytest.raises(TypeError):
        await store.put("k", ["text is not bytes"])  # type: ignore[list-item]


async def test_put_if_absent_success_then_conflict(store: ObjectStore) -> None:
    info = await store.put_if_absent("lock", b"node-1 epoch-3")
    assert (info.size_bytes, info.etag) == (14, md5_hex(b"node-1 epoch-3"))
    with pytest.raises(PreconditionFailed) as raised:
        await store.put_if_absent("lock", b"node-2 epoch-4")
    assert raised.value.key == "lock"
    assert await store.get("lock") == b"node-1 epoch-3"
    await store.delete("lock")
    await store.put_if_absent("lock", b"node-2 epoch-4")
    assert await store.get("lock") == b"node-2 epoch-4"


async def test_put_if_absent_conflicts_with_plain_put(store: ObjectStore) -> None:
    await store.put("k", b"plain")
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("k", b"conditional")
    assert await store.get("k") == b"plain"


async def test_put_if_absent_has_one_winner_under_concurrency(
    store: ObjectStore, backend: str
) -> None:
    if backend == "s3":
        pytest.skip("moto checks If-None-Match without a lock, so racing writers can both win")
    await assert_one_winner_per_key([store])


async def test_missing_object_is_not_found(store: ObjectStore) -> None:
    with pytest.raises(NotFound) as raised:
        await store.get("missing/key")
    assert raised.value.key == "missing/key"
    with pytest.raises(NotFound):
        await store.head("missing/key")
    with pytest.raises(NotFound):
        await store.get_range("missing/key", 0, 10)
    with pytest.raises(NotFound):
        await store.get_range("missing/key", 0, 0)


RANGE_DATA = bytes(range(256)) * 4


@pytest.mark.parametrize(
    ("start", "end_exclusive"),
    [(0, 1), (0, 1024), (100, 200), (1023, 1024), (512, 512), (0, 0), (1024, 1024)],
)
async def test_get_range_inside_the_object(
    store: ObjectStore, start: int, end_exclusive: int
) -> None:
    await store.put("ranged", RANGE_DATA)
    assert await store.get_range("ranged", start, end_exclusive) == RANGE_DATA[start:end_exclusive]


@pytest.mark.parametrize(
    ("start", "end_exclusive"), [(0, 1025), (1000, 2000), (1024, 1025), (1025, 1025), (4000, 5000)]
)
async def test_get_range_outside_the_object_is_not_satisfiable(
    store: ObjectStore, start: int, end_exclusive: int
) -> None:
    await store.put("ranged", RANGE_DATA)
    with pytest.raises(RangeNotSatisfiable) as raised:
        await store.get_range("ranged", start, end_exclusive)
    assert raised.value.size_bytes == len(RANGE_DATA)
    assert (raised.value.start, raised.value.end_exclusive) == (start, end_exclusive)


async def test_get_range_of_an_empty_object(store: ObjectStore) -> None:
    await store.put("empty", b"")
    assert await store.get_range("empty", 0, 0) == b""
    with pytest.raises(RangeNotSatisfiable):
        await store.get_range("empty", 0, 1)


@pytest.mark.parametrize(("start", "end_exclusive"), [(-1, 5), (5, 4), (0, -1)])
async def test_get_range_rejects_bad_arguments(
    store: ObjectStore, start: int, end_exclusive: int
) -> None:
    await store.put("ranged", RANGE_DATA)
    with pytest.raises(ValueError, match="range"):
        await store.get_range("ranged", start, end_exclusive)


LIST_KEYS = ["a/b/1", "a/b/2", "a/bc", "a/c/d/e", "ab", "b/1", "z"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", LIST_KEYS),
        ("a/", ["a/b/1", "a/b/2", "a/bc", "a/c/d/e"]),
        ("a/b", ["a/b/1", "a/b/2", "a/bc"]),
        ("a/b/", ["a/b/1", "a/b/2"]),
        ("a", ["a/b/1", "a/b/2", "a/bc", "a/c/d/e", "ab"]),
        ("a/c/d/e", ["a/c/d/e"]),
        ("a/c/d/e/", []),
        ("nothing", []),
        ("nothing/", []),
    ],
)
async def test_list_by_prefix(store: ObjectStore, prefix: str, expected: list[str]) -> None:
    for key in LIST_KEYS:
        await store.put(key, key.encode())
    listed = await store.list(prefix)
    assert [info.key for info in listed] == expected
    for info in listed:
        assert (info.size_bytes, info.etag) == (len(info.key), md5_hex(info.key.encode()))
        assert isinstance(info.last_modified, datetime)


async def test_list_crosses_pages(store: ObjectStore) -> None:
    inside = [f"p/{i:03d}" for i in range(25)]  # the S3 store lists 7 keys per page
    for key in [*inside, "q/1", "q/2", "o"]:
        await store.put(key, b"x")
    assert [info.key for info in await store.list("p/")] == inside
    assert len(await store.list()) == 28


async def test_unicode_keys(store: ObjectStore) -> None:
    keys = ["ü/ñ/ключ", "ü/ñ/键", "ü/plain"]
    for key in keys:
        await store.put(key, key.encode())
    assert [info.key for info in await store.list("ü/")] == sorted(keys)
    assert await store.get("ü/ñ/键") == "ü/ñ/键".encode()


async def test_delete_is_idempotent(store: ObjectStore) -> None:
    await store.delete("never/written")
    await store.put("d/k", b"data")
    await store.delete("d/k")
    with pytest.raises(NotFound):
        await store.get("d/k")
    await store.delete("d/k")
    assert await store.list() == []


async def test_delete_many(store: ObjectStore) -> None:
    doomed = [f"obj/{i:02d}" for i in range(20)]
    kept = ["obj/keep", "other/1"]
    for key in doomed + kept:
        await store.put(key, b"v")
    await store.delete_many([*doomed, "obj/never-existed", doomed[0]])
    assert [info.key for info in await store.list()] == sorted(kept)
    await store.delete_many([])
    await store.delete_many(iter(["obj/keep"]))
    assert [info.key for info in await store.list()] == ["other/1"]


INVALID_KEYS = [
    "",
    "/absolute",
    "..",
    ".",
    "a/../b",
    "../escape",
    "a/./b",
    "a//b",
    "trailing/",
    "nul\x00byte",
    "x" * 1025,
    "long/" + "s" * 256,
    "lone\ud800surrogate",
    f"{STAGING_DIR_NAME}/x",
]


@pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
async def test_invalid_keys_are_rejected(store: ObjectStore, key: str, tmp_path: Path) -> None:
    before = sorted(path.name for path in tmp_path.parent.iterdir())
    for call in (
        store.put(key, b"data"),
        store.put_if_absent(key, b"data"),
        store.get(key),
        store.get_range(key, 0, 1),
        store.head(key),
        store.delete(key),
        store.delete_many(["valid", key]),
    ):
        with pytest.raises(InvalidKey):
            await call
    assert sorted(path.name for path in tmp_path.parent.iterdir()) == before
    assert await store.list() == []


@pytest.mark.parametrize("prefix", ["/a", "../", "a/../", "a//", "x\x00", f"{STAGING_DIR_NAME}/"])
async def test_invalid_prefixes_are_rejected(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(InvalidKey):
        await store.list(prefix)


async def test_keys_are_case_and_dot_sensitive(store: ObjectStore) -> None:
    await store.put("Key", b"upper")
    await store.put("key", b"lower")
    await store.put(".hidden/..x", b"dots inside a segment are fine")
    assert await store.get("Key") == b"upper"
    assert await store.get("key") == b"lower"
    assert await store.get(".hidden/..x") == b"dots inside a segment are fine"


async def test_closed_store_refuses_calls(store: ObjectStore) -> None:
    await store.put("k", b"v")
    await store.close()
    with pytest.raises(ObjectStoreError, match="closed"):
        await store.get("k")
    await store.close()  # closing twice is fine


# ---------------------------------------------------------------------------------------------
# Local directory backend only


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalDirectoryObjectStore]:
    async with LocalDirectoryObjectStore(tmp_path / "objects") as created:
        yield created


async def test_local_layout_maps_keys_to_paths(local_store: LocalDirectoryObjectStore) -> None:
    await local_store.put("f9960000/_kafka_c/27039", b"object bytes")
    assert (local_store.root / "f9960000" / "_kafka_c" / "27039").read_bytes() == b"object bytes"


async def test_local_list_hides_staging_files(local_store: LocalDirectoryObjectStore) -> None:
    (local_store.root / STAGING_DIR_NAME / "put-leftover.tmp").write_bytes(b"crash leftover")
    await local_store.put("visible", b"v")
    assert [info.key for info in await local_store.list()] == ["visible"]
    assert await local_store.list(".automq") == []


async def test_local_leaves_no_temp_files(local_store: LocalDirectoryObjectStore) -> None:
    await local_store.put("a/1", b"x")
    await local_store.put_if_absent("a/2", b"y")
    with pytest.raises(PreconditionFailed):
        await local_store.put_if_absent("a/2", b"z")
    assert list((local_store.root / STAGING_DIR_NAME).iterdir()) == []


async def test_local_delete_prunes_empty_directories(
    local_store: LocalDirectoryObjectStore,
) -> None:
    await local_store.put("x/y/z/one", b"1")
    await local_store.put("x/y/two", b"2")
    await local_store.delete("x/y/z/one")
    assert sorted(p.name for p in local_store.root.iterdir()) == [STAGING_DIR_NAME, "x"]
    assert sorted(p.name for p in (local_store.root / "x" / "y").iterdir()) == ["two"]
    await local_store.delete_many(["x/y/two"])
    assert [p.name for p in local_store.root.iterdir()] == [STAGING_DIR_NAME]


async def test_local_object_and_directory_names_collide(
    local_store: LocalDirectoryObjectStore,
) -> None:
    await local_store.put("a/b", b"leaf")
    for collision in (
        local_store.put("a", b"would replace a directory"),
        local_store.put_if_absent("a", b"would replace a directory"),
        local_store.put("a/b/c", b"would need a directory where a file is"),
    ):
        with pytest.raises(InvalidKey):
            await collision
    for read in (local_store.get("a"), local_store.head("a"), local_store.get_range("a", 0, 1)):
        with pytest.raises(NotFound):
            await read
    await local_store.delete("a")  # a directory is no object: nothing to delete
    assert await local_store.get("a/b") == b"leaf"


async def test_local_etag_without_extended_attribute(
    local_store: LocalDirectoryObjectStore,
) -> None:
    await local_store.put("k", b"content")
    path = local_store.root / "k"
    if hasattr(os, "removexattr"):
        os.removexattr(path, ETAG_XATTR_NAME)
    assert (await local_store.head("k")).etag == md5_hex(b"content")
    assert (await local_store.list())[0].etag == md5_hex(b"content")


async def test_local_put_survives_concurrent_pruning(
    local_store: LocalDirectoryObjectStore,
) -> None:
    # Deleting the only object in a directory prunes it while other puts target that directory.
    for round_index in range(30):
        key = f"churn/{round_index % 3}/k"
        await asyncio.gather(
            local_store.put(f"{key}-a", b"a"),
            local_store.delete(f"{key}-a"),
            local_store.put(f"{key}-b", b"b"),
            local_store.delete(f"{key}-b"),
            local_store.put(f"{key}-c", b"c"),
        )
        assert await local_store.get(f"{key}-c") == b"c"
        await local_store.delete(f"{key}-c")


async def test_local_put_survives_its_key_deleted_and_pruned_before_the_directory_sync(
    local_store: LocalDirectoryObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the test above meets only now and then, on a busy machine: the put has
    renamed its object into place, and a concurrent delete of the key removes it and prunes the
    directory before the put syncs that directory."""
    sync = local_object_store._fsync_directory
    directory_of_key = str(local_store.root / "pruned")
    pruned: list[str] = []

    def delete_first(directory: str) -> None:
        if directory == directory_of_key and not pruned:
            os.unlink(os.path.join(directory, "k"))
            os.rmdir(directory)
            pruned.append(directory)
        sync(directory)

    monkeypatch.setattr(local_object_store, "_fsync_directory", delete_first)
    await local_store.put("pruned/k", b"v")
    assert pruned == [directory_of_key]
    with pytest.raises(NotFound):
        await local_store.get("pruned/k")


async def test_local_put_if_absent_across_store_instances(tmp_path: Path) -> None:
    # Two stores on one directory stand for two broker processes sharing it.
    async with (
        LocalDirectoryObjectStore(tmp_path / "shared") as first,
        LocalDirectoryObjectStore(tmp_path / "shared") as second,
    ):
        await assert_one_winner_per_key([first, second])


async def test_local_io_errors_are_mapped(local_store: LocalDirectoryObjectStore) -> None:
    (local_store.root / STAGING_DIR_NAME).rmdir()  # the next put cannot create its temp file
    with pytest.raises(ObjectStoreError) as raised:
        await local_store.put("k", b"v")
    assert isinstance(raised.value.__cause__, FileNotFoundError)
    assert type(raised.value) is ObjectStoreError


# ---------------------------------------------------------------------------------------------
# S3 backend only: retry policy and error mapping with scripted fake clients


def client_error(status: int, code: str, operation: str = "PutObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} message"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


class FakeBody:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aenter__(self) -> FakeBody:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def read(self) -> bytes:
        return self.data


@dataclass
class ScriptedClient:
    """A stand-in for an S3 client: each call takes the next scripted outcome of its operation.

    An outcome is an exception to raise, a callable of the call's arguments, or a value. The last
    outcome of an operation repeats.
    """

    scripts: dict[str, list[Any]]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        if operation not in self.scripts:
            raise AttributeError(operation)

        async def call(**arguments: Any) -> Any:
            self.calls.append((operation, arguments))
            script = self.scripts[operation]
            outcome = script.pop(0) if len(script) > 1 else script[0]
            if isinstance(outcome, BaseException):
                raise outcome
            if callable(outcome):
                return outcome(**arguments)
            return outcome

        return call

    def count(self, operation: str) -> int:
        return sum(1 for name, _ in self.calls if name == operation)


@dataclass
class SleepRecorder:
    seconds: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def recorded_store(**settings: Any) -> tuple[S3ObjectStore, SleepRecorder]:
    """An S3 store on ``bucket`` whose backoff sleeps are recorded, not slept."""
    sleeper = SleepRecorder()
    return S3ObjectStore("bucket", **{"sleep": sleeper, **settings}), sleeper


def scripted_store(client: ScriptedClient, **options: Any) -> tuple[S3ObjectStore, SleepRecorder]:
    return recorded_store(client=client, random_unit=lambda: 0.25, **options)


PUT_OK = {"ETag": '"etag"'}


@pytest.mark.parametrize(
    ("retry_index", "expected_ms"),
    [(0, 1000), (1, 2000), (2, 4000), (5, 32_000), (6, 60_000), (16, 60_000), (40, 60_000)],
)
def test_backoff_schedule_matches_automq(retry_index: int, expected_ms: int) -> None:
    assert backoff_delay_ms(retry_index, random_unit=0.0) == expected_ms
    assert backoff_delay_ms(retry_index, random_unit=0.999) == pytest.approx(expected_ms + 999)


def test_backoff_exponent_is_capped_at_16() -> None:
    huge_ms = 10**12
    assert backoff_delay_ms(16, random_unit=0, backoff_base_ms=1, backoff_max_ms=huge_ms) == 65536
    assert backoff_delay_ms(30, random_unit=0, backoff_base_ms=1, backoff_max_ms=huge_ms) == 65536
    with pytest.raises(ValueError):
        backoff_delay_ms(-1, random_unit=0)


async def test_s3_retries_503_then_succeeds() -> None:
    client = ScriptedClient(
        {"put_object": [client_error(503, "SlowDown"), client_error(503, "SlowDown"), PUT_OK]}
    )
    store, sleeper = scripted_store(client)
    info = await store.put("k", b"v")
    assert info.etag == "etag"
    assert client.count("put_object") == 3
    assert sleeper.seconds == [1.25, 2.25]  # jitter 0.25 * 1000 ms + 1000 ms * 2**n


async def test_s3_gives_up_after_max_attempts() -> None:
    failure = client_error(503, "SlowDown")
    client = ScriptedClient({"put_object": [failure]})
    store, sleeper = scripted_store(client, max_attempts=4, backoff_max_ms=3000)
    with pytest.raises(ObjectStoreUnavailable) as raised:
        await store.put("k", b"v")
    assert raised.value.attempts == 4 and raised.value.key == "k"
    assert raised.value.__cause__ is failure
    assert client.count("put_object") == 4
    assert sleeper.seconds == [1.25, 2.25, 3.25]


RETRYABLE_FAILURES = [
    client_error(503, "SlowDown"),
    client_error(429, "TooManyRequests"),
    client_error(500, "InternalError"),
    client_error(502, "BadGateway"),
    client_error(400, "RequestTimeout"),
    client_error(400, "Throttling"),
    client_error(400, "RequestLimitExceeded"),
    client_error(409, "ConditionalRequestConflict"),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    aiohttp.ClientPayloadError("truncated body"),
    aiohttp.ServerDisconnectedError(),
    ConnectionResetError("reset by peer"),
    TimeoutError(),
]


@pytest.mark.parametrize("failure", RETRYABLE_FAILURES, ids=repr)
async def test_s3_retries_transient_failures(failure: BaseException) -> None:
    client = ScriptedClient({"get_object": [failure, {"Body": FakeBody(b"data")}]})
    store, sleeper = scripted_store(client)
    assert await store.get("k") == b"data"
    assert client.count("get_object") == 2 and len(sleeper.seconds) == 1


@pytest.mark.parametrize(
    ("failure", "expected_type"),
    [
        (client_error(403, "AccessDenied"), ObjectStoreError),
        (client_error(404, "NoSuchKey"), NotFound),
        (client_error(404, "NoSuchBucket"), ObjectStoreError),
        (client_error(400, "InvalidArgument"), ObjectStoreError),
        (client_error(501, "NotImplemented"), ObjectStoreError),
        (NoCredentialsError(), ObjectStoreError),
        (ParamValidationError(report="bad parameter"), ObjectStoreError),
    ],
    ids=repr,
)
async def test_s3_does_not_retry_permanent_failures(
    failure: BaseException, expected_type: type[ObjectStoreError]
) -> None:
    client = ScriptedClient({"get_object": [failure]})
    store, sleeper = scripted_store(client)
    with pytest.raises(ObjectStoreError) as raised:
        await store.get("k")
    assert type(raised.value) is expected_type
    assert raised.value.__cause__ is failure
    assert client.count("get_object") == 1 and sleeper.seconds == []


RAW_FAILURES = [
    client_error(500, "InternalError"),
    client_error(403, "AccessDenied"),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    NoCredentialsError(),
    aiohttp.ClientConnectionError("refused"),
    OSError("disk"),
    asyncio.IncompleteReadError(b"", 10),
]
OPERATIONS: list[Callable[[S3ObjectStore], Any]] = [
    lambda store: store.put("k", b"v"),
    lambda store: store.put_if_absent("k", b"v"),
    lambda store: store.get("k"),
    lambda store: store.get_range("k", 0, 1),
    lambda store: store.get_range("k", 0, 0),
    lambda store: store.head("k"),
    lambda store: store.list("p/"),
    lambda store: store.delete("k"),
    lambda store: store.delete_many(["k", "l"]),
    lambda store: store.create_bucket_if_missing(),
]


@pytest.mark.parametrize("failure", RAW_FAILURES, ids=repr)
@pytest.mark.parametrize("operation", OPERATIONS, ids=range(len(OPERATIONS)))
async def test_s3_raw_errors_never_escape(
    failure: BaseException, operation: Callable[[S3ObjectStore], Any]
) -> None:
    names = ["put_object", "get_object", "head_object", "list_objects_v2", "delete_object"]
    client = ScriptedClient(
        {name: [failure] for name in [*names, "delete_objects", "create_bucket"]}
    )
    store, _ = scripted_store(client, max_attempts=2)
    with pytest.raises(ObjectStoreError) as raised:
        await operation(store)
    assert raised.value.__cause__ is failure


class LandedThenLost:
    """put_object whose first attempt stores the content but loses the response."""

    def __init__(self, stored_by_other: bytes | None = None) -> None:
        self.stored: bytes | None = stored_by_other

    def put_object(self, Body: bytes, IfNoneMatch: str, **arguments: Any) -> dict[str, str]:
        if self.stored is not None:
            raise client_error(412, "PreconditionFailed")
        self.stored = Body
        raise ReadTimeoutError(endpoint_url="http://127.0.0.1:1")

    def head_object(self, **arguments: Any) -> dict[str, Any]:
        assert self.stored is not None
        return {"ContentLength": len(self.stored), "ETag": f'"{md5_hex(self.stored)}"'}


async def test_s3_put_if_absent_retry_recognises_its_own_write() -> None:
    landed = LandedThenLost()
    client = ScriptedClient(
        {"put_object": [landed.put_object], "head_object": [landed.head_object]}
    )
    store, sleeper = scripted_store(client)
    info = await store.put_if_absent("lock", b"node-1 epoch-7")
    assert info.etag == md5_hex(b"node-1 epoch-7")
    assert client.count("put_object") == 2 and len(sleeper.seconds) == 1


async def test_s3_put_if_absent_retry_still_detects_a_competitor() -> None:
    landed = LandedThenLost()

    def competitor_wins(**arguments: Any) -> dict[str, str]:
        landed.stored = b"node-2 epoch-8"  # same length, other content
        raise ReadTimeoutError(endpoint_url="http://127.0.0.1:1")

    client = ScriptedClient(
        {
            "put_object": [competitor_wins, landed.put_object],
            "head_object": [landed.head_object],
            "get_object": [lambda **arguments: {"Body": FakeBody(landed.stored or b"")}],
        }
    )
    store, _ = scripted_store(client)
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("lock", b"node-1 epoch-7")


async def test_s3_put_if_absent_retry_compares_bytes_when_etag_is_not_md5() -> None:
    landed = LandedThenLost()
    client = ScriptedClient(
        {
            "put_object": [landed.put_object],
            "head_object": [{"ContentLength": 14, "ETag": '"kms-etag-not-an-md5"'}],
            "get_object": [lambda **arguments: {"Body": FakeBody(landed.stored or b"")}],
        }
    )
    store, _ = scripted_store(client)
    info = await store.put_if_absent("lock", b"node-1 epoch-7")
    assert info.etag == "kms-etag-not-an-md5"
    assert client.count("get_object") == 1


async def test_s3_put_if_absent_first_attempt_412_is_final() -> None:
    client = ScriptedClient({"put_object": [client_error(412, "PreconditionFailed")]})
    store, sleeper = scripted_store(client)
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("lock", b"v")
    assert client.calls == [client.calls[0]] and sleeper.seconds == []
    assert client.calls[0][1]["IfNoneMatch"] == "*"


async def test_s3_delete_many_batches_at_1000_keys() -> None:
    client = ScriptedClient({"delete_objects": [{}]})
    store, _ = scripted_store(client)
    await store.delete_many(f"k{i}" for i in range(2500))
    sizes = [len(arguments["Delete"]["Objects"]) for _, arguments in client.calls]
    assert sizes == [1000, 1000, 500]
    deleted = [
        item["Key"] for _, arguments in client.calls for item in arguments["Delete"]["Objects"]
    ]
    assert deleted == [f"k{i}" for i in range(2500)]


async def test_s3_delete_many_reports_per_key_failures_and_retries_transient_ones() -> None:
    def first_round(**arguments: Any) -> dict[str, Any]:
        return {
            "Errors": [
                {"Key": "denied", "Code": "AccessDenied", "Message": "no"},
                {"Key": "busy", "Code": "SlowDown", "Message": "later"},
            ]
        }

    client = ScriptedClient({"delete_objects": [first_round, {}]})
    store, sleeper = scripted_store(client)
    with pytest.raises(DeleteManyError) as raised:
        await store.delete_many(["ok", "denied", "busy"])
    assert list(raised.value.failures) == ["denied"]
    assert "AccessDenied" in raised.value.failures["denied"] and "denied" in str(raised.value)
    retried = client.calls[1][1]["Delete"]["Objects"]
    assert retried == [{"Key": "busy"}] and len(sleeper.seconds) == 1


async def test_s3_list_follows_continuation_tokens() -> None:
    pages = [
        {
            "IsTruncated": True,
            "NextContinuationToken": "t1",
            "Contents": [{"Key": "p/2", "Size": 1, "ETag": '"b"'}],
        },
        {"IsTruncated": False, "Contents": [{"Key": "p/1", "Size": 2, "ETag": '"a"'}]},
    ]
    client = ScriptedClient({"list_objects_v2": pages})
    store, _ = scripted_store(client)
    listed = await store.list("p/")
    assert [(info.key, info.size_bytes, info.etag) for info in listed] == [
        ("p/1", 2, "a"),
        ("p/2", 1, "b"),
    ]
    assert "ContinuationToken" not in client.calls[0][1]
    assert client.calls[1][1]["ContinuationToken"] == "t1"


# ---------------------------------------------------------------------------------------------
# S3 backend only: real aiobotocore against a scripted HTTP server, moto, and a closed port


@dataclass
class ScriptedHttpServer:
    """Answers each request with the next scripted (status, headers, body); the last repeats."""

    responses: list[tuple[int, dict[str, str], bytes]]
    requests: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.requests.append(head.split(b"\r\n", 1)[0].decode())
        status, headers, body = (
            self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        )
        lines = [f"HTTP/1.1 {status} Scripted", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        writer.close()


SLOW_DOWN = (
    503,
    {"Content-Type": "application/xml"},
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
)
ACCESS_DENIED = (
    403,
    {"Content-Type": "application/xml"},
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
    b"<Message>Access Denied</Message></Error>",
)
OBJECT = (200, {"Content-Type": "application/octet-stream", "ETag": '"abc"'}, b"payload")


def http_store(endpoint_url: str, **options: Any) -> tuple[S3ObjectStore, SleepRecorder]:
    settings: dict[str, Any] = {
        "endpoint_url": endpoint_url,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        # Hang guards: the scripted server answers at once, and a timeout would be counted as
        # one more attempt.
        "connect_timeout_ms": int(PATIENCE_S * 1000),
        "read_timeout_ms": int(PATIENCE_S * 1000),
    }
    return recorded_store(**{**settings, **options})


@pytest.mark.parametrize(
    ("script", "max_attempts", "outcome", "requests"),
    [
        ([SLOW_DOWN, SLOW_DOWN, OBJECT], 5, b"payload", 3),
        ([SLOW_DOWN], 3, ObjectStoreUnavailable, 3),
        ([ACCESS_DENIED], 5, ObjectStoreError, 1),
    ],
    ids=["503-then-ok", "503-forever", "403"],
)
async def test_s3_retry_policy_over_http(
    script: list[tuple[int, dict[str, str], bytes]],
    max_attempts: int,
    outcome: bytes | type[ObjectStoreError],
    requests: int,
) -> None:
    server = ScriptedHttpServer(list(script))
    store, sleeper = http_store(await server.start(), max_attempts=max_attempts)
    try:
        async with store:
            if isinstance(outcome, bytes):
                assert await store.get("k") == outcome
            else:
                with pytest.raises(outcome) as raised:
                    await store.get("k")
                assert type(raised.value) is outcome
                assert isinstance(raised.value.__cause__, ClientError)
    finally:
        await server.stop()
    # One HTTP request per attempt of ours: botocore's own retries are off.
    assert len(server.requests) == requests
    assert all(line.startswith("GET /bucket/k ") for line in server.requests)
    assert len(sleeper.seconds) == requests - 1


async def test_s3_unreachable_endpoint_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store, sleeper = http_store(f"http://127.0.0.1:{port}", max_attempts=2)
    async with store:
        with pytest.raises(ObjectStoreUnavailable) as raised:
            await store.head("k")
    assert raised.value.attempts == 2 and len(sleeper.seconds) == 1
    assert raised.value.__cause__ is not None
    assert type(raised.value.__cause__).__module__.startswith(
        ("botocore", "aiobotocore", "aiohttp")
    )


async def test_s3_client_opens_on_entering_the_store() -> None:
    """A broker builds its S3 client when it starts (``async with``), not in the first request
    (the open of the first partition moved to it); building one contacts nobody."""
    with socket.socket() as probe:  # a port nobody listens on: nothing is sent
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store, _ = http_store(f"http://127.0.0.1:{port}")
    assert store._client is None
    async with store:
        assert store._client is not None
    assert store._client is None


async def test_s3_missing_bucket_is_an_error_not_a_missing_key(moto_s3: MotoS3) -> None:
    store = S3ObjectStore(
        fresh_bucket(),
        endpoint_url=moto_s3.endpoint_url,
        access_key_id=moto_s3.access_key_id,
        secret_access_key=moto_s3.secret_access_key,
    )
    async with store:
        with pytest.raises(ObjectStoreError) as raised:
            await store.get("k")
        assert not isinstance(raised.value, NotFound)
        assert "NoSuchBucket" in str(raised.value)


async def test_s3_create_bucket_if_missing_is_idempotent(moto_s3: MotoS3) -> None:
    bucket = fresh_bucket()
    async with await moto_store(moto_s3, bucket) as store:
        await store.create_bucket_if_missing()
        await store.put("k", b"v")
        await store.create_bucket_if_missing()
        assert await store.get("k") == b"v"


# ---------------------------------------------------------------------------------------------
# The URI factory


def test_open_object_store_parses_automq_bucket_uris() -> None:
    store = open_object_store(
        "0@s3://my-bucket?region=eu-west-1&endpoint=http://127.0.0.1:9000&pathStyle=true"
        "&batchInterval=250"
    )
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.region, store.endpoint_url) == (
        "my-bucket",
        "eu-west-1",
        "http://127.0.0.1:9000",
    )
    plain = open_object_store("s3://other")
    assert isinstance(plain, S3ObjectStore)
    assert (plain.bucket, plain.region, plain.endpoint_url) == ("other", "us-east-1", None)


async def test_open_object_store_file_uri(tmp_path: Path) -> None:
    async with open_object_store(f"file://{tmp_path}/objects", fsync=False) as store:
        assert isinstance(store, LocalDirectoryObjectStore)
        assert store.root == tmp_path / "objects"
        await store.put("k", b"v")
    assert (tmp_path / "objects" / "k").read_bytes() == b"v"


@pytest.mark.parametrize("uri", ["file://somehost/x", "gs://bucket", "s3://", "file://", "/plain"])
def test_open_object_store_rejects_bad_uris(uri: str) -> None:
    with pytest.raises(ValueError):
        open_object_store(uri)


async def test_open_object_store_round_trip_against_moto(moto_s3: MotoS3) -> None:
    bucket = fresh_bucket()
    uri = f"1@s3://{bucket}?region={moto_s3.region}&endpoint={moto_s3.endpoint_url}"
    store = open_object_store(
        uri, access_key_id=moto_s3.access_key_id, secret_access_key=moto_s3.secret_access_key
    )
    assert isinstance(store, S3ObjectStore)
    async with store:
        await store.create_bucket_if_missing()
        await store.put("k", b"via uri")
        assert await store.get("k") == b"via uri"


async def test_counting_reads_counts_gets_and_their_bytes(tmp_path: Path) -> None:
    counted = CountingReads(LocalDirectoryObjectStore(tmp_path / "objects"))
    async with counted:
        await counted.put("a/b", b"0123456789")
        assert (counted.gets, counted.get_bytes) == (0, 0)  # writes are not counted
        assert await counted.get_range("a/b", 2, 5) == b"234"
        assert await counted.get("a/b") == b"0123456789"
        assert (await counted.head("a/b")).size_bytes == 10
        assert [info.key for info in await counted.list("a/")] == ["a/b"]
        assert (counted.gets, counted.get_bytes) == (2, 13)
        with pytest.raises(NotFound):
            await counted.get("a/missing")
        assert (counted.gets, counted.get_bytes) == (2, 13)  # a failed GET returned nothing
        await counted.delete("a/b")
        assert await counted.list() == []


@pytest.mark.parametrize("fsync", [True, False])
async def test_local_put_syncs_its_data_every_step_as_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    # Where each data sync came, as the file's size then: at every multiple of SYNC_STEP_BYTES,
    # however the payload is cut into chunks (the rest is the final fsync's), none with fsync off.
    synced_at: list[int] = []

    def recording_sync(descriptor: int) -> None:
        synced_at.append(os.fstat(descriptor).st_size)

    monkeypatch.setattr(local_object_store, "_fdatasync", recording_sync)
    step = local_object_store.SYNC_STEP_BYTES
    payload = bytes(range(256)) * ((2 * step + step // 2) // 256)
    chunks = [payload[: step // 3], payload[step // 3 : 2 * step + 7], payload[2 * step + 7 :]]
    async with LocalDirectoryObjectStore(tmp_path / "objects", fsync=fsync) as store:
        info = await store.put("big", chunks)
        assert await store.get("big") == payload
    assert info.size_bytes == len(payload)
    assert info.etag == md5_hex(payload)
    assert synced_at == ([step, 2 * step] if fsync else [])
