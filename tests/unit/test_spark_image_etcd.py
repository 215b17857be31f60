"""Planning reads from a cluster's metadata log on etcd, without Spark, and without writing to etcd.

Three layers: the settings that name the log (checked as the broker checks them), where the
objects are, and that reading a file log never loads etcd's client; a hand-built log on etcd, a
snapshot in the middle, read exactly as the same records read from a file log, while nothing in
etcd changes (no revision, no lease); and a real broker on etcd (``metadata.etcd.endpoints``)
with its objects in a local directory store, uploading small objects often and snapshotting its
metadata log in etcd often: read while it runs (a contiguous prefix of what was produced, the
broker's election and lease untouched, the broker still producing afterwards), then after a
graceful stop (exactly what was produced).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.config import BrokerConfig
from automq_ref.formats.metadata_record import decode_record, encode_snapshot
from automq_ref.io.metadata.election import election_key
from automq_ref.io.metadata.etcd_client import EtcdClient, Get, KeyValue, prefix_end
from automq_ref.io.metadata.etcd_metadata_log import EtcdMetadataLog, cluster_prefix
from automq_ref.io.metadata.metadata_log import read_log_directory
from automq_ref.spark import image as im
from automq_ref.state_machines import stream_metadata as sm
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.unit.test_spark_image import (
    SMALL_OBJECTS,
    check_contiguous,
    offsets_read,
    produce,
    write_hand_built_broker,
)
from tests.waiting import PATIENCE_S, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


# ---------------------------------------------------------------------- naming the log


def test_the_settings_are_checked_as_the_broker_checks_them(tmp_path: Path) -> None:
    default = BrokerConfig.model_fields["cluster_id"].default
    assert im.etcd_log("127.0.0.1:2379") == im.EtcdLog(("127.0.0.1:2379",), default)
    assert im.etcd_log(" http://a:1, b:2 ", "orders") == im.EtcdLog(("a:1", "b:2"), "orders")
    assert im.etcd_log(["a:1", "b:2"], "x").endpoints == ("a:1", "b:2")
    for endpoints, cluster_id, setting, problem in (
        ("localhost", None, "metadata.etcd.endpoints", "expected host:port"),
        (" , ", None, "metadata.etcd.endpoints", "no endpoint"),
        ("a:1", "a/b", "cluster.id", "without '/'"),
        ("a:1", "", "cluster.id", "non-empty"),
    ):
        with pytest.raises(im.SettingError, match=problem) as caught:
            im.etcd_log(endpoints, cluster_id)
        assert caught.value.setting == setting
        assert str(caught.value).startswith(f"{setting}: ")

    log = im.etcd_log("a:1", "c")
    store = tmp_path.as_uri()
    assert im.locate(etcd=log, object_store_uri=store) == im.Location(None, store, log)
    with pytest.raises(im.ImageError, match="not both"):
        im.locate(tmp_path, etcd=log, object_store_uri=store)
    with pytest.raises(im.ImageError, match="not both"):
        im.locate(metadata_dir=tmp_path, etcd=log, object_store_uri=store)
    with pytest.raises(im.ImageError, match=r"name the object store \(the brokers' s3"):
        im.locate(etcd=log)
    with pytest.raises(im.ImageError, match="no directory"):
        im.locate(etcd=log, object_store_uri=(tmp_path / "nowhere").as_uri())


def test_reading_a_file_log_never_loads_etcds_client(tmp_path: Path) -> None:
    """etcd's client (gRPC) is imported only to read a log on etcd, as the broker's is."""
    asyncio.run(write_hand_built_broker(tmp_path))
    script = (
        "import sys\n"
        "from automq_ref.spark import image as im\n"
        f"layout = im.read_layout(im.locate({str(tmp_path)!r}))\n"
        "assert set(layout.topics) == {'hand'}, layout.topics\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] in ('grpc', 'aetcd'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert result.returncode == 0, result.stderr


# -------------------------------------------------------------- a hand-built log on etcd


def etcd_state(endpoint: str) -> tuple[int, list[str]]:
    """etcd's revision and its leases, through its HTTP gateway (not this code's client)."""

    def post(path: str, body: dict[str, str]) -> dict[str, object]:
        request = urllib.request.Request(
            f"http://{endpoint}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            answer: dict[str, object] = json.loads(reply.read())
            return answer

    header = post("/v3/kv/range", {"key": "AA=="})["header"]
    assert isinstance(header, dict)
    leases = post("/v3/lease/leases", {}).get("leases") or []
    assert isinstance(leases, list)
    return int(header["revision"]), sorted(str(lease["ID"]) for lease in leases)


def copy_to_etcd(endpoint: str, cluster_id: str, metadata_dir: Path, snapshot_at: int) -> int:
    """The file log's records as a cluster's log on etcd: the first ``snapshot_at`` of them as a
    snapshot (its records truncated), the rest as records after it. The log's next index."""

    async def copy() -> int:
        snapshot, entries = read_log_directory(metadata_dir)
        assert snapshot is None and len(entries) > snapshot_at
        image = sm.EMPTY_IMAGE
        for entry in entries[:snapshot_at]:
            image = sm.replay(image, decode_record(entry.payload))
        async with await EtcdMetadataLog.connect([endpoint], cluster_id) as log:
            payloads = [entry.payload for entry in entries]
            await log.append(payloads[:snapshot_at], expected_next_index=0)
            await log.install_snapshot(snapshot_at, encode_snapshot(sm.image_records(image)))
            await log.append(payloads[snapshot_at:], expected_next_index=snapshot_at)
            assert (log.first_index, log.next_index) == (snapshot_at, len(entries))
            return log.next_index

    return asyncio.run(copy())


