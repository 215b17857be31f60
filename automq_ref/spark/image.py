"""A broker's topics, read straight from its metadata log and its objects, without the broker.

The ``automq-objects`` Spark source (:mod:`automq_ref.spark.objects_source`) plans its reads
with this module; nothing here needs Spark, so it is tested on its own.

Theory of operation
-------------------
Everything a broker has committed can be found from two places: the controller's metadata log
and the object store (``<log.dirs>/objects``, or the bucket of ``s3.data.buckets``). The log is
``<log.dirs>/metadata`` for a broker on its own (the embedded file log), or, for a cluster, the
key range of its ``cluster.id`` on the etcd of its ``metadata.etcd.endpoints`` (an
:class:`EtcdLog`); :func:`locate` says which (a :class:`Location`).

1. *The image.* :func:`load_metadata` reads the metadata log read-only and replays the snapshot
   and the records after it, as a broker does when it opens. A file log is read with
   :func:`~automq_ref.io.metadata.metadata_log.read_log_directory` (:func:`load_image`: no lock,
   nothing written, so a running broker may keep appending). A log on etcd is read by
   :func:`load_etcd_image` with the broker's own replica
   (:meth:`~automq_ref.io.metadata.controller.Controller.open`: the snapshot kept in etcd, then
   the records after it, the snapshot again if a newer one truncated them meanwhile) over an
   :class:`~automq_ref.io.metadata.etcd_metadata_log.EtcdMetadataLog` that may not write: it is
   never created when missing, every write is refused before it reaches etcd, and no election is
   joined and no lease taken, so the cluster's brokers go on as if nobody read. The image holds
   the streams (start and end offsets), the committed objects with the offset ranges they hold per
   stream, and the KV store.
2. *Topics.* The KV entry under :func:`~automq_ref.vocabulary.naming.topic_key` gives a topic's
   id and partition count (:mod:`automq_ref.formats.topic_record`);
   :func:`~automq_ref.vocabulary.naming.partition_key` gives each partition's MetaStream id.
3. *The data stream.* The MetaStream's records (:mod:`automq_ref.formats.meta_stream`) are read
   from its committed objects with the broker's own reader
   (:func:`~automq_ref.io.storage.stream_objects.read_from_objects`) and replayed as the broker
   replays them; the last ``LOG`` record names the data stream.
4. *Object ranges.* ``get_objects`` walks the data stream's committed objects (stream objects
   and stream set objects alike) in offset order from the stream's start offset, which is the
   partition's log start: DeleteRecords and retention move it, and offsets below it are never
   planned, even when an object still holds them. For each object the broker's index cache
   (:class:`~automq_ref.io.storage.stream_objects.ObjectIndexCache`: one tail GET reads the
   footer and the index, a second GET when the index does not fit the tail) gives the index,
   and the entries of the stream's blocks overlapping the range become an :class:`ObjectRange`:
   the object key, the stream offsets ``[start_offset, end_offset)`` and the data blocks holding
   them, whose adjacent runs are the byte ranges to GET.
5. *Reading.* :func:`read_object_range` fetches those blocks as the broker's block cache does
   (:func:`~automq_ref.io.storage.stream_objects.read_blocks`: one ranged GET per run of
   adjacent blocks), checks each block against its index entry, and returns the Kafka
   RecordBatches stored in the stream records (a partition's data-stream record carries the
   RecordBatch bytes of one produce). The caller cuts records to the offsets it wants (a stream
   record may start below the log start or run past the end).

6. *Transactions* (for ``read_committed``, only when asked: :func:`replay_transactions`). The
   partition's transaction state at the end of what its objects hold is rebuilt as the
   partition rebuilds it when it opens: from the MetaStream's last ``CHECKPOINT`` when it
   describes that log (the same data stream and cleaned stream, its end between the log start
   and the committed end), then every batch after it, read from the objects; without a usable
   checkpoint, every batch from the log start. The result is the partition's last stable
   offset as far as the objects go (a transaction without a committed marker is open) and its
   aborted transactions (:mod:`automq_ref.spark.isolation`).

What is visible: only what is committed to objects. Records a broker acknowledged that are still
only in its WAL and log cache (not yet uploaded, or uploaded but not yet committed) are not seen,
so the ``committed_end_offset`` of a partition may be below the high watermark a Kafka client
sees; a graceful broker shutdown uploads and commits everything. Objects uploaded but never
committed (orphans) are not in the image and are never read.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from automq_ref.config import BrokerConfig
from automq_ref.formats.errors import FormatError
from automq_ref.formats.kv_integer import decode_kv_integer
from automq_ref.formats.meta_stream import PartitionMeta, replay
from automq_ref.formats.metadata_record import decode_record, decode_snapshot
from automq_ref.formats.object_file import DataBlockIndex, parse_data_block
from automq_ref.formats.partition_checkpoint import (
    AbortedRow,
    PartitionCheckpoint,
    decode_checkpoint,
)
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.topic_record import Topic, topics_in
from automq_ref.io.metadata.controller import Controller
from automq_ref.io.metadata.metadata_log import MetadataLogError, read_log_directory
from automq_ref.io.storage.object_store import ObjectStore, open_object_store
from automq_ref.io.storage.stream_objects import (
    DataBlockCache,
    ObjectIndexCache,
    StreamReadError,
    read_blocks,
    read_from_objects,
)
from automq_ref.spark.isolation import TransactionReplay, checkpoint_mismatch
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import NAMESPACE as NAMESPACE  # the broker's object keys
from automq_ref.vocabulary.naming import object_key, partition_key

METADATA_DIR_NAME = "metadata"
OBJECTS_DIR_NAME = "objects"
_SEGMENT_FILE = re.compile(r"segment-\d{20}\.log")
_GET_OBJECTS_LIMIT = 1 << 30
# Indexes kept during one planning pass: every object it visits (a stream set object is shared
# by many partitions, and indexes are small).
_PLANNING_INDEX_OBJECTS = 1 << 20
_META_READ_BYTES = 4 * 1024 * 1024
# How long one etcd call may take before the planning fails (etcd down, unreachable).
ETCD_REQUEST_TIMEOUT_S = 5.0

if TYPE_CHECKING:
    from automq_ref.io.metadata.etcd_client import EtcdClient


class ImageError(Exception):
    """The metadata or the objects are not where they should be, or do not agree."""


class SettingError(ImageError):
    """A broker setting naming the metadata log (``metadata.etcd.endpoints``, ``cluster.id``)
    has a bad value."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting, self.problem = setting, problem


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True, slots=True)
class EtcdLog:
    """A cluster's metadata log on etcd: its brokers' ``metadata.etcd.endpoints`` (``host:port``
    each) and ``cluster.id`` (the key range in etcd). Make it with :func:`etcd_log`."""

    endpoints: tuple[str, ...]
    cluster_id: str

    def __str__(self) -> str:
        return f"cluster {self.cluster_id!r} on etcd at {','.join(self.endpoints)}"


