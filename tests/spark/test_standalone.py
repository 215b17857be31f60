"""The Spark sources and ``automq-ref verify`` on a Spark standalone cluster against a cluster
of brokers, not only on ``local[*]``.

One Spark cluster for the module (:mod:`automq_ref.spark.standalone`: a master and two workers
of one core each, executors in JVMs of their own; its daemons start while the brokers are made
ready) and one broker cluster (``running_cluster`` of ``tests/e2e/test_cluster.py``: three
brokers on one etcd, their objects in S3 on moto, uploaded every 200 ms). A topic whose
partitions lead on all three brokers is produced with a manifest; then, on the Spark cluster:

- the ``automq`` source, with a bootstrap list naming an address where nobody listens and
  broker 1 only, reads every partition from its leader (two thirds of them on brokers 2 and 3,
  which it learns from Metadata), and the ``automq-objects`` source reads the cluster's
  metadata log on etcd (read-only, on the driver) and the objects from S3 (on the executors,
  the credentials in the ``s3.*`` options); each returns the acknowledged records (the
  manifest's count and both checksums in every partition), and every task that read them ran
  in an executor under one of the two workers' directories, in a process other than the
  driver, importing this tree's code;
- ``automq-ref verify --master spark://... --source automq-objects --metadata-etcd-endpoints
  ...`` (the command's own entry point, making its own session on that master) passes on the
  same topic, and the master lists it among its finished applications.

The leaders do not move meanwhile (checked at the end), and the brokers run throughout. Both
clusters are stopped, and their directories removed, whatever the outcome; no executor outlives
the Spark cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from automq_ref import cli
from automq_ref.spark import image as im
from automq_ref.spark.manifest import Manifest
from automq_ref.spark.objects_source import AutoMQObjectsDataSource
from automq_ref.spark.produce import ProduceSettings, produce
from automq_ref.spark.standalone import StandaloneCluster, free_port, start_cluster
from automq_ref.spark.verify import checksum_summary, read_source
from tests.e2e.test_cluster import NODES, Cluster, agreed_leaders, create_topic, running_cluster
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from tests.conftest import MotoS3

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
PARTITIONS = 6
RECORDS = 600
TOPIC = "on-a-cluster"
BUCKET = "automq-standalone"


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def _processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is inside ``directory`` (executors run in the
    workers' directories)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, a zombie, or not ours to read
            continue
        if cwd.startswith(str(directory)):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[StandaloneCluster]:
    # Executors inherit the workers' environment: this tree first on their path.
    started = start_cluster(
        WORKERS, cores=1, memory="1g", env={"PYTHONPATH": _pythonpath()}, wait=False
    )
    try:
        yield started
    finally:
        started.stop()
    assert not started.directory.exists()
    deadline = time.monotonic() + 10
    while _processes_in(started.directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_in(started.directory), "executors outlived the cluster"


@dataclass(frozen=True)
class Topic:
    brokers: Cluster
    store: str  # the brokers' s3.data.buckets, without its credentials
    credentials: tuple[str, str]  # access key id, secret
    leaders: dict[int, int]  # partition -> the broker leading it
    manifest: Manifest
    manifest_path: Path

    @property
    def store_with_credentials(self) -> str:
        access_key, secret = self.credentials
        return f"{self.store}&accessKey={access_key}&secretKey={secret}"

    @property
    def etcd(self) -> str:
        return self.brokers.etcd.endpoint


@pytest.fixture(scope="module")
def topic(request: pytest.FixtureRequest, moto_s3: MotoS3) -> Iterator[Topic]:
    """Three brokers on etcd with their objects in S3 (moto), uploaded every 200 ms; a topic
    whose partitions lead on all three, produced with a manifest and committed to objects."""
    from automq_ref.io.storage.object_store import S3ObjectStore

    async def create_bucket() -> None:
        async with S3ObjectStore(
            BUCKET,
            endpoint_url=moto_s3.endpoint_url,
            region=moto_s3.region,
            access_key_id=moto_s3.access_key_id,
            secret_access_key=moto_s3.secret_access_key,
            path_style=True,
        ) as store:
            await store.create_bucket_if_missing()

    asyncio.run(create_bucket())
    store = f"s3://{BUCKET}?endpoint={moto_s3.endpoint_url}&region={moto_s3.region}&pathStyle=true"
    credentials = (moto_s3.access_key_id, moto_s3.secret_access_key)
    failed_before = request.session.testsfailed
    with running_cluster(
        lambda: request.session.testsfailed > failed_before,
        store=f"{store}&accessKey={credentials[0]}&secretKey={credentials[1]}",  # as users do
        overrides=("s3.wal.upload.interval.ms=200",),
    ) as brokers:
        create_topic(brokers.bootstrap(), TOPIC, PARTITIONS)
        leaders = agreed_leaders(brokers, TOPIC)
        assert set(leaders.values()) == set(NODES), leaders
        result = produce(
            ProduceSettings(
                bootstrap=brokers.bootstrap(),
                topic=TOPIC,
                partitions=PARTITIONS,
                records=RECORDS,
                codec="zstd",
                value_bytes=80,
            )
        )
        assert result.failed == 0, result.first_error
        manifest = result.manifest
        path = brokers.root / "manifest.json"
        manifest.write(path)
        made = Topic(brokers, store, credentials, leaders, manifest, path)
        _wait_until_committed(made)
        yield made
        # Nothing moved while Spark read: each partition was read from the broker named above.
        assert agreed_leaders(brokers, TOPIC) == leaders
        assert all(broker.alive() for broker in brokers.brokers.values())


def _wait_until_committed(topic: Topic) -> None:
    """Until the objects hold every acknowledged record (the brokers keep running), as the
    cluster's metadata log on etcd says."""
    manifest = topic.manifest
    location = im.locate(
        etcd=im.etcd_log(topic.etcd, topic.brokers.cluster_id),
        object_store_uri=topic.store_with_credentials,
    )
    wanted = {part.partition: (part.last_offset or 0) + 1 for part in manifest.partitions}
    committed: dict[int, int] = {}

    def all_committed() -> bool:
        nonlocal committed
        layout = im.read_layout(location, lambda name: name == manifest.topic)
        committed = {
            index: partition.committed_end_offset
            for (_, index), partition in layout.partitions.items()
        }
        return committed == wanted

    wait_until(
        all_committed, f"objects holding every acknowledged record ({wanted})", interval_s=0.3
    )


