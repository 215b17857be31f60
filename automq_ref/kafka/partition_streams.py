"""Two stream steps of a partition's open and create (:mod:`automq_ref.kafka.partition`): reading
every record of its MetaStream, and closing the streams a failed open or create opened."""

from __future__ import annotations

import logging

from automq_ref.io.storage.s3stream import S3Storage

log = logging.getLogger(__name__)

# What one read of a partition's streams asks for when it scans them (the MetaStream at open,
# the log's batch headers when the index is rebuilt).
SCAN_CHUNK_BYTES = 4 * 1024 * 1024


async def close_opened(storage: S3Storage, stream_ids: list[int], epoch: int, name: str) -> None:
    """Close the streams a failed open or create opened, newest first; a close that fails is
    logged, and the failure being handled is the one raised."""
    for stream_id in reversed(stream_ids):
        try:
            await storage.close_stream(stream_id, epoch)
        except Exception as error:
            log.warning("%s: stream %d not closed after a failed open: %s", name, stream_id, error)


async def read_meta(storage: S3Storage, stream_id: int) -> list[bytes | memoryview]:
    """Every record of the MetaStream, in order."""
    payloads: list[bytes | memoryview] = []
    cursor = storage.start_offset(stream_id)
    end = storage.confirm_offset(stream_id)
    while cursor < end:
        found = await storage.read(stream_id, cursor, end, SCAN_CHUNK_BYTES)
        if not found:
            break
        payloads.extend(batch.payload for batch in found)
        cursor = found[-1].last_offset
    return payloads
