"""The zone router's proxy side (RouterOut): a Produce from a client of this broker's zone, for
partitions led in other zones, goes through this broker's RouterChannel instead of across zones.

Per partition of the request, in the request's order (at admission, so a connection's requests
keep their order), :func:`~automq_ref.kafka.zones.route_out` decides:

- **local** (this broker leads it, or nobody placed it): with
  ``automq.zonerouter.local.write.mode=direct``, or for a client that declares no zone,
  appended at once, as without the router (a transactional batch verified first, by the
  produce handler: the ``verified`` guards :meth:`RouterOut.route` is given); with
  ``router_channel`` (the default) appended to the channel too and then to the partition with a
  link record, through the main side's order queues (:class:`~automq_ref.kafka.zone_router_in.
  RouterIn`, which verifies transactional batches itself), counted in flight for its route
  epoch like a remote entry;
- **route** to the leader (this broker is the leader's proxy in this zone): the partition's
  records, as a Produce request body of the client's version holding that partition alone, in
  a ZoneRouterPack data block, are appended to the channel for the leader under the order hint
  ``hash(topic, partition, connection) mod 32767``; once durable the channel answers the route
  epoch they were tagged with and their :class:`ChannelOffset`;
- **NOT_LEADER_OR_FOLLOWER** otherwise (the client asks Metadata again and goes where it
  should).

Routed entries are sent per target broker (:class:`_Target`): in admission order, each joins
the open batch once its channel append is done; a batch closes after ``LINGER_S`` (100 us) or
at ``MAX_BATCH_ENTRIES`` (8192), and at most ``MAX_IN_FLIGHT_BATCHES`` (64) batches per target
are in flight. A batch becomes one ``AutomqZoneRouterRequest`` (v1, a RouterRecordV2 of its
channel offsets) per route epoch, oldest epoch first, written on the target's
:class:`~automq_ref.kafka.broker_link.BrokerLink` in order. The answers (a ProduceResponse per
entry, in entry order) are merged into the client's ProduceResponse. Whatever goes wrong on
the way (the channel append failed, no answer, the leader's ``UNKNOWN_SERVER_ERROR``, which is
what a fenced route epoch gets) is answered ``LEADER_NOT_AVAILABLE``, so that the client
retries; an idempotent producer's retry is deduplicated by the leader. With ``acks=0`` the
client gets nothing and the routes go on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.zone_router import (
    ORDER_HINT_MODULUS,
    ChannelOffset,
    RoutedProduceRequest,
    RouterRecordV2,
    ZoneRouterPack,
)
from automq_ref.kafka.broker_link import BrokerLink, BrokerLinkError
from automq_ref.kafka.handlers.produce import admit_partition, answer_partition, produce_answer
from automq_ref.kafka.listeners import Connect
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Chunks, Reply
from automq_ref.kafka.zone_router_in import EpochGate, Located, RouterIn
from automq_ref.kafka.zones import Route, client_zone, proxy_mapping, route_out
from automq_ref.protocol.produce_response import ProducePartitionAnswer
from automq_ref.protocol.zone_router import (
    ROUTER_RECORD_VERSION,
    ZONE_ROUTER_MAX_VERSION,
    ZoneRouterRequest,
    ZoneRouterResponse,
    decode_produce_answer,
    encode_produce_request_body,
)
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import is_internal_topic

log = logging.getLogger(__name__)

LINGER_S: Final = 100e-6
MAX_BATCH_ENTRIES: Final = 8192
MAX_IN_FLIGHT_BATCHES: Final = 64
DIRECT: Final = "direct"


class Channel(Protocol):
    """What the proxy needs of its RouterChannel."""

    async def append(
        self, target_node: int, order_hint: int, payload: bytes
    ) -> tuple[int, ChannelOffset]: ...


class Sender(Protocol):
    """How a batch reaches its target broker (a :class:`BrokerLink`)."""

    async def call(self, version: int, request: ZoneRouterRequest) -> ZoneRouterResponse: ...


def order_hint(topic: str, partition: int, connection_id: int) -> int:
    """The order hint of a connection's records for one partition (same inputs, same hint)."""
    key = f"{topic}\x00{partition}\x00{connection_id}".encode()
    return zlib.crc32(key) % ORDER_HINT_MODULUS


def routed_pack(
    api_version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topic: str,
    index: int,
    records: bytes | memoryview | None,
) -> bytes:
    """The channel payload of one routed partition: a ZoneRouterPack data block holding a
    Produce request body of the client's version with that partition alone."""
    body = encode_produce_request_body(
        api_version, transactional_id, acks, timeout_ms, [(topic, [(index, records)])]
    )
    return ZoneRouterPack((RoutedProduceRequest(api_version, 0, body),)).encode()