def etcd_log(endpoints: str | Sequence[str], cluster_id: str | None = None) -> EtcdLog:
    """The etcd log of a cluster, from the brokers' two settings, checked as a broker checks them
    (``http://`` prefixes dropped). ``cluster_id`` defaults to the broker's default ``cluster.id``.
    Bad values raise :class:`SettingError` naming the setting."""
    text = endpoints if isinstance(endpoints, str) else ",".join(endpoints)
    values = {"metadata.etcd.endpoints": text}
    if cluster_id is not None:
        values["cluster.id"] = cluster_id
    try:
        config = BrokerConfig.model_validate(values)
    except ValidationError as error:
        detail = error.errors(include_url=False)[0]
        setting = ".".join(str(part) for part in detail["loc"])
        raise SettingError(setting, detail["msg"].removeprefix("Value error, ")) from None
    if not config.etcd_endpoints:
        raise SettingError("metadata.etcd.endpoints", "no endpoint (host:port[,host:port...])")
    # The key range's rule (etcd_metadata_log.cluster_prefix), checked without loading gRPC.
    if not config.cluster_id or "/" in config.cluster_id:
        raise SettingError("cluster.id", f"{config.cluster_id!r}: must be non-empty, without '/'")
    return EtcdLog(config.etcd_endpoints, config.cluster_id)


@dataclass(frozen=True, slots=True)
class Location:
    """Where a broker's (or a cluster's) metadata log and objects are: a file log in
    ``metadata_dir``, or the log on etcd (``etcd``), never both."""

    metadata_dir: Path | None  # None: the log is on etcd
    object_store_uri: str
    etcd: EtcdLog | None = None


