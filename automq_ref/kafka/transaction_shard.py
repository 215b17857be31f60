"""One shard of the transaction coordinator: the pure Transaction machine
(:mod:`automq_ref.state_machines.transaction`) over one partition of ``__transaction_state``,
whose log is the shard's transaction log.

A shard is *loaded* when its partition is taken here: the partition's log is replayed (the
latest record of each transactional id wins, a tombstone deletes it) and the machine starts from
it (:func:`~automq_ref.state_machines.transaction.recover`); a transaction the log left
preparing has its markers written again, as Kafka's coordinator does when it loads a partition.
It is *stopped* when the partition is given up or the broker stops: every request still waiting
is answered ``NOT_COORDINATOR`` (:class:`~automq_ref.kafka.group_shard.ShardGone`), and markers
still being written are abandoned (the partition's next coordinator writes them again).

The machine runs under the shell's one driver (:mod:`automq_ref.io.driver`), with synchronous
executors: ``Respond`` resolves the caller's future; ``PersistTransaction`` appends one record
(key and value in Kafka's ``__transaction_state`` layouts,
:mod:`automq_ref.formats.transaction_record`; a null value for an id expired) to the partition
and steps ``TransactionPersisted`` once it is durable, ``TransactionPersistFailed`` when the
append is refused (so a decision is durable before anyone hears of it, and before any marker of
it is written: the checker's broken mode ``txn-markers-before-decision`` turns that order round
through the ``before_decision`` seam, and its transactional workload must catch the torn
transactions that follow); ``WriteMarkers`` hands
each partition's marker to the coordinator's marker writer, which steps ``MarkerWritten`` for
each once it is durable in its partition. The coordinator epoch the markers carry is this
partition's leader epoch, which grows each time the partition moves, so a partition refuses the
markers of a coordinator that lost it (``TRANSACTION_COORDINATOR_FENCED``).

Tracing (``TransactionCoordinator.trace``, a :class:`TransactionTrace`; tests only): the steps
of one transactional id, as the shard takes them, are recorded as a trace of
``specs/Transaction.tla`` (docs/trace_validation.md, "Transaction traces from a real run").
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import transaction_record as trec
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.io.clock import Clock
from automq_ref.io.driver import Driver
from automq_ref.kafka.group_shard import CoordinatorError, ShardGone, append_durably
from automq_ref.kafka.partition import Partition, stored_batches
from automq_ref.state_machines import transaction as tx
from automq_ref.state_machines.transaction_partition import tla_partition
from automq_ref.state_machines.transition import Rejected

log = logging.getLogger(__name__)

# The marker writer: (shard, the WriteMarkers effect) -> written in the background, each
# partition's MarkerWritten stepped through the shard.
MarkerWriter = Callable[["TransactionShard", tx.WriteMarkers], None]
# A seam for the checker (``node.Seams.before_decision``): run before a Prepare* decision is
# appended, with the markers that decision leads to; None (the broker's own way) appends it
# first, and markers follow only once it is durable.
DecisionHook = Callable[["TransactionShard", tx.WriteMarkers], Awaitable[None]]


def record_value(metadata: tx.TransactionMetadata) -> bytes:
    """The ``__transaction_state`` value of one id's metadata."""
    return trec.encode_value(
        trec.TransactionLogValue(
            producer_id=metadata.producer_id,
            producer_epoch=metadata.producer_epoch,
            timeout_ms=metadata.timeout_ms,
            status=int(metadata.state),
            partitions=trec.partitions_of(metadata.partitions),
            last_update_ms=metadata.last_update_ms,
            start_ms=metadata.start_ms,
        )
    )


def record_metadata(
    transactional_id: str, value: trec.TransactionLogValue
) -> tx.TransactionMetadata:
    """One id's metadata from its ``__transaction_state`` value."""
    return tx.TransactionMetadata(
        transactional_id,
        value.producer_id,
        value.producer_epoch,
        value.timeout_ms,
        tx.TransactionState(value.status),
        frozenset((topic, index) for topic, indexes in value.partitions for index in indexes),
        start_ms=value.start_ms,
        last_update_ms=value.last_update_ms,
    )


