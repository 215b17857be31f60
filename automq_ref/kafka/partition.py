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

On open the partition also scans its data stream once (batch headers only) to rebuild what Kafka
keeps beside its segments: the producer state of idempotent producers (last five batches per
producer id) and a batch index (base offset, end offset, max timestamp, size) used by ListOffsets
by timestamp and by retention. That scan reads the whole retained log: fine for a reference
broker, and the place where producer-state snapshots would go.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import uuid
from dataclasses import dataclass, field

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.formats.meta_stream import PartitionMeta, encode_leader_epochs, encode_log, replay
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import partition_key

log = logging.getLogger(__name__)

PRODUCER_BATCHES_RETAINED = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchEntry:
    base_offset: int
    end_offset: int  # exclusive
    max_timestamp: int
    size_bytes: int


@dataclass(slots=True)
class ProducerState:
    epoch: int
    # (first sequence, last sequence, base offset) of the last few batches, oldest first.
    batches: collections.deque[tuple[int, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=PRODUCER_BATCHES_RETAINED)
    )

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1] if self.batches else -1


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error: KafkaErrorCode
    base_offset: int = -1
    durable: asyncio.Future[None] | None = None
    message: str | None = None


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
        self.leader_epochs: list[tuple[int, int]] = []
        self._appended = asyncio.Event()

    # ------------------------------------------------------------------------ lifecycle

    @classmethod
    async def create(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        topic: str,
        topic_id: uuid.UUID,
        index: int,
    ) -> Partition:
        """New streams at epoch 0; the KV entry is written last, so a crash before it leaves
        only unreferenced streams (no half-created partition is ever found)."""
        meta_stream_id = await storage.create_stream()
        data_stream_id = await storage.create_stream()
        await storage.open_stream(meta_stream_id, 0)
        await storage.open_stream(data_stream_id, 0)
        partition = cls(storage, client, topic, topic_id, index, meta_stream_id, data_stream_id, 0)
        await partition._put_meta(encode_log(data_stream_id))
        partition.leader_epochs.append((0, 0))
        await partition._put_meta(encode_leader_epochs(partition.leader_epochs))
        response = await client.submit(
            sm.PutKV(partition_key(topic_id, index), encode_kv_integer(meta_stream_id), False)
        )
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
    ) -> Partition:
        """Open both streams one epoch above their current one and rebuild the state."""
        image = view.image
        raw = image.kv.get(partition_key(topic_id, index))
        if raw is None:
            raise LookupError(f"partition {topic}-{index} has no MetaStream")
        meta_stream_id = decode_kv_integer(raw, f"partition {topic}-{index} MetaStream id")
        meta = image.streams.get(meta_stream_id)
        if meta is None:
            raise LookupError(f"partition {topic}-{index}: MetaStream {meta_stream_id} is gone")
        epoch = max(meta.epoch, 0) + 1
        await storage.open_stream(meta_stream_id, epoch)
        recorded = await _read_meta(storage, meta_stream_id)
        data_stream_id = recorded.data_stream_id
        if data_stream_id is None:
            raise LookupError(f"partition {topic}-{index}: MetaStream {meta_stream_id} has no LOG")
        await storage.open_stream(data_stream_id, epoch)
        partition = cls(
            storage, client, topic, topic_id, index, meta_stream_id, data_stream_id, epoch
        )
        partition.leader_epochs = list(recorded.leader_epochs)
        start_of_epoch = storage.next_offset(data_stream_id, epoch)
        partition.leader_epochs.append((epoch, start_of_epoch))
        await partition._put_meta(encode_leader_epochs(partition.leader_epochs))
        await partition._scan()
        return partition

    async def close(self) -> None:
        for stream_id in (self.data_stream_id, self.meta_stream_id):
            await self.storage.close_stream(stream_id, self.epoch)

    async def delete(self) -> None:
        """Close and delete both streams and forget the KV entry."""
        await self.close()
        for stream_id in (self.data_stream_id, self.meta_stream_id):
            await self.storage.delete_stream(stream_id, self.epoch)
        await self._client.submit(sm.DeleteKV(partition_key(self.topic_id, self.index)))

    async def _put_meta(self, record: bytes) -> None:
        await self.storage.append(self.meta_stream_id, self.epoch, record, 1)

    async def _scan(self) -> None:
        """Rebuild the batch index and producer state from the retained log."""
        cursor = self.log_start_offset
        end = self.high_watermark
        while cursor < end:
            found = await self.storage.read(self.data_stream_id, cursor, end, SCAN_CHUNK_BYTES)
            if not found:
                break
            for stream_batch in found:
                self._index_payload(stream_batch.payload)
            cursor = found[-1].last_offset

    def _index_payload(self, payload: bytes | memoryview) -> None:
        for view in iter_batches(payload, verify_crc=False):
            header = view.header()
            end = header.base_offset + header.last_offset_delta + 1
            self.batches.append(
                BatchEntry(header.base_offset, end, header.max_timestamp, view.size_bytes)
            )
            if header.producer_id >= 0 and not view.is_control:
                self._remember_producer(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.base_sequence + header.last_offset_delta,
                    header.base_offset,
                )

    # ---------------------------------------------------------------------------- offsets

    @property
    def high_watermark(self) -> int:
        return self.storage.confirm_offset(self.data_stream_id)

    @property
    def log_start_offset(self) -> int:
        return self.storage.start_offset(self.data_stream_id)

    @property
    def log_end_offset(self) -> int:
        return self.storage.next_offset(self.data_stream_id, self.epoch)

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers: the largest epoch <= the one
        asked, and the start offset of the epoch after it (or the log end)."""
        chosen: tuple[int, int] | None = None
        for position, (epoch, _) in enumerate(self.leader_epochs):
            if epoch <= leader_epoch:
                chosen = (epoch, position)
        if chosen is None:
            return -1, -1
        epoch, position = chosen
        if position + 1 < len(self.leader_epochs):
            return epoch, self.leader_epochs[position + 1][1]
        return epoch, self.log_end_offset

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch whose max timestamp reaches ``timestamp``:
        the broker then finds the record inside it."""
        start = self.log_start_offset
        for entry in self.batches:
            if entry.end_offset > start and entry.max_timestamp >= timestamp:
                return max(entry.base_offset, start), entry.max_timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        start = self.log_start_offset
        best: BatchEntry | None = None
        for entry in self.batches:
            if entry.end_offset > start and (
                best is None or entry.max_timestamp > best.max_timestamp
            ):
                best = entry
        if best is None:
            return None
        return best.end_offset - 1, best.max_timestamp

    # ----------------------------------------------------------------------------- produce

    def append_nowait(
        self, records: bytes | memoryview | None, max_batch_bytes: int
    ) -> ProduceResult:
        """Validate, assign offsets and queue the WAL write; nothing here awaits, so calls run
        in arrival order. The result's ``durable`` completes when the data is acknowledged.

        A writable ``memoryview`` (a slice of a request frame) gets the offsets and leader epoch
        written into it in place; the storage is handed a copy (``bytes``) either way."""
        if not records:
            return ProduceResult(KafkaErrorCode.INVALID_RECORD, message="no record batch")
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
            if view.is_transactional:
                return ProduceResult(
                    KafkaErrorCode.INVALID_TXN_STATE, message="transactions are not supported"
                )
        checked = self._check_sequences(views)
        if checked is not None:
            return checked
        base = self.log_end_offset
        offset = base
        for view in views:
            view.set_base_offset(offset)
            view.set_partition_leader_epoch(self.epoch)
            offset += view.last_offset_delta + 1
        first, durable = self.storage.append_nowait(
            self.data_stream_id, self.epoch, bytes(data), offset - base
        )
        assert first == base, (first, base)
        for view in views:
            header = view.header()
            self.batches.append(
                BatchEntry(
                    header.base_offset,
                    header.base_offset + header.last_offset_delta + 1,
                    header.max_timestamp,
                    view.size_bytes,
                )
            )
            if header.producer_id >= 0:
                self._remember_producer(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.base_sequence + header.last_offset_delta,
                    header.base_offset,
                )
        durable.add_done_callback(lambda _: self._wake())
        return ProduceResult(KafkaErrorCode.NONE, base, durable)

    def _check_sequences(self, views: list[RecordBatchView]) -> ProduceResult | None:
        """Kafka's idempotence rules (ProducerAppendInfo): a duplicate of one of the last five
        batches is answered with its original offset and not appended again."""
        for position, view in enumerate(views):
            header = view.header()
            if header.producer_id < 0:
                continue
            first = header.base_sequence
            last = first + header.last_offset_delta
            state = self.producers.get(header.producer_id)
            if state is None:
                continue  # unknown producer (new, or its state expired): any sequence
            if header.producer_epoch < state.epoch:
                return ProduceResult(
                    KafkaErrorCode.INVALID_PRODUCER_EPOCH,
                    message=f"epoch {header.producer_epoch} < {state.epoch}",
                )
            if header.producer_epoch > state.epoch:
                if first != 0:
                    return ProduceResult(
                        KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        message=f"new epoch {header.producer_epoch} starts at sequence {first}",
                    )
                continue
            for old_first, old_last, old_base in state.batches:
                if (old_first, old_last) == (first, last):
                    if position == 0 and len(views) == 1:
                        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        done.set_result(None)
                        return ProduceResult(KafkaErrorCode.NONE, old_base, done)
                    return ProduceResult(
                        KafkaErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                        message="a duplicate batch among others",
                    )
            expected = state.last_sequence + 1
            wrapped = first == 0 and state.last_sequence == INT32_MAX
            if first != expected and not wrapped:
                return ProduceResult(
                    KafkaErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    message=f"sequence {first}, expected {expected}",
                )
        return None

    def _remember_producer(
        self, producer_id: int, epoch: int, first: int, last: int, base_offset: int
    ) -> None:
        state = self.producers.get(producer_id)
        if state is None or epoch > state.epoch:
            state = self.producers[producer_id] = ProducerState(epoch)
        state.batches.append((first, last, base_offset))

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
        self, offset: int, max_bytes: int, min_one: bool = True
    ) -> list[bytes | memoryview]:
        """Whole stored payloads from the one holding ``offset`` up to the high watermark, no
        more than ``max_bytes`` together; with ``min_one`` the first comes even past
        ``max_bytes`` (KIP-74: the first batch of a Fetch response may exceed its limits, so a
        consumer always progresses; no other may)."""
        end = self.high_watermark
        if offset >= end or (max_bytes <= 0 and not min_one):
            return []
        found = await self.storage.read(self.data_stream_id, offset, end, max(max_bytes, 1))
        # Storage stops once the budget is spent, so its last batch may overshoot it.
        payloads: list[bytes | memoryview] = []
        size = 0
        for batch in found:
            size += len(batch.payload)
            if size > max_bytes and (payloads or not min_one):
                break
            payloads.append(batch.payload)
        return payloads

    # -------------------------------------------------------------------------------- trim

    async def trim(self, new_start_offset: int) -> None:
        await self.storage.trim_stream(self.data_stream_id, self.epoch, new_start_offset)
        cut = bisect.bisect_right([entry.end_offset for entry in self.batches], new_start_offset)
        del self.batches[:cut]

    def retention_trim_point(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        """The new log start retention allows (the current start if nothing expires). Only
        whole batches below the high watermark go, and never the last one."""
        start = self.log_start_offset
        live = [entry for entry in self.batches if entry.end_offset > start]
        keep_from = 0
        if retention_ms >= 0:
            while (
                keep_from < len(live) - 1 and live[keep_from].max_timestamp < now_ms - retention_ms
            ):
                keep_from += 1
        if retention_bytes >= 0:
            total = sum(entry.size_bytes for entry in live[keep_from:])
            while keep_from < len(live) - 1 and total > retention_bytes:
                total -= live[keep_from].size_bytes
                keep_from += 1
        if keep_from == 0:
            return start
        return min(live[keep_from].base_offset, self.high_watermark)


async def _read_meta(storage: S3Storage, stream_id: int) -> PartitionMeta:
    payloads: list[bytes | memoryview] = []
    cursor = storage.start_offset(stream_id)
    end = storage.confirm_offset(stream_id)
    while cursor < end:
        found = await storage.read(stream_id, cursor, end, SCAN_CHUNK_BYTES)
        if not found:
            break
        payloads.extend(batch.payload for batch in found)
        cursor = found[-1].last_offset
    return replay(payloads)
