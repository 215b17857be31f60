"""The ``automq`` Spark data source: batch and streaming reads of topics over the Kafka protocol.

pyspark ships no Kafka connector, so this source reads through the broker's Kafka API with a
small synchronous client (:mod:`automq_ref.spark.kafka_client`), using Spark's Python Data Source
API (pyspark 4.x, ``pyspark.sql.datasource``; pyarrow is required). Rows have the schema of
Spark's own Kafka source, so queries written for ``format("kafka")`` run unchanged::

    from automq_ref.spark.kafka_source import AutoMQDataSource

    spark.dataSource.register(AutoMQDataSource)
    df = (spark.read.format("automq")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders")
          .load())                     # key, value, topic, partition, offset, timestamp, ...

    query = (spark.readStream.format("automq")
             .option("kafka.bootstrap.servers", "127.0.0.1:9092")
             .option("subscribePattern", "orders-.*")
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "100000")
             .load()
             .writeStream.format("parquet")
             .option("checkpointLocation", "/tmp/ckpt").option("path", "/tmp/out")
             .trigger(availableNow=True).start())

Options (names are case-insensitive, as in Spark):

==========================  =========  ==================================================
option                      default    meaning
==========================  =========  ==================================================
kafka.bootstrap.servers     required   ``host:port[,host:port...]``
subscribe                   none       comma-separated topic names (exactly one of
                                       subscribe, subscribePattern, assign is required)
subscribePattern            none       a regular expression matched against the whole
                                       topic name (``re.fullmatch``); internal topics
                                       (``__consumer_offsets``) never match
assign                      none       JSON ``{"topic": [0, 1]}``: exactly these partitions
startingOffsets             earliest   ``earliest``, ``latest``, or JSON
                            (batch),   ``{"topic": {"0": 23, "1": -2}}`` (-2 = earliest,
                            latest     -1 = latest); partitions left out of the JSON start at
                            (stream)   earliest. Streaming: only for a new query; a restart
                                       continues from the checkpoint.
endingOffsets               latest     batch only: ``latest`` or JSON (-1 = latest); left-out
                                       partitions end at latest
maxOffsetsPerTrigger        none       streaming: at most this many offsets per micro-batch,
                                       split over partitions in proportion to their lag
failOnDataLoss              true       ``false``: skip records that were deleted (retention,
                                       DeleteRecords) instead of failing the query
includeHeaders              false      ``true`` adds ``headers array<struct<key: string,
                                       value: binary>>``
minPartitions               none       at least this many Spark partitions: large offset
                                       ranges are split to reach it
maxRecordsPerPartition      1000000    offset ranges longer than this are split into
                                       several Spark partitions
kafka.client.id             automq-    client id sent to the broker
                            ref-spark
kafka.request.timeout.ms    30000      socket timeout of one request
kafka.fetch.max.bytes       16777216   Fetch ``max_bytes``
kafka.max.partition.fetch.  4194304    Fetch ``partition_max_bytes`` (grown automatically
bytes                                  when one batch is larger)
kafka.isolation.level       read_un-   ``read_committed``: only committed transactions'
                            committed  and non-transactional records, below the last
                                       stable offset (see :mod:`automq_ref.spark.isolation`)
==========================  =========  ==================================================

Columns: ``key binary, value binary, topic string, partition int, offset long, timestamp
timestamp, timestampType int`` (0 = CreateTime, 1 = LogAppendTime) and, with
``includeHeaders``, ``headers``. Control batches (transaction markers) are skipped. With
``kafka.isolation.level=read_uncommitted`` (the default, as in Spark's Kafka source, whose Kafka
consumer's default it is) records of aborted and open transactions are returned; with
``read_committed`` ListOffsets and Fetch are asked at READ_COMMITTED: latest offsets are last
stable offsets, and the batches of the aborted transactions each Fetch answer lists are
dropped, as Kafka's consumers drop them.

How it reads. On the driver the source lists partitions (Metadata) and offsets (ListOffsets) and
plans one Spark partition per topic-partition offset range (split into ranges of at most
``maxRecordsPerPartition`` offsets). Each task Fetches its range from the partition's leader,
decodes RecordBatch v2 (every codec) and hands Spark Arrow record batches, which reach the JVM
without a per-row Python conversion. Streaming offsets are JSON
``{"topic": {"partition": next_offset}}``, as in Spark's Kafka source, so the checkpoint shows
where each partition stands; Trigger.AvailableNow is supported (the target is the latest offsets
when the query starts), and partitions that appear later (CreatePartitions, a new topic matching
the pattern) are read from their earliest offset.

Differences from Spark's Kafka source: no consumer group (``kafka.group.id``, ``groupIdPrefix``),
no ``startingTimestamp``/``startingOffsetsByTimestamp``/``endingTimestamp``, no
``minOffsetsPerTrigger``/``maxTriggerDelay``, no security settings; other ``kafka.*`` options are
refused rather than passed on. JSON offsets may name a subset of partitions (Spark requires all).
A batch query over a subscribed topic that does not exist fails (Spark returns no rows); a
streaming query waits for it. Unknown options are an error, naming the option.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from automq_ref.formats.record_batch import iter_batches
from automq_ref.spark import rows
from automq_ref.spark.isolation import ISOLATION_OPTION, drop_aborted, parse_isolation_level
from automq_ref.spark.kafka_client import (
    EARLIEST,
    LATEST,
    KafkaClient,
    OffsetOutOfRangeError,
    parse_bootstrap,
)
from automq_ref.vocabulary.naming import is_internal_topic

__all__ = [
    "AutoMQDataLossError",
    "AutoMQDataSource",
    "AutoMQOptionError",
    "KafkaRange",
    "SourceOptions",
    "parse_options",
]

TopicPartition = tuple[str, int]
OffsetMap = dict[TopicPartition, int]

DEFAULT_MAX_RECORDS_PER_PARTITION: Final = 1_000_000
MAX_PARTITION_FETCH_BYTES: Final = 256 * 1024 * 1024
_EMPTY_FETCHES_BEFORE_GIVING_UP: Final = 20


class AutoMQOptionError(ValueError):
    """A missing, unknown, malformed or conflicting option; the message names it."""


class AutoMQDataLossError(RuntimeError):
    """Records the query should read are gone (trimmed by retention or DeleteRecords, or the
    partition shrank); raised unless ``failOnDataLoss=false``."""


# ----------------------------------------------------------------------------- options

_SUBSCRIPTIONS: Final = ("subscribe", "subscribepattern", "assign")
_KNOWN: Final = frozenset(
    {
        "kafka.bootstrap.servers",
        *_SUBSCRIPTIONS,
        "startingoffsets",
        "endingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "includeheaders",
        "minpartitions",
        "maxrecordsperpartition",
        "kafka.client.id",
        "kafka.request.timeout.ms",
        "kafka.fetch.max.bytes",
        "kafka.max.partition.fetch.bytes",
        ISOLATION_OPTION,
    }
)
_SPARK_ONLY: Final = frozenset(
    {
        "startingtimestamp",
        "startingoffsetsbytimestamp",
        "startingoffsetsbytimestampstrategy",
        "endingtimestamp",
        "endingoffsetsbytimestamp",
        "minoffsetspertrigger",
        "maxtriggerdelay",
        "groupidprefix",
        "kafkaconsumer.polltimeoutms",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
    }
)
# Spark's spelling of each option, for messages.
_SPELLING: Final = {
    "subscribepattern": "subscribePattern",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "includeheaders": "includeHeaders",
    "minpartitions": "minPartitions",
    "maxrecordsperpartition": "maxRecordsPerPartition",
}

OffsetSpec = Literal["earliest", "latest"] | dict[str, dict[int, int]]


@dataclass(frozen=True)
class SourceOptions:
    """Validated options; picklable, so it travels to executors with the reader."""

    bootstrap: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec | None = None
    ending: OffsetSpec | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    client_id: str = "automq-ref-spark"
    request_timeout_ms: int = 30_000
    fetch_max_bytes: int = 16 * 1024 * 1024
    partition_fetch_max_bytes: int = 4 * 1024 * 1024
    read_committed: bool = False  # kafka.isolation.level=read_committed

    def client(self) -> KafkaClient:
        return KafkaClient(
            self.bootstrap,
            client_id=self.client_id,
            request_timeout_s=self.request_timeout_ms / 1000,
            read_committed=self.read_committed,
        )


def _name(key: str) -> str:
    return _SPELLING.get(key, key)


def _bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise AutoMQOptionError(f"option {_name(key)} must be true or false, not {value!r}")
    return lowered == "true"


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise AutoMQOptionError(f"option {_name(key)} must be a positive integer, not {value!r}")
    return number


def _offsets(key: str, value: str) -> OffsetSpec:
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise AutoMQOptionError(
            f"option {_name(key)} must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, not {value!r}'
        )
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise AutoMQOptionError(
                f"option {_name(key)}: topic {topic!r} must map partition numbers to offsets"
            )
        result[topic] = {}
        for partition, offset in partitions.items():
            if (
                not isinstance(partition, str)
                or not partition.strip().isdigit()
                or not isinstance(offset, int)
                or isinstance(offset, bool)
                or offset < EARLIEST
            ):
                raise AutoMQOptionError(
                    f"option {_name(key)}: {topic}-{partition} -> {offset!r} is not a partition "
                    "number mapped to an offset (>= 0, -2 earliest, -1 latest)"
                )
            result[topic][int(partition)] = offset
    return result


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark's option map (keys in any case); raise :class:`AutoMQOptionError`."""
    given = {key.lower(): str(value) for key, value in options.items()}
    for key in given:
        if key in _SPARK_ONLY or key == "kafka.group.id":
            raise AutoMQOptionError(
                f"option {key} of Spark's Kafka source is not supported by the automq source"
            )
        if key not in _KNOWN:
            hint = (
                " (other kafka.* client settings are not supported)"
                if key.startswith("kafka.")
                else ""
            )
            raise AutoMQOptionError(f"unknown option {key!r} for the automq source{hint}")
    bootstrap = given.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise AutoMQOptionError("option kafka.bootstrap.servers is required (host:port[,...])")
    try:
        parse_bootstrap(bootstrap)
    except ValueError as error:
        raise AutoMQOptionError(f"option kafka.bootstrap.servers: {error}") from None
    chosen = [key for key in _SUBSCRIPTIONS if key in given]
    if len(chosen) != 1:
        which = ", ".join(_name(key) for key in chosen) if chosen else "none"
        raise AutoMQOptionError(
            f"exactly one of the options subscribe, subscribePattern, assign is required "
            f"(given: {which})"
        )
    values: dict[str, Any] = {"bootstrap": bootstrap}
    if "subscribe" in given:
        topics = tuple(t.strip() for t in given["subscribe"].split(",") if t.strip())
        if not topics:
            raise AutoMQOptionError("option subscribe names no topic")
        values["subscribe"] = topics
    elif "subscribepattern" in given:
        pattern = given["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as error:
            raise AutoMQOptionError(
                f"option subscribePattern {pattern!r} is not a regular expression: {error}"
            ) from None
        values["pattern"] = pattern
    else:
        values["assign"] = _assignment(given["assign"])
    if "startingoffsets" in given:
        values["starting"] = _offsets("startingoffsets", given["startingoffsets"])
    if "endingoffsets" in given:
        ending = _offsets("endingoffsets", given["endingoffsets"])
        if ending == "earliest" or (
            isinstance(ending, dict)
            and any(o == EARLIEST for parts in ending.values() for o in parts.values())
        ):
            raise AutoMQOptionError("option endingOffsets cannot be earliest (-2)")
        values["ending"] = ending
    if "maxoffsetspertrigger" in given:
        values["max_offsets_per_trigger"] = _positive_int(
            "maxoffsetspertrigger", given["maxoffsetspertrigger"]
        )
    if "failondataloss" in given:
        values["fail_on_data_loss"] = _bool("failondataloss", given["failondataloss"])
    if "includeheaders" in given:
        values["include_headers"] = _bool("includeheaders", given["includeheaders"])
    if "minpartitions" in given:
        values["min_partitions"] = _positive_int("minpartitions", given["minpartitions"])
    if "maxrecordsperpartition" in given:
        values["max_records_per_partition"] = _positive_int(
            "maxrecordsperpartition", given["maxrecordsperpartition"]
        )
    if "kafka.client.id" in given:
        values["client_id"] = given["kafka.client.id"]
    for key, attribute in (
        ("kafka.request.timeout.ms", "request_timeout_ms"),
        ("kafka.fetch.max.bytes", "fetch_max_bytes"),
        ("kafka.max.partition.fetch.bytes", "partition_fetch_max_bytes"),
    ):
        if key in given:
            values[attribute] = _positive_int(key, given[key])
    values["read_committed"] = parse_isolation_level(given.get(ISOLATION_OPTION), AutoMQOptionError)
    return SourceOptions(**values)


def _assignment(value: str) -> dict[str, tuple[int, ...]]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if (
        not isinstance(parsed, dict)
        or not parsed
        or not all(
            isinstance(parts, list)
            and parts
            and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
            for parts in parsed.values()
        )
    ):
        raise AutoMQOptionError(
            f'option assign must be JSON like {{"topic": [0, 1]}}, not {value!r}'
        )
    return {topic: tuple(sorted(set(parts))) for topic, parts in parsed.items()}


# ------------------------------------------------------------------- offsets as JSON


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": offset}}`` in a canonical order (topics, then partitions by
    number), so equal offsets serialise to equal JSON, which Spark compares."""
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = offsets[(topic, partition)]
    return result


def decode_offsets(offsets: Mapping[str, Any]) -> OffsetMap:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }


# ------------------------------------------------------------------------- planning


class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of one topic-partition: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaRange({self.topic}-{self.partition}, [{self.start}, {self.end}))"


def discover(client: KafkaClient, options: SourceOptions, *, strict: bool) -> list[TopicPartition]:
    """The topic-partitions the options select, now. ``strict``: a named topic or assigned
    partition that does not exist is an error (batch); otherwise it is left out (streaming)."""
    topics = client.metadata(None)
    found: list[TopicPartition] = []
    if options.pattern is not None:
        regex = re.compile(options.pattern)
        for name, listed in topics.items():
            # As Kafka's consumers (exclude.internal.topics): never __consumer_offsets.
            if regex.fullmatch(name) and not is_internal_topic(name):
                found += [(name, p.partition) for p in listed.partitions]
    elif options.assign is not None:
        for name, wanted in options.assign.items():
            metadata = topics.get(name)
            count = 0 if metadata is None else len(metadata.partitions)
            missing = [p for p in wanted if p >= count]
            if missing and strict:
                what = "does not exist" if metadata is None else f"has {count} partitions"
                raise AutoMQOptionError(
                    f"option assign names {name}-{missing[0]}, but topic {name!r} {what}"
                )
            found += [(name, p) for p in wanted if p < count]
    else:
        for name in options.subscribe:
            metadata = topics.get(name)
            if metadata is None:
                if strict:
                    raise AutoMQOptionError(
                        f"option subscribe names topic {name!r}, which does not exist"
                    )
                continue
            found += [(name, p.partition) for p in metadata.partitions]
    return sorted(set(found))


def resolve(
    spec: OffsetSpec,
    partitions: Sequence[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    default: int,
    option: str,
) -> OffsetMap:
    """Offsets named by ``spec`` for ``partitions``; JSON -2/-1 and left-out partitions
    (``default``, -2 or -1) become earliest/latest. Naming a partition the query does not
    read is an error."""
    if spec == "earliest":
        return {key: earliest[key] for key in partitions}
    if spec == "latest":
        return {key: latest[key] for key in partitions}
    assert isinstance(spec, dict)
    selected = set(partitions)
    for topic, offsets in spec.items():
        for partition in offsets:
            if (topic, partition) not in selected:
                raise AutoMQOptionError(
                    f"option {option} names {topic}-{partition}, which this query does not read"
                )
    result: OffsetMap = {}
    for key in partitions:
        offset = spec.get(key[0], {}).get(key[1], default)
        result[key] = (
            earliest[key] if offset == EARLIEST else latest[key] if offset == LATEST else offset
        )
    return result


def split_ranges(
    ranges: Sequence[tuple[TopicPartition, int, int]],
    max_records: int,
    min_partitions: int | None,
) -> list[KafkaRange]:
    """One KafkaRange per non-empty range, cut into pieces of at most ``max_records`` offsets,
    and further so there are at least ``min_partitions`` pieces (big ranges cut first)."""
    nonempty = [(key, start, end) for key, start, end in ranges if end > start]
    total = sum(end - start for _, start, end in nonempty)
    result: list[KafkaRange] = []
    for (topic, partition), start, end in nonempty:
        size = end - start
        pieces = math.ceil(size / max_records)
        if min_partitions and total:
            pieces = max(pieces, math.ceil(size * min_partitions / total))
        pieces = min(pieces, size)
        for index in range(pieces):
            low = start + size * index // pieces
            high = start + size * (index + 1) // pieces
            result.append(KafkaRange(topic, partition, low, high))
    return result


# -------------------------------------------------------------------------- reading


def read_range(options: SourceOptions, task: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Fetch ``[task.start, task.end)`` and yield it as Arrow record batches (at
    read_committed, without the batches of aborted transactions)."""
    topic, partition, offset, end = task.topic, task.partition, task.start, task.end
    partition_max = options.partition_fetch_max_bytes
    empty = 0
    with options.client() as client:
        while offset < end:
            try:
                result = client.fetch(
                    topic,
                    partition,
                    offset,
                    max_bytes=max(options.fetch_max_bytes, partition_max),
                    partition_max_bytes=partition_max,
                )
            except OffsetOutOfRangeError as error:
                if error.log_start_offset > offset:
                    _data_loss(
                        options,
                        f"{topic}-{partition}: offsets {offset} to "
                        f"{min(error.log_start_offset, end) - 1} were deleted (the log now "
                        f"starts at {error.log_start_offset})",
                    )
                    offset = error.log_start_offset
                    continue
                _data_loss(
                    options,
                    f"{topic}-{partition}: offset {offset} is beyond the end of the log "
                    f"({error.high_watermark}); offsets up to {end - 1} were expected",
                )
                return
            views = list(iter_batches(result.records, allow_partial_tail=True, compacted=True))
            if not views:
                if result.records:  # one batch larger than the limit: ask for more
                    if partition_max >= MAX_PARTITION_FETCH_BYTES:
                        raise RuntimeError(
                            f"{topic}-{partition}: the batch at offset {offset} is larger "
                            f"than {MAX_PARTITION_FETCH_BYTES} bytes"
                        )
                    partition_max *= 2
                    continue
                empty += 1
                # A READ_COMMITTED answer ends at the last stable offset.
                bound, what = (
                    (result.last_stable_offset, "last stable offset")
                    if options.read_committed
                    else (result.high_watermark, "high watermark")
                )
                if bound <= offset or empty >= _EMPTY_FETCHES_BEFORE_GIVING_UP:
                    _data_loss(
                        options,
                        f"{topic}-{partition}: no records from offset {offset} ({what} "
                        f"{bound}); offsets up to {end - 1} were expected",
                    )
                    return
                continue
            empty = 0
            kept = (
                drop_aborted(views, result.aborted_transactions or ())
                if options.read_committed
                else views
            )
            yield from rows.arrow_batches(
                topic, partition, kept, offset, end, include_headers=options.include_headers
            )
            offset = views[-1].next_offset