def locate(
    path: str | Path | None = None,
    *,
    metadata_dir: str | Path | None = None,
    object_store_uri: str | None = None,
    etcd: EtcdLog | None = None,
) -> Location:
    """The metadata log and object store of the broker whose ``log.dirs`` is ``path``, or of
    the cluster whose metadata log is ``etcd``.

    ``path`` may also be the metadata log directory itself. ``metadata_dir`` names the log
    directory explicitly (then ``path`` is not needed). The object store defaults to the local
    ``objects`` directory beside the metadata log, as the broker's default; a broker that keeps
    its objects in S3 needs ``object_store_uri`` (``s3://bucket?endpoint=..&region=..``).

    With ``etcd`` (a cluster), neither ``path`` nor ``metadata_dir`` may be given, and
    ``object_store_uri`` is needed (the brokers' ``s3.data.buckets``): nothing on etcd says
    where the objects are. Nothing is read from etcd here; :func:`load_metadata` reads it.
    """
    if etcd is not None:
        if path is not None or metadata_dir is not None:
            raise ImageError(
                "give either a broker's log.dirs (its file metadata log) or a cluster's etcd "
                "(metadata.etcd.endpoints), not both"
            )
        if object_store_uri is None:
            raise ImageError(
                f"{etcd}: name the object store (the brokers' s3.data.buckets): a cluster's "
                "objects are not found from its metadata log"
            )
        _check_local_store(object_store_uri)
        return Location(None, object_store_uri, etcd)
    if metadata_dir is not None:
        log_dir = Path(metadata_dir)
    elif path is not None:
        root = Path(path)
        log_dir = root if _looks_like_log_dir(root) else root / METADATA_DIR_NAME
    else:
        raise ImageError("give the broker's log.dirs (path) or its metadata log directory")
    if not log_dir.is_dir():
        raise ImageError(f"no metadata log at {log_dir}")
    if object_store_uri is None:
        objects = log_dir.parent / OBJECTS_DIR_NAME
        if not objects.is_dir():
            raise ImageError(
                f"no objects directory at {objects}; the broker may keep its objects in S3: "
                "name the object store"
            )
        object_store_uri = objects.resolve().as_uri()
    else:
        _check_local_store(object_store_uri)
    return Location(log_dir, object_store_uri)


def _check_local_store(object_store_uri: str) -> None:
    if urlsplit(object_store_uri).scheme == "file":
        root = Path(unquote(urlsplit(object_store_uri).path))
        if not root.is_dir():
            raise ImageError(f"object store {object_store_uri}: no directory at {root}")


def _looks_like_log_dir(path: Path) -> bool:
    return path.is_dir() and any(_SEGMENT_FILE.fullmatch(child.name) for child in path.iterdir())


def open_store(uri: str, store_options: Mapping[str, Any] | None = None) -> ObjectStore:
    """The object store at ``uri``; ``store_options`` go to its constructor (credentials).

    The local store gets few I/O threads: a reader needs no more.
    """
    options = dict(store_options or {})
    if urlsplit(uri).scheme == "file":
        options.setdefault("io_threads", 2)
    return open_object_store(uri, **options)


# ------------------------------------------------------------------------------ image


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """The replayed image and how far into the log it goes."""

    image: sm.StreamMetadataImage
    next_index: int  # the log index after the last record replayed

    @property
    def topics(self) -> dict[str, Topic]:
        return topics_in(self.image.kv)


async def load_metadata(location: Location) -> MetadataImage:
    """The image of ``location``'s metadata log, on file or on etcd, read-only."""
    if location.etcd is not None:
        return await load_etcd_image(location.etcd)
    assert location.metadata_dir is not None
    return load_image(location.metadata_dir)


def load_image(metadata_dir: str | Path) -> MetadataImage:
    """Replay the snapshot and the records of the metadata log in ``metadata_dir``, read-only."""
    snapshot, entries = read_log_directory(metadata_dir)
    image = sm.EMPTY_IMAGE
    next_index = 0
    if snapshot is not None:
        image = sm.replay_all(image, decode_snapshot(snapshot.payload))
        next_index = snapshot.index
    for entry in entries:
        image = sm.replay(image, decode_record(entry.payload))
        next_index = entry.index + 1
    return MetadataImage(image, next_index)


