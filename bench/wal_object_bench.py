"""The object WAL on moto against the block WAL: PUTs per GB and produce latency, through a broker.

    python -m bench.wal_object_bench [--runs 3] [--mb 512] [--rate 1000] [--latency-seconds 10]
                                     [--quick] [--dir DIR] [--out FILE]

Two targets, each a fresh ``automq-ref serve`` per run with its data objects on a counting moto
server (``s3.data.buckets``):

- ``block WAL``: the WAL file under ``log.dirs`` (the embedded default, fsynced per group);
- ``object WAL``: ``s3.wal.path=0@s3://...`` on a second counting moto server, AutoMQ's defaults
  (``batchInterval=250``, ``maxBytesInBatch=8388608``), so its requests are counted apart from
  the data objects'.

Workloads, with confluent-kafka (the broker benchmark's own functions):

1. full rate: ``--mb`` MB of 1 KiB records (acks=all, linger.ms=5, batch.size=1000000)
   round-robin into a 16-partition topic, as fast as the broker takes them; MB/s, and the WAL's
   PUTs per GB produced (write requests its moto server saw during the run, the reservation
   included; the data objects' PUTs per GB are reported apart, counted until the graceful stop
   that follows, which uploads the rest);
2. paced: ``--rate`` records/s of 1 KiB (acks=all, linger.ms ``--latency-linger-ms``, 5 by
   default) for ``--latency-seconds`` into one partition after 100 warm-up records;
   p50/p99/max of librdkafka's per-message latency (produce call to delivery report), and the
   WAL's PUTs per GB at that rate (a trickle: bulks sealed by the 250 ms timer, not by size).
   The linger matters on the object WAL: an answer waits for its bulk (up to 250 ms), and the
   broker admits at most 64 requests per connection before it stops reading; at 1 ms of linger
   librdkafka sends about one request per record, more than 64 per 250 ms at 1,000 records/s,
   so requests queue in front of the broker and latency grows with the run.

Each figure is the median over ``--runs``; the targets alternate within a run. MB = 10^6 bytes,
GB = 10^9 bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.broker_bench import (
    BUCKET,
    RECORD_BYTES,
    REPO,
    SERVING,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    CountingMoto,
    create_topics,
    percentile,
    produce_latency,
    produce_throughput,
    write_requests,
)

GIGABYTE = 1_000_000_000
MEGABYTE = 1_000_000
TARGETS = ("block WAL", "object WAL")
MOTO_CREDENTIALS = "pathStyle=true&accessKey=test&secretKey=test"


class Broker:
    """One broker of a target, its data moto and (for the object WAL) its WAL moto."""

    def __init__(self, target: str, workdir: Path) -> None:
        self.target = target
        self.data_dir = workdir / target.replace(" ", "-") / "data"
        self.data_moto = CountingMoto(fast_ranges=True)
        self.wal_moto = CountingMoto(fast_ranges=True) if target == "object WAL" else None
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> str:
        overrides = [
            "listeners=PLAINTEXT://127.0.0.1:0",
            f"log.dirs={self.data_dir}",
            "s3.wal.capacity=1073741824",
            f"s3.data.buckets=0@s3://{BUCKET}?region=us-east-1&endpoint={self.data_moto.endpoint}"
            f"&{MOTO_CREDENTIALS}",
        ]
        if self.wal_moto is not None:
            overrides.append(
                f"s3.wal.path=0@s3://{BUCKET}?region=us-east-1&endpoint={self.wal_moto.endpoint}"
                f"&{MOTO_CREDENTIALS}&batchInterval=250&maxBytesInBatch=8388608"
            )
        command = [sys.executable, "-m", "automq_ref.cli", "serve"]
        for override in overrides:
            command += ["--override", override]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir.parent / "broker.log"
        with log_path.open("a") as log_file:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=subprocess.PIPE, stderr=log_file, text=True
            )
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            if SERVING in line:
                return line.split(SERVING, 1)[1].split()[0]
        raise RuntimeError(f"{self.target} did not start; see {log_path}")

    def wal_writes(self) -> int:
        return 0 if self.wal_moto is None else write_requests(self.wal_moto.stats())

    def data_writes(self) -> int:
        return write_requests(self.data_moto.stats())

    def stop(self) -> None:
        """Graceful: SIGTERM uploads what the WAL holds."""
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        if process.wait(timeout=STOP_TIMEOUT_S) != 0:
            raise RuntimeError(f"{self.target} exited with {process.returncode}")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.data_moto.stop()
            if self.wal_moto is not None:
                self.wal_moto.stop()
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def one_run(target: str, workdir: Path, arguments: argparse.Namespace) -> dict[str, float]:
    broker = Broker(target, workdir)
    try:
        bootstrap = broker.start()
        create_topics(bootstrap, {"full-rate": 16, "paced": 1})
        wal_before, data_before = broker.wal_writes(), broker.data_writes()
        records, seconds = produce_throughput(
            bootstrap, "full-rate", 16, int(arguments.mb * MEGABYTE), arguments.max_seconds
        )
        full_bytes = records * RECORD_BYTES
        wal_full = broker.wal_writes() - wal_before
        wal_before = broker.wal_writes()
        paced_records, latencies = produce_latency(
            bootstrap, "paced", arguments.rate, arguments.latency_seconds, arguments.linger_ms
        )
        wal_paced = broker.wal_writes() - wal_before
        broker.stop()  # uploads the rest, so the data objects' count is complete
        data_writes = broker.data_writes() - data_before
        paced_bytes = paced_records * RECORD_BYTES
        return {
            "produce MB/s at full rate, 16 partitions": full_bytes / seconds / MEGABYTE,
            "WAL PUTs per GB at full rate": wal_full / (full_bytes / GIGABYTE),
            "data object PUTs per GB (both workloads)": data_writes
            / ((full_bytes + paced_bytes) / GIGABYTE),
            f"produce p50 ms at {arguments.rate} msg/s": percentile(latencies, 0.5) * 1000,
            f"produce p99 ms at {arguments.rate} msg/s": percentile(latencies, 0.99) * 1000,
            f"produce max ms at {arguments.rate} msg/s": latencies[-1] * 1000,
            f"WAL PUTs per GB at {arguments.rate} msg/s": wal_paced / (paced_bytes / GIGABYTE),
        }
    finally:
        broker.close()


def report(runs: dict[str, list[dict[str, float]]], arguments: argparse.Namespace) -> str:
    names = list(next(iter(runs.values()))[0])
    lines = [
        f"`python -m bench.wal_object_bench`: {arguments.runs} run(s), {arguments.mb:g} MB at "
        f"full rate (at most {arguments.max_seconds:g} s), {arguments.rate} msg/s for "
        f"{arguments.latency_seconds:g} s paced (linger.ms {arguments.linger_ms:g}); "
        f"load average {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs).",
        "",
        "| metric (median) | " + " | ".join(TARGETS) + " |",
        "|---|" + "---:|" * len(TARGETS),
    ]
    for name in names:
        cells = []
        for target in TARGETS:
            value = statistics.median(run[name] for run in runs[target])
            absent = name.startswith("WAL PUTs") and target == "block WAL"
            cells.append("-" if absent else f"{value:.3g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    objects = runs["object WAL"]
    puts = statistics.median(run["WAL PUTs per GB at full rate"] for run in objects)
    p99 = statistics.median(run[f"produce p99 ms at {arguments.rate} msg/s"] for run in objects)
    lines += [
        "",
        "| target | figure (median) | met |",
        "|---|---|:---:|",
        f"| object WAL PUTs per GB at full rate <= 150 | {puts:.0f} | "
        f"{'yes' if puts <= 150 else '**no**'} |",
        f"| object WAL produce p99 <= 300 ms on moto | {p99:.0f} ms | "
        f"{'yes' if p99 <= 300 else '**no**'} |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mb", type=float, default=512.0, help="MB in the full-rate run")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap of the full-rate run")
    parser.add_argument("--rate", type=int, default=1000, help="records/s in the paced run")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-linger-ms", dest="linger_ms", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few MB")
    parser.add_argument("--dir", type=Path, default=None, help="where the brokers keep data")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.runs, arguments.mb, arguments.latency_seconds = 1, 16.0, 2.0
    runs: dict[str, list[dict[str, float]]] = {target: [] for target in TARGETS}
    with tempfile.TemporaryDirectory(prefix="wal-object-bench-", dir=arguments.dir) as workdir:
        for index in range(arguments.runs):
            for target in TARGETS:
                runs[target].append(one_run(target, Path(workdir), arguments))
                print(f"run {index + 1} {target}: {runs[target][-1]}", file=sys.stderr, flush=True)
    text = report(runs, arguments)
    print(text)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
