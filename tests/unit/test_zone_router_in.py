"""The zone router's main side with fakes for the channel reads, the append and the route
epochs: per order hint, appends are issued in arrival order whatever order the channel reads
finish in (and hints do not wait for one another); a fenced route epoch is refused whole,
with nothing read or appended; an admitted request stays in flight for its epoch until every
entry's append is answered; an entry whose data cannot be read or decoded is answered on its
own; a transactional entry is verified at the head of its queue, the entries behind it waiting;
the produce link resolver rebuilds the batches at the link's offsets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import iter_batches
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.formats.zone_router import ChannelOffset, LinkRecord, RecordOffset, RouterRecordV2
from automq_ref.io.storage.router_channel import ChannelRecordGoneError
from automq_ref.kafka.zone_router_in import (
    ProduceLinkResolver,
    RoutedPartition,
    RouterIn,
    decode_routed,
)
from automq_ref.kafka.zone_router_out import routed_pack
from automq_ref.protocol.produce_response import ProducePartitionAnswer
from automq_ref.protocol.zone_router import ZoneRouterRequest, decode_produce_answer

PROXY = 2


def offset(sequence: int, hint: int, target: int = 1) -> ChannelOffset:
    return ChannelOffset(0, hint, PROXY, target, RecordOffset(7, sequence * 100, 60))


def payload(topic: str, index: int, records: bytes = b"r") -> bytes:
    return routed_pack(9, None, -1, 1000, topic, index, records)


@dataclass
class Channel:
    """Channel reads the test completes when it wants, each with the payload it was given."""

    payloads: dict[ChannelOffset, bytes] = field(default_factory=dict)
    reads: dict[ChannelOffset, asyncio.Future[bytes]] = field(default_factory=dict)

    async def read(self, where: ChannelOffset) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.reads[where] = future
        return await future

    def finish(self, where: ChannelOffset) -> None:
        self.reads[where].set_result(self.payloads[where])

    def fail(self, where: ChannelOffset) -> None:
        self.reads[where].set_exception(ChannelRecordGoneError("trimmed"))


@dataclass
class Appends:
    """The append seam: records each call, answers once the test says it is durable."""

    calls: list[tuple[str, int, ChannelOffset]] = field(default_factory=list)
    durable: dict[ChannelOffset, asyncio.Future[None]] = field(default_factory=dict)
    base: int = 0
    guards: list[int] = field(default_factory=list)

    def __call__(
        self, routed: RoutedPartition, where: ChannelOffset
    ) -> asyncio.Future[ProducePartitionAnswer]:
        self.calls.append((routed.topic, routed.partition.index, where))
        self.guards.append(routed.verification_guard)
        durable = self.durable[where] = asyncio.get_running_loop().create_future()
        base = self.base
        self.base += 1

        async def answer() -> ProducePartitionAnswer:
            await durable
            return ProducePartitionAnswer(routed.partition.index, 0, base, -1, 0)

        return asyncio.ensure_future(answer())

    def make_durable(self) -> None:
        for future in self.durable.values():
            if not future.done():
                future.set_result(None)


@dataclass
class Gate:
    fenced: int = -2
    in_flight: dict[int, int] = field(default_factory=dict)

    def begin(self, epoch: int, key: str | None = None) -> bool:
        if epoch <= self.fenced:
            return False
        self.in_flight[epoch] = self.in_flight.get(epoch, 0) + 1
        return True

    def end(self, epoch: int, key: str | None = None) -> None:
        self.in_flight[epoch] -= 1

    def tag(self, main_id: int, key: str | None = None) -> int:
        return 0


def request(offsets: list[ChannelOffset], epoch: int = 3) -> ZoneRouterRequest:
    return ZoneRouterRequest(RouterRecordV2(PROXY, tuple(offsets)).encode(), epoch, 1)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_one_hint_appends_in_arrival_order_whatever_order_the_reads_finish() -> None:
    channel, appends = Channel(), Appends()
    router = RouterIn(appends, channel.read, Gate(), stripes=16)
    first, second, other = offset(1, hint=5), offset(2, hint=5), offset(3, hint=6)
    channel.payloads = {first: payload("t", 0), second: payload("t", 0), other: payload("t", 1)}
    answer = router.admit(request([first, second, other]))
    await settle()
    channel.finish(second)
    channel.finish(other)
    await settle()
    # The second waits for the first of its hint; the other hint does not.
    assert [call[2] for call in appends.calls] == [other]
    channel.finish(first)
    await settle()
    assert [call[2] for call in appends.calls] == [other, first, second]
    appends.make_durable()
    response = await answer
    assert response.error_code == 0
    answers = [decode_produce_answer(data) for data in response.responses]
    # Answered in the request's entry order.
    assert [(a.index, a.base_offset) for a in answers] == [(0, 1), (0, 2), (1, 0)]


async def test_a_later_request_of_a_hint_waits_for_an_earlier_one() -> None:
    channel, appends = Channel(), Appends()
    router = RouterIn(appends, channel.read, Gate(), stripes=16)
    early, late = offset(1, hint=9), offset(2, hint=9)
    channel.payloads = {early: payload("t", 0), late: payload("t", 0)}
    answers = [router.admit(request([early])), router.admit(request([late]))]
    await settle()
    channel.finish(late)
    await settle()
    assert appends.calls == []
    channel.finish(early)
    await settle()
    assert [call[2] for call in appends.calls] == [early, late]
    appends.make_durable()
    assert [(await a).error_code for a in answers] == [0, 0]


async def test_a_fenced_epoch_is_refused_whole() -> None:
    channel, appends, gate = Channel(), Appends(), Gate(fenced=4)
    router = RouterIn(appends, channel.read, gate, stripes=16)
    response = await router.admit(request([offset(1, 1), offset(2, 2)], epoch=4))
    assert response.error_code == KafkaErrorCode.UNKNOWN_SERVER_ERROR.value
    assert response.responses == ()
    assert channel.reads == {} and appends.calls == [] and gate.in_flight == {}
    assert router.fenced == 1


async def test_an_admitted_request_is_in_flight_until_every_append_is_answered() -> None:
    channel, appends, gate = Channel(), Appends(), Gate()
    router = RouterIn(appends, channel.read, gate, stripes=16)
    where = offset(1, 1)
    channel.payloads = {where: payload("t", 0)}
    answer = router.admit(request([where], epoch=5))
    assert gate.in_flight == {5: 1}
    await settle()
    channel.finish(where)
    await settle()
    assert appends.calls and gate.in_flight == {5: 1}  # appended, not durable yet
    appends.make_durable()
    await answer
    assert gate.in_flight == {5: 0}


async def test_an_entry_whose_data_is_gone_or_broken_is_answered_alone() -> None:
    channel, appends = Channel(), Appends()
    router = RouterIn(appends, channel.read, Gate(), stripes=16)
    gone, broken, good = offset(1, 1), offset(2, 2), offset(3, 3)
    channel.payloads = {broken: b"\x01garbage", good: payload("t", 2)}
    answer = router.admit(request([gone, broken, good]))
    await settle()
    channel.fail(gone)
    channel.finish(broken)
    channel.finish(good)
    await settle()
    appends.make_durable()
    response = await answer
    codes = [decode_produce_answer(data).error_code for data in response.responses]
    unknown = KafkaErrorCode.UNKNOWN_SERVER_ERROR.value
    assert codes == [unknown, unknown, 0]
    assert [call[2] for call in appends.calls] == [good]


async def test_the_link_resolver_rebuilds_batches_at_the_link_s_offsets() -> None:
    records = build_record_batch([(b"k", b"a", (), 10), (b"k", b"b", (), 11)]) + build_record_batch(
        [(b"k", b"c", (), 12)]
    )
    stored = payload("t", 0, records)
    where = offset(1, 1)

    async def read(at: ChannelOffset) -> bytes:
        assert at == where
        return stored

    link = LinkRecord(
        last_offset=102,
        timestamp_type=0,
        max_timestamp=12,
        partition_leader_epoch=8,
        channel_offset=where,
    )
    data = await ProduceLinkResolver(read).resolve(link)
    views = list(iter_batches(data))
    assert [(v.base_offset, v.last_offset, v.partition_leader_epoch) for v in views] == [
        (100, 101, 8),
        (102, 102, 8),
    ]
    assert decode_routed(stored).partition.records is not None


async def test_a_payload_with_two_partitions_is_not_routed_data() -> None:
    with pytest.raises(Exception, match="partitions"):
        from automq_ref.formats.zone_router import RoutedProduceRequest, ZoneRouterPack
        from automq_ref.protocol.zone_router import encode_produce_request_body

        body = encode_produce_request_body(9, None, -1, 1, [("t", [(0, b"a"), (1, b"b")])])
        decode_routed(ZoneRouterPack((RoutedProduceRequest(9, 0, body),)).encode())


async def test_a_transactional_entry_is_verified_at_the_head_of_its_queue() -> None:
    """An entry that must be verified (KIP-890) holds its queue until the verification ends:
    then it is appended with the guard, or answered the error and not appended; the entries
    behind it follow in order, and other queues do not wait."""
    channel, appends = Channel(), Appends()
    verifying: dict[str, asyncio.Future[int | KafkaErrorCode]] = {}

    def verify(routed: RoutedPartition) -> asyncio.Future[int | KafkaErrorCode] | None:
        if bytes(routed.partition.records or b"") != b"begin":
            return None
        verifying[routed.topic] = asyncio.get_running_loop().create_future()
        return verifying[routed.topic]

    router = RouterIn(appends, channel.read, Gate(), stripes=16, verify=verify)
    first, second = offset(1, hint=5), offset(2, hint=5)
    refused, after = offset(3, hint=6), offset(4, hint=6)
    plain = offset(5, hint=7)
    channel.payloads = {
        first: payload("t", 0, b"begin"),
        second: payload("t", 0, b"more"),
        refused: payload("u", 1, b"begin"),
        after: payload("u", 1, b"more"),
        plain: payload("v", 2),
    }
    answer = router.admit(request([first, second, refused, after, plain]))
    await settle()
    for where in (after, second, refused, first, plain):
        channel.finish(where)
    await settle()
    assert set(verifying) == {"t", "u"}
    assert [call[2] for call in appends.calls] == [plain]  # the others wait
    verifying["t"].set_result(7)
    await settle()
    assert [call[2] for call in appends.calls] == [plain, first, second]
    assert appends.guards == [0, 7, 0]
    verifying["u"].set_result(KafkaErrorCode.INVALID_TXN_STATE)
    await settle()
    assert [call[2] for call in appends.calls] == [plain, first, second, after]
    appends.make_durable()
    response = await answer
    codes = [decode_produce_answer(data).error_code for data in response.responses]
    assert codes == [0, 0, KafkaErrorCode.INVALID_TXN_STATE.value, 0, 0]
