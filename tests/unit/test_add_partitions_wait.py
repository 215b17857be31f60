"""AddPartitionsToTxn right after a commit (automq_ref/kafka/handlers/transactions.py,
``add_after_completion``): the coordinator machine answers CONCURRENT_TRANSACTIONS while the
producer's previous transaction writes its markers; the handler asks again once that
transaction has completed (its last marker written: the Complete* record need not be durable
for the next transaction to begin), so the producer is answered NONE instead of backing off.
Anything else concurrent is answered at once, and a completion that does not come within
``COMPLETION_WAIT_S`` leaves the answer CONCURRENT_TRANSACTIONS. Below, the shard's deferred
requests (``TransactionShard.request_when``), which the coordinator holds such a request in:
stepped in the step that readies them, withdrawn, or answered ``ShardGone`` when the shard
stops."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Sequence
from typing import cast

import pytest

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.kafka.group_shard import ShardGone
from automq_ref.kafka.handlers import transactions as handlers
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.transaction_shard import TransactionShard
from automq_ref.kafka.transactions import TransactionCoordinator
from automq_ref.state_machines import transaction as tx

PARAMS = tx.TransactionParams(expiration_ms=10_000)
A = ("a", 0)


class MachineCoordinator:
    """The two calls the handler makes, over the real machine; records become durable at once
    unless ``hold`` says which target states wait for :meth:`release`, and markers are written
    at once unless ``hold_markers`` (then :meth:`release_markers` writes them). A record held
    holds the records asked for after it, as a partition's appends become durable in order."""

    def __init__(
        self, hold: frozenset[tx.TransactionState] = frozenset(), hold_markers: bool = False
    ) -> None:
        self.state = tx.CoordinatorState()
        self.hold = hold
        self.hold_markers = hold_markers
        self.held: list[tx.PersistTransaction] = []
        self.held_markers: list[tx.WriteMarkers] = []
        self.request = 0
        self.answers: dict[int, tx.Answer] = {}
        self.asked = 0
        self.waiters: dict[int, asyncio.Future[tx.Answer]] = {}  # answers given later
        self.woken: asyncio.Event | None = None
        self.waits = 0

    def step(self, event: tx.TransactionEvent) -> None:
        transition = tx.step(self.state, event, PARAMS)
        assert transition.rejection is None, transition.rejection
        self.state = transition.state
        woken, self.woken = self.woken, None
        if woken is not None:
            woken.set()
        for effect in transition.effects:
            if isinstance(effect, tx.Respond):
                self.answers[effect.request_id] = effect.answer
                waiter = self.waiters.pop(effect.request_id, None)
                if waiter is not None:
                    waiter.set_result(effect.answer)
            elif isinstance(effect, tx.PersistTransaction):
                record = effect.record
                if self.held or (record is not None and record.state in self.hold):
                    self.held.append(effect)
                else:
                    self.step(tx.TransactionPersisted(effect.transactional_id, effect.write_id))
            elif isinstance(effect, tx.WriteMarkers):
                if self.hold_markers:
                    self.held_markers.append(effect)
                else:
                    self.write_markers(effect)

    def write_markers(self, effect: tx.WriteMarkers) -> None:
        for partition in sorted(effect.partitions):
            self.step(tx.MarkerWritten("t", partition, effect.producer_epoch))

    def release(self) -> None:
        held, self.held = self.held, []
        for effect in held:
            self.step(tx.TransactionPersisted(effect.transactional_id, effect.write_id))

    def release_markers(self) -> None:
        held, self.held_markers = self.held_markers, []
        for effect in held:
            self.write_markers(effect)

    def ask(self, event: tx.TransactionEvent) -> tx.Answer | None:
        self.step(event)
        return self.answers.get(self.request)

    def next_request(self) -> int:
        self.request += 1
        return self.request

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tx.PartitionKey],
        *,
        verify_only: bool = False,
    ) -> tx.PartitionsAnswer:
        self.asked += 1
        request = self.next_request()
        waiter = self.waiters[request] = asyncio.get_running_loop().create_future()
        self.ask(
            tx.AddPartitionsToTxn(
                request,
                transactional_id,
                producer_id,
                producer_epoch,
                tuple(partitions),
                0,
                verify_only,
            )
        )
        answer = await waiter
        assert isinstance(answer, tx.PartitionsAnswer)
        return answer

    async def stepped(self, transactional_id: str) -> None:
        self.waits += 1
        if self.woken is None:
            self.woken = asyncio.Event()
        await self.woken.wait()

    def describe(
        self, transactional_ids: Sequence[str]
    ) -> list[tuple[str, E, tx.TransactionMetadata | None]]:
        return [(i, E.NONE, tx.describe(self.state, i)) for i in transactional_ids]

    def committed(self) -> None:
        """InitProducerId, a partition added, EndTxn(commit) answered: producer 500, epoch 0."""
        init = self.ask(tx.InitProducerId(self.next_request(), "t", 60_000, 0, -1, -1, 500))
        assert init == tx.InitProducerIdAnswer(E.NONE, 500, 0)
        added = self.ask(tx.AddPartitionsToTxn(self.next_request(), "t", 500, 0, (A,), 0))
        assert added == tx.PartitionsAnswer(((A, E.NONE),))
        ended = self.ask(tx.EndTxn(self.next_request(), "t", 500, 0, True, 0))
        assert ended == tx.EndTxnAnswer(E.NONE)


