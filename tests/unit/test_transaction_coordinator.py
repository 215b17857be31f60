"""The transaction coordinator machine's answers, case by case, as Kafka's coordinator gives
them (automq_ref/state_machines/transaction.py)."""

from __future__ import annotations

from automq_ref.errors import KafkaErrorCode as E
from automq_ref.state_machines import transaction as tx
from automq_ref.state_machines.transaction import (
    AddPartitionsToTxn,
    CoordinatorState,
    EndTxn,
    EndTxnAnswer,
    InitProducerId,
    InitProducerIdAnswer,
    MarkerWritten,
    PartitionsAnswer,
    PersistTransaction,
    Respond,
    Tick,
    TransactionEvent,
    TransactionParams,
    TransactionPersisted,
    TransactionPersistFailed,
    TransactionState,
    WriteMarkers,
)

PARAMS = TransactionParams(expiration_ms=10_000)
A = ("a", 0)


class Coordinator:
    def __init__(self) -> None:
        self.state = CoordinatorState()
        self.request = 0
        self.answers: dict[int, object] = {}
        self.persists: list[PersistTransaction] = []
        self.markers: list[WriteMarkers] = []

    def step(self, event: TransactionEvent) -> None:
        transition = tx.step(self.state, event, PARAMS)
        assert transition.rejection is None, transition.rejection
        self.state = transition.state
        for check in tx.INVARIANTS:
            check(self.state)
        for effect in transition.effects:
            if isinstance(effect, Respond):
                self.answers[effect.request_id] = effect.answer
            elif isinstance(effect, PersistTransaction):
                self.persists.append(effect)
            elif isinstance(effect, WriteMarkers):
                self.markers.append(effect)

    def durable(self) -> None:
        while self.persists:
            self.step(TransactionPersisted("t", self.persists.pop(0).write_id))

    def ask(self, make: object, *, persist: bool = True) -> object:
        self.request += 1
        assert callable(make)
        self.step(make(self.request))
        if persist:
            self.durable()
        return self.answers.get(self.request)

    def init(self, pid: int = -1, epoch: int = -1, timeout_ms: int = 1000, now: int = 0) -> object:
        fresh = 500 if tx.needs_producer_id(self.state, "t") else None
        return self.ask(lambda r: InitProducerId(r, "t", timeout_ms, now, pid, epoch, fresh))

    def add(self, pid: int, epoch: int, verify: bool = False) -> object:
        return self.ask(lambda r: AddPartitionsToTxn(r, "t", pid, epoch, (A,), 0, verify))

    def end(self, pid: int, epoch: int, commit: bool) -> object:
        return self.ask(lambda r: EndTxn(r, "t", pid, epoch, commit, 0))

    def markers_written(self) -> None:
        for markers in self.markers:
            for partition in sorted(markers.partitions):
                self.step(MarkerWritten("t", partition, markers.producer_epoch))
        self.markers = []
        self.durable()

    def status(self) -> TransactionState:
        metadata = tx.describe(self.state, "t")
        assert metadata is not None
        return metadata.state


def test_a_new_id_gets_epoch_0_and_a_second_init_bumps_it() -> None:
    c = Coordinator()
    assert c.init() == InitProducerIdAnswer(E.NONE, 500, 0)
    assert c.init() == InitProducerIdAnswer(E.NONE, 500, 1)


def test_a_timeout_above_the_maximum_is_refused() -> None:
    c = Coordinator()
    assert c.init(timeout_ms=900_001) == InitProducerIdAnswer(E.INVALID_TRANSACTION_TIMEOUT)
    assert c.init(timeout_ms=0) == InitProducerIdAnswer(E.INVALID_TRANSACTION_TIMEOUT)
    assert tx.describe(c.state, "t") is None


def test_a_request_while_a_record_is_pending_is_concurrent() -> None:
    c = Coordinator()
    c.init()
    c.ask(lambda r: AddPartitionsToTxn(r, "t", 500, 0, (A,), 0), persist=False)
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.CONCURRENT_TRANSACTIONS)


