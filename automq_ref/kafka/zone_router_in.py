"""The zone router's main side (RouterIn): a partition's leader appends the produce data a proxy
in another zone routed to it through the proxy's RouterChannel, and answers each entry with the
ProduceResponse of that append.

An ``AutomqZoneRouterRequest`` (v1) carries a RouterRecordV2 (the proxy's channel offsets, one
per routed partition) and the route epoch the proxy tagged them with. At admission, in the
connection's order:

1. the route epoch passes the fence check (:meth:`RouteEpochNode.begin`), or the whole request
   is answered ``UNKNOWN_SERVER_ERROR`` (AutoMQ's answer to a fenced epoch; the proxy turns it
   into ``LEADER_NOT_AVAILABLE`` and the client retries) and nothing is appended; an admitted
   request counts in flight for its epoch until every entry's append is durable (or failed);
2. each entry's payload is read from the proxy's channel (a ranged GET, read-only; this node's
   own channel answers from its cache), all at once, and the entry joins the FIFO queue of its
   order hint (``order_hint mod STRIPES``);
3. a queue appends its head entries, in queue order, as soon as their payloads are there: the
   appends of one hint are issued in arrival order whatever order the reads finish in, so a
   connection's records for one partition keep their order (the hint is a hash of the topic,
   the partition and the client's connection).

An append decodes the payload (a ZoneRouterPack data block holding one Produce request body
for one partition) and admits it as a client's produce would be
(:func:`~automq_ref.kafka.handlers.produce.admit_partition`: leadership, sequence checks of
idempotent producers, sizes), with acks = -1 whatever the client asked (the data must be
durable before the epoch can be committed) and the channel offset, so that the partition's WAL
holds a link record and its LogCache the data. An entry whose payload cannot be read or decoded
is answered ``UNKNOWN_SERVER_ERROR`` on its own. A transactional batch that would begin a
transaction at its partition is verified with the transaction coordinator first (KIP-890, as
Produce does: :func:`verify_routed`), at the head of its queue: the entries behind it wait, so
its append still comes before theirs, and it is admitted with the verification's guard (or
answered the verification's error).

:class:`ProduceLinkResolver` is the other half of the link records: recovery (a restart, or a
failover target) reads the channel record a link points to and rebuilds the stored batch from
it, at the offsets and leader epoch the link record carries.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.record_batch import iter_batches
from automq_ref.formats.zone_router import (
    ChannelOffset,
    LinkRecord,
    RouterRecordV2,
    ZoneRouterPack,
)
from automq_ref.io.storage.router_channel import ChannelUnavailableError
from automq_ref.kafka.handlers.produce import admit_partition, answer_partition
from automq_ref.kafka.handlers.transactions import verify_produce
from automq_ref.kafka.request import Context
from automq_ref.protocol.produce import PartitionProduceData, decode_produce_request
from automq_ref.protocol.produce_response import ProducePartitionAnswer
from automq_ref.protocol.zone_router import (
    ZoneRouterRequest,
    ZoneRouterResponse,
    encode_produce_answer,
)

log = logging.getLogger(__name__)

STRIPES_PER_CPU: Final = 64
MAX_STRIPES: Final = 1 << 16
READ_ATTEMPTS: Final = 3
READ_RETRY_S: Final = 0.2
INTERNAL_TOPICS_ALLOWED: Final = 1  # the pack's flag bit

ChannelRead = Callable[[ChannelOffset], Awaitable[bytes]]


class EpochGate(Protocol):
    """What the router needs of the route epochs (a
    :class:`~automq_ref.io.storage.route_epoch_node.RouteEpochNode`)."""

    def begin(self, epoch: int, key: str | None = None) -> bool: ...

    def end(self, epoch: int, key: str | None = None) -> None: ...

    def tag(self, main_id: int, key: str | None = None) -> int: ...


class RoutedDataError(Exception):
    """A channel payload is not one routed produce of one partition."""


@dataclass(frozen=True, slots=True)
class RoutedPartition:
    """What one channel payload holds: one partition's records of a client's produce (and,
    once verified here, the guard it is admitted with)."""

    api_version: int
    flag: int
    acks: int
    timeout_ms: int
    topic: str
    partition: PartitionProduceData
    transactional_id: str | None = None
    verification_guard: int = 0


def decode_routed(payload: bytes) -> RoutedPartition:
    """The one partition a channel payload routes; raises :class:`RoutedDataError`."""
    try:
        pack = ZoneRouterPack.decode(payload)
        if len(pack.requests) != 1:
            raise RoutedDataError(f"the data block holds {len(pack.requests)} requests, not 1")
        routed = pack.requests[0]
        body = decode_produce_request(routed.body, routed.api_version)
    except FormatError as error:
        raise RoutedDataError(str(error)) from error
    partitions = [(t.name, p) for t in body.topic_data for p in t.partition_data]
    if len(partitions) != 1:
        raise RoutedDataError(f"the request holds {len(partitions)} partitions, not 1")
    topic, partition = partitions[0]
    return RoutedPartition(
        routed.api_version,
        routed.flag,
        body.acks,
        body.timeout_ms,
        topic,
        partition,
        body.transactional_id,
    )


class ProduceLinkResolver:
    """Recovery's :class:`~automq_ref.io.storage.s3stream.LinkResolver` for Kafka partitions:
    the batches a link record stands for, read from the channel and given the base offsets
    (ending at the link's last offset) and leader epoch the leader stored them with."""

    def __init__(self, read: ChannelRead) -> None:
        self._read = read

    async def resolve(self, link: LinkRecord) -> bytes:
        routed = decode_routed(await _read_retrying(self._read, link.channel_offset))
        if routed.partition.records is None:
            raise RoutedDataError("the routed partition has no records")
        data = bytearray(routed.partition.records)
        views = list(iter_batches(data))
        offset = link.last_offset + 1 - sum(view.last_offset_delta + 1 for view in views)
        for view in views:
            view.set_base_offset(offset)
            view.set_partition_leader_epoch(link.partition_leader_epoch)
            offset += view.last_offset_delta + 1
        return bytes(data)


async def _read_retrying(read: ChannelRead, where: ChannelOffset) -> bytes:
    for attempt in range(READ_ATTEMPTS):
        try:
            return await read(where)
        except ChannelUnavailableError:
            if attempt == READ_ATTEMPTS - 1:
                raise
            await asyncio.sleep(READ_RETRY_S * (attempt + 1))
    raise AssertionError("unreachable")


# An entry's data once it is there: where it lies in the channel, and the payload.
Located = tuple[ChannelOffset, bytes]


@dataclass(slots=True)
class Entry:
    """One routed partition queued at the main: its order hint, its data (a future: read from
    the channel, or being appended to this node's own), its answer."""

    order_hint: int
    data: asyncio.Future[Located]
    answer: asyncio.Future[ProducePartitionAnswer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    topic: str = ""
    owner: int = -1
    routed: RoutedPartition | None = None  # decoded once its data is there
    verifying: asyncio.Future[int | KafkaErrorCode] | None = None


# Admit one routed partition now (in queue order) and answer it once durable.
Admit = Callable[[RoutedPartition, ChannelOffset], Awaitable[ProducePartitionAnswer]]
# Whether a routed partition must be verified before it is admitted: None if not (decided at
# once), else the verification (its guard, or the error the entry is answered).
Verify = Callable[[RoutedPartition], Awaitable[int | KafkaErrorCode] | None]


def admit_routed(context: Context) -> Admit:
    """The append of a routed partition on this broker: admitted as a client's produce of it
    would be (:func:`~automq_ref.kafka.handlers.produce.admit_partition`), with acks = -1 (it
    must be durable before its route epoch can be committed) and its channel offset (the WAL
    gets a link record)."""

    def admit(routed: RoutedPartition, offset: ChannelOffset) -> Awaitable[ProducePartitionAnswer]:
        outcome = admit_partition(
            context,
            routed.topic,
            routed.partition.index,
            routed.partition.records,
            -1,
            internal_allowed=bool(routed.flag & INTERNAL_TOPICS_ALLOWED),
            channel_offset=offset,
            verification_guard=routed.verification_guard,
        )
        return answer_partition(routed.topic, routed.partition.index, outcome)

    return admit


def verify_routed(context: Context) -> Verify:
    """KIP-890's verification of a routed partition whose first batch is transactional and
    would begin a transaction at its partition (led here), as Produce verifies a client's
    (:func:`~automq_ref.kafka.handlers.transactions.verify_produce`)."""

    def verify(routed: RoutedPartition) -> Awaitable[int | KafkaErrorCode] | None:
        partition = context.topics.partitions.get((routed.topic, routed.partition.index))
        if partition is None or not routed.partition.records:
            return None
        try:
            first = next(iter_batches(routed.partition.records))
        except Exception:  # the append answers the malformed batch
            return None
        if not first.is_transactional:
            return None
        header = first.header()
        if not partition.transaction_needs_verification(header.producer_id, header.producer_epoch):
            return None
        return verify_produce(
            context,
            routed.api_version,
            routed.transactional_id,
            partition,
            header.producer_id,
            header.producer_epoch,
        )

    return verify


class RouterIn:
    """This broker's main side (module docstring). ``admit`` appends one routed partition
    (:func:`admit_routed`); ``read`` reads a channel payload (this node's RouterChannel's
    ``read``: its cache, else any node's channel); ``route_epochs`` is None outside a cluster
    (every epoch admitted); ``verify`` (:func:`verify_routed`) verifies a transactional entry
    before it is admitted."""

    def __init__(
        self,
        admit: Admit,
        read: ChannelRead,
        route_epochs: EpochGate | None,
        stripes: int | None = None,
        verify: Verify | None = None,
    ) -> None:
        self._admit = admit
        self._verify = verify
        self._read = read
        self._route_epochs = route_epochs
        self._stripes = stripes or min(MAX_STRIPES, (os.cpu_count() or 1) * STRIPES_PER_CPU)
        self._queues: dict[int, collections.deque[Entry]] = {}
        self.admitted = 0
        self.fenced = 0
        # AutomqZoneRouter frames taken and answered (size prefixes included): the requests of
        # proxies in other zones and the answers sent back (counted by the dispatcher).
        self.bytes_in = 0
        self.bytes_out = 0

    # ----------------------------------------------------------------- remote requests

    def admit(self, request: ZoneRouterRequest) -> Awaitable[ZoneRouterResponse]:
        """Admit a proxy's request (in its connection's order); the awaitable is its answer."""
        try:
            record = RouterRecordV2.decode(request.metadata)
        except FormatError as error:
            log.error("zone router request: %s", error)
            return _ready(ZoneRouterResponse(KafkaErrorCode.UNKNOWN_SERVER_ERROR.value))
        epoch = request.route_epoch
        if self._route_epochs is not None and not self._route_epochs.begin(epoch):
            self.fenced += 1
            log.warning(
                "zone router request from node %d refused: its route epoch %d is fenced",
                record.proxy_node_id,
                epoch,
            )
            return _ready(ZoneRouterResponse(KafkaErrorCode.UNKNOWN_SERVER_ERROR.value))
        self.admitted += 1
        entries = [
            self.enqueue(offset.order_hint, asyncio.ensure_future(self._located(offset)))
            for offset in record.channel_offsets
        ]
        # A task: the epoch's in-flight count ends however the connection goes.
        task = asyncio.get_running_loop().create_task(self._respond(entries, epoch))
        return asyncio.shield(task)

    async def _located(self, offset: ChannelOffset) -> Located:
        return offset, await _read_retrying(self._read, offset)

    async def _respond(self, entries: list[Entry], epoch: int) -> ZoneRouterResponse:
        try:
            answers = [await entry.answer for entry in entries]
        finally:
            if self._route_epochs is not None:
                self._route_epochs.end(epoch)
        return ZoneRouterResponse(
            KafkaErrorCode.NONE.value,
            tuple(
                encode_produce_answer(entry.topic, answer)
                for entry, answer in zip(entries, answers, strict=True)
            ),
        )

    # ------------------------------------------------------------------ the order queues

    def enqueue(self, order_hint: int, data: asyncio.Future[Located]) -> Entry:
        """Queue one entry behind the earlier ones of its order hint; it is appended once its
        data is there and every earlier entry of its queue was appended. (The proxy side
        queues its own router_channel-mode local writes here too.)"""
        entry = Entry(order_hint, data)
        stripe = (order_hint & 0xFFFF) % self._stripes
        queue = self._queues.setdefault(stripe, collections.deque())
        queue.append(entry)
        data.add_done_callback(lambda _: self._drain(stripe))
        return entry

    def _drain(self, stripe: int) -> None:
        queue = self._queues.get(stripe)
        while queue and queue[0].data.done():
            entry = queue[0]
            try:
                if not self._ready(entry, stripe):
                    return  # its verification is under way: the queue waits for it
                queue.popleft()
                self._append(entry)
            except Exception as error:  # a bug: answered, never left hanging
                if queue and queue[0] is entry:
                    queue.popleft()
                log.exception("zone router append failed")
                self._fail(entry, f"append failed: {error}")
        if queue is not None and not queue:
            del self._queues[stripe]

    def _ready(self, entry: Entry, stripe: int) -> bool:
        """Whether the head entry (its data there) may be appended now: decoded, and verified
        if it must be (the verification starts here and drains the queue again when done)."""
        data = entry.data
        if data.cancelled() or data.exception() is not None or entry.verifying is not None:
            return entry.verifying is None or entry.verifying.done()
        if entry.routed is None:
            offset, payload = data.result()
            entry.owner = offset.channel_owner
            try:
                entry.routed = decode_routed(payload)
            except RoutedDataError:
                return True  # _append answers it
            entry.topic = entry.routed.topic
            verification = None if self._verify is None else self._verify(entry.routed)
            if verification is not None:
                entry.verifying = asyncio.ensure_future(verification)
                entry.verifying.add_done_callback(lambda _: self._drain(stripe))
                return False
        return True

    def _append(self, entry: Entry) -> None:
        data = entry.data
        if data.cancelled() or data.exception() is not None:
            error = "cancelled" if data.cancelled() else data.exception()
            self._fail(entry, f"its data from the channel: {error}")
            return
        offset, payload = data.result()
        entry.owner = offset.channel_owner
        routed = entry.routed
        if routed is None:
            try:
                routed = decode_routed(payload)
            except RoutedDataError as error:
                self._fail(entry, f"its channel data: {error}")
                return
        entry.topic = routed.topic
        verifying = entry.verifying
        if verifying is not None:
            if verifying.cancelled() or verifying.exception() is not None:
                failure = "cancelled" if verifying.cancelled() else verifying.exception()
                self._fail(entry, f"its transaction's verification: {failure}")
                return
            verified = verifying.result()
            if isinstance(verified, KafkaErrorCode):
                index = routed.partition.index
                entry.answer.set_result(ProducePartitionAnswer(index, verified.value))
                return
            routed = dataclasses.replace(routed, verification_guard=verified)
        task = asyncio.ensure_future(self._admit(routed, offset))
        task.add_done_callback(lambda done: _settle(entry, done))

    def _fail(self, entry: Entry, reason: str) -> None:
        log.error("zone router entry (hint %d): %s", entry.order_hint, reason)
        if not entry.answer.done():
            entry.answer.set_result(
                ProducePartitionAnswer(-1, KafkaErrorCode.UNKNOWN_SERVER_ERROR.value)
            )


def _settle(entry: Entry, done: asyncio.Future[ProducePartitionAnswer]) -> None:
    if entry.answer.done():
        return
    if done.cancelled() or done.exception() is not None:
        entry.answer.set_result(
            ProducePartitionAnswer(-1, KafkaErrorCode.UNKNOWN_SERVER_ERROR.value)
        )
    else:
        entry.answer.set_result(done.result())


def _ready(response: ZoneRouterResponse) -> Awaitable[ZoneRouterResponse]:
    future: asyncio.Future[ZoneRouterResponse] = asyncio.get_running_loop().create_future()
    future.set_result(response)
    return future
