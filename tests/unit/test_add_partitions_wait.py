"""AddPartitionsToTxn right after a commit (automq_ref/kafka/transactions.py,
``TransactionCoordinator.add_partitions``): while the producer's previous transaction writes
its markers the machine would answer CONCURRENT_TRANSACTIONS, so the coordinator holds the
request and steps it in the step of the last marker (its Ongoing record then goes to the log
right behind the Complete* record), and the producer is answered NONE instead of backing off;
the Complete* record need not be durable for the next transaction to begin. Anything else is
asked at once, a completion that does not come within ``COMPLETION_WAIT_S`` leaves the answer
CONCURRENT_TRANSACTIONS, and a request cancelled while held (its connection closed) is never
asked. Below, the shard's deferred requests (``TransactionShard.request_when``), which the
coordinator holds such a request in: stepped in the step that readies them, withdrawn, or
answered ``ShardGone`` when the shard stops."""

from __future__ import annotations

import asyncio
import types
from typing import cast

import pytest

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode as E
from automq_ref.formats import transaction_record as trec
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka import transactions
from automq_ref.kafka.coordinator_topic import CoordinatorTopic
from automq_ref.kafka.group_shard import ShardGone
from automq_ref.kafka.partition import Partition, stored_batches
from automq_ref.kafka.producer_ids import ProducerIdAllocator
from automq_ref.kafka.transaction_shard import TransactionShard
from automq_ref.kafka.transactions import TransactionCoordinator
from automq_ref.state_machines import transaction as tx

PARAMS = tx.TransactionParams(expiration_ms=10_000)
A = ("a", 0)
S = tx.TransactionState


class TransactionLog:
    """The shard's ``__transaction_state`` partition: each record's state noted as it is
    appended (``appended``), durable at once unless ``hold`` names its state; a record held
    holds the records appended after it (a partition's appends become durable in order) until
    :meth:`release`."""

    topic = "__transaction_state"
    index = 0
    epoch = 0

    def __init__(self, hold: frozenset[tx.TransactionState] = frozenset()) -> None:
        self.hold = hold
        self.appended: list[tx.TransactionState] = []
        self.held: list[asyncio.Future[None]] = []

    def append_nowait(
        self, batch: bytes, max_batch_bytes: int, *, verification_guard: int = 0
    ) -> types.SimpleNamespace:
        (view,) = stored_batches(batch)
        (record,) = view.records()
        assert record.value is not None
        state = S(trec.decode_value(record.value).status)
        self.appended.append(state)
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.held or state in self.hold:
            self.held.append(durable)
        else:
            durable.set_result(None)
        return types.SimpleNamespace(error=E.NONE, message="", durable=durable)

    def release(self) -> None:
        held, self.held = self.held, []
        for durable in held:
            durable.set_result(None)


class Markers:
    """The shard's marker writer: each marker written soon after it is asked for (as the
    coordinator's writer tasks do), or, with ``hold``, only at :meth:`release`."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.held: list[tuple[TransactionShard, tx.WriteMarkers]] = []

    def __call__(self, shard: TransactionShard, effect: tx.WriteMarkers) -> None:
        if self.hold:
            self.held.append((shard, effect))
        else:
            asyncio.get_running_loop().call_soon(self.write, shard, effect)

    @staticmethod
    def write(shard: TransactionShard, effect: tx.WriteMarkers) -> None:
        for partition in sorted(effect.partitions):
            shard.step(tx.MarkerWritten(effect.transactional_id, partition, effect.producer_epoch))

    def release(self) -> None:
        held, self.held = self.held, []
        for shard, effect in held:
            self.write(shard, effect)


class Allocator:
    async def allocate(self) -> int:
        return 500


class OneShard:
    """The coordinator's topic, reduced to one shard that serves every transactional id."""

    def __init__(self, shard: TransactionShard) -> None:
        self.shard = shard

    def placement(self) -> object:
        return self

    def route(self, transactional_id: str, shards: object) -> TransactionShard:
        return self.shard