def test_a_log_on_etcd_reads_as_the_same_log_on_file(tmp_path: Path, etcd: EtcdServer) -> None:
    asyncio.run(write_hand_built_broker(tmp_path))
    cluster_id = unique_cluster_id("image")
    next_index = copy_to_etcd(etcd.endpoint, cluster_id, tmp_path / "metadata", snapshot_at=4)
    on_file = im.read_layout(im.locate(tmp_path))
    location = im.locate(
        etcd=im.etcd_log(etcd.endpoint, cluster_id),
        object_store_uri=on_file.location.object_store_uri,
    )
    before = etcd_state(etcd.endpoint)
    on_etcd = im.read_layout(location)
    assert etcd_state(etcd.endpoint) == before  # nothing written, no lease taken
    assert on_etcd.metadata.next_index == next_index
    assert on_etcd.metadata.image.streams == on_file.metadata.image.streams
    assert on_etcd.metadata.image.objects == on_file.metadata.image.objects
    assert on_etcd.metadata.image.kv == on_file.metadata.image.kv
    assert on_etcd.topics == on_file.topics
    assert on_etcd.partitions == on_file.partitions
    partition = on_etcd.partitions[("hand", 0)]
    assert list(offsets_read(location.object_store_uri, partition.objects)) == [
        (offset, f"v{offset}".encode()) for offset in range(5, 20)
    ]
    assert str(location.etcd) == f"cluster {cluster_id!r} on etcd at {etcd.endpoint}"


