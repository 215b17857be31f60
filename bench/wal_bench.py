"""Block WAL append throughput and latency, beside the disk's own sequential write + fdatasync.

    python -m bench.wal_bench [--seconds 3] [--runs 3] [--dir bench/out] [--out FILE]

For each record size (1 KiB, 64 KiB, 1 MiB) and each number of concurrent writers (1, 64), every
writer appends in a loop for ``--seconds``; a record's latency runs from the call to ``append`` to
its completion (after the fsync that covers it). In the same run, and on the same file system,
the disk's limit is measured the plain way: one ``pwrite`` of the same size followed by one
``fdatasync``, in a loop, on a preallocated file. Each figure is the median over ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from automq_ref.io.storage.wal_block import MAX_GROUPS_IN_FLIGHT, BlockWal

WRITER_COUNTS = (1, 64)
CAPACITY_BYTES = 1024 * 1024 * 1024
MEGABYTE = 1_000_000


@dataclass
class Figures:
    throughput_mb_per_s: float
    p50_ms: float
    p99_ms: float
    syncs_per_s: float = 0.0


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def disk_baseline(directory: Path, size_bytes: int, seconds: float) -> Figures:
    path = directory / "disk-baseline"
    file_bytes = 512 * 1024 * 1024
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, file_bytes)
        os.fsync(fd)
        data = os.urandom(size_bytes)
        latencies: list[float] = []
        position = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            begin = time.perf_counter()
            os.pwrite(fd, data, position)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - begin)
            position = (position + size_bytes) % (file_bytes - size_bytes)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    latencies.sort()
    return Figures(
        len(latencies) * size_bytes / elapsed / MEGABYTE,
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
        len(latencies) / elapsed,
    )


async def wal_run(
    directory: Path, size_bytes: int, writers: int, seconds: float, groups_in_flight: int
) -> Figures:
    path = directory / "wal"
    wal = await BlockWal.open_file(
        path,
        node_id=1,
        node_epoch=1,
        capacity_bytes=CAPACITY_BYTES,
        max_groups_in_flight=groups_in_flight,
    )
    try:
        async for _ in wal.recover():
            pass
        await wal.reset()
        data = os.urandom(size_bytes)
        latencies: list[float] = []
        trimming = False
        started = time.perf_counter()
        syncs_before = wal.sync_count

        async def writer() -> None:
            nonlocal trimming
            while time.perf_counter() - started < seconds:
                begin = time.perf_counter()
                result = await wal.append(data)
                latencies.append(time.perf_counter() - begin)
                # Keep the ring half empty, as the upload path would, one trim at a time.
                used = result.next_offset - wal.start_offset
                if not trimming and used > wal.ring_capacity_bytes // 2:
                    trimming = True
                    try:
                        await wal.trim(result.next_offset)
                    finally:
                        trimming = False

        await asyncio.gather(*(writer() for _ in range(writers)))
        elapsed = time.perf_counter() - started
        syncs = wal.sync_count - syncs_before
    finally:
        await wal.close()
        path.unlink()
    latencies.sort()
    return Figures(
        len(latencies) * size_bytes / elapsed / MEGABYTE,
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
        syncs / elapsed,
    )


def median_figures(runs: list[Figures]) -> Figures:
    return Figures(
        statistics.median(run.throughput_mb_per_s for run in runs),
        statistics.median(run.p50_ms for run in runs),
        statistics.median(run.p99_ms for run in runs),
        statistics.median(run.syncs_per_s for run in runs),
    )


def human_size(size_bytes: int) -> str:
    return f"{size_bytes // 1024} KiB" if size_bytes < 1024 * 1024 else "1 MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--groups-in-flight", type=int, default=MAX_GROUPS_IN_FLIGHT)
    parser.add_argument("--sizes", default="1024,65536,1048576", help="record sizes in bytes")
    arguments = parser.parse_args()
    directory = arguments.dir or Path(tempfile.mkdtemp(prefix="wal-bench-", dir="."))
    directory.mkdir(parents=True, exist_ok=True)

    lines = [
        "| record | writers | WAL MB/s | WAL p50 ms | WAL p99 ms | syncs/s | "
        "disk MB/s (write+fdatasync) | disk p50 ms | WAL / disk |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size_bytes in (int(size) for size in arguments.sizes.split(",")):
        disk_runs: list[Figures] = []
        wal_runs: dict[int, list[Figures]] = {writers: [] for writers in WRITER_COUNTS}
        for _ in range(arguments.runs):
            # Interleave disk and WAL runs so both see the same background load.
            disk_runs.append(disk_baseline(directory, size_bytes, arguments.seconds))
            for writers in WRITER_COUNTS:
                figures = asyncio.run(
                    wal_run(
                        directory,
                        size_bytes,
                        writers,
                        arguments.seconds,
                        arguments.groups_in_flight,
                    )
                )
                wal_runs[writers].append(figures)
        disk = median_figures(disk_runs)
        for writers in WRITER_COUNTS:
            wal = median_figures(wal_runs[writers])
            ratio = wal.throughput_mb_per_s / disk.throughput_mb_per_s
            lines.append(
                f"| {human_size(size_bytes)} | {writers} | {wal.throughput_mb_per_s:.1f} | "
                f"{wal.p50_ms:.2f} | {wal.p99_ms:.2f} | {wal.syncs_per_s:.0f} | "
                f"{disk.throughput_mb_per_s:.1f} | {disk.p50_ms:.2f} | {ratio:.2f} |"
            )
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print()
    print(table)
    if arguments.out:
        arguments.out.write_text(table + "\n")
    if arguments.dir is None:
        directory.rmdir()


if __name__ == "__main__":
    main()