class TransactionTrace:
    """A trace of one transactional id's coordinator, as the shards step it: ``Init`` (the id
    unknown: a trace starts on a fresh transaction log), then a line per step of the machine
    for that id (a ``Tick`` while the shard knows it), labelled by ``tla_action``, with the
    coordinator's variables (``tla_state``) and ``log``: on a ``MarkerWritten`` line, the
    markers the shell wrote to that partition for the id so far, marked durable by the
    partition (:meth:`marker_written`, just before the shard steps ``MarkerWritten``); other
    lines name no partition (``log`` is a partial variable). ``lines`` are
    ``{"action", "state"}`` dicts."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self._markers: dict[tx.PartitionKey, list[object]] = {}
        self.lines: list[dict[str, object]] = []
        self._line("Init", tx.CoordinatorState(), None)

    def _line(self, action: str, state: tx.CoordinatorState, key: tx.PartitionKey | None) -> None:
        log = [] if key is None else [[tla_partition(key), {"seq": list(self._markers[key])}]]
        tla = tx.tla_state(state, self.transactional_id)
        self.lines.append({"action": action, "state": {**tla, "log": {"fn": log}}})

    def marker_written(self, effect: tx.WriteMarkers, key: tx.PartitionKey) -> None:
        if effect.transactional_id == self.transactional_id:
            kind = "COMMIT" if effect.commit else "ABORT"
            marker = {"record": {"kind": kind, "e": effect.producer_epoch}}
            self._markers.setdefault(key, []).append(marker)

    def stepped(
        self, event: tx.TransactionEvent, before: tx.CoordinatorState, after: tx.CoordinatorState
    ) -> None:
        if isinstance(event, tx.Tick):
            if self.transactional_id not in before.entries:
                return
        elif event.transactional_id != self.transactional_id:
            return
        key = event.partition if isinstance(event, tx.MarkerWritten) else None
        if key is not None and key not in self._markers:
            key = None  # a marker the shell did not write (none in this shell)
        self._line(tx.tla_action(event, before, after), after, key)


class TransactionTraceFiles:
    """``transaction.trace.dir``: every transactional id whose first request this broker's
    coordinator serves is traced (a :class:`TransactionTrace` of its own) into
    ``<dir>/<id>.ndjson`` (the id percent-encoded), a line written as each step is taken, for
    ``specs/trace_validate.py --spec Transaction``. An id the coordinator already knew (loaded
    from the log: its trace would not start at the spec's ``Init``) is not traced."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._traces: dict[str, tuple[TransactionTrace, Path]] = {}
        self._written: dict[str, int] = {}

    def path_of(self, transactional_id: str) -> Path:
        return self.directory / f"{urllib.parse.quote(transactional_id, safe='')}.ndjson"

    def marker_written(self, effect: tx.WriteMarkers, key: tx.PartitionKey) -> None:
        traced = self._traces.get(effect.transactional_id)
        if traced is not None:
            traced[0].marker_written(effect, key)

    def stepped(
        self, event: tx.TransactionEvent, before: tx.CoordinatorState, after: tx.CoordinatorState
    ) -> None:
        if isinstance(event, tx.Tick):
            ids = list(self._traces)
        else:
            ids = [event.transactional_id]
            if event.transactional_id not in self._traces:
                if event.transactional_id in before.entries:
                    return  # known before this broker traced it
                trace = TransactionTrace(event.transactional_id)
                self._traces[event.transactional_id] = (trace, self.path_of(trace.transactional_id))
                self._written[event.transactional_id] = 0
        for transactional_id in ids:
            trace, path = self._traces[transactional_id]
            trace.stepped(event, before, after)
            written = self._written[transactional_id]
            if len(trace.lines) > written:
                with path.open("a") as out:
                    for line in trace.lines[written:]:
                        out.write(json.dumps(line, separators=(",", ":")) + "\n")
                self._written[transactional_id] = len(trace.lines)


@dataclass(eq=False)
class Deferred:
    """A request waiting for a state of the machine (:meth:`TransactionShard.request_when`)."""

    ready: Callable[[tx.CoordinatorState], bool]
    make_event: Callable[[int, int], tx.TransactionEvent]
    answer: asyncio.Future[tx.Answer]


class TransactionShard:
    """The machine of transaction log partition ``partition``: loading until :meth:`start`,
    serving until :meth:`stop`."""

    def __init__(
        self,
        partition: Partition,
        clock: Clock,
        markers: MarkerWriter,
        before_decision: DecisionHook | None = None,
        trace: TransactionTrace | TransactionTraceFiles | None = None,
    ) -> None:
        self.partition = partition
        self.trace = trace
        self._clock = clock
        self._markers = markers
        self._before_decision = before_decision
        self._hooked: set[asyncio.Task[None]] = set()
        self._records: list[tuple[str, tx.TransactionMetadata | None]] = []
        self._driver: Driver[tx.CoordinatorState, tx.TransactionEvent, tx.TransactionEffect] | None
        self._driver = None
        self._next_request_id = 0
        self._answers: dict[int, asyncio.Future[tx.Answer]] = {}
        self._deferred: list[Deferred] = []  # requests stepped once their state comes
        self._stepped: asyncio.Event | None = None  # set at the next step, for its waiters
        self.stopped = False

    @property
    def index(self) -> int:
        return self.partition.index

    @property
    def coordinator_epoch(self) -> int:
        return self.partition.epoch

    @property
    def serving(self) -> bool:
        return self._driver is not None and not self.stopped

    @property
    def state(self) -> tx.CoordinatorState:
        assert self._driver is not None, "the shard is loading"
        return self._driver.state

    # ------------------------------------------------------------------------------ loading

    async def replay(self) -> None:
        """Read the partition's log: every record of every id, in log order."""
        records: list[tuple[str, tx.TransactionMetadata | None]] = []
        partition = self.partition
        async with partition.maintenance:
            stored = partition.read_stored(partition.log_start_offset, partition.high_watermark)
            async for stream_batch in stored:
                for view in stored_batches(stream_batch.payload):
                    if view.is_control:
                        continue
                    for record in view.records():
                        if record.key is None:
                            continue
                        transactional_id = trec.decode_key(record.key)
                        if transactional_id is None:
                            continue  # a key of a version this broker does not know
                        if record.value is None:
                            records.append((transactional_id, None))
                        else:
                            value = trec.decode_value(record.value)
                            records.append(
                                (transactional_id, record_metadata(transactional_id, value))
                            )
        self._records = records

    def start(self, params: tx.TransactionParams) -> None:
        """Serve from the log replayed; the markers of transactions left preparing are written
        again."""
        recovered = tx.recover(self._records, self._clock.now_ms())
        self._records = []
        self._driver = Driver(
            lambda state, event: tx.step(state, event, params),
            recovered.state,
            {
                tx.Respond: self._answer,
                tx.PersistTransaction: self._persist,
                tx.WriteMarkers: self._write_markers,
                Rejected: self._refused,
            },
        )
        for effect in recovered.effects:
            assert isinstance(effect, tx.WriteMarkers)
            self._write_markers(effect)

    def stop(self) -> None:
        self.stopped = True
        self._wake()
        for task in self._hooked:
            task.cancel()
        answers, self._answers = self._answers, {}
        deferred, self._deferred = self._deferred, []
        for answer in [*answers.values(), *(d.answer for d in deferred)]:
            if not answer.done():
                answer.set_exception(ShardGone(f"{self.partition.topic}-{self.index}"))

    # ----------------------------------------------------------------------------- serving

    async def request(self, make_event: Callable[[int, int], tx.TransactionEvent]) -> tx.Answer:
        """Step ``make_event(request_id, now_ms)`` and wait for its answer."""
        if not self.serving:
            raise ShardGone(f"{self.partition.topic}-{self.index}")
        answer: asyncio.Future[tx.Answer] = asyncio.get_running_loop().create_future()
        self._ask(make_event, answer)
        return await answer

    def request_when(
        self,
        ready: Callable[[tx.CoordinatorState], bool],
        make_event: Callable[[int, int], tx.TransactionEvent],
    ) -> Deferred:
        """A request stepped once ``ready(state)`` holds: now, or right after the step that
        makes it hold, in that step's own call, so that the record it asks for is appended
        right behind what that step appended (and shares its WAL group commit). Its answer is
        ``.answer``; :meth:`withdraw` takes it back while it waits."""
        if not self.serving:
            raise ShardGone(f"{self.partition.topic}-{self.index}")
        deferred = Deferred(ready, make_event, asyncio.get_running_loop().create_future())
        if ready(self.state):
            self._ask(make_event, deferred.answer)
        else:
            self._deferred.append(deferred)
        return deferred

    def withdraw(self, deferred: Deferred) -> bool:
        """Take back a request of :meth:`request_when` not stepped yet (False: it was)."""
        if deferred in self._deferred:
            self._deferred.remove(deferred)
            return True
        return False

    def _ask(
        self,
        make_event: Callable[[int, int], tx.TransactionEvent],
        answer: asyncio.Future[tx.Answer],
    ) -> None:
        self._next_request_id += 1
        request_id = self._next_request_id
        self._answers[request_id] = answer
        self.step(make_event(request_id, self._clock.now_ms()))

    def step(self, event: tx.TransactionEvent) -> None:
        if not self.serving:
            return
        assert self._driver is not None
        before = self._driver.state
        self._driver.apply(event)
        if self.trace is not None:
            self.trace.stepped(event, before, self._driver.state)
        if self._deferred:
            state = self._driver.state
            ready = [deferred for deferred in self._deferred if deferred.ready(state)]
            for deferred in ready:
                self._deferred.remove(deferred)
                self._ask(deferred.make_event, deferred.answer)
        self._wake()

    async def stepped(self) -> None:
        """Until the machine's next step (or the shard stops)."""
        if self.stopped:
            return
        if self._stepped is None:
            self._stepped = asyncio.Event()
        await self._stepped.wait()

    def _wake(self) -> None:
        waiters, self._stepped = self._stepped, None
        if waiters is not None:
            waiters.set()

    def tick(self, now_ms: int) -> None:
        if self.serving and self.state.entries:
            self.step(tx.Tick(now_ms))

    def _answer(self, effect: tx.Respond) -> None:
        answer = self._answers.pop(effect.request_id, None)
        if answer is not None and not answer.done():
            answer.set_result(effect.answer)

    def _refused(self, effect: Rejected[KafkaErrorCode]) -> None:
        raise CoordinatorError(f"{effect.error.name}: {effect.message}")

    def _write_markers(self, effect: tx.WriteMarkers) -> None:
        if not self.stopped:
            self._markers(self, effect)

    def _persist(self, effect: tx.PersistTransaction) -> None:
        tid, write_id = effect.transactional_id, effect.write_id
        value = None if effect.record is None else record_value(effect.record)
        batch = build_record_batch(
            [(trec.encode_key(tid), value)], base_timestamp=self._clock.now_ms()
        )

        def append() -> None:
            append_durably(
                self.partition,
                batch,
                0,
                lambda: self.stopped,
                lambda: self.step(tx.TransactionPersisted(tid, write_id)),
                lambda: self.step(tx.TransactionPersistFailed(tid, write_id)),
            )

        record = effect.record
        if self._before_decision is None or record is None or record.state not in tx.PREPARING:
            append()
            return
        markers = tx.WriteMarkers(
            tid,
            record.producer_id,
            record.producer_epoch,
            record.state is tx.TransactionState.PrepareCommit,
            record.partitions,
        )

        async def hooked(hook: DecisionHook) -> None:
            await hook(self, markers)
            if not self.stopped:
                append()

        task = asyncio.get_running_loop().create_task(hooked(self._before_decision))
        self._hooked.add(task)
        task.add_done_callback(self._hooked.discard)
