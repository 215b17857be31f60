"""The embedded metadata log: :class:`FileMetadataLog`, one directory written by one process.

The contract it keeps is ``metadata_log_contract.py``'s, its files are laid out as
``metadata_log_format.py`` describes.

Crash safety
------------
*Appends.* A batch is written with one ``pwrite`` at the end of the segment and made durable
with ``fdatasync`` before the append returns; the next batch is written only after that. So
a crash can damage only the bytes after the last acknowledged batch: the batch in flight, which
may reach the disk as any subset of its pages (a prefix, or with holes), or not at all. A batch
counts only if its header checks, every one of its ``record_count`` frames checks (magic,
header CRC, payload CRC) and carries the expected index, and the frames fill ``body_length``
exactly; so half a batch is never taken for a whole one, and the batch is atomic.

*Recovery* walks the segment batch after batch. At the first batch that does not check it
decides between a torn tail and damage in the middle: if a complete, valid batch with a higher
first index lies anywhere after it (found by searching for the batch magic), then acknowledged
data follows the damage, and open raises :class:`MetadataLogCorrupt` with the file and offset
rather than drop it. Otherwise the damaged bytes are the tail a crash tore: the file is
truncated there and synced, so that later appends never land behind garbage. A batch that checks
but has the wrong first index (a gap or a duplicate) cannot come from a torn write and is always
:class:`MetadataLogCorrupt`.

One choice follows from this, by design: a byte flipped inside the *last* batch is
indistinguishable from a crash that tore that batch, and the batch is dropped as torn. Its
append was acknowledged, so this loses one acknowledged batch to media corruption; the log
cannot tell, without a second copy, and losing it beats refusing every crash recovery. The
search for a later batch fails safe: should a payload happen to contain a complete valid batch
with a higher index, open refuses the log instead of truncating it.

*Snapshots.* ``install_snapshot(S, payload)`` performs, in order:

1. write ``snapshot.tmp``, fsync it, rename it to ``snapshot``, fsync the directory;
2. write ``segment-S.log.tmp`` holding the records ``>= S`` (the batch that contains ``S`` gets a
   new header starting at ``S``; the later batches are copied byte for byte), fsync it, rename
   it to ``segment-S.log``, fsync the directory;
3. delete the old segment, fsync the directory.

A crash before the first rename leaves the old state (open deletes the temp file). After it,
the snapshot covers ``S``, and open rolls the rest forward: it keeps the newest segment (a
segment is renamed into place only once complete, so the newest is whole), deletes older ones,
and if that segment still starts below ``S`` it repeats step 2 from it. Every acknowledged
record ``>= S`` is in the old segment until the new one is durable, so in every case open
recovers either the old snapshot with all records, or the new snapshot with all records from
``S`` on. A segment whose base is above the snapshot index, a snapshot without a segment,
and a snapshot file that does not check are :class:`MetadataLogCorrupt`.

``close`` writes nothing: every acknowledged byte is already durable, so a close and a crash
leave the same files (tests rely on this to simulate crashes).

Concurrency: every file operation runs on one I/O thread (a single-thread executor), in the
order the calls were made; it owns the segment, the index of record offsets and the published
``next_index`` / ``first_index``, which the event loop only reads. Memory holds one file offset
per record and one first index per batch, never the payloads.
"""

from __future__ import annotations

import array
import asyncio
import bisect
import contextlib
import enum
import fcntl
import logging
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar

from crc32c import crc32c

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
    COPY_CHUNK_BYTES,
    LOCK_FILE_NAME,
    MAX_PAYLOAD_BYTES,
    RECORD_HEADER_SIZE,
    SEGMENT_NAME,
    SNAPSHOT_FILE_NAME,
    SNAPSHOT_HEADER_SIZE,
    TEMP_SUFFIX,
    FrameInconsistent,
    FrameInvalid,
    decode_batch,
    decode_record_header,
    encode_batch,
    encode_batch_header,
    encode_snapshot_header,
    find_later_batch,
    read_exactly,
    read_snapshot_file,
    segment_name,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")


# --------------------------------------------------------------- file operations
#
# The durability steps go through these module functions so that tests can make one of them
# fail, which is how a crash between two steps is simulated.

_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _fsync_file(fd: int) -> None:
    """Make the file's data and size durable (fdatasync where the platform has it)."""
    _fdatasync(fd)


