"""The zone router's route-epoch record in the controller's KV store, and a node's report.

Under :data:`~automq_ref.vocabulary.naming.ROUTE_EPOCH_KEY` (AutoMQ's ``__a_r_c/metadata``)
the active controller keeps one record: the committed, fenced and current route epochs and the
wall-clock time of the last bump, in milliseconds. Its bytes are Avro's binary encoding of a
record of four ``long`` fields in that order (each a zigzag varint, as a Kafka varlong), the
layout AutoMQ's controller writes. Under
:func:`~automq_ref.vocabulary.naming.node_committed_route_epoch_key` each node keeps its
committed route epoch as a KV integer (:mod:`automq_ref.formats.kv_integer`).

Decoding accepts exactly what encoding writes: four varlongs and nothing after them.
"""

from __future__ import annotations

from dataclasses import dataclass

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.kv_integer import decode_kv_integer, encode_kv_integer
from automq_ref.formats.record_codec import encode_varlong, read_varlong


@dataclass(frozen=True, slots=True)
class RouteEpochRecord:
    """The controller's route epochs (AutoMQ starts at committed -3, fenced -2, current 0)."""

    committed: int
    fenced: int
    current: int
    last_bump_ms: int


def encode_route_epoch_record(record: RouteEpochRecord) -> bytes:
    return b"".join(
        encode_varlong(value)
        for value in (record.committed, record.fenced, record.current, record.last_bump_ms)
    )


def decode_route_epoch_record(raw: bytes | bytearray | memoryview) -> RouteEpochRecord:
    """The record in ``raw``; :class:`~automq_ref.formats.errors.FormatError` otherwise."""
    data = bytes(raw)
    values = []
    position = 0
    for _ in range(4):
        value, position = read_varlong(data, position)
        values.append(value)
    if position != len(data):
        raise InvalidFieldError(f"route epoch record: {len(data) - position} bytes after it")
    committed, fenced, current, last_bump_ms = values
    return RouteEpochRecord(committed, fenced, current, last_bump_ms)


def encode_node_committed_epoch(epoch: int) -> bytes:
    return encode_kv_integer(epoch)


def decode_node_committed_epoch(raw: bytes | bytearray | memoryview) -> int:
    return decode_kv_integer(raw, "node committed route epoch")
