"""The rows both Spark sources yield: Spark's Kafka source schema, built from stored batches.

Spark's own Kafka source gives ``key``, ``value``, ``topic``, ``partition``, ``offset``,
``timestamp``, ``timestampType`` and, with ``includeHeaders=true``, ``headers``. The sources here
keep those names and types so a query written for Spark's source reads the same. Records are
decoded from RecordBatch v2 bytes (every codec, through ``automq_ref.formats``) and handed to
Spark as Arrow record batches, which cross into the JVM without a per-row Python conversion.
Control batches (transaction markers) are skipped, as consumers skip them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from automq_ref.formats.record_batch import RecordBatchView

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])


def schema_ddl(include_headers: bool) -> str:
    columns = (
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int"
    )
    return columns + (
        ", headers array<struct<key: string, value: binary>>" if include_headers else ""
    )


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", pa.list_(HEADER_TYPE)))
    return pa.schema(fields)


@dataclass
class _Columns:
    keys: list[bytes | None]
    values: list[bytes | None]
    offsets: list[int]
    timestamps: list[int]  # microseconds
    timestamp_types: list[int]
    headers: list[list[dict[str, object]]]

    @classmethod
    def empty(cls) -> _Columns:
        return cls([], [], [], [], [], [])

    def __len__(self) -> int:
        return len(self.offsets)


def arrow_batches(
    topic: str,
    partition: int,
    batches: Iterable[RecordBatchView],
    start: int,
    end: int,
    *,
    include_headers: bool = False,
    rows_per_batch: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """The records with ``start <= offset < end`` from ``batches`` (in offset order), as Arrow
    record batches of at most ``rows_per_batch`` rows in the schema of :func:`arrow_schema`."""
    columns = _Columns.empty()
    for batch in batches:
        header = batch.header()
        if header.base_offset + header.last_offset_delta < start or batch.is_control:
            continue
        if header.base_offset >= end:
            break
        timestamp_type = (header.attributes >> 3) & 1
        decoded = batch.record_columns(include_headers=include_headers)
        low = bisect.bisect_left(decoded.offsets, start)
        high = bisect.bisect_left(decoded.offsets, end)
        if low == high:
            continue
        whole = low == 0 and high == len(decoded.offsets)
        offsets = decoded.offsets if whole else decoded.offsets[low:high]
        columns.offsets.extend(offsets)
        columns.keys.extend(decoded.keys if whole else decoded.keys[low:high])
        columns.values.extend(decoded.values if whole else decoded.values[low:high])
        columns.timestamps.extend(t * 1000 for t in decoded.timestamps[low:high])
        columns.timestamp_types.extend([timestamp_type] * len(offsets))
        if include_headers:
            columns.headers.extend(
                [{"key": k, "value": v} for k, v in pairs] for pairs in decoded.headers[low:high]
            )
        if len(columns) >= rows_per_batch:
            yield _to_arrow(topic, partition, columns, include_headers)
            columns = _Columns.empty()
    if len(columns):
        yield _to_arrow(topic, partition, columns, include_headers)


def _to_arrow(
    topic: str, partition: int, columns: _Columns, include_headers: bool
) -> pa.RecordBatch:
    count = len(columns)
    arrays = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array(columns.offsets, pa.int64()),
        pa.array(columns.timestamps, pa.timestamp("us", tz="UTC")),
        pa.array(columns.timestamp_types, pa.int32()),
    ]
    if include_headers:
        arrays.append(pa.array(columns.headers, pa.list_(HEADER_TYPE)))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
