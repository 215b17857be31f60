"""What one request of a catch-up consumer costs the broker's event loop, at many partitions.

    python -m bench.request_cost_bench [--partitions 1000] [--runs 30]

A consumer assigned 1,000 partitions names all of them in every Fetch, and asks Metadata for all
of them when it starts; each such request is a step of the broker's one event loop, during which
no produce is acknowledged. This bench starts a broker in process (its default local store, no
listener: requests go straight to its front end), creates a topic of ``--partitions`` partitions,
writes one batch of 1 KiB to each, and times whole requests, from the frame to the encoded
answer:

* ``fetch, nothing to send``: Fetch v16 of every partition at its high watermark (no partition
  has bytes to send: like the partitions of a catch-up's Fetch past the response's byte budget,
  or a tail consumer's idle Fetch), ``max_wait_ms`` 0;
* ``fetch, all have data``: Fetch v16 of every partition from offset 0 (from the LogCache);
* ``metadata``: Metadata v12 of the topic.

Each figure is the median over ``--runs`` requests of the thread's CPU time (``time.thread_time``)
and of the wall time, in milliseconds; the loop runs nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import inspect
import io
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.fetch.v16.request import FetchPartition, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i32, i64

from automq_ref.config import load_config
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.server import Peer
from automq_ref.node import Node, start_node
from automq_ref.protocol.kio_codec import api_name

TOPIC = TopicName("catch-up")
PEER = Peer(1, "127.0.0.1:1")


def request_frame(api_key: int, version: int, **body: Any) -> bytes:
    """A request frame (header and body, no size prefix) built with kio."""
    cls: Any = load_request_schema(api_key, version)
    header_cls: Any = cls.__header_schema__
    out = io.BytesIO()
    header = header_cls(
        request_api_key=api_key, request_api_version=version, correlation_id=1, client_id="bench"
    )
    entity_writer(header_cls)(out, header)
    entity_writer(cls)(out, cls(**body))
    return out.getvalue()


def decode_response(api_key: int, version: int, answer: bytes) -> Any:
    cls: Any = load_response_schema(api_key, version)
    _, offset = entity_reader(cls.__header_schema__)(answer, 0)
    return entity_reader(cls)(answer, offset)[0]


async def send(node: Node, api_key: int, version: int, frame: bytes) -> bytes:
    reply = await node.front_end.admit(frame, PEER)
    if inspect.isawaitable(reply):
        reply = await reply
    assert reply is not None, "every request here is answered"
    return b"".join(bytes(chunk) for chunk in reply)


async def prepare(node: Node, partitions: int) -> uuid.UUID:
    created = decode_response(
        19,
        5,
        await send(
            node,
            19,
            5,
            request_frame(
                19,
                5,
                topics=(_creatable(TOPIC, partitions),),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            ),
        ),
    )
    assert int(created.topics[0].error_code) == 0, created
    batch = build_record_batch([(None, b"x" * 1024)])
    produced = decode_response(
        0,
        9,
        await send(
            node,
            0,
            9,
            request_frame(
                0,
                9,
                transactional_id=None,
                acks=-1,
                timeout=datetime.timedelta(seconds=30),
                topic_data=(
                    TopicProduceData(
                        name=TOPIC,
                        partition_data=tuple(
                            PartitionProduceData(index=i32(index), records=Records(batch))
                            for index in range(partitions)
                        ),
                    ),
                ),
            ),
        ),
    )
    codes = {int(p.error_code) for p in produced.responses[0].partition_responses}
    assert codes == {0}, f"produce answered {codes}"
    metadata = decode_response(3, 12, await send(node, 3, 12, _metadata_frame()))
    return metadata.topics[0].topic_id  # type: ignore[no-any-return]


def _creatable(name: str, partitions: int) -> Any:
    from kio.schema.create_topics.v5.request import CreatableTopic
    from kio.static.primitive import i16

    return CreatableTopic(
        name=TopicName(name),
        num_partitions=i32(partitions),
        replication_factor=i16(1),
        assignments=(),
        configs=(),
    )


def _metadata_frame() -> bytes:
    return request_frame(
        3,
        12,
        topics=(MetadataRequestTopic(topic_id=None, name=TOPIC),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def _fetch_frame(topic_id: uuid.UUID, partitions: int, offset: int) -> bytes:
    return request_frame(
        1,
        16,
        max_wait=datetime.timedelta(0),
        min_bytes=i32(1),
        max_bytes=i32(256 * 1024 * 1024),
        topics=(
            FetchTopic(
                topic_id=topic_id,
                partitions=tuple(
                    FetchPartition(
                        partition=i32(index),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(1024 * 1024),
                    )
                    for index in range(partitions)
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


async def timed(
    node: Node, key: int, version: int, frame: bytes, runs: int
) -> tuple[float, float, bytes]:
    cpu, wall = [], []
    answer = b""
    for _ in range(runs):
        started_cpu, started_wall = time.thread_time(), time.perf_counter()
        answer = await send(node, key, version, frame)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return statistics.median(cpu) * 1000, statistics.median(wall) * 1000, answer


async def run(partitions: int, runs: int) -> list[tuple[str, float, float, int]]:
    with tempfile.TemporaryDirectory(prefix="request-cost-") as directory:
        config = load_config(
            overrides=[f"log.dirs={Path(directory)}", "s3.wal.capacity=67108864"],
            environment={},
        )
        node = await start_node(config)
        try:
            topic_id = await prepare(node, partitions)
            cases = {
                "fetch, nothing to send": (1, 16, _fetch_frame(topic_id, partitions, 1)),
                "fetch, all have data": (1, 16, _fetch_frame(topic_id, partitions, 0)),
                "metadata": (3, 12, _metadata_frame()),
            }
            rows = []
            for name, (key, version, frame) in cases.items():
                await send(node, key, version, frame)  # warm
                cpu, wall, answer = await timed(node, key, version, frame, runs)
                _check(name, key, version, answer, partitions)
                rows.append((name, cpu, wall, len(answer)))
            return rows
        finally:
            await node.shutdown()


def _check(name: str, key: int, version: int, answer: bytes, partitions: int) -> None:
    """The answer is what the case asks: every partition, no error, data where there is."""
    response = decode_response(key, version, answer)
    if key == 1:
        answered = response.responses[0].partitions
        assert len(answered) == partitions, f"{name}: {len(answered)} partitions answered"
        assert {int(p.error_code) for p in answered} == {0}, name
        with_data = sum(1 for p in answered if p.records)
        assert with_data == (partitions if "all" in name else 0), f"{name}: {with_data} had data"
    else:
        assert len(response.topics[0].partitions) == partitions, f"{api_name(key)} answer"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=30)
    arguments = parser.parse_args(argv)
    rows = asyncio.run(run(arguments.partitions, arguments.runs))
    print(f"| request, {arguments.partitions} partitions | CPU ms | wall ms | answer bytes |")
    print("|---|---:|---:|---:|")
    for name, cpu, wall, size in rows:
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {size} |")


if __name__ == "__main__":
    main()
