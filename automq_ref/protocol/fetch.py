"""Fetch response encoder (API key 1, versions 4 through 17) that never copies record data.

The broker's hottest response is a Fetch carrying record batches it read from the log cache or
object storage. This encoder takes the batches as a sequence of bytes-like chunks per partition
and returns a list of chunks for ``transport.writelines``: the protocol structure around the
records is packed into a few small ``bytes`` objects (consecutive structure between two record
sections is joined into one chunk), and each record chunk appears in the list as the very object
it was given, so a 1 MiB batch costs one list entry, not a copy.

Output: ``[size prefix + response header + ..., records, structure, records, ...]``. The first
chunk starts with the 4-byte big-endian size of everything after it (the frame length Kafka puts
before every response), so the list is the whole frame. Header v0 (correlation id) for versions
4..11, header v1 (correlation id + empty tagged-field section) for the flexible versions 12+.

Fields by version (Kafka's FetchResponse.json):

* all: ``throttle_time_ms``; per topic a list of partitions; per partition ``partition_index``,
  ``error_code``, ``high_watermark``, ``last_stable_offset``, ``aborted_transactions`` (nullable
  list of producer id + first offset), ``records`` (nullable)
* 5+: ``log_start_offset``; 7+: top-level ``error_code`` and ``session_id``;
  11+: ``preferred_read_replica``
* 12+: flexible (compact strings/arrays/records, tagged fields); topics by ``topic`` name up to
  12, by 16-byte ``topic_id`` from 13. Version 17 changed only the request; its response bytes
  are those of 16.

Tagged fields are always written as an empty section, which is what Kafka sends when they hold
their defaults. Omitted: the partition tags ``diverging_epoch`` (0) and ``snapshot_id`` (2), which
serve follower and KRaft fetchers (KIP-320, KIP-595), and ``current_leader`` (partition tag 1)
with ``node_endpoints`` (top-level tag 0 of v16+), which tell a client the new leader along with
NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH (KIP-951); clients fall back to a Metadata request.

A partition with no data has ``records`` empty (length 0), as Kafka sends
(``MemoryRecords.EMPTY``); ``records=None`` writes a null instead.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from automq_ref.protocol.primitives import (
    Chunk,
    UnsupportedVersionError,
    encode_array_length,
    encode_string,
    encode_uvarint,
)

FETCH_API_KEY: Final = 1
FETCH_MIN_VERSION: Final = 4
FETCH_MAX_VERSION: Final = 17
FETCH_FIRST_FLEXIBLE_VERSION: Final = 12
FETCH_FIRST_TOPIC_ID_VERSION: Final = 13

ZERO_UUID: Final = uuid.UUID(int=0)
_Append = Callable[[bytes], None]
_NO_TAGS: Final = b"\x00"


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


class FetchPartition(Protocol):
    """What the encoder reads from a partition: :class:`FetchPartitionData`, or any object with
    these attributes (a broker may hand in its own read results and skip building dataclasses)."""

    @property
    def partition_index(self) -> int: ...
    @property
    def error_code(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def aborted_transactions(self) -> Sequence[AbortedTransaction] | None: ...
    @property
    def preferred_read_replica(self) -> int: ...
    @property
    def records(self) -> Sequence[Chunk] | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchPartitionData:
    """One partition of a Fetch response; fields a version lacks are ignored at that version."""

    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[AbortedTransaction] | None = None
    """None (null) unless the consumer reads committed; Kafka sends null for read_uncommitted."""
    preferred_read_replica: int = -1
    records: Sequence[Chunk] | None = ()
    """Record batches as chunks of bytes (each passed through, never copied); empty = no data."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchableTopicResponse:
    """One topic: named by ``topic`` up to v12, by ``topic_id`` from v13."""

    partitions: Sequence[FetchPartition]
    topic: str = ""
    topic_id: uuid.UUID = ZERO_UUID


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one version lays a partition out."""

    flexible: bool
    topic_id: bool
    has_session: bool
    has_log_start_offset: bool
    has_preferred_read_replica: bool
    # partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset]
    head: struct.Struct
    # head + null aborted_transactions [+ preferred_read_replica] [+ int32 records length]
    # (the records length is a varint in flexible versions, appended separately)
    head_no_aborted: struct.Struct


def _layout(version: int) -> _Layout:
    flexible = version >= FETCH_FIRST_FLEXIBLE_VERSION
    log_start = version >= 5
    replica = version >= 11
    head = ">ihqq" + ("q" if log_start else "")
    no_aborted = head + ("B" if flexible else "i") + ("i" if replica else "")
    if not flexible:
        no_aborted += "i"
    return _Layout(
        flexible=flexible,
        topic_id=version >= FETCH_FIRST_TOPIC_ID_VERSION,
        has_session=version >= 7,
        has_log_start_offset=log_start,
        has_preferred_read_replica=replica,
        head=struct.Struct(head),
        head_no_aborted=struct.Struct(no_aborted),
    )


_LAYOUTS: Final = {v: _layout(v) for v in range(FETCH_MIN_VERSION, FETCH_MAX_VERSION + 1)}
_INT32: Final = struct.Struct(">i")
_PAIR: Final = struct.Struct(">qq")
_HEADER_V0: Final = struct.Struct(">i")
_HEADER_V1: Final = struct.Struct(">iB")
_TOP_V4: Final = struct.Struct(">i")
_TOP_V7: Final = struct.Struct(">ihi")


def encode_fetch_response(
    version: int,
    correlation_id: int,
    responses: Sequence[FetchableTopicResponse],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> list[Chunk]:
    """Encode a whole Fetch response frame (size prefix, header, body) as a list of chunks.

    ``error_code`` and ``session_id`` exist from v7 and are ignored before. Record chunks must be
    single-byte buffers (``bytes``, ``bytearray``, a ``memoryview`` of bytes).
    """
    layout = _LAYOUTS.get(version)
    if layout is None:
        raise UnsupportedVersionError(
            f"Fetch v{version} is not supported (v{FETCH_MIN_VERSION}..v{FETCH_MAX_VERSION} are)"
        )
    flexible = layout.flexible
    has_replica = layout.has_preferred_read_replica
    has_log_start = layout.has_log_start_offset
    pack = layout.head_no_aborted.pack
    out: list[Chunk] = []
    # Structure since the last records section; joined into one chunk before the next one.
    parts: list[bytes] = [
        _HEADER_V1.pack(correlation_id, 0) if flexible else _HEADER_V0.pack(correlation_id),
        _TOP_V7.pack(throttle_time_ms, error_code, session_id)
        if layout.has_session
        else _TOP_V4.pack(throttle_time_ms),
        encode_array_length(len(responses), flexible),
    ]
    append = parts.append
    for topic in responses:
        if layout.topic_id:
            append(topic.topic_id.bytes)
        else:
            append(encode_string(topic.topic, flexible))
        partitions = topic.partitions
        append(encode_array_length(len(partitions), flexible))
        for p in partitions:
            records = p.records
            if records is None:
                size = -1
            elif len(records) == 1:
                size = len(records[0])
            else:
                size = sum(map(len, records))
            # The common case, null aborted_transactions, is one pack (plus a varint if flexible).
            if p.aborted_transactions is not None:
                _pack_with_aborted(layout, p, p.aborted_transactions, size, append)
            elif flexible:
                append(
                    pack(
                        p.partition_index,
                        p.error_code,
                        p.high_watermark,
                        p.last_stable_offset,
                        p.log_start_offset,
                        0,
                        p.preferred_read_replica,
                    )
                )
                append(encode_uvarint(size + 1))  # null (-1) becomes 0
            elif has_replica:
                append(
                    pack(
                        p.partition_index,
                        p.error_code,
                        p.high_watermark,
                        p.last_stable_offset,
                        p.log_start_offset,
                        -1,
                        p.preferred_read_replica,
                        size,
                    )
                )
            elif has_log_start:
                append(
                    pack(
                        p.partition_index,
                        p.error_code,
                        p.high_watermark,
                        p.last_stable_offset,
                        p.log_start_offset,
                        -1,
                        size,
                    )
                )
            else:
                append(
                    pack(
                        p.partition_index,
                        p.error_code,
                        p.high_watermark,
                        p.last_stable_offset,
                        -1,
                        size,
                    )
                )
            if size > 0:
                assert records is not None
                out.append(b"".join(parts))
                out.extend(records)
                parts = [_NO_TAGS] if flexible else []
                append = parts.append
            elif flexible:
                append(_NO_TAGS)
        if flexible:
            append(_NO_TAGS)
    if flexible:
        append(_NO_TAGS)
    out.append(b"".join(parts))
    # out[0] always holds structure: the header comes before any records.
    out[0] = _INT32.pack(sum(map(len, out))) + out[0]
    return out


def _pack_with_aborted(
    layout: _Layout,
    partition: FetchPartition,
    aborted: Sequence[AbortedTransaction],
    records_size: int,
    append: _Append,
) -> None:
    """A partition with a (possibly empty) list of aborted transactions."""
    flexible = layout.flexible
    values = [
        partition.partition_index,
        partition.error_code,
        partition.high_watermark,
        partition.last_stable_offset,
    ]
    if layout.has_log_start_offset:
        values.append(partition.log_start_offset)
    append(layout.head.pack(*values))
    append(encode_array_length(len(aborted), flexible))
    for transaction in aborted:
        append(_PAIR.pack(transaction.producer_id, transaction.first_offset))
        if flexible:
            append(_NO_TAGS)
    if layout.has_preferred_read_replica:
        append(_INT32.pack(partition.preferred_read_replica))
    if flexible:
        append(encode_uvarint(records_size + 1))
    else:
        append(_INT32.pack(records_size))