async def load_etcd_image(
    etcd: EtcdLog, *, request_timeout_s: float = ETCD_REQUEST_TIMEOUT_S
) -> MetadataImage:
    """Replay a cluster's metadata log on etcd as a broker that opens does: the snapshot kept in
    etcd, then the records after it. Read-only: the log is not created when ``etcd`` has none,
    any write would be refused before reaching etcd, and no election or lease is touched.
    etcd unreachable, no log for the cluster id, or a log that does not decode raise
    :class:`ImageError`."""
    # Imported here: a broker's file log is read without loading etcd's client (gRPC).
    from automq_ref.io.metadata.etcd_client import EtcdClient, EtcdError, Get, prefix_end
    from automq_ref.io.metadata.etcd_metadata_log import KEY_ROOT, EtcdMetadataLog, cluster_prefix

    try:
        client = await EtcdClient.connect(etcd.endpoints, request_timeout_s)
    except EtcdError as error:
        raise ImageError(f"metadata log of {etcd}: {error}") from error
    # Not EtcdMetadataLog.open, which creates a missing log. Fenced writes without a fence: an
    # append or a snapshot install is refused at once (NotController), nothing is sent.
    metadata_log = EtcdMetadataLog(client, etcd.cluster_id, owns_client=True, fenced_writes=True)
    try:
        prefix = cluster_prefix(etcd.cluster_id).encode()
        if not (await client.range(Get(prefix, prefix_end(prefix), limit=1))).kvs:
            known = await _cluster_ids(client, KEY_ROOT)
            raise ImageError(
                f"no metadata log of {etcd}: set cluster.id to the brokers' cluster.id "
                f"(clusters there: {', '.join(known) or 'none'})"
            )
        await metadata_log.refresh()
        replica = await Controller.open(metadata_log)
        return MetadataImage(replica.image, replica.applied_index)
    except (EtcdError, MetadataLogError, FormatError) as error:
        raise ImageError(f"metadata log of {etcd}: {error}") from error
    finally:
        await metadata_log.close()


async def _cluster_ids(client: EtcdClient, key_root: str, most: int = 10) -> list[str]:
    """The cluster ids that have keys under ``key_root`` (at most ``most``), for a hint: one
    key of each cluster is read, then the range skips to the next cluster."""
    from automq_ref.io.metadata.etcd_client import Get, prefix_end

    root = (key_root + "/").encode()
    found: list[str] = []
    cursor = root
    while len(found) < most:
        page = await client.range(Get(cursor, prefix_end(root), limit=1))
        if not page.kvs:
            break
        cluster_id = page.kvs[0].key[len(root) :].split(b"/", 1)[0]
        found.append(cluster_id.decode(errors="replace"))
        cursor = prefix_end(root + cluster_id + b"/")
    return found


# ---------------------------------------------------------------------------- layouts


def byte_runs(blocks: Sequence[DataBlockIndex]) -> tuple[tuple[int, int], ...]:
    """``[start, end)`` byte ranges covering ``blocks``, adjacent blocks merged into one."""
    runs: list[tuple[int, int]] = []
    for block in blocks:
        if runs and runs[-1][1] == block.start_position:
            runs[-1] = (runs[-1][0], block.end_position)
        else:
            runs.append((block.start_position, block.end_position))
    return tuple(runs)


@dataclass(frozen=True, slots=True)
class ObjectRange:
    """Offsets ``[start_offset, end_offset)`` of one stream, held by the blocks of one object.

    Plain data (picklable): what an executor needs to read the range without the image.
    """

    object_id: int
    key: str
    object_size: int
    is_stream_object: bool
    stream_id: int
    start_offset: int
    end_offset: int
    blocks: tuple[DataBlockIndex, ...]

    @property
    def byte_ranges(self) -> tuple[tuple[int, int], ...]:
        return byte_runs(self.blocks)

    @property
    def size_bytes(self) -> int:
        return sum(block.block_size_bytes for block in self.blocks)

    def clip(self, start: int, end: int) -> ObjectRange | None:
        """The part of this range inside ``[start, end)``, with only the blocks it needs."""
        low, high = max(start, self.start_offset), min(end, self.end_offset)
        if low >= high:
            return None
        blocks = tuple(b for b in self.blocks if b.end_offset > low and b.start_offset < high)
        return ObjectRange(
            self.object_id,
            self.key,
            self.object_size,
            self.is_stream_object,
            self.stream_id,
            low,
            high,
            blocks,
        )


