"""The transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn (v0-3 from
producers, v4+ the verification form between brokers), AddOffsetsToTxn, EndTxn, WriteTxnMarkers
(a transaction coordinator on another broker writing the markers of the partitions led here),
DescribeTransactions, ListTransactions and DescribeProducers; and the verification a partition
leader makes before the first transactional write of a transaction lands (KIP-890), which
Produce calls (:func:`verify_produce`).

Each request goes to the transaction coordinator (:mod:`automq_ref.kafka.transactions`), which
answers once the decision is durable in ``__transaction_state``; an id this broker does not
coordinate now is answered ``NOT_COORDINATOR`` (``COORDINATOR_LOAD_IN_PROGRESS`` while its shard
loads) and the producer asks FindCoordinator again. Errors are Kafka's, with its mapping for
older request versions: ``PRODUCER_FENCED`` (KIP-588) is answered ``INVALID_PRODUCER_EPOCH`` to
versions that predate it (InitProducerId below v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn
below v2). AddOffsetsToTxn adds the group's ``__consumer_offsets`` partition to the transaction,
so that its marker ends the transaction's offset commits there too.

With an authorizer, Kafka's checks: AddPartitionsToTxn (v0-3), AddOffsetsToTxn and EndTxn need
WRITE on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), AddPartitionsToTxn
WRITE on each topic (else TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED) and,
from brokers (v4+), CLUSTER_ACTION on the cluster; AddOffsetsToTxn READ on the group;
WriteTxnMarkers ALTER or CLUSTER_ACTION on the cluster; DescribeProducers READ on each topic;
DescribeTransactions DESCRIBE on each id (its partitions of topics the principal may not
DESCRIBE left out); ListTransactions lists the ids the principal may DESCRIBE.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    allowed,
    cluster_allowed,
    cluster_refusal,
    denied,
)
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.responses import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    DescribedState,
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    ListedState,
    ListTransactionsResponse,
    MarkerPartitionResult,
    MarkerResult,
    MarkerTopicResult,
    PartitionProducers,
    TopicProducers,
    TxnPartitionResult,
    TxnResult,
    TxnTopicData,
    TxnTopicResult,
    WriteTxnMarkersResponse,
    respond,
)
from automq_ref.kafka.server import Chunks, Reply
from automq_ref.state_machines import transaction as tx
from automq_ref.vocabulary.naming import CONSUMER_OFFSETS_TOPIC, is_internal_topic

NONE = KafkaErrorCode.NONE
TXN_ID = ResourceType.TRANSACTIONAL_ID
TOPIC = ResourceType.TOPIC
WRITE = AclOperation.WRITE
DESCRIBE = AclOperation.DESCRIBE
# The first version of each API that knows PRODUCER_FENCED.
_FENCED_SINCE = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
}
# Verification answers a Produce may not pass on as they are (Kafka's mapping): retriable ones
# become NOT_ENOUGH_REPLICAS, so the producer retries the batch.
_PRODUCE_RETRIABLE = frozenset(
    {
        KafkaErrorCode.CONCURRENT_TRANSACTIONS,
        KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaErrorCode.COORDINATOR_NOT_AVAILABLE,
        KafkaErrorCode.NOT_COORDINATOR,
    }
)
TRANSACTION_ABORTABLE_SINCE_PRODUCE = 11
PRODUCE_MAX_VERSION = 12  # TxnOffsetCommit's verification answers as the newest Produce would


def _versioned(request: Request, error: KafkaErrorCode) -> KafkaErrorCode:
    if error is KafkaErrorCode.PRODUCER_FENCED and request.api_version < _FENCED_SINCE.get(
        ApiKey(request.api_key), 0
    ):
        return KafkaErrorCode.INVALID_PRODUCER_EPOCH
    return error


# ------------------------------------------------------------------------------- handlers


async def handle_transactional_init(context: Context, request: Request) -> Reply:
    """InitProducerId with a transactional id (the handler of InitProducerId hands it here)."""
    body = request.body
    coordinator = context.transactions
    if coordinator is None:
        return respond(
            request, InitProducerIdResponse(error_code=KafkaErrorCode.COORDINATOR_NOT_AVAILABLE)
        )
    timeout = body.transaction_timeout
    timeout_ms = int(
        timeout.total_seconds() * 1000 if isinstance(timeout, datetime.timedelta) else timeout
    )

    async def answer() -> Chunks:
        found = await coordinator.init_producer_id(
            body.transactional_id,
            timeout_ms,
            int(getattr(body, "producer_id", -1)),
            int(getattr(body, "producer_epoch", -1)),
        )
        return respond(
            request,
            InitProducerIdResponse(
                error_code=_versioned(request, found.error),
                producer_id=found.producer_id,
                producer_epoch=found.producer_epoch,
            ),
        )

    return answer()


def _topic_results(
    errors: Sequence[tuple[tx.PartitionKey, KafkaErrorCode]], request: Request
) -> list[TxnTopicResult]:
    by_topic: dict[str, list[TxnPartitionResult]] = {}
    for (topic, index), error in errors:
        by_topic.setdefault(topic, []).append(TxnPartitionResult(index, _versioned(request, error)))
    return [TxnTopicResult(topic, results) for topic, results in by_topic.items()]


async def _add(
    context: Context,
    request: Request,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: Any,
    verify_only: bool,
) -> list[TxnTopicResult]:
    wanted = [(t.name, int(index)) for t in topics for index in t.partitions]
    coordinator = context.transactions
    if context.acls is not None:
        refused = _add_refused(context, request, transactional_id, wanted)
        if refused is not None:
            return _topic_results(refused, request)
    if coordinator is None:
        return _topic_results(
            [(p, KafkaErrorCode.COORDINATOR_NOT_AVAILABLE) for p in wanted], request
        )
    unknown = [p for p in wanted if p[0] not in context.topics.topics]
    if unknown:
        # Kafka: the unknown ones UNKNOWN_TOPIC_OR_PARTITION, the rest OPERATION_NOT_ATTEMPTED.
        return _topic_results(
            [
                (
                    p,
                    KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    if p in unknown
                    else KafkaErrorCode.OPERATION_NOT_ATTEMPTED,
                )
                for p in wanted
            ],
            request,
        )
    # A producer's request while its previous transaction writes its markers is held by the
    # coordinator until they are written (TransactionCoordinator.add_partitions).
    answer = await coordinator.add_partitions(
        transactional_id, producer_id, producer_epoch, wanted, verify_only=verify_only
    )
    return _topic_results(answer.errors, request)


def _add_refused(
    context: Context, request: Request, transactional_id: str, wanted: list[tx.PartitionKey]
) -> list[tuple[tx.PartitionKey, KafkaErrorCode]] | None:
    """Kafka's answer when the principal may not add ``wanted`` (None: it may)."""
    if request.api_version <= 3 and not allowed(context, request, WRITE, TXN_ID, transactional_id):
        return [(p, KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for p in wanted]
    names = (topic for topic, _ in wanted if not is_internal_topic(topic))
    hidden = denied(context, request, WRITE, TOPIC, names)
    if not hidden:
        return None
    return [
        (
            p,
            KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
            if p[0] in hidden
            else KafkaErrorCode.OPERATION_NOT_ATTEMPTED,
        )
        for p in wanted
    ]


async def handle_add_partitions_to_txn(context: Context, request: Request) -> Reply:
    body = request.body
    if request.api_version >= 4 and not cluster_allowed(
        context, request, AclOperation.CLUSTER_ACTION
    ):
        return cluster_refusal(request)

    async def answer() -> Chunks:
        if request.api_version <= 3:
            results = await _add(
                context,
                request,
                body.v3_and_below_transactional_id,
                int(body.v3_and_below_producer_id),
                int(body.v3_and_below_producer_epoch),
                body.v3_and_below_topics,
                False,
            )
            return respond(
                request, AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)
            )
        transactions = []
        for txn in body.transactions:
            results = await _add(
                context,
                request,
                txn.transactional_id,
                int(txn.producer_id),
                int(txn.producer_epoch),
                txn.topics,
                bool(txn.verify_only),
            )
            transactions.append(TxnResult(txn.transactional_id, results))
        return respond(request, AddPartitionsToTxnResponse(results_by_transaction=transactions))

    return answer()


