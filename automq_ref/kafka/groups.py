"""The group coordinator: groups spread over the partitions of ``__consumer_offsets``, one shard
per partition this broker leads.

A group's *coordinator partition* is ``abs(hashCode(group id)) % partitions`` of the internal
topic ``__consumer_offsets`` (:func:`coordinator_partition`, Kafka's own formula, so a group
lands where Kafka would put it), and its coordinator is the broker placement assigns that
partition. This broker runs one :class:`~automq_ref.kafka.group_shard.GroupShard` per coordinator
partition it holds: the topic registry tells it when it takes one (:meth:`partition_taken`: the
shard loads from the partition's log, then serves) and when it gives one up
(:meth:`partition_given_up`, before the partition closes: the shard stops and its waiting
requests are answered ``NOT_COORDINATOR``). So a group's offsets move with its partition: no
byte is copied, the next broker replays the same log.

Routing (:meth:`GroupCoordinator.request` and the many-group requests): a request for a group
whose partition is led here and loaded goes to its shard; while the shard loads, or while the
partition is placed here but not taken yet, the answer is ``COORDINATOR_LOAD_IN_PROGRESS``; a
group this broker does not coordinate (or any group before the topic exists) is answered
``NOT_COORDINATOR``, and the client asks FindCoordinator again (:meth:`coordinator`: the
partition's broker, ``COORDINATOR_NOT_AVAILABLE`` while the topic does not exist or the partition
has no broker). OffsetFetch v8+, DescribeGroups and DeleteGroups name many groups: each goes to
its own shard, and a group coordinated elsewhere gets its own ``NOT_COORDINATOR``. ListGroups
lists the groups of every shard here (Kafka's admin client asks every broker);
``COORDINATOR_LOAD_IN_PROGRESS`` while one of them loads.

The topic is created through the controller like any topic, by the first group request a
broker receives (FindCoordinator, as in Kafka, or any other; ``CreateTopic`` is put-if-absent,
so any broker may): :meth:`topic_created` creates it and waits until it exists and the shards
placed here have loaded, so the first consumer is answered rather than told to retry. Not at
start, so a node that never serves a group never has it, except when an earlier version's
offsets stream is there to import (:mod:`automq_ref.kafka.group_import`): then at start
(:meth:`start`; a single node waits for it, :meth:`ready`). It has
``offsets.topic.num.partitions`` partitions (Kafka's setting and default, 50) and
``cleanup.policy=compact``: the shards write one key per committed offset, so compaction keeps
each offset's latest value and drops deleted groups' tombstones after ``delete.retention.ms``.

One ticker feeds every shard's timers: it wakes at the earliest deadline of any shard (at least
every 100 ms) and ticks each shard that holds groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.io.clock import Clock
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.kafka import group_import
from automq_ref.kafka.coordinator_topic import CoordinatorTopic, coordinator_partition
from automq_ref.kafka.group_import import Offsets
from automq_ref.kafka.group_shard import GroupShard, ShardGone
from automq_ref.kafka.partition import Partition
from automq_ref.state_machines import group as gc
from automq_ref.vocabulary.naming import CONSUMER_OFFSETS_TOPIC

if TYPE_CHECKING:
    from automq_ref.kafka.topic_registry import TopicRegistry

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.1  # the longest the ticker sleeps; it wakes earlier for a known deadline
TICK_MIN_S = 0.001
LOAD_RETRY_S = 1.0  # a shard whose load failed (storage, controller) tries again after this
READY_WAIT_S = 30.0  # the longest a single node waits for its shards before it serves anyway
# The longest a group request waits for the topic it made a broker create: well under clients'
# request timeouts (30 s and more), well over a creation (about a second on three brokers).
CREATE_WAIT_S = 10.0
# The topic's configs (Kafka's own for it: compacted, so each offset's latest value stays).
TOPIC_CONFIGS = {"cleanup.policy": "compact"}

R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A", bound=gc.Response)


def _as(kind: type[A], response: gc.Response) -> A:
    """``response`` as the answer type its event has."""
    assert isinstance(response, kind), response
    return response


class GroupCoordinator:
    """The shards of the coordinator partitions held here, and the routing of group requests to
    them. A listener of the topic registry (:meth:`partition_taken`,
    :meth:`partition_given_up`)."""

    def __init__(
        self,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        config: BrokerConfig,
        clock: Clock,
    ) -> None:
        self._storage = storage
        self._client = client
        self._view = view
        self._config = config
        self._clock = clock
        self._params = gc.GroupParams(
            group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            group_min_session_timeout_ms=config.group_min_session_timeout_ms,
            group_max_session_timeout_ms=config.group_max_session_timeout_ms,
            consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            consumer_max_size=config.group_consumer_max_size,
            consumer_assignors=tuple(config.group_consumer_assignors.split(",")),
        )
        self._shards: dict[int, GroupShard] = {}
        self._loads: dict[GroupShard, asyncio.Task[None]] = {}
        # Each old offsets stream, read once for every shard that imports it.
        self._old: dict[int, asyncio.Task[Offsets | None]] = {}
        self._topic = CoordinatorTopic(
            view,
            config.node_id,
            CONSUMER_OFFSETS_TOPIC,
            config.offsets_topic_num_partitions,
            TOPIC_CONFIGS,
        )
        self._ticker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------- lifecycle

    def start(self, topics: TopicRegistry) -> None:
        """Run the ticker; create ``__consumer_offsets`` now if an earlier version's offsets
        stream is there to import (else at the first group request)."""
        self._topic.start(topics)
        self._ticker = asyncio.create_task(self._tick_forever(), name="group-ticker")
        if group_import.old_streams(self._view.image):
            self.ensure_topic()

    async def ready(self, timeout_s: float = READY_WAIT_S) -> None:
        """Until the topic exists, if it is being created, and every shard held here has
        loaded (at most ``timeout_s``: a shard that cannot load answers
        ``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile)."""
        try:
            async with asyncio.timeout(timeout_s):
                # asyncio.wait: a task cancelled meanwhile (a shard stopped) ends the wait for
                # it without cancelling this caller.
                if self._topic.creating is not None:
                    await asyncio.wait([self._topic.creating])
                loads = list(self._loads.values())
                if loads:
                    await asyncio.wait(loads)
        except TimeoutError:
            log.warning(
                "group coordinator not ready %s",
                fields(loading=sorted(s.index for s in self._shards.values() if not s.serving)),
            )

    async def close(self) -> None:
        """Stop every shard (their waiting requests answered ``NOT_COORDINATOR``) and the
        tasks; the partitions are closed by their owner, the topic registry."""
        await self._topic.close()
        for task in (self._ticker, *self._old.values()):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for shard in list(self._shards.values()):
            await self._stop(shard, moved=False)
        self._shards.clear()

    async def abandon(self) -> None:
        """Stop at once (this broker was fenced): as :meth:`close`."""
        await self.close()

    # --------------------------------------------------------- the topic registry's listener

    def partition_taken(self, partition: Partition) -> None:
        """A partition was taken here: a coordinator partition's shard starts loading."""
        if partition.topic != CONSUMER_OFFSETS_TOPIC:
            return
        shard = GroupShard(partition, self._clock)
        self._shards[partition.index] = shard
        self._loads[shard] = asyncio.create_task(
            self._load(shard), name=f"group-shard-load-{partition.index}"
        )

    async def partition_given_up(self, partition: Partition) -> None:
        """A partition is given up (before it closes): a coordinator partition's shard stops."""
        if partition.topic != CONSUMER_OFFSETS_TOPIC:
            return
        shard = self._shards.get(partition.index)
        if shard is None or shard.partition is not partition:
            return
        del self._shards[partition.index]
        await self._stop(shard)

    async def _stop(self, shard: GroupShard, *, moved: bool = True) -> None:
        shard.stop()
        task = self._loads.pop(shard, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        # Every shard stops at shutdown: only a partition given up is worth a line each.
        log.log(
            logging.INFO if moved else logging.DEBUG,
            "group coordinator partition unloaded %s",
            fields(partition=shard.index),
        )

    async def _load(self, shard: GroupShard) -> None:
        while True:
            started_s = time.monotonic()
            try:
                await shard.replay()
                imported = await self._import_old(shard)
                shard.start(self._params)
            except Exception:
                log.exception("group coordinator partition %d not loaded", shard.index)
                await asyncio.sleep(LOAD_RETRY_S)
                continue
            state = shard.state
            # A start loads every partition placed here, most of them empty: those at DEBUG.
            log.log(
                logging.INFO if state.offsets or imported else logging.DEBUG,
                "group coordinator partition loaded %s",
                fields(
                    partition=shard.index,
                    groups=len(state.groups),
                    offsets=sum(len(o) for o in state.offsets.values()),
                    imported=imported,
                    seconds=round(time.monotonic() - started_s, 3),
                ),
            )
            return

    async def _import_old(self, shard: GroupShard) -> int:
        """Import the offsets of earlier versions' offsets streams into ``shard`` (each stream
        once per partition); how many offsets were appended."""
        appended = 0
        for old in group_import.old_streams(self._view.image):
            partitions = self._partition_count()
            if partitions is None:
                break
            if group_import.imported(self._view.image, old, shard.index):
                await group_import.delete_if_imported(
                    self._client, self._storage, self._view, old, partitions
                )
                continue
            offsets = await asyncio.shield(self._old_offsets(old.stream_id))
            if offsets is None:
                log.info(
                    "old offsets stream still open: imported later %s",
                    fields(stream=old.stream_id, partition=shard.index),
                )
                continue
            mine = {
                group_id: committed
                for group_id, committed in offsets.items()
                if coordinator_partition(group_id, partitions) == shard.index
            }
            appended += await shard.import_offsets(mine)
            await group_import.mark_imported(
                self._client, self._storage, self._view, old, shard.index, partitions
            )
        return appended

    def _old_offsets(self, stream_id: int) -> asyncio.Task[Offsets | None]:
        task = self._old.get(stream_id)
        if task is None or (
            task.done() and (task.cancelled() or task.exception() or task.result() is None)
        ):
            task = asyncio.create_task(
                group_import.read_old_stream(self._storage, self._view.image, stream_id)
            )
            self._old[stream_id] = task
        return task

    # ------------------------------------------------------------------------------ topic

    def ensure_topic(self) -> None:
        """Create ``__consumer_offsets`` in the background unless it exists or is being
        created."""
        self._topic.ensure()

    async def topic_created(self) -> None:
        """Until ``__consumer_offsets`` exists (created here or elsewhere) and the shards then
        placed here have loaded: a group request (FindCoordinator included) that finds no topic
        creates it and waits, as Metadata waits for a topic it creates, so that the first
        consumer is served without retrying; at most :data:`CREATE_WAIT_S`."""
        self.ensure_topic()
        await self.ready(CREATE_WAIT_S)

    def _partition_count(self) -> int | None:
        return self._topic.partition_count()

    def serving_states(self) -> list[gc.CoordinatorState]:
        """The machine state of every shard serving here (the metrics read them)."""
        return [shard.state for shard in self._shards.values() if shard.serving]

    # --------------------------------------------------------------------------- routing

    async def _existing(self) -> None:
        if self._topic.placement() is None:
            await self.topic_created()

    async def coordinator(self, group_id: str) -> int | KafkaErrorCode:
        """The broker coordinating ``group_id`` (FindCoordinator)."""
        await self._existing()
        return self._topic.coordinator(group_id)

    async def partition_of(self, group_id: str) -> int | None:
        """The ``__consumer_offsets`` partition of ``group_id`` (AddOffsetsToTxn adds it to a
        transaction); None while the topic does not exist."""
        await self._existing()
        return self._topic.partition_of(group_id)

    def _route(self, group_id: str) -> GroupShard | KafkaErrorCode:
        return self._topic.route(group_id, self._shards)

    async def request(
        self,
        group_id: str,
        make_event: Callable[[int, int], gc.GroupEvent],
        refused: Callable[[KafkaErrorCode], gc.Response],
        verification_guard: Callable[[Partition], Awaitable[int | KafkaErrorCode]] | None = None,
    ) -> gc.Response:
        """Step ``make_event(request_id, now_ms)`` in ``group_id``'s shard and await the
        machine's answer; ``refused(error)`` when this broker does not serve the group now.
        ``verification_guard`` (a TxnOffsetCommit): asked for the guard of the transactional
        append to the group's partition, or the error that refuses the request."""
        await self._existing()
        routed = self._route(group_id)
        if isinstance(routed, KafkaErrorCode):
            return refused(routed)
        guard = 0
        if verification_guard is not None:
            verified = await verification_guard(routed.partition)
            if isinstance(verified, KafkaErrorCode):
                return refused(verified)
            guard = verified
        try:
            return await routed.request(make_event, guard)
        except ShardGone:
            return refused(KafkaErrorCode.NOT_COORDINATOR)

    async def _per_shard(
        self,
        group_ids: Sequence[str],
        items: Sequence[T],
        event: Callable[[int, int, tuple[T, ...]], gc.GroupEvent],
        answers: Callable[[gc.Response], Sequence[R]],
        refused: Callable[[int, KafkaErrorCode], R],
    ) -> list[R]:
        """One answer per group of ``group_ids``, in order: each shard is asked once, with
        ``event(request_id, now, items)`` of the items (``items[p]`` for group ``p``) of the
        groups it serves, and ``answers(response)`` gives their answers in order;
        ``refused(position, error)`` answers each group this broker does not serve."""
        await self._existing()
        results: list[R | None] = [None] * len(group_ids)
        by_shard: dict[GroupShard, list[int]] = {}
        for position, group_id in enumerate(group_ids):
            routed = self._route(group_id)
            if isinstance(routed, KafkaErrorCode):
                results[position] = refused(position, routed)
            else:
                by_shard.setdefault(routed, []).append(position)

        async def one(shard: GroupShard, positions: list[int]) -> None:
            wanted = tuple(items[p] for p in positions)
            try:
                response = await shard.request(
                    lambda request_id, now: event(request_id, now, wanted)
                )
                answered = answers(response)
            except ShardGone:
                answered = [refused(p, KafkaErrorCode.NOT_COORDINATOR) for p in positions]
            for position, result in zip(positions, answered, strict=True):
                results[position] = result

        await asyncio.gather(*(one(shard, positions) for shard, positions in by_shard.items()))
        found = [result for result in results if result is not None]
        assert len(found) == len(results)
        return found

    async def offset_fetch(
        self, groups: Sequence[gc.OffsetFetchGroup], require_stable: bool = False
    ) -> gc.OffsetFetchResponse:
        results = await self._per_shard(
            [g.group_id for g in groups],
            groups,
            lambda request_id, now, wanted: gc.OffsetFetch(request_id, now, wanted, require_stable),
            lambda response: _as(gc.OffsetFetchResponse, response).groups,
            lambda p, error: gc.OffsetFetchGroupResult(groups[p].group_id, error, ()),
        )
        return gc.OffsetFetchResponse(tuple(results))

    async def describe_groups(self, group_ids: Sequence[str]) -> gc.DescribeGroupsResponse:
        results = await self._per_shard(
            group_ids,
            group_ids,
            gc.DescribeGroups,
            lambda response: _as(gc.DescribeGroupsResponse, response).groups,
            lambda p, error: gc.DescribedGroup(group_ids[p], error, "", "", "", ()),
        )
        return gc.DescribeGroupsResponse(tuple(results))

    async def consumer_group_describe(
        self, group_ids: Sequence[str]
    ) -> gc.ConsumerGroupDescribeResponse:
        """ConsumerGroupDescribe: each group by its shard (KIP-848 groups with their members)."""
        results = await self._per_shard(
            group_ids,
            group_ids,
            gc.ConsumerGroupDescribe,
            lambda response: _as(gc.ConsumerGroupDescribeResponse, response).groups,
            lambda p, error: gc.DescribedConsumerGroup(group_ids[p], error),
        )
        return gc.ConsumerGroupDescribeResponse(tuple(results))

    async def delete_groups(self, group_ids: Sequence[str]) -> gc.DeleteGroupsResponse:
        distinct = list(dict.fromkeys(group_ids))  # one result per group, as the machine gives
        results = await self._per_shard(
            distinct,
            distinct,
            gc.DeleteGroups,
            lambda response: _as(gc.DeleteGroupsResponse, response).results,
            lambda p, error: gc.DeletedGroupResult(distinct[p], error),
        )
        return gc.DeleteGroupsResponse(tuple(results))

    async def delete_offsets(
        self, group_id: str, partitions: tuple[gc.TopicPartition, ...]
    ) -> gc.OffsetDeleteResponse:
        """OffsetDelete of ``group_id``'s offsets of ``partitions`` (partitions the cluster has),
        in the group's shard; the routing's error as the answer's group-level error."""
        response = await self.request(
            group_id,
            lambda request_id, now: gc.OffsetDelete(request_id, now, group_id, partitions),
            lambda error: gc.OffsetDeleteResponse(error),
        )
        assert isinstance(response, gc.OffsetDeleteResponse)
        return response

    async def list_groups(
        self, states: tuple[str, ...], types: tuple[str, ...]
    ) -> gc.ListGroupsResponse:
        """The groups of every shard here (``COORDINATOR_LOAD_IN_PROGRESS`` while one loads;
        none before the topic exists, which listing does not create)."""
        shards = list(self._shards.values())
        if any(not shard.serving for shard in shards):
            return gc.ListGroupsResponse(KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ())

        async def one(shard: GroupShard) -> tuple[gc.ListedGroup, ...]:
            try:
                response = await shard.request(
                    lambda request_id, now: gc.ListGroups(request_id, now, states, types)
                )
            except ShardGone:
                return ()  # moved away meanwhile: its new broker lists them
            assert isinstance(response, gc.ListGroupsResponse)
            return response.groups

        found = await asyncio.gather(*(one(shard) for shard in shards))
        listed = sorted((g for groups in found for g in groups), key=lambda g: g.group_id)
        return gc.ListGroupsResponse(KafkaErrorCode.NONE, tuple(listed))

    # ------------------------------------------------------------------------------ time

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._until_next_tick_s())
            now_ms = self._clock.now_ms()
            for shard in list(self._shards.values()):
                shard.tick(now_ms)

    def _until_next_tick_s(self) -> float:
        deadlines = [
            deadline
            for shard in self._shards.values()
            if (deadline := shard.next_deadline_ms()) is not None
        ]
        if not deadlines:
            return TICK_INTERVAL_S
        wait_s = (min(deadlines) - self._clock.now_ms()) / 1000
        return min(max(wait_s, TICK_MIN_S), TICK_INTERVAL_S)