@dataclass(frozen=True, slots=True)
class TransactionState:
    """A partition's transactions as far as its committed objects go."""

    stable_offset: int  # the last stable offset of [log start, committed end)
    aborted: tuple[AbortedRow, ...]  # (producer id, first offset, marker offset), marker order
    replayed_from: int  # where the replay read the log from: the checkpoint's end, or log start
    checkpoint_ignored: str | None  # why the MetaStream's checkpoint was not used, if one was


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """One Kafka partition as its committed objects hold it."""

    topic: str
    partition: int
    meta_stream_id: int
    data_stream_id: int | None  # None: the MetaStream's LOG record is not committed yet
    log_start_offset: int
    committed_end_offset: int  # objects hold every offset in [log start, this)
    objects: tuple[ObjectRange, ...] = field(default=())
    transactions: TransactionState | None = None  # only when asked (read_committed)

    def ranges(self, start: int, end: int) -> list[ObjectRange]:
        """The object ranges holding ``[start, end)`` (clipped to it), in offset order."""
        clipped = (object_range.clip(start, end) for object_range in self.objects)
        return [object_range for object_range in clipped if object_range is not None]


def _index_cache(store: ObjectStore) -> ObjectIndexCache:
    return ObjectIndexCache(store, NAMESPACE, max_objects=_PLANNING_INDEX_OBJECTS)


def _object_size(image: sm.StreamMetadataImage, object_id: int) -> int:
    s3_object = image.objects.get(object_id)
    if s3_object is None or s3_object.state is not sm.S3ObjectState.COMMITTED:
        raise ImageError(f"object {object_id} is named by a stream but is not committed")
    return s3_object.object_size


async def stream_ranges(
    image: sm.StreamMetadataImage, store: ObjectStore, stream_id: int
) -> tuple[int, int, tuple[ObjectRange, ...]]:
    """(start offset, committed end, object ranges) of a stream, from its start offset.

    The committed end is where the objects stop being contiguous: the stream's end offset
    unless the image names no object for some offsets (a commit not replayed yet).
    """
    indexes = _index_cache(store)
    try:
        return await _stream_ranges(indexes, image, stream_id)
    finally:
        await indexes.close()


async def _stream_ranges(
    indexes: ObjectIndexCache, image: sm.StreamMetadataImage, stream_id: int
) -> tuple[int, int, tuple[ObjectRange, ...]]:
    stream = image.streams.get(stream_id)
    if stream is None:
        raise ImageError(f"stream {stream_id} is not in the image")
    start = stream.start_offset
    if stream.end_offset <= start:
        return start, start, ()
    error, slices = sm.get_objects(image, stream_id, start, stream.end_offset, _GET_OBJECTS_LIMIT)
    if error is not sm.StreamErrorCode.NONE:
        raise ImageError(f"stream {stream_id} from {start}: {error.value}")
    found: list[ObjectRange] = []
    cursor = start
    for object_slice in slices:
        low, high = cursor, min(object_slice.end_offset, stream.end_offset)
        if low >= high:
            continue
        size = _object_size(image, object_slice.object_id)
        entries = await indexes.get(object_slice.object_id, size)
        blocks = tuple(
            entry
            for entry in entries
            if entry.stream_id == stream_id and entry.end_offset > low and entry.start_offset < high
        )
        _check_covers(object_slice.object_id, stream_id, blocks, low, high)
        found.append(
            ObjectRange(
                object_slice.object_id,
                object_key(NAMESPACE, object_slice.object_id),
                size,
                object_slice.is_stream_object,
                stream_id,
                low,
                high,
                blocks,
            )
        )
        cursor = high
    return start, cursor, tuple(found)


def _check_covers(
    object_id: int, stream_id: int, blocks: Sequence[DataBlockIndex], low: int, high: int
) -> None:
    expected = low
    for block in blocks:
        if block.start_offset > expected:
            break
        expected = block.end_offset
    if not blocks or blocks[0].start_offset > low or expected < high:
        raise ImageError(
            f"object {object_id} does not hold offsets [{low}, {high}) of stream {stream_id} "
            "as the metadata says"
        )


