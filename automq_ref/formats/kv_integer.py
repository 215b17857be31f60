"""Integers in the controller's KV store: a stream id or a producer id as decimal ASCII.

The values under :func:`~automq_ref.vocabulary.naming.partition_key` (a MetaStream id),
:data:`~automq_ref.vocabulary.naming.OFFSETS_STREAM_KEY` (an earlier version's offsets stream's
id) and
:data:`~automq_ref.vocabulary.naming.PRODUCER_ID_KEY` (the next producer-id block) are written
this way (the last by the controller's StreamMetadata machine, the others by the broker) and read
back by their writers and by the Spark source. Decoding accepts exactly
what encoding writes: an optional minus sign and ASCII digits, nothing around them.
"""

from __future__ import annotations

import re

from automq_ref.formats.errors import InvalidFieldError

# Longer than any int64, short enough that int() never meets Python's digit limit.
_MAX_DIGITS = 20
_DECIMAL = re.compile(rb"-?[0-9]{1,%d}" % _MAX_DIGITS)


def encode_kv_integer(value: int) -> bytes:
    return str(value).encode()


def decode_kv_integer(raw: bytes | bytearray | memoryview, what: str) -> int:
    """The integer in ``raw``; :class:`InvalidFieldError` naming ``what`` otherwise."""
    data = bytes(raw)
    if not _DECIMAL.fullmatch(data):
        raise InvalidFieldError(f"{what}: {data[:40]!r} is not a decimal integer")
    return int(data)
