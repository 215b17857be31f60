"""``automq-objects``: a Spark batch source that reads topics straight from the object store.

::

    spark.dataSource.register(AutoMQObjectsDataSource)
    df = (spark.read.format("automq-objects")
          .option("path", "/var/lib/automq/data")        # the broker's log.dirs
          .option("subscribe", "orders,payments")
          .load())

A cluster's topics (brokers on etcd over one object store) are read from the cluster's metadata
log on etcd instead::

    df = (spark.read.format("automq-objects")
          .option("metadata.etcd.endpoints", "10.0.0.1:2379,10.0.0.2:2379")
          .option("cluster.id", "orders-cluster")
          .option("objectStore", "s3://bucket?endpoint=..&region=..")   # s3.data.buckets
          .option("subscribe", "orders")
          .load())

No broker is involved: the driver reads the controller's metadata log read-only (a running broker
may keep writing it; on etcd nothing is written, no election joined, no lease taken) and plans
the read from the committed objects (:mod:`automq_ref.spark.image`); executors GET byte ranges of
objects and decode the Kafka RecordBatches in them. The rows are those of Spark's Kafka source
(:mod:`automq_ref.spark.rows`).

Only what is committed to objects is visible: records still only in a broker's WAL (acknowledged
to producers but not yet uploaded and committed) are not read, so ``latest`` means the end of
what is committed, which may trail the high watermark. Offsets below a partition's log start
(DeleteRecords, retention) are never returned, even while an object still holds them.

Options (names are case-insensitive, as all Spark options):

``path``
    The broker's ``log.dirs`` (or its ``metadata`` directory). Required unless ``metadata.dir``
    or ``metadata.etcd.endpoints``.
``metadata.dir``
    The metadata log directory, when it is not ``<path>/metadata``.
``metadata.etcd.endpoints``
    A cluster's metadata log: its brokers' setting of that name (``host:port`` of the etcd
    members, comma-separated). Not with ``path`` or ``metadata.dir``; needs ``objectStore``.
``cluster.id``
    With ``metadata.etcd.endpoints``: the brokers' ``cluster.id`` (default: the broker's
    default, ``automq-ref-embedded``).
``objectStore``
    The object store URI: ``file:///...`` or ``s3://bucket?endpoint=..&region=..&pathStyle=true``
    (AutoMQ's ``s3.data.buckets`` form). Default: ``objects`` beside the metadata directory;
    required with ``metadata.etcd.endpoints``.
``s3.accessKeyId``, ``s3.secretAccessKey``, ``s3.sessionToken``
    S3 credentials; without them the usual AWS environment variables and files are used.
``subscribe`` / ``subscribePattern`` / ``assign``
    Exactly one: a comma-separated topic list, a regular expression matched against whole topic
    names, or JSON ``{"topic": [0, 1]}``, as Spark's Kafka source.
``startingOffsets`` / ``endingOffsets``
    ``earliest`` / ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest),
    as Spark's Kafka source: defaults ``earliest`` and ``latest``; a batch read may not start at
    ``latest`` nor end at ``earliest``; JSON starting offsets must name every partition read.
``failOnDataLoss``
    ``true`` (default): a starting offset below a partition's log start is an error; ``false``:
    it reads from the log start.
``includeHeaders``
    ``true`` adds the ``headers`` column.
``kafka.isolation.level``
    ``read_uncommitted`` (default, as Spark's Kafka source): every data record up to the
    committed end, aborted and open transactions' too. ``read_committed``: the driver replays
    each read partition's transactions from its MetaStream checkpoint and the batches after it
    (:func:`automq_ref.spark.image.replay_transactions`); reads end at the last stable offset of
    what is committed, and executors drop the batches of aborted transactions.

One Spark partition per (object, Kafka partition) range: a stream set object holding several
partitions gives one Spark partition for each of them, a stream object gives one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from automq_ref.formats.partition_checkpoint import AbortedRow
from automq_ref.spark import rows
from automq_ref.spark.image import (
    EtcdLog,
    ImageError,
    Layout,
    ObjectRange,
    PartitionLayout,
    etcd_log,
    locate,
    read_batches,
    read_layout,
)
from automq_ref.spark.isolation import ISOLATION_OPTION, aborted_within, parse_isolation_level
from automq_ref.state_machines.compaction import aborted_ranges, in_aborted

EARLIEST = -2
LATEST = -1
_TOPIC_OPTIONS = ("subscribe", "subscribepattern", "assign")


class OptionError(ValueError):
    """An option of the ``automq-objects`` source is missing or has a bad value."""


@dataclass(frozen=True)
class ObjectRangePartition(InputPartition):
    """One Spark partition: the records ``[start, end)`` of one Kafka partition in one object;
    at read_committed, with the aborted transactions those offsets may meet."""

    topic: str
    partition: int
    start: int
    end: int
    object_store_uri: str
    object_range: ObjectRange
    aborted: tuple[AbortedRow, ...] = ()

    @property
    def key(self) -> str:
        return self.object_range.key

    @property
    def byte_ranges(self) -> tuple[tuple[int, int], ...]:
        return self.object_range.byte_ranges


# ------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class TopicSelection:
    topics: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None
    assigned: Mapping[str, frozenset[int]] | None = None

    def accepts(self, topic: str) -> bool:
        if self.assigned is not None:
            return topic in self.assigned
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return topic in self.topics

    def accepts_partition(self, topic: str, partition: int) -> bool:
        if self.assigned is not None:
            return partition in self.assigned.get(topic, frozenset())
        return self.accepts(topic)


# "earliest", "latest", or {topic: {partition: offset}}
OffsetSpec = int | dict[str, dict[int, int]]


@dataclass(frozen=True)
class SourceOptions:
    path: str | None
    metadata_dir: str | None
    etcd: EtcdLog | None  # a cluster's metadata log (then path and metadata_dir are None)
    object_store_uri: str | None
    store_options: Mapping[str, str]
    selection: TopicSelection
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool
    include_headers: bool
    read_committed: bool = False  # kafka.isolation.level=read_committed


def _option(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        return None
    return str(value)


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _option(options, name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name}: expected true or false, not {value!r}")
    return value.strip().lower() == "true"


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Check the source's options; every error names the option at fault."""
    options = {str(key).lower(): str(value) for key, value in raw.items()}
    path = _option(options, "path")
    metadata_dir = _option(options, "metadata.dir")
    object_store_uri = _option(options, "objectStore")
    etcd = _parse_etcd(options, path or metadata_dir, object_store_uri)
    if etcd is None and not path and not metadata_dir:
        raise OptionError(
            "option path (the broker's log.dirs) is required, or metadata.dir (its metadata "
            "log), or metadata.etcd.endpoints (a cluster's metadata log on etcd)"
        )
    store_options: dict[str, str] = {}
    for option, argument in (
        ("s3.accessKeyId", "access_key_id"),
        ("s3.secretAccessKey", "secret_access_key"),
        ("s3.sessionToken", "session_token"),
    ):
        value = _option(options, option)
        if value is None:
            continue
        if object_store_uri is None or not object_store_uri.strip().split("@")[-1].startswith(
            "s3://"
        ):
            raise OptionError(f"option {option} applies only to an s3:// objectStore")
        store_options[argument] = value
    return SourceOptions(
        path=path or None,
        metadata_dir=metadata_dir or None,
        etcd=etcd,
        object_store_uri=object_store_uri,
        store_options=store_options,
        selection=_parse_selection(options),
        starting=_parse_offsets(options, "startingOffsets", EARLIEST),
        ending=_parse_offsets(options, "endingOffsets", LATEST),
        fail_on_data_loss=_bool_option(options, "failOnDataLoss", True),
        include_headers=_bool_option(options, "includeHeaders", False),
        read_committed=parse_isolation_level(_option(options, ISOLATION_OPTION), OptionError),
    )


