"""The topic registry: the cluster's topics, the partitions this broker leads, and the changes
to them.

It owns the map from topic name to :class:`Topic` (every topic of the cluster, as the metadata
view shows it) and from (name, index) to :class:`Partition` (the partitions this broker holds
open: the ones placement assigns it), and the one lock under which topics are created, deleted,
grown and reconfigured and partitions taken and given up, so that two changes never interleave.

Topics. Other brokers change the same KV, so every change is conditional, decided by the
controller: a topic is created if absent (``CreateTopic``; another broker's topic of that name:
``TOPIC_ALREADY_EXISTS``), grown (``CreatePartitions``) and reconfigured (``PutKV``) with
compare-and-set and deleted (``DeleteTopic``) with compare-and-delete on the record this registry
read or wrote last. Creating and growing place the new partitions on live brokers in the same
decision (by hand when the request assigns them); a topic found at open whose partitions are not
all placed (written before placement existed) is placed then, its record written again. When
another broker changed only the topic's configs meanwhile, the registry takes its record and
decides the change once more on it; a topic deleted, re-created or grown elsewhere is answered
with an error, and so is a change that loses twice.

Partitions follow placement (:meth:`reconcile`). Each partition has one broker and a leader
epoch (``broker_partitions``); this broker holds open exactly the partitions assigned to it, at
their leader epochs:

- a partition assigned here that has no streams yet (a new topic or partition) is created here:
  its streams tagged with the partition, opened at the leader epoch, then its KV entry; a
  partition that has them is opened at the leader epoch (its log scanned);
- a partition no longer assigned here (moved to another broker, or here again at a later
  epoch) is given up: it leaves :attr:`partitions` first, so Produce, Fetch and ListOffsets
  answer ``NOT_LEADER_OR_FOLLOWER`` from then on, then its streams are closed, which uploads
  what the WAL holds for them. The new broker's open is refused (``STREAM_NOT_CLOSED``) until
  then, and tried again at the next change of the image (the close is one) or after
  :data:`RETRY_S`;
- a topic deleted (here or by another broker) has the partitions held here deleted: streams
  and KV entries.

A request for a partition placed here that this broker has not opened yet (:meth:`opening`)
may wait for the open (:meth:`wait_opened`, up to ``partition.open.wait.ms``): right after a
move or a crash failover, the client's next request then finds the partition open instead of
backing off from ``NOT_LEADER_OR_FOLLOWER``.

Listeners (:class:`PartitionListener`, given to :meth:`TopicRegistry.open`; the group
coordinator is one) hear each partition taken, once it is open and in :attr:`partitions`, and
each one given up or deleted, after it left :attr:`partitions` and before its streams close.

The view's changes drive it: :meth:`follow` runs a task that takes in topic changes and
reconciles partitions at each new image. Admin changes made through this broker reconcile at
once, and creating or growing a topic waits (up to :data:`READY_WAIT_S`) until every new
partition is open on its broker, so a client that produces right after CreateTopics finds its
leaders (as Kafka answers once the leaders are elected).

``topic_config`` answers a topic's effective config: its own setting, else the broker's setting
of the config's synonym (``log.retention.ms``, ...), else Kafka's default. What a config may be
and how a change applies is :mod:`automq_ref.kafka.topic_configs`' (the catalog).

Every change that took effect is logged at INFO, one line each (``topic created``, ``topic
deleted``, ``topic partitions added``, ``topic configs altered``, ``partition led``, ``partition
given up``) with its fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.errors import FormatError
from automq_ref.formats.topic_record import Topic, topics_in
from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.logfmt import fields
from automq_ref.io.metadata.client import ControllerClient, ControllerError
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import PlacementRefusedError, S3Storage, StorageError
from automq_ref.kafka.partition import Partition, PartitionExistsError
from automq_ref.kafka.producer_expiry import ProducerExpiry
from automq_ref.kafka.topic_configs import (
    ConfigChange,
    altered_configs,
    check_configs,
    effective_defaults,
    replaced_configs,
)
from automq_ref.kafka.topics import TopicError, check_replica_assignment, check_topic_name
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import partition_key, topic_key

log = logging.getLogger(__name__)


class PartitionListener(Protocol):
    """Told when this broker takes a partition and when it gives one up."""

    def partition_taken(self, partition: Partition) -> None:
        """``partition`` is open here and in :attr:`TopicRegistry.partitions`."""

    async def partition_given_up(self, partition: Partition) -> None:
        """``partition`` left :attr:`TopicRegistry.partitions`; its streams close (or are
        deleted) once this returns."""


class TopicRegistry:
    def __init__(
        self,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        config: BrokerConfig,
        listeners: Sequence[PartitionListener] = (),
        clock: Clock | None = None,
    ) -> None:
        self._storage = storage
        self._listeners = tuple(listeners)
        self._client = client
        self._view = view
        self._config = config
        self._node_id = config.node_id
        # The node's clock and producer.id.expiration.ms, for every partition opened here.
        self.producer_expiry = ProducerExpiry(
            clock or SystemClock(), config.producer_id_expiration_ms
        )
        # Each topic config's value where a topic does not set it: read once, since the
        # broker's settings do not change while it runs (and Produce asks on every request).
        self.config_defaults: Mapping[str, str] = effective_defaults(
            config.model_dump(by_alias=True)
        )
        self.topics: dict[str, Topic] = {}
        # Per topic, the traffic of its partitions no longer led here (bytes in, bytes out,
        # records in), so what the metrics report per topic only grows (kafka/broker_metrics.py).
        self.traffic_before: dict[str, tuple[int, int, int]] = {}
        self.partitions: dict[tuple[str, int], Partition] = {}
        # The leader epoch each held partition was taken at (its streams' epoch, except for
        # streams written before placement, opened above their own epoch).
        self._led_at: dict[tuple[str, int], int] = {}
        # Partitions given up whose close has not finished: a follower stopped in the middle
        # of one leaves it here, and the broker's shutdown closes it (see :meth:`unclosed`).
        self._leaving: dict[tuple[str, int], Partition] = {}
        # Each topic's KV record as this registry read or last wrote it: the condition of the
        # topic's next change (compare-and-set, compare-and-delete), so that a change another
        # node made meanwhile is never overwritten unseen.
        self._records: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self._follower: asyncio.Task[None] | None = None
        # Set by a round that could not take a partition yet (its old broker still has it
        # open): the follower tries again after RETRY_S even if nothing changes.
        self._waiting = False
        # Set (and replaced) whenever a partition is taken or a round ends: wakes the
        # requests held for a partition this broker is opening (wait_opened).
        self._opened = asyncio.Event()
        # Per held partition: when its loads were last reported, and its counters then.
        self._counted: weakref.WeakKeyDictionary[Partition, tuple[float, int, int]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def view(self) -> MetadataView:
        return self._view

    @classmethod
    async def open(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        config: BrokerConfig,
        listeners: Sequence[PartitionListener] = (),
        clock: Clock | None = None,
    ) -> TopicRegistry:
        """The registry of the topics in the controller's KV, the partitions placed on this
        broker opened (those it cannot take yet are left to :meth:`follow`); ``listeners``
        hear of every partition taken and given up from the first on; ``clock``: the node's
        (the partitions' time: producer expiry, marker timestamps)."""
        registry = cls(storage, client, view, config, listeners, clock)
        kv = view.image.kv
        for name, topic in sorted(topics_in(kv).items()):
            registry.topics[name] = topic
            registry._records[name] = kv[topic_key(name)]
            await registry._place_unplaced(name, topic)
        async with registry._lock:
            await registry.reconcile()
        return registry

    # ---------------------------------------------------------------------- following the view

    def follow(self) -> None:
        """From now on, take in the topics other brokers create, grow, reconfigure and delete,
        and the partitions placement gives and takes (as the view shows them), until
        :meth:`stop_following`."""
        self._follower = asyncio.create_task(self._follow_forever(), name="topic-follower")

    async def stop_following(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def _follow_forever(self) -> None:
        while True:
            # The version before the image: a change made after this read wakes the wait.
            version = self._view.version
            async with self._lock:
                try:
                    await self.catch_up()
                    await self.reconcile()
                    caught_up = True
                except Exception:
                    # A failure must not stop this broker from following: what was not taken
                    # in is taken at the next round.
                    log.exception("topics not caught up with the metadata")
                    caught_up = False
            if not caught_up:
                await asyncio.sleep(FOLLOW_RETRY_S)
            elif self._waiting:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that arrives as the wait ends, and this loop would outlive
                # stop_following.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._view.wait_for_change(version)
            else:
                await self._view.wait_for_change(version)

    async def catch_up(self) -> None:
        """Make this registry's topics the view's: another broker's new topic is taken in, a
        grown or reconfigured one takes the new record, a deleted one (or one re-created under
        a new id) has the partitions held here deleted. Called under the lock, or before
        anything else uses the registry."""
        kv = self._view.image.kv
        theirs = topics_in(kv)
        for name in sorted(set(self.topics) - set(theirs)):
            gone = self.topics.pop(name)
            del self._records[name]
            await self._drop_held(gone)
            self.traffic_before.pop(name, None)
            log.info("topic deleted elsewhere %s", fields(topic=name, topic_id=gone.topic_id))
        for name, topic in sorted(theirs.items()):
            record = kv[topic_key(name)]
            if self._records.get(name) == record:
                continue
            ours = self.topics.get(name)
            if ours is not None and ours.topic_id != topic.topic_id:
                await self._drop_held(ours)
            self.topics[name] = topic
            self._records[name] = record
            log.info(
                "topic changed elsewhere %s",
                fields(
                    topic=name,
                    partitions=topic.partitions,
                    configs=topic.configs,
                    topic_id=topic.topic_id,
                ),
            )

    async def reconcile(self) -> None:
        """Hold open exactly the partitions placement assigns this broker, each at its leader
        epoch: give up the others, then take the missing ones (together). Called under the
        lock."""
        image = self._view.image
        wanted = {
            (name, index): epoch
            for name, index, epoch in sm.broker_partitions(image, self._node_id)
            if name in self.topics and index < self.topics[name].partitions
        }
        # Together: each leaves the map at once (answering NOT_LEADER_OR_FOLLOWER), and the
        # first close seals the block holding all their data, the others wait for that upload.
        leaving = [key for key in sorted(self.partitions) if wanted.get(key) != self._led_at[key]]
        given_up = await asyncio.gather(
            *(self._give_up(key, wanted.get(key)) for key in leaving), return_exceptions=True
        )
        for failure in given_up:
            if isinstance(failure, BaseException):
                raise failure
        missing = sorted(key for key in wanted if key not in self.partitions)
        try:
            results = await asyncio.gather(
                *(self._take(key, wanted[key]) for key in missing), return_exceptions=True
            )
        finally:
            # Held requests look again: their partition may have moved on, or not opened.
            self._tell_opened()
        self._waiting = False
        created = False
        for key, result in zip(missing, results, strict=True):
            if isinstance(result, PlacementRefusedError | PartitionExistsError):
                # Not yet (the old broker is closing it) or not any more (moved again): the
                # next change of the image, or RETRY_S, decides again.
                log.debug("partition %s-%d not taken yet: %s", key[0], key[1], result)
                self._waiting = True
            elif isinstance(result, BaseException):
                log.error(
                    "partition not taken %s",
                    fields(topic=key[0], partition=key[1], error=repr(result)),
                )
                self._waiting = True
            else:
                created = created or result
        if created:
            # The new partitions' MetaStream records go to objects now rather than at the next
            # upload: a topic's skeleton then never depends on the WAL.
            await self._storage.force_upload(lc.ALL_STREAMS)

    async def _take(self, key: tuple[str, int], epoch: int) -> bool:
        """Open (or create, if it has no streams yet) partition ``key`` at leader epoch
        ``epoch``; True if it was created."""
        name, index = key
        topic = self.topics[name]
        began = time.monotonic()
        raw = self._view.image.kv.get(partition_key(topic.topic_id, index))
        if raw is None:
            partition = await Partition.create(
                self._storage,
                self._client,
                name,
                topic.topic_id,
                index,
                epoch,
                self.producer_expiry,
            )
        else:
            partition = await Partition.open(
                self._storage,
                self._client,
                self._view,
                name,
                topic.topic_id,
                index,
                epoch,
                self.producer_expiry,
            )
        self.partitions[key] = partition
        self._led_at[key] = epoch
        # Opened here again at a later epoch: an earlier close left unfinished is moot.
        self._leaving.pop(key, None)
        self._tell_opened()
        log.info(
            "partition led %s",
            fields(
                topic=name,
                partition=index,
                leader_epoch=partition.epoch,
                created=raw is None,
                log_end=partition.log_end_offset,
                seconds=round(time.monotonic() - began, 3),
                scanned_bytes=partition.scanned_bytes,
                scan_seconds=round(partition.scan_seconds, 3),
            ),
        )
        for listener in self._listeners:
            listener.partition_taken(partition)
        return raw is None

    def _count_traffic(self, partition: Partition) -> None:
        bytes_in, bytes_out, records_in = self.traffic_before.get(partition.topic, (0, 0, 0))
        self.traffic_before[partition.topic] = (
            bytes_in + partition.bytes_in,
            bytes_out + partition.bytes_out,
            records_in + partition.records_in,
        )

    async def _give_up(self, key: tuple[str, int], now_at: int | None) -> None:
        """Stop leading partition ``key``: out of :attr:`partitions` first (requests answer
        NOT_LEADER_OR_FOLLOWER), then its streams closed (what the WAL holds uploaded)."""
        partition = self.partitions.pop(key)
        self._count_traffic(partition)
        del self._led_at[key]
        self._leaving[key] = partition
        partition.wake_waiters()
        await self._tell_given_up(partition)
        log_end = partition.log_end_offset
        began = time.monotonic()
        try:
            await partition.close()
        except StorageError as error:
            # Fenced already (a newer owner, or this broker's session expired): nothing of
            # it is this broker's to close any more.
            log.warning(
                "partition not closed %s",
                fields(topic=key[0], partition=key[1], error=str(error)),
            )
        del self._leaving[key]
        image = self._view.image
        log.info(
            "partition given up %s",
            fields(
                topic=key[0],
                partition=key[1],
                leader_epoch=partition.epoch,
                to=sm.assigned_broker(image, key[0], key[1]),
                log_end=log_end,
                here_again_at=now_at,
                close_seconds=round(time.monotonic() - began, 3),
            ),
        )

    async def _tell_given_up(self, partition: Partition) -> None:
        for listener in self._listeners:
            await listener.partition_given_up(partition)

    async def _place_unplaced(self, name: str, topic: Topic) -> None:
        """A topic written before the controller placed partitions (its KV record only), or
        one grown by a bare write of its record, gets its missing partitions placed: its record
        again, as both value and expected. Refused (changed meanwhile, no live broker), it stays
        unplaced and no broker opens it until another broker places it."""
        placed = sm.placed_topic(self._view.image, name)
        if placed is not None and len(placed.partitions) >= topic.partitions:
            return
        record = self._records[name]
        response = await self._client.submit(sm.CreatePartitions(name, record, expected=record))
        if not response.ok:
            log.warning(
                "topic not placed %s",
                fields(topic=name, error=response.error.value, message=response.message),
            )

    async def wait_until_led(self, topic: Topic, indexes: range, timeout_s: float) -> bool:
        """Wait until partitions ``indexes`` of ``topic`` are open on the brokers placement
        assigned them (at most ``timeout_s``); True if they all are."""

        def led() -> bool:
            image = self._view.image
            for index in indexes:
                assignment = sm.partition_assignment(image, topic.name, index)
                if assignment is None or assignment.leader == sm.NO_LEADER:
                    return False
                if sm.partition_leader(image, str(topic.topic_id), index) != assignment.leader:
                    return False
            return True

        async def until_led() -> None:
            while True:
                version = self._view.version
                if led():
                    return
                await self._view.wait_for_change(version)

        try:
            async with asyncio.timeout(timeout_s):
                await until_led()
        except TimeoutError:
            return False
        return True

    def unclosed(self) -> list[Partition]:
        """Every partition whose streams this broker may still hold open: those it leads, and
        those given up whose close was cut short (the follower stopped in the middle of it).
        A broker that stops closes them all; one left open would keep its next broker out
        (``STREAM_NOT_CLOSED``) until this broker's next start."""
        return [*self.partitions.values(), *self._leaving.values()]

    async def wait_handed_over(self, timeout_s: float) -> bool:
        """Wait until placement assigns this broker no partition and every one it held is
        given up (closed, so that its new broker can open it), at most ``timeout_s``; True if
        so. A broker in controlled shutdown waits here while the controller moves its
        partitions away."""

        def done() -> bool:
            return not self.partitions and not sm.broker_partitions(self._view.image, self._node_id)

        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    version = self._view.version
                    if done():
                        # A round of the follower may still be closing what it gave up.
                        async with self._lock:
                            if done():
                                return True
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(RETRY_S):
                            await self._view.wait_for_change(version)
        except TimeoutError:
            return False

    def loads(self) -> tuple[sm.PartitionLoad, ...]:
        """Each partition led here: its bytes in and out per second since the last call (or
        since it was taken), as the heartbeat reports them to the autobalancer."""
        now_s = time.monotonic()
        found = []
        for (_, index), partition in sorted(self.partitions.items()):
            counted = self._counted.get(partition)
            since_s, bytes_in, bytes_out = counted or (partition.taken_s, 0, 0)
            seconds = max(now_s - since_s, 1e-3)
            found.append(
                sm.PartitionLoad(
                    str(partition.topic_id),
                    index,
                    round((partition.bytes_in - bytes_in) / seconds),
                    round((partition.bytes_out - bytes_out) / seconds),
                )
            )
            self._counted[partition] = (now_s, partition.bytes_in, partition.bytes_out)
        return tuple(found)

    def opening(self, name: str | None, index: int) -> bool:
        """Whether partition ``index`` of topic ``name`` is placed on this broker (in its image)
        but not open here yet: it moved here and waits for its old broker's (or a failover's)
        close, or is being opened."""
        if name is None or (name, index) in self.partitions:
            return False
        topic = self.topics.get(name)
        if topic is None or not 0 <= index < topic.partitions:
            return False
        return sm.assigned_broker(self._view.image, name, index) == self._node_id

    async def wait_opened(self, keys: Sequence[tuple[str | None, int]], timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, until none of partitions ``keys`` is :meth:`opening`
        here any more (each is open, or placed elsewhere): a request for a partition this broker
        is about to lead is held for the open rather than answered ``NOT_LEADER_OR_FOLLOWER``,
        whose retry a client backs off from for longer than the open takes. The caller looks
        the partitions up again afterwards; those still not open are answered as before."""
        if timeout_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while any(self.opening(name, index) for name, index in keys):
                    # No await between the look and the wait: no wake-up is missed.
                    await self._opened.wait()

    def _tell_opened(self) -> None:
        opened, self._opened = self._opened, asyncio.Event()
        opened.set()

    def not_here(self, name: str | None, index: int) -> KafkaErrorCode:
        """What a request for partition ``index`` of topic ``name`` that this broker does not
        hold is answered: ``NOT_LEADER_OR_FOLLOWER`` if the partition exists (another broker
        leads it, or will: the client refreshes its metadata and goes there), else
        ``UNKNOWN_TOPIC_OR_PARTITION``."""
        topic = self.topics.get(name) if name is not None else None
        if topic is not None and 0 <= index < topic.partitions:
            return KafkaErrorCode.NOT_LEADER_OR_FOLLOWER
        return KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def topic_by_id(self, topic_id: uuid.UUID) -> Topic | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    def topic_config(self, topic: Topic, name: str) -> str:
        """Topic config ``name``'s value for ``topic`` (a name of the catalog)."""
        value = topic.configs.get(name)
        return self.config_defaults[name] if value is None else value

    # ----------------------------------------------------------------------------- changes

    async def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None],
        validate_only: bool = False,
        assignments: Sequence[int] = (),
    ) -> Topic:
        """Create topic ``name``; ``configs`` are checked whole (a missing value is refused).
        ``assignments``, if given, names the broker of each partition in order (checked by the
        caller; the controller refuses a broker that is not live), else the controller places
        them."""
        check_topic_name(name)
        if partitions < 1:
            raise TopicError(KafkaErrorCode.INVALID_PARTITIONS, f"{partitions} partitions")
        checked = check_configs(configs, self.config_defaults)
        async with self._lock:
            if name in self.topics or topic_key(name) in self._view.image.kv:
                raise TopicError(KafkaErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name} exists")
            topic = Topic(name, uuid.uuid4(), partitions, checked)
            if validate_only:
                return topic
            encoded = topic.encode()
            created = await self._decide(
                sm.CreateTopic(name, encoded, assignments=tuple(assignments))
            )
            if not created.ok:
                if created.error is sm.StreamErrorCode.KEY_EXIST:
                    raise TopicError(
                        KafkaErrorCode.TOPIC_ALREADY_EXISTS,
                        f"topic {name} was created by another node",
                    )
                raise _refused(created)
            self._records[name] = encoded
            self.topics[name] = topic
            log.info(
                "topic created %s",
                fields(
                    topic=name,
                    partitions=partitions,
                    configs=topic.configs,
                    topic_id=topic.topic_id,
                ),
            )
            # The partitions placed here are created now; the other brokers create theirs
            # when their views show the topic.
            await self.reconcile()
        await self.wait_until_led(topic, range(partitions), READY_WAIT_S)
        return topic

    async def delete_topic(self, name: str) -> Topic:
        async with self._lock:
            for _ in range(CHANGE_ATTEMPTS):
                topic = self._topic(name)
                deleted = await self._decide(sm.DeleteTopic(name, expected=self._records[name]))
                if deleted.ok:
                    break
                self._adopt(name, deleted)
            else:
                raise _kept_changing(name)
            del self.topics[name]
            del self._records[name]
            await self._drop_partitions(name, range(topic.partitions))
            self.traffic_before.pop(name, None)
            log.info(
                "topic deleted %s",
                fields(topic=name, partitions=topic.partitions, topic_id=topic.topic_id),
            )
            return topic

    async def add_partitions(
        self,
        name: str,
        count: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool,
    ) -> None:
        """Grow topic ``name`` to ``count`` partitions (CreatePartitions); ``assignments``, if
        given, are the added partitions' replicas in order, each one live broker: the
        controller places each added partition there (else where it chooses)."""
        async with self._lock:
            topic = self._topic(name)
            if count <= topic.partitions:
                raise TopicError(
                    KafkaErrorCode.INVALID_PARTITIONS,
                    f"topic {name} has {topic.partitions} partitions; {count} would not add any",
                )
            if assignments is not None:
                added_count = count - topic.partitions
                if len(assignments) != added_count:
                    raise TopicError(
                        KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"{added_count} partitions are added but {len(assignments)} "
                        "assignments were given",
                    )
                check_replica_assignment(
                    [(topic.partitions + i, r) for i, r in enumerate(assignments)],
                    topic.partitions,
                    self.live_brokers(),
                )
            brokers = () if assignments is None else tuple(r[0] for r in assignments)
            if validate_only:
                return
            added = range(topic.partitions, count)
            for _ in range(CHANGE_ATTEMPTS):
                # The configs may be another node's newer ones (adopted): the partitions
                # added here are still the ones the record lacks.
                current = self._topic(name)
                grown = Topic(current.name, current.topic_id, count, current.configs)
                if await self._compare_and_set(grown, placing=brokers):
                    log.info(
                        "topic partitions added %s",
                        fields(topic=name, partitions=count, added=len(added)),
                    )
                    break
            else:
                raise _kept_changing(name)
            await self.reconcile()
        await self.wait_until_led(grown, added, READY_WAIT_S)

    async def alter_configs(
        self, name: str, changes: Sequence[ConfigChange], *, validate_only: bool
    ) -> None:
        """Apply ``changes`` to topic ``name``'s configs (IncrementalAlterConfigs): all or none."""
        await self._reconfigure(
            name,
            lambda configs: altered_configs(configs, changes, self.config_defaults),
            validate_only,
        )

    async def replace_configs(
        self, name: str, configs: Sequence[tuple[str, str | None]], *, validate_only: bool
    ) -> None:
        """Make ``configs`` topic ``name``'s whole set of configs (AlterConfigs)."""
        await self._reconfigure(
            name, lambda _: replaced_configs(configs, self.config_defaults), validate_only
        )

    async def _reconfigure(
        self,
        name: str,
        decide: Callable[[Mapping[str, str]], dict[str, str]],
        validate_only: bool,
    ) -> None:
        async with self._lock:
            for _ in range(CHANGE_ATTEMPTS):
                topic = self._topic(name)
                configs = decide(topic.configs)
                if validate_only:
                    return
                altered = Topic(topic.name, topic.topic_id, topic.partitions, configs)
                if await self._compare_and_set(altered):
                    log.info("topic configs altered %s", fields(topic=name, configs=configs))
                    return
            raise _kept_changing(name)

    async def _decide(self, event: sm.StreamMetadataEvent) -> sm.Response:
        """The controller's answer to ``event``; no answer (the metadata quorum away, the
        controller failed over with it in flight) is the request's error, not the
        connection's."""
        try:
            return await self._client.submit(event)
        except ControllerError as error:
            raise _undecided(event, error) from error

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        return topic

    def live_brokers(self) -> list[int]:
        """The ids of the brokers partitions may be assigned to now (as this node's view
        shows them)."""
        return [broker.node_id for broker in sm.live_brokers(self._view.image)]

    async def _compare_and_set(self, topic: Topic, placing: tuple[int, ...] | None = None) -> bool:
        """Write ``topic``'s record if the KV still holds the one this registry read or wrote
        last; with ``placing`` (the brokers of the added partitions, or none to leave them to
        the controller), through ``CreatePartitions``, which places the partitions the record
        adds in the same decision. True once written; False when another node changed the
        topic's configs meanwhile: the registry adopted that record (``_adopt``) and the caller
        may decide again on it."""
        encoded = topic.encode()
        expected = self._records[topic.name]
        event: sm.StreamMetadataEvent = (
            sm.PutKV(topic_key(topic.name), encoded, True, expected=expected)
            if placing is None
            else sm.CreatePartitions(topic.name, encoded, expected=expected, assignments=placing)
        )
        response = await self._decide(event)
        if not response.ok:
            self._adopt(topic.name, response)
            return False
        self._records[topic.name] = encoded
        self.topics[topic.name] = topic
        return True

    def _adopt(self, name: str, refused: sm.Response) -> None:
        """A conditional change of topic ``name`` was refused. If only its configs changed
        elsewhere, take that record as this registry's; otherwise the topic is no longer the one
        this node has open (deleted, re-created, grown elsewhere) and the request is answered
        with an error: reconciling is not this node's job."""
        if refused.error is not sm.StreamErrorCode.VALUE_NOT_MATCHED:
            raise _refused(refused)
        if refused.value is None:
            raise TopicError(
                KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {name} was deleted by another node",
            )
        ours = self.topics[name]
        try:
            theirs = Topic.decode(name, refused.value)
        except FormatError as error:
            raise TopicError(KafkaErrorCode.KAFKA_STORAGE_ERROR, str(error)) from error
        if (theirs.topic_id, theirs.partitions) != (ours.topic_id, ours.partitions):
            raise TopicError(
                KafkaErrorCode.UNKNOWN_SERVER_ERROR,
                f"topic {name} was changed by another node (now id {theirs.topic_id}, "
                f"{theirs.partitions} partitions); try again",
            )
        self._records[name] = refused.value
        self.topics[name] = theirs

    async def _drop_partitions(self, name: str, indexes: range) -> None:
        """Close and delete these partitions of topic ``name`` (streams and KV entries) that
        this broker holds (the others' brokers drop theirs when they see the topic go)."""
        for index in indexes:
            partition = self.partitions.pop((name, index), None)
            if partition is None:
                continue
            self._count_traffic(partition)
            del self._led_at[(name, index)]
            partition.wake_waiters()
            await self._tell_given_up(partition)
            await partition.delete()

    async def _drop_held(self, topic: Topic) -> None:
        """Drop the partitions of ``topic`` this broker holds: the topic is gone (deleted or
        re-created under another id) by another broker's change."""
        held = [index for name, index in self.partitions if name == topic.name]
        for index in sorted(held):
            if self.partitions[(topic.name, index)].topic_id == topic.topic_id:
                await self._drop_partitions(topic.name, range(index, index + 1))


FOLLOW_RETRY_S = 1.0  # after a round of following that failed
RETRY_S = 0.5  # a partition not taken yet is tried again after this, if nothing changed before
# How long creating or growing a topic waits for its new partitions' leaders to open them: the
# answer is a success either way (the topic exists); clients retry until the leaders serve.
READY_WAIT_S = 10.0
CHANGE_ATTEMPTS = 2  # a change that lost to another node's is decided once more on its record


# The controller's refusals that are the request's fault, answered with Kafka's code for them.
_PLACEMENT_ERRORS = {
    sm.StreamErrorCode.INVALID_REPLICA_ASSIGNMENT: KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
    sm.StreamErrorCode.INVALID_REPLICATION_FACTOR: KafkaErrorCode.INVALID_REPLICATION_FACTOR,
    sm.StreamErrorCode.INVALID_PARTITIONS: KafkaErrorCode.INVALID_PARTITIONS,
}


def _undecided(event: sm.StreamMetadataEvent, error: ControllerError) -> TopicError:
    """A topic change the controller gave no decision on: REQUEST_TIMED_OUT, as Kafka answers a
    change its controller did not finish in time, naming that it may have been applied."""
    return TopicError(
        KafkaErrorCode.REQUEST_TIMED_OUT,
        f"the controller gave {type(event).__name__} no decision (it may have been applied; "
        f"describe the topic before trying again): {error}",
    )


def _refused(response: sm.Response) -> TopicError:
    code = _PLACEMENT_ERRORS.get(response.error, KafkaErrorCode.KAFKA_STORAGE_ERROR)
    return TopicError(code, f"{response.error.value}: {response.message}")


def _kept_changing(name: str) -> TopicError:
    return TopicError(
        KafkaErrorCode.UNKNOWN_SERVER_ERROR,
        f"topic {name} kept changing on another node; try again",
    )