def _fsync_directory(path: Path) -> None:
    """Make renames, creations and deletions inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_file(source: Path, destination: Path) -> None:
    os.replace(source, destination)


def _remove_file(path: Path) -> None:
    os.unlink(path)


def _write_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _copy_range(source_fd: int, start: int, end: int, destination_fd: int, position: int) -> None:
    while start < end:
        chunk = os.pread(source_fd, min(COPY_CHUNK_BYTES, end - start), start)
        if not chunk:
            raise OSError(f"segment ended at {start} while copying up to {end}")
        _write_all(destination_fd, chunk, position)
        start += len(chunk)
        position += len(chunk)


def _take_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise MetadataLogLocked(path.parent, f"pid {holder}") from error
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _write_snapshot_file(directory: Path, index: int, payload: bytes) -> None:
    temp_path = directory / (SNAPSHOT_FILE_NAME + TEMP_SUFFIX)
    fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, encode_snapshot_header(index, payload), 0)
        _write_all(fd, payload, SNAPSHOT_HEADER_SIZE)
        _fsync_file(fd)
    finally:
        os.close(fd)
    _replace_file(temp_path, directory / SNAPSHOT_FILE_NAME)
    _fsync_directory(directory)


# ------------------------------------------------------------------ the file log


@dataclass(slots=True)
class _Segment:
    """The open segment: owned by the I/O thread."""

    path: Path
    fd: int
    base_index: int
    record_offsets: array.array[int]  # file offset of the frame of record base_index + i
    batch_first_indexes: array.array[int]
    end_offset: int  # the file holds acknowledged batches up to here

    @property
    def next_index(self) -> int:
        return self.base_index + len(self.record_offsets)


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class FileMetadataLog(MetadataLog):
    """The embedded metadata log in one directory. Open with :meth:`open` or ``async with``."""

    def __init__(self, directory: Path | str) -> None:
        self._directory = Path(directory)
        self._state = _State.NEW
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock_fd: int | None = None
        self._segment: _Segment | None = None
        self._snapshot_index: int | None = None
        # Written by the I/O thread once durable, read by the event loop.
        self._next_index = 0
        self._first_index = 0
        self._failure: BaseException | None = None
        self._appended = asyncio.Event()

    @classmethod
    async def open(cls, directory: Path | str) -> FileMetadataLog:
        """Lock the directory, recover the log in it (creating it if needed) and return it."""
        metadata_log = cls(directory)
        await metadata_log._open()
        return metadata_log

    async def __aenter__(self) -> Self:
        if self._state is _State.NEW:
            await self._open()
        return self

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def next_index(self) -> int:
        return self._next_index

    @property
    def first_index(self) -> int:
        return self._first_index

    # ---------------------------------------------------------------- operations

    async def append(self, records: Sequence[bytes], *, expected_next_index: int) -> int:
        for payload in records:
            if len(payload) > MAX_PAYLOAD_BYTES:
                raise ValueError(f"record of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
        return await self._run(self._append_sync, list(records), expected_next_index)

    async def read(self, from_index: int, max_records: int | None = None) -> list[LogEntry]:
        if from_index < 0:
            raise ValueError(f"negative index {from_index}")
        if max_records is not None and max_records < 0:
            raise ValueError(f"negative max_records {max_records}")
        return await self._run(self._read_sync, from_index, max_records)

    async def snapshot(self) -> Snapshot | None:
        return await self._run(self._read_snapshot_sync)

    async def install_snapshot(self, index: int, payload: bytes) -> None:
        await self._run(self._install_snapshot_sync, index, bytes(payload))

    async def wait_for(self, index: int) -> int:
        while self._next_index <= index:
            if self._state is not _State.OPEN:
                raise MetadataLogClosed(f"metadata log {self._directory} is {self._state.value}")
            await self._appended.wait()
        return self._next_index

    async def close(self) -> None:
        """Release the files and the lock; queued operations finish first. Writes nothing."""
        if self._state is _State.CLOSED:
            return
        was_open = self._state is _State.OPEN
        self._state = _State.CLOSED
        self._notify_appended()
        if not was_open or self._executor is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._close_files_sync)
        except OSError as error:
            raise MetadataLogError(f"closing metadata log {self._directory}: {error}") from error
        finally:
            self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ plumbing

    async def _open(self) -> None:
        if self._state is not _State.NEW:
            raise MetadataLogError(f"metadata log {self._directory} was already opened")
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata-log")
        try:
            await self._loop.run_in_executor(self._executor, self._open_sync)
        except BaseException as error:
            self._state = _State.CLOSED
            self._executor.shutdown(wait=True)
            # Cancelled while the I/O thread went on to open everything: release it all.
            self._close_files_sync()
            if isinstance(error, OSError):
                raise MetadataLogError(
                    f"opening metadata log {self._directory}: {error}"
                ) from error
            raise
        self._state = _State.OPEN

    async def _run(self, function: Callable[..., _T], *args: object) -> _T:
        if self._state is not _State.OPEN or self._executor is None:
            raise MetadataLogClosed(f"metadata log {self._directory} is {self._state.value}")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, function, *args)
        except OSError as error:
            raise MetadataLogError(f"metadata log {self._directory}: {error}") from error

    def _notify_appended(self) -> None:
        """Wake every ``wait_for``; runs on the event loop."""
        appended, self._appended = self._appended, asyncio.Event()
        appended.set()

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise MetadataLogError(
                f"metadata log {self._directory} failed earlier ({self._failure}); "
                "reopen it to write again"
            ) from self._failure

    # ------------------------------------------------- I/O thread: open and recover

    def _open_sync(self) -> None:
        if not self._directory.is_dir():
            self._directory.mkdir(parents=True, exist_ok=True)
            _fsync_directory(self._directory.parent)
        self._lock_fd = _take_lock(self._directory / LOCK_FILE_NAME)
        try:
            self._recover_sync()
        except BaseException:
            self._close_files_sync()
            raise

    def _recover_sync(self) -> None:
        directory = self._directory
        names = sorted(os.listdir(directory))
        changed = False
        for name in names:
            if name.endswith(TEMP_SUFFIX):
                _remove_file(directory / name)
                changed = True
        snapshot_path = directory / SNAPSHOT_FILE_NAME
        if SNAPSHOT_FILE_NAME in names:
            self._snapshot_index, _ = read_snapshot_file(snapshot_path, keep_payload=False)
        first_index = self._snapshot_index or 0
        segments = [
            (int(match.group(1)), directory / name)
            for name in names
            if (match := SEGMENT_NAME.fullmatch(name))
        ]
        if not segments:
            if self._snapshot_index is not None:
                raise MetadataLogCorrupt(directory, None, "a snapshot but no segment file")
            path = directory / segment_name(0)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.close(fd)
            segments = [(0, path)]
            changed = True
        base_index, path = max(segments)
        if base_index > first_index:
            raise MetadataLogCorrupt(
                path,
                None,
                f"segment starts at {base_index}, above the snapshot index "
                f"{first_index}: the records between are missing",
            )
        for _, older_path in segments:
            if older_path != path:
                # A complete newer segment was renamed into place before this one's deletion.
                _remove_file(older_path)
                changed = True
        if changed:
            _fsync_directory(directory)
        self._segment = self._scan_segment(path, base_index)
        self._next_index = self._segment.next_index
        if base_index < first_index:
            log.info("metadata log %s: finishing a snapshot install at %d", path, first_index)
            self._compact_sync(first_index)
        self._first_index = first_index

    def _scan_segment(self, path: Path, base_index: int) -> _Segment:
        """Check every batch; cut a torn tail; refuse damage followed by valid batches."""
        fd = os.open(path, os.O_RDWR)
        try:
            segment = _Segment(path, fd, base_index, array.array("q"), array.array("q"), 0)
            size = os.fstat(fd).st_size
            if size == 0:
                return segment
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
                torn_reason = self._scan_batches(segment, data, size)
            if torn_reason is not None:
                log.warning(
                    "metadata log %s: dropping a torn tail of %d bytes at offset %d (%s)",
                    path,
                    size - segment.end_offset,
                    segment.end_offset,
                    torn_reason,
                )
                os.ftruncate(fd, segment.end_offset)
                _fsync_file(fd)
            return segment
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _scan_batches(segment: _Segment, data: mmap.mmap, size: int) -> str | None:
        """Fill ``segment`` from the batches in ``data``; the reason the tail is torn, if it is."""
        position = 0
        while position < size:
            next_index = segment.next_index
            try:
                batch = decode_batch(data, position, size)
            except FrameInconsistent as error:
                raise MetadataLogCorrupt(segment.path, position, str(error)) from None
            except FrameInvalid as error:
                later = find_later_batch(data, position, next_index, size)
                if later is not None:
                    raise MetadataLogCorrupt(
                        segment.path,
                        position,
                        f"{error}, yet a valid batch follows at offset {later}",
                    ) from None
                return str(error)
            if batch.first_index != next_index:
                kind = "gap" if batch.first_index > next_index else "duplicate"
                raise MetadataLogCorrupt(
                    segment.path,
                    position,
                    f"{kind}: batch starts at index {batch.first_index}, expected {next_index}",
                )
            segment.batch_first_indexes.append(batch.first_index)
            segment.record_offsets.extend(batch.record_offsets)
            segment.end_offset = position = batch.end_offset
        return None

    # ------------------------------------------------------ I/O thread: operations

    def _append_sync(self, payloads: list[bytes], expected_next_index: int) -> int:
        self._check_writable()
        segment = self._segment
        assert segment is not None
        if expected_next_index != segment.next_index:
            raise LogIndexConflict(expected_next_index, segment.next_index)
        if not payloads:
            return segment.next_index
        data = encode_batch(expected_next_index, payloads)
        position = segment.end_offset
        try:
            _write_all(segment.fd, data, position)
            _fsync_file(segment.fd)
        except BaseException as error:
            self._failure = error
            raise
        cursor = position + BATCH_HEADER_SIZE
        for payload in payloads:
            segment.record_offsets.append(cursor)
            cursor += RECORD_HEADER_SIZE + len(payload)
        segment.batch_first_indexes.append(expected_next_index)
        segment.end_offset = position + len(data)
        self._next_index = segment.next_index
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._notify_appended)
        return self._next_index

    def _read_sync(self, from_index: int, max_records: int | None) -> list[LogEntry]:
        segment = self._segment
        assert segment is not None
        if from_index < self._first_index:
            raise LogTruncated(from_index, self._first_index)
        next_index = self._next_index
        stop_index = (
            next_index if max_records is None else min(next_index, from_index + max_records)
        )
        if from_index >= stop_index:
            return []
        offsets = segment.record_offsets
        base_index = segment.base_index
        start = offsets[from_index - base_index]
        end = offsets[stop_index - base_index] if stop_index < next_index else segment.end_offset
        data = read_exactly(segment.fd, end - start, start)
        entries: list[LogEntry] = []
        for index in range(from_index, stop_index):
            position = offsets[index - base_index] - start
            try:
                record = decode_record_header(data, position)
            except (FrameInvalid, FrameInconsistent) as error:
                raise MetadataLogCorrupt(segment.path, position + start, str(error)) from None
            payload_start = position + RECORD_HEADER_SIZE
            payload = data[payload_start : payload_start + record.payload_length]
            if record.index != index or int(crc32c(payload)) != record.payload_crc:
                raise MetadataLogCorrupt(
                    segment.path, position + start, f"record {index} changed on disk"
                )
            entries.append(LogEntry(index, payload))
        return entries

    def _read_snapshot_sync(self) -> Snapshot | None:
        if self._snapshot_index is None:
            return None
        index, payload = read_snapshot_file(self._directory / SNAPSHOT_FILE_NAME, keep_payload=True)
        return Snapshot(index, payload)

    def _install_snapshot_sync(self, index: int, payload: bytes) -> None:
        self._check_writable()
        segment = self._segment
        assert segment is not None
        if not self._first_index <= index <= self._next_index:
            raise ValueError(
                f"snapshot index {index} outside [{self._first_index}, {self._next_index}]"
            )
        try:
            _write_snapshot_file(self._directory, index, payload)
            self._snapshot_index = index
            self._first_index = index
            if index > segment.base_index:
                self._compact_sync(index)
        except BaseException as error:
            self._failure = error
            raise

    def _compact_sync(self, index: int) -> None:
        """Replace the segment with one holding only the records ``>= index`` (step 2 and 3)."""
        old = self._segment
        assert old is not None and index > old.base_index
        path = self._directory / segment_name(index)
        temp_path = path.with_name(path.name + TEMP_SUFFIX)
        fd = os.open(temp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            segment = self._write_tail(old, index, path, fd)
            _fsync_file(fd)
            _replace_file(temp_path, path)
        except BaseException:
            os.close(fd)
            raise
        self._segment = segment
        os.close(old.fd)
        _fsync_directory(self._directory)
        _remove_file(old.path)
        _fsync_directory(self._directory)
        self._next_index = segment.next_index

    @staticmethod
    def _write_tail(old: _Segment, index: int, path: Path, fd: int) -> _Segment:
        """Write the records ``>= index`` of ``old`` into ``fd``; describe the result."""
        segment = _Segment(path, fd, index, array.array("q"), array.array("q"), 0)
        if index >= old.next_index:
            return segment
        start = old.record_offsets[index - old.base_index]
        batch = bisect.bisect_right(old.batch_first_indexes, index)
        if batch < len(old.batch_first_indexes):
            split_index = old.batch_first_indexes[batch]
            split_offset = old.record_offsets[split_index - old.base_index] - BATCH_HEADER_SIZE
        else:
            split_index, split_offset = old.next_index, old.end_offset
        # The batch holding ``index`` restarts there under a new header; the rest is copied.
        _write_all(fd, encode_batch_header(index, split_index - index, split_offset - start), 0)
        _copy_range(old.fd, start, old.end_offset, fd, BATCH_HEADER_SIZE)
        shift = start - BATCH_HEADER_SIZE
        segment.record_offsets.extend(
            offset - shift for offset in old.record_offsets[index - old.base_index :]
        )
        segment.batch_first_indexes.append(index)
        segment.batch_first_indexes.extend(old.batch_first_indexes[batch:])
        segment.end_offset = old.end_offset - shift
        return segment

    def _close_files_sync(self) -> None:
        """Close the segment, then the lock file, which releases the flock. Idempotent."""
        segment, self._segment = self._segment, None
        lock_fd, self._lock_fd = self._lock_fd, None
        if segment is not None:
            with contextlib.suppress(OSError):
                os.close(segment.fd)
        if lock_fd is not None:
            os.close(lock_fd)