def _parse_etcd(
    options: Mapping[str, str], file_log: str | None, object_store_uri: str | None
) -> EtcdLog | None:
    """The cluster's log on etcd named by ``metadata.etcd.endpoints`` and ``cluster.id``, or
    None; refused alongside a file log (``path``/``metadata.dir``) or without ``objectStore``."""
    endpoints = _option(options, "metadata.etcd.endpoints")
    cluster_id = _option(options, "cluster.id")
    if endpoints is None:
        if cluster_id is not None:
            raise OptionError(
                "option cluster.id applies only with metadata.etcd.endpoints (a cluster's "
                "metadata log on etcd)"
            )
        return None
    if file_log:
        raise OptionError(
            "options path/metadata.dir and metadata.etcd.endpoints name two metadata logs: give "
            "path (a broker's log.dirs) or metadata.etcd.endpoints (a cluster's etcd), not both"
        )
    if object_store_uri is None:
        raise OptionError(
            "option objectStore is required with metadata.etcd.endpoints: a cluster's objects "
            "are where its brokers' s3.data.buckets says"
        )
    try:
        return etcd_log(endpoints, cluster_id)
    except ImageError as error:
        raise OptionError(f"option {error}") from None


def _parse_selection(options: Mapping[str, str]) -> TopicSelection:
    given = [name for name in _TOPIC_OPTIONS if options.get(name) is not None]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise OptionError(
            f"exactly one of the options subscribe, subscribePattern, assign is needed "
            f"(given: {found})"
        )
    value = options[given[0]]
    if given[0] == "subscribe":
        topics = frozenset(name.strip() for name in value.split(",") if name.strip())
        if not topics:
            raise OptionError("option subscribe: no topic named")
        return TopicSelection(topics=topics)
    if given[0] == "subscribepattern":
        try:
            return TopicSelection(pattern=re.compile(value))
        except re.error as error:
            raise OptionError(f"option subscribePattern: bad regular expression: {error}") from None
    try:
        document = json.loads(value)
        if not isinstance(document, dict) or not document:
            raise ValueError("expected a non-empty object")
        assigned: dict[str, frozenset[int]] = {}
        for topic, partitions in document.items():
            if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            ):
                raise ValueError(f"topic {topic!r}: expected a list of partition numbers")
            assigned[str(topic)] = frozenset(partitions)
    except ValueError as error:
        raise OptionError(
            f'option assign: expected JSON like {{"topic": [0, 1]}}: {error}'
        ) from None
    return TopicSelection(assigned=assigned)


