"""The ``automq`` Spark source against a real broker process, and its Kafka client without Spark.

Records are produced with confluent-kafka (every codec, keys, headers, explicit timestamps) and
read back through Spark: batch reads must return exactly what was produced, streaming reads with
a checkpoint must resume where they stopped (no record skipped, none repeated), and
``maxOffsetsPerTrigger`` must cut the backlog into several micro-batches. Transactions: with
``kafka.isolation.level=read_committed`` a batch and a streaming read return exactly the records
of committed transactions and the plain records below the last stable offset (nothing of an
aborted transaction, of a transaction left open, or after it), with ``read_uncommitted`` (the
default) every record written; the streaming query goes on past the LSO once the open
transaction commits.
"""

from __future__ import annotations

import collections
import functools
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.formats.record_batch import iter_batches
from automq_ref.spark.isolation import ISOLATION_OPTION
from automq_ref.spark.kafka_client import (
    KafkaClient,
    KafkaConnectionError,
    KafkaResponseError,
    OffsetOutOfRangeError,
)
from automq_ref.spark.kafka_source import (
    AutoMQDataLossError,
    AutoMQDataSource,
    AutoMQOptionError,
    KafkaRange,
    parse_options,
    rate_limit,
    read_range,
    split_ranges,
)
from tests.spark.transactions import Written, write_transactions
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import Row as SparkRow
    from pyspark.sql import SparkSession

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TS = 1_700_000_000_000

# (topic, partition, offset, key, value, timestamp ms, headers)
Row = tuple[str, int, int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[
        topic
    ].result()


def produce(
    broker: BrokerProcess,
    topic: str,
    count: int,
    *,
    partitions: int,
    codec: str = "none",
    first: int = 0,
) -> list[Row]:
    """``count`` records spread over ``partitions``; returns them with their offsets."""
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20}
    )
    rows: list[Row] = []

    def delivered(headers: tuple[tuple[str, bytes | None], ...], error: Any, message: Any) -> None:
        assert error is None, error
        rows.append(
            (
                message.topic(),
                message.partition(),
                message.offset(),
                message.key(),
                message.value(),
                message.timestamp()[1],
                headers,
            )
        )

    for index in range(first, first + count):
        key = None if index % 5 == 0 else f"k{index}".encode()
        sent: tuple[tuple[str, bytes | None], ...] = (
            (("h", f"{index}".encode()), ("null", None)) if index % 2 else ()
        )
        producer.produce(
            topic,
            value=f"{codec}-{index}-".encode() * (1 + index % 4),
            key=key,
            partition=index % partitions,
            timestamp=BASE_TS + index,
            headers=list(sent),
            on_delivery=functools.partial(delivered, sent),
        )
    assert producer.flush(30) == 0
    assert len(rows) == count
    return sorted(rows)


def spark_rows(collected: list[SparkRow], headers: bool = True) -> list[Row]:
    result: list[Row] = []
    for row in collected:
        result.append(
            (
                row.topic,
                row.partition,
                row.offset,
                None if row.key is None else bytes(row.key),
                None if row.value is None else bytes(row.value),
                int(row.timestamp.timestamp() * 1000 + 0.5),
                tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers)
                if headers
                else (),
            )
        )
    return sorted(result)


@pytest.fixture(scope="module")
def automq(spark: SparkSession) -> SparkSession:
    spark.dataSource.register(AutoMQDataSource)
    return spark


@pytest.fixture(scope="module")
def codec_topics(broker: BrokerProcess) -> dict[str, list[Row]]:
    """One two-partition topic per codec, 300 records each."""
    produced: dict[str, list[Row]] = {}
    prefix = unique("codec")
    for codec in CODECS:
        topic = f"{prefix}-{codec}"
        create_topic(broker, topic, 2)
        produced[topic] = produce(broker, topic, 300, partitions=2, codec=codec)
    return produced


def reader(spark: SparkSession, broker: BrokerProcess, **options: str) -> Any:
    stream = spark.read.format("automq").option("kafka.bootstrap.servers", broker.bootstrap)
    for key, value in options.items():
        stream = stream.option(key, value)
    return stream


# ------------------------------------------------------------------- the client alone


