"""``automq-ref verify``: read a topic with Spark and check it against the producer's manifest.

The topic is read through one of the two Spark sources (``automq``, over the Kafka protocol, or
``automq-objects``, straight from the committed objects, planned from a broker's file metadata
log or from a cluster's metadata log on etcd); both give Spark's Kafka-source schema. Every check
is a Spark aggregation: only per-partition totals and a few examples reach the driver, so the
check scales with the cluster, not with the driver's memory.

1. Each row's value is parsed with ``regexp_extract`` (see :mod:`automq_ref.spark.manifest` for
   the value format). A row is *expected* if its value names this manifest's producer, the
   partition it was read from, and a sequence the manifest lists as acknowledged there; any other
   row is *unexpected*. The narrow result (partition, offset, sequence, flags and the two 64-bit
   hashes, computed with Spark's ``md5``) is persisted, so the source is read once.
2. Per partition: rows, first and last offset, unexpected rows, and the two checksums over the
   expected rows (the checksums are sums of two 32-bit halves, recombined modulo 2**64 on the
   driver, so no decimal arithmetic is needed).
3. Per (partition, sequence): copies and first offset. A value at more than one offset is a
   *duplicate*; an acknowledged sequence with no row is *lost* (count = acknowledged - distinct
   read; examples come from an anti-join of the acknowledged runs with what was read, only when
   something is missing).
4. Order: over the first copy of each value, ordered by offset within the partition, a sequence
   smaller than the one before it is *reordered* (a window with ``lag``).
5. The checksums are compared. A difference in a partition where records were lost, duplicated
   or unexpected is explained by those; alone, it is reported as *checksum* (a value's bytes or
   its offset changed).

The verdict names the kinds found: ``lost``, ``duplicate``, ``reordered``, ``unexpected``,
``checksum``. ``report.txt`` and ``report.json`` go to the report directory; the command exits 0
when everything matches, 1 on a mismatch, 2 when the check could not run.

While it runs, the command shows its stage (starting Spark, reading the topic or the objects,
comparing) with the elapsed time and the running Spark tasks on stderr (:mod:`automq_ref.progress`:
a bar on a terminal, a line every few seconds and at each stage otherwise), and keeps Spark's own
JVM noise out of the way (:mod:`automq_ref.spark.session`) unless ``verbose``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from automq_ref.progress import Progress, Status
from automq_ref.spark.manifest import MODULUS, VALUE_REGEX, Manifest, PartitionManifest
from automq_ref.spark.session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

SOURCES = ("automq", "automq-objects")
KINDS = ("lost", "duplicate", "reordered", "unexpected", "checksum")
EXAMPLES = 5
MAX_INLINE_RUNS = 512
TEXT_PREFIX = 48


# ---------------------------------------------------------------------------------- the report


class PartitionReport(BaseModel):
    partition: int
    expected_count: int
    read_count: int = 0
    expected_first_offset: int | None = None
    expected_last_offset: int | None = None
    read_first_offset: int | None = None
    read_last_offset: int | None = None
    lost: int = 0
    lost_examples: list[str] = Field(default_factory=list)
    duplicates: int = Field(default=0, description="values read at more than one offset")
    extra_copies: int = 0
    duplicate_examples: list[str] = Field(default_factory=list)
    reordered: int = 0
    reordered_examples: list[str] = Field(default_factory=list)
    unexpected: int = 0
    unexpected_examples: list[str] = Field(default_factory=list)
    expected_values_checksum: int = 0
    read_values_checksum: int = 0
    expected_placed_checksum: int = 0
    read_placed_checksum: int = 0
    kinds: list[str] = Field(default_factory=list)

    @property
    def checksums_match(self) -> bool:
        return (
            self.expected_values_checksum == self.read_values_checksum
            and self.expected_placed_checksum == self.read_placed_checksum
        )


class VerifyReport(BaseModel):
    topic: str
    source: str
    producer: str
    expected_records: int
    read_records: int
    ok: bool
    kinds: list[str]
    diagnosis: str
    seconds: float
    partitions: list[PartitionReport]

    def text(self) -> str:
        lines = [
            f"verify {self.topic} through {self.source}: "
            f"{'OK' if self.ok else 'MISMATCH: ' + ', '.join(self.kinds)}",
            f"records: {self.read_records} read, {self.expected_records} acknowledged "
            f"(producer {self.producer}); {len(self.partitions)} partitions; "
            f"{self.seconds:.1f} s",
            "",
            "| partition | acked | read | offsets acked | offsets read | lost | duplicate "
            "| reordered | unexpected | checksums | verdict |",
            "|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|",
        ]
        for part in self.partitions:
            lines.append(
                f"| {part.partition} | {part.expected_count} | {part.read_count} "
                f"| {_span(part.expected_first_offset, part.expected_last_offset)} "
                f"| {_span(part.read_first_offset, part.read_last_offset)} | {part.lost} "
                f"| {part.duplicates} | {part.reordered} | {part.unexpected} "
                f"| {'equal' if part.checksums_match else 'differ'} "
                f"| {', '.join(part.kinds) or 'ok'} |"
            )
        lines += ["", self.diagnosis]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "report.txt").write_text(self.text())
        (directory / "report.json").write_text(self.model_dump_json(indent=1) + "\n")


def _span(first: int | None, last: int | None) -> str:
    return "-" if first is None or last is None else f"{first}..{last}"


# ----------------------------------------------------------------------------- Spark plumbing


def read_source(
    spark: SparkSession,
    source: str,
    topic: str,
    *,
    bootstrap: str | None = None,
    path: str | None = None,
    object_store: str | None = None,
    etcd_endpoints: str | None = None,
    cluster_id: str | None = None,
) -> DataFrame:
    """The whole of ``topic`` (earliest to latest) through one of the two sources.

    ``automq-objects`` reads the metadata log of the broker whose ``log.dirs`` is ``path``, or,
    with ``etcd_endpoints`` (and ``cluster_id``), a cluster's on etcd; the source's own options
    check the combination."""
    if source == "automq":
        if bootstrap is None:
            raise ValueError("the automq source needs a bootstrap address")
        module = importlib.import_module("automq_ref.spark.kafka_source")
        spark.dataSource.register(module.AutoMQDataSource)
        reader = (
            spark.read.format("automq")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
        )
    elif source == "automq-objects":
        if path is None and etcd_endpoints is None:
            raise ValueError(
                "the automq-objects source needs --path (a broker's log.dirs) or "
                "--metadata-etcd-endpoints (a cluster's etcd)"
            )
        module = importlib.import_module("automq_ref.spark.objects_source")
        spark.dataSource.register(module.AutoMQObjectsDataSource)
        reader = spark.read.format("automq-objects")
        for name, value in (
            ("path", path),
            ("metadata.etcd.endpoints", etcd_endpoints),
            ("cluster.id", cluster_id),
            ("objectStore", object_store),
        ):
            if value is not None:
                reader = reader.option(name, value)
    else:
        raise ValueError(f"source {source!r}: choose from {', '.join(SOURCES)}")
    frame: DataFrame = reader.option("subscribe", topic).load()
    return frame


def _hash_halves(data: Column, prefix: str) -> list[Column]:
    """The first 8 bytes of MD5 of ``data`` as two unsigned 32-bit halves (longs)."""
    from pyspark.sql import functions as F

    digest = F.md5(data)
    return [
        F.conv(F.substring(digest, 1, 8), 16, 10).cast("long").alias(f"{prefix}_hi"),
        F.conv(F.substring(digest, 9, 8), 16, 10).cast("long").alias(f"{prefix}_lo"),
    ]


def _offset_bytes(offset: Column) -> Column:
    from pyspark.sql import functions as F

    return F.unhex(F.lpad(F.hex(offset), 16, "0"))


def hashed(frame: DataFrame) -> DataFrame:
    """``partition``, ``offset`` and the halves of both hashes (``v_hi``, ``v_lo``, ``p_hi``,
    ``p_lo``) of every row: what the checksums are summed from."""
    from pyspark.sql import functions as F

    value, offset = F.col("value"), F.col("offset")
    return frame.select(
        "partition",
        "offset",
        *_hash_halves(value, "v"),
        *_hash_halves(F.concat(_offset_bytes(offset), value), "p"),
    )


def combine(high: int | None, low: int | None) -> int:
    """Sums of 32-bit halves back to a sum of 64-bit hashes, modulo 2**64."""
    return ((high or 0) * 2**32 + (low or 0)) % MODULUS


def checksum_summary(frame: DataFrame) -> dict[int, tuple[int, int, int]]:
    """Per partition: (rows, values checksum, placed checksum) over every row of ``frame``.

    One Spark job; the aggregation the benchmark times."""
    from pyspark.sql import functions as F

    rows = (
        hashed(frame)
        .groupBy("partition")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            *(F.sum(name).alias(name) for name in ("v_hi", "v_lo", "p_hi", "p_lo")),
        )
        .collect()
    )
    return {
        int(row["partition"]): (
            int(row["rows"]),
            combine(row["v_hi"], row["v_lo"]),
            combine(row["p_hi"], row["p_lo"]),
        )
        for row in rows
    }


def _acked_condition(manifest: Manifest, partition: Column, sequence: Column) -> Column | None:
    """True where (partition, sequence) was acknowledged; None if too many runs to inline."""
    from pyspark.sql import functions as F

    runs = [(part.partition, run) for part in manifest.partitions for run in part.acked]
    if len(runs) > MAX_INLINE_RUNS:
        return None
    condition = F.lit(False)
    for index, run in runs:
        condition = condition | (
            (partition == index) & sequence.between(run.sequence, run.sequence + run.length - 1)
        )
    return condition


def _runs_frame(spark: SparkSession, parts: list[PartitionManifest]) -> DataFrame:
    rows = [
        (part.partition, run.sequence, run.sequence + run.length)
        for part in parts
        for run in part.acked
    ]
    return spark.createDataFrame(rows, "run_partition int, run_start long, run_end long")


def classified(spark: SparkSession, frame: DataFrame, manifest: Manifest) -> DataFrame:
    """Rows as (partition, offset, sequence, expected, text, hash halves)."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    producer = F.regexp_extract(text, VALUE_REGEX, 1)
    named_partition = F.regexp_extract(text, VALUE_REGEX, 2)
    sequence_text = F.regexp_extract(text, VALUE_REGEX, 3)
    ours = (
        (producer == F.lit(manifest.scheme.producer))
        & (named_partition != "")
        & (named_partition.cast("int") == F.col("partition"))
    )
    sequence = F.when(ours, sequence_text.cast("long"))
    base = frame.select(
        "partition",
        "offset",
        sequence.alias("sequence"),
        F.substring(text, 1, TEXT_PREFIX).alias("text"),
        *_hash_halves(F.col("value"), "v"),
        *_hash_halves(F.concat(_offset_bytes(F.col("offset")), F.col("value")), "p"),
    )
    condition = _acked_condition(manifest, F.col("partition"), F.col("sequence"))
    if condition is not None:
        return base.withColumn("expected", F.coalesce(condition, F.lit(False)))
    runs = F.broadcast(_runs_frame(spark, manifest.partitions))
    joined = base.join(
        runs,
        (base["partition"] == runs["run_partition"])
        & (base["sequence"] >= runs["run_start"])
        & (base["sequence"] < runs["run_end"]),
        "left",
    )
    return joined.withColumn("expected", F.col("run_partition").isNotNull()).drop(
        "run_partition", "run_start", "run_end"
    )