def _parse_offsets(options: Mapping[str, str], name: str, default: int) -> OffsetSpec:
    value = _option(options, name)
    if value is None:
        return default
    text = value.strip()
    if text.lower() == "earliest":
        return EARLIEST
    if text.lower() == "latest":
        return LATEST
    example = '{"topic": {"0": 23, "1": -2}}'
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("expected a JSON object")
        offsets: dict[str, dict[int, int]] = {}
        for topic, partitions in document.items():
            if not isinstance(partitions, dict):
                raise ValueError(f"topic {topic!r}: expected an object of partition -> offset")
            offsets[str(topic)] = {}
            for partition, offset in partitions.items():
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                    raise ValueError(f"{topic}-{partition}: bad offset {offset!r}")
                offsets[str(topic)][int(partition)] = offset
    except ValueError as error:
        raise OptionError(
            f"option {name}: expected earliest, latest or JSON like {example}: {error}"
        ) from None
    return offsets


def check_batch_offsets(options: SourceOptions) -> None:
    """Spark's rules for batch reads: no start at latest, no end at earliest."""
    if _mentions(options.starting, LATEST):
        raise OptionError("option startingOffsets: latest (-1) is not allowed for batch queries")
    if _mentions(options.ending, EARLIEST):
        raise OptionError("option endingOffsets: earliest (-2) is not allowed for batch queries")


def _mentions(spec: OffsetSpec, value: int) -> bool:
    if isinstance(spec, int):
        return spec == value
    return any(offset == value for offsets in spec.values() for offset in offsets.values())


# ------------------------------------------------------------------------------ planning


