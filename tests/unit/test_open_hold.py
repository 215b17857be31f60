"""Requests held for a partition this broker is opening (``partition.open.wait.ms``; see
``opening`` and ``wait_opened`` in automq_ref/kafka/topic_registry.py and the Produce, Fetch and
ListOffsets handlers).

Two brokers in one process (tests/unit/test_topic_following.py's): a partition led by broker 2
is moved to node 1, whose open of it is stopped at a gate the test opens, so that the window in
which node 1 is the partition's broker in the image but has not opened it yet lasts as long as
the test needs. Requests reach node 1 through its front end, as a client's would.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i8, i32, i64

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.server import Peer
from automq_ref.state_machines import stream_metadata as sm
from tests.unit.test_broker_node import call
from tests.unit.test_topic_following import OTHER, Brokers, produce, start_brokers, until

PEER = Peer(1, "127.0.0.1:1")
TOPIC = "moving"
E = KafkaErrorCode


async def produce_request(brokers: Brokers, timeout_ms: int = 10_000) -> tuple[E, int]:
    """Produce one record to partition 0 through node 1's front end: (error, base offset)."""
    response: Any = await call(
        brokers.node.front_end.admit,
        PEER,
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            TopicProduceData(
                name=TopicName(TOPIC),
                partition_data=(
                    PartitionProduceData(
                        index=i32(0), records=Records(build_record_batch([(None, b"held")]))
                    ),
                ),
            ),
        ),
    )
    (answer,) = response.responses[0].partition_responses
    return E(answer.error_code), int(answer.base_offset)


async def list_latest(brokers: Brokers) -> tuple[E, int]:
    response: Any = await call(
        brokers.node.front_end.admit,
        PEER,
        2,
        7,
        replica_id=-1,
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=TopicName(TOPIC),
                partitions=(
                    ListOffsetsPartition(
                        partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)
                    ),
                ),
            ),
        ),
    )
    (answer,) = response.topics[0].partitions
    return E(answer.error_code), int(answer.offset)


async def fetch_from_start(brokers: Brokers) -> tuple[E, int]:
    """Fetch partition 0 from offset 0 (wait at most 5 s): (error, high watermark)."""
    response: Any = await call(
        brokers.node.front_end.admit,
        PEER,
        1,
        12,
        replica_id=-1,
        max_wait=datetime.timedelta(seconds=5),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=TopicName(TOPIC),
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(0),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(1 << 20),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    (answer,) = response.responses[0].partitions
    return E(answer.error_code), int(answer.high_watermark)


async def move_here_behind_a_gate(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> asyncio.Event:
    """Partition 0 of TOPIC, led by broker 2 with 5 records, moved to node 1, whose open of it
    waits for the returned gate; returns once node 1 reached the gate."""
    here, there = brokers.node.topics, brokers.other
    me = brokers.node.config.node_id
    await there.create_topic(TOPIC, 1, {}, assignments=[OTHER])
    await produce(there.partitions[(TOPIC, 0)], 5)
    gate = asyncio.Event()
    reached: list[object] = []
    opened = Partition.open

    async def open_at_the_gate(*args: Any, **kwargs: Any) -> Partition:
        reached.append(args)
        await gate.wait()
        return await opened(*args, **kwargs)

    monkeypatch.setattr(Partition, "open", open_at_the_gate)
    assert (await brokers.node.client.submit(sm.ReassignPartition(TOPIC, 0, me))).ok
    await until(lambda: bool(reached))
    assert here.opening(TOPIC, 0) and (TOPIC, 0) not in here.partitions
    return gate


async def timed(request: Awaitable[tuple[E, int]]) -> tuple[E, int, float]:
    began = time.monotonic()
    error, value = await request
    return error, value, time.monotonic() - began


async def still_waiting(task: asyncio.Task[Any]) -> bool:
    await asyncio.sleep(0.3)
    return not task.done()


async def test_held_requests_are_answered_once_the_partition_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with start_brokers(tmp_path, "partition.open.wait.ms=60000") as brokers:
        gate = await move_here_behind_a_gate(brokers, monkeypatch)
        produced = asyncio.create_task(produce_request(brokers))
        listed = asyncio.create_task(list_latest(brokers))
        fetched = asyncio.create_task(fetch_from_start(brokers))
        assert await still_waiting(produced)
        assert not listed.done() and not fetched.done()
        gate.set()
        # Appended after the open, at the new leader epoch, after the 5 records moved with it.
        assert await produced == (E.NONE, 5)
        partition = brokers.node.topics.partitions[(TOPIC, 0)]
        assert partition.epoch == 1 and partition.log_end_offset == 6
        assert (await listed)[0] is E.NONE and (await listed)[1] in (5, 6)
        assert (await fetched)[0] is E.NONE and (await fetched)[1] in (5, 6)


@pytest.mark.parametrize(("hold_ms", "timeout_ms"), [(300, 10_000), (60_000, 300)])
async def test_a_partition_still_not_open_is_answered_not_leader_after_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold_ms: int, timeout_ms: int
) -> None:
    """Held for the setting or the request's own timeout, whichever is shorter; then answered
    as before, with nothing appended."""
    async with start_brokers(tmp_path, f"partition.open.wait.ms={hold_ms}") as brokers:
        gate = await move_here_behind_a_gate(brokers, monkeypatch)
        error, _, seconds = await timed(produce_request(brokers, timeout_ms))
        assert error is E.NOT_LEADER_OR_FOLLOWER
        assert seconds >= 0.29
        gate.set()
        await until(lambda: (TOPIC, 0) in brokers.node.topics.partitions)
        assert brokers.node.topics.partitions[(TOPIC, 0)].log_end_offset == 5


async def test_a_partition_placed_elsewhere_is_answered_at_once(tmp_path: Path) -> None:
    async with start_brokers(tmp_path, "partition.open.wait.ms=60000") as brokers:
        await brokers.other.create_topic(TOPIC, 1, {}, assignments=[OTHER])
        assert not brokers.node.topics.opening(TOPIC, 0)
        for request in (produce_request, list_latest, fetch_from_start):
            error, _, seconds = await timed(request(brokers))
            assert error is E.NOT_LEADER_OR_FOLLOWER
            # Not held: far below the hold (a hang guard, not a budget).
            assert seconds < 30


async def test_zero_answers_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with start_brokers(tmp_path, "partition.open.wait.ms=0") as brokers:
        gate = await move_here_behind_a_gate(brokers, monkeypatch)
        for request in (produce_request, list_latest):
            error, _, seconds = await timed(request(brokers))
            assert error is E.NOT_LEADER_OR_FOLLOWER and seconds < 30
        gate.set()
