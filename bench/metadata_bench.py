"""The metadata quorum's costs: ``python -m bench.metadata_bench [--appends N] [--takeovers N]``.

Three measurements, against an etcd member this script starts on free loopback ports in a
temporary directory (``tests/etcd_fixture.py``), with etcd's defaults (its WAL fsynced):

1. **Append latency** of one batch of one record (a 200-byte record, the size of a typical
   controller decision) on the embedded file log (a temporary directory, ``fdatasync`` per
   append) and on the etcd log (one guarded transaction per append), appended one after
   another: median, 99th percentile and mean in milliseconds.
2. **Decision latency** through a broker's controller client: on the elected broker (its own
   replica decides) and on another broker (the request goes over the controller RPC, and
   returns once that broker's own image has replayed the decision).
3. **Takeover**: the elected broker stops renewing its lease (its election tasks and listener
   are cut off, as a SIGKILL would) and the time until another broker holds the election is
   measured, ``--takeovers`` times, with the lease TTL of ``--ttl-ms``.

The numbers depend on the disk and on what else runs (two cores shared); compare the rows of one
run, not runs on different machines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from automq_ref.io.metadata.cluster import ClusterMetadata, ClusterSettings
from automq_ref.io.metadata.etcd_metadata_log import EtcdMetadataLog
from automq_ref.io.metadata.metadata_log import FileMetadataLog, MetadataLog
from automq_ref.state_machines import stream_metadata as sm
from tests.etcd_fixture import running_etcd, unique_cluster_id

RECORD = b"x" * 200


def summary(samples_s: list[float]) -> str:
    ordered = sorted(samples_s)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"{statistics.median(ordered) * 1000:.2f} | {p99 * 1000:.2f} | "
        f"{statistics.fmean(ordered) * 1000:.2f}"
    )


async def append_latencies(log: MetadataLog, count: int) -> list[float]:
    samples: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        await log.append([RECORD], expected_next_index=log.next_index)
        samples.append(time.perf_counter() - started)
    return samples


async def timed(count: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    samples: list[float] = []
    for n in range(count):
        started = time.perf_counter()
        await call(n)
        samples.append(time.perf_counter() - started)
    return samples


async def until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


def leading(nodes: list[ClusterMetadata]) -> ClusterMetadata | None:
    for node in nodes:
        if node.election is not None and node.election.is_leader:
            return node
    return None


async def run(endpoint: str, appends: int, takeovers: int, ttl_ms: int) -> None:
    print("| log | appends | p50 ms | p99 ms | mean ms |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="metadata-bench-") as directory:
        async with FileMetadataLog(Path(directory)) as file_log:
            print(f"| file | {appends} | {summary(await append_latencies(file_log, appends))} |")
    etcd_log = await EtcdMetadataLog.connect([endpoint], unique_cluster_id("bench"))
    try:
        print(f"| etcd | {appends} | {summary(await append_latencies(etcd_log, appends))} |")
    finally:
        await etcd_log.close()

    cluster_id = unique_cluster_id("bench")
    nodes = [
        await ClusterMetadata.start(
            ClusterSettings((endpoint,), cluster_id, node_id, lease_ttl_ms=ttl_ms)
        )
        for node_id in (1, 2, 3)
    ]
    try:
        await until(lambda: leading(nodes) is not None)
        leader = leading(nodes)
        assert leader is not None
        other = next(node for node in nodes if node is not leader)
        await until(lambda: other.election is not None and other.election.leader is not None)
        for node in nodes:
            await node.client.submit(sm.RegisterNode(node.settings.node_id, 1))
        print()
        print("| decision (PutKV) | requests | p50 ms | p99 ms | mean ms |")
        print("| --- | --- | --- | --- | --- |")
        for name, node in (("on the controller", leader), ("over the controller RPC", other)):

            def put(n: int, node: ClusterMetadata = node) -> Awaitable[sm.Response]:
                return node.client.submit(
                    sm.PutKV(f"bench/{node.settings.node_id}/{n}", RECORD, True)
                )

            samples = await timed(appends, put)
            print(f"| {name} | {appends} | {summary(samples)} |")

        print()
        print(f"| takeover after the controller stops renewing (TTL {ttl_ms} ms) | seconds |")
        print("| --- | --- |")
        times: list[float] = []
        for _ in range(takeovers):
            dead = leading(nodes)
            assert dead is not None and dead.election is not None
            for task in dead.election._tasks:
                task.cancel()
            await dead.server.close()
            died = time.monotonic()
            survivors = [node for node in nodes if node is not dead]

            def taken_over(survivors: list[ClusterMetadata] = survivors) -> bool:
                return leading(survivors) is not None

            await until(taken_over)
            times.append(time.monotonic() - died)
            nodes.remove(dead)
            await dead.close()
            nodes.append(
                await ClusterMetadata.start(
                    ClusterSettings((endpoint,), cluster_id, 10 + len(times), lease_ttl_ms=ttl_ms)
                )
            )
        for index, seconds in enumerate(times, 1):
            print(f"| takeover {index} | {seconds:.2f} |")
        if times:
            print(f"| max | {max(times):.2f} |")
    finally:
        for node in nodes:
            await node.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--takeovers", type=int, default=3)
    parser.add_argument("--ttl-ms", type=int, default=3000)
    args = parser.parse_args()
    with running_etcd() as etcd:
        asyncio.run(run(etcd.endpoint, args.appends, args.takeovers, args.ttl_ms))


if __name__ == "__main__":
    main()