# ------------------------------------------------------------------------------------- verify


@dataclass
class _VerifyTally:
    """The command's stage, for its progress line: ``say`` (the main thread) moves it on; the
    progress thread reads it and asks Spark's status tracker how many tasks of the running
    stages are done."""

    stages: int = 5  # starting Spark, reading, two comparisons, the verdict
    stage: str = "starting Spark"
    step: int = 1
    spark: SparkSession | None = None

    def say(self, what: str) -> None:
        self.stage, self.step = what, min(self.step + 1, self.stages)

    def status(self, _elapsed_s: float) -> Status:
        detail = f"step {self.step}/{self.stages}"
        fraction = (self.step - 1) / self.stages
        spark = self.spark
        if spark is not None:
            tracker = spark.sparkContext.statusTracker()
            running = [tracker.getStageInfo(i) for i in sorted(tracker.getActiveStageIds())]
            stages = [info for info in running if info is not None]
            total = sum(info.numTasks for info in stages)
            done = sum(info.numCompletedTasks for info in stages)
            if total:
                ids = ",".join(str(info.stageId) for info in stages)
                detail += f", Spark stage{'s' if len(stages) > 1 else ''} {ids}: {done}/{total}"
                detail += " tasks"
                fraction += done / total / self.stages
        return Status(self.stage, detail, fraction)


