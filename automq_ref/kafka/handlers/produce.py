"""Produce: records appended to partitions, answered when durable.

Admission (in request order) validates each partition's batches and assigns their offsets
(:meth:`Partition.append_nowait`); the answer waits for the WAL writes to be durable, in the
awaitable returned, so that a connection pipelines many produces into one fsync. With
``acks=0`` there is no answer. Internal topics (``__consumer_offsets``) are refused
``INVALID_TOPIC_EXCEPTION``, as Kafka refuses clients' appends to them. The request is decoded
and the response encoded by hand (:mod:`automq_ref.protocol`): this is the busiest path.

A partition placed on this broker but not open yet (moved here, its open waiting for the old
broker's or a failover's close) holds the request's admission for the open, up to
``partition.open.wait.ms`` and never past the request's timeout: the records are appended only
once it is open, at its new leader epoch, and the connection's later requests stay behind them;
one still not open is answered ``NOT_LEADER_OR_FOLLOWER``. A partition this broker is not
placed on is answered at once.

A transactional Produce whose batch would begin a transaction at a partition is first verified
with the transaction coordinator (KIP-890,
:func:`automq_ref.kafka.handlers.transactions.verify_produce`): the batch is admitted only if
the partition is in the producer's ongoing transaction, so a late write of a transaction that
ended cannot open a transaction nobody will end.

With the zone router on, the request goes to the router's proxy side
(:mod:`automq_ref.kafka.zone_router_out`), which decides per partition where it goes and uses
:func:`admit_partition` and :func:`answer_partition` for what it appends here.

With an authorizer, as Kafka's ``handleProduceRequest``: a transactional Produce without WRITE
on its transactional id is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition,
and a partition of a topic the principal may not WRITE is TOPIC_AUTHORIZATION_FAILED, before
anything else is checked.
"""

from __future__ import annotations

import logging
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import iter_batches
from automq_ref.formats.zone_router import ChannelOffset
from automq_ref.io.storage.s3stream import StorageError, StreamFencedError
from automq_ref.kafka.compaction import is_compacted
from automq_ref.kafka.handlers.authorize import AclOperation, ResourceType, allowed, denied
from automq_ref.kafka.handlers.transactions import verify_produce
from automq_ref.kafka.log_state import ProduceResult
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Answer, Chunks, CloseConnection, Reply
from automq_ref.protocol.produce_response import (
    ProducePartitionAnswer,
    encode_produce_response,
)
from automq_ref.state_machines.quota import PRODUCER_BYTE_RATE
from automq_ref.vocabulary.naming import is_internal_topic

log = logging.getLogger(__name__)

# One partition's admission: an error code (refused), or the partition and its append's result.
Outcome = KafkaErrorCode | tuple[Partition, ProduceResult]
# Per topic, per partition: its outcome.
Outcomes = list[tuple[str, list[tuple[int, Any]]]]


async def handle_produce(context: Context, request: Request) -> Reply:
    body = request.body
    if request.api_version < 3:
        raise CloseConnection(f"Produce v{request.api_version} is not supported (v3+)")
    acks = body.acks
    refused = _refused(context, request, body) if context.acls is not None else {}
    await _hold_for_opening(context, body)
    throttle_ms = 0
    if context.quotas is not None:
        size = sum(len(p.records or b"") for topic in body.topic_data for p in topic.partition_data)
        throttle_ms = context.quotas.throttle_ms(
            PRODUCER_BYTE_RATE, request.peer, request.client_id, size
        )
    if context.router_out is not None:
        # The zone router decides, per partition, here, through the channel, or refused; what
        # it appends here at once is verified here first (what goes through the channel is
        # verified where it is appended, zone_router_in.verify_routed).
        router = context.router_out
        verified = (
            await _verify(context, request.api_version, body, refused)
            if body.transactional_id is not None and router.appends_at_once(context, request)
            else refused
        )
        if context.quotas is not None:
            await context.quotas.throttled(request, throttle_ms)
        return router.route(context, request, body, verified)
    verified = (
        await _verify(context, request.api_version, body, refused)
        if body.transactional_id is not None
        else refused
    )
    outcomes: Outcomes = []
    for topic_data in body.topic_data:
        results: list[tuple[int, Any]] = []
        for partition_data in topic_data.partition_data:
            guard = verified.get((topic_data.name, partition_data.index), 0)
            outcome = (
                guard
                if isinstance(guard, KafkaErrorCode)
                else admit_partition(
                    context,
                    topic_data.name,
                    partition_data.index,
                    partition_data.records,
                    acks,
                    verification_guard=guard,
                )
            )
            results.append((partition_data.index, outcome))
        outcomes.append((topic_data.name, results))
    if acks == 0:
        if context.quotas is not None:
            await context.quotas.throttled(request, throttle_ms)
        return None
    return _answer(context, request, outcomes, throttle_ms)


