"""Hand-written Produce response encoder (versions 3-12), byte for byte what kio writes.

The Produce answer is the broker's most frequent response; building it through kio's dataclasses
cost about a tenth of the event loop at 1,000 small produces a second. Layout per version:
``responses`` (topic name, partition answers: index, error code, base offset, log append time,
log start offset (v5+), record errors and error message (v8+)), then ``throttle_time_ms``;
flexible (compact strings and arrays, tagged-field sections) from v9. The tagged fields
``current_leader`` (v10+) and ``node_endpoints`` (v10+) are left out (they only matter for
NOT_LEADER_OR_FOLLOWER leader discovery), as Kafka does when they hold their defaults.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from automq_ref.protocol.primitives import encode_array_length, encode_string

PRODUCE_RESPONSE_MIN_VERSION: Final = 3
PRODUCE_RESPONSE_MAX_VERSION: Final = 12
_FIRST_FLEXIBLE: Final = 9
_HEAD: Final = struct.Struct(">ihqq")  # index, error code, base offset, log append time
_INT64: Final = struct.Struct(">q")
_INT32: Final = struct.Struct(">i")
_NO_TAGS: Final = b"\x00"


@dataclass(frozen=True, slots=True)
class ProducePartitionAnswer:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[ProducePartitionAnswer]]],
    throttle_time_ms: int = 0,
) -> bytes:
    """Response header + body (no size prefix)."""
    if not PRODUCE_RESPONSE_MIN_VERSION <= version <= PRODUCE_RESPONSE_MAX_VERSION:
        raise ValueError(f"Produce response v{version} is not supported (v3-v12)")
    flexible = version >= _FIRST_FLEXIBLE
    parts: list[bytes] = [_INT32.pack(correlation_id)]
    if flexible:
        parts.append(_NO_TAGS)  # response header v1
    parts.append(encode_array_length(len(topics), flexible))
    for name, partitions in topics:
        parts.append(encode_string(name, flexible))
        parts.append(encode_array_length(len(partitions), flexible))
        for answer in partitions:
            parts.append(
                _HEAD.pack(
                    answer.index,
                    answer.error_code,
                    answer.base_offset,
                    answer.log_append_time_ms,
                )
            )
            if version >= 5:
                parts.append(_INT64.pack(answer.log_start_offset))
            if version >= 8:
                parts.append(encode_array_length(0, flexible))  # record_errors
                parts.append(_nullable_string(answer.error_message, flexible))
            if flexible:
                parts.append(_NO_TAGS)
        if flexible:
            parts.append(_NO_TAGS)
    parts.append(_INT32.pack(throttle_time_ms))
    if flexible:
        parts.append(_NO_TAGS)
    return b"".join(parts)


def _nullable_string(value: str | None, flexible: bool) -> bytes:
    if value is not None:
        return encode_string(value, flexible)
    return b"\x00" if flexible else b"\xff\xff"