def _unavailable(index: int) -> ProducePartitionAnswer:
    return ProducePartitionAnswer(index, KafkaErrorCode.LEADER_NOT_AVAILABLE.value)


@dataclass(slots=True)
class _Routed:
    """One partition routed to a remote leader."""

    index: int
    appended: asyncio.Future[tuple[int, ChannelOffset]]
    answer: asyncio.Future[ProducePartitionAnswer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, answer: ProducePartitionAnswer) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)


class _Target:
    """The entries routed to one broker: batched, sent, answered (module docstring)."""

    def __init__(self, out: RouterOut, node_id: int) -> None:
        self._out = out
        self.node_id = node_id
        self._pending: collections.deque[_Routed] = collections.deque()
        self._batch: dict[int, list[_Routed]] | None = None
        self._batch_size = 0
        self._closed: collections.deque[dict[int, list[_Routed]]] = collections.deque()
        self.in_flight = 0
        self.sent_requests = 0

    def submit(self, entry: _Routed) -> None:
        self._pending.append(entry)
        entry.appended.add_done_callback(lambda _: self._pump())

    def _pump(self) -> None:
        while self._pending and self._pending[0].appended.done():
            entry = self._pending.popleft()
            appended = entry.appended
            if appended.cancelled() or appended.exception() is not None:
                error = "cancelled" if appended.cancelled() else appended.exception()
                log.error("zone router: channel append for node %d failed: %s", self.node_id, error)
                entry.settle(_unavailable(entry.index))
                continue
            epoch, _ = appended.result()
            if self._batch is None:
                batch: dict[int, list[_Routed]] = {}
                self._batch, self._batch_size = batch, 0
                asyncio.get_running_loop().call_later(LINGER_S, self._lingered, batch)
            self._batch.setdefault(epoch, []).append(entry)
            self._batch_size += 1
            if self._batch_size >= MAX_BATCH_ENTRIES:
                self._close_batch()
        self._send()

    def _lingered(self, batch: dict[int, list[_Routed]]) -> None:
        if self._batch is batch:
            self._close_batch()
            self._send()

    def _close_batch(self) -> None:
        if self._batch:
            self._closed.append(self._batch)
        self._batch, self._batch_size = None, 0

    def _send(self) -> None:
        while self._closed and self.in_flight < MAX_IN_FLIGHT_BATCHES:
            batch = self._closed.popleft()
            self.in_flight += 1
            # Each request is written before the next batch's (the link's FIFO): in order.
            calls = [
                asyncio.ensure_future(self._send_epoch(epoch, batch[epoch]))
                for epoch in sorted(batch)
            ]
            done = asyncio.gather(*calls)
            done.add_done_callback(self._sent)

    def _sent(self, _: Any) -> None:
        self.in_flight -= 1
        self._send()

    async def _send_epoch(self, epoch: int, entries: list[_Routed]) -> None:
        record = RouterRecordV2(
            self._out.node_id, tuple(entry.appended.result()[1] for entry in entries)
        )
        request = ZoneRouterRequest(record.encode(), epoch, ROUTER_RECORD_VERSION)
        self.sent_requests += 1
        try:
            sender = self._out.sender(self.node_id)
            if sender is None:
                raise BrokerLinkError(f"broker {self.node_id} has no known listener")
            response = await sender.call(ZONE_ROUTER_MAX_VERSION, request)
        except Exception as error:  # no answer (or a broken one): the client retries
            log.warning("zone router: request to node %d failed: %s", self.node_id, error)
            for entry in entries:
                entry.settle(_unavailable(entry.index))
            return
        code = response.error_code
        if code != KafkaErrorCode.NONE.value or len(response.responses) != len(entries):
            if code == KafkaErrorCode.NONE.value:
                log.error(
                    "zone router: node %d answered %d entries of %d",
                    self.node_id,
                    len(response.responses),
                    len(entries),
                )
            if code in (KafkaErrorCode.UNKNOWN_SERVER_ERROR.value, KafkaErrorCode.NONE.value):
                code = KafkaErrorCode.LEADER_NOT_AVAILABLE.value
            for entry in entries:
                entry.settle(ProducePartitionAnswer(entry.index, code))
            return
        for entry, data in zip(entries, response.responses, strict=True):
            try:
                answer = decode_produce_answer(data)
            except Exception as error:
                log.error("zone router: node %d's answer does not decode: %s", self.node_id, error)
                entry.settle(_unavailable(entry.index))
                continue
            code = answer.error_code
            if code == KafkaErrorCode.UNKNOWN_SERVER_ERROR.value:
                code = KafkaErrorCode.LEADER_NOT_AVAILABLE.value
            entry.settle(
                ProducePartitionAnswer(
                    entry.index,
                    code,
                    answer.base_offset,
                    answer.log_append_time_ms,
                    answer.log_start_offset,
                    answer.error_message,
                )
            )


