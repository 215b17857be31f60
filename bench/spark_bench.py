"""Spark reading a topic through the ``automq`` source and through ``automq-objects``.

    python -m bench.spark_bench [--records 10000000] [--partitions 64] [--value-bytes 100]
                                [--codec none] [--runs 3] [--master local[*]] [--quick]
                                [--dir DIR] [--out FILE]

One broker process (``automq-ref serve`` on local objects, as the tests start it) gets
``--records`` records spread round robin over ``--partitions`` partitions by
:mod:`automq_ref.spark.produce` (idempotent, acks=all; the produce rate is reported). Then the
same Spark query runs ``--runs`` times through each source, after one untimed warm-up run that
starts the Python workers: per partition, a count and the two checksums of ``automq-ref verify``
(sums of 64-bit MD5 prefixes of the values and of offset + value) in one aggregation, collected
to the driver and compared with the producer's manifest (a mismatch fails the benchmark).

- ``automq``: over the Kafka protocol, while the broker runs (Metadata, ListOffsets, Fetch);
- ``automq-objects``: straight from the objects under the broker's ``log.dirs``, after a
  graceful stop (the stop uploads the WAL's data, so every record is in an object).

Figures: the median wall time of the query, records/s and MB/s of values (10^6 bytes; the
values' bytes, not the batches'). The machine is shared, so figures move from run to run; the
minimum and maximum are printed beside the median.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.spark.manifest import Manifest
from automq_ref.spark.produce import ProduceSettings, produce
from automq_ref.spark.session import spark_session
from automq_ref.spark.verify import checksum_summary, read_source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "spark-bench"
MEGABYTE = 1_000_000
WAL_BYTES = 2**30


def log(message: str) -> None:
    print(f"[spark_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Timing:
    source: str
    seconds: list[float]
    records: int
    value_bytes: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def row(self) -> str:
        median = self.median_s
        megabytes = self.records * self.value_bytes / MEGABYTE
        return (
            f"| Spark count + checksums via `{self.source}` | {self.records:,} "
            f"| {len(self.seconds)} | {median:.2f} | {min(self.seconds):.2f} "
            f"| {max(self.seconds):.2f} | {self.records / median:,.0f} "
            f"| {megabytes / median:.1f} |"
        )


def check_against(manifest: Manifest, summary: dict[int, tuple[int, int, int]], what: str) -> None:
    for part in manifest.partitions:
        found = summary.get(part.partition, (0, 0, 0))
        wanted = (part.count, part.values_checksum, part.placed_checksum)
        if found != wanted:
            raise RuntimeError(
                f"{what}: partition {part.partition} read (rows, values, placed) = {found}, "
                f"the manifest says {wanted}"
            )


def time_source(
    spark: SparkSession, source: str, manifest: Manifest, runs: int, **where: str
) -> Timing:
    """A warm-up run, then ``runs`` timed runs of the aggregation through ``source``."""
    seconds: list[float] = []
    for run in range(runs + 1):
        started = time.perf_counter()
        frame = read_source(spark, source, manifest.topic, **where)
        summary = checksum_summary(frame)
        elapsed = time.perf_counter() - started
        check_against(manifest, summary, source)
        log(f"{source}: {'warm-up' if run == 0 else f'run {run}'}: {elapsed:.2f} s")
        if run:
            seconds.append(elapsed)
    return Timing(source, seconds, manifest.records, manifest.scheme.value_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 records, 1 run")
    parser.add_argument("--dir", type=Path, default=None, help="where the broker keeps data")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.records, arguments.partitions, arguments.runs = 2_000, 4, 1
    workdir = Path(tempfile.mkdtemp(prefix="spark-bench-", dir=arguments.dir))
    load_before = os.getloadavg()
    began = time.perf_counter()
    # A 1 GiB WAL, the broker's default (the process the tests start has 64 MiB).
    broker = BrokerProcess(workdir / "data", f"s3.wal.capacity={WAL_BYTES}")
    spark = None
    try:
        broker.start()
        log(f"broker on {broker.bootstrap}; producing {arguments.records:,} records")
        result = produce(
            ProduceSettings(
                bootstrap=broker.bootstrap,
                topic=TOPIC,
                partitions=arguments.partitions,
                records=arguments.records,
                codec=arguments.codec,
                value_bytes=arguments.value_bytes,
            )
        )
        log(result.summary())
        if result.failed:
            raise RuntimeError(f"{result.failed} records were not acknowledged")
        manifest = result.manifest
        spark = spark_session(arguments.master)
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, os.cpu_count() or 2)))
        kafka = time_source(spark, "automq", manifest, arguments.runs, bootstrap=broker.bootstrap)
        stop_started = time.perf_counter()
        broker.stop()
        stop_s = time.perf_counter() - stop_started
        log(f"graceful stop (upload of the WAL's data): {stop_s:.2f} s")
        objects = time_source(
            spark, "automq-objects", manifest, arguments.runs, path=str(broker.data_dir)
        )
    finally:
        if spark is not None:
            spark.stop()
        if broker.alive():
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    megabytes = manifest.records * manifest.scheme.value_bytes / MEGABYTE
    command = "python -m bench.spark_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    report = [
        f"`{command.strip()}`: {manifest.records:,} records of {manifest.scheme.value_bytes} "
        f"bytes ({megabytes:.0f} MB of values, codec {manifest.codec}) in "
        f"{len(manifest.partitions)} partitions; Spark `{arguments.master}`; median of "
        f"{arguments.runs} run(s) after a warm-up; {time.perf_counter() - began:.0f} s in all; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} CPUs).",
        "",
        "| workload | records | runs | median s | min s | max s | records/s | MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| produce (`automq_ref.spark.produce`, idempotent, acks=all) | "
        f"{manifest.records:,} | 1 | {result.seconds:.2f} | - | - "
        f"| {result.records_per_second:,.0f} | {megabytes / result.seconds:.1f} |",
        kafka.row(),
        objects.row(),
        "",
        f"Graceful stop before the `automq-objects` runs: {stop_s:.2f} s. Every run's counts and "
        "checksums equal the manifest's.",
    ]
    text = "\n".join(report)
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
