"""PUT and GET throughput of the object stores: ``python -m bench.object_store_bench [--out FILE]``.

Backends: the local directory store (with and without fsync) in a fresh temporary directory, and
the S3 store against moto's server, which this script starts in a child process on 127.0.0.1 so
that the server does not share the benchmark's interpreter lock. Workloads: many 4 KiB objects at
concurrency 1 and 16, and 8 MiB objects at concurrency 1 and 4.

Method: each (backend, size, concurrency) case runs several times on fresh keys. A run PUTs every
object (``concurrency`` workers taking keys from a shared queue), then GETs every object the same
way, then deletes them (not timed). Throughput is bytes moved / wall time of the phase, in MB/s
(10^6 bytes) and operations per second; the table shows the median over runs. Latency columns are
the median and 99th percentile of single operations pooled over all runs. The whole script stops
starting new cases once ``--budget-s`` is spent, so it stays bounded on slow machines.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, ObjectStore, S3ObjectStore

KIB = 1024
MIB = 1024 * KIB

_MOTO_CHILD = (
    "import logging, sys\n"
    "logging.getLogger('werkzeug').setLevel(logging.ERROR)  # no line per request\n"
    "from moto.server import ThreadedMotoServer\n"
    "server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
    "server.start()\n"
    "print(server.get_host_and_port()[1], flush=True)\n"
    "sys.stdin.read()\n"
    "server.stop()\n"
)


@dataclass(frozen=True, slots=True)
class Case:
    size_bytes: int
    objects: int
    concurrency: int
    runs: int


@dataclass(frozen=True, slots=True)
class Row:
    backend: str
    operation: str
    case: Case
    megabytes_per_s: float
    operations_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float


CASES = [
    Case(size_bytes=4 * KIB, objects=256, concurrency=1, runs=5),
    Case(size_bytes=4 * KIB, objects=256, concurrency=16, runs=5),
    Case(size_bytes=8 * MIB, objects=6, concurrency=1, runs=3),
    Case(size_bytes=8 * MIB, objects=6, concurrency=4, runs=3),
]


async def _run_phase(
    keys: Sequence[str], concurrency: int, operation: Callable[[str], Awaitable[object]]
) -> tuple[float, list[float]]:
    """Apply ``operation`` to every key with ``concurrency`` workers; wall seconds, latencies."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for key in keys:
        queue.put_nowait(key)
    latencies_s: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            key = queue.get_nowait()
            started = time.perf_counter()
            await operation(key)
            latencies_s.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies_s


async def measure(store: ObjectStore, backend: str, case: Case) -> list[Row]:
    payload = os.urandom(case.size_bytes)
    put_runs: list[float] = []
    get_runs: list[float] = []
    put_latencies: list[float] = []
    get_latencies: list[float] = []
    for _ in range(case.runs):
        prefix = f"bench/{uuid.uuid4().hex}/"
        keys = [f"{prefix}{index:06d}" for index in range(case.objects)]
        put_s, latencies = await _run_phase(
            keys, case.concurrency, lambda key: store.put(key, payload)
        )
        put_runs.append(put_s)
        put_latencies += latencies

        async def get_and_check(key: str) -> object:
            data = await store.get(key)
            if len(data) != case.size_bytes:
                raise AssertionError(f"GET {key} returned {len(data)} bytes")
            return data

        get_s, latencies = await _run_phase(keys, case.concurrency, get_and_check)
        get_runs.append(get_s)
        get_latencies += latencies
        await store.delete_many(keys)
    return [
        _row(backend, "PUT", case, put_runs, put_latencies),
        _row(backend, "GET", case, get_runs, get_latencies),
    ]