class RouterOut:
    """This broker's proxy side (module docstring)."""

    def __init__(
        self,
        *,
        node_id: int,
        zone: str,
        local_write_mode: str,
        channel: Channel,
        router_in: RouterIn,
        route_epochs: EpochGate | None,
        sender: Callable[[int], Sender | None],
        links: Mapping[int, BrokerLink] | None = None,
    ) -> None:
        self.node_id = node_id
        self.zone = zone
        self.direct = local_write_mode == DIRECT
        self._channel = channel
        self._router_in = router_in
        self._route_epochs = route_epochs
        self.sender = sender
        # The links ``sender`` hands out (by target), whose bytes cross zones: the metrics'.
        self.links = {} if links is None else links
        self.targets: dict[int, _Target] = {}
        self._background: set[asyncio.Future[Any]] = set()
        # (topic, partition, target) already logged as routed: one line each, so an operator
        # (and make cluster's test) can tell from the log which partitions went through here.
        self._announced: set[tuple[str, int, int]] = set()

    def appends_at_once(self, context: Context, request: Request) -> bool:
        """Whether the partitions of ``request`` led here are appended at once (direct mode,
        or a client that declares no zone), not through the channel."""
        config = context.config
        return (
            self.direct
            or client_zone(request.client_id, request.peer.host, config.zone_cidr_blocks) is None
        )

    def route(
        self,
        context: Context,
        request: Request,
        body: Any,
        verified: Mapping[tuple[str, int], int | KafkaErrorCode] | None = None,
    ) -> Reply:
        """Admit a client's Produce (the produce handler's admission, with the router on).
        ``verified``: per partition, the verification guard of its transactional batch (one
        appended at once), or the error it is answered (its verification's, or its
        authorization's: routed or not)."""
        image = context.topics.view.image
        zone = client_zone(request.client_id, request.peer.host, context.config.zone_cidr_blocks)
        mapping = proxy_mapping(image.brokers.values())
        acks = body.acks
        answers: list[tuple[str, list[Awaitable[ProducePartitionAnswer]]]] = []
        for topic_data in body.topic_data:
            name = topic_data.name
            pending: list[Awaitable[ProducePartitionAnswer]] = []
            for partition_data in topic_data.partition_data:
                index, records = partition_data.index, partition_data.records
                assignment = sm.partition_assignment(image, name, index)
                leader = None if assignment is None else assignment.leader
                leader_broker = None if leader is None else image.brokers.get(leader)
                decision = route_out(
                    node_id=self.node_id,
                    zone=self.zone,
                    client_zone=zone,
                    leader=leader,
                    leader_zone=None if leader_broker is None else leader_broker.rack,
                    mapping=mapping,
                )
                guard = (verified or {}).get((name, index), 0)
                refused = guard if isinstance(guard, KafkaErrorCode) else _refusal(acks, name)
                if refused is not None or decision.route is Route.NOT_LEADER_OR_FOLLOWER:
                    code = refused or KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
                    pending.append(_ready(ProducePartitionAnswer(index, code.value)))
                    continue
                hint = order_hint(name, index, request.peer.connection_id)
                # A client that declares no zone writing to this partition's leader is appended
                # here at once, whatever the local write mode: the mode is for zoned clients
                # (a zoneless one is not routed, so the channel would only add its latency).
                if decision.route is Route.LOCAL and (
                    self.direct or leader is None or zone is None
                ):
                    outcome = admit_partition(
                        context, name, index, records, acks, verification_guard=int(guard)
                    )
                    pending.append(asyncio.ensure_future(answer_partition(name, index, outcome)))
                    continue
                payload = routed_pack(
                    request.api_version,
                    body.transactional_id,
                    acks,
                    body.timeout_ms,
                    name,
                    index,
                    records,
                )
                if decision.route is Route.LOCAL:
                    pending.append(self.write_local(index, hint, payload))
                else:
                    assert decision.target is not None
                    self._announce(name, index, decision.target, zone)
                    pending.append(self.send_routed(decision.target, index, hint, payload))
            answers.append((name, pending))
        if acks == 0:
            for _, pending in answers:
                for waiting in pending:
                    if isinstance(waiting, asyncio.Future):
                        self._keep(waiting)
            return None
        return _answer(request, answers)

    def _announce(self, topic: str, index: int, target: int, client_zone: str | None) -> None:
        if (topic, index, target) not in self._announced:
            self._announced.add((topic, index, target))
            log.info(
                "zone router: routing %s-%d to its leader, node %d, for clients of zone %s",
                topic,
                index,
                target,
                client_zone,
            )

    def _keep(self, future: asyncio.Future[Any]) -> None:
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    def send_routed(
        self, target: int, index: int, hint: int, payload: bytes
    ) -> asyncio.Future[ProducePartitionAnswer]:
        """Route one partition's payload to ``target``: appended to the channel, then batched
        and sent in admission order; the future is its answer."""
        appended = asyncio.ensure_future(self._channel.append(target, hint, payload))
        entry = _Routed(index, appended)
        if self._route_epochs is not None:
            appended.add_done_callback(lambda done: self._tag(done, target))
        routed = self.targets.get(target)
        if routed is None:
            routed = self.targets[target] = _Target(self, target)
        routed.submit(entry)
        return entry.answer

    def _tag(self, done: asyncio.Future[tuple[int, ChannelOffset]], target: int) -> None:
        if self._route_epochs is not None and not done.cancelled() and done.exception() is None:
            self._route_epochs.tag(target)

    def write_local(
        self, index: int, hint: int, payload: bytes
    ) -> asyncio.Future[ProducePartitionAnswer]:
        """router_channel mode, a partition led here: through the channel, then appended in
        the main side's order queue with its link."""
        epoch_box: list[int] = []
        located = asyncio.ensure_future(self._append_local(hint, payload, epoch_box))
        entry = self._router_in.enqueue(hint, located)
        answer: asyncio.Future[ProducePartitionAnswer] = asyncio.get_running_loop().create_future()

        def finish(done: asyncio.Future[ProducePartitionAnswer]) -> None:
            if epoch_box and self._route_epochs is not None:
                self._route_epochs.end(epoch_box[0])
            result = done.result()
            code = result.error_code
            if code == KafkaErrorCode.UNKNOWN_SERVER_ERROR.value:
                code = KafkaErrorCode.LEADER_NOT_AVAILABLE.value
            answer.set_result(
                ProducePartitionAnswer(
                    index,
                    code,
                    result.base_offset,
                    result.log_append_time_ms,
                    result.log_start_offset,
                    result.error_message,
                )
            )

        entry.answer.add_done_callback(finish)
        return answer

    async def _append_local(self, hint: int, payload: bytes, epoch_box: list[int]) -> Located:
        epoch, offset = await self._channel.append(self.node_id, hint, payload)
        if self._route_epochs is not None:
            if not self._route_epochs.begin(epoch):
                raise RuntimeError(f"route epoch {epoch} is fenced")
            epoch_box.append(epoch)
        return offset, payload