def verify_frame(
    spark: SparkSession,
    frame: DataFrame,
    manifest: Manifest,
    *,
    source: str = "dataframe",
    examples: int = EXAMPLES,
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Check ``frame`` (Spark's Kafka-source schema, the manifest's topic) against ``manifest``."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    say = progress or (lambda _what: None)
    read = "objects" if source == "automq-objects" else "topic"
    examples = max(1, examples)  # the counts of each kind come back with its examples
    started = time.perf_counter()
    reports = {
        part.partition: PartitionReport(
            partition=part.partition,
            expected_count=part.count,
            expected_first_offset=part.first_offset,
            expected_last_offset=part.last_offset,
            expected_values_checksum=part.values_checksum,
            expected_placed_checksum=part.placed_checksum,
        )
        for part in manifest.partitions
    }
    rows = classified(spark, frame, manifest).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        say(f"reading the {read}")
        expected_rows = dict.fromkeys(reports, 0)
        expected = F.col("expected")
        for row in (
            rows.groupBy("partition")
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.min("offset").alias("first"),
                F.max("offset").alias("last"),
                F.sum(F.when(~expected, 1).otherwise(0)).alias("unexpected"),
                F.sum(F.when(expected, 1).otherwise(0)).alias("expected_rows"),
                *(
                    F.sum(F.when(expected, F.col(name))).alias(name)
                    for name in ("v_hi", "v_lo", "p_hi", "p_lo")
                ),
            )
            .collect()
        ):
            index = int(row["partition"])
            report = reports.get(index)
            if report is None:  # a partition the manifest does not know: all of it unexpected
                report = reports[index] = PartitionReport(partition=index, expected_count=0)
            report.read_count = int(row["rows"])
            report.read_first_offset = row["first"]
            report.read_last_offset = row["last"]
            report.unexpected = int(row["unexpected"])
            expected_rows[index] = int(row["expected_rows"])
            report.read_values_checksum = combine(row["v_hi"], row["v_lo"])
            report.read_placed_checksum = combine(row["p_hi"], row["p_lo"])

        say("comparing: duplicates, order")
        valued = (
            rows.where(expected)
            .groupBy("partition", "sequence")
            .agg(
                F.count(F.lit(1)).alias("copies"),
                F.min("offset").alias("first_offset"),
                F.max("offset").alias("last_offset"),
                F.first("text").alias("text"),
            )
        )
        # One pass over the values in log order (first copy of each): a value with several
        # copies is a duplicate, a sequence below the one before it is out of order. Counts and
        # the first few examples of each (partition, kind) come back in the same job.
        copies, sequence = F.col("copies"), F.col("sequence")
        in_log = Window.partitionBy("partition").orderBy("first_offset")
        flagged = valued.select(
            "*",
            F.lag("sequence").over(in_log).alias("previous"),
            F.lag("first_offset").over(in_log).alias("previous_offset"),
        ).select(
            "*",
            F.explode(
                F.array_compact(
                    F.array(
                        F.when(copies > 1, F.lit("duplicate")),
                        F.when(sequence < F.col("previous"), F.lit("reordered")),
                    )
                )
            ).alias("kind"),
        )
        by_kind = Window.partitionBy("partition", "kind")
        for row in (
            flagged.select(
                "*",
                F.row_number().over(by_kind.orderBy("first_offset")).alias("rank"),
                F.count(F.lit(1)).over(by_kind).alias("found"),
                F.sum(copies - 1).over(by_kind).alias("extra"),
            )
            .where(F.col("rank") <= examples)
            .collect()
        ):
            report = reports[int(row["partition"])]
            if row["kind"] == "duplicate":
                report.duplicates = int(row["found"])
                report.extra_copies = int(row["extra"])
                report.duplicate_examples.append(
                    f"{row['text']!r} (sequence {row['sequence']}) at {row['copies']} offsets, "
                    f"first {row['first_offset']}, last {row['last_offset']}"
                )
            else:
                report.reordered = int(row["found"])
                report.reordered_examples.append(
                    f"sequence {row['sequence']} at offset {row['first_offset']} after "
                    f"sequence {row['previous']} at offset {row['previous_offset']}"
                )
        for report in reports.values():
            report.lost = report.expected_count - (
                expected_rows[report.partition] - report.extra_copies
            )

        say("comparing: lost, unexpected")
        losing = [part for part in manifest.partitions if reports[part.partition].lost]
        if losing:
            acked = spark.createDataFrame([], "partition int, sequence long")
            for part in losing:
                for run in part.acked:
                    acked = acked.unionByName(
                        spark.range(run.sequence, run.sequence + run.length).select(
                            F.lit(part.partition).cast("int").alias("partition"),
                            F.col("id").alias("sequence"),
                        )
                    )
            gone = acked.join(valued, ["partition", "sequence"], "left_anti")
            ranked = Window.partitionBy("partition").orderBy("sequence")
            for row in (
                gone.withColumn("rank", F.row_number().over(ranked))
                .where(F.col("rank") <= examples)
                .collect()
            ):
                part = manifest.partition(int(row["partition"]))
                number = int(row["sequence"])
                name = manifest.scheme.prefix(part.partition, number).decode()
                reports[part.partition].lost_examples.append(
                    f"{name!r} (sequence {number}, acknowledged at offset {part.offset_of(number)})"
                )
        if any(report.unexpected for report in reports.values()):
            for row in (
                rows.where(~expected)
                .withColumn(
                    "rank", F.row_number().over(Window.partitionBy("partition").orderBy("offset"))
                )
                .where(F.col("rank") <= examples)
                .collect()
            ):
                reports[int(row["partition"])].unexpected_examples.append(
                    f"{row['text']!r} at offset {row['offset']}"
                )
        say("verdict")
    finally:
        rows.unpersist()

    for report in reports.values():
        report.kinds = _kinds(report)
    partitions = [reports[index] for index in sorted(reports)]
    kinds = [kind for kind in KINDS if any(kind in report.kinds for report in partitions)]
    return VerifyReport(
        topic=manifest.topic,
        source=source,
        producer=manifest.scheme.producer,
        expected_records=manifest.records,
        read_records=sum(report.read_count for report in partitions),
        ok=not kinds,
        kinds=kinds,
        diagnosis=diagnose(partitions),
        seconds=time.perf_counter() - started,
        partitions=partitions,
    )


