"""The transaction coordinator: Kafka's TransactionMetadata of every transactional id, as a
pure machine. Spec: ``specs/Transaction.tla``; properties:
``tests/properties/test_transaction.py::TransactionMachine``; the partition's side of a
transaction (its producer epoch, open transaction, verification guard, markers) is
:mod:`automq_ref.state_machines.transaction_partition`.

``step(state, event, params) -> Transition(state, effects)``. Every decision is a record of the
transaction log, and a request is answered only once its record is durable, as Kafka's
coordinator does (``prepareTransitionTo`` / ``completeTransitionTo``): a handler that changes a
transactional id's metadata leaves the change *pending* and emits ``PersistTransaction``; the
shell appends the record and steps ``TransactionPersisted`` (the change takes effect, the
request is answered) or ``TransactionPersistFailed`` (it is dropped, the request answered with
the error). While a change is pending, every other request of that id is answered
``CONCURRENT_TRANSACTIONS``, as Kafka answers a pending transition.

The states, with Kafka's ids (DescribeTransactions names them so):

- ``Empty`` after InitProducerId, ``Ongoing`` once a partition is added, ``PrepareCommit`` /
  ``PrepareAbort`` once EndTxn's decision is durable (the request is answered then, before the
  markers), ``CompleteCommit`` / ``CompleteAbort`` once every partition has its marker.
- ``PrepareEpochFence``: the coordinator aborts an ongoing transaction on its own, because it
  ran past its timeout (``Tick``) or because an InitProducerId of the same id came (a new
  producer instance fences the old one). The epoch is bumped at once, so the old instance's
  requests are fenced, and the abort's ``PrepareAbort`` record is what is written. The spec's
  ``FenceOngoing`` and ``AbortFenced`` are the step that fences and the persist that follows.
- ``Dead``: an id left Empty or Complete* for ``transactional_id_expiration_ms`` is expired: its
  tombstone is written, then the id is forgotten.

Epochs: InitProducerId bumps the epoch by one (a new id starts at 0); at 32766 (Kafka's
exhaustion bound) a new producer id is taken at epoch 0, which the shell supplies with the
request (:func:`needs_producer_id`). InitProducerId with the instance's own producer id and
epoch (KIP-360, sent after an abort whose writes' fate the producer does not know) bumps it
too, and a retry of one that already bumped it (``last_producer_epoch``) gets the same answer.
EndTxn (v4 and lower, what the clients served here send) keeps the epoch; the coordinator's own
abort bumps it (``TransactionParams.bump_on_fence``, False only in the mutation the property
test runs to see the zombie commit the spec's ``NoFenceBump`` model shows).

Markers: a durable Prepare* emits ``WriteMarkers`` (every partition of the transaction, the
producer id and epoch, the result); the shell writes a control batch to each partition and
steps ``MarkerWritten`` for each; when none is left the transaction is complete. A
transaction with no partition completes at once.

Completion does not wait for its record. Once every marker is durable the outcome is settled
(the Prepare* record is durable, and so are the markers), so the Complete* metadata takes effect
at once and the next request of the id is decided on it while the Complete* record is still on
its way (``Entry.completing``), as Kafka lets a producer's next transaction begin once its
markers are written. Nothing a client hears depends on that record: a later record of the id
(the next transaction's Ongoing, an InitProducerId's bump, a tombstone) is appended behind it to
the same partition and answered only once it is durable itself, and it carries the id's whole
metadata, so a log that lost the Complete* record but kept a later one loads the later one; a
log whose last record of the id is the Prepare* loads it and writes the markers again (which
the partitions take as the same outcome). The shell reports the outcomes of one id's records
in the order it was asked for them (one partition's appends become durable in order).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.transaction_partition import tla_partition
from automq_ref.state_machines.transition import InvariantViolation, Rejected, Transition

PartitionKey: TypeAlias = tuple[str, int]  # (topic name, partition index)
NO_PRODUCER_ID: Final = -1
NO_EPOCH: Final = -1
NO_TIMESTAMP: Final = -1
# Kafka's ProducerIdAndEpoch bound: from this epoch on a new producer id is taken (32767 is
# kept for the coordinator's own fencing).
EXHAUSTED_EPOCH: Final = 32766
TRANSACTION_MAX_TIMEOUT_MS: Final = 900_000  # transaction.max.timeout.ms
TRANSACTIONAL_ID_EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState, with its ids (the transaction log's TransactionStatus)."""

    Empty = 0
    Ongoing = 1
    PrepareCommit = 2
    PrepareAbort = 3
    CompleteCommit = 4
    CompleteAbort = 5
    Dead = 6
    PrepareEpochFence = 7


