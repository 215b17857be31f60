"""``automq-ref produce`` and ``verify``: a clean topic passes, damage behind its back is named.

One Spark session and one broker for the module (tests/spark/conftest.py). First a local
DataFrame in the Kafka-source schema with one kind of damage per partition (no broker: the checks
themselves). Then real topics: produced by :mod:`automq_ref.spark.produce` into the broker, read
through the ``automq`` source: a clean topic passes; DeleteRecords on one partition (the log start
moves, the first records are gone) is reported as ``lost`` naming that partition; values re-sent
by a plain producer are reported as ``duplicate``. Last, the broker is stopped gracefully (its WAL
is uploaded) and the same topics are read through ``automq-objects`` from its directory, with the
same verdicts; the broker is started again for the fixture's teardown.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.spark import rows
from automq_ref.spark.manifest import Manifest, PartitionTally, ValueScheme
from automq_ref.spark.produce import ProduceSettings, produce
from automq_ref.spark.verify import VerifySettings, main, read_source, verify_frame, why

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 3
RECORDS = 600  # 200 per partition
TRIMMED_TO = 50


def _local_manifest_and_rows() -> tuple[Manifest, list[tuple[object, ...]]]:
    """Six partitions of 20 records; partition n gets damage n (0 = none)."""
    scheme = ValueScheme(producer="loc", value_bytes=40)
    now = datetime.now(UTC)
    tallies: list[PartitionTally] = []
    table: list[tuple[object, ...]] = []
    for partition in range(6):
        tally = PartitionTally(partition, sent=20)
        log = [scheme.value(partition, sequence) for sequence in range(20)]
        for sequence, value in enumerate(log):
            tally.add(sequence, sequence, value)
        tallies.append(tally)
        if partition == 1:  # lost: sequences 5 and 6 are not read
            placed = [(offset, value) for offset, value in enumerate(log) if offset not in (5, 6)]
        elif partition == 2:  # duplicate: sequence 3 appended again
            placed = [*enumerate(log), (20, log[3])]
        elif partition == 3:  # reordered: sequences 10 and 11 swapped
            log[10], log[11] = log[11], log[10]
            placed = list(enumerate(log))
        elif partition == 4:  # checksum: one filler byte changed
            log[7] = log[7][:-1] + (b"0" if log[7][-1:] != b"0" else b"1")
            placed = list(enumerate(log))
        elif partition == 5:  # unexpected: a foreign value appended
            placed = [*enumerate(log), (20, b"someone-else")]
        else:
            placed = list(enumerate(log))
        table += [(None, value, "t", partition, offset, now, 0) for offset, value in placed]
    manifest = Manifest(topic="t", scheme=scheme, partitions=[t.manifest() for t in tallies])
    return manifest, table


def test_a_sources_error_is_named_in_one_line() -> None:
    """A source's exception reaches the driver inside Spark's, with the source's traceback."""
    inside_spark = (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to generate Python data source read partitions: "
        "Traceback (most recent call last):\n"
        '  File "objects_source.py", line 1, in partitions\n'
        "    layout = read_layout(\n"
        "automq_ref.spark.image.ImageError: no metadata log of cluster 'c': set cluster.id\n"
        " SQLSTATE: 38000"
    )
    assert (
        why(Exception(inside_spark)) == "ImageError: no metadata log of cluster 'c': set cluster.id"
    )
    assert why(ValueError("plain")) == "ValueError('plain')"


def test_each_kind_of_damage_is_named(spark: SparkSession) -> None:
    manifest, table = _local_manifest_and_rows()
    frame = spark.createDataFrame(table, rows.schema_ddl(False))
    report = verify_frame(spark, frame, manifest, examples=3)
    by_partition = {part.partition: part for part in report.partitions}
    assert [by_partition[index].kinds for index in range(6)] == [
        [],
        ["lost"],
        ["duplicate"],
        ["reordered"],
        ["checksum"],
        ["unexpected"],
    ]
    assert report.kinds == ["lost", "duplicate", "reordered", "unexpected", "checksum"]
    assert not report.ok
    lost = by_partition[1]
    assert (lost.lost, lost.read_count) == (2, 18)
    assert lost.lost_examples[0].startswith("'loc-00001-000000000005'")
    assert "acknowledged at offset 5" in lost.lost_examples[0]
    assert by_partition[2].duplicates == 1
    assert "sequence 3" in by_partition[2].duplicate_examples[0]
    assert by_partition[3].reordered == 1
    assert by_partition[3].reordered_examples == [
        "sequence 10 at offset 11 after sequence 11 at offset 10"
    ]
    assert "their bytes differ" in report.diagnosis
    assert by_partition[5].unexpected_examples == ["'someone-else' at offset 20"]
    assert by_partition[0].checksums_match
    assert "partition 1" in report.text()


