"""A Kafka partition over two streams: its MetaStream and its data stream.

Offsets: a Kafka offset *is* a data-stream offset. Each produced RecordBatch (or the batches of
one partition in one Produce request) becomes one stream append covering ``lastOffsetDelta + 1``
offsets per batch; before the append the broker writes the assigned base offset and the leader
epoch into the batch (both outside the CRC), so a Fetch hands the stored bytes back unchanged.

The MetaStream holds small key/value records (:mod:`automq_ref.formats.meta_stream`; the last
value of a key wins on replay): ``LOG`` names the data stream; ``LEADER_EPOCHS`` records the
``[epoch, start offset]`` history, rewritten each time the partition is opened. The MetaStream's
id is found through the controller's KV under :func:`~automq_ref.vocabulary.naming.partition_key`
(read from the metadata view, written through the controller client).
The leader epoch is the stream epoch: every open (a restart, or a move to another node) opens both
streams one epoch higher, which fences the previous owner.

A compacted topic's partition has a second data stream, the *cleaned* stream, named by the
MetaStream's ``CLEANED`` record with the offset where the last clean ended (the cleaned end):
the log below the cleaned end is read from the cleaned stream, the log from it on from the live
``LOG`` stream (which is trimmed to the cleaned end once the clean is committed). Both keep the
rule "a Kafka offset is a stream offset": the cleaned stream holds the compacted batches at their
own offsets, each stream record covering the offsets from the end of the previous one to the end
of its last batch, so the offsets compaction removed lie inside the record that follows them and
a read at any offset finds the next batch that survived. Reads (Fetch, the index scan, the
cleaner) go through :meth:`Partition.read` / :meth:`Partition.read_stored`, which walk the two
parts in offset order; the log start is the cleaned stream's start when there is one. How a
clean is written and committed, and what a restart finds after a crash at any point of it, is
in :mod:`automq_ref.kafka.compaction`; this module holds the steps that touch the streams and
the MetaStream (``begin_clean``, ``append_cleaned``, ``commit_clean``, ``settle``).

The partition keeps beside its log what Kafka keeps beside its segments: the producer state of
idempotent producers (last five batches per producer id) and a batch index (base offset, end
offset, max timestamp, size) used by ListOffsets by timestamp, by retention and by the cleaner
(their rules: :mod:`automq_ref.kafka.log_state`). Both are rebuilt at open from the log's batch
headers. A partition that closes cleanly writes them into its MetaStream as a ``CHECKPOINT``
record covering the log up to its end (:mod:`automq_ref.formats.partition_checkpoint`), so the
next open (on this broker after a restart, or on the broker it moved to) loads them and scans
only what lies past the checkpoint: nothing after a clean close, so an open takes the same time
whatever the partition holds. A running partition also writes one every
:data:`CHECKPOINT_INTERVAL_BYTES` appended, so an open after a crash scans about that much at
most. A checkpoint that does not describe the log the open finds (written for other streams, as
after a clean committed since; past the log's end; or with the log trimmed past it) or that
cannot be decoded is ignored with a log line, the whole log scanned, and a checkpoint of what
the scan rebuilt written in its place. The transaction state (Kafka transactions: the open
transactions, the aborted index, the LSO) is kept the same way: :mod:`.partition_transactions`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.control_batch import build_marker_batch
from automq_ref.formats.errors import FormatError
from automq_ref.formats.json_document import Json
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.formats.meta_stream import (
    CHECKPOINT_KEY,
    CLEANED_KEY,
    CLEANING_KEY,
    LEADER_EPOCHS_KEY,
    LOG_KEY,
    PartitionMeta,
    encode_checkpoint_record,
    encode_cleaned,
    encode_cleaning,
    encode_leader_epochs,
    encode_log,
    latest_records,
    replay,
)
from automq_ref.formats.partition_checkpoint import AbortedRow, decode_checkpoint
from automq_ref.formats.record_batch import TIMESTAMP_TYPE_MASK, RecordBatchView, iter_batches
from automq_ref.formats.stream_record_batch import StreamRecordBatch
from automq_ref.formats.zone_router import ChannelOffset, LinkRecord
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import (
    OffsetOutOfRangeError,
    S3Storage,
    StorageError,
    StreamFencedError,
)
from automq_ref.io.storage.stream_objects import ReadOrigin
from automq_ref.kafka import log_state
from automq_ref.kafka.log_state import (
    BatchEntry,
    Duplicate,
    ProduceResult,
    ProducerState,
    answer_duplicate,
    answer_of,
    check_sequences,
    remember_batch,
)
from automq_ref.kafka.partition_streams import SCAN_CHUNK_BYTES, close_opened, read_meta
from automq_ref.kafka.partition_transactions import PartitionTransactions, ProducerDescription
from automq_ref.kafka.producer_expiry import ProducerExpiry
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import partition_key

log = logging.getLogger(__name__)

# A partition writing a checkpoint compacts its MetaStream (rewrites the last record of each key,
# trims the rest) once the stream holds more than this many times their bytes.
META_COMPACTION_RATIO = 2
# A running partition writes a checkpoint once this many bytes were appended since the last one
# (at a moment when every append is durable), so that an open after a crash scans at most about
# this much (plus what came after it).
CHECKPOINT_INTERVAL_BYTES = 64 * 1024 * 1024
# The largest checkpoint record written: well within what one WAL record may hold (a batch of
# Kafka's default max.message.bytes fits too). About 2.7 bytes a batch once compressed and in
# base64: an index of up to about 380,000 batches.
MAX_CHECKPOINT_BYTES = 1024 * 1024


class Partition:
    def __init__(
        self,
        storage: S3Storage,
        client: ControllerClient,
        topic: str,
        topic_id: uuid.UUID,
        index: int,
        meta_stream_id: int,
        data_stream_id: int,
        epoch: int,
    ) -> None:
        self.storage = storage
        self._client = client
        self.topic = topic
        self.topic_id = topic_id
        self.index = index
        self.meta_stream_id = meta_stream_id
        self.data_stream_id = data_stream_id
        self.epoch = epoch
        self.batches: list[BatchEntry] = []
        self.producers: dict[int, ProducerState] = {}
        self.transactions = PartitionTransactions(epoch)
        # The node's clock and producer.id.expiration.ms (an idle producer id is forgotten);
        # create and open take the registry's.
        self.expiry = ProducerExpiry()
        # Told (producer id, commit) of every marker once durable: the group shard of a
        # __consumer_offsets partition shows or drops the producer's transactional offsets.
        self.marker_listeners: list[Callable[[int, bool], None]] = []
        self.leader_epochs: list[tuple[int, int]] = []
        # Bytes produced to and fetched from the partition here: the loads its broker reports.
        self.bytes_in = 0
        self.bytes_out = 0
        self.records_in = 0  # and the records produced (the metrics' kafka_message_count)
        self.taken_s = time.monotonic()  # when this broker opened it
        # What rebuilding the batch index and producer state at open read, and how long it
        # took: the part of a move's unavailability that grows with the retained log.
        self.scanned_bytes = 0
        self.scan_seconds = 0.0
        # Where the open's scan began: the checkpoint's end, or the log start without one.
        self.scanned_from = 0
        self.checkpoint_used = False
        # An append whose WAL write failed: a checkpoint at close would claim offsets the
        # stream may not hold, so none is written.
        self._lost_append = False
        # Appends not yet durable, by base offset, and those whose WAL write failed (kept): what
        # a retry of one of them waits for (log_state.answer_duplicate).
        self._unconfirmed: dict[int, asyncio.Future[None]] = {}
        # Periodic checkpoints: bytes appended since the last one, the write in flight, and
        # whether the partition closed (a write that comes after the close is dropped).
        self._unchecked_bytes = 0
        self._checkpointing: asyncio.Task[None] | None = None
        self._closed = False
        # The last MetaStream record of each key, and the bytes the stream holds: what a
        # compaction of the MetaStream rewrites, and when it is due.
        self._meta_latest: dict[str, bytes] = {}
        self._meta_bytes = 0
        self._appended = asyncio.Event()
        # Set once an append's WAL write failed (a device error, or the WAL fenced by a
        # takeover): the stream ends there, and the producer state already remembers batches
        # that were never durable, so a client's retry must not be answered as a duplicate.
        self._write_failure: BaseException | None = None
        # Compaction: the cleaned stream and where it ends (None: never cleaned), the stream a
        # clean in progress writes, the replaced cleaned stream still to delete.
        self.cleaned_stream_id: int | None = None
        self.cleaned_end = 0
        self._cleaning_stream_id: int | None = None
        self._retiring: int | None = None
        # Held by whatever changes which streams hold the log: a clean, a trim, close, delete.
        self.maintenance = asyncio.Lock()
        # Reads in flight per stream: a replaced cleaned stream is deleted once none is left.
        self._readers: collections.Counter[int] = collections.Counter()

    # ------------------------------------------------------------------------ lifecycle

    @classmethod
    async def create(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        topic: str,
        topic_id: uuid.UUID,
        index: int,
        epoch: int = 0,
        expiry: ProducerExpiry | None = None,
    ) -> Partition:
        """New streams, tagged with the partition, opened at ``epoch`` (the partition's leader
        epoch); the KV entry is written last, so a crash before it leaves only unreferenced
        streams (no half-created partition is ever found). Another broker that wrote the KV
        entry first (the partition moved while both created it) wins: these streams are
        deleted and :class:`PartitionExistsError` raised."""
        meta_stream_id = await storage.create_stream(str(topic_id), index)
        data_stream_id = await storage.create_stream(str(topic_id), index)
        opened: list[int] = []
        try:
            for stream_id in (meta_stream_id, data_stream_id):
                await storage.open_stream(stream_id, epoch)
                opened.append(stream_id)
            partition = cls(
                storage, client, topic, topic_id, index, meta_stream_id, data_stream_id, epoch
            )
            partition.expiry = expiry or partition.expiry
            await partition._put_meta(LOG_KEY, encode_log(data_stream_id))
            partition.leader_epochs.append((epoch, 0))
            await partition._put_meta(
                LEADER_EPOCHS_KEY, encode_leader_epochs(partition.leader_epochs)
            )
        except Exception:
            # Refused half way (the partition moved on meanwhile): streams this broker holds
            # open would keep the partition's next broker from opening it, so they are closed.
            await close_opened(storage, opened, epoch, f"{topic}-{index}")
            raise
        response = await client.submit(
            sm.PutKV(partition_key(topic_id, index), encode_kv_integer(meta_stream_id), False)
        )
        if response.error is sm.StreamErrorCode.KEY_EXIST:
            async with partition.maintenance:
                await partition._close_streams()
                for stream_id in partition._streams():
                    await storage.delete_stream(stream_id, epoch)
            raise PartitionExistsError(f"partition {topic}-{index} was created elsewhere")
        if not response.ok:
            raise RuntimeError(f"partition {topic}-{index}: {response.message}")
        return partition

    @classmethod
    async def open(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        topic: str,
        topic_id: uuid.UUID,
        index: int,
        epoch: int | None = None,
        expiry: ProducerExpiry | None = None,
    ) -> Partition:
        """Open the partition's streams at ``epoch`` (its leader epoch) and rebuild the state
        (then forget the producers idle past ``expiry``'s expiration: :meth:`expire_producers`).
        Streams not tagged with the partition (written before placement) open one epoch above
        their current one when that is higher; without ``epoch``, at that one."""
        image = view.image
        raw = image.kv.get(partition_key(topic_id, index))
        if raw is None:
            raise LookupError(f"partition {topic}-{index} has no MetaStream")
        meta_stream_id = decode_kv_integer(raw, f"partition {topic}-{index} MetaStream id")
        meta = image.streams.get(meta_stream_id)
        if meta is None:
            raise LookupError(f"partition {topic}-{index}: MetaStream {meta_stream_id} is gone")
        if meta.partition_key is None or epoch is None:
            epoch = max(meta.epoch + 1, 0 if epoch is None else epoch, 1)
        opened: list[int] = []
        try:
            await storage.open_stream(meta_stream_id, epoch)
            opened.append(meta_stream_id)
            payloads = await read_meta(storage, meta_stream_id)
            recorded = replay(payloads)
            data_stream_id = recorded.data_stream_id
            if data_stream_id is None:
                raise LookupError(
                    f"partition {topic}-{index}: MetaStream {meta_stream_id} has no LOG"
                )
            await storage.open_stream(data_stream_id, epoch)
            opened.append(data_stream_id)
            partition = cls(
                storage, client, topic, topic_id, index, meta_stream_id, data_stream_id, epoch
            )
            partition.expiry = expiry or partition.expiry
            partition._meta_latest = latest_records(payloads)
            partition._meta_bytes = sum(len(payload) for payload in payloads)
            if recorded.cleaned is not None:
                await storage.open_stream(recorded.cleaned.stream_id, epoch)
                opened.append(recorded.cleaned.stream_id)
                partition.cleaned_stream_id = recorded.cleaned.stream_id
                partition.cleaned_end = recorded.cleaned.end
            partition.leader_epochs = list(recorded.leader_epochs)
            start_of_epoch = storage.next_offset(data_stream_id, epoch)
            partition.leader_epochs.append((epoch, start_of_epoch))
            await partition._put_meta(
                LEADER_EPOCHS_KEY, encode_leader_epochs(partition.leader_epochs)
            )
            await partition._finish_cleans(view, recorded)
            await partition._scan(partition._load_checkpoint(recorded.checkpoint))
            partition.expire_producers()
            if recorded.checkpoint is not None and not partition.checkpoint_used:
                await partition._replace_checkpoint()
        except Exception:
            # Refused half way (in a cluster: the partition moved on between the opens of its
            # streams) or failed: a stream left open here would keep every other broker from
            # opening the partition (STREAM_NOT_CLOSED) for as long as this one runs.
            await close_opened(storage, opened, epoch, f"{topic}-{index}")
            raise
        return partition

    async def _finish_cleans(self, view: MetadataView, recorded: PartitionMeta) -> None:
        """What a clean cut short by a crash or a shutdown left: a stream begun but never
        committed is deleted (its output never became part of the log), the stream a committed
        clean replaced is deleted, and the live stream is trimmed to the cleaned end."""
        cleaned = recorded.cleaned
        leftovers = []
        if recorded.cleaning_stream_id is not None and (
            cleaned is None or recorded.cleaning_stream_id != cleaned.stream_id
        ):
            leftovers.append(recorded.cleaning_stream_id)
        if cleaned is not None and cleaned.replaces is not None:
            leftovers.append(cleaned.replaces)
        for stream_id in leftovers:
            if stream_id not in view.image.streams:
                continue  # deleted already
            try:
                await self.storage.open_stream(stream_id, self.epoch)
                await self.storage.close_stream(stream_id, self.epoch)
                await self.storage.delete_stream(stream_id, self.epoch)
            except StorageError as error:  # an unreferenced stream: a leak, not a fault
                log.warning(
                    "%s-%d: stream %d left by a clean: %s", self.topic, self.index, stream_id, error
                )
        await self.settle()

    def _streams(self) -> list[int]:
        """Every stream this partition has open."""
        streams = [self.data_stream_id]
        for stream_id in (self.cleaned_stream_id, self._cleaning_stream_id, self._retiring):
            if stream_id is not None:
                streams.append(stream_id)
        return [*streams, self.meta_stream_id]

    async def close(self) -> None:
        """Close the streams; a partition whose appends all became durable writes a checkpoint
        of its batch index and producer state into the MetaStream first (after the data streams
        closed, so nothing changes the log any more, before the MetaStream closes)."""
        async with self.maintenance:
            self._closed = True  # no periodic checkpoint any more
            # No await between reading the end and the data stream's close refusing appends:
            # the index and producer state then describe exactly the log up to ``end``.
            end: int | None
            try:
                end = self.log_end_offset
            except StorageError:  # an earlier close, cut short, closed the data stream already
                end = None
            *data_streams, meta_stream = self._streams()
            for stream_id in data_streams:
                await self.storage.close_stream(stream_id, self.epoch)
            if end is not None and not self._lost_append:
                try:
                    await self._write_checkpoint(end)
                except StorageError as error:  # the next open scans: slower, as correct
                    log.warning("%s-%d: no checkpoint written: %s", self.topic, self.index, error)
            await self.storage.close_stream(meta_stream, self.epoch)

    async def _close_streams(self) -> None:
        for stream_id in self._streams():
            await self.storage.close_stream(stream_id, self.epoch)

    async def delete(self) -> None:
        """Close and delete every stream and forget the KV entry."""
        async with self.maintenance:
            self._closed = True
            await self._close_streams()
            for stream_id in self._streams():
                await self.storage.delete_stream(stream_id, self.epoch)
        await self._client.submit(sm.DeleteKV(partition_key(self.topic_id, self.index)))

    async def _put_meta(self, key: str, record: bytes) -> None:
        await self.storage.append(self.meta_stream_id, self.epoch, record, 1)
        self._meta_latest.pop(key, None)
        self._meta_latest[key] = record
        self._meta_bytes += len(record)

    # ---------------------------------------------------------------- index and checkpoint

    async def _scan(self, start: int | None = None) -> None:
        """Rebuild the batch index and producer state from the log from ``start`` (a loaded
        checkpoint's end) on, or from the log start."""
        began = time.monotonic()
        start = self.log_start_offset if start is None else start
        self.scanned_from = start
        async for stream_batch in self.read_stored(start, self.high_watermark):
            self._index_payload(stream_batch.payload, start)
            self.scanned_bytes += len(stream_batch.payload)
        self.scan_seconds = time.monotonic() - began

    def _index_payload(self, payload: bytes | memoryview, start: int = 0) -> None:
        for view in stored_batches(payload):
            if view.base_offset < start and self.checkpoint_used:
                continue  # covered by the checkpoint already
            self._remember(view)

    def _remember(self, view: RecordBatchView) -> None:
        remember_batch(self.batches, self.producers, view)
        if view.is_transactional:
            self.transactions.add(view)

    @property
    def _cleaned(self) -> tuple[int, int] | None:
        """(cleaned stream, cleaned end), as a checkpoint names the log's layout."""
        if self.cleaned_stream_id is None:
            return None
        return self.cleaned_stream_id, self.cleaned_end

    def _load_checkpoint(self, value: Json) -> int | None:
        """Take the batch index and producer state from the MetaStream's last checkpoint if it
        describes the log as it is now; the offset to scan from then (its end), else None."""
        if value is None:
            return None
        try:
            checkpoint = decode_checkpoint(value)
        except FormatError as error:
            self._ignore_checkpoint(f"unreadable: {error}")
            return None
        start = self.log_start_offset
        mismatch = log_state.mismatch(
            checkpoint, self.data_stream_id, self._cleaned, start, self.high_watermark
        )
        if mismatch is not None:
            self._ignore_checkpoint(mismatch)
            return None
        now_ms = self.expiry.now_ms()
        self.batches, self.producers = log_state.restore(checkpoint, start, now_ms)
        self.transactions.restore_at(checkpoint, start, now_ms)
        self.checkpoint_used = True
        return checkpoint.end

    async def _replace_checkpoint(self) -> None:
        """After a checkpoint was ignored: one of what the scan rebuilt, at once. A stale
        checkpoint left in place could come to fit a log it does not describe (its end past a
        log that lost acknowledged data, once new appends pass that end); the next open after a
        crash scans less too."""
        if not self._all_durable():
            return
        value = log_state.checkpoint_value(
            self.data_stream_id,
            self._cleaned,
            self.high_watermark,
            self.batches,
            self.producers,
            self.transactions.rows(),
        )
        try:
            await self._put_checkpoint(value)
        except StorageError as error:  # the open stands; the close writes one
            log.warning("%s-%d: no checkpoint written: %s", self.topic, self.index, error)

    def _ignore_checkpoint(self, reason: str) -> None:
        log.warning(
            "%s-%d: checkpoint ignored, scanning the whole log: %s", self.topic, self.index, reason
        )

    async def _write_checkpoint(self, end: int) -> None:
        """Append a checkpoint of the index and producer state up to ``end`` to the MetaStream
        (the log must not change meanwhile), then compact the MetaStream if it is due."""
        rows = self.transactions.rows()
        value = log_state.checkpoint_value(
            self.data_stream_id, self._cleaned, end, self.batches, self.producers, rows
        )
        await self._put_checkpoint(value)

    async def _put_checkpoint(self, value: Json) -> None:
        """Append the checkpoint ``value`` to the MetaStream, unless it is too large for one
        record (the next open then uses an older one, or scans), and compact the MetaStream
        if that is due."""
        record = encode_checkpoint_record(value)
        if len(record) > MAX_CHECKPOINT_BYTES:
            log.warning(
                "%s-%d: checkpoint of %d bytes not written (at most %d): the next open scans",
                self.topic,
                self.index,
                len(record),
                MAX_CHECKPOINT_BYTES,
            )
            return
        await self._put_meta(CHECKPOINT_KEY, record)
        await self._compact_meta()

    async def _compact_meta(self) -> None:
        """Rewrite the last record of each key and trim the MetaStream below them, once the
        stream holds more than :data:`META_COMPACTION_RATIO` times their bytes. A crash in
        between leaves both copies: replay gives the same state either way."""
        latest = list(self._meta_latest.values())
        if self._meta_bytes <= META_COMPACTION_RATIO * sum(map(len, latest)):
            return
        first = self.storage.next_offset(self.meta_stream_id, self.epoch)
        # Queued together (one WAL write for all), durable before the trim.
        await asyncio.gather(
            *(
                self.storage.append_nowait(self.meta_stream_id, self.epoch, record, 1)[1]
                for record in latest
            )
        )
        await self.storage.trim_stream(self.meta_stream_id, self.epoch, first)
        self._meta_bytes = sum(map(len, latest))

    # ---------------------------------------------------------------------------- offsets

    @property
    def high_watermark(self) -> int:
        return self.storage.confirm_offset(self.data_stream_id)

    @property
    def log_start_offset(self) -> int:
        if self.cleaned_stream_id is not None:
            return self.storage.start_offset(self.cleaned_stream_id)
        return self.storage.start_offset(self.data_stream_id)

    def fetch_bounds(self) -> tuple[int, int, int]:
        """(log start offset, high watermark, log end offset), read together: what a Fetch
        checks of each partition it names (one by one, as properties, they cost a Fetch of
        1,000 partitions milliseconds of the event loop)."""
        storage, data = self.storage, self.data_stream_id
        cleaned = self.cleaned_stream_id
        return (
            storage.start_offset(data if cleaned is None else cleaned),
            storage.confirm_offset(data),
            storage.next_offset(data, self.epoch),
        )

    @property
    def dirty_start(self) -> int:
        """Where the part of the log no clean has reached begins."""
        if self.cleaned_stream_id is None:
            return self.log_start_offset
        return max(self.cleaned_end, self.log_start_offset)

    def _parts(self, upper: int | None = None) -> list[tuple[int, int, int]]:
        """(stream, first offset, end offset) of each stream holding the log (below ``upper``),
        in offset order: the cleaned stream's own extent, then the live stream from the cleaned
        end."""
        live_start = self.storage.start_offset(self.data_stream_id)
        parts = []
        cleaned = self.cleaned_stream_id
        if cleaned is not None:
            parts.append(
                (cleaned, self.storage.start_offset(cleaned), self.storage.confirm_offset(cleaned))
            )
            live_start = max(live_start, self.cleaned_end)
        parts.append((self.data_stream_id, live_start, self.high_watermark))
        if upper is not None:
            return [(stream, first, min(stop, upper)) for stream, first, stop in parts]
        return parts

    @property
    def log_end_offset(self) -> int:
        return self.storage.next_offset(self.data_stream_id, self.epoch)

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        return log_state.end_offset_for_epoch(self.leader_epochs, leader_epoch, self.log_end_offset)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        return log_state.offset_for_timestamp(self.batches, self.log_start_offset, timestamp)

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        return log_state.max_timestamp_offset(self.batches, self.log_start_offset)

    # ----------------------------------------------------------------------------- produce

    def append_nowait(
        self,
        records: bytes | memoryview | None,
        max_batch_bytes: int,
        *,
        require_keys: bool = False,
        channel_offset: ChannelOffset | None = None,
        verification_guard: int = 0,
    ) -> ProduceResult:
        """Validate, assign offsets and queue the WAL write; nothing here awaits, so calls run
        in arrival order. The result's ``durable`` completes when the data is acknowledged.
        ``require_keys`` (a compacted topic): a record without a key is ``INVALID_RECORD``.
        ``channel_offset`` (data the zone router routed here, read from a proxy's
        RouterChannel): the WAL holds a link record pointing there instead of the data, the
        LogCache the data (``S3Storage.append_nowait``'s ``link``). A transactional batch lands
        by :meth:`PartitionTransactions.check` (``verification_guard``: what
        :meth:`begin_transaction_verification` returned before the coordinator verified it).

        A writable ``memoryview`` (a slice of a request frame) gets the offsets and leader epoch
        written into it in place; the storage copies it (once, into the WAL record) either way."""
        if not records:
            return ProduceResult(KafkaErrorCode.INVALID_RECORD, message="no record batch")
        if self._write_failure is not None:
            return ProduceResult(
                KafkaErrorCode.KAFKA_STORAGE_ERROR,
                message=f"an earlier append failed: {self._write_failure}",
            )
        # A writable view (of the request frame) is patched in place; anything else is copied.
        data = (
            records
            if isinstance(records, memoryview) and not records.readonly
            else bytearray(records)
        )
        try:
            views = list(iter_batches(data))
        except FormatError as error:  # each carries its Kafka code (CORRUPT_MESSAGE for a CRC)
            return ProduceResult(error.code, message=str(error))
        transactional = False
        for view in views:
            if view.size_bytes > max_batch_bytes:
                return ProduceResult(
                    KafkaErrorCode.MESSAGE_TOO_LARGE,
                    message=f"batch of {view.size_bytes} bytes exceeds {max_batch_bytes}",
                )
            if view.is_control:
                return ProduceResult(
                    KafkaErrorCode.INVALID_RECORD, message="clients may not send control batches"
                )
            transactional = transactional or view.is_transactional
            if require_keys:
                keyless = log_state.keyless_record(view, f"{self.topic}-{self.index}")
                if keyless is not None:
                    return keyless
        if transactional or self.transactions.entries:
            refused = self.transactions.check(views, verification_guard)
            if refused is not None:
                return refused
        checked = check_sequences(self.producers, views)
        if isinstance(checked, Duplicate):
            return answer_duplicate(checked, self._unconfirmed.get(checked.base_offset))
        if checked is not None:
            return checked
        base, durable = self._queue(data, views, channel_offset)
        return ProduceResult(KafkaErrorCode.NONE, base, answer_of(durable))

    def _queue(
        self,
        data: bytearray | memoryview,
        views: list[RecordBatchView],
        channel: ChannelOffset | None = None,
    ) -> tuple[int, asyncio.Future[None]]:
        """Assign ``views`` (in ``data``) their offsets, queue their append, note them landed."""
        base = offset = self.log_end_offset
        for view in views:
            view.set_base_offset(offset)
            view.set_partition_leader_epoch(self.epoch)
            offset += view.last_offset_delta + 1
        link = None
        if channel is not None:
            link = LinkRecord(
                last_offset=offset - 1,
                timestamp_type=1 if views[-1].attributes & TIMESTAMP_TYPE_MASK else 0,
                max_timestamp=max(view.max_timestamp for view in views),
                partition_leader_epoch=self.epoch,
                channel_offset=channel,
            )
        first, durable = self.storage.append_nowait(  # copies data (a view of the frame)
            self.data_stream_id, self.epoch, memoryview(data), offset - base, link=link
        )
        self.bytes_in += len(data)
        self.records_in += offset - base
        self._unchecked_bytes += len(data)
        assert first == base, (first, base)
        for view in views:
            self._remember(view)
        durable.add_done_callback(self._appended_durably)
        self._unconfirmed[base] = durable
        durable.add_done_callback(lambda done: self._confirmed(base, done))
        return base, durable

    # ------------------------------------------------------------------------ transactions

    def transaction_needs_verification(self, producer_id: int, epoch: int) -> bool:
        """Whether a transactional batch at ``epoch`` must be verified (it would begin one)."""
        return self.transactions.needs_verification(producer_id, epoch)

    def begin_transaction_verification(self, producer_id: int, epoch: int) -> int:
        """A new guard, for ``append_nowait(..., verification_guard=)`` once verified."""
        return self.transactions.begin_verification(producer_id, epoch, self.expiry.now_ms())

    async def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> KafkaErrorCode:
        """Append a COMMIT (``commit``) or ABORT marker and wait until it is durable (the
        transaction ends here as its offset is assigned: in order with appends)."""
        error = self.transactions.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if error is KafkaErrorCode.NONE and self._write_failure is not None:
            error = KafkaErrorCode.KAFKA_STORAGE_ERROR
        if error is not KafkaErrorCode.NONE:
            return error
        now = self.expiry.now_ms()
        marker = bytearray(
            build_marker_batch(producer_id, producer_epoch, coordinator_epoch, commit, now)
        )
        try:
            await answer_of(self._queue(marker, list(iter_batches(marker)))[1])
        except StreamFencedError:
            return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        except StorageError as failure:
            log.error("%s-%d: marker not written: %s", self.topic, self.index, failure)
            return KafkaErrorCode.KAFKA_STORAGE_ERROR
        for listener in list(self.marker_listeners):
            listener(producer_id, commit)
        return KafkaErrorCode.NONE

    @property
    def last_stable_offset(self) -> int:
        return self.stable_offset(self.high_watermark)

    def stable_offset(self, high_watermark: int) -> int:
        """The LSO, given the high watermark read just now (without transactions: a flag)."""
        if not self.transactions.unstable:
            return high_watermark
        return self.transactions.stable_offset(high_watermark, self.log_start_offset)

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read may meet."""
        return self.transactions.aborted_between(fetch_offset, upper_bound)

    def describe_producers(self) -> list[ProducerDescription]:
        return self.transactions.describe(self.producers)

    def expire_producers(self) -> list[int]:
        """Forget the producer ids idle for the expiration, by the clock's time now, unless a
        transaction of theirs is open (:meth:`PartitionTransactions.expire`); the ids gone."""
        now_ms, expiration_ms = self.expiry.now_ms(), self.expiry.expiration_ms
        return self.transactions.expire(self.producers, now_ms, expiration_ms)

    def _confirmed(self, base: int, durable: asyncio.Future[None]) -> None:
        if not durable.cancelled() and durable.exception() is None:
            del self._unconfirmed[base]

    def _appended_durably(self, durable: asyncio.Future[None]) -> None:
        # Runs before the producer is answered (the handler awaits the future after this
        # callback was added), so a retry already finds the failure.
        if durable.cancelled() or durable.exception() is not None:
            self._lost_append = True
        if not durable.cancelled() and durable.exception() is not None:
            self._write_failure = self._write_failure or durable.exception()
        self._wake()
        if (
            self._unchecked_bytes >= CHECKPOINT_INTERVAL_BYTES
            and self._checkpointing is None
            and not self._closed
            and not self._lost_append
            and self._all_durable()
        ):
            self._checkpoint_in_background()

    def _all_durable(self) -> bool:
        """Every append durable: the index and producer state then describe the log up to the
        high watermark exactly (else the next durable append tries again)."""
        try:
            return self.log_end_offset == self.high_watermark
        except StorageError:  # the stream closed or failed meanwhile
            return False

    def _checkpoint_in_background(self) -> None:
        """Take a checkpoint of the index and producer state as they are now (all appends
        durable) and write it to the MetaStream in a task: what a crash-recovered open loads."""
        end = self.high_watermark
        batches = list(self.batches)  # the entries are immutable: a copy of the list suffices
        producers = {
            producer_id: ProducerState(state.epoch, state.batches.copy(), state.last_timestamp)
            for producer_id, state in self.producers.items()
        }
        cleaned, data_stream_id = self._cleaned, self.data_stream_id
        rows = self.transactions.rows()
        self._unchecked_bytes = 0

        async def write() -> None:
            try:
                # Encoding is a pass over the whole index: off the event loop.
                value = await asyncio.to_thread(
                    log_state.checkpoint_value,
                    *(data_stream_id, cleaned, end, batches, producers, rows),
                )
                async with self.maintenance:  # no MetaStream compaction or close meanwhile
                    # A clean committed meanwhile made it stale (an open would ignore it).
                    if not self._closed and self._cleaned == cleaned:
                        await self._put_checkpoint(value)
            except Exception as error:  # a later checkpoint, or the close's, will do
                log.warning("%s-%d: periodic checkpoint failed: %s", self.topic, self.index, error)
            finally:
                self._checkpointing = None

        self._checkpointing = asyncio.get_running_loop().create_task(
            write(), name=f"checkpoint {self.topic}-{self.index}"
        )

    def _wake(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    async def wait_for_data(self) -> None:
        """Until the next append becomes durable (a Fetch long poll waits on this)."""
        await self._appended.wait()

    def wake_waiters(self) -> None:
        self._wake()

    # ------------------------------------------------------------------------------- fetch

    async def read(
        self,
        offset: int,
        max_bytes: int,
        min_one: bool = True,
        origin: ReadOrigin | None = None,
        upper: int | None = None,
    ) -> list[bytes | memoryview]:
        """Whole stored payloads from the one holding ``offset`` up to the high watermark (or
        ``upper`` below it, the LSO of a READ_COMMITTED Fetch), no
        more than ``max_bytes`` together; with ``min_one`` the first comes even past
        ``max_bytes`` (KIP-74: the first batch of a Fetch response may exceed its limits, so a
        consumer always progresses; no other may). ``origin`` learns whether storage read
        objects for them (:class:`~automq_ref.io.storage.stream_objects.ReadOrigin`)."""
        budget = self._read_budget(offset, max_bytes, min_one, upper)
        found: list[StreamRecordBatch] = []
        for stream_id, first, stop in self._parts(upper) if budget > 0 else ():
            if offset < stop and first < stop:
                found = await self._read_part(stream_id, max(offset, first), stop, budget, origin)
                if found:
                    break
        return log_state.stored_payloads(found, max_bytes, min_one, upper)

    def read_now(
        self, offset: int, max_bytes: int, min_one: bool = True, upper: int | None = None
    ) -> list[bytes | memoryview] | None:
        """What :meth:`read` answers, when the LogCache holds all of it (no await: a Fetch of
        many tail partitions answers those at once); else None."""
        budget = self._read_budget(offset, max_bytes, min_one, upper)
        for stream_id, first, stop in self._parts(upper) if budget > 0 else ():
            if offset < stop and first < stop:
                found = self.storage.read_cached(stream_id, max(offset, first), stop, budget)
                if found is None:
                    return None
                if found:
                    return log_state.stored_payloads(found, max_bytes, min_one, upper)
        return []

    def _read_budget(self, offset: int, max_bytes: int, min_one: bool, upper: int | None) -> int:
        """What a read from ``offset`` asks storage for: the batches that fit, by the batch
        index (:func:`log_state.read_budget`); 0 when nothing may come."""
        end = self.high_watermark if upper is None else min(upper, self.high_watermark)
        if offset >= end or (max_bytes <= 0 and not min_one):
            return 0
        start = self.log_start_offset
        if offset < start:
            raise OffsetOutOfRangeError(f"{self.topic}-{self.index}: {offset} is below {start}")
        return log_state.read_budget(self.batches, offset, max_bytes, min_one)

    async def _read_part(
        self, stream_id: int, start: int, end: int, max_bytes: int, origin: ReadOrigin | None = None
    ) -> list[StreamRecordBatch]:
        self._readers[stream_id] += 1
        try:
            return await self.storage.read(stream_id, start, end, max(max_bytes, 1), origin=origin)
        finally:
            self._readers[stream_id] -= 1

    async def read_stored(self, start: int, end: int) -> AsyncIterator[StreamRecordBatch]:
        """The stored stream records from the one holding ``start`` on, up to the one holding
        ``end - 1``, across the cleaned and the live part. The streams must not change while
        this runs (the caller holds :attr:`maintenance`, or nothing else runs yet)."""
        for stream_id, first, stop in self._parts():
            cursor, stop = max(start, first), min(end, stop)
            while cursor < stop:
                found = await self._read_part(stream_id, cursor, stop, SCAN_CHUNK_BYTES)
                if not found:
                    break
                for stream_batch in found:
                    yield stream_batch
                cursor = found[-1].last_offset

    # -------------------------------------------------------------------------------- trim

    async def trim(self, new_start_offset: int) -> None:
        """Move the log start to ``new_start_offset`` (retention, DeleteRecords)."""
        async with self.maintenance:
            if self.cleaned_stream_id is not None:
                await self._trim_stream(self.cleaned_stream_id, new_start_offset)
            if self.cleaned_stream_id is None or new_start_offset > self.cleaned_end:
                await self._trim_stream(self.data_stream_id, new_start_offset)
            cut = bisect.bisect_right(
                [entry.end_offset for entry in self.batches], new_start_offset
            )
            del self.batches[:cut]
            self.transactions.trim(self.log_start_offset)

    async def _trim_stream(self, stream_id: int, new_start_offset: int) -> None:
        if new_start_offset <= self.storage.start_offset(stream_id):
            return
        await self.storage.trim_stream(stream_id, self.epoch, new_start_offset)
        if new_start_offset > self.storage.next_offset(stream_id, self.epoch):
            # Trimmed past its end (a cleaned stream whose last batches went, or a new one that
            # must start at the log start): the controller moved its end there too; opening it
            # again at the same epoch hands this node the new start and end.
            await self.storage.open_stream(stream_id, self.epoch)

    def retention_trim_point(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        """The new log start retention allows (:func:`log_state.retention_trim_point`)."""
        return log_state.retention_trim_point(
            self.batches,
            self.log_start_offset,
            self.high_watermark,
            now_ms,
            retention_ms,
            retention_bytes,
        )

    # -------------------------------------------------------------------------- compaction

    def producer_last_batches(self) -> frozenset[int]:
        """Base offsets of each idempotent producer's last batch (a clean keeps them)."""
        return frozenset(state.batches[-1][2] for state in self.producers.values() if state.batches)

    async def begin_clean(self, start: int) -> int:
        """A new stream for a clean's output, recorded as ``CLEANING`` and starting at
        ``start`` (the log start). Call with :attr:`maintenance` held."""
        stream_id = await self.storage.create_stream()
        await self.storage.open_stream(stream_id, self.epoch)
        self._cleaning_stream_id = stream_id
        await self._put_meta(CLEANING_KEY, encode_cleaning(stream_id))
        await self._trim_stream(stream_id, start)
        return stream_id

    def append_cleaned(self, stream_id: int, payload: bytes, end: int) -> asyncio.Future[None]:
        """Append compacted batches ending at Kafka offset ``end`` to the clean's stream, as one
        record covering the offsets from the stream's end to ``end``; the future completes once
        durable."""
        count = end - self.storage.next_offset(stream_id, self.epoch)
        _, durable = self.storage.append_nowait(stream_id, self.epoch, payload, count)
        return durable

    async def commit_clean(
        self,
        stream_id: int,
        end: int,
        entries: list[BatchEntry],
        aborted: Sequence[AbortedRow] = (),
    ) -> None:
        """Make the clean's stream the log below ``end``: the ``CLEANED`` record is the commit
        point (durable before anything reads the new stream); ``entries`` index its batches,
        ``aborted`` is its aborted-transactions index (it replaces the entries whose marker
        is below ``end``)."""
        replaced = self.cleaned_stream_id
        await self._put_meta(CLEANED_KEY, encode_cleaned(stream_id, end, replaced))
        # No await from here to the end of the switch: a read sees the old parts or the new.
        self.cleaned_stream_id, self.cleaned_end = stream_id, end
        self._cleaning_stream_id = None
        self._retiring = replaced
        self.batches = entries + [entry for entry in self.batches if entry.base_offset >= end]
        self.transactions.cleaned(end, aborted)
        await self.settle()

    async def abandon_clean(self, stream_id: int) -> None:
        """A clean that failed before its commit: its stream goes now (an open would delete it
        too, as the ``CLEANED`` record does not name it)."""
        self._cleaning_stream_id = None
        try:
            await self.storage.close_stream(stream_id, self.epoch)
            await self.storage.delete_stream(stream_id, self.epoch)
        except StorageError as error:
            log.warning(
                "%s-%d: stream %d of a failed clean: %s", self.topic, self.index, stream_id, error
            )

    async def settle(self) -> None:
        """Finish what a committed clean leaves to do: trim the live stream to the cleaned end
        and delete the replaced cleaned stream once no read of it is in flight. Idempotent; run
        after every commit and every open."""
        if self.cleaned_stream_id is not None:
            await self._trim_stream(self.data_stream_id, self.cleaned_end)
        replaced = self._retiring
        if replaced is not None:
            while self._readers[replaced]:
                await asyncio.sleep(0.001)
            await self.storage.close_stream(replaced, self.epoch)
            await self.storage.delete_stream(replaced, self.epoch)
            self._retiring = None
            del self._readers[replaced]


class PartitionExistsError(Exception):
    """Another broker created the partition's streams first (:meth:`Partition.create`)."""


def stored_batches(payload: bytes | memoryview) -> Iterator[RecordBatchView]:
    """The Kafka batches of one stored stream record (CRC not checked again: it was at produce
    time, or the cleaner computed it); compacted batches are accepted."""
    return iter_batches(payload, verify_crc=False, compacted=True)
