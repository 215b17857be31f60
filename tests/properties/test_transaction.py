"""TransactionMachine: specs/Transaction.tla's world on the real machines.

The coordinator is ``automq_ref.state_machines.transaction`` (every request stepped, every
record persisted or failed by a rule of its own, every marker written by one); each partition
is ``transaction_partition``'s producer state plus a log of the batches that landed; the
producer instances and the network are the spec's, modelled here: instances initialize, add
partitions, send writes, give up on writes (a produce timeout: the transaction must abort and,
KIP-360, the epoch be bumped before the next one), and end transactions; writes are verified,
land, or are lost, in any order. Rules are named after the spec's actions in snake_case, and the
spec's invariants are checked after every step under the same names (``AllOrNothing`` is
``all_or_nothing``...). The machine's own invariants (``INVARIANTS``) are checked too. With
``traced`` the run is recorded as a trace of the spec (``tla_state``, ``record``), which
tests/properties/test_transaction_trace.py validates with TLC.

Below the machine, the spec's two mutation models replayed: without the epoch bump on the
coordinator's abort a zombie commits (MCTransactionNoFenceBump), and without verification a
write given up on hangs a transaction (MCTransactionNoVerify).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines import transaction as tx
from automq_ref.state_machines import transaction_partition as tp
from automq_ref.state_machines.transaction import (
    AddPartitionsToTxn,
    EndTxn,
    EndTxnAnswer,
    InitProducerId,
    InitProducerIdAnswer,
    MarkerWritten,
    PartitionsAnswer,
    PersistTransaction,
    Respond,
    Tick,
    TransactionParams,
    TransactionPersisted,
    TransactionPersistFailed,
    TransactionState,
    WriteMarkers,
)

E = KafkaErrorCode
S = TransactionState
TID = "t"
INSTANCES = ("i1", "i2")
PARTITIONS = (("a", 0), ("b", 0))
TIMEOUT_MS = 3_000
MAX_WRITES = 6
MAX_ATTEMPTS = 3
# How often the environment's rarer moves happen when their rule is drawn: one draw in N. Each
# is a hazard per step (its rule is enabled most of the time), so they are kept rare enough
# that a run commits (at one in three each, and time passing as a rule of its own, 40% of the
# steps, fewer than one run in ten committed).
SECOND_INSTANCE_ONE_IN = 6  # a second instance initializes (and fences the first)
GIVE_UP_ONE_IN = 6  # an instance gives up on a write (a produce timeout)
LOSE_ONE_IN = 6  # the network loses a write
ABORT_ONE_IN = 4  # an instance whose transaction may commit aborts it


def one_in(n: int) -> st.SearchStrategy[int]:
    """A draw that is ``n - 1`` one time in ``n``."""
    return st.integers(0, n - 1)


@dataclass
class Instance:
    """A producer instance of the one transactional id (the client's TransactionManager)."""

    name: str
    state: str = "Uninitialized"  # Ready, InTransaction, FatalError
    epoch: int = -1
    producer_id: int = -1
    attempt: int = 1
    added: set[tuple[str, int]] = field(default_factory=set)
    abortable: bool = False
    fate_unknown: bool = False
    must_bump: bool = False
    asking: int | None = None  # the request id of its coordinator request in flight
    pending: set[int] = field(default_factory=set)  # writes it waits for


@dataclass(frozen=True)
class Write:
    w: int
    instance: str
    attempt: int
    producer_id: int
    epoch: int
    partition: tuple[str, int]
    guard: int = tp.NO_GUARD


@dataclass
class PartitionLog:
    # The partition's transaction state of each producer id: an id that expires (Dead) comes
    # back with a new producer id, whose state starts afresh here.
    entries: dict[int, tp.ProducerTransaction] = field(default_factory=dict)
    # ("DATA", (instance, attempt), w, epoch) or ("COMMIT" | "ABORT", epoch, producer_id)
    batches: list[tuple[object, ...]] = field(default_factory=list)

    def of(self, producer_id: int) -> tp.ProducerTransaction:
        return self.entries.get(producer_id, tp.ProducerTransaction())

    @property
    def entry(self) -> tp.ProducerTransaction:
        """The newest producer id's state: the spec's one producer (traced runs keep one id)."""
        return self.of(max(self.entries, default=-1))


def fates(log: PartitionLog) -> list[tuple[tuple[str, int], int, str]]:
    """Every data batch of the log with its fate: the first marker after it, or NONE."""
    found: list[tuple[tuple[str, int], int, str]] = []
    for k, batch in enumerate(log.batches):
        if batch[0] != "DATA":
            continue
        later = [b[0] for b in log.batches[k + 1 :] if b[0] != "DATA"]
        attempt, w = batch[1], batch[2]
        assert isinstance(attempt, tuple) and isinstance(w, int)
        found.append((attempt, w, str(later[0]) if later else "NONE"))
    return found


def init_request(
    request_id: int, instance: Instance, now_ms: int, fresh: int | None
) -> InitProducerId:
    """InitProducerId of a new instance, or with the instance's own id and epoch (KIP-360)."""
    own = instance.state == "Ready"
    producer_id, epoch = (instance.producer_id, instance.epoch) if own else (-1, -1)
    return InitProducerId(request_id, TID, TIMEOUT_MS, now_ms, producer_id, epoch, fresh)


class TransactionMachine(RuleBasedStateMachine):
    # Ids expire after 5 s idle here (Kafka: 7 days), so that runs reach Dead.
    params = TransactionParams(expiration_ms=5_000)
    verify = True
    # Record the run as a trace of specs/Transaction.tla (tests/properties/
    # test_transaction_trace.py): ``Init``, then one line per step of the spec's world.
    traced = False
    # Whether the write of the coordinator's own abort may fail (the fence is then undone, a
    # step the spec, whose writes never fail, does not have: traced runs keep it durable).
    fail_fences = True

    def __init__(self) -> None:
        super().__init__()
        self.state = tx.CoordinatorState()
        self.now_ms = 0
        self.instances = {name: Instance(name) for name in INSTANCES}
        self.partitions = {p: PartitionLog() for p in PARTITIONS}
        self.in_flight: list[Write] = []
        self.writes = 0
        self.requests = 0
        self.next_producer_id = 1000
        self.next_guard = 1
        self.persists: list[PersistTransaction] = []
        self.markers: list[tuple[WriteMarkers, set[tuple[str, int]]]] = []
        self.answers: dict[int, tuple[str, object]] = {}  # request id -> (instance, request)
        # History, as the spec's.
        self.decisions: list[tuple[tuple[str, int], str, bool]] = []
        self.aborts: set[tuple[str, int]] = set()
        self.fenced: set[str] = set()
        self.trace: list[dict[str, object]] = []
        self.record("Init")

    # ------------------------------------------------------------------------- the trace

    def tla_state(self) -> dict[str, object]:
        """The spec's variables: the coordinator's and the partitions' from the machines
        (``tla_state``), the instances', the network's and the logs from this world; the
        history (``decisions``, ``aborts``, ``fenced``) is left to TLC."""

        def per_instance(value: Callable[[Instance], object]) -> dict[str, object]:
            return {"fn": [[name, value(i)] for name, i in sorted(self.instances.items())]}

        def names(partitions: set[tuple[str, int]]) -> dict[str, object]:
            return {"set": sorted(tp.tla_partition(p) for p in partitions)}

        def batch(entry: tuple[object, ...]) -> dict[str, object]:
            if entry[0] == "DATA":
                attempt, w, epoch = entry[1], entry[2], entry[3]
                assert isinstance(attempt, tuple)
                return {"record": {"kind": "DATA", "a": {"seq": list(attempt)}, "e": epoch, "w": w}}
            return {"record": {"kind": entry[0], "e": entry[1]}}

        logs = sorted(self.partitions.items())
        return {
            **tx.tla_state(self.state, TID),
            **tp.tla_state({p: log.entry for p, log in logs}),
            "log": {
                "fn": [
                    [tp.tla_partition(p), {"seq": [batch(b) for b in log.batches]}]
                    for p, log in logs
                ]
            },
            "instanceState": per_instance(lambda i: i.state),
            "instanceEpoch": per_instance(lambda i: i.epoch),
            "attempt": per_instance(lambda i: i.attempt),
            "added": per_instance(lambda i: names(i.added)),
            "abortable": per_instance(lambda i: i.abortable),
            "fateUnknown": per_instance(lambda i: i.fate_unknown),
            "mustBump": per_instance(lambda i: i.must_bump),
            "inFlight": {
                "set": [
                    {
                        "record": {
                            "a": {"seq": [w.instance, w.attempt]},
                            "e": w.epoch,
                            "p": tp.tla_partition(w.partition),
                            "w": w.w,
                        }
                    }
                    for w in sorted(self.in_flight, key=lambda w: w.w)
                ]
            },
            "pending": per_instance(lambda i: {"set": sorted(i.pending)}),
            "sent": self.writes,
        }

    def record(self, action: str) -> None:
        if self.traced:
            self.trace.append({"action": action, "state": self.tla_state()})

    # ---------------------------------------------------------------------- the coordinator

    def apply(self, event: tx.TransactionEvent) -> None:
        before = self.state.entries.get(TID)
        pending = before.pending if before is not None else None
        transition = tx.step(self.state, event, self.params)
        assert transition.rejection is None, (event, transition.rejection)
        previous, self.state = self.state, transition.state
        for check in tx.INVARIANTS:
            check(self.state)
        if (
            isinstance(event, TransactionPersisted)
            and pending is not None
            and pending.restore is not None
        ):
            # The coordinator's own abort is durable: the transaction of the instance that
            # held the epoch is aborted (the spec's FenceOngoing, then AbortFenced).
            for instance in self.instances.values():
                if (
                    instance.epoch == pending.restore.producer_epoch
                    and instance.state == "InTransaction"
                ):
                    self.aborts.add((instance.name, instance.attempt))
        for effect in transition.effects:
            if isinstance(effect, PersistTransaction):
                self.persists.append(effect)
            elif isinstance(effect, WriteMarkers):
                self.markers.append((effect, set(effect.partitions)))
            elif isinstance(effect, Respond):
                self.answer(effect)
        self.record(tx.tla_action(event, previous, self.state))

    def ask(self, instance: Instance, make: object) -> None:
        self.requests += 1
        instance.asking = self.requests
        assert callable(make)
        request = make(self.requests)
        self.answers[self.requests] = (instance.name, request)
        self.apply(request)

    def answer(self, respond: Respond) -> None:
        name, request = self.answers.pop(respond.request_id)
        instance = self.instances[name]
        instance.asking = None
        answer = respond.answer
        if isinstance(answer, InitProducerIdAnswer):
            if answer.error is E.NONE:
                others = {
                    i.name for i in self.instances.values() if i.name != name and i.epoch != -1
                }
                self.fenced |= others
                instance.state, instance.epoch = "Ready", answer.producer_epoch
                instance.producer_id, instance.must_bump = answer.producer_id, False
            elif answer.error is E.PRODUCER_FENCED:
                instance.state = "FatalError"
            else:
                assert answer.error in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_NOT_AVAILABLE), (
                    answer
                )
        elif isinstance(answer, PartitionsAnswer):
            assert isinstance(request, AddPartitionsToTxn)
            errors = {error for _, error in answer.errors}
            assert len(errors) == 1, answer
            error = errors.pop()
            if error is E.NONE:
                instance.state = "InTransaction"
                instance.added |= set(request.partitions)
            elif error in (E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING):
                instance.state = "FatalError"
            else:
                assert error in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_NOT_AVAILABLE), answer
        elif isinstance(answer, EndTxnAnswer):
            assert isinstance(request, EndTxn)
            if answer.error is E.NONE:
                attempt = (name, instance.attempt)
                zombie = attempt in self.aborts or name in self.fenced
                self.decisions.append((attempt, "COMMIT" if request.commit else "ABORT", zombie))
                instance.state, instance.attempt = "Ready", instance.attempt + 1
                instance.added, instance.abortable = set(), False
                instance.must_bump, instance.fate_unknown = instance.fate_unknown, False
            elif answer.error in (
                E.PRODUCER_FENCED,
                E.INVALID_TXN_STATE,
                E.INVALID_PRODUCER_ID_MAPPING,  # the id expired (Dead) since its last request
            ):
                instance.state = "FatalError"
            else:
                assert answer.error in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_NOT_AVAILABLE), (
                    answer
                )

    def idle(self, instance: Instance) -> bool:
        return instance.asking is None

    # ------------------------------------------------------------------ the instances' rules

    def busy(self) -> bool:
        """The coordinator would answer CONCURRENT_TRANSACTIONS: a client backs off."""
        entry = self.state.entries.get(TID)
        if entry is None:
            return False
        if entry.pending is not None or entry.metadata is None:
            return True
        return entry.metadata.state in tx.PREPARING

    def can_init(self) -> list[Instance]:
        if self.busy():
            return []
        return [
            i
            for i in self.instances.values()
            if self.idle(i) and (i.state == "Uninitialized" or (i.state == "Ready" and i.must_bump))
        ]

    @precondition(lambda self: bool(self.can_init()))
    @rule(data=st.data(), now=one_in(SECOND_INSTANCE_ONE_IN))
    def init_producer_id(self, data: st.DataObject, now: int) -> None:
        instance = data.draw(st.sampled_from(self.can_init()))
        others = [i for i in self.instances.values() if i is not instance and i.epoch != -1]
        if others and instance.state == "Uninitialized" and now != SECOND_INSTANCE_ONE_IN - 1:
            return  # a second instance (which fences the first) one draw in four
        fresh = None
        if tx.needs_producer_id(self.state, TID):
            fresh = self.next_producer_id = self.next_producer_id + 1
        self.ask(instance, lambda r: init_request(r, instance, self.now_ms, fresh))

    def can_add(self) -> list[Instance]:
        if self.busy():
            return []
        return [
            i
            for i in self.instances.values()
            if self.idle(i)
            and i.state in ("Ready", "InTransaction")
            and not i.must_bump
            and not i.abortable
            and i.attempt <= MAX_ATTEMPTS
            and i.added != set(PARTITIONS)
        ]

    @precondition(lambda self: bool(self.can_add()))
    @rule(data=st.data())
    def add_partitions_to_txn(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(self.can_add()))
        wanted = data.draw(
            st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=2, unique=True)
        )
        self.ask(
            instance,
            lambda r: AddPartitionsToTxn(
                r, TID, instance.producer_id, instance.epoch, tuple(wanted), self.now_ms
            ),
        )

    def can_end(self) -> list[Instance]:
        """Instances that may end their transaction: those that wrote, or gave up on a write,
        and wait for none (an empty transaction is a stutter of the spec's)."""
        if self.busy():
            return []
        return [
            i
            for i in self.instances.values()
            if self.idle(i)
            and i.state == "InTransaction"
            and not i.pending
            and (i.abortable or any(w.instance == i.name for w in self.in_flight) or self.wrote(i))
        ]

    def wrote(self, instance: Instance) -> bool:
        return any(
            batch[0] == "DATA" and batch[1] == (instance.name, instance.attempt)
            for log in self.partitions.values()
            for batch in log.batches
        )

    @precondition(lambda self: bool(self.can_end()))
    @rule(data=st.data(), abort=one_in(ABORT_ONE_IN))
    def end_txn(self, data: st.DataObject, abort: int) -> None:
        instance = data.draw(st.sampled_from(self.can_end()))
        commit = abort != ABORT_ONE_IN - 1 and not instance.abortable
        self.ask(
            instance,
            lambda r: EndTxn(r, TID, instance.producer_id, instance.epoch, commit, self.now_ms),
        )

    def can_send(self) -> list[Instance]:
        if self.writes >= MAX_WRITES:
            return []
        return [
            i
            for i in self.instances.values()
            if i.state == "InTransaction" and i.added and not i.abortable and self.idle(i)
        ]

    @precondition(lambda self: bool(self.can_send()))
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        instance = data.draw(st.sampled_from(self.can_send()))
        self.send_write(instance, data.draw(st.sampled_from(sorted(instance.added))))

    def send_write(self, instance: Instance, partition: tuple[str, int]) -> Write:
        self.writes += 1
        write = Write(
            self.writes,
            instance.name,
            instance.attempt,
            instance.producer_id,
            instance.epoch,
            partition,
        )
        self.in_flight.append(write)
        instance.pending.add(write.w)
        self.record("Send")
        return write

    def waiting(self) -> list[tuple[Instance, int]]:
        return [(i, w) for i in self.instances.values() for w in sorted(i.pending)]

    @precondition(lambda self: bool(self.waiting()))
    @rule(data=st.data(), now=one_in(GIVE_UP_ONE_IN))
    def give_up(self, data: st.DataObject, now: int) -> None:
        """A produce timeout (one draw in three: the other two, the produce is not late yet)."""
        if now != GIVE_UP_ONE_IN - 1:
            return
        instance, w = data.draw(st.sampled_from(self.waiting()))
        self.give_up_write(instance, w)

    def give_up_write(self, instance: Instance, w: int) -> None:
        instance.pending.discard(w)
        instance.abortable = instance.fate_unknown = True
        self.record("GiveUp")

    # ----------------------------------------------------------- the network and partitions

    def refused(self, write: Write) -> None:
        self.in_flight.remove(write)
        instance = self.instances[write.instance]
        if write.w in instance.pending:
            instance.pending.discard(write.w)
            instance.abortable = True

    def unverified(self) -> list[Write]:
        if not self.verify:
            return []
        return [
            w
            for w in self.in_flight
            if w.guard == tp.NO_GUARD
            and tp.needs_verification(self.partitions[w.partition].of(w.producer_id), w.epoch)
        ]

    def verify_write(self, write: Write) -> None:
        """The partition leaves a guard and asks the coordinator (AddPartitionsToTxn, verify
        only); the write keeps the guard if the coordinator vouches for it, else is refused."""
        log = self.partitions[write.partition]
        guard, self.next_guard = self.next_guard, self.next_guard + 1
        entry = tp.begin_verification(log.of(write.producer_id), write.epoch, guard)
        log.entries[write.producer_id] = entry
        guard = entry.guard  # the one left earlier for this epoch, if no batch cleared it
        self.requests += 1
        verify = AddPartitionsToTxn(
            self.requests,
            TID,
            write.producer_id,
            write.epoch,
            (write.partition,),
            self.now_ms,
            True,
        )
        transition = tx.step(self.state, verify, self.params)
        assert transition.state == self.state, "a verification changes nothing"
        (respond,) = transition.effects
        assert isinstance(respond, Respond) and isinstance(respond.answer, PartitionsAnswer)
        ((_, error),) = respond.answer.errors
        if error is E.NONE:
            self.in_flight[self.in_flight.index(write)] = replace(write, guard=guard)
        else:
            self.refused(write)
        self.record("AddPartitionsToTxnVerify")

    def land(self, write: Write) -> None:
        """The write reaches its partition: refused, or appended."""
        log = self.partitions[write.partition]
        entry = log.of(write.producer_id)
        if tp.check_data(entry, write.epoch, write.guard, self.verify) is not E.NONE:
            self.refused(write)
        else:
            self.in_flight.remove(write)
            self.instances[write.instance].pending.discard(write.w)
            log.entries[write.producer_id] = tp.append_data(entry, write.epoch, len(log.batches))
            log.batches.append(("DATA", (write.instance, write.attempt), write.w, write.epoch))
        self.record("Produce")

    @precondition(lambda self: bool(self.unverified()))
    @rule(data=st.data())
    def add_partitions_to_txn_verify(self, data: st.DataObject) -> None:
        """The partition asks the coordinator before a transaction's first write lands."""
        self.verify_write(data.draw(st.sampled_from(self.unverified())))

    def arriving(self) -> list[Write]:
        """Writes the partition leader may append now: verified, or not in need of it (the
        leader verifies a transaction's first write before it appends it)."""
        unverified = self.unverified()
        return [w for w in self.in_flight if w not in unverified]

    @precondition(lambda self: bool(self.arriving()))
    @rule(data=st.data())
    def produce(self, data: st.DataObject) -> None:
        self.land(data.draw(st.sampled_from(self.arriving())))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), now=one_in(LOSE_ONE_IN))
    def lose(self, data: st.DataObject, now: int) -> None:
        """The network loses a write (one draw in three)."""
        if now == LOSE_ONE_IN - 1:
            self.in_flight.remove(data.draw(st.sampled_from(self.in_flight)))
            self.record("Lose")

    def markers_left(self) -> list[tuple[WriteMarkers, tuple[str, int]]]:
        return [(m, p) for m, ps in self.markers for p in sorted(ps)]

    @precondition(lambda self: bool(self.markers_left()))
    @rule(data=st.data())
    def marker_written(self, data: st.DataObject) -> None:
        markers, partition = data.draw(st.sampled_from(self.markers_left()))
        log = self.partitions[partition]
        entry = log.of(markers.producer_id)
        error = tp.check_marker(entry, markers.producer_epoch, 0)
        assert error is E.NONE, f"MarkersNotStale: {error.name} at {partition}"
        log.entries[markers.producer_id], _ = tp.append_marker(
            entry, markers.producer_epoch, 0, len(log.batches), markers.commit
        )
        result = "COMMIT" if markers.commit else "ABORT"
        log.batches.append((result, markers.producer_epoch, markers.producer_id))
        for pair in self.markers:
            if pair[0] == markers:
                pair[1].discard(partition)
        self.markers = [pair for pair in self.markers if pair[1]]
        self.apply(MarkerWritten(TID, partition, markers.producer_epoch))

    # -------------------------------------------------------------- durability and time

    @precondition(lambda self: bool(self.persists))
    @rule(data=st.data(), fail=st.integers(0, 9))
    def persist(self, data: st.DataObject, fail: int) -> None:
        """The oldest record asked for lands, or fails (one draw in ten): one partition's
        appends become durable in order. A Complete* record with a later record behind it does
        not fail: the shell refuses an append at once, before any later one is asked for."""
        write = data.draw(st.sampled_from(self.persists[:1]))
        self.persists.remove(write)
        entry = self.state.entries.get(TID)
        fence = (
            entry is not None and entry.pending is not None and entry.pending.restore is not None
        )
        completing = (
            entry is not None
            and entry.completing is not None
            and entry.completing.write_id == write.write_id
        )
        if fail == 7 and (self.fail_fences or not fence) and not (completing and self.persists):
            self.apply(TransactionPersistFailed(TID, write.write_id))
        else:
            self.apply(TransactionPersisted(TID, write.write_id))

    def time_out(self, advance: int) -> None:
        """Time passes; an ongoing transaction past its timeout is fenced (FenceOngoing), an id
        idle past its expiration is forgotten (Dead). Drawn by ``any_action`` only: as a rule of
        its own, always enabled, it took most steps where swarm testing left few rules on."""
        self.now_ms += advance
        self.apply(Tick(self.now_ms))

    # Hypothesis runs each example with some rules switched off (swarm testing); a
    # transaction that commits needs eight of them. This rule draws any enabled action (and is
    # the only one that lets time pass), so the examples that keep it reach the whole protocol.
    @rule(data=st.data())
    def any_action(self, data: st.DataObject) -> None:
        actions: dict[str, tuple[bool, dict[str, st.SearchStrategy[object]]]] = {
            "init_producer_id": (bool(self.can_init()), {"now": one_in(SECOND_INSTANCE_ONE_IN)}),
            "add_partitions_to_txn": (bool(self.can_add()), {}),
            "end_txn": (bool(self.can_end()), {"abort": one_in(ABORT_ONE_IN)}),
            "send": (bool(self.can_send()), {}),
            "give_up": (bool(self.waiting()), {"now": one_in(GIVE_UP_ONE_IN)}),
            "add_partitions_to_txn_verify": (bool(self.unverified()), {}),
            "produce": (bool(self.arriving()), {}),
            "lose": (bool(self.in_flight), {"now": one_in(LOSE_ONE_IN)}),
            "marker_written": (bool(self.markers_left()), {}),
            "persist": (bool(self.persists), {"fail": st.integers(0, 9)}),
            "time_out": (True, {"advance": st.sampled_from((300, 1_200, 100))}),
        }
        name = data.draw(st.sampled_from(sorted(n for n, (on, _) in actions.items() if on)))
        arguments = {key: data.draw(strategy) for key, strategy in actions[name][1].items()}
        if name != "time_out":
            arguments["data"] = data
        getattr(self, name)(**arguments)

    # ---------------------------------------------------------------------- invariants

    def landed(self) -> list[tuple[tuple[str, int], int, str]]:
        return [found for log in self.partitions.values() for found in fates(log)]

    @invariant()
    def states_are_kafkas(self) -> None:
        tx.inv_states_are_kafkas(self.state)

    @invariant()
    def pending_is_one_write(self) -> None:
        tx.inv_pending_is_one_write(self.state)

    @invariant()
    def all_or_nothing(self) -> None:
        by_attempt: dict[tuple[str, int], set[str]] = {}
        for attempt, _, fate in self.landed():
            by_attempt.setdefault(attempt, set()).add(fate)
        for attempt, seen in by_attempt.items():
            assert not {"COMMIT", "ABORT"} <= seen, f"AllOrNothing: {attempt} {seen}"

    @invariant()
    def outcome_as_answered(self) -> None:
        answered = {(attempt, result) for attempt, result, _ in self.decisions}
        for attempt, w, fate in self.landed():
            if fate == "COMMIT":
                assert attempt not in self.aborts, f"OutcomeAsAnswered: {attempt} {w}"
                assert (attempt, "ABORT") not in answered, f"OutcomeAsAnswered: {attempt} {w}"
            if fate == "ABORT":
                assert (attempt, "COMMIT") not in answered, f"OutcomeAsAnswered: {attempt} {w}"

    @invariant()
    def no_zombie_commit(self) -> None:
        for attempt, result, zombie in self.decisions:
            assert not (result == "COMMIT" and zombie), f"NoZombieCommit: {attempt}"

    @invariant()
    def no_hanging_transaction(self) -> None:
        entry = self.state.entries.get(TID)
        metadata = entry.metadata if entry is not None else None
        for partition, log in self.partitions.items():
            if not any(e.open for e in log.entries.values()):
                continue
            assert entry is not None and metadata is not None, f"NoHangingTransaction: {partition}"
            ongoing = metadata.state in (S.Ongoing, S.PrepareEpochFence)
            ongoing = ongoing and partition in metadata.partitions
            preparing = metadata.state in tx.PREPARING and partition in entry.pending_markers
            assert ongoing or preparing, f"NoHangingTransaction: {partition} {metadata.state.name}"


