"""The controller's metadata log: an ordered, durable log of opaque records, plus one snapshot.

This module is the door the shell uses; it re-exports the pieces, each in a module of its own:

- ``metadata_log_contract.py``: the :class:`MetadataLog` interface every implementation keeps
  (compare-and-append, snapshots, ``wait_for``), its errors and values;
- ``metadata_log_format.py``: the on-disk format (directory layout, batch and record frames, the
  snapshot file) and its codec;
- ``file_metadata_log.py``: :class:`FileMetadataLog`, the embedded implementation, and why it is
  crash safe;
- ``metadata_log_reader.py``: :func:`read_log_directory`, a read-only look at a live log.
"""

from __future__ import annotations

from automq_ref.io.metadata.file_metadata_log import FileMetadataLog
from automq_ref.io.metadata.metadata_log_contract import (
    LogEntry,
    LogIndexConflict,
    LogTruncated,
    MetadataLog,
    MetadataLogClosed,
    MetadataLogCorrupt,
    MetadataLogError,
    MetadataLogLocked,
    Snapshot,
)
from automq_ref.io.metadata.metadata_log_format import (
    BATCH_HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    RECORD_HEADER_SIZE,
    SNAPSHOT_FILE_NAME,
    SNAPSHOT_HEADER_SIZE,
    encode_batch,
)
from automq_ref.io.metadata.metadata_log_reader import read_log_directory

__all__ = [
    "BATCH_HEADER_SIZE",
    "MAX_PAYLOAD_BYTES",
    "RECORD_HEADER_SIZE",
    "SNAPSHOT_FILE_NAME",
    "SNAPSHOT_HEADER_SIZE",
    "FileMetadataLog",
    "LogEntry",
    "LogIndexConflict",
    "LogTruncated",
    "MetadataLog",
    "MetadataLogClosed",
    "MetadataLogCorrupt",
    "MetadataLogError",
    "MetadataLogLocked",
    "Snapshot",
    "encode_batch",
    "read_log_directory",
]
