"""Fetch: record batches read from partitions, with the long poll.

A Fetch reads every asked partition once; if that found fewer than ``min_bytes`` and nothing
went wrong, it waits (up to ``max_wait``, on the injected clock) for any of the partitions that
had nothing to receive data, and reads again. Stored batches are passed through as they are, and
the response is encoded by hand (:func:`automq_ref.protocol.encode_fetch_response`). Topics are
named from v13 by id. There are no fetch sessions (session id 0). A partition placed on this
broker but not open yet (moved here, its open waiting for the old broker's or a failover's
close) is waited for first, up to ``partition.open.wait.ms`` and within ``max_wait``.

The byte limits follow KIP-74: partitions are read in the request's order, each given whole
batches within ``min(partition_max_bytes, what is left of max_bytes)``; only the first partition
that has data gets its first batch even when that is larger than both, so a response is larger
than ``max_bytes`` only when it is that one batch, and a consumer always progresses. Once a
partition has answered data, the others are read several at once (:func:`_read_partitions`),
within the same limits.

Before it is sent, a response's record bytes are consumed from the broker's outbound network
bandwidth limiter (``Context.network``): at TAIL when every partition was read from the
LogCache, at CATCH_UP when any read objects (a consumer catching up), so that when the bandwidth
runs short catch-up responses wait and tail reads go first (``docs/storage.md``, "Network
bandwidth limiter").

Isolation (Fetch v4+): a READ_COMMITTED Fetch (``isolation_level`` 1) reads a partition only
up to its last stable offset (:attr:`Partition.last_stable_offset`): what lies past it is not
answered, does not count toward ``min_bytes`` and does not end the long poll, and each answer
carries the aborted transactions its records overlap (:meth:`Partition.aborted_transactions`:
last offset at or past the fetch offset, first offset below the end of the last batch answered,
Kafka's rule; none when no records are answered). Both isolation levels answer the LSO as
``last_stable_offset``; control batches go to clients as stored (clients drop them). A
partition that never saw a transaction pays one flag test for this. A snapshot-read copy (zone
router) answers the same from its main's transaction state
(:class:`~automq_ref.kafka.snapshot_read.SnapshotPartition`: the main's LSO with the end it
applied, the aborted transactions from the entries it holds or, for a read below them, from its
main); a copy that cannot learn them answers that partition ``KAFKA_STORAGE_ERROR``, no records.

With an authorizer, a consumer's partitions of a topic it may not READ are answered
TOPIC_AUTHORIZATION_FAILED (an unknown topic id stays UNKNOWN_TOPIC_ID), as Kafka's; a
follower's Fetch (a replica id) needs CLUSTER_ACTION on the cluster, else every partition is
TOPIC_AUTHORIZATION_FAILED, and reads every topic with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch import RecordBatchView, iter_batches
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.io.storage.stream_objects import ReadOrigin
from automq_ref.kafka.handlers.authorize import (
    AclOperation,
    ResourceType,
    cluster_allowed,
    denied,
)
from automq_ref.kafka.handlers.partition_snapshot import snapshot_partition
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.request import Context, Request
from automq_ref.kafka.server import Answer, Chunks, Reply
from automq_ref.kafka.snapshot_read import SnapshotPartition
from automq_ref.protocol import (
    AbortedTransaction,
    Chunk,
    FetchableTopicResponse,
    encode_fetch_response,
)
from automq_ref.state_machines.network_limiter import Priority
from automq_ref.state_machines.quota import CONSUMER_BYTE_RATE

log = logging.getLogger(__name__)

# (the topic as the response names it: id or name, its name if known, the partitions asked)
Wanted = list[tuple[Any, str | None, list[Any]]]
# A partition led here, or a snapshot-read copy of one its main leads (the zone router's reads
# in the client's zone): the same reads, offsets and waits.
Readable = Partition | SnapshotPartition
# The partition reads of one Fetch in flight at once.
READS_IN_FLIGHT = 32


async def handle_fetch(context: Context, request: Request) -> Reply:
    return _fetch(context, request)


async def _fetch(context: Context, request: Request) -> Chunks:
    body = request.body
    version = request.api_version
    clock = context.clock
    by_id = version >= 13
    max_wait_s = max(body.max_wait.total_seconds(), 0.0)
    deadline = clock.monotonic_s() + max_wait_s
    wanted: Wanted = []
    for fetch_topic in body.topics:
        if by_id:
            topic = context.topics.topic_by_id(fetch_topic.topic_id)
            name = topic.name if topic is not None else None
            key = fetch_topic.topic_id
        else:
            name = fetch_topic.topic
            key = name
        wanted.append((key, name, list(fetch_topic.partitions)))
    hidden = _hidden(context, request, wanted) if context.acls is not None else frozenset()
    opening = [
        (name, int(fetch_partition.partition))
        for _, name, fetch_partitions in wanted
        for fetch_partition in fetch_partitions
        if context.topics.opening(name, int(fetch_partition.partition))
    ]
    if opening:
        hold_s = min(context.config.partition_open_wait_ms / 1000, max_wait_s)
        await context.topics.wait_opened(opening, hold_s)
    committed = version >= 4 and int(getattr(body, "isolation_level", 0)) == 1
    while True:
        read = await _fetch_once(context, request, wanted, by_id, committed, hidden)
        remaining = deadline - clock.monotonic_s()
        if read.total >= int(body.min_bytes) or remaining <= 0 or read.answer_now or not read.waits:
            break
        waiting = [asyncio.ensure_future(partition.wait_for_data()) for partition in read.waits]
        done, pending = await asyncio.wait(
            waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        for future in pending:
            future.cancel()
        if not done:
            read = await _fetch_once(context, request, wanted, by_id, committed, hidden)
            break
    if context.network is not None and read.total:
        priority = Priority.CATCH_UP if read.from_objects else Priority.TAIL
        await context.network.outbound.consume(read.total, priority)
    throttle_ms = 0
    if context.quotas is not None:
        quotas = context.quotas
        throttle_ms = quotas.throttle_ms(
            CONSUMER_BYTE_RATE, request.peer, request.client_id, read.total
        )
        await quotas.throttled(request, throttle_ms)  # an old client's answer waits
    chunks = encode_fetch_response(
        version, request.correlation_id, read.responses, throttle_time_ms=throttle_ms
    )
    # The encoder's first chunk starts with the frame size; the listener writes its own.
    responses = read.responses
    return Answer(
        (memoryview(chunks[0])[4:], *chunks[1:]),
        lambda: (p.error_code for topic in responses for p in topic.partitions),
    )


def _hidden(context: Context, request: Request, wanted: Wanted) -> frozenset[str]:
    """The topics of ``wanted`` the principal may not fetch (the module docstring)."""
    body = request.body
    state = getattr(body, "replica_state", None)
    replica = int(state.replica_id if state is not None else getattr(body, "replica_id", -1))
    names = [name for _, name, _ in wanted if name is not None]
    if replica >= 0:  # a follower's
        if cluster_allowed(context, request, AclOperation.CLUSTER_ACTION):
            return frozenset()
        return frozenset(names)
    return denied(context, request, AclOperation.READ, ResourceType.TOPIC, names)


@dataclass
class _Read:
    """One pass over the asked partitions: the responses, their record bytes, the partitions
    that had nothing to read, whether to answer without waiting for more (an error, or a
    partition that had data the byte limits left out: the response is as full as it can be),
    and whether any partition was read from objects."""

    responses: list[FetchableTopicResponse]
    total: int
    waits: list[Readable]
    answer_now: bool
    from_objects: bool


class _Answer:
    """One partition's part of a Fetch answer, as the encoder reads it
    (:class:`~automq_ref.protocol.fetch.FetchPartition`). A catch-up's Fetch builds one for
    each of the 1,000 partitions it names, so this is a plain slotted class with a positional
    ``__init__``: the frozen :class:`~automq_ref.protocol.FetchPartitionData`'s keyword one
    cost 2.4 µs a partition. Aborted transactions are answered to READ_COMMITTED only."""

    __slots__ = (
        "aborted_transactions",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "partition_index",
        "records",
    )
    preferred_read_replica: int = -1

    def __init__(self, partition_index: int, error_code: int) -> None:
        self.partition_index = partition_index
        self.error_code = error_code
        self.aborted_transactions: Sequence[AbortedTransaction] | None = None
        self.high_watermark = self.last_stable_offset = self.log_start_offset = -1
        self.records: Sequence[Chunk] | None = ()


async def _fetch_once(
    context: Context,
    request: Request,
    wanted: Wanted,
    by_id: bool,
    committed: bool,
    hidden: frozenset[str] = frozenset(),
) -> _Read:
    partitions_by_key = context.topics.partitions
    answer_now = False
    responses = []
    # The partitions to read, in the request's order, and the answer each fills.
    reads: list[tuple[Readable, Any]] = []
    answers: list[_Answer] = []
    for key, name, fetch_partitions in wanted:
        topic_answers: list[_Answer] = []
        for fetch_partition in fetch_partitions:
            index = int(fetch_partition.partition)
            partition: Readable | None = (
                partitions_by_key.get((name, index)) if name is not None else None
            )
            if hidden and name in hidden:
                answer_now = True
                topic_answers.append(_Answer(index, KafkaErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if partition is None:
                # With the zone router on, this broker may be the client's zone proxy of the
                # partition's leader: its snapshot-read copy answers.
                partition = snapshot_partition(context, request, name, index)
            if partition is None:
                code = (
                    KafkaErrorCode.UNKNOWN_TOPIC_ID
                    if by_id and name is None
                    else context.topics.not_here(name, index)
                )
                answer_now = True
                topic_answers.append(_Answer(index, code))
            else:
                answer = _Answer(index, KafkaErrorCode.NONE)
                topic_answers.append(answer)
                reads.append((partition, fetch_partition))
                answers.append(answer)
        if by_id:
            responses.append(FetchableTopicResponse(partitions=topic_answers, topic_id=key))
        else:
            responses.append(FetchableTopicResponse(partitions=topic_answers, topic=key))
    origin = ReadOrigin()
    found = await _read_partitions(reads, int(request.body.max_bytes), origin, committed)
    aborted = await _aborted(reads, found) if committed else None
    total = 0
    waits: list[Readable] = []
    # The high watermark is read here, after every read's await: a partition that received
    # data while the others were read answers now instead of joining the long poll.
    for position, ((partition, fetch_partition), answer, (code, chunks)) in enumerate(
        zip(reads, answers, found, strict=True)
    ):
        high_watermark = partition.high_watermark
        stable = partition.stable_offset(high_watermark)
        if chunks:
            size = sum(map(len, chunks))
            partition.bytes_out += size
            total += size
            answer.records = chunks
        if code is not KafkaErrorCode.NONE:
            answer.error_code = code
            answer_now = True
        elif not chunks:
            if int(fetch_partition.fetch_offset) < (stable if committed else high_watermark):
                answer_now = True  # it has data the byte limits left out
            else:
                waits.append(partition)
        answer.high_watermark, answer.last_stable_offset = high_watermark, stable
        answer.log_start_offset = partition.log_start_offset
        if aborted is not None:
            answer.aborted_transactions = aborted[position]
    return _Read(responses, total, waits, answer_now, origin.from_objects)


Read = tuple[KafkaErrorCode, list[bytes | memoryview]]


async def _aborted(
    reads: list[tuple[Readable, Any]], found: list[Read]
) -> list[list[AbortedTransaction]]:
    """Each READ_COMMITTED answer's aborted transactions: those its records overlap. A
    snapshot-read copy that must ask its main for them is asked with the others at once; one
    whose main does not answer has its records taken back (``found`` is changed in place: they
    cannot go without the transactions to drop)."""
    rows: list[list[tuple[int, int]]] = [[] for _ in reads]
    asking: dict[int, Awaitable[list[tuple[int, int]]]] = {}
    for position, ((partition, fetch_partition), (_, chunks)) in enumerate(
        zip(reads, found, strict=True)
    ):
        if not chunks:
            continue
        fetch_offset = int(fetch_partition.fetch_offset)
        if isinstance(partition, Partition):
            if partition.transactions.aborted:
                upper = _answered_end(chunks)
                rows[position] = partition.aborted_transactions(fetch_offset, upper)
            continue
        upper = _answered_end(chunks)
        held = partition.aborted_held(fetch_offset, upper)
        if held is None:
            asking[position] = partition.aborted_transactions(fetch_offset, upper)
        else:
            rows[position] = held
    if asking:
        answers = await asyncio.gather(*asking.values(), return_exceptions=True)
        for position, answer in zip(asking, answers, strict=True):
            if isinstance(answer, BaseException):
                partition = reads[position][0]
                log.error("fetch from %s-%d: %s", partition.topic, partition.index, answer)
                found[position] = (KafkaErrorCode.KAFKA_STORAGE_ERROR, [])
            else:
                rows[position] = answer
    return [
        [AbortedTransaction(producer_id=producer, first_offset=first) for producer, first in held]
        for held in rows
    ]


def _answered_end(chunks: list[bytes | memoryview]) -> int:
    """The offset after the last batch of ``chunks`` (stored records, in offset order)."""
    end = -1
    for view in iter_batches(chunks[-1], verify_crc=False, compacted=True):
        end = view.next_offset
    return end


def _upper(partition: Readable, committed: bool) -> int | None:
    """Where a read stops short of the high watermark: a READ_COMMITTED one, at the LSO."""
    return partition.last_stable_offset if committed else None


def _bounds(partition: Readable, committed: bool) -> tuple[int, int, int]:
    """(log start, the end a read may reach: the high watermark or the LSO, log end)."""
    log_start, high_watermark, log_end = partition.fetch_bounds()
    if committed:
        return log_start, partition.stable_offset(high_watermark), log_end
    return log_start, high_watermark, log_end


async def _read_partitions(
    reads: list[tuple[Readable, Any]], budget: int, origin: ReadOrigin, committed: bool = False
) -> list[Read]:
    """Each partition's answer, in order, read up to :data:`READS_IN_FLIGHT` at once once a
    partition has answered data (a read from objects waits for the store; one after another, a
    catch-up of many partitions would wait for each in turn).

    The byte limits stay KIP-74's. Until a partition has data, partitions are read one after
    another, each allowed its first batch past the limits (``min_one``), as a sequential read
    would: a consumer always progresses, and only that one batch may pass them. After it, a read
    starts with ``min(partition_max_bytes, budget - reserved)``, where ``reserved`` counts the
    bytes read so far and the limits of the reads in flight, so the response never passes
    ``budget`` but by that batch; a read that returns less than its limit gives the rest back
    to the reads after it. Last, in order, a read that started with less than its partition's
    limit reads on from where it stopped within what the others left (:func:`_top_up`), so a
    Fetch answers what one read after another would have answered, give or take the batches
    that fit the space the reads in flight had promised."""
    results: list[Read | None] = [None] * len(reads)
    limits = [0] * len(reads)
    running: dict[asyncio.Task[Read], int] = {}
    reserved = 0
    started = 0
    try:
        while started < len(reads) and reserved == 0:
            partition, fetch_partition = reads[started]
            limit = min(int(fetch_partition.partition_max_bytes), budget)
            results[started] = found = (
                _answer_at_once(partition, fetch_partition, limit, True, committed)
                or _answer_now(partition, fetch_partition, limit, True, committed)
                or await _read_partition(partition, fetch_partition, limit, True, origin, committed)
            )
            limits[started] = int(fetch_partition.partition_max_bytes)  # nothing to top up
            reserved = sum(map(len, found[1]))
            started += 1
        while started < len(reads) or running:
            while started < len(reads) and len(running) < READS_IN_FLIGHT:
                partition, fetch_partition = reads[started]
                limit = min(int(fetch_partition.partition_max_bytes), budget - reserved)
                limits[started] = limit = max(limit, 0)
                at_once = _answer_at_once(
                    partition, fetch_partition, limit, False, committed
                ) or _answer_now(partition, fetch_partition, limit, False, committed)
                if at_once is not None:  # no read to wait for: no task either
                    results[started] = at_once
                    reserved += sum(map(len, at_once[1]))
                    started += 1
                    continue
                reserved += limit
                reading = _read_partition(
                    partition, fetch_partition, limit, False, origin, committed
                )
                running[asyncio.ensure_future(reading)] = started
                started += 1
            if not running:
                continue
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                position = running.pop(task)
                results[position] = found = task.result()
                reserved -= limits[position] - sum(map(len, found[1]))
    finally:
        for task in running:
            task.cancel()
    answered = [result for result in results if result is not None]
    assert len(answered) == len(reads), "every partition read is answered"
    return await _top_up(reads, answered, limits, budget, origin, committed)


async def _top_up(
    reads: list[tuple[Readable, Any]],
    answered: list[Read],
    limits: list[int],
    budget: int,
    origin: ReadOrigin,
    committed: bool = False,
) -> list[Read]:
    """``answered``, each read whose limit was below its partition's (``limits``) extended from
    where it stopped, in order, within its partition's limit and what is left of ``budget``."""
    total = sum(sum(map(len, chunks)) for _, chunks in answered if chunks)
    for position, (partition, fetch_partition) in enumerate(reads):
        if total >= budget:  # it only grows
            break
        code, chunks = answered[position]
        partition_max = int(fetch_partition.partition_max_bytes)
        if code is not KafkaErrorCode.NONE or limits[position] >= partition_max:
            continue
        size = sum(map(len, chunks))
        more = min(partition_max - size, budget - total)
        offset = (
            RecordBatchView(chunks[-1], verify_crc=False).next_offset
            if chunks
            else int(fetch_partition.fetch_offset)
        )
        if more <= 0 or offset >= _bounds(partition, committed)[1]:
            continue
        try:
            extra = await _read(partition, offset, more, False, origin, committed)
        except StorageError as error:  # what it read already stands
            log.error("fetch from %s-%d: %s", partition.topic, partition.index, error)
            continue
        answered[position] = (code, [*chunks, *extra])
        total += sum(map(len, extra))
    return answered