S = TransactionState
PREPARING: Final = frozenset({S.PrepareCommit, S.PrepareAbort})
COMPLETED: Final = frozenset({S.CompleteCommit, S.CompleteAbort})
# Kafka's valid previous states of each state (TransactionState, 3.x: PrepareAbort only after
# Ongoing or PrepareEpochFence, as clients of EndTxn v4 and lower need).
VALID_PREVIOUS: Final[Mapping[TransactionState, frozenset[TransactionState]]] = {
    S.Empty: frozenset({S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.Ongoing: frozenset({S.Ongoing, S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.PrepareCommit: frozenset({S.Ongoing}),
    S.PrepareAbort: frozenset({S.Ongoing, S.PrepareEpochFence}),
    S.CompleteCommit: frozenset({S.PrepareCommit}),
    S.CompleteAbort: frozenset({S.PrepareAbort}),
    S.Dead: frozenset({S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.PrepareEpochFence: frozenset({S.Ongoing}),
}


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """One transactional id's metadata, as its transaction log record holds it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TransactionState = S.Empty
    partitions: frozenset[PartitionKey] = frozenset()
    last_producer_epoch: int = NO_EPOCH  # the epoch before the last bump (KIP-360 retries)
    start_ms: int = NO_TIMESTAMP  # when the ongoing transaction began
    last_update_ms: int = NO_TIMESTAMP


@dataclass(frozen=True, slots=True)
class Pending:
    """A change waiting for its record to be durable: ``target`` takes effect and ``answer``
    (if any) is sent when it is; if the write fails, the answer carries the error instead."""

    write_id: int
    target: TransactionMetadata
    answer: Respond | None = None
    restore: TransactionMetadata | None = None  # a fence's: the metadata before it


@dataclass(frozen=True, slots=True)
class Entry:
    """A transactional id in the coordinator: its durable metadata (None until the first
    record of a new id is durable), the change pending on it, the markers still to write."""

    metadata: TransactionMetadata | None
    pending: Pending | None = None
    pending_markers: frozenset[PartitionKey] = frozenset()
    completing: Completing | None = None


@dataclass(frozen=True, slots=True)
class Completing:
    """The Complete* record of an id on its way to the log: its metadata has taken effect (the
    markers are all durable), requests are decided on it, and a later record of the id waits
    behind it in the partition. ``prepared``: the Prepare* metadata it completes, what the
    log's last durable record of the id says until this one is (``tla_state``)."""

    write_id: int
    prepared: TransactionMetadata


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    entries: Mapping[str, Entry] = field(default_factory=dict)
    now_ms: int = 0
    next_write_id: int = 1


@dataclass(frozen=True, slots=True)
class TransactionParams:
    max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS
    expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS
    bump_on_fence: bool = True  # False: the spec's NoFenceBump mutation, for tests only


# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class InitProducerId:
    """InitProducerId with a transactional id. ``producer_id``/``producer_epoch`` are the
    instance's own (KIP-360) or -1; ``fresh_producer_id`` is an id the shell allocated for
    the case :func:`needs_producer_id` says needs one."""

    request_id: int
    transactional_id: str
    timeout_ms: int
    now_ms: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH
    fresh_producer_id: int | None = None


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxn:
    """AddPartitionsToTxn (and AddOffsetsToTxn, whose partition is the group's offsets
    partition). ``verify_only``: the v4+ form a partition leader sends before the first write
    of a transaction lands: nothing is added, each partition is answered NONE if it is in the
    ongoing transaction, TRANSACTION_ABORTABLE if not."""

    request_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[PartitionKey, ...]
    now_ms: int
    verify_only: bool = False


@dataclass(frozen=True, slots=True)
class EndTxn:
    request_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class TransactionPersisted:
    transactional_id: str
    write_id: int


@dataclass(frozen=True, slots=True)
class TransactionPersistFailed:
    transactional_id: str
    write_id: int
    error: KafkaErrorCode = KafkaErrorCode.COORDINATOR_NOT_AVAILABLE


@dataclass(frozen=True, slots=True)
class MarkerWritten:
    """The marker of the transaction ``transactional_id`` prepared at ``producer_epoch`` is
    durable in ``partition``."""

    transactional_id: str
    partition: PartitionKey
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: transactions past their timeout are aborted, idle ids expired."""

    now_ms: int


TransactionEvent: TypeAlias = (
    InitProducerId
    | AddPartitionsToTxn
    | EndTxn
    | TransactionPersisted
    | TransactionPersistFailed
    | MarkerWritten
    | Tick
)

# ----------------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class InitProducerIdAnswer:
    error: KafkaErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class PartitionsAnswer:
    """AddPartitionsToTxn's answer: an error per partition."""

    errors: tuple[tuple[PartitionKey, KafkaErrorCode], ...]


@dataclass(frozen=True, slots=True)
class EndTxnAnswer:
    error: KafkaErrorCode


Answer: TypeAlias = InitProducerIdAnswer | PartitionsAnswer | EndTxnAnswer


@dataclass(frozen=True, slots=True)
class Respond:
    request_id: int
    answer: Answer


@dataclass(frozen=True, slots=True)
class PersistTransaction:
    """Append ``record`` (None: the id's tombstone) to the transaction log, then step
    ``TransactionPersisted`` or ``TransactionPersistFailed`` with ``write_id``."""

    write_id: int
    transactional_id: str
    record: TransactionMetadata | None


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    """Write a COMMIT (``commit``) or ABORT marker of the producer to each partition, then step
    ``MarkerWritten`` for each."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[PartitionKey]


TransactionEffect: TypeAlias = (
    Respond | PersistTransaction | WriteMarkers | Rejected[KafkaErrorCode]
)
TransactionTransition: TypeAlias = Transition[CoordinatorState, TransactionEffect]

# ------------------------------------------------------------------------------------ queries


def writing_markers(
    state: CoordinatorState, transactional_id: str, producer_id: int, producer_epoch: int
) -> bool:
    """Whether the id's transaction of this producer (id and epoch) is writing its markers: its
    next AddPartitionsToTxn is ``CONCURRENT_TRANSACTIONS`` until the last one is written, when
    the transaction completes and the next one may begin."""
    entry = state.entries.get(transactional_id)
    metadata = entry.metadata if entry is not None else None
    return (
        metadata is not None
        and metadata.state in PREPARING
        and (metadata.producer_id, metadata.producer_epoch) == (producer_id, producer_epoch)
    )


def needs_producer_id(state: CoordinatorState, transactional_id: str) -> bool:
    """Whether an InitProducerId of ``transactional_id`` may take a new producer id: the id is
    new, or its epoch is exhausted."""
    entry = state.entries.get(transactional_id)
    if entry is None or entry.metadata is None:
        return True
    return entry.metadata.producer_epoch >= EXHAUSTED_EPOCH


def describe(state: CoordinatorState, transactional_id: str) -> TransactionMetadata | None:
    """The durable metadata of an id (None: unknown, or expired)."""
    entry = state.entries.get(transactional_id)
    if entry is None or entry.metadata is None:  # Dead: forgotten once its tombstone lands
        return None
    return entry.metadata


def listed(state: CoordinatorState) -> tuple[TransactionMetadata, ...]:
    """Every id's durable metadata, by id, Dead ones left out (ListTransactions)."""
    found = (describe(state, tid) for tid in sorted(state.entries))
    return tuple(metadata for metadata in found if metadata is not None)


# --------------------------------------------------------------------------------------- step


def step(
    state: CoordinatorState, event: TransactionEvent, params: TransactionParams
) -> TransactionTransition:
    """One event; time never runs backwards (a late-stamped request happens now)."""
    if isinstance(event, InitProducerId | AddPartitionsToTxn | EndTxn | Tick):
        state = replace(state, now_ms=max(state.now_ms, event.now_ms))
    if isinstance(event, InitProducerId):
        return _on_init_producer_id(state, event, params)
    if isinstance(event, AddPartitionsToTxn):
        return _on_add_partitions_to_txn(state, event)
    if isinstance(event, EndTxn):
        return _on_end_txn(state, event)
    if isinstance(event, TransactionPersisted):
        return _on_transaction_persisted(state, event)
    if isinstance(event, TransactionPersistFailed):
        return _on_transaction_persist_failed(state, event)
    if isinstance(event, MarkerWritten):
        return _on_marker_written(state, event)
    return _on_tick(state, event, params)


def _answer(request_id: int, answer: Answer) -> Respond:
    return Respond(request_id, answer)


def _with(state: CoordinatorState, transactional_id: str, entry: Entry | None) -> CoordinatorState:
    entries = dict(state.entries)
    if entry is None:
        entries.pop(transactional_id, None)
    else:
        entries[transactional_id] = entry
    return replace(state, entries=entries)


def _persist(
    state: CoordinatorState,
    entry: Entry,
    target: TransactionMetadata,
    answer: Respond | None,
    *before: TransactionEffect,
    restore: TransactionMetadata | None = None,
) -> TransactionTransition:
    """Leave ``target`` pending on ``entry`` and ask for its record (a tombstone for Dead)."""
    write_id = state.next_write_id
    pending = Pending(write_id, replace(target, last_update_ms=state.now_ms), answer, restore)
    state = replace(state, next_write_id=write_id + 1)
    state = _with(state, target.transactional_id, replace(entry, pending=pending))
    record = None if target.state is S.Dead else pending.target
    return Transition(
        state, (*before, PersistTransaction(write_id, target.transactional_id, record))
    )


def _transit(
    metadata: TransactionMetadata, target: TransactionState, **changes: object
) -> TransactionMetadata:
    if metadata.state not in VALID_PREVIOUS[target]:
        raise InvariantViolation(
            f"{metadata.transactional_id}: {metadata.state.name} -> {target.name}"
        )
    return replace(metadata, state=target, **changes)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- InitProducerId


def _on_init_producer_id(
    state: CoordinatorState, event: InitProducerId, params: TransactionParams
) -> TransactionTransition:
    def answer(error: KafkaErrorCode, pid: int = NO_PRODUCER_ID, epoch: int = NO_EPOCH) -> Respond:
        return _answer(event.request_id, InitProducerIdAnswer(error, pid, epoch))

    if not event.transactional_id:
        return Transition(state, (answer(KafkaErrorCode.INVALID_REQUEST),))
    if not 0 < event.timeout_ms <= params.max_timeout_ms:
        return Transition(state, (answer(KafkaErrorCode.INVALID_TRANSACTION_TIMEOUT),))
    if (event.producer_id == NO_PRODUCER_ID) != (event.producer_epoch == NO_EPOCH):
        return Transition(state, (answer(KafkaErrorCode.INVALID_REQUEST),))
    entry = state.entries.get(event.transactional_id)
    if entry is None:
        if event.fresh_producer_id is None:
            return _contract(state, "InitProducerId of a new id without a fresh producer id")
        # A new id: Empty at epoch -1 until its first record (epoch 0) is durable.
        entry = Entry(None)
        new = TransactionMetadata(
            event.transactional_id, event.fresh_producer_id, NO_EPOCH, event.timeout_ms
        )
    elif entry.pending is not None or entry.metadata is None:
        return Transition(state, (answer(KafkaErrorCode.CONCURRENT_TRANSACTIONS),))
    else:
        new = entry.metadata
    metadata = new
    expected = event.producer_id != NO_PRODUCER_ID
    if (
        expected
        and metadata.producer_epoch != NO_EPOCH
        and event.producer_id != metadata.producer_id
    ):
        return Transition(state, (answer(KafkaErrorCode.PRODUCER_FENCED),))
    if metadata.state in PREPARING or metadata.state is S.PrepareEpochFence:
        return Transition(state, (answer(KafkaErrorCode.CONCURRENT_TRANSACTIONS),))
    if metadata.state is S.Ongoing:
        # A new instance: fence the one whose transaction this is, abort it; the new one asks
        # again once the abort completes.
        fenced = _fence(state, entry, metadata, params)
        return Transition(
            fenced.state, (answer(KafkaErrorCode.CONCURRENT_TRANSACTIONS), *fenced.effects)
        )
    # Empty, CompleteCommit, CompleteAbort: a new epoch.
    current = metadata.producer_epoch
    if (
        expected
        and current != NO_EPOCH
        and event.producer_epoch not in (current, metadata.last_producer_epoch)
    ):
        return Transition(state, (answer(KafkaErrorCode.PRODUCER_FENCED),))
    if expected and event.producer_epoch == metadata.last_producer_epoch and current != NO_EPOCH:
        # A retry of an InitProducerId that bumped already: the same answer.
        return Transition(state, (answer(KafkaErrorCode.NONE, metadata.producer_id, current),))
    if current + 1 >= EXHAUSTED_EPOCH:
        if event.fresh_producer_id is None:
            return _contract(
                state, "InitProducerId past the exhausted epoch without a fresh producer id"
            )
        producer_id, epoch, last = (
            event.fresh_producer_id,
            0,
            (event.producer_epoch if expected else NO_EPOCH),
        )
    else:
        producer_id, epoch, last = (
            metadata.producer_id,
            current + 1,
            (current if expected else NO_EPOCH),
        )
    target = _transit(
        metadata,
        S.Empty,
        producer_id=producer_id,
        producer_epoch=epoch,
        last_producer_epoch=last,
        timeout_ms=event.timeout_ms,
        partitions=frozenset(),
        start_ms=NO_TIMESTAMP,
    )
    return _persist(state, entry, target, answer(KafkaErrorCode.NONE, producer_id, epoch))


def _fence(
    state: CoordinatorState, entry: Entry, metadata: TransactionMetadata, params: TransactionParams
) -> TransactionTransition:
    """The coordinator's own abort of an ongoing transaction (the spec's FenceOngoing): the
    epoch bumped now, the PrepareAbort record written; AbortFenced is its persist."""
    epoch = metadata.producer_epoch + 1 if params.bump_on_fence else metadata.producer_epoch
    fencing = _transit(
        metadata, S.PrepareEpochFence, producer_epoch=epoch, last_producer_epoch=NO_EPOCH
    )
    target = _transit(fencing, S.PrepareAbort)
    return _persist(state, replace(entry, metadata=fencing), target, None, restore=metadata)


# -------------------------------------------------------------------------- AddPartitionsToTxn


def _identity_error(
    entry: Entry | None, transactional_id: str, producer_id: int, producer_epoch: int
) -> KafkaErrorCode | None:
    """The error of a request whose id, producer id or epoch is not the id's: INVALID_REQUEST,
    INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED; None when they are."""
    metadata = entry.metadata if entry is not None else None
    if not transactional_id:
        return KafkaErrorCode.INVALID_REQUEST
    if metadata is None or producer_id != metadata.producer_id:
        return KafkaErrorCode.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != metadata.producer_epoch:
        return KafkaErrorCode.PRODUCER_FENCED
    return None


def _on_add_partitions_to_txn(
    state: CoordinatorState, event: AddPartitionsToTxn
) -> TransactionTransition:
    def every(error: KafkaErrorCode) -> TransactionTransition:
        errors = tuple((partition, error) for partition in event.partitions)
        return Transition(state, (_answer(event.request_id, PartitionsAnswer(errors)),))

    entry = state.entries.get(event.transactional_id)
    identity = _identity_error(
        entry, event.transactional_id, event.producer_id, event.producer_epoch
    )
    if identity is not None:
        return every(identity)
    assert entry is not None and entry.metadata is not None
    metadata = entry.metadata
    if event.verify_only:
        if metadata.state in PREPARING or metadata.state is S.PrepareEpochFence:
            return every(KafkaErrorCode.CONCURRENT_TRANSACTIONS)
        # Kafka does not look at a pending change here: the durable set is what was promised.
        ongoing = metadata.state is S.Ongoing
        errors = tuple(
            (
                p,
                KafkaErrorCode.NONE
                if ongoing and p in metadata.partitions
                else KafkaErrorCode.TRANSACTION_ABORTABLE,
            )
            for p in event.partitions
        )
        return Transition(state, (_answer(event.request_id, PartitionsAnswer(errors)),))
    if (
        entry.pending is not None
        or metadata.state in PREPARING
        or metadata.state is S.PrepareEpochFence
    ):
        return every(KafkaErrorCode.CONCURRENT_TRANSACTIONS)
    added = frozenset(event.partitions)
    if metadata.state is S.Ongoing and added <= metadata.partitions:
        return every(KafkaErrorCode.NONE)
    ongoing = metadata.state is S.Ongoing
    target = _transit(
        metadata,
        S.Ongoing,
        partitions=(metadata.partitions | added) if ongoing else added,
        start_ms=metadata.start_ms if ongoing else state.now_ms,
    )
    errors = tuple((partition, KafkaErrorCode.NONE) for partition in event.partitions)
    return _persist(state, entry, target, _answer(event.request_id, PartitionsAnswer(errors)))


# ------------------------------------------------------------------------------------- EndTxn


def _on_end_txn(state: CoordinatorState, event: EndTxn) -> TransactionTransition:
    def answer(error: KafkaErrorCode) -> TransactionTransition:
        return Transition(state, (_answer(event.request_id, EndTxnAnswer(error)),))

    entry = state.entries.get(event.transactional_id)
    identity = _identity_error(
        entry, event.transactional_id, event.producer_id, event.producer_epoch
    )
    if identity is not None:
        return answer(identity)
    assert entry is not None and entry.metadata is not None
    metadata = entry.metadata
    if entry.pending is not None:
        return answer(KafkaErrorCode.CONCURRENT_TRANSACTIONS)
    commit = event.commit
    match metadata.state:
        case S.Ongoing:
            target = _transit(metadata, S.PrepareCommit if commit else S.PrepareAbort)
            return _persist(
                state, entry, target, _answer(event.request_id, EndTxnAnswer(KafkaErrorCode.NONE))
            )
        case S.CompleteCommit | S.CompleteAbort:
            retry = (metadata.state is S.CompleteCommit) == commit
            return answer(KafkaErrorCode.NONE if retry else KafkaErrorCode.INVALID_TXN_STATE)
        case S.PrepareCommit | S.PrepareAbort:
            same = (metadata.state is S.PrepareCommit) == commit
            return answer(
                KafkaErrorCode.CONCURRENT_TRANSACTIONS if same else KafkaErrorCode.INVALID_TXN_STATE
            )
        case S.Empty:
            return answer(KafkaErrorCode.INVALID_TXN_STATE)
        case _:  # PrepareEpochFence and Dead stand only while their record is pending
            raise InvariantViolation(f"{event.transactional_id}: {metadata.state.name} at rest")


# --------------------------------------------------------------------------- persist outcomes


def _on_transaction_persisted(
    state: CoordinatorState, event: TransactionPersisted
) -> TransactionTransition:
    entry = state.entries.get(event.transactional_id)
    if entry is not None and _completing(entry, event.write_id):
        return Transition(_with(state, event.transactional_id, replace(entry, completing=None)))
    if entry is None or entry.pending is None or entry.pending.write_id != event.write_id:
        return _contract(state, f"{event.transactional_id}: no pending write {event.write_id}")
    pending = entry.pending
    target = pending.target
    answered = () if pending.answer is None else (pending.answer,)
    if target.state is S.Dead:
        return Transition(_with(state, event.transactional_id, None), answered)
    entry = Entry(target, completing=entry.completing)
    if target.state in PREPARING:
        if not target.partitions:
            return _complete(state, entry, target, answered)
        entry = replace(entry, pending_markers=target.partitions)
        return Transition(
            _with(state, event.transactional_id, entry), (*answered, _markers(target))
        )
    return Transition(_with(state, event.transactional_id, entry), answered)


def _complete(
    state: CoordinatorState,
    entry: Entry,
    metadata: TransactionMetadata,
    before: tuple[TransactionEffect, ...] = (),
) -> TransactionTransition:
    """Every marker written: the transaction is complete now, its Complete* record on its way
    (the spec's CompleteTransaction once that record is durable; ``Completing``)."""
    done = S.CompleteCommit if metadata.state is S.PrepareCommit else S.CompleteAbort
    target = _transit(
        metadata,
        done,
        partitions=frozenset(),
        start_ms=NO_TIMESTAMP,
        last_update_ms=state.now_ms,
    )
    return _log_complete(state, replace(entry, metadata=target), metadata, before)


def _log_complete(
    state: CoordinatorState,
    entry: Entry,
    prepared: TransactionMetadata,
    before: tuple[TransactionEffect, ...] = (),
) -> TransactionTransition:
    """Append the Complete* record of ``entry``'s metadata, completing ``prepared``."""
    write_id = state.next_write_id
    state = replace(state, next_write_id=write_id + 1)
    tid = prepared.transactional_id
    state = _with(state, tid, replace(entry, completing=Completing(write_id, prepared)))
    return Transition(state, (*before, PersistTransaction(write_id, tid, entry.metadata)))


def _completing(entry: Entry, write_id: int) -> bool:
    return entry.completing is not None and entry.completing.write_id == write_id


def _on_transaction_persist_failed(
    state: CoordinatorState, event: TransactionPersistFailed
) -> TransactionTransition:
    entry = state.entries.get(event.transactional_id)
    if entry is not None and entry.completing is not None and _completing(entry, event.write_id):
        prepared = entry.completing.prepared
        entry = replace(entry, completing=None)
        if entry.pending is None:
            # The Complete* record did not land: ask again (Kafka retries it too).
            return _log_complete(state, entry, prepared)
        # A later record of the id is on its way behind it and carries the whole metadata.
        return Transition(_with(state, event.transactional_id, entry))
    if entry is None or entry.pending is None or entry.pending.write_id != event.write_id:
        return _contract(state, f"{event.transactional_id}: no pending write {event.write_id}")
    pending = entry.pending
    metadata = entry.metadata
    if metadata is None:  # a new id whose first record did not land: forgotten
        state = _with(state, event.transactional_id, None)
    elif pending.restore is not None:
        # The fence's abort did not land: nothing durable changed, the transaction goes on at
        # its epoch (nobody was answered the bumped one) and the next Tick fences it again.
        state = _with(
            state,
            event.transactional_id,
            Entry(pending.restore, completing=entry.completing),
        )
    else:
        state = _with(state, event.transactional_id, replace(entry, pending=None))
    answered = () if pending.answer is None else (_failed(pending.answer, event.error),)
    return Transition(state, answered)


def _failed(answer: Respond, error: KafkaErrorCode) -> Respond:
    match answer.answer:
        case InitProducerIdAnswer():
            return Respond(answer.request_id, InitProducerIdAnswer(error))
        case PartitionsAnswer(errors):
            return Respond(
                answer.request_id, PartitionsAnswer(tuple((p, error) for p, _ in errors))
            )
        case _:
            return Respond(answer.request_id, EndTxnAnswer(error))


# ---------------------------------------------------------------------------------- markers


def _markers(metadata: TransactionMetadata) -> WriteMarkers:
    """The markers of a transaction being prepared, one per partition of it."""
    return WriteMarkers(
        metadata.transactional_id,
        metadata.producer_id,
        metadata.producer_epoch,
        metadata.state is S.PrepareCommit,
        metadata.partitions,
    )


def _on_marker_written(state: CoordinatorState, event: MarkerWritten) -> TransactionTransition:
    entry = state.entries.get(event.transactional_id)
    metadata = entry.metadata if entry is not None else None
    if entry is None or metadata is None or metadata.state not in PREPARING:
        return Transition(state)  # a marker of a transaction completed already: nothing to do
    if (
        event.producer_epoch != metadata.producer_epoch
        or event.partition not in entry.pending_markers
    ):
        return Transition(state)
    entry = replace(entry, pending_markers=entry.pending_markers - {event.partition})
    if entry.pending_markers or entry.pending is not None:
        return Transition(_with(state, event.transactional_id, entry))
    return _complete(state, entry, metadata)


# ------------------------------------------------------------------------------------- time


def _on_tick(
    state: CoordinatorState, event: Tick, params: TransactionParams
) -> TransactionTransition:
    effects: list[TransactionEffect] = []
    for transactional_id in sorted(state.entries):
        entry = state.entries[transactional_id]
        metadata = entry.metadata
        if metadata is None or entry.pending is not None:
            continue
        if metadata.state is S.Ongoing and metadata.start_ms + metadata.timeout_ms < state.now_ms:
            done = _fence(state, entry, metadata, params)
        elif metadata.state in VALID_PREVIOUS[S.Dead] and (
            metadata.last_update_ms + params.expiration_ms <= state.now_ms
        ):
            done = _persist(state, entry, _transit(metadata, S.Dead), None)
        else:
            continue
        state = done.state
        effects += done.effects
    return Transition(state, tuple(effects))


def _contract(state: CoordinatorState, message: str) -> TransactionTransition:
    return Transition(state, (Rejected(KafkaErrorCode.INVALID_REQUEST, message),))


# ------------------------------------------------------------------------------- recovery


def recover(
    records: Iterable[tuple[str, TransactionMetadata | None]], now_ms: int
) -> TransactionTransition:
    """The coordinator's state from its transaction log (the latest record of each id wins, a
    tombstone deletes it), and the markers of every transaction left preparing, to write again."""
    latest: dict[str, TransactionMetadata | None] = {}
    for transactional_id, record in records:
        latest[transactional_id] = record
    entries: dict[str, Entry] = {}
    effects: list[TransactionEffect] = []
    for transactional_id, record in sorted(latest.items()):
        if record is None:
            continue
        entry = Entry(record)
        if record.state in PREPARING:
            entry = replace(entry, pending_markers=record.partitions)
            effects.append(_markers(record))
        entries[transactional_id] = entry
    return Transition(CoordinatorState(entries, now_ms), tuple(effects))


# ------------------------------------------------------------------------------ invariants


def inv_states_are_kafkas(state: CoordinatorState) -> None:
    """Every id's state is one of Kafka's, reached from a valid previous state (``_transit``
    checks each change), with the fields its state allows: partitions only while a
    transaction is open or preparing, markers pending only while preparing and only for its
    partitions, epochs in range."""
    for transactional_id, entry in state.entries.items():
        metadata = entry.metadata
        if metadata is None:
            if entry.pending is None:
                raise InvariantViolation(
                    f"{transactional_id}: neither metadata nor a pending record"
                )
            continue
        if metadata.state in COMPLETED | {S.Empty} and metadata.partitions:
            raise InvariantViolation(f"{transactional_id}: {metadata.state.name} with partitions")
        if entry.pending_markers and (
            metadata.state not in PREPARING or not entry.pending_markers <= metadata.partitions
        ):
            raise InvariantViolation(f"{transactional_id}: markers pending outside a prepare")
        if not NO_EPOCH <= metadata.producer_epoch <= EXHAUSTED_EPOCH + 1:
            raise InvariantViolation(f"{transactional_id}: epoch {metadata.producer_epoch}")


def inv_pending_is_one_write(state: CoordinatorState) -> None:
    """At most one change is pending per id, its write id is below the next one, and it is a
    valid transition of the id's state. A Complete* record on its way is the id's latest
    durable-to-be state until its outcome (which comes before any later record's): the id is
    Complete* meanwhile, completing a Prepare* of the same producer, and a pending change was
    asked for after it."""
    for transactional_id, entry in state.entries.items():
        completing = entry.completing
        if completing is not None:
            metadata = entry.metadata
            if completing.write_id >= state.next_write_id:
                raise InvariantViolation(
                    f"{transactional_id}: write id {completing.write_id} ahead"
                )
            if (
                metadata is None
                or metadata.state not in COMPLETED
                or completing.prepared.state not in VALID_PREVIOUS[metadata.state]
                or (completing.prepared.producer_id, completing.prepared.producer_epoch)
                != (metadata.producer_id, metadata.producer_epoch)
            ):
                raise InvariantViolation(f"{transactional_id}: completing outside a completion")
            if entry.pending is not None and entry.pending.write_id <= completing.write_id:
                raise InvariantViolation(f"{transactional_id}: a change pending before completion")
        if entry.pending is None:
            continue
        if entry.pending.write_id >= state.next_write_id:
            raise InvariantViolation(f"{transactional_id}: write id {entry.pending.write_id} ahead")
        metadata = entry.metadata
        if (
            metadata is not None
            and metadata.state not in VALID_PREVIOUS[entry.pending.target.state]
        ):
            raise InvariantViolation(
                f"{transactional_id}: {metadata.state.name} -> {entry.pending.target.state.name}"
            )


INVARIANTS = (inv_states_are_kafkas, inv_pending_is_one_write)


# ------------------------------------------------------------------------- trace validation


def _tla_partitions(partitions: Iterable[PartitionKey]) -> dict[str, object]:
    return {"set": sorted(tla_partition(p) for p in partitions)}


def tla_state(state: CoordinatorState, transactional_id: str) -> dict[str, object]:
    """The coordinator's variables of specs/Transaction.tla for one transactional id
    (docs/trace_validation.md, "Transaction"): its metadata as the spec sees it. A change
    waiting for its record is not there yet (the spec's step is the persist); the
    coordinator's own abort is, from the fence on (PrepareEpochFence at the bumped epoch: the
    spec's FenceOngoing). A completion whose record is on its way is not there yet either: the
    id is the Prepare* it completes, with no marker left (the spec's CompleteTransaction is the
    persist of that record). An id not known, or whose first record is not durable yet, is the
    spec's initial ``Empty`` at epoch -1."""
    entry = state.entries.get(transactional_id)
    metadata = entry.metadata if entry is not None else None
    if entry is None or metadata is None:
        return {
            "txnState": S.Empty.name,
            "producerEpoch": NO_EPOCH,
            "txnPartitions": _tla_partitions(()),
            "pendingMarkers": _tla_partitions(()),
        }
    if entry.completing is not None:
        metadata = entry.completing.prepared  # the log's until the Complete* record is durable
    return {
        "txnState": metadata.state.name,
        "producerEpoch": metadata.producer_epoch,
        "txnPartitions": _tla_partitions(metadata.partitions),
        "pendingMarkers": _tla_partitions(entry.pending_markers),
    }


# The action of a persist, by the state its record takes the id to (and Dead: the expiry, which
# the spec does not have).
_PERSISTED_ACTION: Final[Mapping[TransactionState, str]] = {
    S.Empty: "InitProducerId",
    S.Ongoing: "AddPartitionsToTxn",
    S.PrepareCommit: "EndTxn",
    S.PrepareAbort: "EndTxn",
    S.CompleteCommit: "CompleteTransaction",
    S.CompleteAbort: "CompleteTransaction",
    S.Dead: "ExpireTransactionalId",
}


def tla_action(event: TransactionEvent, before: CoordinatorState, after: CoordinatorState) -> str:
    """The action of specs/Transaction.tla that ``event``, stepped on ``before`` to ``after``,
    stands for (a refused or waiting request is a stutter of it). A request's decision takes
    effect when its record is durable, so ``TransactionPersisted`` is the request's action
    (``TransactionPersistFailed`` a stutter of it); the fence of an ongoing transaction (a
    ``Tick`` past its timeout, an InitProducerId over it) is ``FenceOngoing``, and the persist
    of its abort ``AbortFenced``."""
    if isinstance(event, InitProducerId):
        was, now = (describe(s, event.transactional_id) for s in (before, after))
        fenced = was is not None and was.state is S.Ongoing
        fenced = fenced and now is not None and now.state is S.PrepareEpochFence
        return "FenceOngoing" if fenced else "InitProducerId"
    if isinstance(event, AddPartitionsToTxn):
        return "AddPartitionsToTxnVerify" if event.verify_only else "AddPartitionsToTxn"
    if isinstance(event, EndTxn):
        return "EndTxn"
    if isinstance(event, MarkerWritten):
        return "MarkerWritten"
    if isinstance(event, Tick):
        return "FenceOngoing"
    entry = before.entries.get(event.transactional_id)
    pending = entry.pending if entry is not None else None
    if entry is not None and _completing(entry, event.write_id):
        return "CompleteTransaction"  # its record durable (failed: a stutter, asked again)
    if entry is None or pending is None:
        return "CompleteTransaction"  # no write of that id pending: refused, a stutter
    if pending.restore is not None:
        return "AbortFenced"
    return _PERSISTED_ACTION[pending.target.state]