TestTransactionMachine = TransactionMachine.TestCase
TestTransactionMachine.settings = settings(TestTransactionMachine.settings, stateful_step_count=80)


# ------------------------------------------- the spec's mutation models, replayed in Python


def _machine(
    params: TransactionParams, verify: bool, kind: type[TransactionMachine] = TransactionMachine
) -> TransactionMachine:
    machine = kind()
    machine.params = params
    machine.verify = verify
    return machine


def _persist_all(machine: TransactionMachine) -> None:
    while machine.persists:
        machine.apply(TransactionPersisted(TID, machine.persists.pop(0).write_id))


def _ask(machine: TransactionMachine, name: str, make: object) -> None:
    machine.ask(machine.instances[name], make)
    _persist_all(machine)


def _write(machine: TransactionMachine, name: str, partition: tuple[str, int]) -> Write:
    return machine.send_write(machine.instances[name], partition)


def _land(machine: TransactionMachine, write: Write) -> None:
    """Verify (if the partition needs it) and append, as the partition leader does."""
    if machine.verify and tp.needs_verification(
        machine.partitions[write.partition].of(write.producer_id), write.epoch
    ):
        machine.verify_write(write)
        write = next((w for w in machine.in_flight if w.w == write.w), write)
        if write not in machine.in_flight:
            return
    machine.land(write)