async def handle_add_offsets_to_txn(context: Context, request: Request) -> Reply:
    """The group's ``__consumer_offsets`` partition joins the transaction."""
    body = request.body
    if not allowed(context, request, WRITE, TXN_ID, body.transactional_id):
        denial = KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return respond(request, AddOffsetsToTxnResponse(denial))
    if not allowed(context, request, AclOperation.READ, ResourceType.GROUP, body.group_id):
        denial = KafkaErrorCode.GROUP_AUTHORIZATION_FAILED
        return respond(request, AddOffsetsToTxnResponse(denial))

    async def answer() -> Chunks:
        coordinator = context.transactions
        if coordinator is None:
            return respond(
                request, AddOffsetsToTxnResponse(KafkaErrorCode.COORDINATOR_NOT_AVAILABLE)
            )
        index = await context.groups.partition_of(body.group_id)
        if index is None:
            return respond(
                request, AddOffsetsToTxnResponse(KafkaErrorCode.COORDINATOR_NOT_AVAILABLE)
            )
        key = (CONSUMER_OFFSETS_TOPIC, index)
        found = await coordinator.add_partitions(
            body.transactional_id, int(body.producer_id), int(body.producer_epoch), [key]
        )
        error = dict(found.errors).get(key, KafkaErrorCode.UNKNOWN_SERVER_ERROR)
        return respond(request, AddOffsetsToTxnResponse(_versioned(request, error)))

    return answer()


