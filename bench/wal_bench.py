"""Block WAL append throughput and latency, beside the disk's own sequential write + fdatasync.

    python -m bench.wal_bench [--seconds 3] [--runs 3] [--dir bench/out] [--out FILE]
    python -m bench.wal_bench --targets file,direct,device [--capacity-mib 256]

For each record size (1 KiB, 64 KiB, 1 MiB) and each number of concurrent writers (1, 64), every
writer appends in a loop for ``--seconds``; a record's latency runs from the call to ``append`` to
its completion (after the fsync that covers it). In the same run, and on the same file system,
the disk's limit is measured the plain way: one ``pwrite`` of the same size followed by one
``fdatasync``, in a loop, on a preallocated file. Each figure is the median over ``--runs``.

``--targets`` compares where the block WAL lives instead, side by side (each run goes through
every target in turn): ``file`` (the embedded default: a preallocated file, buffered writes and
``fdatasync``), ``direct`` (a loop device over a sparse file in ``--dir``, opened with
``O_DIRECT``; needs root and ``losetup``) and ``device`` (a file served by a WAL device process,
``python -m automq_ref.io.storage.wal_device``, over a Unix socket: every group crosses the
socket twice, once for the write and once for the flush).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from automq_ref.io.storage.block_device import DirectBlockDevice
from automq_ref.io.storage.wal_block import MAX_GROUPS_IN_FLIGHT, BlockWal

TARGETS = ("file", "direct", "device")

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


@contextlib.contextmanager
def loop_device(backing: Path, size_bytes: int) -> Iterator[Path]:
    """A loop device over a new sparse file, detached on the way out."""
    with open(backing, "wb") as file:
        file.truncate(size_bytes)
    attached = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=True
    )
    device = Path(attached.stdout.strip())
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", str(device)], check=False)
        backing.unlink()


@contextlib.asynccontextmanager
async def target_wal(
    target: str,
    directory: Path,
    capacity_bytes: int,
    groups_in_flight: int,
    raw_device: Path | None,
) -> AsyncIterator[BlockWal]:
    """A fresh, formatted block WAL on ``target`` (see the module docstring)."""
    if target == "file":
        path = directory / "wal"
        wal = await BlockWal.open_file(
            path,
            node_id=1,
            node_epoch=1,
            capacity_bytes=capacity_bytes,
            max_groups_in_flight=groups_in_flight,
        )
        try:
            yield wal
        finally:
            await wal.close()
            path.unlink()
    elif target == "direct":
        assert raw_device is not None
        blank = DirectBlockDevice(raw_device, capacity_bytes)  # forget the last run's WAL
        blank.write([bytes(8192)], 0)
        blank.sync()
        blank.close()
        wal = await BlockWal.open_file(
            raw_device,
            node_id=1,
            node_epoch=1,
            capacity_bytes=capacity_bytes,
            max_groups_in_flight=groups_in_flight,
        )
        try:
            yield wal
        finally:
            await wal.close()
    else:
        path, sock = directory / "device-wal", directory / "wal-device.sock"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "automq_ref.io.storage.wal_device",
                f"--path={path}",
                f"--size={capacity_bytes}",
                f"--listen={sock}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert process.stdout is not None
            address = process.stdout.readline().split()[-1]
            wal = await BlockWal.open_remote(
                address,
                node_id=1,
                node_epoch=1,
                capacity_bytes=capacity_bytes,
                max_groups_in_flight=groups_in_flight,
            )
            try:
                yield wal
            finally:
                await wal.close()
        finally:
            process.terminate()
            process.wait()
            path.unlink(missing_ok=True)


async def wal_run(
    directory: Path,
    size_bytes: int,
    writers: int,
    seconds: float,
    groups_in_flight: int,
    target: str = "file",
    capacity_bytes: int = CAPACITY_BYTES,
    raw_device: Path | None = None,
) -> Figures:
    async with target_wal(target, directory, capacity_bytes, groups_in_flight, raw_device) as wal:
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


def compare_targets(arguments: argparse.Namespace, directory: Path, targets: list[str]) -> str:
    """The WAL on each target, run after run in turn so all see the same background load."""
    capacity = arguments.capacity_mib << 20
    lines = [
        "| record | writers | WAL on | MB/s | p50 ms | p99 ms | syncs/s | / file |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    with contextlib.ExitStack() as stack:
        raw_device = None
        if "direct" in targets:
            raw_device = stack.enter_context(loop_device(directory / "loop-backing", capacity))
        for size_bytes in (int(size) for size in arguments.sizes.split(",")):
            for writers in WRITER_COUNTS:
                runs: dict[str, list[Figures]] = {target: [] for target in targets}
                for _ in range(arguments.runs):
                    for target in targets:
                        runs[target].append(
                            asyncio.run(
                                wal_run(
                                    directory,
                                    size_bytes,
                                    writers,
                                    arguments.seconds,
                                    arguments.groups_in_flight,
                                    target,
                                    capacity,
                                    raw_device,
                                )
                            )
                        )
                medians = {target: median_figures(runs[target]) for target in targets}
                base = medians.get("file")
                for target in targets:
                    figures = medians[target]
                    ratio = (
                        f"{figures.throughput_mb_per_s / base.throughput_mb_per_s:.2f}"
                        if base is not None and base.throughput_mb_per_s
                        else "-"
                    )
                    lines.append(
                        f"| {human_size(size_bytes)} | {writers} | {target} | "
                        f"{figures.throughput_mb_per_s:.1f} | {figures.p50_ms:.2f} | "
                        f"{figures.p99_ms:.2f} | {figures.syncs_per_s:.0f} | {ratio} |"
                    )
                    print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--groups-in-flight", type=int, default=MAX_GROUPS_IN_FLIGHT)
    parser.add_argument("--sizes", default="1024,65536,1048576", help="record sizes in bytes")
    parser.add_argument(
        "--targets", default="", help=f"compare the WAL on these, side by side: {TARGETS}"
    )
    parser.add_argument("--capacity-mib", type=int, default=CAPACITY_BYTES >> 20)
    arguments = parser.parse_args()
    directory = arguments.dir or Path(tempfile.mkdtemp(prefix="wal-bench-", dir="."))
    directory.mkdir(parents=True, exist_ok=True)
    if arguments.targets:
        targets = [target for target in arguments.targets.split(",") if target]
        unknown = set(targets) - set(TARGETS)
        if unknown:
            parser.error(f"unknown targets {sorted(unknown)}; choose from {TARGETS}")
        table = compare_targets(arguments, directory, targets)
        print()
        print(table)
        if arguments.out:
            arguments.out.write_text(table + "\n")
        if arguments.dir is None:
            directory.rmdir()
        return

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
