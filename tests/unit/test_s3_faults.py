"""S3Storage behind the S3 fault proxy: what an S3 outage longer than the store's retries does.

Regression tests for two defects the proxy exposed:

- An upload whose object-store retries ran out (``ObjectStoreUnavailable``) failed the whole
  storage for good: every later append was refused until the broker restarted, although the data
  was safe in the WAL and S3 came back a moment later. Uploads are now retried until they land
  (an upload is a plain PUT of an already prepared object id, so repeating it is harmless); only
  a storage that is shutting down gives up, leaving the data to WAL recovery.
- A read from objects that failed raised the object store's own error out of ``S3Storage.read``;
  the Fetch handler catches ``StorageError`` only, so the client's connection was dropped (with
  every other partition of that Fetch). Object read failures are now ``StorageError``, answered
  as ``KAFKA_STORAGE_ERROR`` for that partition.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from automq_ref.checker.faults import MemoryBlockDevice
from automq_ref.checker.proxies import S3FaultProxy
from automq_ref.io.storage import s3stream
from automq_ref.io.storage.object_store import S3ObjectStore
from automq_ref.io.storage.s3stream import S3Storage, StorageError
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from tests.conftest import MotoS3
from tests.storage_fixtures import NODE_ID, start_storage
from tests.unit.test_object_store import fresh_bucket
from tests.waiting import PATIENCE_S, wait_until_async

PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=2000,
    upload_interval_ms=-1,
    stream_object_split_bytes=100_000,
    capacity_bytes=1000,  # committed blocks leave the cache at once: reads go to objects
)


@pytest.fixture
def proxy(moto_s3: MotoS3) -> Iterator[S3FaultProxy]:
    started = S3FaultProxy(moto_s3.endpoint_url, seed=5)
    started.start()
    yield started
    started.stop()


@contextlib.asynccontextmanager
async def running_storage(
    tmp_path: Path, moto_s3: MotoS3, proxy: S3FaultProxy, *, shut_down: bool = True
) -> AsyncIterator[S3Storage]:
    """S3Storage over the proxied store; on the way out the proxy heals, the storage shuts
    down (unless the test did that itself) and the store and metadata log close."""
    bucket = fresh_bucket()
    store = S3ObjectStore(
        bucket,
        endpoint_url=proxy.url,
        access_key_id=moto_s3.access_key_id,
        secret_access_key=moto_s3.secret_access_key,
        path_style=True,
        max_attempts=2,  # an outage of a few requests exhausts the store's own retries
        backoff_base_ms=5,
        backoff_max_ms=10,
        backoff_jitter_ms=1,
    )
    await store.create_bucket_if_missing()
    wal = await BlockWal.open(
        MemoryBlockDevice(1 << 20), node_id=NODE_ID, node_epoch=1, max_write_bytes=64 * 1024
    )
    running = await start_storage(
        tmp_path,
        wal,
        store,
        params=PARAMS,
        namespace="_kafka_faults",
        block_size_threshold_bytes=512,
    )
    try:
        yield running.storage
    finally:
        proxy.heal()
        await running.stop(shut_down=shut_down, close_store=True)


def payload(offset: int) -> bytes:
    return f"record {offset:05d} ".encode() * 10


async def test_an_upload_outlasting_the_store_retries_is_retried_after_heal(
    tmp_path: Path, moto_s3: MotoS3, proxy: S3FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3stream, "UPLOAD_RETRY_BASE_S", 0.1)
    async with running_storage(tmp_path, moto_s3, proxy) as storage:
        stream_id = await storage.create_stream()
        await storage.open_stream(stream_id, 0)
        proxy.set_faults(error_rate=1.0)
        for offset in range(5):  # acknowledged from the WAL while S3 refuses everything
            assert await storage.append(stream_id, 0, payload(offset), 1) == offset
        uploading = asyncio.create_task(storage.force_upload(lc.ALL_STREAMS))
        # The store gives up after 2 attempts; wait until it has done so at least twice.
        await wait_until_async(lambda: proxy.stats["errors_injected"] >= 4, "4 errors injected")
        await asyncio.sleep(0.1)
        assert not uploading.done() or uploading.exception() is None
        proxy.heal()
        await asyncio.wait_for(uploading, PATIENCE_S)
        # The storage is healthy: appends go on, and everything reads back from objects.
        for offset in range(5, 40):
            assert await storage.append(stream_id, 0, payload(offset), 1) == offset
        await storage.force_upload(lc.ALL_STREAMS)
        got = await storage.read(stream_id, 0, 40, 10**9)
        assert [bytes(batch.payload) for batch in got] == [payload(o) for o in range(40)]


async def test_a_failed_read_from_objects_is_a_storage_error(
    tmp_path: Path, moto_s3: MotoS3, proxy: S3FaultProxy
) -> None:
    async with running_storage(tmp_path, moto_s3, proxy) as storage:
        stream_id = await storage.create_stream()
        await storage.open_stream(stream_id, 0)
        for offset in range(40):
            await storage.append(stream_id, 0, payload(offset), 1)
        await storage.force_upload(lc.ALL_STREAMS)
        proxy.set_faults(error_rate=1.0)
        with pytest.raises(StorageError, match="SlowDown"):
            await storage.read(stream_id, 0, 40, 10**9)
        assert proxy.stats["errors_injected"] >= 2
        proxy.heal()
        got = await storage.read(stream_id, 0, 40, 10**9)
        assert [bytes(batch.payload) for batch in got] == [payload(o) for o in range(40)]


async def test_shutdown_gives_up_on_an_exhausted_upload_and_the_wal_keeps_the_data(
    tmp_path: Path, moto_s3: MotoS3, proxy: S3FaultProxy
) -> None:
    """Retrying forever must not make a graceful stop hang while S3 is down."""
    async with running_storage(tmp_path, moto_s3, proxy, shut_down=False) as storage:
        stream_id = await storage.create_stream()
        await storage.open_stream(stream_id, 0)
        proxy.set_faults(error_rate=1.0)
        for offset in range(5):
            await storage.append(stream_id, 0, payload(offset), 1)
        uploading = asyncio.create_task(storage.force_upload(lc.ALL_STREAMS))
        # Then it pauses to retry.
        await wait_until_async(lambda: proxy.stats["errors_injected"] >= 2, "2 errors injected")
        with pytest.raises(StorageError, match="SlowDown"):
            await asyncio.wait_for(storage.shutdown(), PATIENCE_S)
        with pytest.raises(StorageError):
            await uploading