def test_client_metadata_offsets_and_fetch(
    broker: BrokerProcess, codec_topics: dict[str, list[Row]]
) -> None:
    topic = next(t for t in codec_topics if t.endswith("-zstd"))
    expected = [r for r in codec_topics[topic] if r[1] == 1]
    with KafkaClient(broker.bootstrap) as client:
        versions = client.api_versions()
        assert versions[1][1] >= 12
        metadata = client.metadata([topic])[topic]
        assert [p.partition for p in metadata.partitions] == [0, 1]
        assert metadata.topic_id.int != 0
        assert topic in client.list_topics()
        keys = [(topic, 0), (topic, 1)]
        assert client.earliest_offsets(keys) == {(topic, 0): 0, (topic, 1): 0}
        assert client.latest_offsets(keys) == {(topic, 0): 150, (topic, 1): 150}
        offset, got = 40, []
        while offset < 150:
            result = client.fetch(topic, 1, offset, partition_max_bytes=512)
            assert result.high_watermark == 150
            views = list(iter_batches(result.records, allow_partial_tail=True))
            got += [
                (r.offset, r.key, r.value, r.timestamp, r.headers)
                for v in views
                for r in v.records()
                if r.offset >= offset
            ]
            offset = views[-1].next_offset
        assert got == [(r[2], r[3], r[4], r[5], r[6]) for r in expected[40:]]


def test_client_errors_name_the_code(broker: BrokerProcess, codec_topics: dict[str, Any]) -> None:
    topic = next(iter(codec_topics))
    with KafkaClient(broker.bootstrap) as client:
        with pytest.raises(KafkaResponseError, match="UNKNOWN_TOPIC_OR_PARTITION") as raised:
            client.metadata(["no-such-topic"])
        assert raised.value.code == 3 and raised.value.topic == "no-such-topic"
        with pytest.raises(KafkaResponseError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            client.latest_offsets([(topic, 7)])
        with pytest.raises(OffsetOutOfRangeError, match="OFFSET_OUT_OF_RANGE") as out:
            client.fetch(topic, 0, 10_000)
        assert (out.value.log_start_offset, out.value.high_watermark) == (0, 150)
    with socket.socket() as listener:  # a port nobody listens on
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    client = KafkaClient(f"127.0.0.1:{port}", retries=2, retry_backoff_s=0.01)
    with pytest.raises(KafkaConnectionError, match=f"127.0.0.1:{port}"):
        client.metadata(None)


def test_read_range_skips_deleted_records_only_when_told(broker: BrokerProcess) -> None:
    topic = unique("trimmed")
    create_topic(broker, topic, 1)
    produce(broker, topic, 50, partitions=1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deleted = admin.delete_records([TopicPartition(topic, 0, 20)])
    for future in deleted.values():
        future.result()
    options = parse_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic})
    task = KafkaRange(topic, 0, 5, 50)
    with pytest.raises(AutoMQDataLossError, match=rf"{topic}-0: offsets 5 to 19 were deleted"):
        list(read_range(options, task))
    lenient = parse_options(
        {
            "kafka.bootstrap.servers": broker.bootstrap,
            "subscribe": topic,
            "failOnDataLoss": "false",
        }
    )
    offsets = [o for batch in read_range(lenient, task) for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(20, 50))


# ------------------------------------------------------------------ planning, pure


