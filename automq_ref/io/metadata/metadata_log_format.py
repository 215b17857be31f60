"""The file metadata log's on-disk format: directory layout, batch and record frames, snapshot
file; their encoders and checking decoders.

Directory layout
----------------
::

    LOCK                              flock(LOCK_EX) by the one process that writes; holds its pid
    snapshot                          the newest snapshot (absent until the first one)
    segment-<base index, 20 digits>.log   the records from <base index> on
    *.tmp                             a snapshot or segment being written; deleted on open

Normally exactly one segment exists and its base index is the snapshot index (0 without a
snapshot). Two exist only for a moment inside ``install_snapshot``.

Segment file: a sequence of batches, one per ``append``, nothing else. Big-endian::

    batch header (28 bytes)
      offset size field
           0    4 magic         0x4D4C4231 ("MLB1")
           4    8 first_index   index of the batch's first record (i64)
          12    4 record_count  records in the batch, at least 1 (u32)
          16    8 body_length   bytes of record frames that follow this header (u64)
          24    4 header_crc    CRC-32C of bytes [0, 24)
    then record_count record frames, back to back:
      offset size field
           0    4 magic         0x4D4C5231 ("MLR1")
           4    8 index         the record's index (i64): first_index + position in the batch
          12    4 payload_length (u32, at most MAX_PAYLOAD_BYTES)
          16    4 payload_crc   CRC-32C of the payload
          20    4 header_crc    CRC-32C of bytes [0, 20)
          24    n payload

Snapshot file: one header and the payload. Big-endian::

      offset size field
           0    4 magic         0x4D4C5331 ("MLS1")
           4    8 index         records covered: the next index after the snapshot (i64)
          12    8 payload_length (u64); the file is exactly 28 + payload_length bytes
          20    4 payload_crc   CRC-32C of the payload
          24    4 header_crc    CRC-32C of bytes [0, 24)
          28    n payload

Decoding tells two failures apart. :class:`FrameInvalid`: the bytes do not check (CRC, magic,
too short), which is what a torn write leaves. :class:`FrameInconsistent`: the bytes check but
contradict the log (index, lengths), which no crash explains.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias

from crc32c import crc32c

from automq_ref.io.metadata.metadata_log_contract import MetadataLogCorrupt

BATCH_MAGIC: Final = 0x4D4C4231
RECORD_MAGIC: Final = 0x4D4C5231
SNAPSHOT_MAGIC: Final = 0x4D4C5331
BATCH_HEADER_SIZE: Final = 28
RECORD_HEADER_SIZE: Final = 24
SNAPSHOT_HEADER_SIZE: Final = 28
MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024
COPY_CHUNK_BYTES: Final = 1024 * 1024

LOCK_FILE_NAME: Final = "LOCK"
SNAPSHOT_FILE_NAME: Final = "snapshot"
TEMP_SUFFIX: Final = ".tmp"
SEGMENT_NAME = re.compile(r"segment-(\d{20})\.log")

_BATCH_HEADER = struct.Struct(">IqIQI")
_RECORD_HEADER = struct.Struct(">IqIII")
_SNAPSHOT_HEADER = struct.Struct(">IqQII")
_UINT32 = struct.Struct(">I")
_BATCH_MAGIC_BYTES: Final = _UINT32.pack(BATCH_MAGIC)


def encode_batch(first_index: int, payloads: Sequence[bytes]) -> bytes:
    """The bytes of one batch: header, then one frame per payload (tests and tools use this)."""
    if not payloads:
        raise ValueError("a batch holds at least one record")
    if first_index < 0:
        raise ValueError(f"negative record index {first_index}")
    frames: list[bytes] = []
    for position, payload in enumerate(payloads):
        frames.append(encode_record_header(first_index + position, payload))
        frames.append(bytes(payload))
    body = b"".join(frames)
    return encode_batch_header(first_index, len(payloads), len(body)) + body


def encode_batch_header(first_index: int, record_count: int, body_length: int) -> bytes:
    prefix = _BATCH_HEADER.pack(BATCH_MAGIC, first_index, record_count, body_length, 0)[:-4]
    return prefix + _UINT32.pack(crc32c(prefix))


def encode_record_header(index: int, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    prefix = _RECORD_HEADER.pack(RECORD_MAGIC, index, len(payload), crc32c(payload), 0)[:-4]
    return prefix + _UINT32.pack(crc32c(prefix))


def encode_snapshot_header(index: int, payload: bytes) -> bytes:
    prefix = _SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, index, len(payload), crc32c(payload), 0)[:-4]
    return prefix + _UINT32.pack(crc32c(prefix))


class FrameInvalid(Exception):
    """The bytes do not check (CRC, magic, too short): what a torn write leaves."""


class FrameInconsistent(Exception):
    """The bytes check but contradict the log (index, lengths): no crash explains them."""


@dataclass(frozen=True, slots=True)
class RecordHeader:
    index: int
    payload_length: int
    payload_crc: int


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    first_index: int
    record_offsets: list[int]
    end_offset: int


Readable: TypeAlias = bytes | mmap.mmap


def decode_record_header(data: Readable, position: int) -> RecordHeader:
    raw = data[position : position + RECORD_HEADER_SIZE]
    if len(raw) < RECORD_HEADER_SIZE:
        raise FrameInvalid(f"record header cut short at offset {position}")
    magic, index, payload_length, payload_crc, header_crc = _RECORD_HEADER.unpack(raw)
    if int(crc32c(raw[:20])) != header_crc:
        raise FrameInvalid(f"record header CRC mismatch at offset {position}")
    if magic != RECORD_MAGIC:
        raise FrameInvalid(f"record magic {magic:#010x} at offset {position}")
    if payload_length > MAX_PAYLOAD_BYTES:
        raise FrameInconsistent(f"record length {payload_length} at offset {position}")
    return RecordHeader(index, payload_length, payload_crc)


def decode_batch(data: Readable, position: int, size: int) -> DecodedBatch:
    """Check the whole batch at ``position`` of ``data`` (``size`` bytes long)."""
    raw = data[position : position + BATCH_HEADER_SIZE]
    if len(raw) < BATCH_HEADER_SIZE:
        raise FrameInvalid(f"batch header cut short at offset {position}")
    magic, first_index, record_count, body_length, header_crc = _BATCH_HEADER.unpack(raw)
    if int(crc32c(raw[:24])) != header_crc:
        raise FrameInvalid(f"batch header CRC mismatch at offset {position}")
    if magic != BATCH_MAGIC:
        raise FrameInvalid(f"batch magic {magic:#010x} at offset {position}")
    if record_count < 1 or first_index < 0:
        raise FrameInconsistent(f"batch at offset {position} of {record_count} records")
    cursor = position + BATCH_HEADER_SIZE
    end = cursor + body_length
    if end > size:
        raise FrameInvalid(f"batch at offset {position} runs past the end of the file")
    offsets: list[int] = []
    for index in range(first_index, first_index + record_count):
        if cursor + RECORD_HEADER_SIZE > end:
            raise FrameInconsistent(f"batch at offset {position} shorter than its records")
        record = decode_record_header(data, cursor)
        if record.index != index:
            raise FrameInconsistent(
                f"record at offset {cursor} has index {record.index}, expected {index}"
            )
        payload_end = cursor + RECORD_HEADER_SIZE + record.payload_length
        if payload_end > end:
            raise FrameInconsistent(f"record at offset {cursor} runs past its batch")
        if int(crc32c(data[cursor + RECORD_HEADER_SIZE : payload_end])) != record.payload_crc:
            raise FrameInvalid(f"record payload CRC mismatch at offset {cursor}")
        offsets.append(cursor)
        cursor = payload_end
    if cursor != end:
        raise FrameInconsistent(f"batch at offset {position} longer than its records")
    return DecodedBatch(first_index, offsets, end)


def find_later_batch(data: Readable, position: int, after_index: int, size: int) -> int | None:
    """Offset of a complete, valid batch past ``position`` starting above ``after_index``."""
    candidate = data.find(_BATCH_MAGIC_BYTES, position + 1)
    while candidate != -1:
        try:
            batch = decode_batch(data, candidate, size)
        except (FrameInvalid, FrameInconsistent):
            pass
        else:
            if batch.first_index > after_index:
                return candidate
        candidate = data.find(_BATCH_MAGIC_BYTES, candidate + 1)
    return None


# ------------------------------------------------------------------------- files


def segment_name(base_index: int) -> str:
    return f"segment-{base_index:020d}.log"


def read_exactly(fd: int, length: int, position: int) -> bytes:
    chunks: list[bytes] = []
    while length:
        chunk = os.pread(fd, length, position)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        position += len(chunk)
    return b"".join(chunks)


def read_snapshot_file(path: Path, *, keep_payload: bool) -> tuple[int, bytes]:
    """Check the snapshot file; return its index and (if asked) its payload."""
    with path.open("rb") as file:
        raw = file.read(SNAPSHOT_HEADER_SIZE)
        if len(raw) < SNAPSHOT_HEADER_SIZE:
            raise MetadataLogCorrupt(path, 0, "snapshot file shorter than its header")
        magic, index, payload_length, payload_crc, header_crc = _SNAPSHOT_HEADER.unpack(raw)
        if int(crc32c(raw[:24])) != header_crc or magic != SNAPSHOT_MAGIC:
            raise MetadataLogCorrupt(path, 0, "snapshot header does not check")
        size = os.fstat(file.fileno()).st_size
        if index < 0 or size != SNAPSHOT_HEADER_SIZE + payload_length:
            raise MetadataLogCorrupt(
                path, 0, f"snapshot of {payload_length} payload bytes in a {size}-byte file"
            )
        crc = 0
        chunks: list[bytes] = []
        remaining = payload_length
        while remaining:
            chunk = file.read(min(COPY_CHUNK_BYTES, remaining))
            if not chunk:
                raise MetadataLogCorrupt(path, size - remaining, "snapshot payload cut short")
            crc = int(crc32c(chunk, crc))
            if keep_payload:
                chunks.append(chunk)
            remaining -= len(chunk)
        if crc != payload_crc:
            raise MetadataLogCorrupt(path, SNAPSHOT_HEADER_SIZE, "snapshot payload CRC mismatch")
    return index, b"".join(chunks)