def _where_tasks_ran(frame: DataFrame) -> list[tuple[int, str, str, int]]:
    """(pid, working directory, automq_ref's file, rows) of every task reading ``frame``."""

    def probe(rows: Iterable[Row]) -> Iterator[tuple[int, str, str, int]]:
        import os

        import automq_ref

        yield os.getpid(), os.getcwd(), automq_ref.__file__, sum(1 for _ in rows)

    return frame.rdd.mapPartitions(probe).collect()


def _check_executors(cluster: StandaloneCluster, tasks: list[tuple[int, str, str, int]]) -> None:
    assert sum(rows for *_, rows in tasks) == RECORDS
    assert os.getpid() not in {pid for pid, *_ in tasks}
    # An executor's directory: <cluster>/worker-N/<app id>/<executor id>
    executors = {Path(cwd).relative_to(cluster.directory).parts[:3] for _, cwd, _, _ in tasks}
    assert {parts[0] for parts in executors} == {"worker-1", "worker-2"}, executors
    assert len(executors) == WORKERS
    assert {module for _, _, module, _ in tasks} == {str(ROOT / "automq_ref" / "__init__.py")}


@pytest.fixture
def cluster_spark(spark_cluster: StandaloneCluster, topic: Topic) -> Iterator[SparkSession]:
    """A session on the Spark cluster; both executors register before the first job runs."""
    from pyspark.sql import SparkSession

    spark_cluster.wait_for_workers()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(spark_cluster.master_url)
        .appName("automq-ref standalone test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", str(WORKERS))
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        assert session.sparkContext.master == spark_cluster.master_url
        yield session
    finally:
        session.stop()  # frees the cluster's cores for the next application


def _check_contents(frame: DataFrame, manifest: Manifest) -> None:
    """The acknowledged records, each once at its offset: counts and both checksums."""
    expected = {
        part.partition: (part.count, part.values_checksum, part.placed_checksum)
        for part in manifest.partitions
    }
    assert checksum_summary(frame) == expected


def test_sources_read_on_the_executors(
    cluster_spark: SparkSession,
    spark_cluster: StandaloneCluster,
    topic: Topic,
) -> None:
    spark, manifest = cluster_spark, topic.manifest
    # Broker 1 leads a third of the partitions: the rest are found through its Metadata.
    bootstrap = f"127.0.0.1:{free_port()},{topic.brokers.brokers[1].bootstrap}"
    frame = read_source(spark, "automq", manifest.topic, bootstrap=bootstrap)
    _check_contents(frame, manifest)
    _check_executors(spark_cluster, _where_tasks_ran(frame))

    access_key, secret = topic.credentials
    spark.dataSource.register(AutoMQObjectsDataSource)
    frame = (
        spark.read.format("automq-objects")
        .option("metadata.etcd.endpoints", topic.etcd)
        .option("cluster.id", topic.brokers.cluster_id)
        .option("objectStore", topic.store)
        .option("s3.accessKeyId", access_key)
        .option("s3.secretAccessKey", secret)
        .option("subscribe", manifest.topic)
        .load()
    )
    _check_contents(frame, manifest)
    _check_executors(spark_cluster, _where_tasks_ran(frame))


def test_verify_command_on_the_cluster(
    spark_cluster: StandaloneCluster,
    topic: Topic,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None  # verify makes its own, on the cluster
    spark_cluster.wait_for_workers()
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    code = cli.main(
        [
            "verify",
            "--manifest",
            str(topic.manifest_path),
            "--source",
            "automq-objects",
            "--metadata-etcd-endpoints",
            topic.etcd,
            "--cluster-id",
            topic.brokers.cluster_id,
            "--object-store",
            topic.store_with_credentials,
            "--master",
            spark_cluster.master_url,
            "--report",
            str(tmp_path / "report"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"ok": True, "kinds": [], "records": RECORDS}
    finished = [app["name"] for app in spark_cluster.status()["completedapps"]]
    assert "automq-ref verify" in finished
    assert SparkSession.getActiveSession() is None  # and stopped it


def test_the_launcher_refuses_a_cluster_without_workers(capsys: pytest.CaptureFixture[str]) -> None:
    from automq_ref.spark import standalone

    handler = signal.getsignal(signal.SIGTERM)
    assert standalone.main(["--workers", "0"]) == 2
    assert "at least one worker" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == handler  # the command's own handler is undone