def test_option_parsing_errors_name_the_option() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:9092"}
    cases = [
        ({}, "kafka.bootstrap.servers is required"),
        ({"subscribe": "t", "kafka.bootstrap.servers": "nohost"}, "kafka.bootstrap.servers"),
        (base, "exactly one of the options subscribe, subscribePattern, assign"),
        ({**base, "subscribe": "a", "assign": '{"a": [0]}'}, "given: subscribe, assign"),
        ({**base, "assign": "[0]"}, "option assign must be JSON"),
        ({**base, "subscribePattern": "("}, "subscribePattern"),
        ({**base, "subscribe": "t", "startingOffsets": "first"}, "option startingOffsets"),
        ({**base, "subscribe": "t", "endingOffsets": "earliest"}, "endingOffsets cannot"),
        ({**base, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({**base, "subscribe": "t", "includeHeaders": "yes"}, "includeHeaders"),
        ({**base, "subscribe": "t", "startingTimestamp": "1"}, "startingtimestamp of Spark"),
        ({**base, "subscribe": "t", "kafka.security.protocol": "SSL"}, "kafka.security"),
        ({**base, "subscribe": "t", "bogus": "1"}, "unknown option 'bogus'"),
        (
            {**base, "subscribe": "t", "kafka.isolation.level": "READ_COMMITTED"},
            "kafka.isolation.level must be read_uncommitted",
        ),
    ]
    for options, message in cases:
        with pytest.raises(AutoMQOptionError, match=message):
            parse_options(options)
    parsed = parse_options(
        {**base, "SUBSCRIBE": "a,b", "StartingOffsets": '{"a": {"0": 5, "1": -2}}'}
    )
    assert parsed.subscribe == ("a", "b") and parsed.starting == {"a": {0: 5, 1: -2}}
    assert not parsed.read_committed  # read_uncommitted, Spark's (its Kafka consumer's) default
    committed = parse_options({**base, "subscribe": "a", "KAFKA.ISOLATION.LEVEL": "read_committed"})
    assert committed.read_committed and committed.client().isolation_level == 1


def test_split_ranges_and_rate_limit() -> None:
    ranges = [(("t", 0), 0, 2_500_000), (("t", 1), 10, 10), (("u", 0), 5, 105)]
    split = split_ranges(ranges, 1_000_000, None)
    assert [(r.topic, r.partition, r.start, r.end) for r in split] == [
        ("t", 0, 0, 833_333),
        ("t", 0, 833_333, 1_666_666),
        ("t", 0, 1_666_666, 2_500_000),
        ("u", 0, 5, 105),
    ]
    assert len(split_ranges([(("t", 0), 0, 10)], 1_000_000, 4)) == 4
    begin = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 7}
    assert rate_limit(begin, latest, 100) == {("t", 0): 90, ("t", 1): 110, ("t", 2): 7}
    assert rate_limit(begin, latest, 5000) == latest


# ----------------------------------------------------------------------- batch, Spark


def test_batch_read_every_codec_with_headers(
    automq: SparkSession, broker: BrokerProcess, codec_topics: dict[str, list[Row]]
) -> None:
    df = reader(automq, broker, subscribe=",".join(codec_topics), includeHeaders="true").load()
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    expected = sorted(row for rows in codec_topics.values() for row in rows)
    collected = df.collect()
    assert spark_rows(collected) == expected
    assert {r.timestampType for r in collected} == {0}  # CreateTime


def test_batch_offsets_json_pattern_and_assign(
    automq: SparkSession, broker: BrokerProcess, codec_topics: dict[str, list[Row]]
) -> None:
    topic = next(t for t in codec_topics if t.endswith("-gzip"))
    produced = codec_topics[topic]
    df = reader(
        automq,
        broker,
        subscribe=topic,
        startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 20}}}}',
        maxRecordsPerPartition="60",
    ).load()
    got = spark_rows(df.collect(), headers=False)
    want = [(*r[:6], ()) for r in produced if (r[1] == 0 and 10 <= r[2] < 20) or r[1] == 1]
    assert got == want
    prefix = topic.rsplit("-", 1)[0]
    pattern = reader(automq, broker, subscribePattern=f"{prefix}-(lz4|snappy)").load()
    counts = collections.Counter(r.topic for r in pattern.select("topic").collect())
    assert counts == {f"{prefix}-lz4": 300, f"{prefix}-snappy": 300}
    assigned = reader(automq, broker, assign=f'{{"{topic}": [1]}}', minPartitions="3").load()
    assert assigned.rdd.getNumPartitions() == 3
    assert sorted(r.offset for r in assigned.collect()) == list(range(150))


def test_bad_options_fail_clearly_in_spark(
    automq: SparkSession, broker: BrokerProcess, codec_topics: dict[str, list[Row]]
) -> None:
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        reader(automq, broker).load()
    with pytest.raises(Exception, match="does not exist"):
        reader(automq, broker, subscribe="no-such-topic").load().collect()
    with pytest.raises(Exception, match="startingOffsets cannot be latest") as raised:
        reader(
            automq, broker, subscribe=next(iter(codec_topics)), startingOffsets="latest"
        ).load().collect()
    assert "AutoMQOptionError" in str(raised.value)
    with pytest.raises(Exception, match=r"kafka\.isolation\.level must be read_uncommitted"):
        reader(
            automq, broker, subscribe=next(iter(codec_topics)), **{ISOLATION_OPTION: "serializable"}
        ).load().collect()


# ------------------------------------------------------------------- streaming, Spark