def _data_loss(options: SourceOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise AutoMQDataLossError(
            f"{message}. Some data may have been lost; set option failOnDataLoss=false to "
            "skip it and go on"
        )


# ----------------------------------------------------------------------------- batch


class AutoMQBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        options = self.options
        with options.client() as client:
            keys = discover(client, options, strict=True)
            earliest = client.earliest_offsets(keys) if keys else {}
            latest = client.latest_offsets(keys) if keys else {}
        start = resolve(
            options.starting or "earliest",
            keys,
            earliest,
            latest,
            default=EARLIEST,
            option="startingOffsets",
        )
        end = resolve(
            options.ending or "latest",
            keys,
            earliest,
            latest,
            default=LATEST,
            option="endingOffsets",
        )
        ranges = []
        for key in keys:
            topic, partition = key
            begin = start[key]
            if begin < earliest[key]:
                _data_loss(
                    options,
                    f"{topic}-{partition}: startingOffsets {begin} is before the log start "
                    f"{earliest[key]}",
                )
                begin = earliest[key]
            if end[key] > latest[key]:
                ends = (
                    "the partition's last stable offset is"
                    if options.read_committed
                    else "the partition ends at"
                )
                raise AutoMQOptionError(
                    f"option endingOffsets asks for {topic}-{partition} up to {end[key]}, but "
                    f"{ends} {latest[key]}"
                )
            if begin > end[key]:
                raise AutoMQOptionError(
                    f"{topic}-{partition}: startingOffsets {begin} is after endingOffsets "
                    f"{end[key]}"
                )
            ranges.append((key, begin, end[key]))
        planned: list[InputPartition] = list(
            split_ranges(ranges, options.max_records_per_partition, options.min_partitions)
        )
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, KafkaRange):  # Spark sends InputPartition(None) if none
            yield from read_range(self.options, partition)