def _produce(broker: BrokerProcess, topic: str, path: Path) -> Manifest:
    settings = ProduceSettings(
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=PARTITIONS,
        records=RECORDS,
        codec="lz4",
        value_bytes=64,
    )
    result = produce(settings)
    assert result.failed == 0
    assert result.manifest.records == RECORDS
    result.manifest.write(path)
    return result.manifest


@pytest.fixture(scope="module")
def topics(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three topics and their manifests: clean, trimmed behind its back, with duplicates."""
    directory = tmp_path_factory.mktemp("manifests")
    paths = {name: directory / f"{name}.json" for name in ("clean", "trimmed", "doubled")}
    manifests = {name: _produce(broker, f"verify-{name}", path) for name, path in paths.items()}

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.delete_records([TopicPartition("verify-trimmed", 1, TRIMMED_TO)])
    for future in futures.values():
        future.result(timeout=30)

    doubled = manifests["doubled"]
    plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    for sequence in (0, 1, 2):
        plain.produce("verify-doubled", doubled.scheme.value(2, sequence), partition=2)
    assert plain.flush(30) == 0
    return paths


def _verify(
    spark: SparkSession,
    manifest_path: Path,
    report_dir: Path,
    *,
    bootstrap: str | None = None,
    path: str | None = None,
) -> tuple[int, dict[str, object]]:
    settings = VerifySettings(
        manifest=manifest_path,
        report=report_dir,
        bootstrap=bootstrap,
        source="automq" if path is None else "automq-objects",
        path=path,
    )
    code = main(settings, spark=spark)
    assert (report_dir / "report.txt").exists()
    report: dict[str, object] = json.loads((report_dir / "report.json").read_text())
    return code, report


def test_clean_topic_passes_through_automq(
    spark: SparkSession, broker: BrokerProcess, topics: dict[str, Path], tmp_path: Path
) -> None:
    code, report = _verify(spark, topics["clean"], tmp_path, bootstrap=broker.bootstrap)
    assert (code, report["ok"], report["read_records"]) == (0, True, RECORDS)
    assert "OK" in (tmp_path / "report.txt").read_text()


def test_deleted_records_are_lost(
    spark: SparkSession, broker: BrokerProcess, topics: dict[str, Path], tmp_path: Path
) -> None:
    code, report = _verify(spark, topics["trimmed"], tmp_path, bootstrap=broker.bootstrap)
    assert code == 1
    assert report["kinds"] == ["lost"]
    diagnosis = str(report["diagnosis"])
    assert f"lost: partition 1: {TRIMMED_TO} of {RECORDS // PARTITIONS}" in diagnosis
    assert "partition 0" not in diagnosis and "partition 2" not in diagnosis
    assert "log start moved" in diagnosis


def test_resent_values_are_duplicates(
    spark: SparkSession, broker: BrokerProcess, topics: dict[str, Path], tmp_path: Path
) -> None:
    code, report = _verify(spark, topics["doubled"], tmp_path, bootstrap=broker.bootstrap)
    assert code == 1
    assert report["kinds"] == ["duplicate"]
    assert "duplicate: partition 2: 3 values" in str(report["diagnosis"])


def test_the_same_verdicts_through_automq_objects(
    spark: SparkSession, broker: BrokerProcess, topics: dict[str, Path], tmp_path: Path
) -> None:
    broker.stop()  # graceful: the WAL's data is uploaded and committed to objects
    try:
        path = str(broker.data_dir)
        verdicts = {}
        for name, manifest_path in topics.items():
            code, report = _verify(spark, manifest_path, tmp_path / name, path=path)
            verdicts[name] = (code, report["kinds"], report["read_records"])
        assert verdicts == {
            "clean": (0, [], RECORDS),
            "trimmed": (1, ["lost"], RECORDS - TRIMMED_TO),
            "doubled": (1, ["duplicate"], RECORDS + 3),
        }
        frame = read_source(spark, "automq-objects", "verify-clean", path=path)
        assert frame.count() == RECORDS
    finally:
        broker.start()
