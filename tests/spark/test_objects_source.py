"""The ``automq-objects`` source: Spark reads topics from the broker's objects, not the broker.

Records are produced with every codec, the broker is stopped gracefully (which uploads and
commits everything), and Spark must return exactly the produced rows, one Spark partition per
object range; DeleteRecords must hide the rows below the new log start; with
``kafka.isolation.level=read_committed`` a topic written with transactions (a committed, an
aborted and an open one, plain records around them) reads exactly its committed and plain
records below the last stable offset, with ``read_uncommitted`` (the default) every record; the
same works against an S3 object store (moto), and for a broker of a cluster, its metadata log on
etcd (``metadata.etcd.endpoints``, ``cluster.id``), where ``automq-ref verify`` passes too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.spark import image as im
from automq_ref.spark.objects_source import (
    AutoMQObjectsDataSource,
    OptionError,
    check_batch_offsets,
    parse_options,
)
from automq_ref.spark.produce import ProduceSettings
from automq_ref.spark.produce import produce as produce_with_manifest
from automq_ref.spark.verify import VerifySettings
from automq_ref.spark.verify import main as verify
from tests.etcd_fixture import running_etcd, unique_cluster_id
from tests.spark.transactions import Transactions, Written, write_transactions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.conftest import MotoS3

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3
TRIMMED_TO = 11
BASE_TIMESTAMP_MS = 1_700_000_000_000

# (key, value, headers, timestamp ms) per offset, per partition
Sent = dict[int, list[tuple[bytes | None, bytes, list[tuple[str, bytes]], int]]]


@dataclass(frozen=True)
class Produced:
    data_dir: Path
    sent: dict[str, Sent]
    transactions: Transactions | None = None  # topic "txn"; its open transaction left open


def produce(bootstrap: str, topic: str, count: int, codec: str, sent: Sent) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 2,
            "enable.idempotence": True,
        }
    )
    for index in range(count):
        partition = index % PARTITIONS
        key = None if index % 5 == 0 else f"{codec}-k{index}".encode()
        value = f"{codec}-value-{index}-".encode() * (1 + index % 11)
        headers = [("codec", codec.encode()), ("n", str(index).encode())] if index % 3 else []
        timestamp = BASE_TIMESTAMP_MS + len(sent[partition])
        kafka_headers: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=kafka_headers,
            timestamp=timestamp,
        )
        sent[partition].append((key, value, headers, timestamp))
        if index % 40 == 39:
            assert producer.flush(10) == 0
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """This module's broker uploads small objects often, so a partition spans many objects
    (stream objects and stream set objects) and Spark reads many ranges."""
    process = BrokerProcess(
        tmp_path_factory.mktemp("broker") / "data",
        "s3.wal.upload.threshold=8192",
        "s3.wal.upload.interval.ms=300",
        "s3.stream.object.split.size=3000",
    )
    process.start()
    yield process
    if process.alive():
        process.stop()


@pytest.fixture(scope="module")
def produced(broker: BrokerProcess) -> Produced:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in ("codecs", "trimmed"):
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result()
    sent: dict[str, Sent] = {topic: {p: [] for p in range(PARTITIONS)} for topic in ("codecs",)}
    sent["trimmed"] = {p: [] for p in range(PARTITIONS)}
    for codec in CODECS:
        produce(broker.bootstrap, "codecs", 120, codec, sent["codecs"])
    produce(broker.bootstrap, "trimmed", 90, "lz4", sent["trimmed"])
    result = admin.delete_records([TopicPartition("trimmed", p, TRIMMED_TO) for p in (0, 1)])
    for future in result.values():
        future.result()
    transactions = write_transactions(broker.bootstrap, "txn")
    assert broker.stop() == 0  # graceful: everything is uploaded and committed
    return Produced(broker.data_dir, sent, transactions)


@pytest.fixture(scope="module")
def objects(spark: SparkSession) -> SparkSession:
    spark.dataSource.register(AutoMQObjectsDataSource)
    return spark


def read(spark: SparkSession, **options: str) -> DataFrame:
    reader = spark.read.format("automq-objects")
    for name, value in options.items():
        reader = reader.option(name.replace("_", "."), value)
    return reader.load()


Row = tuple[str, int, int, bytes | None, bytes, list[tuple[str, bytes]], int]


def collect(frame: DataFrame) -> list[Row]:
    from pyspark.sql import functions as F

    columns: list[Any] = ["topic", "partition", "offset", "key", "value"]
    if "headers" in frame.columns:
        columns.append("headers")
    columns.append(F.unix_micros("timestamp").alias("micros"))
    rows: list[Row] = []
    for row in frame.select(*columns).collect():
        fields = row.asDict()
        headers = [(h["key"], bytes(h["value"])) for h in fields.get("headers") or []]
        key = None if row["key"] is None else bytes(row["key"])
        rows.append(
            (row["topic"], row["partition"], row["offset"], key, bytes(row["value"]), headers,
             row["micros"] // 1000)
        )  # fmt: skip
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


def expected(
    produced: Produced, topic: str, ranges: dict[int, tuple[int, int]] | None = None
) -> list[Row]:
    rows: list[Row] = []
    for partition, records in sorted(produced.sent[topic].items()):
        start, end = (ranges or {}).get(partition, (0, len(records)))
        for offset in range(start, end):
            key, value, headers, timestamp = records[offset]
            rows.append((topic, partition, offset, key, value, headers, timestamp))
    return rows


def test_reads_exactly_the_produced_rows(objects: SparkSession, produced: Produced) -> None:
    frame = read(objects, path=str(produced.data_dir), subscribe="codecs", includeHeaders="true")
    assert collect(frame) == expected(produced, "codecs")
    layout = im.read_layout(im.locate(produced.data_dir))
    ranges = sum(len(layout.partitions[("codecs", p)].objects) for p in range(PARTITIONS))
    assert frame.rdd.getNumPartitions() == ranges
    kinds = {
        r.is_stream_object
        for p in range(PARTITIONS)
        for r in layout.partitions[("codecs", p)].objects
    }
    assert ranges > 3 * PARTITIONS and kinds == {True, False}, (ranges, kinds)
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )


def test_delete_records_hides_the_rows_below_the_log_start(
    objects: SparkSession, produced: Produced
) -> None:
    trimmed = {p: (TRIMMED_TO, 30) for p in (0, 1)}
    frame = read(objects, path=str(produced.data_dir), subscribePattern="trim.*")
    assert [r[:6] for r in collect(frame)] == [
        (*r[:5], []) for r in expected(produced, "trimmed", trimmed)
    ]
    # An explicit start below the log start is data loss: refused, or skipped when allowed.
    below = '{"trimmed": {"0": 3, "1": -2, "2": 4}}'
    with pytest.raises(Exception, match=r"startingOffsets.*below its log start"):
        read(
            objects, path=str(produced.data_dir), subscribe="trimmed", startingOffsets=below
        ).count()
    frame = read(
        objects,
        path=str(produced.data_dir),
        subscribe="trimmed",
        startingOffsets=below,
        failOnDataLoss="false",
    )
    ranges = {**trimmed, 2: (4, 30)}
    assert [r[:3] for r in collect(frame)] == [r[:3] for r in expected(produced, "trimmed", ranges)]


def test_offset_ranges_and_assign(objects: SparkSession, produced: Produced) -> None:
    frame = read(
        objects,
        metadata_dir=str(produced.data_dir / "metadata"),
        objectStore=(produced.data_dir / "objects").resolve().as_uri(),
        assign='{"codecs": [0, 2]}',
        startingOffsets='{"codecs": {"0": 150, "2": -2}}',
        endingOffsets='{"codecs": {"0": 161, "2": 7}}',
    )
    want = expected(produced, "codecs", {0: (150, 161), 2: (0, 7)})
    assert [r[:5] for r in collect(frame)] == [r[:5] for r in want if r[1] in (0, 2)]


def test_bad_options_name_the_option(objects: SparkSession, produced: Produced) -> None:
    path = str(produced.data_dir)
    cases = [
        ({"subscribe": "codecs"}, "option path"),
        ({"path": path}, "subscribe, subscribePattern, assign"),
        ({"path": path, "subscribe": "codecs", "assign": "{}"}, "exactly one of"),
        ({"path": path, "subscribe": "codecs", "startingOffsets": "oldest"}, "startingOffsets"),
        ({"path": path, "subscribe": "codecs", "startingOffsets": "latest"}, "startingOffsets"),
        ({"path": path, "subscribe": "codecs", "endingOffsets": "[1]"}, "endingOffsets"),
        ({"path": path, "subscribe": "codecs", "includeHeaders": "yes"}, "includeHeaders"),
        ({"path": path, "subscribePattern": "("}, "subscribePattern"),
        ({"path": path, "assign": "[0]"}, "assign"),
        ({"path": path, "subscribe": "codecs", "s3.accessKeyId": "x"}, "s3.accessKeyId"),
        (
            {"path": path, "subscribe": "codecs", "kafka.isolation.level": "committed"},
            "option kafka.isolation.level must be read_uncommitted",
        ),
        (
            {"path": path, "subscribe": "c", "metadata.etcd.endpoints": "a:1", "objectStore": "x"},
            "options path/metadata.dir and metadata.etcd.endpoints name two metadata logs",
        ),
        (
            {"subscribe": "c", "metadata.etcd.endpoints": "a:1"},
            "option objectStore is required with metadata.etcd.endpoints",
        ),
        ({"path": path, "subscribe": "c", "cluster.id": "x"}, "option cluster.id applies only"),
        (
            {"subscribe": "c", "metadata.etcd.endpoints": "nohost", "objectStore": "x"},
            "option metadata.etcd.endpoints: 'nohost': expected host:port",
        ),
        (
            {
                "subscribe": "c",
                "metadata.etcd.endpoints": "a:1",
                "cluster.id": "",
                "objectStore": "x",
            },
            "option cluster.id: '': must be non-empty",
        ),
    ]
    for options, message in cases:
        with pytest.raises(OptionError, match=message):
            check_batch_offsets(parse_options({k.lower(): v for k, v in options.items()}))
    # Through Spark, errors found while planning still name the option.
    with pytest.raises(Exception, match="startingOffsets"):
        read(objects, path=path, subscribe="codecs", startingOffsets='{"codecs": {"0": 1}}').count()
    with pytest.raises(Exception, match="objectStore"):
        read(
            objects, path=path, subscribe="codecs", objectStore="file:///nonexistent/objects"
        ).count()
    empty = read(objects, path=path, subscribe="no-such-topic")
    assert empty.count() == 0
    with pytest.raises(Exception, match=r"kafka\.isolation\.level must be read_uncommitted"):
        read(objects, path=path, subscribe="txn", kafka_isolation_level="snapshot").count()


def written(frame: DataFrame) -> list[Written]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in frame.collect())


def test_read_committed_hides_aborted_and_open_transactions(
    objects: SparkSession, produced: Produced
) -> None:
    txn = produced.transactions
    assert txn is not None
    path = str(produced.data_dir)
    committed = read(objects, path=path, subscribe="txn", kafka_isolation_level="read_committed")
    assert written(committed) == txn.committed
    for level in ({}, {"kafka_isolation_level": "read_uncommitted"}):
        assert written(read(objects, path=path, subscribe="txn", **level)) == txn.everything
    # An explicit end past the last stable offset is cut to it, as at the committed end.
    beyond = f'{{"txn": {{"0": {txn.stable[0] + 3}}}}}'
    cut = read(
        objects,
        path=path,
        assign='{"txn": [0]}',
        endingOffsets=beyond,
        kafka_isolation_level="read_committed",
    )
    assert written(cut) == [w for w in txn.committed if w[0] == 0]
    # The graceful stop wrote each partition's checkpoint, its open transaction in it: the
    # replay starts from it and reads no batch.
    layout = im.read_layout(
        im.locate(produced.data_dir), lambda t: t == "txn", transactions=lambda t, p: True
    )
    for p in (0, 1):
        partition = layout.partitions[("txn", p)]
        state = partition.transactions
        assert state is not None and state.checkpoint_ignored is None
        assert state.replayed_from == partition.committed_end_offset
        assert state.stable_offset == txn.stable[p]
        first_aborted = min(o for q, o, _ in txn.aborted if q == p)
        assert [(first, last > first) for _, first, last in state.aborted] == [
            (first_aborted, True)
        ]


@pytest.fixture
def s3_broker(tmp_path: Path, moto_s3: MotoS3) -> Iterator[tuple[BrokerProcess, str]]:
    from automq_ref.io.storage.object_store import S3ObjectStore

    bucket = "automq-objects-source"

    async def create_bucket() -> None:
        async with S3ObjectStore(
            bucket,
            endpoint_url=moto_s3.endpoint_url,
            region=moto_s3.region,
            access_key_id=moto_s3.access_key_id,
            secret_access_key=moto_s3.secret_access_key,
            path_style=True,
        ) as store:
            await store.create_bucket_if_missing()

    asyncio.run(create_bucket())
    uri = f"s3://{bucket}?endpoint={moto_s3.endpoint_url}&region={moto_s3.region}&pathStyle=true"
    credentials = f"&accessKey={moto_s3.access_key_id}&secretKey={moto_s3.secret_access_key}"
    broker = BrokerProcess(tmp_path / "data", f"s3.data.buckets={uri}{credentials}")
    broker.start()
    yield broker, uri
    if broker.alive():
        broker.stop()


def test_objects_in_s3(
    objects: SparkSession, s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker, uri = s3_broker
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("in-s3", num_partitions=PARTITIONS)])["in-s3"].result()
    sent: Sent = {p: [] for p in range(PARTITIONS)}
    produce(broker.bootstrap, "in-s3", 60, "zstd", sent)
    assert broker.stop() == 0
    assert not (broker.data_dir / "objects").exists()
    with pytest.raises(Exception, match="objectStore"):
        read(objects, path=str(broker.data_dir), subscribe="in-s3").count()  # no local objects
    frame = read(
        objects,
        path=str(broker.data_dir),
        subscribe="in-s3",
        objectStore=uri,
        includeHeaders="true",
        s3_accessKeyId=moto_s3.access_key_id,
        s3_secretAccessKey=moto_s3.secret_access_key,
    )
    assert collect(frame) == expected(Produced(broker.data_dir, {"in-s3": sent}), "in-s3")


def test_a_cluster_on_etcd(
    objects: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker of a cluster: its metadata log on etcd, its objects in a directory store. Once it
    stopped gracefully, its topics are read through the cluster's etcd (no path), and
    ``automq-ref verify`` passes through it."""
    store = tmp_path / "objects"
    store.mkdir()
    cluster_id = unique_cluster_id("spark")
    with running_etcd() as etcd:
        broker = BrokerProcess(
            tmp_path / "data",
            f"metadata.etcd.endpoints={etcd.endpoint}",
            f"cluster.id={cluster_id}",
            f"s3.data.buckets={store.as_uri()}",
            "node.id=1",
        )
        broker.start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            for future in admin.create_topics([NewTopic("on-etcd", PARTITIONS)]).values():
                future.result()
            sent: Sent = {p: [] for p in range(PARTITIONS)}
            produce(broker.bootstrap, "on-etcd", 60, "zstd", sent)
            manifest = produce_with_manifest(
                ProduceSettings(
                    bootstrap=broker.bootstrap, topic="verified", partitions=PARTITIONS, records=90
                )
            ).manifest
            manifest.write(tmp_path / "manifest.json")
        finally:
            assert broker.stop() == 0  # graceful: everything is uploaded and committed
        cluster = {
            "metadata.etcd.endpoints": etcd.endpoint,
            "cluster.id": cluster_id,
            "objectStore": store.as_uri(),
        }
        frame = read(objects, subscribe="on-etcd", includeHeaders="true", **cluster)
        assert collect(frame) == expected(Produced(broker.data_dir, {"on-etcd": sent}), "on-etcd")
        with pytest.raises(Exception, match="no metadata log of cluster 'elsewhere'"):
            read(objects, subscribe="on-etcd", **{**cluster, "cluster.id": "elsewhere"}).count()
        report = tmp_path / "report"
        settings = VerifySettings(
            manifest=tmp_path / "manifest.json",
            source="automq-objects",
            etcd_endpoints=etcd.endpoint,
            cluster_id=cluster_id,
            object_store=store.as_uri(),
            report=report,
        )
        code = verify(settings, spark=objects)
        summary = (report / "report.json").read_text()
        assert code == 0, summary
        assert f'"read_records": {manifest.records}' in summary
        capsys.readouterr()
        assert verify(replace(settings, cluster_id="elsewhere"), spark=objects) == 2
        assert (
            "automq-ref verify: the check could not run: ImageError: no metadata log of cluster "
            f"'elsewhere' on etcd at {etcd.endpoint}: set cluster.id to the brokers' cluster.id "
            f"(clusters there: "
        ) in capsys.readouterr().err