def admit_partition(
    context: Context,
    topic: str,
    index: int,
    records: bytes | memoryview | None,
    acks: int,
    *,
    internal_allowed: bool = False,
    channel_offset: ChannelOffset | None = None,
    verification_guard: int = 0,
) -> Outcome:
    """Admit one partition's records: an error code, or the partition and its append's
    ProduceResult. ``channel_offset``: the records came through the zone router's channel (the
    WAL gets a link record)."""
    registry = context.topics
    partition = registry.partitions.get((topic, index))
    if acks not in (-1, 0, 1):
        return KafkaErrorCode.INVALID_REQUIRED_ACKS
    if is_internal_topic(topic) and not internal_allowed:
        # Kafka: "Cannot append to internal topic" (only its coordinators write there).
        return KafkaErrorCode.INVALID_TOPIC_EXCEPTION
    if partition is None:
        return registry.not_here(topic, index)
    described = registry.topics[topic]
    max_bytes = int(registry.topic_config(described, "max.message.bytes"))
    compacted = is_compacted(registry, described)
    try:
        result = partition.append_nowait(
            records,
            max_bytes,
            require_keys=compacted,
            channel_offset=channel_offset,
            verification_guard=verification_guard,
        )
    except StreamFencedError:
        # Closing (shutdown, deletion) or moved: the client refreshes and retries.
        return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
    except StorageError as error:
        log.error("produce to %s: %s", partition.topic, error)
        return KafkaErrorCode.KAFKA_STORAGE_ERROR
    return (partition, result)


async def answer_partition(name: str, index: int, outcome: Outcome) -> ProducePartitionAnswer:
    """The answer to one admitted partition, once its append is durable (or failed)."""
    if isinstance(outcome, KafkaErrorCode):
        return ProducePartitionAnswer(index, outcome.value)
    partition, result = outcome
    code = result.error
    if code is KafkaErrorCode.NONE and result.durable is not None:
        try:
            await result.durable
        except StorageError as error:
            log.error("produce to %s: %s", name, error)
            code = KafkaErrorCode.KAFKA_STORAGE_ERROR
    if code is not KafkaErrorCode.NONE:
        return ProducePartitionAnswer(index, code.value, -1, -1, -1, result.message)
    try:
        log_start = partition.log_start_offset
    except StorageError:
        log_start = -1
    return ProducePartitionAnswer(index, 0, result.base_offset, -1, log_start)


def _refused(context: Context, request: Request, body: Any) -> dict[tuple[str, int], Any]:
    """The partitions the principal may not write to, with their error (the module docstring)."""
    transactional_id = body.transactional_id
    if transactional_id is not None and not allowed(
        context, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id
    ):
        error = KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return {(t.name, p.index): error for t in body.topic_data for p in t.partition_data}
    names = (t.name for t in body.topic_data)
    hidden = denied(context, request, AclOperation.WRITE, ResourceType.TOPIC, names)
    error = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
    topics = (t for t in body.topic_data if t.name in hidden)
    return {(t.name, p.index): error for t in topics for p in t.partition_data}


async def _verify(
    context: Context, version: int, body: Any, refused: dict[tuple[str, int], Any]
) -> dict[tuple[str, int], int | KafkaErrorCode]:
    """Per partition of a transactional Produce whose batch begins a transaction there: the
    verification guard to admit it with, or the error it is answered (``refused``'s, its
    authorization's, unverified)."""
    verified: dict[tuple[str, int], int | KafkaErrorCode] = dict(refused)
    for topic_data in body.topic_data:
        for partition_data in topic_data.partition_data:
            key = (topic_data.name, partition_data.index)
            partition = context.topics.partitions.get(key)
            if partition is None or not partition_data.records or key in refused:
                continue
            try:
                first = next(iter_batches(partition_data.records))
            except Exception:  # append_nowait answers the malformed batch
                continue
            if not first.is_transactional:
                continue
            header = first.header()
            verified[key] = await verify_produce(
                context,
                version,
                body.transactional_id,
                partition,
                header.producer_id,
                header.producer_epoch,
            )
    return verified


async def _hold_for_opening(context: Context, body: Any) -> None:
    """Wait for the partitions of the request this broker is opening (bounded): at admission,
    so that the connection's later requests are admitted after this one, in order."""
    registry = context.topics
    opening = [
        (topic_data.name, partition_data.index)
        for topic_data in body.topic_data
        for partition_data in topic_data.partition_data
        if (topic_data.name, partition_data.index) not in registry.partitions
        and not is_internal_topic(topic_data.name)
        and registry.opening(topic_data.name, partition_data.index)
    ]
    if opening:
        hold_ms = min(context.config.partition_open_wait_ms, max(body.timeout_ms, 0))
        await registry.wait_opened(opening, hold_ms / 1000)


async def _answer(
    context: Context, request: Request, outcomes: Outcomes, throttle_ms: int = 0
) -> Chunks:
    topics: list[tuple[str, list[ProducePartitionAnswer]]] = []
    for name, results in outcomes:
        answers = [await answer_partition(name, index, outcome) for index, outcome in results]
        topics.append((name, answers))
    if context.quotas is not None:
        await context.quotas.throttled(request, throttle_ms)  # an old client's answer waits
    return produce_answer(request, topics, throttle_ms)


def produce_answer(
    request: Request, topics: list[tuple[str, list[ProducePartitionAnswer]]], throttle_ms: int = 0
) -> Answer:
    """The encoded answer (by hand: the busiest response; kio's dataclasses cost a tenth of the
    loop at 1,000/s), whose error codes are its partitions'."""
    encoded = encode_produce_response(
        request.api_version, request.correlation_id, topics, throttle_time_ms=throttle_ms
    )
    return Answer((encoded,), lambda: (p.error_code for _, answers in topics for p in answers))
