"""The Spark sources and ``automq-ref verify`` on a Spark standalone cluster, not only ``local[*]``.

One cluster for the module (:mod:`automq_ref.spark.standalone`: a master and two workers of one
core each, executors in JVMs of their own; its daemons start while the broker is made ready) and
one broker whose objects go to S3 (moto), uploaded every 200 ms. Records are produced with a
manifest; then, on the cluster:

- the ``automq`` source, with a bootstrap list whose first address has no broker (as a cluster's
  list with one broker down), and the ``automq-objects`` source, reading the running broker's
  metadata log read-only on the driver and the objects from S3 on the executors, each return
  the acknowledged records (the manifest's count and both checksums in every partition), and
  every task that read them ran in an executor under one of the two workers' directories, in a
  process other than the driver, importing this tree's code;
- ``automq-ref verify --master spark://...`` (the command's own entry point, making its own
  session on that master) passes on the same topic through ``automq-objects``, and the master
  lists it among its finished applications.

The cluster is stopped, and its directory removed, whatever the outcome; no executor outlives it.
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
from automq_ref.checker.cluster import BrokerProcess
from automq_ref.spark import image as im
from automq_ref.spark.manifest import Manifest
from automq_ref.spark.produce import ProduceSettings, produce
from automq_ref.spark.standalone import StandaloneCluster, free_port, start_cluster
from automq_ref.spark.verify import checksum_summary, read_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from tests.conftest import MotoS3

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
PARTITIONS = 4
RECORDS = 400
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
def cluster() -> Iterator[StandaloneCluster]:
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
    broker: BrokerProcess
    store_uri: str  # the broker's s3.data.buckets, credentials included
    manifest: Manifest
    manifest_path: Path


@pytest.fixture(scope="module")
def topic(tmp_path_factory: pytest.TempPathFactory, moto_s3: MotoS3) -> Iterator[Topic]:
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
    uri = (
        f"s3://{BUCKET}?endpoint={moto_s3.endpoint_url}&region={moto_s3.region}&pathStyle=true"
        f"&accessKey={moto_s3.access_key_id}&secretKey={moto_s3.secret_access_key}"
    )
    directory = tmp_path_factory.mktemp("standalone")
    broker = BrokerProcess(
        directory / "data",
        f"s3.data.buckets={uri}",
        "s3.wal.upload.threshold=4096",
        "s3.wal.upload.interval.ms=200",
    )
    broker.start()
    try:
        result = produce(
            ProduceSettings(
                bootstrap=broker.bootstrap,
                topic="on-a-cluster",
                partitions=PARTITIONS,
                records=RECORDS,
                codec="zstd",
                value_bytes=80,
            )
        )
        assert result.failed == 0
        manifest = result.manifest
        path = directory / "manifest.json"
        manifest.write(path)
        _wait_until_committed(broker.data_dir, uri, manifest)
        yield Topic(broker, uri, manifest, path)
    finally:
        if broker.alive():
            broker.stop()


def _wait_until_committed(data_dir: Path, uri: str, manifest: Manifest) -> None:
    """Until the objects hold every acknowledged record (the broker keeps running)."""
    location = im.locate(data_dir, object_store_uri=uri)
    wanted = {part.partition: (part.last_offset or 0) + 1 for part in manifest.partitions}
    deadline = time.monotonic() + 30
    while True:
        layout = im.read_layout(location, lambda name: name == manifest.topic)
        committed = {
            index: partition.committed_end_offset
            for (_, index), partition in layout.partitions.items()
        }
        if committed == wanted:
            return
        assert time.monotonic() < deadline, f"committed {committed}, produced {wanted}"
        time.sleep(0.3)


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
def cluster_spark(cluster: StandaloneCluster, topic: Topic) -> Iterator[SparkSession]:
    """A session on the cluster; both executors register before the first job runs."""
    from pyspark.sql import SparkSession

    cluster.wait_for_workers()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(cluster.master_url)
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
        assert session.sparkContext.master == cluster.master_url
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
    cluster_spark: SparkSession, cluster: StandaloneCluster, topic: Topic
) -> None:
    spark, manifest = cluster_spark, topic.manifest
    nobody = f"127.0.0.1:{free_port()}"
    frame = read_source(
        spark, "automq", manifest.topic, bootstrap=f"{nobody},{topic.broker.bootstrap}"
    )
    _check_contents(frame, manifest)
    _check_executors(cluster, _where_tasks_ran(frame))

    frame = read_source(
        spark,
        "automq-objects",
        manifest.topic,
        path=str(topic.broker.data_dir),
        object_store=topic.store_uri,
    )
    _check_contents(frame, manifest)
    _check_executors(cluster, _where_tasks_ran(frame))
    assert topic.broker.alive()


def test_verify_command_on_the_cluster(
    cluster: StandaloneCluster,
    topic: Topic,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None  # verify makes its own, on the cluster
    cluster.wait_for_workers()
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    code = cli.main(
        [
            "verify",
            "--manifest",
            str(topic.manifest_path),
            "--source",
            "automq-objects",
            "--path",
            str(topic.broker.data_dir),
            "--object-store",
            topic.store_uri,
            "--master",
            cluster.master_url,
            "--report",
            str(tmp_path / "report"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"ok": True, "kinds": [], "records": RECORDS}
    finished = [app["name"] for app in cluster.status()["completedapps"]]
    assert "automq-ref verify" in finished
    assert SparkSession.getActiveSession() is None  # and stopped it
    assert topic.broker.alive()


def test_the_launcher_refuses_a_cluster_without_workers(capsys: pytest.CaptureFixture[str]) -> None:
    from automq_ref.spark import standalone

    handler = signal.getsignal(signal.SIGTERM)
    assert standalone.main(["--workers", "0"]) == 2
    assert "at least one worker" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == handler  # the command's own handler is undone
