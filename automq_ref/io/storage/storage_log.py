"""What a broker's storage logs about its traffic with the object store, as ``key=value`` lines.

What was uploaded is summed over :data:`UPLOAD_LOG_INTERVAL_S` (``uploaded``; nothing when
nothing was) and at shutdown: a summary rather than a line per upload, since under load a block
is uploaded every upload threshold of data (every second or two at 100 MB/s) and idle every
upload interval (a minute by default), so a line per minute says as much without drowning the
rest. Reads from objects (consumers catching up) are summed every :data:`READ_LOG_INTERVAL_S` in
which there were any (``read objects``: GETs, the bytes they fetched, the block cache's peak
size), so that what a catch-up costs the store and the cache can be read off the log.
"""

from __future__ import annotations

import asyncio
import logging

from automq_ref.io.clock import Clock
from automq_ref.io.logfmt import fields
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.io.storage.storage_totals import UploadTotals

log = logging.getLogger(__name__)

UPLOAD_LOG_INTERVAL_S = 60.0
READ_LOG_INTERVAL_S = 5.0


async def log_storage_forever(storage: S3Storage, clock: Clock) -> None:
    """The ``uploaded`` line every :data:`UPLOAD_LOG_INTERVAL_S`; the ``read objects`` line every
    :data:`READ_LOG_INTERVAL_S` with reads: GETs, bytes, the block cache's peak (sampled 1/s)."""
    uploads_s = reads_s = clock.monotonic_s()
    cache_peak = 0
    while True:
        await asyncio.sleep(min(1.0, UPLOAD_LOG_INTERVAL_S, READ_LOG_INTERVAL_S))
        now_s = clock.monotonic_s()
        cache_peak = max(cache_peak, storage.block_cache_stats().peak_bytes)
        if now_s - reads_s >= READ_LOG_INTERVAL_S:
            gets, get_bytes = storage.reads.take()
            if gets:
                log.info(
                    "read objects %s",
                    fields(
                        seconds=round(now_s - reads_s),
                        gets=gets,
                        bytes=get_bytes,
                        cache_peak_bytes=cache_peak,
                    ),
                )
            cache_peak = 0
            reads_s = now_s
        if now_s - uploads_s >= UPLOAD_LOG_INTERVAL_S:
            log_uploads(storage.take_upload_totals(), seconds=round(now_s - uploads_s))
            uploads_s = now_s


def log_uploads(totals: UploadTotals, **when: object) -> None:
    """One line for ``totals``, if anything was uploaded; ``when`` says over what."""
    if totals.blocks == 0:
        return
    log.info(
        "uploaded %s",
        fields(
            **when,
            blocks=totals.blocks,
            objects=totals.objects,
            bytes=totals.bytes,
            streams=len(totals.streams),
            slowest_seconds=totals.slowest_s,
        ),
    )