def _kinds(report: PartitionReport) -> list[str]:
    kinds = []
    if report.lost:
        kinds.append("lost")
    if report.duplicates:
        kinds.append("duplicate")
    if report.reordered:
        kinds.append("reordered")
    if report.unexpected:
        kinds.append("unexpected")
    # Lost, duplicated or foreign records change both sums, records out of order the placed
    # one: a difference is reported as its own kind only when nothing else explains it.
    explained = report.lost or report.duplicates or report.unexpected
    if (report.read_values_checksum != report.expected_values_checksum and not explained) or (
        report.read_placed_checksum != report.expected_placed_checksum
        and not (explained or report.reordered)
    ):
        kinds.append("checksum")
    return kinds


def diagnose(partitions: list[PartitionReport]) -> str:
    """One paragraph per kind found, naming the partitions and a few examples."""
    lines: list[str] = []
    for report in partitions:
        where = f"partition {report.partition}"
        if report.lost:
            hint = ""
            if (
                report.read_first_offset is not None
                and report.expected_first_offset is not None
                and report.read_first_offset > report.expected_first_offset
            ):
                hint = (
                    f"; nothing read below offset {report.read_first_offset} "
                    f"(acknowledged from {report.expected_first_offset}: the log start moved?)"
                )
            lines.append(
                f"lost: {where}: {report.lost} of {report.expected_count} acknowledged records "
                f"not read{hint}; e.g. {'; '.join(report.lost_examples) or '-'}"
            )
        if report.duplicates:
            lines.append(
                f"duplicate: {where}: {report.duplicates} values read at more than one offset "
                f"({report.extra_copies} extra copies); e.g. "
                f"{'; '.join(report.duplicate_examples) or '-'}"
            )
        if report.reordered:
            lines.append(
                f"reordered: {where}: {report.reordered} records out of the producer's order; "
                f"e.g. {'; '.join(report.reordered_examples) or '-'}"
            )
        if report.unexpected:
            lines.append(
                f"unexpected: {where}: {report.unexpected} records this producer never had "
                f"acknowledged there; e.g. {'; '.join(report.unexpected_examples) or '-'}"
            )
        if "checksum" in report.kinds:
            lines.append(
                f"checksum: {where}: the same values were read, but "
                + (
                    "their bytes differ (values checksum "
                    f"{report.read_values_checksum:#x} != {report.expected_values_checksum:#x})"
                    if report.read_values_checksum != report.expected_values_checksum
                    else "not at the offsets they were acknowledged at (placed checksum "
                    f"{report.read_placed_checksum:#x} != {report.expected_placed_checksum:#x})"
                )
            )
    if not lines:
        return "every acknowledged record was read once, in order, with equal checksums"
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- the command