async def handle_end_txn(context: Context, request: Request) -> Reply:
    body = request.body
    if not allowed(context, request, WRITE, TXN_ID, body.transactional_id):
        denial = KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return respond(request, EndTxnResponse(denial))

    async def answer() -> Chunks:
        coordinator = context.transactions
        if coordinator is None:
            return respond(request, EndTxnResponse(KafkaErrorCode.COORDINATOR_NOT_AVAILABLE))
        error = await coordinator.end_txn(
            body.transactional_id,
            int(body.producer_id),
            int(body.producer_epoch),
            bool(body.committed),
        )
        return respond(request, EndTxnResponse(_versioned(request, error)))

    return answer()


def _start_time(start_ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(start_ms / 1000, tz=datetime.UTC)


async def handle_describe_transactions(context: Context, request: Request) -> Reply:
    body = request.body
    ids = list(body.transactional_ids)
    hidden = denied(context, request, DESCRIBE, TXN_ID, ids)
    coordinator = context.transactions
    found = (
        coordinator.describe(ids)
        if coordinator is not None
        else [(i, KafkaErrorCode.COORDINATOR_NOT_AVAILABLE, None) for i in ids]
    )
    states = []
    for transactional_id, error, metadata in found:
        if transactional_id in hidden:
            error, metadata = KafkaErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
        if metadata is None:
            states.append(
                DescribedState(error, transactional_id, "", 0, _start_time(-1), -1, -1, ())
            )
            continue
        by_topic: dict[str, list[int]] = {}
        unseen = denied(context, request, DESCRIBE, TOPIC, (t for t, _ in metadata.partitions))
        for topic, index in sorted(metadata.partitions):
            if topic not in unseen:
                by_topic.setdefault(topic, []).append(index)
        states.append(
            DescribedState(
                NONE,
                transactional_id,
                metadata.state.name,
                metadata.timeout_ms,
                _start_time(metadata.start_ms),
                metadata.producer_id,
                metadata.producer_epoch,
                [TxnTopicData(topic, indexes) for topic, indexes in by_topic.items()],
            )
        )
    return respond(request, DescribeTransactionsResponse(states))


async def handle_list_transactions(context: Context, request: Request) -> Reply:
    body = request.body
    names = {state.name for state in tx.TransactionState}
    filters = set(body.state_filters)
    unknown = sorted(filters - names)
    producer_ids = {int(p) for p in body.producer_id_filters}
    duration_ms = int(getattr(body, "duration_filter", -1))
    coordinator = context.transactions
    if coordinator is None:
        return respond(
            request,
            ListTransactionsResponse((), error_code=KafkaErrorCode.COORDINATOR_NOT_AVAILABLE),
        )
    error, listed = coordinator.listed()
    hidden = denied(context, request, DESCRIBE, TXN_ID, (m.transactional_id for m in listed))
    now_ms = context.clock.now_ms()
    states = [
        ListedState(m.transactional_id, m.producer_id, m.state.name)
        for m in listed
        if (not filters or m.state.name in filters)
        and (not producer_ids or m.producer_id in producer_ids)
        and (duration_ms < 0 or (m.start_ms >= 0 and now_ms - m.start_ms >= duration_ms))
        and m.transactional_id not in hidden
    ]
    return respond(request, ListTransactionsResponse(states, unknown, error))


async def handle_describe_producers(context: Context, request: Request) -> Reply:
    body = request.body
    names = (t.name for t in body.topics)
    hidden = denied(context, request, AclOperation.READ, TOPIC, names)
    topics = []
    for topic in body.topics:
        partitions = []
        for index in topic.partition_indexes:
            partition = context.topics.partitions.get((topic.name, int(index)))
            if topic.name in hidden:
                denial = KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED
                partitions.append(PartitionProducers(int(index), denial, ()))
                continue
            if partition is None:
                error = context.topics.not_here(topic.name, int(index))
                partitions.append(PartitionProducers(int(index), error, ()))
                continue
            producers = partition.describe_producers()
            partitions.append(PartitionProducers(int(index), NONE, producers))
        topics.append(TopicProducers(topic.name, partitions))
    return respond(request, DescribeProducersResponse(topics))


async def handle_write_txn_markers(context: Context, request: Request) -> Reply:
    """Each marker written to each of its partitions led here, answered once durable (a
    partition not led here: NOT_LEADER_OR_FOLLOWER or UNKNOWN_TOPIC_OR_PARTITION)."""
    body = request.body
    # Kafka's rule: ALTER on the cluster, else CLUSTER_ACTION (a broker's).
    refused = not (
        cluster_allowed(context, request, AclOperation.ALTER)
        or cluster_allowed(context, request, AclOperation.CLUSTER_ACTION)
    )

    async def one(marker: Any, name: str, index: int) -> MarkerPartitionResult:
        if refused:
            return MarkerPartitionResult(index, KafkaErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        partition = context.topics.partitions.get((name, index))
        if partition is None:
            return MarkerPartitionResult(index, context.topics.not_here(name, index))
        try:
            error = await partition.write_marker(
                int(marker.producer_id),
                int(marker.producer_epoch),
                int(marker.coordinator_epoch),
                bool(marker.transaction_result),
            )
        except Exception:  # the partition closed meanwhile (moved, or the broker stops)
            error = KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        return MarkerPartitionResult(index, error)

    async def answer() -> Chunks:
        markers = []
        for marker in body.markers:
            topics = []
            for topic in marker.topics:
                results = await asyncio.gather(
                    *(one(marker, topic.name, int(index)) for index in topic.partition_indexes)
                )
                topics.append(MarkerTopicResult(topic.name, results))
            markers.append(MarkerResult(int(marker.producer_id), topics))
        return respond(request, WriteTxnMarkersResponse(markers))

    return answer()


# ------------------------------------------------------------------------ Produce's check


async def verify_produce(
    context: Context,
    request_version: int,
    transactional_id: str | None,
    partition: Partition,
    producer_id: int,
    producer_epoch: int,
) -> int | KafkaErrorCode:
    """Before a transactional batch that would begin a transaction at ``partition`` is
    admitted: the verification guard it is admitted with (0: none needed), or the error Produce
    answers for the partition."""
    if not partition.transaction_needs_verification(producer_id, producer_epoch):
        return 0
    coordinator = context.transactions
    if transactional_id is None or coordinator is None:
        return KafkaErrorCode.INVALID_TXN_STATE
    guard = partition.begin_transaction_verification(producer_id, producer_epoch)
    error = await coordinator.verify(
        transactional_id, producer_id, producer_epoch, (partition.topic, partition.index)
    )
    if error is NONE:
        return guard
    if error in _PRODUCE_RETRIABLE:
        return KafkaErrorCode.NOT_ENOUGH_REPLICAS
    if error is KafkaErrorCode.TRANSACTION_ABORTABLE and (
        request_version < TRANSACTION_ABORTABLE_SINCE_PRODUCE
    ):
        return KafkaErrorCode.INVALID_TXN_STATE
    if error is KafkaErrorCode.PRODUCER_FENCED:
        return KafkaErrorCode.INVALID_PRODUCER_EPOCH
    return error