# ------------------------------------------------------------------------- streaming


class AutoMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; the Spark driver keeps one instance (and its connection) for the
    whole query, tasks get pickled copies without the connection."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: KafkaClient | None = None
        self._target: OffsetMap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_client": None, "_target": None}

    def _kafka(self) -> KafkaClient:
        if self._client is None:
            self._client = self.options.client()
        return self._client

    def initialOffset(self) -> dict[str, Any]:
        client = self._kafka()
        keys = discover(client, self.options, strict=False)
        earliest = client.earliest_offsets(keys) if keys else {}
        latest = client.latest_offsets(keys) if keys else {}
        start = resolve(
            self.options.starting or "latest",
            keys,
            earliest,
            latest,
            default=EARLIEST,
            option="startingOffsets",
        )
        return encode_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        client = self._kafka()
        keys = discover(client, self.options, strict=False)
        self._target = client.latest_offsets(keys) if keys else {}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        client = self._kafka()
        begin = decode_offsets(start)
        keys = discover(client, self.options, strict=False)
        latest = client.latest_offsets(keys) if keys else {}
        if self._target is not None:
            latest = {
                key: min(o, self._target[key]) for key, o in latest.items() if key in self._target
            }
        new = [key for key in latest if key not in begin]
        origin = dict(begin)
        if new:
            origin.update(client.earliest_offsets(new))
        for key, offset in latest.items():
            if offset < origin[key]:
                _data_loss(
                    self.options,
                    f"{key[0]}-{key[1]}: the log ends at {offset}, before offset {origin[key]} "
                    "the query had reached",
                )
                origin[key] = offset
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(origin, latest, limit.max_rows)
        end = dict(begin)
        end.update(latest)
        return encode_offsets(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = decode_offsets(start)
        finish = decode_offsets(end)
        new = [key for key in finish if key not in begin]
        if new:
            earliest = self._kafka().earliest_offsets(new)
            for key in new:
                origin = earliest[key]
                if origin > finish[key]:
                    _data_loss(
                        self.options,
                        f"{key[0]}-{key[1]}: new partition's log starts at {origin}, after "
                        f"the planned end {finish[key]}",
                    )
                begin[key] = min(origin, finish[key])
        ranges = [(key, begin[key], finish[key]) for key in sorted(finish)]
        planned: list[InputPartition] = list(
            split_ranges(
                ranges, self.options.max_records_per_partition, self.options.min_partitions
            )
        )
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def rate_limit(begin: Mapping[TopicPartition, int], latest: OffsetMap, limit: int) -> OffsetMap:
    """Spark's split of ``limit`` offsets over partitions in proportion to their lag: each
    partition advances by floor(limit * lag / total lag), at least 1 when it lags at all."""
    lags = {key: latest[key] - begin[key] for key in latest if latest[key] > begin[key]}
    total = sum(lags.values())
    if total <= limit:
        return latest
    result = dict(latest)
    for key, lag in lags.items():
        share = limit * lag / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        result[key] = min(latest[key], begin[key] + step)
    return result


# ------------------------------------------------------------------------ the source


class AutoMQDataSource(DataSource):
    """Register with ``spark.dataSource.register(AutoMQDataSource)``; read with
    ``spark.read.format("automq")`` or ``spark.readStream.format("automq")``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.parsed = parse_options(dict(options))

    @classmethod
    def name(cls) -> str:
        return "automq"

    def schema(self) -> str:
        return rows.schema_ddl(self.parsed.include_headers)

    def _check_schema(self, schema: StructType) -> None:
        expected = rows.arrow_schema(self.parsed.include_headers).names
        if list(schema.fieldNames()) != expected:
            raise AutoMQOptionError(
                f"the automq source has a fixed schema ({', '.join(expected)}); a user-specified "
                "schema cannot be used"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        options = self.parsed
        if options.starting == "latest" or (
            isinstance(options.starting, dict)
            and any(o == LATEST for parts in options.starting.values() for o in parts.values())
        ):
            raise AutoMQOptionError("option startingOffsets cannot be latest (-1) in a batch read")
        return AutoMQBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        if self.parsed.ending is not None:
            raise AutoMQOptionError("option endingOffsets applies to batch reads only")
        return AutoMQStreamReader(self.parsed)
