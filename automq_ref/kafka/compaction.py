"""Log compaction over streams: the cleaner loop, and one clean of a partition.

Topics whose ``cleanup.policy`` holds ``compact`` (``compact`` or ``compact,delete``) are
cleaned: every ``log.cleaner.backoff.ms`` while nothing was due (at once again after a round
that cleaned something), each partition of such a topic is asked whether a clean is due, and how
far it may reach (:func:`automq_ref.state_machines.compaction.plan_clean`: Kafka's dirty ratio,
``min.compaction.lag.ms`` and ``max.compaction.lag.ms``). ``compact,delete`` also gets retention
(:mod:`automq_ref.kafka.retention`); plain ``compact`` does not.

The design. A partition's log is its live stream (``LOG``) plus, once cleaned, a *cleaned
stream* holding the compacted log below the *cleaned end* (:mod:`automq_ref.kafka.partition`).
A clean rewrites the whole log from the log start to a new clean end ``E`` into a **new** stream
(streams are append-only, and a later record of a key may remove an earlier one anywhere below
``E``), then switches to it:

1. key index: read ``[log start, E)`` once, across the cleaned and the live part, and note for
   every key its highest offset (``E`` is the end of the last whole stored record at or below the
   planned end, so the live stream is later trimmed at a record boundary);
2. ``begin_clean``: create a stream, record ``CLEANING {stream}`` in the MetaStream, trim the
   new stream to the log start (so its offsets are Kafka offsets);
3. read ``[log start, E)`` again and append each batch as compaction leaves it
   (:func:`~automq_ref.state_machines.compaction.compact_batch`: unchanged, thinned, an empty
   producer batch, or nothing), grouped up to 64 KiB to a stream record whose offset range runs
   from the previous record's end to its last batch's end; wait until all are durable;
4. ``commit_clean``: record ``CLEANED {stream, end: E, replaces: old}``: the commit point. The
   partition then reads below ``E`` from the new stream and from ``E`` on from the live stream;
5. ``settle``: trim the live stream to ``E``, delete the replaced cleaned stream once no read of
   it is in flight.

A crash (or a failure, or a shutdown) at any point leaves a consistent partition: before step 4
is durable, the MetaStream still names the old cleaned stream and end, and the live stream still
holds everything from the old cleaned end (it is trimmed only in step 5), so the log is exactly
the one before the clean; the next open deletes the stream ``CLEANING`` names (and a failure
deletes it at once). After step 4, the new stream holds a durable copy of every surviving record
below ``E``, so the log below ``E`` is the compacted one; step 5 is repeated by the next open
(trim to ``E`` if not done, delete ``replaces`` if it still exists). No acknowledged record is
lost: a clean drops only records that a later record of the same key supersedes, keyless
records, and tombstones past their horizon. The clean runs under the partition's ``maintenance``
lock (retention, DeleteRecords, close and delete wait for it); produce and fetch go on: appends
land above ``E`` in the live stream, and reads see either the old parts or the new ones.

Idempotent producers: a producer's last batch is kept, emptied if all its records went (as
Kafka does), so its last sequence and epoch are found again when the partition is reopened; the
producer state in memory is not touched by a clean. Transactions: a clean stops at the last
stable offset (an open transaction's records are never compacted), drops the records of aborted
transactions (by the partition's aborted-transactions index) and removes transaction markers by
Kafka's rule (:mod:`automq_ref.state_machines.compaction`, "Transaction markers"): a marker
stays while a batch of its transaction does; the clean that finds none left stamps it with a
delete horizon (now + ``delete.retention.ms``) and a clean past that horizon removes it; the
last marker of a producer the partition knows stays. The clean rebuilds the aborted-transactions
index of the range it rewrote (an aborted transaction with no batch left loses its entry), and
the commit puts it in place of the entries below the clean end (:meth:`Partition.commit_clean`),
so the index in memory, and every checkpoint written from it, is what a scan of the cleaned log
rebuilds; a READ_COMMITTED Fetch still never sees aborted data, since none is left where an
entry went.

Topic configs are read per clean: ``cleanup.policy`` through the registry; the compaction
configs (``delete.retention.ms``, ``min.compaction.lag.ms``, ``max.compaction.lag.ms``,
``min.cleanable.dirty.ratio``) from the topic's own settings, else the broker's
``log.cleaner.*`` defaults (Kafka's defaults).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from automq_ref.config import BrokerConfig
from automq_ref.formats.record_batch import RecordBatchView
from automq_ref.formats.topic_record import Topic
from automq_ref.io.clock import Clock
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.kafka.log_state import BatchEntry, index_entry
from automq_ref.kafka.partition import Partition, stored_batches
from automq_ref.kafka.topic_configs import cleanup_policies as parse_cleanup_policies
from automq_ref.kafka.topic_registry import TopicRegistry
from automq_ref.state_machines.compaction import (
    BatchSpan,
    CleanedTransactions,
    CleanerConfig,
    KeyIndex,
    clean_batch,
    plan_clean,
)

log = logging.getLogger(__name__)

# Compacted batches are appended to the clean's stream in records of at most this size (a batch
# larger on its own is a record alone). Fetch hands out whole stored records where Kafka hands
# out whole batches, so this bounds how far the first record of a response may pass a
# consumer's fetch.max.bytes beyond what Kafka would send.
CLEANED_RECORD_BYTES = 64 * 1024


def cleanup_policies(registry: TopicRegistry, topic: Topic) -> frozenset[str]:
    return parse_cleanup_policies(registry.topic_config(topic, "cleanup.policy"))


def is_compacted(registry: TopicRegistry, topic: Topic) -> bool:
    """Whether the topic is compacted (produce then requires a key on every record)."""
    return "compact" in cleanup_policies(registry, topic)


def cleaner_config(topic: Topic, broker: BrokerConfig) -> CleanerConfig:
    """The topic's compaction configs: its own settings, else the broker's defaults."""
    configs = topic.configs
    return CleanerConfig(
        delete_retention_ms=int(
            configs.get("delete.retention.ms", broker.log_cleaner_delete_retention_ms)
        ),
        min_compaction_lag_ms=int(
            configs.get("min.compaction.lag.ms", broker.log_cleaner_min_compaction_lag_ms)
        ),
        max_compaction_lag_ms=int(
            configs.get("max.compaction.lag.ms", broker.log_cleaner_max_compaction_lag_ms)
        ),
        min_cleanable_dirty_ratio=float(
            configs.get("min.cleanable.dirty.ratio", broker.log_cleaner_min_cleanable_ratio)
        ),
    )


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one clean did: the range it rewrote and how many bytes it read and wrote."""

    start: int
    end: int
    bytes_read: int
    bytes_written: int


