"""Hand-written Fetch/Produce codecs against kio: microseconds per operation.

    python -m bench.protocol_bench [--runs 7] [--seconds 0.2]

Fetch response encode, for 1 partition x 1 MiB of records and 100 partitions x 16 KiB, at v11
(the last non-flexible version) and v16 (flexible, topic ids). Four figures per row:

* ``hand``: :func:`encode_fetch_response` on prebuilt dataclasses, returning the chunk list;
* ``hand+build``: the same, building the per-partition dataclasses first (what a broker pays);
* ``kio``: kio's writer on prebuilt kio objects, into a chunk list (zero-copy), plus size prefix;
* ``kio+build``: the same, building the kio objects first.

Produce request decode (header and body) of 1 partition x 1 MiB and 100 partitions x 10 KiB at v7
and v9: ``hand`` is :func:`decode_produce_frame` (records are views into the frame), ``kio`` is
kio's reader (records are copied into new ``bytes``).

Each figure is the median over ``--runs`` runs; a run repeats the operation for about
``--seconds`` of the thread's CPU time (``time.thread_time``, which other processes on a shared
machine distort less than wall time) and divides. The records are random bytes (the codecs never
look inside them). Before timing, each row checks that both sides give the same bytes or values.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import struct
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from automq_ref.protocol import (
    FetchableTopicResponse,
    FetchPartitionData,
    decode_produce_frame,
    encode_fetch_response,
)

KIB = 1024
MIB = 1024 * KIB
TOPIC_ID = uuid.UUID("6a1f1a3c-0d2b-4c7e-9f00-3b5a7d9e2c11")


class ChunkList(list[Any]):
    write = list.append


def time_per_op_us(operation: Callable[[], object], runs: int, seconds: float) -> float:
    """Median over ``runs`` of the mean time of one call, in microseconds."""
    clock = time.thread_time
    started = clock()
    for _ in range(3):
        operation()
    calls = max(1, int(seconds / max((clock() - started) / 3, 1e-7)))
    figures = []
    for _ in range(runs):
        started = clock()
        for _ in range(calls):
            operation()
        figures.append((clock() - started) / calls * 1e6)
    return statistics.median(figures)


# --- Fetch --------------------------------------------------------------------------------------


def hand_fetch_topics(batches: list[bytes]) -> tuple[FetchableTopicResponse, ...]:
    partitions = tuple(
        FetchPartitionData(
            partition_index=index,
            high_watermark=1_000_000,
            last_stable_offset=1_000_000,
            log_start_offset=0,
            records=(batch,),
        )
        for index, batch in enumerate(batches)
    )
    return (FetchableTopicResponse(partitions=partitions, topic="bench", topic_id=TOPIC_ID),)


def kio_fetch_response(version: int, batches: list[bytes]) -> Any:
    response_class: Any = load_response_schema(1, version)
    module = sys.modules[response_class.__module__]
    partitions = []
    for index, batch in enumerate(batches):
        values: dict[str, Any] = {
            "partition_index": index,
            "error_code": ErrorCode.none,
            "high_watermark": 1_000_000,
            "last_stable_offset": 1_000_000,
            "aborted_transactions": None,
            "records": batch,
        }
        if version >= 5:
            values["log_start_offset"] = 0
        partitions.append(module.PartitionData(**values))
    topic = (
        module.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=tuple(partitions))
        if version >= 13
        else module.FetchableTopicResponse(topic="bench", partitions=tuple(partitions))
    )
    return response_class(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(topic,),
    )


def kio_fetch_encode(response: Any) -> list[Any]:
    response_class: Any = type(response)
    header_class = response_class.__header_schema__
    out = ChunkList()
    write_header: Any = entity_writer(header_class)
    write_body: Any = entity_writer(response_class)
    write_header(out, header_class(correlation_id=7))
    write_body(out, response)
    return [struct.pack(">i", sum(map(len, out))), *out]


def fetch_row(label: str, batches: list[bytes], version: int, runs: int, seconds: float) -> str:
    topics = hand_fetch_topics(batches)
    kio_response = kio_fetch_response(version, batches)
    hand_chunks = encode_fetch_response(version, 7, topics)
    assert b"".join(hand_chunks) == b"".join(kio_fetch_encode(kio_response))
    hand = time_per_op_us(lambda: encode_fetch_response(version, 7, topics), runs, seconds)
    hand_build = time_per_op_us(
        lambda: encode_fetch_response(version, 7, hand_fetch_topics(batches)), runs, seconds
    )
    kio = time_per_op_us(lambda: kio_fetch_encode(kio_response), runs, seconds)
    kio_build = time_per_op_us(
        lambda: kio_fetch_encode(kio_fetch_response(version, batches)), runs, seconds
    )
    return (
        f"| Fetch v{version} encode, {label} | {hand:.1f} | {kio:.1f} | {kio / hand:.1f}x "
        f"| {hand_build:.1f} | {kio_build:.1f} | {kio_build / hand_build:.1f}x |"
    )


def fetch_rows(runs: int, seconds: float) -> list[str]:
    scenarios = [
        ("1 x 1 MiB", [os.urandom(MIB)]),
        ("100 x 16 KiB", [os.urandom(16 * KIB) for _ in range(100)]),
    ]
    return [
        fetch_row(label, batches, version, runs, seconds)
        for label, batches in scenarios
        for version in (11, 16)
    ]


# --- Produce ------------------------------------------------------------------------------------


def kio_produce_frame(version: int, batches: list[bytes]) -> bytes:
    request_class: Any = load_request_schema(0, version)
    module = sys.modules[request_class.__module__]
    request = request_class(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            module.TopicProduceData(
                name="bench",
                partition_data=tuple(
                    module.PartitionProduceData(index=index, records=batch)
                    for index, batch in enumerate(batches)
                ),
            ),
        ),
    )
    header_class = request_class.__header_schema__
    header = header_class(
        request_api_key=0, request_api_version=version, correlation_id=7, client_id="bench"
    )
    out = ChunkList()
    write_header: Any = entity_writer(header_class)
    write_body: Any = entity_writer(request_class)
    write_header(out, header)
    write_body(out, request)
    return b"".join(out)


def kio_produce_decode(frame: bytes) -> Any:
    version = struct.unpack_from(">h", frame, 2)[0]
    request_class: Any = load_request_schema(0, version)
    read_header: Any = entity_reader(request_class.__header_schema__)
    read_body: Any = entity_reader(request_class)
    _, offset = read_header(frame, 0)
    return read_body(frame, offset)[0]


def produce_row(label: str, batches: list[bytes], version: int, runs: int, seconds: float) -> str:
    frame = kio_produce_frame(version, batches)
    _, request = decode_produce_frame(frame)
    hand_records = [bytes(p.records or b"") for t in request.topic_data for p in t.partition_data]
    assert hand_records == batches
    hand = time_per_op_us(lambda: decode_produce_frame(frame), runs, seconds)
    kio = time_per_op_us(lambda: kio_produce_decode(frame), runs, seconds)
    return (
        f"| Produce v{version} decode, {label} | {hand:.1f} | {kio:.1f} | {kio / hand:.1f}x | | | |"
    )


def produce_rows(runs: int, seconds: float) -> list[str]:
    scenarios = [
        ("1 x 1 MiB", [os.urandom(MIB)]),
        ("100 x 10 KiB", [os.urandom(10 * KIB) for _ in range(100)]),
    ]
    return [
        produce_row(label, batches, version, runs, seconds)
        for label, batches in scenarios
        for version in (7, 9)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.2)
    arguments = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load}\n")
    print(
        "| operation (µs per op, median) | hand | kio | kio/hand "
        "| hand+build | kio+build | kio/hand |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in fetch_rows(arguments.runs, arguments.seconds):
        print(row, flush=True)
    for row in produce_rows(arguments.runs, arguments.seconds):
        print(row, flush=True)


if __name__ == "__main__":
    main()
