"""The transaction coordinator: transactional ids spread over the partitions of
``__transaction_state``, one shard per partition this broker leads, as groups are spread over
``__consumer_offsets`` (:mod:`automq_ref.kafka.groups`; the placement, creation and routing
they share: :mod:`automq_ref.kafka.coordinator_topic`).

A transactional id's coordinator is the broker leading partition ``abs(hashCode(id)) %
partitions`` of the topic (``transaction.state.log.num.partitions``, 50 by default,
``cleanup.policy=compact``). This broker runs a
:class:`~automq_ref.kafka.transaction_shard.TransactionShard` per partition of the topic it
holds: loaded from the partition's log when the topic registry says it took the partition
(:meth:`TransactionCoordinator.partition_taken`), stopped when it gives it up. The topic is
created by the first transactional request (FindCoordinator with key type 1, as in Kafka), and
that request waits until it exists and the shards placed here have loaded.

Requests: InitProducerId, AddPartitionsToTxn (and AddOffsetsToTxn), EndTxn and the partition
leaders' verification (:meth:`TransactionCoordinator.verify`) go to the id's shard and are
answered by its machine once the decision is durable; the shard answers ``NOT_COORDINATOR`` or
``COORDINATOR_LOAD_IN_PROGRESS`` as :meth:`CoordinatorTopic.route
<automq_ref.kafka.coordinator_topic.CoordinatorTopic.route>` says. InitProducerId of a new id
(or one whose epoch is exhausted) takes a fresh producer id from the node's allocator first.
DescribeTransactions reads the machines' durable metadata; ListTransactions lists every shard's.

Markers: a decision that is durable (PrepareCommit, PrepareAbort) is followed by a COMMIT or
ABORT control batch in each partition of the transaction (:meth:`_write_markers`), written
with the coordinator epoch of the id's log partition: through the partition itself when this
broker leads it, else as ``WriteTxnMarkers`` to the broker placement assigns it
(:class:`~automq_ref.kafka.broker_link.BrokerLink`, one per broker). A marker not written yet
(the partition moving, its broker away) is tried again, backing off, until it is written or
its topic is gone (a deleted partition needs no marker, as in Kafka); a partition that refuses
it because the coordinator is stale (``TRANSACTION_COORDINATOR_FENCED``) ends the writing: the newer
coordinator writes it. A shard loaded while the broker starts (the topic registry opens every
partition together, and tells of each as it opens) writes its markers only once the coordinator
is started, when the registry its writers look partitions up in is there. Timeouts and expiry:
a ticker steps ``Tick`` in every shard each
``transaction.abort.timed.out.transaction.cleanup.interval.ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.io.clock import Clock
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka.broker_link import BrokerLink, BrokerLinkError
from automq_ref.kafka.coordinator_topic import CoordinatorTopic
from automq_ref.kafka.group_shard import ShardGone
from automq_ref.kafka.listeners import inter_broker_address, link_connect
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.producer_ids import ProducerIdAllocator
from automq_ref.kafka.transaction_shard import (
    TransactionShard,
    TransactionTrace,
    TransactionTraceFiles,
)
from automq_ref.protocol.kio_codec import build, request_class
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.state_machines import transaction as tx
from automq_ref.vocabulary.naming import TRANSACTION_STATE_TOPIC

if TYPE_CHECKING:
    from automq_ref.kafka.topic_registry import TopicRegistry

log = logging.getLogger(__name__)

LOAD_RETRY_S = 1.0
CREATE_WAIT_S = 10.0  # the longest a request waits for the topic it made a broker create
MARKER_RETRY_S = (0.05, 1.0)  # a marker not written yet is tried again after this, doubling
# The longest an AddPartitionsToTxn waits for the same producer's previous transaction to
# write its markers (add_partitions), instead of CONCURRENT_TRANSACTIONS and the client's
# backoff (librdkafka's and the Java client's 20 ms).
COMPLETION_WAIT_S = 0.1
TOPIC_CONFIGS = {"cleanup.policy": "compact"}
WRITE_TXN_MARKERS = 27
ADD_PARTITIONS_TO_TXN = 24
VERIFY_VERSION = 4  # AddPartitionsToTxn's broker-to-broker form (verify only)
WRITE_TXN_MARKERS_VERSION = 1

Described = tuple[str, KafkaErrorCode, tx.TransactionMetadata | None]
# The broker's seam ``node.Seams.before_decision``: given a writer per partition of the markers
# a Prepare* decision leads to (each writes its marker now, and returns once it is written),
# run before that decision is appended. None, the broker's own way: no marker before the
# decision is durable. Only the checker's broken mode sets it.
MarkersHook = Callable[[Sequence[Callable[[], Awaitable[None]]]], Awaitable[None]]


class TransactionCoordinator:
    """The shards of the ``__transaction_state`` partitions held here, and the routing of
    transactional requests to them. A listener of the topic registry."""

    def __init__(
        self,
        view: MetadataView,
        config: BrokerConfig,
        clock: Clock,
        producer_ids: ProducerIdAllocator,
        before_decision: MarkersHook | None = None,
    ) -> None:
        self._config = config
        self._before_decision = before_decision
        self._view = view
        self._clock = clock
        self._producer_ids = producer_ids
        self._params = tx.TransactionParams(
            max_timeout_ms=config.transaction_max_timeout_ms,
            expiration_ms=config.transactional_id_expiration_ms,
        )
        self._topic = CoordinatorTopic(
            view,
            config.node_id,
            TRANSACTION_STATE_TOPIC,
            config.transaction_state_log_num_partitions,
            TOPIC_CONFIGS,
        )
        self._shards: dict[int, TransactionShard] = {}
        self._loads: dict[TransactionShard, asyncio.Task[None]] = {}
        self._markers: set[asyncio.Task[None]] = set()
        self._registry: TopicRegistry | None = None
        # Set by start: a shard may load (and write the markers of what its log left
        # preparing) while the broker's other partitions still open, before the registry the
        # marker writers look partitions up in is given.
        self._started = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self._links: dict[tuple[str, int], BrokerLink] = {}
        # Set before the first transactional request, the shards record the steps of one
        # transactional id (transaction_shard.TransactionTrace, tests), or of every new one into
        # files (transaction.trace.dir: TransactionTraceFiles).
        self.trace: TransactionTrace | TransactionTraceFiles | None = (
            TransactionTraceFiles(Path(config.transaction_trace_dir))
            if config.transaction_trace_dir
            else None
        )

    # ------------------------------------------------------------------------- lifecycle

    def start(self, topics: TopicRegistry) -> None:
        """Serve with ``topics``, the registry whose partitions' opens told this coordinator
        of its shards (:meth:`partition_taken`: they load from then on; markers they write
        before this wait for it)."""
        self._registry = topics
        self._topic.start(topics)
        self._started.set()
        self._ticker = asyncio.create_task(self._tick_forever(), name="transaction-ticker")

    async def ready(self, timeout_s: float) -> None:
        """Until the topic exists, if it is being created, and every shard held here has loaded
        (at most ``timeout_s``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                if self._topic.creating is not None:
                    await asyncio.wait([self._topic.creating])
                loads = list(self._loads.values())
                if loads:
                    await asyncio.wait(loads)

    async def close(self) -> None:
        await self._topic.close()
        tasks = [self._ticker, *self._markers]
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
        for shard in list(self._shards.values()):
            await self._stop(shard)
        self._shards.clear()
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()

    # --------------------------------------------------------- the topic registry's listener

    def partition_taken(self, partition: Partition) -> None:
        if partition.topic != TRANSACTION_STATE_TOPIC:
            return
        shard = TransactionShard(
            partition,
            self._clock,
            self._write_markers,
            None if self._before_decision is None else self._markers_now,
            self.trace,
        )
        self._shards[partition.index] = shard
        self._loads[shard] = asyncio.create_task(
            self._load(shard), name=f"transaction-shard-load-{partition.index}"
        )

    async def partition_given_up(self, partition: Partition) -> None:
        if partition.topic != TRANSACTION_STATE_TOPIC:
            return
        shard = self._shards.get(partition.index)
        if shard is None or shard.partition is not partition:
            return
        del self._shards[partition.index]
        await self._stop(shard)

    async def _stop(self, shard: TransactionShard) -> None:
        shard.stop()
        task = self._loads.pop(shard, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _load(self, shard: TransactionShard) -> None:
        while True:
            started_s = time.monotonic()
            try:
                await shard.replay()
                shard.start(self._params)
            except Exception:
                log.exception("transaction coordinator partition %d not loaded", shard.index)
                await asyncio.sleep(LOAD_RETRY_S)
                continue
            entries = shard.state.entries
            log.log(
                logging.INFO if entries else logging.DEBUG,
                "transaction coordinator partition loaded %s",
                fields(
                    partition=shard.index,
                    ids=len(entries),
                    seconds=round(time.monotonic() - started_s, 3),
                ),
            )
            self._loads.pop(shard, None)
            return

    # --------------------------------------------------------------------------- routing

    async def _existing(self) -> None:
        if self._topic.placement() is None:
            self._topic.ensure()
            await self.ready(CREATE_WAIT_S)

    async def coordinator(self, transactional_id: str) -> int | KafkaErrorCode:
        """The broker coordinating ``transactional_id`` (FindCoordinator, key type 1)."""
        await self._existing()
        return self._topic.coordinator(transactional_id)

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tx.InitProducerIdAnswer:
        await self._existing()
        routed = self._topic.route(transactional_id, self._shards)
        if isinstance(routed, KafkaErrorCode):
            return tx.InitProducerIdAnswer(routed)
        fresh = None
        if tx.needs_producer_id(routed.state, transactional_id):
            fresh = await self._producer_ids.allocate()
        try:
            answer = await routed.request(
                lambda request_id, now_ms: tx.InitProducerId(
                    request_id,
                    transactional_id,
                    timeout_ms,
                    now_ms,
                    producer_id,
                    producer_epoch,
                    fresh,
                )
            )
        except ShardGone:
            return tx.InitProducerIdAnswer(KafkaErrorCode.NOT_COORDINATOR)
        assert isinstance(answer, tx.InitProducerIdAnswer)
        return answer

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tx.PartitionKey],
        *,
        verify_only: bool = False,
    ) -> tx.PartitionsAnswer:
        """AddPartitionsToTxn (``verify_only``: the v4+ verification form): an error per
        partition. A producer's request that comes while its previous transaction writes its
        markers (the usual case for the first partition of the next transaction: EndTxn is
        answered before the markers) is stepped once they are written, for at most
        ``COMPLETION_WAIT_S``, in the step of the last one, so that its Ongoing record goes to
        the log right behind the Complete* record, in the same WAL group commit; past that it
        is asked at once (``CONCURRENT_TRANSACTIONS``, for the client to ask again)."""
        wanted = tuple(partitions)
        await self._existing()
        routed = self._topic.route(transactional_id, self._shards)
        if isinstance(routed, KafkaErrorCode):
            return tx.PartitionsAnswer(tuple((p, routed) for p in wanted))

        def add(request_id: int, now_ms: int) -> tx.AddPartitionsToTxn:
            return tx.AddPartitionsToTxn(
                request_id,
                transactional_id,
                producer_id,
                producer_epoch,
                wanted,
                now_ms,
                verify_only,
            )

        def completed(state: tx.CoordinatorState) -> bool:
            return not tx.writing_markers(state, transactional_id, producer_id, producer_epoch)

        try:
            if verify_only:
                answer = await routed.request(add)
            else:
                deferred = routed.request_when(completed, add)
                try:
                    async with asyncio.timeout(COMPLETION_WAIT_S):
                        answer = await asyncio.shield(deferred.answer)
                except TimeoutError:
                    if routed.withdraw(deferred):
                        answer = await routed.request(add)
                    else:
                        answer = await deferred.answer
                except asyncio.CancelledError:  # its connection closed: not asked, if not yet
                    routed.withdraw(deferred)
                    raise
        except ShardGone:
            return tx.PartitionsAnswer(tuple((p, KafkaErrorCode.NOT_COORDINATOR) for p in wanted))
        assert isinstance(answer, tx.PartitionsAnswer)
        return answer

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partition: tx.PartitionKey,
    ) -> KafkaErrorCode:
        """A partition leader's check before the first write of a transaction lands there
        (KIP-890): NONE if ``partition`` is in the producer's ongoing transaction. Asked in
        process when the id is coordinated here, else as AddPartitionsToTxn v4 (verify only) of
        the coordinator's broker."""
        await self._existing()
        leader = self._topic.coordinator(transactional_id)
        if isinstance(leader, KafkaErrorCode):
            return leader
        if leader == self._config.node_id:
            answer = await self.add_partitions(
                transactional_id, producer_id, producer_epoch, [partition], verify_only=True
            )
            return dict(answer.errors).get(partition, KafkaErrorCode.UNKNOWN_SERVER_ERROR)
        link = self._link(leader)
        if link is None:
            return KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
        body = build(
            request_class(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION),
            {
                "transactions": [
                    {
                        "transactional_id": transactional_id,
                        "producer_id": producer_id,
                        "producer_epoch": producer_epoch,
                        "verify_only": True,
                        "topics": [{"name": partition[0], "partitions": [partition[1]]}],
                    }
                ]
            },
        )
        try:
            response = await link.request(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, body)
        except BrokerLinkError:
            return KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
        if int(response.error_code.value) != 0:
            return KafkaErrorCode(int(response.error_code.value))
        for result in response.results_by_transaction:
            for topic in result.topic_results:
                for found in topic.results_by_partition:
                    if (topic.name, int(found.partition_index)) == partition:
                        return KafkaErrorCode(int(found.partition_error_code.value))
        return KafkaErrorCode.UNKNOWN_SERVER_ERROR

    def _link(self, node_id: int) -> BrokerLink | None:
        """The link to broker ``node_id`` at its inter-broker listener (None: unknown)."""
        broker = self._view.image.brokers.get(node_id)
        address = None if broker is None else inter_broker_address(broker, self._config)
        if address is None:
            return None
        link = self._links.get(address)
        if link is None:
            client_id = f"transaction-coordinator-{self._config.node_id}"
            link = self._links[address] = BrokerLink(
                *address, client_id, link_connect(self._config, client_id)
            )
        return link

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> KafkaErrorCode:
        await self._existing()
        routed = self._topic.route(transactional_id, self._shards)
        if isinstance(routed, KafkaErrorCode):
            return routed
        try:
            answer = await routed.request(
                lambda request_id, now_ms: tx.EndTxn(
                    request_id, transactional_id, producer_id, producer_epoch, commit, now_ms
                )
            )
        except ShardGone:
            return KafkaErrorCode.NOT_COORDINATOR
        assert isinstance(answer, tx.EndTxnAnswer)
        return answer.error

    async def stepped(self, transactional_id: str) -> None:
        """Until the shard of ``transactional_id`` steps (at once if no shard here serves it)."""
        routed = self._topic.route(transactional_id, self._shards)
        if not isinstance(routed, KafkaErrorCode):
            await routed.stepped()

    def describe(self, transactional_ids: Sequence[str]) -> list[Described]:
        """DescribeTransactions: each id's durable metadata, or the error for it
        (``TRANSACTIONAL_ID_NOT_FOUND`` for an id this broker coordinates but does not know)."""
        found: list[Described] = []
        for transactional_id in transactional_ids:
            routed = self._topic.route(transactional_id, self._shards)
            if isinstance(routed, KafkaErrorCode):
                found.append((transactional_id, routed, None))
                continue
            metadata = tx.describe(routed.state, transactional_id)
            error = KafkaErrorCode.NONE if metadata else KafkaErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            found.append((transactional_id, error, metadata))
        return found

    def listed(self) -> tuple[KafkaErrorCode, list[tx.TransactionMetadata]]:
        """ListTransactions: every id of every shard here (``COORDINATOR_LOAD_IN_PROGRESS``
        while one loads)."""
        shards = list(self._shards.values())
        if any(not shard.serving for shard in shards):
            return KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []
        found = [metadata for shard in shards for metadata in tx.listed(shard.state)]
        return KafkaErrorCode.NONE, sorted(found, key=lambda m: m.transactional_id)

    # --------------------------------------------------------------------------- markers

    def _write_markers(self, shard: TransactionShard, effect: tx.WriteMarkers) -> None:
        """The shard's executor of ``WriteMarkers``: a task per partition."""
        for key in sorted(effect.partitions):
            task = asyncio.get_running_loop().create_task(
                self._write_marker(shard, effect, key), name=f"marker {key[0]}-{key[1]}"
            )
            self._markers.add(task)
            task.add_done_callback(self._markers.discard)

    async def _markers_now(self, shard: TransactionShard, effect: tx.WriteMarkers) -> None:
        """The ``before_decision`` seam's call: the hook gets one writer per partition."""
        assert self._before_decision is not None
        await self._before_decision(
            [
                functools.partial(self._write_marker, shard, effect, key)
                for key in sorted(effect.partitions)
            ]
        )

    async def _write_marker(
        self, shard: TransactionShard, effect: tx.WriteMarkers, key: tx.PartitionKey
    ) -> None:
        delay_s, most_s = MARKER_RETRY_S
        # A shard loaded while the broker was starting writes its markers once the broker is
        # up (the partitions they go to may be among those still opening then).
        await self._started.wait()
        registry = self._registry
        assert registry is not None
        while not shard.stopped:
            partition = registry.partitions.get(key)
            if partition is None:
                topic = registry.topics.get(key[0])
                if topic is None or key[1] >= topic.partitions:
                    error = KafkaErrorCode.NONE  # deleted: nothing to mark
                else:
                    error = await self._write_remote(shard, effect, key)
            else:
                try:
                    error = await partition.write_marker(
                        effect.producer_id,
                        effect.producer_epoch,
                        shard.coordinator_epoch,
                        effect.commit,
                    )
                except Exception as failure:  # the partition closed or its storage failed
                    log.warning(
                        "marker not written yet %s: %r",
                        fields(**_marker_fields(effect, key)),
                        failure,
                    )
                    error = KafkaErrorCode.KAFKA_STORAGE_ERROR
            if error is KafkaErrorCode.NONE:
                if shard.trace is not None:
                    shard.trace.marker_written(effect, key)
                shard.step(tx.MarkerWritten(effect.transactional_id, key, effect.producer_epoch))
                return
            if error in (
                KafkaErrorCode.TRANSACTION_COORDINATOR_FENCED,
                KafkaErrorCode.INVALID_PRODUCER_EPOCH,
            ):
                log.warning(
                    "marker refused: a newer coordinator writes it %s",
                    fields(**_marker_fields(effect, key), error=error.name),
                )
                return
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, most_s)

    async def _write_remote(
        self, shard: TransactionShard, effect: tx.WriteMarkers, key: tx.PartitionKey
    ) -> KafkaErrorCode:
        """The marker as WriteTxnMarkers to the broker placement assigns ``key`` (that broker's
        answer for it; NOT_LEADER_OR_FOLLOWER while it has none, or it is this one, opening)."""
        placed = sm.placed_topic(self._view.image, key[0])
        assignment = placed.partitions.get(key[1]) if placed is not None else None
        if assignment is None or assignment.leader < 0:
            return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        link = None if assignment.leader == self._config.node_id else self._link(assignment.leader)
        if link is None:
            return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        body = build(
            request_class(WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION),
            {
                "markers": [
                    {
                        "producer_id": effect.producer_id,
                        "producer_epoch": effect.producer_epoch,
                        "transaction_result": effect.commit,
                        "topics": [{"name": key[0], "partition_indexes": [key[1]]}],
                        "coordinator_epoch": shard.coordinator_epoch,
                    }
                ]
            },
        )
        try:
            response = await link.request(WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, body)
        except BrokerLinkError as error:
            log.warning("marker not sent yet %s: %s", fields(**_marker_fields(effect, key)), error)
            return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        for marker in response.markers:
            for topic in marker.topics:
                for result in topic.partitions:
                    if topic.name == key[0] and int(result.partition_index) == key[1]:
                        return KafkaErrorCode(int(result.error_code.value))
        return KafkaErrorCode.UNKNOWN_SERVER_ERROR

    # ------------------------------------------------------------------------------ time

    async def _tick_forever(self) -> None:
        interval_s = self._config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self._clock.now_ms()
            for shard in list(self._shards.values()):
                shard.tick(now_ms)


def _marker_fields(effect: tx.WriteMarkers, key: tx.PartitionKey) -> dict[str, object]:
    return {
        "transactional_id": effect.transactional_id,
        "topic": key[0],
        "partition": key[1],
        "producer_id": effect.producer_id,
        "producer_epoch": effect.producer_epoch,
        "commit": effect.commit,
    }