async def read_stream(store: ObjectStore, object_range: ObjectRange) -> list[StreamRecordBatch]:
    """The stream records of ``object_range`` overlapping its offsets, in offset order.

    One ranged GET per run of adjacent blocks; each block is checked against its index entry.
    Link records and the trim marker carry no data and are left out.
    """
    found: list[StreamRecordBatch] = []
    contents = await read_blocks(store, NAMESPACE, object_range.object_id, object_range.blocks)
    for block, data in zip(object_range.blocks, contents, strict=True):
        for batch in parse_data_block(data, block):
            if batch.is_link_record or batch.is_fake_trim_record:
                continue
            if (
                batch.last_offset > object_range.start_offset
                and batch.base_offset < object_range.end_offset
            ):
                found.append(batch)
    return found


def kafka_batches(stream_batches: Iterable[StreamRecordBatch]) -> Iterator[RecordBatchView]:
    """The Kafka RecordBatches in data-stream records (CRC checked), in offset order."""
    for stream_batch in stream_batches:
        yield from iter_batches(stream_batch.payload)


async def read_object_range(store: ObjectStore, object_range: ObjectRange) -> list[RecordBatchView]:
    """The Kafka RecordBatches stored in ``object_range`` (whole batches: cut records yourself)."""
    return list(kafka_batches(await read_stream(store, object_range)))


async def _meta_records(
    indexes: ObjectIndexCache, store: ObjectStore, image: sm.StreamMetadataImage, stream_id: int
) -> PartitionMeta:
    """The MetaStream's committed records, replayed: read with the broker's reader, from the
    stream's start up to where its objects stop."""
    stream = image.streams[stream_id]
    payloads: list[bytes | memoryview] = []
    blocks = DataBlockCache(store, NAMESPACE, capacity_bytes=0)
    cursor = stream.start_offset
    try:
        while cursor < stream.end_offset:
            found = await read_from_objects(
                store,
                NAMESPACE,
                image,
                indexes,
                blocks,
                stream_id,
                cursor,
                stream.end_offset,
                _META_READ_BYTES,
            )
            if not found:
                break
            payloads.extend(batch.payload for batch in found)
            cursor = found[-1].last_offset
        return replay(payloads)
    except (StreamReadError, FormatError) as error:
        raise ImageError(f"MetaStream {stream_id}: {error}") from error
    finally:
        await blocks.close()


async def resolve_partition(
    image: sm.StreamMetadataImage,
    store: ObjectStore,
    topic: Topic,
    index: int,
    *,
    transactions: bool = False,
) -> PartitionLayout:
    """Find one partition's data stream and the object ranges holding its committed offsets
    (and, with ``transactions``, replay its transactions: :func:`replay_transactions`)."""
    indexes = _index_cache(store)
    try:
        return await _resolve_partition(
            indexes, store, image, topic, index, transactions=transactions
        )
    finally:
        await indexes.close()


async def _resolve_partition(
    indexes: ObjectIndexCache,
    store: ObjectStore,
    image: sm.StreamMetadataImage,
    topic: Topic,
    index: int,
    *,
    transactions: bool = False,
) -> PartitionLayout:
    raw = image.kv.get(partition_key(topic.topic_id, index))
    if raw is None:
        raise ImageError(f"partition {topic.name}-{index} has no MetaStream in the KV store")
    try:
        meta_stream_id = decode_kv_integer(raw, f"partition {topic.name}-{index} MetaStream id")
    except FormatError as error:
        raise ImageError(str(error)) from error
    if meta_stream_id not in image.streams:
        raise ImageError(f"partition {topic.name}-{index}: MetaStream {meta_stream_id} is gone")
    meta = await _meta_records(indexes, store, image, meta_stream_id)
    data_stream_id = meta.data_stream_id
    if data_stream_id is None:
        empty = TransactionState(0, (), 0, None) if transactions else None
        return PartitionLayout(topic.name, index, meta_stream_id, None, 0, 0, (), empty)
    start, end, ranges = await _stream_ranges(indexes, image, data_stream_id)
    layout = PartitionLayout(topic.name, index, meta_stream_id, data_stream_id, start, end, ranges)
    if not transactions:
        return layout
    replayed = await replay_transactions(store, layout, meta)
    return PartitionLayout(
        topic.name, index, meta_stream_id, data_stream_id, start, end, ranges, replayed
    )