def _refusal(acks: int, topic: str) -> KafkaErrorCode | None:
    if acks not in (-1, 0, 1):
        return KafkaErrorCode.INVALID_REQUIRED_ACKS
    if is_internal_topic(topic):
        return KafkaErrorCode.INVALID_TOPIC_EXCEPTION
    return None


def _ready(answer: ProducePartitionAnswer) -> Awaitable[ProducePartitionAnswer]:
    future: asyncio.Future[ProducePartitionAnswer] = asyncio.get_running_loop().create_future()
    future.set_result(answer)
    return future


async def _answer(
    request: Request, answers: list[tuple[str, list[Awaitable[ProducePartitionAnswer]]]]
) -> Chunks:
    topics = [(name, [await waiting for waiting in pending]) for name, pending in answers]
    return produce_answer(request, topics)


_closing: set[asyncio.Future[None]] = set()


def link_sender(
    links: dict[int, BrokerLink],
    image: Callable[[], sm.StreamMetadataImage],
    node_id: int,
    address: Callable[[sm.BrokerRegistration], tuple[str, int] | None],
    connect: Connect | None = None,
) -> Callable[[int], BrokerLink | None]:
    """The sender for each target: a :class:`BrokerLink` to the target's ``address`` (its
    inter-broker listener), made again when that address changes."""

    def sender(target: int) -> BrokerLink | None:
        broker = image().brokers.get(target)
        found = None if broker is None else address(broker)
        if found is None:
            return None
        link = links.get(target)
        if link is None or (link.host, link.port) != found:
            if link is not None:
                closing = asyncio.ensure_future(link.close())
                _closing.add(closing)
                closing.add_done_callback(_closing.discard)
            link = links[target] = BrokerLink(*found, f"automq-ref-router-{node_id}", connect)
        return link

    return sender
