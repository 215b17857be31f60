"""Reading a metadata log directory read-only, for tools that look at a running controller's log.

:func:`read_log_directory` takes no lock and writes, cuts or deletes nothing; it checks what it
reads as :class:`~automq_ref.io.metadata.file_metadata_log.FileMetadataLog` does on open, except
that a bad batch at the end is taken for an append in flight and ends the read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from automq_ref.io.metadata.metadata_log_contract import (
    LogEntry,
    MetadataLogCorrupt,
    MetadataLogError,
    Snapshot,
)
from automq_ref.io.metadata.metadata_log_format import (
    RECORD_HEADER_SIZE,
    SEGMENT_NAME,
    SNAPSHOT_FILE_NAME,
    FrameInconsistent,
    FrameInvalid,
    decode_batch,
    decode_record_header,
    find_later_batch,
    read_exactly,
    read_snapshot_file,
)

READ_ONLY_ATTEMPTS: Final = 5


class _DirectoryMoved(Exception):
    """A snapshot install moved files between a reader's listing and its reads: try again."""


def read_log_directory(directory: Path | str) -> tuple[Snapshot | None, list[LogEntry]]:
    """Read a log directory without writing it: the newest snapshot and every record after it.

    For tools that look at a log another process may be writing (a broker holds the lock): no
    lock is taken, nothing is truncated, deleted or created. The records returned are those of
    the complete batches found when the segment was read; a batch that does not check at the
    end of the segment is taken for an append in flight (or a torn tail the writer will cut on
    its next open) and ends the read. A bad batch followed by a valid one, or a gap or
    duplicate in the indexes, raises :class:`MetadataLogCorrupt` as :meth:`FileMetadataLog.open`
    does. A snapshot install racing with the read (files renamed or deleted between the listing
    and the reads) is retried a few times. A directory without any log file reads as empty.
    """
    path = Path(directory)
    if not path.is_dir():
        raise MetadataLogError(f"no metadata log directory at {path}")
    for _ in range(READ_ONLY_ATTEMPTS):
        try:
            return _read_directory_once(path)
        except (FileNotFoundError, _DirectoryMoved):
            continue
    raise MetadataLogError(f"metadata log {path} kept changing while being read")


def _read_directory_once(directory: Path) -> tuple[Snapshot | None, list[LogEntry]]:
    names = os.listdir(directory)
    segments = [
        (int(match.group(1)), directory / name)
        for name in names
        if (match := SEGMENT_NAME.fullmatch(name))
    ]
    snapshot: Snapshot | None = None
    if SNAPSHOT_FILE_NAME in names:
        index, payload = read_snapshot_file(directory / SNAPSHOT_FILE_NAME, keep_payload=True)
        snapshot = Snapshot(index, payload)
    first_index = 0 if snapshot is None else snapshot.index
    # The newest segment starting at or below the snapshot holds every record from it on.
    usable = [(base, path) for base, path in segments if base <= first_index]
    if not usable:
        if not segments and snapshot is None:
            return None, []
        raise _DirectoryMoved
    base_index, path = max(usable)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = read_exactly(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    entries: list[LogEntry] = []
    position, next_index, size = 0, base_index, len(data)
    while position < size:
        try:
            batch = decode_batch(data, position, size)
        except FrameInconsistent as error:
            raise MetadataLogCorrupt(path, position, str(error)) from None
        except FrameInvalid as error:
            if find_later_batch(data, position, next_index, size) is not None:
                raise MetadataLogCorrupt(
                    path, position, f"{error}, yet a valid batch follows"
                ) from None
            break
        if batch.first_index != next_index:
            raise MetadataLogCorrupt(
                path, position, f"batch starts at index {batch.first_index}, expected {next_index}"
            )
        for index, offset in enumerate(batch.record_offsets, batch.first_index):
            if index >= first_index:
                record = decode_record_header(data, offset)
                start = offset + RECORD_HEADER_SIZE
                entries.append(LogEntry(index, data[start : start + record.payload_length]))
        next_index = batch.first_index + len(batch.record_offsets)
        position = batch.end_offset
    if next_index < first_index:
        raise MetadataLogCorrupt(
            path, None, f"records end at {next_index}, below the snapshot index {first_index}"
        )
    return snapshot, entries