def run_available_now(
    spark: SparkSession, broker: BrokerProcess, topic: str, out: Path, **options: str
) -> list[int]:
    """One availableNow run into parquet at ``out``; the rows of each micro-batch."""
    stream = (
        spark.readStream.format("automq")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        stream = stream.option(key, value)
    query = (
        stream.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_streaming_restart_resumes_exactly(
    automq: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique("stream")
    create_topic(broker, topic, 2)
    first = produce(broker, topic, 90, partitions=2, codec="lz4")
    assert run_available_now(automq, broker, topic, tmp_path) == [90]
    second = produce(broker, topic, 60, partitions=2, codec="zstd", first=90)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result()
    third = produce(broker, topic, 9, partitions=3, first=150)  # 3 into the new partition
    batches = run_available_now(automq, broker, topic, tmp_path, maxOffsetsPerTrigger="30")
    assert sum(batches) == 69 and len(batches) >= 3 and max(batches) <= 30 + 3
    # Every record exactly once across both runs (pyarrow skips Spark's _spark_metadata).
    written = pq.read_table(tmp_path / "data", columns=["partition", "offset", "value"])
    got = sorted(zip(*(written.column(c).to_pylist() for c in written.column_names), strict=True))
    want = sorted((r[1], r[2], r[4]) for r in [*first, *second, *third])
    assert got == want


# ---------------------------------------------------------------- transactions, Spark


def triples(collected: list[SparkRow]) -> list[Written]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in collected)


def test_read_committed_reads_only_committed_records(
    automq: SparkSession, broker: BrokerProcess
) -> None:
    written = write_transactions(broker.bootstrap)
    topic = written.topic
    try:
        # The client alone: READ_COMMITTED answers stop at the LSO and list the aborted one.
        with KafkaClient(broker.bootstrap, read_committed=True) as client:
            result = client.fetch(topic, 0, 0)
            assert result.last_stable_offset == written.stable[0]
            assert result.aborted_transactions is not None
            first_aborted = min(o for p, o, _ in written.aborted if p == 0)
            assert [first for _, first in result.aborted_transactions] == [first_aborted]
            views = list(iter_batches(result.records, allow_partial_tail=True))
            assert views[-1].next_offset == written.stable[0]
        with KafkaClient(broker.bootstrap) as client:
            assert client.fetch(topic, 0, 0).aborted_transactions is None
            assert client.latest_offsets([(topic, 0)])[(topic, 0)] > written.stable[0]
        committed = {ISOLATION_OPTION: "read_committed"}
        # Many small ranges and fetches, so that reads begin inside the aborted transaction.
        small = {"minPartitions": "8", "kafka.max.partition.fetch.bytes": "200"}
        for shape in ({}, small):
            got = reader(automq, broker, subscribe=topic, **committed, **shape).load()
            assert triples(got.collect()) == written.committed
            for level in ({}, {ISOLATION_OPTION: "read_uncommitted"}):
                everything = reader(automq, broker, subscribe=topic, **level, **shape).load()
                assert triples(everything.collect()) == written.everything
        # One task alone, from the log start and from inside the aborted transaction.
        options = parse_options(
            {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic, **committed}
        )
        inside = min(o for p, o, _ in written.aborted if p == 1) + 1
        for start in (0, inside):
            task = KafkaRange(topic, 1, start, written.stable[1])
            read = [
                (1, offset, value)
                for batch in read_range(options, task)
                for offset, value in zip(
                    batch.column("offset").to_pylist(),
                    batch.column("value").to_pylist(),
                    strict=True,
                )
            ]
            assert read == [w for w in written.committed if w[0] == 1 and w[1] >= start]
        # endingOffsets past the LSO is refused at read_committed.
        with pytest.raises(Exception, match="last stable offset is"):
            reader(
                automq,
                broker,
                subscribe=topic,
                endingOffsets=f'{{"{topic}": {{"0": {written.stable[0] + 1}}}}}',
                **committed,
            ).load().collect()
    finally:
        written.open_producer.abort_transaction(30)


def test_streaming_read_committed_waits_for_the_open_transaction(
    automq: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    written = write_transactions(broker.bootstrap)
    committed = {ISOLATION_OPTION: "read_committed"}

    def parquet() -> list[Written]:
        table = pq.read_table(tmp_path / "data", columns=["partition", "offset", "value"])
        return sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))

    try:
        assert sum(run_available_now(automq, broker, written.topic, tmp_path, **committed)) == len(
            written.committed
        )
        assert parquet() == written.committed
        written.open_producer.commit_transaction(30)
    except BaseException:
        written.open_producer.abort_transaction(30)
        raise
    keys = [(written.topic, 0), (written.topic, 1)]
    with (
        KafkaClient(broker.bootstrap, read_committed=True) as committed_client,
        KafkaClient(broker.bootstrap) as uncommitted_client,
    ):
        wait_until(
            lambda: (
                committed_client.latest_offsets(keys) == uncommitted_client.latest_offsets(keys)
            ),
            "the open transaction's commit marker",
        )
    run_available_now(automq, broker, written.topic, tmp_path, **committed)
    assert parquet() == sorted(written.committed + written.open_records + written.after_open)