def _refused(
    partition: Readable, fetch_partition: Any, log_start: int, log_end: int
) -> KafkaErrorCode | None:
    """The error a read of ``fetch_partition`` is answered with before any reading, if any."""
    leader_epoch = int(getattr(fetch_partition, "current_leader_epoch", -1))
    if leader_epoch >= 0 and leader_epoch != partition.epoch:
        return (
            KafkaErrorCode.FENCED_LEADER_EPOCH
            if leader_epoch < partition.epoch
            else KafkaErrorCode.UNKNOWN_LEADER_EPOCH
        )
    offset = int(fetch_partition.fetch_offset)
    if offset < log_start or offset > log_end:
        return KafkaErrorCode.OFFSET_OUT_OF_RANGE
    return None


def _answer_at_once(
    partition: Readable, fetch_partition: Any, limit: int, first: bool, committed: bool = False
) -> Read | None:
    """The answer of a read that needs no reading (refused, at the high watermark, or with no
    bytes left to it), else None. A catch-up asks for every partition in each Fetch, and most
    of them are past the response's budget: a task each, and ``asyncio.wait``'s callbacks on
    every read in flight for each of them, took the broker's loop several milliseconds per
    Fetch of 1,000 partitions. The partition's offsets are read at once, not one property
    after another."""
    log_start, high_watermark, log_end = _bounds(partition, committed)
    refused = _refused(partition, fetch_partition, log_start, log_end)
    if refused is not None:
        return refused, []
    if int(fetch_partition.fetch_offset) >= high_watermark or (limit <= 0 and not first):
        return KafkaErrorCode.NONE, []
    return None