def test_a_cluster_id_without_a_log_is_named_and_not_created(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    asyncio.run(write_hand_built_broker(tmp_path))
    known = unique_cluster_id("known")
    copy_to_etcd(etcd.endpoint, known, tmp_path / "metadata", snapshot_at=1)
    missing = unique_cluster_id("missing")
    location = im.locate(
        etcd=im.etcd_log(etcd.endpoint, missing), object_store_uri=tmp_path.as_uri()
    )
    before = etcd_state(etcd.endpoint)
    with pytest.raises(im.ImageError, match=f"no metadata log of cluster '{missing}'") as caught:
        im.read_layout(location)
    assert "set cluster.id to the brokers' cluster.id" in str(caught.value)
    assert known in str(caught.value)  # the clusters that are there
    assert etcd_state(etcd.endpoint) == before


def test_an_unreachable_etcd_is_an_image_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    log = im.etcd_log(f"127.0.0.1:{dead}", "nowhere")
    with pytest.raises(im.ImageError, match="metadata log of cluster 'nowhere' on etcd at 127"):
        asyncio.run(im.load_etcd_image(log, request_timeout_s=1.0))


# ------------------------------------------------------------------------ a real broker


def etcd_key(endpoint: str, key: bytes) -> KeyValue | None:
    async def read() -> KeyValue | None:
        client = await EtcdClient.connect([endpoint])
        try:
            return await client.get(key)
        finally:
            await client.close()

    return asyncio.run(read())


def snapshot_index(endpoint: str, cluster_id: str) -> int | None:
    async def read() -> int | None:
        client = await EtcdClient.connect([endpoint])
        log = EtcdMetadataLog(client, cluster_id, owns_client=True)
        try:
            snapshot = await log.snapshot()
            return None if snapshot is None else snapshot.index
        finally:
            await log.close()

    return asyncio.run(read())


def cluster_keys(endpoint: str, cluster_id: str) -> int:
    async def count() -> int:
        prefix = cluster_prefix(cluster_id).encode()
        client = await EtcdClient.connect([endpoint])
        try:
            return len((await client.range(Get(prefix, prefix_end(prefix)))).kvs)
        finally:
            await client.close()

    return asyncio.run(count())


def test_a_broker_on_etcd_read_while_it_runs_and_after_it_stopped(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster_id = unique_cluster_id("broker")
    objects = tmp_path / "objects"
    objects.mkdir()
    broker = BrokerProcess(
        tmp_path / "data",
        *SMALL_OBJECTS,
        f"metadata.etcd.endpoints={etcd.endpoint}",
        f"cluster.id={cluster_id}",
        f"s3.data.buckets={objects.as_uri()}",
        "node.id=1",
        # A snapshot in etcd as soon as a few records followed the last one.
        "metadata.log.max.record.bytes.between.snapshots=2048",
    )
    location = im.locate(
        etcd=im.etcd_log(f"http://{etcd.endpoint}", cluster_id), object_store_uri=objects.as_uri()
    )
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("gamma", num_partitions=3)])["gamma"].result(60)
        sent = produce(broker.bootstrap, "gamma", 3, 150)
        election = etcd_key(etcd.endpoint, election_key(cluster_id))
        assert election is not None
        wait_until(lambda: snapshot_index(etcd.endpoint, cluster_id), "a metadata snapshot in etcd")
        # While the broker runs, follows the log and snapshots it: a prefix of each partition
        # is committed, contiguous from the log start, never more than was produced.
        wait_until(
            lambda: all(
                p.committed_end_offset > 0 for p in im.read_layout(location).partitions.values()
            ),
            "an upload of every partition",
            interval_s=0.3,
        )
        # Reads race with the broker's appends, uploads and snapshot installs.
        readings: list[im.Layout] = []
        producing = threading.Event()
        producing.set()

        def read_while_producing() -> None:
            while producing.is_set() or len(readings) < 3:
                readings.append(im.read_layout(location))

        reader = threading.Thread(target=read_while_producing)
        _, leases = etcd_state(etcd.endpoint)
        reader.start()
        try:
            more = produce(broker.bootstrap, "gamma", 3, 600)
        finally:
            producing.clear()
            reader.join(PATIENCE_S)
        assert not reader.is_alive() and len(readings) >= 3
        for index, values in more.items():
            sent[index] += values
        ends = {index: 0 for index in sent}
        for reading in readings:
            assert set(reading.topics) == {"gamma"}
            for (_, index), partition in reading.partitions.items():
                assert partition.committed_end_offset <= len(sent[index])
                check_contiguous(partition)
                ends[index] = max(ends[index], partition.committed_end_offset)
        assert all(ends.values())
        # No lease taken, no election joined: the broker is still the controller, on the same
        # election key, and goes on.
        assert etcd_state(etcd.endpoint)[1] == leases
        assert etcd_key(etcd.endpoint, election_key(cluster_id)) == election
    finally:
        assert broker.stop() == 0  # graceful: uploads and commits everything
    snapshot_at = snapshot_index(etcd.endpoint, cluster_id)
    assert snapshot_at is not None
    keys = cluster_keys(etcd.endpoint, cluster_id)
    before = etcd_state(etcd.endpoint)
    layout = im.read_layout(location)
    assert etcd_state(etcd.endpoint) == before
    assert cluster_keys(etcd.endpoint, cluster_id) == keys
    assert layout.metadata.next_index >= snapshot_at
    for index, values in sent.items():
        partition = layout.partitions[("gamma", index)]
        assert (partition.log_start_offset, partition.committed_end_offset) == (0, len(values))
        check_contiguous(partition)
        got = list(offsets_read(location.object_store_uri, partition.objects))
        assert got == list(enumerate(values))
    assert not broker.unawaited_coroutines()
