"""The column decoder: a batch's records as columns (offsets, timestamps, keys, values,
headers), decoded in one tight loop without a record object per record.

What a columnar reader (Spark) wants. Each field is read inline for the common case; anything
unusual (a varint longer than the fast path reads, a length that does not add up) raises
:class:`SlowPath`, and the caller falls back to the careful decoder in ``record_codec.py``,
which gives the same records or the precise error.
"""

from __future__ import annotations

from typing import NamedTuple


class RecordColumns(NamedTuple):
    """A batch's records column by column (``headers`` empty unless asked for)."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[tuple[str, bytes | None], ...]]


class SlowPath(Exception):
    """The fast column decoder met something it leaves to the careful one."""


def decode_columns(
    data: bytes,
    records_count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    include_headers: bool,
) -> RecordColumns:
    """Every field read inline; anything unusual (a timestamp delta that needs a varlong, a
    length that does not add up) raises SlowPath."""
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[tuple[tuple[str, bytes | None], ...]] = []
    end = len(data)
    position = 0

    def varint(position: int) -> tuple[int, int]:
        if position >= end:
            raise SlowPath
        raw = data[position]
        if raw < 0x80:
            return (raw >> 1) ^ -(raw & 1), position + 1
        result = raw & 0x7F
        for shift in (7, 14, 21, 28):
            position += 1
            if position >= end:
                raise SlowPath
            raw = data[position]
            result |= (raw & 0x7F) << shift
            if raw < 0x80:
                if result > 0xFFFF_FFFF:
                    raise SlowPath
                return (result >> 1) ^ -(result & 1), position + 1
        raise SlowPath

    for _ in range(records_count):
        length, position = varint(position)
        body_end = position + length
        if length <= 0 or body_end > end:
            raise SlowPath
        timestamp_delta, position = varint(position + 1)  # past the attributes byte
        offset_delta, position = varint(position)
        key_length, position = varint(position)
        if key_length < 0:
            key = None
        else:
            key = data[position : position + key_length]
            position += key_length
        value_length, position = varint(position)
        if value_length < 0:
            value = None
        else:
            value = data[position : position + value_length]
            position += value_length
        header_count, position = varint(position)
        if key_length < -1 or value_length < -1 or header_count < 0 or position > body_end:
            raise SlowPath
        if header_count:
            pairs = []
            for _ in range(header_count):
                header_key_length, position = varint(position)
                if header_key_length < 0 or position + header_key_length > body_end:
                    raise SlowPath
                header_key = str(
                    data[position : position + header_key_length], "utf-8", "surrogateescape"
                )
                position += header_key_length
                header_value_length, position = varint(position)
                if header_value_length < -1:
                    raise SlowPath
                header_value = None
                if header_value_length >= 0:
                    header_value = data[position : position + header_value_length]
                    position += header_value_length
                pairs.append((header_key, header_value))
            if include_headers:
                headers.append(tuple(pairs))
        elif include_headers:
            headers.append(())
        if position != body_end:
            raise SlowPath
        offsets.append(base_offset + offset_delta)
        timestamps.append(
            base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        )
        keys.append(key)
        values.append(value)
    if position != end:
        raise SlowPath
    return RecordColumns(offsets, timestamps, keys, values, headers)