def why(error: BaseException) -> str:
    """``error`` in one line. A source's own error reaches the driver inside Spark's (its message
    carries the source's Python traceback): the traceback's last line, the source's exception,
    says why, e.g. ``ImageError: no metadata log of cluster ...``."""
    text = str(error)
    if "Traceback (most recent call last)" in text:
        for line in reversed(text.splitlines()):
            name, colon, message = line.partition(": ")
            if colon and name and not line[0].isspace() and " " not in name:
                return f"{name.rsplit('.', 1)[-1]}: {message}"
    return repr(error)


@dataclass(frozen=True)
class VerifySettings:
    manifest: Path
    bootstrap: str | None = None
    source: str = "automq"
    path: str | None = None
    object_store: str | None = None
    # A cluster's metadata log on etcd (automq-objects), instead of path.
    etcd_endpoints: str | None = None
    cluster_id: str | None = None
    master: str = "local[*]"
    report: Path = Path("verify-report")
    examples: int = EXAMPLES
    verbose: bool = False  # Spark's own log lines and stage bars


def main(settings: VerifySettings, spark: SparkSession | None = None) -> int:
    """The command. Exit codes: 0 everything matches, 1 a mismatch, 2 the check could not run.

    With ``spark`` given, that session is used (and left running); otherwise one is made for
    ``settings.master`` and stopped at the end."""
    try:
        manifest = Manifest.read(settings.manifest)
    except (OSError, ValueError) as error:
        print(f"automq-ref verify: cannot read the manifest: {error}", file=sys.stderr)
        return 2
    own_session = spark is None
    tally = _VerifyTally()
    # Spark draws its own bars when verbose: ours then keeps to plain lines.
    terminal = False if settings.verbose else None
    try:
        with Progress("automq-ref verify", tally.status, terminal=terminal):
            if spark is None:
                spark = spark_session(settings.master, verbose=settings.verbose)
            tally.spark = spark
            frame = read_source(
                spark,
                settings.source,
                manifest.topic,
                bootstrap=settings.bootstrap,
                path=settings.path,
                object_store=settings.object_store,
                etcd_endpoints=settings.etcd_endpoints,
                cluster_id=settings.cluster_id,
            )
            report = verify_frame(
                spark,
                frame,
                manifest,
                source=settings.source,
                examples=settings.examples,
                progress=tally.say,
            )
            tally.spark = None
    except Exception as error:  # the check did not run: say why, exit 2
        print(f"automq-ref verify: the check could not run: {why(error)}", file=sys.stderr)
        return 2
    finally:
        if own_session and spark is not None:
            spark.stop()
    report.write(settings.report)
    print(report.text(), end="", flush=True)
    print(f"report: {settings.report / 'report.txt'}, {settings.report / 'report.json'}")
    summary = {"ok": report.ok, "kinds": report.kinds, "records": report.read_records}
    print(json.dumps(summary), flush=True)
    return 0 if report.ok else 1