async def cleaner_forever(registry: TopicRegistry, broker: BrokerConfig, clock: Clock) -> None:
    backoff_s = broker.log_cleaner_backoff_ms / 1000
    while True:
        try:
            cleaned = await clean_round(registry, broker, clock)
        except Exception:
            log.exception("cleaner round failed; the next round retries")
            cleaned = 0
        await asyncio.sleep(0 if cleaned else backoff_s)


async def clean_round(registry: TopicRegistry, broker: BrokerConfig, clock: Clock) -> int:
    """Clean every partition of a compacted topic that is due; return how many were."""
    cleaned = 0
    for key, partition in list(registry.partitions.items()):
        topic = registry.topics.get(key[0])
        if topic is None or registry.partitions.get(key) is not partition:
            continue  # deleted meanwhile
        if not is_compacted(registry, topic):
            continue
        try:
            result = await clean_partition(partition, clock.now_ms(), cleaner_config(topic, broker))
        except StorageError as error:  # closed or deleted meanwhile, or storage trouble
            log.warning("clean of %s-%d failed: %s", partition.topic, partition.index, error)
            continue
        if result is not None:
            cleaned += 1
            log.info(
                "cleaned %s-%d: offsets %d-%d, %d bytes -> %d",
                partition.topic,
                partition.index,
                result.start,
                result.end,
                result.bytes_read,
                result.bytes_written,
            )
    return cleaned