def _markers(machine: TransactionMachine) -> None:
    while machine.markers:
        markers, left = machine.markers[0]
        partition = sorted(left)[0]
        log = machine.partitions[partition]
        log.entries[markers.producer_id], _ = tp.append_marker(
            log.of(markers.producer_id), markers.producer_epoch, 0, len(log.batches), markers.commit
        )
        log.batches.append(("COMMIT" if markers.commit else "ABORT", markers.producer_epoch, 0))
        left.discard(partition)
        if not left:
            machine.markers.pop(0)
        machine.apply(MarkerWritten(TID, partition, markers.producer_epoch))
        _persist_all(machine)


def _init(machine: TransactionMachine, name: str) -> None:
    instance = machine.instances[name]
    fresh = 7 if tx.needs_producer_id(machine.state, TID) else None
    _ask(machine, name, lambda r: init_request(r, instance, machine.now_ms, fresh))


def _add(machine: TransactionMachine, name: str, partition: tuple[str, int]) -> None:
    i = machine.instances[name]
    _ask(
        machine,
        name,
        lambda r: AddPartitionsToTxn(r, TID, i.producer_id, i.epoch, (partition,), machine.now_ms),
    )


def _end(machine: TransactionMachine, name: str, commit: bool) -> None:
    i = machine.instances[name]
    _ask(machine, name, lambda r: EndTxn(r, TID, i.producer_id, i.epoch, commit, machine.now_ms))