def serving(log: TransactionLog, markers: Markers) -> TransactionCoordinator:
    """A coordinator whose one shard is over ``log``, its markers written by ``markers``."""
    coordinator = TransactionCoordinator(
        cast(MetadataView, None),
        load_config(environment={}),
        FixedClock(),
        cast(ProducerIdAllocator, Allocator()),
    )
    shard = TransactionShard(cast(Partition, log), FixedClock(), markers)
    shard.start(PARAMS)
    coordinator._topic = cast(CoordinatorTopic, OneShard(shard))
    return coordinator


async def committed(coordinator: TransactionCoordinator) -> None:
    """InitProducerId, a partition added, EndTxn(commit) answered: producer 500, epoch 0."""
    init = await coordinator.init_producer_id("t", 60_000, -1, -1)
    assert init == tx.InitProducerIdAnswer(E.NONE, 500, 0)
    added = await coordinator.add_partitions("t", 500, 0, [A])
    assert added == tx.PartitionsAnswer(((A, E.NONE),))
    assert await coordinator.end_txn("t", 500, 0, commit=True) is E.NONE


def described(coordinator: TransactionCoordinator) -> tx.TransactionMetadata | None:
    return coordinator.describe(["t"])[0][2]


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold that outlasts any test below, however loaded the machine."""
    monkeypatch.setattr(transactions, "COMPLETION_WAIT_S", 60.0)


@pytest.mark.usefixtures("long_wait")
async def test_the_next_transaction_is_added_in_the_step_of_the_last_marker() -> None:
    log, markers = TransactionLog(), Markers(hold=True)
    coordinator = serving(log, markers)
    await committed(coordinator)
    assert markers.held, "the markers wait"
    added = asyncio.ensure_future(coordinator.add_partitions("t", 500, 0, [A]))
    await asyncio.sleep(0.01)
    assert not added.done()  # held, not answered CONCURRENT_TRANSACTIONS
    assert log.appended == [S.Empty, S.Ongoing, S.PrepareCommit]  # and not asked yet
    markers.release()
    # In the marker's own step: the Complete record, and the Ongoing record right behind it.
    assert log.appended[-2:] == [S.CompleteCommit, S.Ongoing]
    assert await added == tx.PartitionsAnswer(((A, E.NONE),))
    metadata = described(coordinator)
    assert metadata is not None
    assert (metadata.state, metadata.partitions) == (S.Ongoing, frozenset({A}))


async def test_the_next_transaction_does_not_wait_for_the_complete_record() -> None:
    """The Complete* record still on its way: the next transaction's Ongoing record is asked
    for at once, behind it, and the answer comes once both are durable."""
    log = TransactionLog(hold=frozenset({S.CompleteCommit}))
    coordinator = serving(log, Markers())
    await committed(coordinator)
    while S.CompleteCommit not in log.appended:  # the markers are written soon
        await asyncio.sleep(0)
    assert log.held, "the Complete record is not durable"
    added = asyncio.ensure_future(coordinator.add_partitions("t", 500, 0, [A]))
    await asyncio.sleep(0)
    assert log.appended[-2:] == [S.CompleteCommit, S.Ongoing]
    assert not added.done()  # the Ongoing record is not durable yet
    log.release()
    assert await added == tx.PartitionsAnswer(((A, E.NONE),))


async def test_an_answer_that_is_not_concurrent_is_given_at_once() -> None:
    log = TransactionLog()
    coordinator = serving(log, Markers(hold=True))
    init = await coordinator.init_producer_id("t", 60_000, -1, -1)
    assert init == tx.InitProducerIdAnswer(E.NONE, 500, 0)
    async with asyncio.timeout(1.0):  # nothing to wait for: no marker is released below
        answer = await coordinator.add_partitions("t", 500, 0, [A])
        assert answer == tx.PartitionsAnswer(((A, E.NONE),))
        fenced = await coordinator.add_partitions("t", 500, 7, [A])
        assert fenced == tx.PartitionsAnswer(((A, E.PRODUCER_FENCED),))


async def test_concurrent_with_a_pending_record_of_an_ongoing_transaction_is_not_waited_for() -> (
    None
):
    log = TransactionLog(hold=frozenset({S.Ongoing}))
    coordinator = serving(log, Markers())
    init = await coordinator.init_producer_id("t", 60_000, -1, -1)
    assert init == tx.InitProducerIdAnswer(E.NONE, 500, 0)
    pending = asyncio.ensure_future(coordinator.add_partitions("t", 500, 0, [A]))
    await asyncio.sleep(0)
    assert log.appended == [S.Empty, S.Ongoing] and not pending.done()
    async with asyncio.timeout(1.0):  # not held: no marker is being written
        answer = await coordinator.add_partitions("t", 500, 0, [("b", 0)])
    assert answer == tx.PartitionsAnswer(((("b", 0), E.CONCURRENT_TRANSACTIONS),))
    log.release()
    assert await pending == tx.PartitionsAnswer(((A, E.NONE),))


async def test_a_completion_that_does_not_come_leaves_the_answer_concurrent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "COMPLETION_WAIT_S", 0.02)
    log, markers = TransactionLog(), Markers(hold=True)
    coordinator = serving(log, markers)
    await committed(coordinator)
    loop = asyncio.get_running_loop()
    began = loop.time()
    answer = await coordinator.add_partitions("t", 500, 0, [A])
    assert answer == tx.PartitionsAnswer(((A, E.CONCURRENT_TRANSACTIONS),))
    assert 0.02 <= loop.time() - began < 1.0
    markers.release()  # the completion comes later: the request is not asked again
    assert log.appended == [S.Empty, S.Ongoing, S.PrepareCommit, S.CompleteCommit]


@pytest.mark.usefixtures("long_wait")
async def test_a_held_request_whose_connection_closes_is_never_asked() -> None:
    log, markers = TransactionLog(), Markers(hold=True)
    coordinator = serving(log, markers)
    await committed(coordinator)
    added = asyncio.ensure_future(coordinator.add_partitions("t", 500, 0, [A]))
    await asyncio.sleep(0.01)
    added.cancel()
    with pytest.raises(asyncio.CancelledError):
        await added
    markers.release()
    assert log.appended == [S.Empty, S.Ongoing, S.PrepareCommit, S.CompleteCommit]
    metadata = described(coordinator)
    assert metadata is not None and metadata.state is S.CompleteCommit


class FixedClock:
    def now_ms(self) -> int:
        return 0

    def monotonic_s(self) -> float:
        return 0.0


def shard() -> TransactionShard:
    """A shard serving an empty transaction log (its partition never written: the requests
    below write no record)."""
    log = cast(Partition, types.SimpleNamespace(topic="__transaction_state", index=0))
    served = TransactionShard(log, FixedClock(), lambda _shard, _effect: None)
    served.start(PARAMS)
    return served


def refused(request_id: int, now_ms: int) -> tx.InitProducerId:
    """A request the machine answers at once, writing nothing (a timeout out of range)."""
    return tx.InitProducerId(request_id, "t", 0, now_ms, -1, -1, 500)


async def test_a_deferred_request_is_stepped_in_the_step_that_readies_it() -> None:
    s = shard()
    deferred = s.request_when(lambda state: state.now_ms >= 5, refused)
    assert not deferred.answer.done()
    s.step(tx.Tick(3))
    assert not deferred.answer.done()
    s.step(tx.Tick(5))
    assert deferred.answer.done()  # in that step's own call, before anything else runs
    assert await deferred.answer == tx.InitProducerIdAnswer(E.INVALID_TRANSACTION_TIMEOUT)
    assert not s.withdraw(deferred)


async def test_a_deferred_request_withdrawn_or_left_when_the_shard_stops() -> None:
    s = shard()
    ready = s.request_when(lambda state: True, refused)
    assert ready.answer.done()  # ready at once: asked at once
    withdrawn = s.request_when(lambda state: state.now_ms >= 5, refused)
    assert s.withdraw(withdrawn)
    left = s.request_when(lambda state: state.now_ms >= 5, refused)
    s.step(tx.Tick(5))
    assert not withdrawn.answer.done()  # never asked
    assert left.answer.done()
    waiting = s.request_when(lambda state: state.now_ms >= 10, refused)
    s.stop()
    with pytest.raises(ShardGone):
        await waiting.answer
