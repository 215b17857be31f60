"""The zone router's proxy side with a fake channel and a fake target: entries for one target
are sent in admission order even when their channel appends finish out of order; a batch is
one request per route epoch, oldest first; a batch closes at its size limit; at most the limit
of batches is in flight per target; answers are merged back per entry, and what fails on the
way is answered LEADER_NOT_AVAILABLE (the client retries). router_channel-mode local writes go
through the channel and then the main side's order queue, counted in flight for their epoch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.zone_router import (
    ORDER_HINT_MODULUS,
    ChannelOffset,
    RecordOffset,
    RouterRecordV2,
)
from automq_ref.kafka import zone_router_out
from automq_ref.kafka.broker_link import BrokerLinkError
from automq_ref.kafka.zone_router_in import RoutedPartition, RouterIn
from automq_ref.kafka.zone_router_out import RouterOut, order_hint
from automq_ref.protocol.produce_response import ProducePartitionAnswer
from automq_ref.protocol.zone_router import (
    ZoneRouterRequest,
    ZoneRouterResponse,
    encode_produce_answer,
)

NODE = 2
TARGET = 1
LEADER_NOT_AVAILABLE = KafkaErrorCode.LEADER_NOT_AVAILABLE.value


@dataclass
class Channel:
    """Appends that complete when the test says, each tagged with the epoch it is given."""

    appends: list[tuple[int, int, bytes, asyncio.Future[tuple[int, ChannelOffset]]]] = field(
        default_factory=list
    )

    async def append(
        self, target_node: int, order_hint: int, payload: bytes
    ) -> tuple[int, ChannelOffset]:
        future: asyncio.Future[tuple[int, ChannelOffset]] = (
            asyncio.get_running_loop().create_future()
        )
        self.appends.append((target_node, order_hint, payload, future))
        return await future

    def finish(self, number: int, epoch: int = 3) -> ChannelOffset:
        target, hint, _, future = self.appends[number]
        where = ChannelOffset(0, hint, NODE, target, RecordOffset(1, number * 100, 40))
        future.set_result((epoch, where))
        return where

    def fail(self, number: int) -> None:
        self.appends[number][3].set_exception(OSError("the channel's store is down"))


@dataclass
class Target:
    """A leader that records each request and answers as told (every entry ok by default)."""

    requests: list[tuple[int, list[ChannelOffset]]] = field(default_factory=list)
    error: int = 0
    entry_error: int = 0
    broken: bool = False
    hold: asyncio.Event | None = None
    outstanding: int = 0
    most_outstanding: int = 0

    async def call(self, version: int, request: ZoneRouterRequest) -> ZoneRouterResponse:
        assert version == 1 and request.version == 1
        offsets = list(RouterRecordV2.decode(request.metadata).channel_offsets)
        self.requests.append((request.route_epoch, offsets))
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.broken:
                raise BrokerLinkError("connection lost")
        finally:
            self.outstanding -= 1
        if self.error:
            return ZoneRouterResponse(self.error)
        return ZoneRouterResponse(
            0,
            tuple(
                encode_produce_answer(
                    "t", ProducePartitionAnswer(0, self.entry_error, where.record_offset.offset)
                )
                for where in offsets
            ),
        )


@dataclass
class Gate:
    in_flight: dict[int, int] = field(default_factory=dict)
    tagged: list[int] = field(default_factory=list)

    def begin(self, epoch: int, key: str | None = None) -> bool:
        self.in_flight[epoch] = self.in_flight.get(epoch, 0) + 1
        return True

    def end(self, epoch: int, key: str | None = None) -> None:
        self.in_flight[epoch] -= 1

    def tag(self, main_id: int, key: str | None = None) -> int:
        self.tagged.append(main_id)
        return 0


@dataclass
class Local:
    """The main side's append seam, for router_channel-mode local writes."""

    calls: list[tuple[RoutedPartition, ChannelOffset]] = field(default_factory=list)

    def __call__(
        self, routed: RoutedPartition, where: ChannelOffset
    ) -> asyncio.Future[ProducePartitionAnswer]:
        self.calls.append((routed, where))
        future: asyncio.Future[ProducePartitionAnswer] = asyncio.get_running_loop().create_future()
        future.set_result(ProducePartitionAnswer(routed.partition.index, 0, 77))
        return future


def router(
    channel: Channel, target: Target, gate: Gate | None = None, local: Local | None = None
) -> RouterOut:
    async def unused(where: ChannelOffset) -> bytes:
        raise AssertionError("local writes are read from the append, not the channel")

    return RouterOut(
        node_id=NODE,
        zone="az2",
        local_write_mode="router_channel",
        channel=channel,
        router_in=RouterIn(local or Local(), unused, gate),
        route_epochs=gate,
        sender=lambda node: target if node == TARGET else None,
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.001)


