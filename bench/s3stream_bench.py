"""S3Storage append throughput, p99 latency and object PUTs per GB written.

    python -m bench.s3stream_bench [--gib 1] [--streams 1,16,1000] [--concurrency 16]

1 MiB appends spread round-robin over N streams by ``--concurrency`` writers, on a block WAL file
and a local-directory object store in one temporary directory, with the controller on a file
metadata log. The LogCache uses AutoMQ's defaults where they apply: upload threshold 500 MiB,
stream object split 8 MiB. PUTs are counted by wrapping the object store; "PUTs per GB" counts
every object written (data objects only: the local store has no multipart upload).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectInfo, Payload
from automq_ref.io.storage.wal_block import BlockWal
from automq_ref.state_machines import log_cache as lc
from tests.storage_fixtures import NODE_ID, start_storage

RECORD_BYTES = 1024 * 1024
PARAMS = lc.LogCacheParams(
    upload_threshold_bytes=500 * 1024 * 1024,
    upload_interval_ms=60_000,
    stream_object_split_bytes=8 * 1024 * 1024,
    capacity_bytes=2 * 1024 * 1024 * 1024,
)


class CountingStore(LocalDirectoryObjectStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts = 0

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        self.puts += 1
        return await super().put(key, data)


async def run(directory: Path, streams: int, total_bytes: int, concurrency: int) -> str:
    wal = await BlockWal.open_file(
        directory / "wal", node_id=NODE_ID, node_epoch=1, capacity_bytes=2 * 1024 * 1024 * 1024
    )
    store = CountingStore(directory / "objects")
    running = await start_storage(directory, wal, store, params=PARAMS, namespace="_kafka_bench")
    storage = running.storage
    stream_ids = [await storage.create_stream() for _ in range(streams)]
    for stream_id in stream_ids:
        await storage.open_stream(stream_id, 0)
    payload = os.urandom(RECORD_BYTES)
    records = total_bytes // RECORD_BYTES
    latencies: list[float] = []
    next_record = 0

    async def writer() -> None:
        nonlocal next_record
        while next_record < records:
            stream_id = stream_ids[next_record % streams]
            next_record += 1
            begin = time.perf_counter()
            await storage.append(stream_id, 0, payload, 1)
            latencies.append(time.perf_counter() - begin)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(concurrency)))
    append_seconds = time.perf_counter() - started
    await storage.shutdown()  # uploads the tail, as a graceful stop does
    total_seconds = time.perf_counter() - started
    await running.metadata_log.close()
    latencies.sort()
    written_gb = records * RECORD_BYTES / 1e9
    return (
        f"| {streams} | {records * RECORD_BYTES / 2**20:.0f} | "
        f"{records * RECORD_BYTES / append_seconds / 1e6:.0f} | "
        f"{statistics.median(latencies) * 1000:.1f} | "
        f"{latencies[int(len(latencies) * 0.99)] * 1000:.1f} | {store.puts} | "
        f"{store.puts / written_gb:.1f} | {total_seconds:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--streams", default="1,16,1000")
    parser.add_argument("--concurrency", type=int, default=16)
    arguments = parser.parse_args()
    print(
        "| streams | MiB written | append MB/s | p50 ms | p99 ms | PUTs | PUTs per GB | "
        "seconds incl. final upload |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for streams in (int(n) for n in arguments.streams.split(",")):
        with tempfile.TemporaryDirectory(prefix="s3stream-bench-", dir=".") as directory:
            row = asyncio.run(
                run(
                    Path(directory),
                    streams,
                    int(arguments.gib * 2**30),
                    arguments.concurrency,
                )
            )
        print(row, flush=True)


if __name__ == "__main__":
    main()
