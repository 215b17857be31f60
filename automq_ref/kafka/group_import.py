"""The committed offsets of earlier versions, imported once into ``__consumer_offsets``.

Before groups were spread over brokers, a node kept every group's offsets in one *offsets
stream* of its own: a single node's under :data:`~automq_ref.vocabulary.naming.OFFSETS_STREAM_KEY`,
each broker of a cluster's under :func:`~automq_ref.vocabulary.naming.node_offsets_stream_key`;
its records are JSON (:mod:`automq_ref.formats.group_record`), replayed in order. A data
directory (or a cluster's metadata) from then keeps its offsets: each coordinator partition,
when its shard loads (:mod:`automq_ref.kafka.groups`), imports the offsets of the groups that
hash to it from every such stream it has not imported yet, then records that it has (a KV key
per stream and partition, :func:`~automq_ref.vocabulary.naming.offsets_imported_key`). The
partition that completes a stream (every partition's key present) deletes the stream, its key
and the partitions' keys.

The old stream is read from the object store without opening it (any broker may read a closed
stream's committed objects), so it must be closed: a broker's start closes the streams it left
open (WAL recovery), so a stream is closed once its broker has started this version. A stream
still open (its broker not restarted yet) is imported at the partition's next load. An import
never overwrites an offset the partition holds (a newer commit wins; a repeat adds nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from automq_ref.formats import group_record as gr
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import S3Storage, StorageError
from automq_ref.state_machines import group as gc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import is_offsets_stream_key, offsets_imported_key

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 4 * 1024 * 1024

# Per group, per (topic, partition): a committed offset.
Offsets = dict[str, dict[gc.TopicPartition, gc.OffsetRecord]]


@dataclass(frozen=True, slots=True)
class OldStream:
    """An offsets stream of an earlier version: its KV key and its id."""

    key: str
    stream_id: int


def encode_record(record: gc.DurableRecord) -> bytes:
    """The offsets-stream record of one of the Group machine's durable effects (as earlier
    versions wrote them)."""
    if isinstance(record, gc.PersistOffsets):
        offsets = tuple(
            gr.StoredOffset(
                o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms
            )
            for o in record.offsets
        )
        return gr.encode_group_record(gr.OffsetsCommitted(record.group_id, offsets))
    if isinstance(record, gc.PersistOffsetDeletion):
        raise ValueError("earlier versions' offsets streams hold no OffsetDelete")
    return gr.encode_group_record(gr.GroupsDeleted(record.group_ids))


def decode_record(payload: bytes | memoryview) -> gc.DurableRecord:
    """The Group machine's record for one offsets-stream record (request id -1: replayed)."""
    record = gr.decode_group_record(payload)
    if isinstance(record, gr.OffsetsCommitted):
        offsets = tuple(
            gc.OffsetRecord(
                o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms
            )
            for o in record.offsets
        )
        return gc.PersistOffsets(-1, record.group_id, offsets)
    return gc.PersistGroupDeletion(-1, record.group_ids)


def old_streams(image: sm.StreamMetadataImage) -> list[OldStream]:
    """Every offsets stream of an earlier version the KV still names."""
    return [
        OldStream(key, decode_kv_integer(value, f"offsets stream id under {key}"))
        for key, value in sorted(image.kv.items())
        if is_offsets_stream_key(key)
    ]


def imported(image: sm.StreamMetadataImage, old: OldStream, partition: int) -> bool:
    """Whether coordinator partition ``partition`` has imported ``old``."""
    return offsets_imported_key(old.stream_id, partition) in image.kv


async def read_old_stream(
    storage: S3Storage, image: sm.StreamMetadataImage, stream_id: int
) -> Offsets | None:
    """The offsets stream ``stream_id`` holds, replayed (every group's latest offsets); None
    while the stream is open (not readable yet); empty if it is gone."""
    metadata = image.streams.get(stream_id)
    if metadata is None:
        return {}
    if metadata.state is not sm.StreamState.CLOSED:
        return None
    records: list[gc.DurableRecord] = []
    cursor, end = metadata.start_offset, metadata.end_offset
    while cursor < end:
        found = await storage.read(stream_id, cursor, end, READ_CHUNK_BYTES)
        if not found:
            raise StorageError(f"offsets stream {stream_id}: nothing at {cursor}")
        records.extend(decode_record(bytes(batch.payload)) for batch in found)
        cursor = found[-1].last_offset
    state = gc.recover(records)
    return {
        group_id: {
            tp: gc.OffsetRecord(
                tp[0], tp[1], c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms
            )
            for tp, c in committed.items()
        }
        for group_id, committed in state.offsets.items()
    }


async def mark_imported(
    client: ControllerClient,
    storage: S3Storage,
    view: MetadataView,
    old: OldStream,
    partition: int,
    partitions: int,
) -> None:
    """Record that ``partition`` imported ``old``; once all ``partitions`` have, delete it."""
    response = await client.submit(
        sm.PutKV(offsets_imported_key(old.stream_id, partition), b"", True)
    )
    if not response.ok:
        raise StorageError(f"offsets stream {old.stream_id}: {response.message}")
    await delete_if_imported(client, storage, view, old, partitions)


async def delete_if_imported(
    client: ControllerClient,
    storage: S3Storage,
    view: MetadataView,
    old: OldStream,
    partitions: int,
) -> None:
    """Delete ``old`` if every one of the ``partitions`` imported it."""
    kv = view.image.kv
    if all(offsets_imported_key(old.stream_id, index) in kv for index in range(partitions)):
        await _delete(client, storage, view, old, partitions)


async def _delete(
    client: ControllerClient,
    storage: S3Storage,
    view: MetadataView,
    old: OldStream,
    partitions: int,
) -> None:
    """The stream, then its key, then the partitions' keys: a crash in between leaves a key
    naming a stream that is gone, which imports nothing and is deleted again."""
    metadata = view.image.streams.get(old.stream_id)
    if metadata is not None:
        await storage.delete_stream(old.stream_id, metadata.epoch)
    await client.submit(sm.DeleteKV(old.key, expected=encode_kv_integer(old.stream_id)))
    for index in range(partitions):
        await client.submit(sm.DeleteKV(offsets_imported_key(old.stream_id, index)))
    log.info(
        "old offsets stream imported and deleted %s",
        fields(stream=old.stream_id, key=old.key, partitions=partitions),
    )