def test_commit_writes_markers_then_completes_and_a_retry_is_answered_none() -> None:
    c = Coordinator()
    c.init()
    assert c.add(500, 0) == PartitionsAnswer(((A, E.NONE),))
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.NONE)
    assert c.status() is TransactionState.PrepareCommit
    assert c.markers == [WriteMarkers("t", 500, 0, True, frozenset({A}))]
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.CONCURRENT_TRANSACTIONS)
    assert c.end(500, 0, commit=False) == EndTxnAnswer(E.INVALID_TXN_STATE)
    c.markers_written()
    assert c.status() is TransactionState.CompleteCommit
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.NONE)
    assert c.end(500, 0, commit=False) == EndTxnAnswer(E.INVALID_TXN_STATE)


def test_end_txn_without_a_transaction_and_with_a_wrong_id_or_epoch() -> None:
    c = Coordinator()
    c.init()
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.INVALID_TXN_STATE)
    assert c.end(501, 0, commit=True) == EndTxnAnswer(E.INVALID_PRODUCER_ID_MAPPING)
    assert c.end(500, 3, commit=True) == EndTxnAnswer(E.PRODUCER_FENCED)
    assert c.add(500, 3) == PartitionsAnswer(((A, E.PRODUCER_FENCED),))


def test_a_new_instance_fences_the_ongoing_transaction_with_an_epoch_bump() -> None:
    c = Coordinator()
    c.init()
    c.add(500, 0)
    assert c.init() == InitProducerIdAnswer(E.CONCURRENT_TRANSACTIONS)
    assert c.status() is TransactionState.PrepareAbort
    assert c.markers == [WriteMarkers("t", 500, 1, False, frozenset({A}))]
    assert c.end(500, 0, commit=True) == EndTxnAnswer(E.PRODUCER_FENCED)
    c.markers_written()
    assert c.status() is TransactionState.CompleteAbort
    assert c.init() == InitProducerIdAnswer(E.NONE, 500, 2)


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator() -> None:
    c = Coordinator()
    c.init(timeout_ms=1000)
    c.add(500, 0)
    c.step(Tick(1000))
    assert c.status() is TransactionState.Ongoing
    c.step(Tick(1001))
    c.durable()
    assert c.status() is TransactionState.PrepareAbort
    assert c.add(500, 0) == PartitionsAnswer(((A, E.PRODUCER_FENCED),))


def test_kip_360_bump_with_the_own_epoch_and_its_retry() -> None:
    c = Coordinator()
    c.init()
    c.add(500, 0)
    c.end(500, 0, commit=False)
    c.markers_written()
    assert c.init(500, 0) == InitProducerIdAnswer(E.NONE, 500, 1)
    assert c.init(500, 0) == InitProducerIdAnswer(E.NONE, 500, 1)  # a retry: the same
    assert c.init(500, 7) == InitProducerIdAnswer(E.PRODUCER_FENCED)


def test_verification_answers_per_partition_and_changes_nothing() -> None:
    c = Coordinator()
    c.init()
    assert c.add(500, 0, verify=True) == PartitionsAnswer(((A, E.TRANSACTION_ABORTABLE),))
    c.add(500, 0)
    before = c.state
    assert c.add(500, 0, verify=True) == PartitionsAnswer(((A, E.NONE),))
    assert c.state == before
    assert c.add(500, 1, verify=True) == PartitionsAnswer(((A, E.PRODUCER_FENCED),))


def test_a_failed_record_is_dropped_and_the_request_gets_the_error() -> None:
    c = Coordinator()
    c.init()
    c.ask(lambda r: AddPartitionsToTxn(r, "t", 500, 0, (A,), 0), persist=False)
    c.step(TransactionPersistFailed("t", c.persists.pop().write_id))
    assert c.answers[c.request] == PartitionsAnswer(((A, E.COORDINATOR_NOT_AVAILABLE),))
    assert c.status() is TransactionState.Empty


def test_an_idle_id_expires_and_recovery_resumes_the_markers() -> None:
    c = Coordinator()
    c.init()
    c.step(Tick(20_000))
    assert c.persists[-1].record is None  # the tombstone
    c.durable()
    assert tx.describe(c.state, "t") is None
    d = Coordinator()
    d.init()
    d.add(500, 0)
    d.end(500, 0, commit=True)
    records = [("t", None), ("t", tx.describe(d.state, "t"))]
    recovered = tx.recover(records, 0)
    assert recovered.effects == (WriteMarkers("t", 500, 0, True, frozenset({A})),)