async def test_entries_are_sent_in_admission_order_whatever_order_the_channel_acks() -> None:
    channel, target = Channel(), Target()
    out = router(channel, target)
    answers = [out.send_routed(TARGET, index, 11, b"p%d" % index) for index in range(3)]
    await settle()
    assert [append[0] for append in channel.appends] == [TARGET] * 3
    offsets = [channel.finish(2), channel.finish(1)]
    await settle()
    assert target.requests == []  # the first entry's append is not done: nothing overtakes it
    offsets.append(channel.finish(0))
    await settle()
    assert target.requests == [(3, [offsets[2], offsets[1], offsets[0]])]
    results = [await answer for answer in answers]
    assert [(r.index, r.error_code, r.base_offset) for r in results] == [
        (0, 0, 0),
        (1, 0, 100),
        (2, 0, 200),
    ]


async def test_a_batch_is_one_request_per_route_epoch_oldest_first() -> None:
    channel, target, gate = Channel(), Target(), Gate()
    out = router(channel, target, gate)
    answers = [out.send_routed(TARGET, index, index, b"p") for index in range(3)]
    await settle()
    first = channel.finish(0, epoch=6)
    second = channel.finish(1, epoch=5)
    third = channel.finish(2, epoch=6)
    await settle()
    assert target.requests == [(5, [second]), (6, [first, third])]
    assert [(await a).error_code for a in answers] == [0, 0, 0]
    assert gate.tagged == [TARGET] * 3


async def test_a_batch_closes_at_its_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zone_router_out, "MAX_BATCH_ENTRIES", 3)
    monkeypatch.setattr(zone_router_out, "LINGER_S", 10.0)
    channel, target = Channel(), Target()
    out = router(channel, target)
    answers = [out.send_routed(TARGET, index, 1, b"p") for index in range(7)]
    await settle()
    for number in range(7):
        channel.finish(number)
    await settle()
    assert [len(offsets) for _, offsets in target.requests] == [3, 3]  # the last one lingers
    assert all(answer.done() for answer in answers[:6]) and not answers[6].done()


async def test_at_most_the_limit_of_batches_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zone_router_out, "MAX_BATCH_ENTRIES", 1)
    monkeypatch.setattr(zone_router_out, "MAX_IN_FLIGHT_BATCHES", 2)
    channel, target = Channel(), Target(hold=asyncio.Event())
    out = router(channel, target)
    answers = [out.send_routed(TARGET, index, 1, b"p") for index in range(5)]
    await settle()
    for number in range(5):
        channel.finish(number)
    await settle()
    assert len(target.requests) == 2 and out.targets[TARGET].in_flight == 2
    assert target.hold is not None
    target.hold.set()
    results = [await answer for answer in answers]
    assert len(target.requests) == 5 and target.most_outstanding == 2
    assert [r.error_code for r in results] == [0] * 5


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("unknown", LEADER_NOT_AVAILABLE),
        ("entry_unknown", LEADER_NOT_AVAILABLE),
        ("broken", LEADER_NOT_AVAILABLE),
        ("not_leader", KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value),
        ("channel", LEADER_NOT_AVAILABLE),
    ],
)
async def test_failures_are_answered_so_that_the_client_retries(how: str, expected: int) -> None:
    channel, target = Channel(), Target()
    if how == "unknown":
        target.error = KafkaErrorCode.UNKNOWN_SERVER_ERROR.value  # a fenced route epoch
    elif how == "entry_unknown":
        target.entry_error = KafkaErrorCode.UNKNOWN_SERVER_ERROR.value
    elif how == "broken":
        target.broken = True
    elif how == "not_leader":
        target.error = KafkaErrorCode.NOT_LEADER_OR_FOLLOWER.value
    out = router(channel, target)
    answer = out.send_routed(TARGET, 4, 1, b"p")
    await settle()
    if how == "channel":
        channel.fail(0)
    else:
        channel.finish(0)
    result = await answer
    assert (result.index, result.error_code) == (4, expected)


async def test_an_unknown_target_is_answered_leader_not_available() -> None:
    channel, target = Channel(), Target()
    out = router(channel, target)
    answer = out.send_routed(TARGET + 10, 0, 1, b"p")
    await settle()
    channel.finish(0)
    assert (await answer).error_code == LEADER_NOT_AVAILABLE


async def test_local_writes_go_through_the_channel_and_the_order_queue() -> None:
    channel, target, gate, local = Channel(), Target(), Gate(), Local()
    out = router(channel, target, gate, local)
    pack = zone_router_out.routed_pack(9, None, -1, 100, "t", 3, b"records")
    answer = out.write_local(3, 5, pack)
    await settle()
    assert channel.appends[0][:3] == (NODE, 5, pack)
    where = channel.finish(0, epoch=8)
    result = await answer
    assert (result.index, result.error_code, result.base_offset) == (3, 0, 77)
    ((routed, at),) = local.calls
    assert (routed.topic, routed.partition.index, at) == ("t", 3, where)
    assert gate.in_flight == {8: 0}  # counted while it was appended, released after
    assert target.requests == []


def test_order_hints_are_stable_and_in_range() -> None:
    hints = {order_hint("topic", partition, 7) for partition in range(200)}
    assert all(0 <= hint < ORDER_HINT_MODULUS for hint in hints) and len(hints) > 150
    assert order_hint("topic", 1, 7) == order_hint("topic", 1, 7)
    assert order_hint("topic", 1, 7) != order_hint("topic", 1, 8)