async def clean_partition(
    partition: Partition, now_ms: int, config: CleanerConfig
) -> CleanResult | None:
    """One clean of ``partition`` if one is due (see the module docstring for the steps)."""
    async with partition.maintenance:
        await partition.settle()
        start = partition.log_start_offset
        spans = [
            BatchSpan(entry.base_offset, entry.end_offset, entry.max_timestamp, entry.size_bytes)
            for entry in partition.batches
        ]
        limit = plan_clean(
            spans, start, partition.dirty_start, partition.last_stable_offset, now_ms, config
        )
        if limit is None:
            return None
        keys = KeyIndex()
        end = start
        transactions = CleanedTransactions(partition.transactions.aborted)
        async for stored in partition.read_stored(start, limit):
            if stored.last_offset > limit:
                break
            for view in _live(stored.payload, start):
                keys.add(view, aborted=transactions.is_aborted(view))
            end = stored.last_offset
        if end <= partition.dirty_start:
            return None  # no whole stored record in the dirty part yet
        keep = partition.producer_last_batches()
        last_markers = keys.last_markers(partition.transactions.entries)
        stream_id = await partition.begin_clean(start)
        try:
            entries, read, written = await _write_clean(
                partition,
                stream_id,
                (start, end),
                keys,
                transactions,
                (keep, last_markers),
                now_ms,
                config,
            )
        except Exception:
            await partition.abandon_clean(stream_id)
            raise
        await partition.commit_clean(stream_id, end, entries, transactions.aborted)
        return CleanResult(start, end, read, written)


async def _write_clean(
    partition: Partition,
    stream_id: int,
    bounds: tuple[int, int],
    keys: KeyIndex,
    transactions: CleanedTransactions,
    kept: tuple[frozenset[int], frozenset[int]],
    now_ms: int,
    config: CleanerConfig,
) -> tuple[list[BatchEntry], int, int]:
    """Steps 3 of the module docstring: the compacted batches of ``bounds`` (start, end)
    appended to the clean's stream and durable; ``transactions`` learns the aborted index of
    the range meanwhile; ``kept``: the base offsets of the producers' last data batches and of
    their last markers. Returns the index entries and the bytes read and written."""
    start, end = bounds
    keep, last_markers = kept
    latest = keys.latest()
    entries: list[BatchEntry] = []
    durable: list[asyncio.Future[None]] = []
    group: list[bytes] = []
    group_bytes = group_end = read = written = 0
    async for stored in partition.read_stored(start, end):
        read += len(stored.payload)
        for view in _live(stored.payload, start):
            out = clean_batch(
                view,
                latest,
                transactions,
                now_ms=now_ms,
                delete_retention_ms=config.delete_retention_ms,
                producer_last_batches=keep,
                last_markers=last_markers,
            )
            if out is None:
                continue
            if group and group_bytes + len(out) > CLEANED_RECORD_BYTES:
                durable.append(partition.append_cleaned(stream_id, b"".join(group), group_end))
                written += group_bytes
                group, group_bytes = [], 0
            entry = index_entry(RecordBatchView.parse(out, verify_crc=False, compacted=True))
            entries.append(entry)
            group.append(out)
            group_bytes += len(out)
            group_end = entry.end_offset
    if group:
        durable.append(partition.append_cleaned(stream_id, b"".join(group), group_end))
        written += group_bytes
    await asyncio.gather(*durable)
    return entries, read, written


def _live(payload: bytes | memoryview, start: int) -> list[RecordBatchView]:
    """The batches of a stored record that reach the log start (a record read from the start
    of the live stream may begin below it, after DeleteRecords)."""
    return [view for view in stored_batches(payload) if view.next_offset > start]