def coordinator(fake: MachineCoordinator) -> TransactionCoordinator:
    return cast(TransactionCoordinator, fake)


async def test_the_next_transaction_is_added_once_the_previous_one_completes() -> None:
    fake = MachineCoordinator(hold_markers=True)
    fake.committed()
    assert fake.held_markers, "the markers wait"
    asyncio.get_running_loop().call_later(0.01, fake.release_markers)
    answer = await handlers.add_after_completion(coordinator(fake), "t", 500, 0, [A])
    assert answer == tx.PartitionsAnswer(((A, E.NONE),))
    assert fake.asked == 2  # once refused as concurrent, once after the completion
    assert fake.waits == 1  # the release stepped the marker, and so the completion, at once
    metadata = tx.describe(fake.state, "t")
    assert metadata is not None
    assert (metadata.state, metadata.partitions) == (tx.TransactionState.Ongoing, frozenset({A}))


async def test_the_next_transaction_does_not_wait_for_the_complete_record() -> None:
    """The Complete* record still on its way: the next transaction's Ongoing record is asked
    for at once, behind it, and the answer comes once both are durable."""
    fake = MachineCoordinator(hold=frozenset({tx.TransactionState.CompleteCommit}))
    fake.committed()
    assert [r.record.state for r in fake.held if r.record] == [tx.TransactionState.CompleteCommit]
    added = asyncio.ensure_future(
        handlers.add_after_completion(coordinator(fake), "t", 500, 0, [A])
    )
    await asyncio.sleep(0)
    assert [r.record.state for r in fake.held if r.record] == [
        tx.TransactionState.CompleteCommit,
        tx.TransactionState.Ongoing,
    ]
    assert not added.done()  # the Ongoing record is not durable yet
    fake.release()
    assert await added == tx.PartitionsAnswer(((A, E.NONE),))
    assert fake.asked == 1 and fake.waits == 0


async def test_an_answer_that_is_not_concurrent_is_given_at_once() -> None:
    fake = MachineCoordinator()
    fake.committed()  # completed at once
    answer = await handlers.add_after_completion(coordinator(fake), "t", 500, 0, [A])
    assert answer == tx.PartitionsAnswer(((A, E.NONE),))
    fenced = await handlers.add_after_completion(coordinator(fake), "t", 500, 7, [A])
    assert fenced == tx.PartitionsAnswer(((A, E.PRODUCER_FENCED),))
    assert fake.asked == 2


async def test_concurrent_with_a_pending_record_of_an_ongoing_transaction_is_not_waited_for() -> (
    None
):
    fake = MachineCoordinator(hold=frozenset({tx.TransactionState.Ongoing}))
    init = fake.ask(tx.InitProducerId(fake.next_request(), "t", 60_000, 0, -1, -1, 500))
    assert init == tx.InitProducerIdAnswer(E.NONE, 500, 0)
    fake.ask(tx.AddPartitionsToTxn(fake.next_request(), "t", 500, 0, (A,), 0))  # pending
    answer = await handlers.add_after_completion(coordinator(fake), "t", 500, 0, [("b", 0)])
    assert answer == tx.PartitionsAnswer(((("b", 0), E.CONCURRENT_TRANSACTIONS),))
    assert fake.asked == 1


async def test_a_completion_that_does_not_come_leaves_the_answer_concurrent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers, "COMPLETION_WAIT_S", 0.02)
    fake = MachineCoordinator(hold_markers=True)
    fake.committed()
    loop = asyncio.get_running_loop()
    began = loop.time()
    answer = await handlers.add_after_completion(coordinator(fake), "t", 500, 0, [A])
    assert answer == tx.PartitionsAnswer(((A, E.CONCURRENT_TRANSACTIONS),))
    assert 0.02 <= loop.time() - began < 1.0
    assert fake.asked == 1


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
