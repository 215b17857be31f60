"""The metrics endpoint (automq_ref/io/metrics.py, automq_ref/kafka/broker_metrics.py): AutoMQ's
exporter URI, and a broker scraped by ``prometheus_client``'s own parser while a producer and a
consumer group use it (aiokafka, in this process), whose series move as the traffic flows."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kio.schema.create_topics.v5.request import CreatableTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import i8, i16, i32, i64
from prometheus_client.parser import text_string_to_metric_families

from automq_ref.config import ConfigError, ExporterAddress, load_config, parse_exporter_uri
from automq_ref.errors import KafkaErrorCode
from automq_ref.io.metrics import BrokerMetrics
from automq_ref.io.storage.object_store import LocalDirectoryObjectStore, MeasuredStore, NotFound
from automq_ref.kafka import responses as r
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import request_frame

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
SERIES = re.compile(r"\bkafka_[a-z0-9_]+")


def test_the_exporter_uri_is_automqs() -> None:
    assert parse_exporter_uri("") is None and parse_exporter_uri(" , ") is None
    assert parse_exporter_uri("prometheus://?host=127.0.0.1&port=9464") == ExporterAddress(
        "127.0.0.1", 9464
    )
    assert parse_exporter_uri("prometheus://10.0.0.1:1234") == ExporterAddress("10.0.0.1", 1234)
    # AutoMQ's defaults for what the URI leaves out.
    assert parse_exporter_uri("prometheus://") == ExporterAddress("localhost", 9090)
    assert parse_exporter_uri(" prometheus://?port=0 ") == ExporterAddress("localhost", 0)
    for wrong, says in (
        ("otlp://?endpoint=http://collector:4317", "only prometheus://"),
        ("prometheus://?port=1,prometheus://?port=2", "a second prometheus://"),
        ("prometheus://?port=nine", "the port must be a number"),
        ("prometheus://?port=70000", "the port must be a number"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_exporter_uri(wrong)


def test_a_broker_config_refuses_a_wrong_uri_naming_the_property() -> None:
    with pytest.raises(ConfigError, match=r"s3\.telemetry\.metrics\.exporter\.uri=.otlp"):
        load_config(overrides=["s3.telemetry.metrics.exporter.uri=otlp://x"], environment={})
    config = load_config(
        overrides=["s3.telemetry.metrics.exporter.uri=prometheus://?host=127.0.0.1&port=0"],
        environment={},
    )
    assert config.metrics_exporter == ExporterAddress("127.0.0.1", 0)
    assert load_config(overrides=[], environment={}).metrics_exporter is None


async def test_object_store_requests_are_timed_by_operation_and_outcome(tmp_path: Path) -> None:
    metrics = BrokerMetrics()
    store = MeasuredStore(LocalDirectoryObjectStore(tmp_path / "objects"), metrics)
    async with store:
        await store.put("a/b", b"12345")
        assert await store.get_range("a/b", 1, 3) == b"23"
        with pytest.raises(NotFound):
            await store.get("a/missing")  # an answer: a success
        await store.delete("a/b")
    samples = scrape_text(metrics.exposition().decode())
    latency = "kafka_stream_operation_latency_count"

    def count(name: str, status: str = "success") -> float:
        labels = (("operation_name", name), ("operation_type", "S3Request"), ("status", status))
        return samples.get((latency, labels), 0.0)

    assert (count("PutObject"), count("GetObject"), count("DeleteObject")) == (1, 2, 1)
    assert count("GetObject", "failed") == 0
    assert samples[("kafka_stream_upload_size_total", ())] == 5
    assert samples[("kafka_stream_download_size_total", ())] == 2

    class Broken(LocalDirectoryObjectStore):
        async def head(self, key: str) -> object:  # type: ignore[override]
            raise OSError("the disk is gone")

    broken = MeasuredStore(Broken(tmp_path / "broken"), metrics)
    with pytest.raises(OSError):
        await broken.head("x")
    samples = scrape_text(metrics.exposition().decode())
    assert count("HeadObject", "failed") == 1 and count("HeadObject") == 0


# --------------------------------------------------------------------------- a broker scraped


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            "s3.telemetry.metrics.exporter.uri=prometheus://?host=127.0.0.1&port=0",
        ],
        environment={},
    )
    started = await start_node(config)
    try:
        await started.listen()
        yield started
    finally:
        await started.shutdown()


def scrape_text(text: str) -> Samples:
    """Every sample, by name and sorted labels (parsed by prometheus_client's own parser)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(node: Node) -> Samples:
    assert node.metrics_endpoint is not None
    async with aiohttp.ClientSession() as session, session.get(node.metrics_endpoint.url) as got:
        assert got.status == 200
        assert got.headers["Content-Type"].startswith("text/plain")
        return scrape_text(await got.text())


async def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for number in range(count):
            await producer.send(topic, f"record {number}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def test_a_scraped_broker_counts_its_traffic(node: Node) -> None:
    host, port = node.advertised_address
    bootstrap = f"{host}:{port}"
    before = await scrape(node)
    assert before[("kafka_partition_count", ())] == 0
    # Embedded, the broker's own controller is the active one; it counts itself live.
    assert before[("kafka_controller_active_count", ())] == 1
    assert before[("kafka_broker_active_count", ())] == 1
    assert before[("kafka_broker_fenced_count", ())] == 0
    assert before[("kafka_group_count", ())] == 0
    # No created-time series: AutoMQ's exporter has none.
    assert not any(name.endswith("_created") for name, _ in before)

    await produce(bootstrap, "metered", 10)
    first = await scrape(node)
    topic = (("topic", "metered"),)
    assert first[("kafka_message_count_total", topic)] == 10
    bytes_in = first[("kafka_network_io_bytes_total", (("direction", "in"), *topic))]
    assert bytes_in > 10 * len(b"record 0")
    assert first[("kafka_log_end_offset", (("partition", "0"), *topic))] == 10
    assert first[("kafka_partition_count", ())] >= 1
    assert first[("kafka_request_count_total", (("type", "Produce"),))] >= 1
    assert first[("kafka_request_time_milliseconds_count", (("type", "Produce"),))] >= 1
    appends = (
        ("operation_name", "append"),
        ("operation_type", "S3Storage"),
        ("status", "success"),
    )
    assert first[("kafka_stream_operation_latency_count", appends)] >= 1
    assert first[("kafka_broker_network_io_bytes_total", (("direction", "in"),))] > bytes_in

    consumer = AIOKafkaConsumer(
        "metered",
        bootstrap_servers=bootstrap,
        group_id="readers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        read = 0
        while read < 10:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            read += sum(len(records) for records in batches.values())
        await consumer.commit()
        during = await scrape(node)
        assert during[("kafka_server_connection_count", ())] >= 1
        assert during[("kafka_group_count", ())] == 1
        assert during[("kafka_group_stable_count", ())] == 1
        # The consumer read the tail, from the LogCache (the storage's series, node-wired).
        assert during[("kafka_stream_log_cache_reads_total", (("status", "hit"),))] >= 1
    finally:
        await consumer.stop()

    await produce(bootstrap, "metered", 5)
    after = await scrape(node)
    assert after[("kafka_message_count_total", topic)] == 15
    assert after[("kafka_network_io_bytes_total", (("direction", "out"), *topic))] >= bytes_in
    committed = (("consumer_group", "readers"), ("partition", "0"), *topic)
    assert after[("kafka_group_commit_offset", committed)] == 10
    assert after[("kafka_log_end_offset", (("partition", "0"), *topic))] == 15
    fetches = ("kafka_request_count_total", (("type", "Fetch"),))
    assert after[fetches] > first.get(fetches, 0)
    # Every series the Grafana dashboard asks for is one this broker exports (an error's
    # series once there is one).
    await create_topic(node, "metered")
    exported = {name for name, _ in await scrape(node)}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    wanted = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in SERIES.findall(target["expr"])
    }
    assert len(wanted) >= 10 and wanted <= exported, wanted - exported


async def ask(node: Node, api_key: int, version: int, **body: Any) -> None:
    """One request (kio's ``body``) on a connection of its own, its answer read."""
    host, port = node.advertised_address
    reader, writer = await asyncio.open_connection(host, port)
    try:
        frame = request_frame(api_key, version, 1, **body)
        writer.write(len(frame).to_bytes(4, "big") + frame)
        size = int.from_bytes(await reader.readexactly(4), "big")
        await reader.readexactly(size)
    finally:
        writer.close()
        await writer.wait_closed()


async def create_topic(node: Node, name: str) -> None:
    """CreateTopics (v5) of one topic of one partition; an existing one: TOPIC_ALREADY_EXISTS."""
    topic = CreatableTopic(
        name=TopicName(name),
        num_partitions=i32(1),
        replication_factor=i16(1),
        assignments=(),
        configs=(),
    )
    await ask(node, 19, 5, topics=(topic,), timeout=timedelta(seconds=10), validate_only=False)


def test_a_typed_response_lists_the_error_codes_at_every_depth() -> None:
    """Its own, its entries' and theirs, NONE among them, in field order (the listener drops
    NONE); lists of plain values are not entries."""
    partitions = [
        r.MetadataPartition(i, 1, 0, [1, 2], [1], error_code=code)
        for i, code in enumerate((KafkaErrorCode.NONE, KafkaErrorCode.LEADER_NOT_AVAILABLE))
    ]
    response = r.MetadataResponse(
        brokers=[r.MetadataBroker(1, "h", 9)],
        cluster_id="c",
        controller_id=1,
        topics=[
            r.MetadataTopic("t", uuid.uuid4(), partitions),
            r.MetadataTopic(
                "u", uuid.uuid4(), error_code=KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            ),
        ],
    )
    assert list(r.error_codes(response)) == [0, 0, 0, 5, 3]


async def test_answered_error_codes_are_counted_by_api_and_name(node: Node) -> None:
    """Top-level and per-entry codes of a typed response (CreateTopics), of Produce's and Fetch's
    hand-encoded ones, per partition; NONE is not counted."""
    for _ in range(2):  # the second: TOPIC_ALREADY_EXISTS
        await create_topic(node, "twice")
    missing = tuple(PartitionProduceData(index=i32(i), records=None) for i in (5, 6))
    await ask(
        node,
        0,  # Produce, to two partitions the topic does not have
        9,
        transactional_id=None,
        acks=i16(1),
        timeout=timedelta(seconds=10),
        topic_data=(TopicProduceData(name=TopicName("twice"), partition_data=missing),),
    )
    fetched = FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(0),
        last_fetched_epoch=i32(-1),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(1024),
    )
    await ask(
        node,
        1,  # Fetch, of a topic that does not exist
        12,
        replica_id=i32(-1),
        max_wait=timedelta(0),
        min_bytes=i32(1),
        max_bytes=i32(1024),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(FetchTopic(topic=TopicName("nowhere"), partitions=(fetched,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    samples = await scrape(node)
    errors = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "kafka_request_error_count_total"
    }
    assert errors == {
        (("error", "TOPIC_ALREADY_EXISTS"), ("type", "CreateTopics")): 1,
        (("error", "UNKNOWN_TOPIC_OR_PARTITION"), ("type", "Produce")): 2,
        (("error", "UNKNOWN_TOPIC_OR_PARTITION"), ("type", "Fetch")): 1,
    }