def _answer_now(
    partition: Readable, fetch_partition: Any, limit: int, first: bool, committed: bool = False
) -> Read | None:
    """The answer of a read the LogCache holds whole (:meth:`Partition.read_now`), else None: a
    tail consumer's Fetch of 1,000 partitions spent more on a task and ``asyncio.wait``'s
    callbacks for each of those reads than on the reads."""
    if not isinstance(partition, Partition):
        return None
    try:
        chunks = partition.read_now(
            int(fetch_partition.fetch_offset), limit, first, _upper(partition, committed)
        )
    except StorageError as error:
        log.error("fetch from %s-%d: %s", partition.topic, partition.index, error)
        return KafkaErrorCode.KAFKA_STORAGE_ERROR, []
    return None if chunks is None else (KafkaErrorCode.NONE, chunks)


async def _read_partition(
    partition: Readable,
    fetch_partition: Any,
    limit: int,
    first: bool,
    origin: ReadOrigin,
    committed: bool = False,
) -> Read:
    log_start, _, log_end = partition.fetch_bounds()
    refused = _refused(partition, fetch_partition, log_start, log_end)
    if refused is not None:
        return refused, []
    offset = int(fetch_partition.fetch_offset)
    try:
        return KafkaErrorCode.NONE, await _read(partition, offset, limit, first, origin, committed)
    except StorageError as error:
        log.error("fetch from %s-%d: %s", partition.topic, partition.index, error)
        return KafkaErrorCode.KAFKA_STORAGE_ERROR, []


async def _read(
    partition: Readable,
    offset: int,
    limit: int,
    first: bool,
    origin: ReadOrigin,
    committed: bool = False,
) -> list[bytes | memoryview]:
    """``partition.read``, telling ``origin`` whether it read objects (a partition led here);
    ``committed``: up to the LSO."""
    upper = _upper(partition, committed)
    if isinstance(partition, Partition):
        return await partition.read(offset, limit, first, origin, upper)
    return await partition.read(offset, limit, min_one=first, upper=upper)