def plan_partitions(layout: Layout, options: SourceOptions) -> list[ObjectRangePartition]:
    """One Spark partition per object range of each selected Kafka partition, in offset order."""
    selected = [
        partition
        for (topic, index), partition in sorted(layout.partitions.items())
        if options.selection.accepts_partition(topic, index)
    ]
    if options.selection.assigned is not None:
        for topic, indexes in options.selection.assigned.items():
            for index in sorted(indexes):
                if (topic, index) not in layout.partitions:
                    raise OptionError(f"option assign: {topic}-{index} does not exist")
    keys = {(p.topic, p.partition) for p in selected}
    _check_named_partitions(options.starting, keys, "startingOffsets", require_all=True)
    _check_named_partitions(options.ending, keys, "endingOffsets", require_all=False)
    planned: list[ObjectRangePartition] = []
    uri = layout.location.object_store_uri
    for partition in selected:
        start = _start_offset(partition, options)
        end = _resolve(options.ending, partition, LATEST)
        last = partition.committed_end_offset
        aborted: tuple[AbortedRow, ...] = ()
        if options.read_committed:
            if partition.transactions is None:
                raise ImageError(
                    f"{partition.topic}-{partition.partition}: its transactions were not "
                    "replayed, which read_committed needs"
                )
            last = min(last, partition.transactions.stable_offset)
            aborted = partition.transactions.aborted
        end = min(last if end == LATEST else end, last)
        for object_range in partition.ranges(start, end):
            planned.append(
                ObjectRangePartition(
                    partition.topic,
                    partition.partition,
                    object_range.start_offset,
                    object_range.end_offset,
                    uri,
                    object_range,
                    aborted_within(aborted, object_range.start_offset, object_range.end_offset),
                )
            )
    return planned


def _check_named_partitions(
    spec: OffsetSpec, keys: set[tuple[str, int]], name: str, *, require_all: bool
) -> None:
    if isinstance(spec, int):
        return
    named = {(topic, index) for topic, offsets in spec.items() for index in offsets}
    unknown = sorted(named - keys)
    if unknown:
        listed = ", ".join(f"{topic}-{index}" for topic, index in unknown)
        raise OptionError(f"option {name} names partitions that are not read: {listed}")
    missing = sorted(keys - named)
    if require_all and missing:
        listed = ", ".join(f"{topic}-{index}" for topic, index in missing)
        raise OptionError(
            f"option {name}: JSON offsets must name every partition read (-2 for earliest); "
            f"missing {listed}"
        )


def _resolve(spec: OffsetSpec, partition: PartitionLayout, default: int) -> int:
    if isinstance(spec, int):
        return spec
    return spec.get(partition.topic, {}).get(partition.partition, default)


def _start_offset(partition: PartitionLayout, options: SourceOptions) -> int:
    start = _resolve(options.starting, partition, EARLIEST)
    if start == EARLIEST:
        return partition.log_start_offset
    if start < partition.log_start_offset:
        if options.fail_on_data_loss:
            raise OptionError(
                f"option startingOffsets: {partition.topic}-{partition.partition} starts at "
                f"{start}, below its log start {partition.log_start_offset} (those records are "
                "deleted); set failOnDataLoss=false to read from the log start"
            )
        return partition.log_start_offset
    return start


# ------------------------------------------------------------------------------- Spark


class AutoMQObjectsReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self._options
        try:
            location = locate(
                options.path,
                metadata_dir=options.metadata_dir,
                object_store_uri=options.object_store_uri,
                etcd=options.etcd,
            )
        except ImageError as error:
            names = "metadata.etcd.endpoints" if options.etcd else "path/metadata.dir"
            raise OptionError(f"options {names}/objectStore: {error}") from error
        layout = read_layout(
            location,
            options.selection.accepts,
            store_options=options.store_options,
            transactions=options.selection.accepts_partition if options.read_committed else None,
        )
        return plan_partitions(layout, options)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, ObjectRangePartition):
            return  # Spark's placeholder when nothing is planned
        batches = read_batches(
            partition.object_store_uri,
            partition.object_range,
            store_options=self._options.store_options,
        )
        if partition.aborted:
            ranges = aborted_ranges(partition.aborted)
            batches = [batch for batch in batches if not in_aborted(batch, ranges)]
        yield from rows.arrow_batches(
            partition.topic,
            partition.partition,
            batches,
            partition.start,
            partition.end,
            include_headers=self._options.include_headers,
        )


class AutoMQObjectsDataSource(DataSource):
    """Spark's Kafka-source rows, read from a broker's committed objects (see the module)."""

    @classmethod
    def name(cls) -> str:
        return "automq-objects"

    def _parsed(self) -> SourceOptions:
        options = parse_options(self.options)
        check_batch_offsets(options)
        return options

    def schema(self) -> str:
        return rows.schema_ddl(self._parsed().include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return AutoMQObjectsReader(self._parsed())