def _usable_checkpoint(
    meta: PartitionMeta, layout: PartitionLayout
) -> tuple[PartitionCheckpoint | None, str | None]:
    """The MetaStream's last checkpoint if it describes the log the objects hold, else None
    and why not (None and None: there is none)."""
    if meta.checkpoint is None:
        return None, None
    try:
        checkpoint = decode_checkpoint(meta.checkpoint)
    except FormatError as error:
        return None, f"unreadable: {error}"
    assert layout.data_stream_id is not None
    cleaned = None if meta.cleaned is None else (meta.cleaned.stream_id, meta.cleaned.end)
    mismatch = checkpoint_mismatch(
        checkpoint,
        layout.data_stream_id,
        cleaned,
        layout.log_start_offset,
        layout.committed_end_offset,
    )
    return (None, mismatch) if mismatch else (checkpoint, None)


async def replay_transactions(
    store: ObjectStore, layout: PartitionLayout, meta: PartitionMeta
) -> TransactionState:
    """The partition's transaction state over ``[log start, committed end)``: its usable
    checkpoint (:func:`_usable_checkpoint`) and the batches after it, or every batch from the
    log start, replayed in offset order as the partition replays them when it opens."""
    checkpoint, ignored = _usable_checkpoint(meta, layout)
    replay = TransactionReplay()
    log_start, end = layout.log_start_offset, layout.committed_end_offset
    start = log_start
    if checkpoint is not None:
        replay.restore(checkpoint)
        start = checkpoint.end
    try:
        for object_range in layout.ranges(start, end):
            for view in await read_object_range(store, object_range):
                if checkpoint is not None and view.base_offset < start:
                    continue  # the checkpoint covers it
                replay.add(view)
    except (StreamReadError, FormatError) as error:
        raise ImageError(
            f"partition {layout.topic}-{layout.partition}: replaying its transactions: {error}"
        ) from error
    return TransactionState(
        replay.stable_offset(log_start, end), replay.aborted_from(log_start), start, ignored
    )


# ----------------------------------------------------------------------- whole layouts


@dataclass(frozen=True, slots=True)
class Layout:
    """The topics of a broker and the committed object ranges of the partitions asked for."""

    location: Location
    metadata: MetadataImage
    topics: Mapping[str, Topic]
    partitions: Mapping[tuple[str, int], PartitionLayout]


async def resolve_layout(
    location: Location,
    topic_filter: Callable[[str], bool] = lambda name: True,
    *,
    store_options: Mapping[str, Any] | None = None,
    transactions: Callable[[str, int], bool] | None = None,
) -> Layout:
    """Load the image and resolve every partition of the topics ``topic_filter`` accepts,
    replaying the transactions of those ``transactions`` accepts (none when None)."""
    metadata = await load_metadata(location)
    topics = metadata.topics
    partitions: dict[tuple[str, int], PartitionLayout] = {}
    async with open_store(location.object_store_uri, store_options) as store:
        indexes = _index_cache(store)
        try:
            for name, topic in sorted(topics.items()):
                if not topic_filter(name):
                    continue
                for index in range(topic.partitions):
                    partitions[(name, index)] = await _resolve_partition(
                        indexes,
                        store,
                        metadata.image,
                        topic,
                        index,
                        transactions=transactions is not None and transactions(name, index),
                    )
        finally:
            await indexes.close()
    return Layout(location, metadata, topics, partitions)


def read_layout(
    location: Location,
    topic_filter: Callable[[str], bool] = lambda name: True,
    *,
    store_options: Mapping[str, Any] | None = None,
    transactions: Callable[[str, int], bool] | None = None,
) -> Layout:
    """:func:`resolve_layout` for callers without an event loop (Spark's driver)."""
    return asyncio.run(
        resolve_layout(
            location, topic_filter, store_options=store_options, transactions=transactions
        )
    )


def read_batches(
    object_store_uri: str,
    object_range: ObjectRange,
    *,
    store_options: Mapping[str, Any] | None = None,
) -> list[RecordBatchView]:
    """:func:`read_object_range` for callers without an event loop (Spark's executors)."""

    async def run() -> list[RecordBatchView]:
        async with open_store(object_store_uri, store_options) as store:
            return await read_object_range(store, object_range)

    return asyncio.run(run())