def _zombie_run(
    params: TransactionParams, kind: type[TransactionMachine] = TransactionMachine
) -> TransactionMachine:
    """MCTransactionNoFenceBump's trace: i1's transaction times out and the coordinator aborts
    it; i1, not told, adds another partition, writes and commits."""
    machine = _machine(params, verify=True, kind=kind)
    a, b = PARTITIONS
    _init(machine, "i1")
    _add(machine, "i1", a)
    _land(machine, _write(machine, "i1", a))
    machine.now_ms += TIMEOUT_MS + 1
    machine.apply(Tick(machine.now_ms))
    _persist_all(machine)
    _markers(machine)
    _add(machine, "i1", b)
    if machine.instances["i1"].state == "InTransaction":
        _land(machine, _write(machine, "i1", b))
        _end(machine, "i1", commit=True)
        _markers(machine)
    return machine


def test_without_the_fence_bump_a_zombie_commits() -> None:
    machine = _zombie_run(TransactionParams(expiration_ms=5_000, bump_on_fence=False))
    with pytest.raises(AssertionError, match="NoZombieCommit"):
        machine.no_zombie_commit()
    with pytest.raises(AssertionError, match="AllOrNothing"):
        machine.all_or_nothing()


def test_with_the_fence_bump_the_zombie_is_fenced() -> None:
    machine = _zombie_run(TransactionParams(expiration_ms=5_000))
    assert machine.instances["i1"].state == "FatalError"
    machine.no_zombie_commit()
    machine.all_or_nothing()
    assert [fate for _, _, fate in machine.landed()] == ["ABORT"]


def _late_write_run(
    verify: bool, kind: type[TransactionMachine] = TransactionMachine
) -> TransactionMachine:
    """MCTransactionNoVerify's trace: i1 gives up on a write, aborts, bumps its epoch; the
    write lands after the abort marker."""
    machine = _machine(TransactionParams(), verify=verify, kind=kind)
    a, _ = PARTITIONS
    _init(machine, "i1")
    _add(machine, "i1", a)
    late = _write(machine, "i1", a)
    machine.give_up_write(machine.instances["i1"], late.w)
    _end(machine, "i1", commit=False)
    _markers(machine)
    _init(machine, "i1")  # KIP-360: the bump
    _land(machine, late)
    return machine


def test_without_verification_a_late_write_hangs_a_transaction() -> None:
    machine = _late_write_run(verify=False)
    with pytest.raises(AssertionError, match="NoHangingTransaction"):
        machine.no_hanging_transaction()


def test_with_verification_the_late_write_is_refused() -> None:
    machine = _late_write_run(verify=True)
    machine.no_hanging_transaction()
    assert machine.in_flight == []
    assert machine.partitions[PARTITIONS[0]].batches == [("ABORT", 0, 0)]
