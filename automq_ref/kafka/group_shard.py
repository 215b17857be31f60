"""One shard of the group coordinator: the pure Group machine over one partition of
``__consumer_offsets``, whose log is the shard's log.

The coordinator (:mod:`automq_ref.kafka.groups`) runs one shard per coordinator partition this
broker leads; a group lives in the shard of its partition. A shard is *loaded* when its
partition is taken here: the partition's log is replayed (:meth:`GroupShard.replay`: the latest
record of each key wins, a tombstone deletes), offsets of earlier versions' offsets streams are
imported (:meth:`GroupShard.import_offsets`), then the machine starts from that state
(:meth:`GroupShard.start`; groups come back Empty with their offsets, and members rejoin). It is
*stopped* when the partition is given up or the broker stops: every request still waiting is
answered ``NOT_COORDINATOR`` (:class:`ShardGone`), so clients find the partition's new broker.

Every group request becomes an event with a fresh request id; the caller awaits the answer,
which the machine may give later (a JoinGroup waits for the rebalance). The machine runs under
the shell's one driver (:mod:`automq_ref.io.driver`), whose executors are synchronous: a
``Respond`` resolves the caller's future; ``PersistOffsets`` and ``PersistGroupDeletion`` are
appended, in emission order, to the partition as one Kafka record batch each, with the keys and
values of Kafka's own ``__consumer_offsets`` schemas (:mod:`automq_ref.formats.offsets_record`):
a record per committed offset (key: group, topic, partition), and for a deleted group a
tombstone for every offset key the log holds of it and one for its group key, so compaction
(the topic is ``cleanup.policy=compact``) keeps exactly the latest offsets; for an OffsetDelete
a tombstone for each offset key it deletes (``PersistOffsetDeletion``), which a replay applies
as any offset tombstone. When an append is durable the machine hears ``OffsetsPersisted`` and
only then answers the commit and shows the offsets (so offsets are persisted before the commit
is answered). A TxnOffsetCommit's records are
appended as a transactional batch of the producer (verified first, as a Produce of that
producer would be: the handler passes the guard, :meth:`GroupShard.request`), and the machine
holds them until the transaction's marker lands in the partition: the partition tells the shard
of every marker written (its marker listeners), and the shard steps ``TxnMarker``; a replay
holds a transactional batch's offsets until the control batch that ends it, and drops them on an
abort or at a tombstone of their key (a group deleted meanwhile). An append the partition
refuses at once is answered ``OffsetsPersistFailed`` (stepped after the transition that asked for
it). A ``Rejected`` means this shell broke its side of the contract and raises
``CoordinatorError``.

Time is the injected clock's wall-clock milliseconds (the node's ``Clock``), stamped on every
request and fed as ``Tick`` by the coordinator's ticker (:meth:`GroupShard.tick`), and before any
request once a deadline has passed, so that a request sees every timer due at its time fired (a
static member that stopped heartbeating is gone for the DeleteGroups sent one session timeout
after it closed, as in Kafka, where timers fire on their own).

Each new generation of a group is logged at INFO (``group rebalanced``: the group, generation,
member count, protocol and leader; ``group empty`` when the last member left), and so is a group
removed (deleted, or expired once empty without offsets).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Callable, Mapping

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import offsets_record as orec
from automq_ref.formats.control_batch import batch_marker
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.clock import Clock
from automq_ref.io.driver import Driver
from automq_ref.io.logfmt import fields
from automq_ref.io.storage.s3stream import StorageError
from automq_ref.kafka.partition import Partition, stored_batches
from automq_ref.state_machines import group as gc

log = logging.getLogger(__name__)

# The coordinator's own appends are not bounded by the topic's max.message.bytes: a commit of
# many partitions is one batch, as the machine asked for one durable write.
MAX_APPEND_BYTES = 2**31 - 1

# Per group, per (topic, partition): the offset the log holds (replayed or imported).
Offsets = dict[str, dict[gc.TopicPartition, gc.OffsetRecord]]


class CoordinatorError(RuntimeError):
    """The machine refused an event this shell made: the shell broke its side of the contract."""


class ShardGone(Exception):
    """The shard stopped (its partition moved, or the broker stops) before it answered."""


def _log_generations(before: Mapping[str, gc.Group], after: Mapping[str, gc.Group]) -> None:
    """One line per group whose generation moved, or that is gone."""
    for group_id, group in after.items():
        old = before.get(group_id)
        if group is old or group.generation_id == (0 if old is None else old.generation_id):
            continue  # unchanged, or a group just created: its first rebalance is logged
        if group.members:
            log.info(
                "group rebalanced %s",
                fields(
                    group=group_id,
                    generation=group.generation_id,
                    members=len(group.members),
                    protocol_type=group.protocol_type or "",
                    protocol=group.protocol_name or "",
                    leader=group.leader_id or "",
                ),
            )
        else:
            log.info("group empty %s", fields(group=group_id, generation=group.generation_id))
    # Linear, as the machine's own copy of the mapping on every change is.
    for group_id in sorted(before.keys() - after.keys()):
        log.info("group removed %s", fields(group=group_id))


def _log_consumer_epochs(
    before: Mapping[str, gc.ConsumerGroup], after: Mapping[str, gc.ConsumerGroup]
) -> None:
    """One line per KIP-848 group whose target assignment moved to a new epoch."""
    for group_id, group in after.items():
        old = before.get(group_id)
        if group is old or group.assignment_epoch == (0 if old is None else old.assignment_epoch):
            continue
        log.info(
            "group rebalanced %s",
            fields(
                group=group_id,
                generation=group.assignment_epoch,
                members=len(group.members),
                protocol_type="consumer",
                group_type="consumer",
            ),
        )
    for group_id in sorted(before.keys() - after.keys()):
        log.info("group removed %s", fields(group=group_id))


def offset_records(
    group_id: str, offsets: tuple[gc.OffsetRecord, ...]
) -> list[tuple[bytes, bytes]]:
    """The (key, value) records of offsets committed for ``group_id``."""
    return [
        (
            orec.encode_offset_key(group_id, o.topic, o.partition),
            orec.encode_offset_value(
                orec.OffsetValue(o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms)
            ),
        )
        for o in offsets
    ]


def append_durably(
    partition: Partition,
    batch: bytes,
    verification_guard: int,
    stopped: Callable[[], bool],
    persisted: Callable[[], None],
    refused: Callable[[], None],
) -> None:
    """A coordinator's append of one durable record batch to its partition: ``persisted()``
    once it is durable, ``refused()`` at once if the partition refuses it; nothing if the shard
    ``stopped()`` meanwhile (its request was answered NOT_COORDINATOR) or the storage failed
    (the append may or may not be in the WAL: the node restarts from what is durable)."""
    name = f"{partition.topic}-{partition.index}"
    try:
        result = partition.append_nowait(
            batch, MAX_APPEND_BYTES, verification_guard=verification_guard
        )
    except StorageError as error:
        log.error("%s: append refused: %s", name, error)
        refused()
        return
    durable = result.durable
    if durable is None:
        log.error("%s: append refused: %s %s", name, result.error.name, result.message)
        refused()
        return

    def done(future: asyncio.Future[None]) -> None:
        if stopped():
            return
        if future.cancelled() or future.exception() is not None:
            failure = None if future.cancelled() else future.exception()
            log.error("%s: append failed: %s", name, failure)
            return
        persisted()

    durable.add_done_callback(done)


class GroupShard:
    """The machine of coordinator partition ``partition``: loading until :meth:`start`, serving
    until :meth:`stop`."""

    def __init__(self, partition: Partition, clock: Clock) -> None:
        self.partition = partition
        self._clock = clock
        self._driver: Driver[gc.CoordinatorState, gc.GroupEvent, gc.GroupEffect] | None = None
        self._offsets: Offsets = {}
        # Per group, the offset keys the log holds a value of: a deletion tombstones each.
        self._written: dict[str, set[gc.TopicPartition]] = {}
        # Per producer id, the transactional offsets a replay found with no marker yet.
        self._held: dict[int, Offsets] = {}
        self._next_request_id = 0
        self._answers: dict[int, asyncio.Future[gc.Response]] = {}
        # Per TxnOffsetCommit request id: the verification guard its append carries.
        self._guards: dict[int, int] = {}
        self.stopped = False

    @property
    def index(self) -> int:
        return self.partition.index

    @property
    def serving(self) -> bool:
        return self._driver is not None and not self.stopped

    @property
    def state(self) -> gc.CoordinatorState:
        assert self._driver is not None, "the shard is loading"
        return self._driver.state

    # ------------------------------------------------------------------------------ loading

    async def replay(self) -> None:
        """Fold the partition's log into the offsets it holds (the latest record of each key
        wins; an offset tombstone deletes that offset, a group tombstone the whole group)."""
        self._offsets, self._written, self._held = {}, {}, {}
        partition = self.partition
        async with partition.maintenance:
            stored = partition.read_stored(partition.log_start_offset, partition.high_watermark)
            async for stream_batch in stored:
                for view in stored_batches(stream_batch.payload):
                    producer_id = view.producer_id
                    if view.is_control:
                        marker = batch_marker(view)
                        if marker is not None:
                            self._end_held(producer_id, marker.commit)
                        continue
                    if view.is_transactional:
                        offsets = self._offsets
                        self._offsets = self._held.setdefault(producer_id, {})
                        try:
                            for record in view.records():
                                self._replay_record(record.key, record.value)
                        finally:
                            self._offsets = offsets
                        continue
                    for record in view.records():
                        self._replay_record(record.key, record.value)

    def _end_held(self, producer_id: int, commit: bool) -> None:
        """A marker in the replayed log: the producer's held offsets committed or dropped."""
        held = self._held.pop(producer_id, {})
        if commit:
            for group_id, committed in held.items():
                self._offsets.setdefault(group_id, {}).update(committed)

    def _replay_record(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return  # never written here; compaction would drop it anyway
        decoded = orec.decode_key(key)
        if isinstance(decoded, orec.GroupKey):
            if value is None:
                self._offsets.pop(decoded.group, None)
                self._written.pop(decoded.group, None)
                for held in self._held.values():
                    held.pop(decoded.group, None)
            return
        if not isinstance(decoded, orec.OffsetKey):
            return
        group, tp = decoded.group, (decoded.topic, decoded.partition)
        if value is None:
            # A tombstone also removes the key's offsets held for a transaction's marker
            # (Kafka 4's replay): a deleted group's COMMIT marker shows nothing of it.
            self._offsets.get(group, {}).pop(tp, None)
            self._written.get(group, set()).discard(tp)
            for held in self._held.values():
                held.get(group, {}).pop(tp, None)
            return
        stored = orec.decode_offset_value(value)
        self._offsets.setdefault(group, {})[tp] = gc.OffsetRecord(
            tp[0],
            tp[1],
            stored.offset,
            stored.leader_epoch,
            stored.metadata,
            stored.commit_timestamp_ms,
        )
        self._written.setdefault(group, set()).add(tp)

    async def import_offsets(self, offsets: Offsets) -> int:
        """Append ``offsets`` of an earlier version's offsets stream, each one the log does not
        hold yet (an import never overwrites a newer commit, and one repeated after a crash
        adds nothing); return how many were appended, once durable. Before :meth:`start`."""
        records: list[tuple[bytes, bytes]] = []
        for group_id, committed in sorted(offsets.items()):
            held = self._offsets.setdefault(group_id, {})
            new = tuple(o for tp, o in sorted(committed.items()) if tp not in held)
            records += offset_records(group_id, new)
            for o in new:
                held[(o.topic, o.partition)] = o
                self._written.setdefault(group_id, set()).add((o.topic, o.partition))
        if records:
            result = self.partition.append_nowait(
                build_record_batch(records, base_timestamp=self._clock.now_ms()), MAX_APPEND_BYTES
            )
            if result.durable is None:
                raise StorageError(f"importing offsets: {result.error.name}: {result.message}")
            await result.durable
        return len(records)

    def start(self, params: gc.GroupParams) -> None:
        """Serve: the machine starts from the offsets loaded (every group Empty). Member ids
        carry a token chosen now, so a shard loaded again (here after a restart, or elsewhere)
        never hands out an id an old client still holds."""
        params = dataclasses.replace(params, member_id_token=secrets.token_hex(4))
        held = [
            gc.PersistOffsets(-1, group_id, tuple(committed.values()), producer_id)
            for producer_id, groups in sorted(self._held.items())
            for group_id, committed in sorted(groups.items())
        ]
        recovered = gc.recover(
            [
                *(
                    gc.PersistOffsets(-1, group_id, tuple(committed.values()))
                    for group_id, committed in sorted(self._offsets.items())
                ),
                *held,
            ]
        )
        self._offsets, self._held = {}, {}
        self._driver = Driver(
            lambda state, event: gc.step(state, event, params),
            recovered,
            {
                gc.Respond: self._answer,
                gc.PersistOffsets: self._persist,
                gc.PersistGroupDeletion: self._persist,
                gc.PersistOffsetDeletion: self._persist,
                gc.Rejected: self._refused,
            },
        )
        self.partition.marker_listeners.append(self._marker)

    def stop(self) -> None:
        """Stop serving: every request still waiting is answered with :class:`ShardGone`, and
        appends still in flight are answered to no one."""
        self.stopped = True
        if self._marker in self.partition.marker_listeners:
            self.partition.marker_listeners.remove(self._marker)
        answers, self._answers = self._answers, {}
        for answer in answers.values():
            if not answer.done():
                answer.set_exception(ShardGone(f"{self.partition.topic}-{self.index}"))

    # ----------------------------------------------------------------------------- serving

    async def request(
        self, make_event: Callable[[int, int], gc.GroupEvent], verification_guard: int = 0
    ) -> gc.Response:
        """Step ``make_event(request_id, now_ms)`` and wait for its answer;
        ``verification_guard``: a TxnOffsetCommit's, for its transactional append."""
        if not self.serving:
            raise ShardGone(f"{self.partition.topic}-{self.index}")
        self._next_request_id += 1
        request_id = self._next_request_id
        if verification_guard:
            self._guards[request_id] = verification_guard
        answer: asyncio.Future[gc.Response] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        now_ms = self._clock.now_ms()
        self._fire_due_timers(now_ms)
        self._step(make_event(request_id, now_ms))
        return await answer

    def next_deadline_ms(self) -> int | None:
        return gc.next_deadline_ms(self.state) if self.serving else None

    def tick(self, now_ms: int) -> None:
        """The ticker's Tick: every shard holding groups hears one each round, so the machine's
        timers fire and forgotten Empty groups go."""
        if self.serving and (self.state.groups or self.state.consumer_groups):
            self._step(gc.Tick(now_ms))

    def _fire_due_timers(self, now_ms: int) -> None:
        deadline = gc.next_deadline_ms(self.state)
        if deadline is not None and deadline <= now_ms:
            self._step(gc.Tick(now_ms))

    def _step(self, event: gc.GroupEvent) -> None:
        assert self._driver is not None
        before, consumer_before = self._driver.state.groups, self._driver.state.consumer_groups
        self._driver.apply(event)
        after, consumer_after = self._driver.state.groups, self._driver.state.consumer_groups
        if after is not before and log.isEnabledFor(logging.INFO):
            _log_generations(before, after)
        if consumer_after is not consumer_before and log.isEnabledFor(logging.INFO):
            _log_consumer_epochs(consumer_before, consumer_after)

    def _marker(self, producer_id: int, commit: bool) -> None:
        """The partition's marker listener: a transaction ended in this partition."""
        if self.serving:
            self._step(gc.TxnMarker(producer_id, commit))

    def _answer(self, effect: gc.Respond) -> None:
        answer = self._answers.pop(effect.request_id, None)
        if answer is not None and not answer.done():
            answer.set_result(effect.response)

    def _refused(self, effect: gc.Rejected[KafkaErrorCode]) -> None:
        raise CoordinatorError(f"{effect.error.name}: {effect.message}")

    def _records(self, record: gc.DurableRecord) -> list[tuple[bytes, bytes | None]]:
        """The Kafka records of one durable effect (and what the log then holds)."""
        if isinstance(record, gc.PersistOffsets):
            written = self._written.setdefault(record.group_id, set())
            written.update((o.topic, o.partition) for o in record.offsets)
            return list(offset_records(record.group_id, record.offsets))
        records: list[tuple[bytes, bytes | None]] = []
        if isinstance(record, gc.PersistOffsetDeletion):
            written = self._written.get(record.group_id, set())
            for topic, index in record.partitions:
                written.discard((topic, index))
                records.append((orec.encode_offset_key(record.group_id, topic, index), None))
            return records
        for group_id in record.group_ids:
            for topic, index in sorted(self._written.pop(group_id, ())):
                records.append((orec.encode_offset_key(group_id, topic, index), None))
            records.append((orec.encode_group_key(group_id), None))
        return records

    def _next_sequence(self, producer_id: int, producer_epoch: int) -> int:
        """The base sequence of a transactional append of the producer to this partition: the
        next after its last batch here at that epoch (the partition checks them as it checks a
        producer's), -1 for an append of no producer."""
        if producer_id < 0:
            return -1
        state = self.partition.producers.get(producer_id)
        if state is None or state.epoch != producer_epoch:
            return 0
        return state.last_sequence + 1

    def _persist(self, record: gc.DurableRecord) -> None:
        request_id = record.request_id
        producer_id, producer_epoch = (
            (record.producer_id, record.producer_epoch)
            if isinstance(record, gc.PersistOffsets)
            else (-1, -1)
        )
        batch = build_record_batch(
            self._records(record),
            base_timestamp=self._clock.now_ms(),
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=self._next_sequence(producer_id, producer_epoch),
            is_transactional=producer_id >= 0,
        )
        guard = self._guards.pop(request_id, 0)
        append_durably(
            self.partition,
            batch,
            guard,
            lambda: self.stopped,
            lambda: self._step(gc.OffsetsPersisted(request_id)),
            lambda: self._step(gc.OffsetsPersistFailed(request_id)),
        )