def _row(
    backend: str, operation: str, case: Case, runs_s: list[float], latencies_s: list[float]
) -> Row:
    median_s = statistics.median(runs_s)
    total_bytes = case.size_bytes * case.objects
    ordered = sorted(latencies_s)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Row(
        backend=backend,
        operation=operation,
        case=case,
        megabytes_per_s=total_bytes / median_s / 1e6,
        operations_per_s=case.objects / median_s,
        latency_p50_ms=statistics.median(ordered) * 1000,
        latency_p99_ms=p99 * 1000,
    )


@asynccontextmanager
async def moto_store() -> AsyncIterator[S3ObjectStore]:
    child = subprocess.Popen(
        [sys.executable, "-c", _MOTO_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        store = S3ObjectStore(
            f"bench-{uuid.uuid4().hex[:12]}",
            endpoint_url=f"http://127.0.0.1:{port}",
            access_key_id="testing",
            secret_access_key="testing",
            max_attempts=3,
        )
        async with store:
            await store.create_bucket_if_missing()
            yield store
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@asynccontextmanager
async def local_store(base: Path, fsync: bool) -> AsyncIterator[LocalDirectoryObjectStore]:
    root = Path(tempfile.mkdtemp(prefix="object-store-bench-", dir=base))
    try:
        async with LocalDirectoryObjectStore(root, fsync=fsync) as store:
            yield store
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _size(size_bytes: int) -> str:
    return f"{size_bytes // MIB} MiB" if size_bytes >= MIB else f"{size_bytes // KIB} KiB"


def render(rows: list[Row], skipped: list[str], header: list[str]) -> str:
    lines = [*header, ""]
    lines.append(
        "| backend | op | object size | objects | concurrency | runs | MB/s (median) "
        "| ops/s (median) | latency p50 ms | latency p99 ms |"
    )
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        lines.append(
            f"| {row.backend} | {row.operation} | {_size(row.case.size_bytes)} "
            f"| {row.case.objects} | {row.case.concurrency} | {row.case.runs} "
            f"| {row.megabytes_per_s:.1f} | {row.operations_per_s:.0f} "
            f"| {row.latency_p50_ms:.2f} | {row.latency_p99_ms:.2f} |"
        )
    lines += [f"\nSkipped (time budget): {case}" for case in skipped]
    return "\n".join(lines) + "\n"


def _header(base: Path, elapsed_s: float) -> list[str]:
    versions = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("aiobotocore", "botocore", "moto")
    )
    return [
        "Object store throughput (`python -m bench.object_store_bench`)",
        "",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {versions}",
        f"- local store directory: {base} (temporary, removed afterwards)",
        "- moto: its threaded server in a child process on 127.0.0.1 (in-memory, so S3 figures "
        "measure the client path and moto, not a real object store)",
        f"- total wall time: {elapsed_s:.1f} s",
    ]


async def main_async(out: Path | None, base: Path, budget_s: float) -> str:
    started = time.perf_counter()
    rows: list[Row] = []
    skipped: list[str] = []
    backends: list[tuple[str, Callable[[], AbstractAsyncContextManager[ObjectStore]]]] = [
        ("local (fsync)", lambda: local_store(base, fsync=True)),
        ("local (no fsync)", lambda: local_store(base, fsync=False)),
        ("S3 on moto", moto_store),
    ]
    for backend, opener in backends:
        async with opener() as store:
            for case in CASES:
                if time.perf_counter() - started > budget_s:
                    skipped.append(f"{backend} {_size(case.size_bytes)} x{case.concurrency}")
                    continue
                rows += await measure(store, backend, case)
                print(
                    f"done: {backend} {_size(case.size_bytes)} c={case.concurrency}",
                    file=sys.stderr,
                )
    text = render(rows, skipped, _header(base, time.perf_counter() - started))
    if out is not None:
        out.write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="also write the markdown table to this file")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the local store lives"
    )
    parser.add_argument(
        "--budget-s", type=float, default=100.0, help="start no new case after this many seconds"
    )
    arguments = parser.parse_args(argv)
    print(asyncio.run(main_async(arguments.out, arguments.dir, arguments.budget_s)))


if __name__ == "__main__":
    main()
