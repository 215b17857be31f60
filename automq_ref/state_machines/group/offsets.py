"""Committed offsets: OffsetCommit (answered once ``OffsetsPersisted`` says the write is durable,
or failed by ``OffsetsPersistFailed``), TxnOffsetCommit (the same, but the offsets wait, per
producer id, for the transaction's marker: ``TxnMarker`` shows them on a commit and drops them
on an abort, as Kafka's pending transactional offsets), OffsetFetch (with ``require_stable``,
``UNSTABLE_OFFSET_COMMIT`` for a partition whose commit is not settled), and ``recover``, which
folds the durable records (and the markers between them) back into a state after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.consumer_admin import (
    consumer_commit_error,
    consumer_fetch_error,
)
from automq_ref.state_machines.group.events import (
    NO_LEADER_EPOCH,
    NO_OFFSET,
    UNKNOWN_MEMBER_ID,
    Error,
    OffsetCommit,
    OffsetFetch,
    OffsetsPersisted,
    OffsetsPersistFailed,
    TopicPartition,
    TxnMarker,
    TxnOffsetCommit,
)
from automq_ref.state_machines.group.rebalance import (
    _heartbeat,
    _validate_current_member,
)
from automq_ref.state_machines.group.responses import (
    DurableRecord,
    FetchedOffset,
    OffsetCommitPartitionResult,
    OffsetCommitResponse,
    OffsetFetchGroupResult,
    OffsetFetchResponse,
    OffsetRecord,
    PersistGroupDeletion,
    PersistOffsetDeletion,
    PersistOffsets,
    Respond,
)
from automq_ref.state_machines.group.state import (
    CommittedOffset,
    CoordinatorState,
    Group,
    GroupParams,
    GroupState,
    GroupTransition,
    PendingWrite,
    _respond,
    _with_group,
)
from automq_ref.state_machines.transition import Transition

# ===================================================================================== OffsetCommit


def _commit_error(event: OffsetCommit | TxnOffsetCommit, error: KafkaErrorCode) -> Respond:
    keys = dict.fromkeys((entry.topic, entry.partition) for entry in event.offsets)
    results = tuple(OffsetCommitPartitionResult(t, p, error) for t, p in keys)
    return Respond(event.request_id, OffsetCommitResponse(results))


def _validate_offset_commit(
    group: Group, event: OffsetCommit | TxnOffsetCommit
) -> KafkaErrorCode | None:
    if (
        event.generation_id >= 0
        or event.member_id != UNKNOWN_MEMBER_ID
        or event.group_instance_id is not None
    ):
        error = _validate_current_member(group, event.member_id, event.group_instance_id)
        if error is None and event.generation_id != group.generation_id:
            error = Error.ILLEGAL_GENERATION
        return error
    if group.state is not GroupState.EMPTY:
        return Error.UNKNOWN_MEMBER_ID  # only members commit for a group that has members
    return None


def _on_offset_commit(
    state: CoordinatorState, event: OffsetCommit | TxnOffsetCommit, params: GroupParams
) -> GroupTransition:
    """OffsetCommit and TxnOffsetCommit: the same checks, the same durable write; the latter's
    offsets are the producer's until its transaction ends (Kafka answers a transactional
    commit during a rebalance too: the producer's transaction is not the group's business)."""
    transactional = isinstance(event, TxnOffsetCommit)
    consumer = state.consumer_groups.get(event.group_id)
    if consumer is not None:  # a KIP-848 group: the member epoch is the generation
        if (error := consumer_commit_error(consumer, event)) is not None:
            return _respond(state, _commit_error(event, error))
        return _write_commit(state, event, params)
    group = state.groups.get(event.group_id)
    if group is None:
        if event.generation_id >= 0:
            return _respond(state, _commit_error(event, Error.ILLEGAL_GENERATION))
        group = Group(event.group_id)  # a standalone consumer's group: created Empty
        state = _with_group(state, group)
    if transactional and event.generation_id < 0 and event.member_id == UNKNOWN_MEMBER_ID:
        error = None  # a producer that does not name its consumer: not checked, as Kafka
    else:
        error = _validate_offset_commit(group, event)
    if error is None and not transactional and group.state is GroupState.COMPLETING_REBALANCE:
        error = Error.REBALANCE_IN_PROGRESS
    if error is not None:
        return _respond(state, _commit_error(event, error))
    if event.member_id in group.members:
        state = _with_group(state, _heartbeat(group, event.member_id, state.now_ms))
    return _write_commit(state, event, params)


def _write_commit(
    state: CoordinatorState, event: OffsetCommit | TxnOffsetCommit, params: GroupParams
) -> GroupTransition:
    """The durable write of a commit its group accepted (answered once durable)."""
    results: dict[TopicPartition, KafkaErrorCode] = {}
    accepted: dict[TopicPartition, CommittedOffset] = {}
    seq = state.next_write_seq
    for entry in event.offsets:
        key = (entry.topic, entry.partition)
        if len(entry.metadata) > params.offset_metadata_max_bytes:
            results[key] = Error.OFFSET_METADATA_TOO_LARGE
            accepted.pop(key, None)
        else:
            results[key] = Error.NONE
            accepted[key] = CommittedOffset(
                entry.offset, entry.leader_epoch, entry.metadata, state.now_ms, seq
            )
    response = OffsetCommitResponse(
        tuple(OffsetCommitPartitionResult(t, p, error) for (t, p), error in results.items())
    )
    if not accepted:
        return _respond(state, Respond(event.request_id, response))
    failure = OffsetCommitResponse(
        tuple(
            OffsetCommitPartitionResult(
                t, p, Error.COORDINATOR_NOT_AVAILABLE if (t, p) in accepted else error
            )
            for (t, p), error in results.items()
        )
    )
    producer_id, producer_epoch = (
        (event.producer_id, event.producer_epoch)
        if isinstance(event, TxnOffsetCommit)
        else (-1, -1)
    )
    write = PendingWrite(
        seq, (event.group_id,), tuple(accepted.items()), response, failure, producer_id
    )
    state = replace(
        state,
        pending_writes={**state.pending_writes, event.request_id: write},
        next_write_seq=seq + 1,
    )
    records = tuple(
        OffsetRecord(t, p, c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms)
        for (t, p), c in accepted.items()
    )
    return Transition(
        state,
        (PersistOffsets(event.request_id, event.group_id, records, producer_id, producer_epoch),),
    )


def _on_offsets_persisted(state: CoordinatorState, event: OffsetsPersisted) -> GroupTransition:
    write = state.pending_writes[event.request_id]  # step refuses a completion for no write
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    state = replace(state, pending_writes=pending)
    if write.offsets:
        (group_id,) = write.group_ids
        if write.producer_id >= 0:
            state = _hold(state, write.producer_id, group_id, write.offsets)
        else:
            state = _show(state, group_id, write.offsets)
    return Transition(state, (Respond(event.request_id, write.response),))


def _show(
    state: CoordinatorState,
    group_id: str,
    offsets: Iterable[tuple[TopicPartition, CommittedOffset]],
) -> CoordinatorState:
    """``offsets`` committed: each replaces the group's offset unless a later write set it."""
    shown = dict(state.offsets)
    committed = dict(shown.get(group_id, {}))
    for key, offset in offsets:
        current = committed.get(key)
        if current is None or current.write_seq < offset.write_seq:
            committed[key] = offset
    shown[group_id] = committed
    return replace(state, offsets=shown)


def _hold(
    state: CoordinatorState,
    producer_id: int,
    group_id: str,
    offsets: Iterable[tuple[TopicPartition, CommittedOffset]],
) -> CoordinatorState:
    """``offsets`` durable in ``producer_id``'s open transaction: held until its marker."""
    held = dict(state.txn_offsets)
    groups = dict(held.get(producer_id, {}))
    groups[group_id] = {**groups.get(group_id, {}), **dict(offsets)}
    held[producer_id] = groups
    return replace(state, txn_offsets=held)


def _on_txn_marker(state: CoordinatorState, event: TxnMarker) -> GroupTransition:
    """The producer's transaction ended: its held offsets are shown (commit) or dropped; a
    commit's offsets count as written now, after every write before the marker."""
    held = dict(state.txn_offsets)
    groups = held.pop(event.producer_id, None)
    state = replace(state, txn_offsets=held)
    if groups and event.commit:
        seq = state.next_write_seq
        state = replace(state, next_write_seq=seq + 1)
        for group_id, offsets in sorted(groups.items()):
            if group_id not in state.groups:
                state = _with_group(state, Group(group_id))
            state = _show(
                state,
                group_id,
                ((key, replace(offset, write_seq=seq)) for key, offset in offsets.items()),
            )
    return Transition(state)


def _on_offsets_persist_failed(
    state: CoordinatorState, event: OffsetsPersistFailed
) -> GroupTransition:
    write = state.pending_writes[event.request_id]  # step refuses a completion for no write
    pending = {rid: w for rid, w in state.pending_writes.items() if rid != event.request_id}
    state = replace(state, pending_writes=pending)
    return Transition(state, (Respond(event.request_id, write.failure_response),))


# ====================================================================================== OffsetFetch


def committed_offset(state: CoordinatorState, group_id: str, key: TopicPartition) -> FetchedOffset:
    committed = state.offsets.get(group_id, {}).get(key)
    if committed is None:
        return FetchedOffset(key[0], key[1], NO_OFFSET, NO_LEADER_EPOCH, "")
    return FetchedOffset(
        key[0], key[1], committed.offset, committed.leader_epoch, committed.metadata
    )


def unstable_offset(state: CoordinatorState, group_id: str, key: TopicPartition) -> bool:
    """Whether ``group_id``'s offset of ``key`` has a commit not settled yet: a commit still in
    flight (Kafka's pending offset commits) or a transaction's offsets held for its marker
    (its pending transactional offset commits), ``hasPendingOffsetCommitsForTopicPartition``."""
    for write in state.pending_writes.values():
        if write.group_ids == (group_id,) and any(k == key for k, _ in write.offsets):
            return True
    return any(key in groups.get(group_id, {}) for groups in state.txn_offsets.values())


def _on_offset_fetch(state: CoordinatorState, event: OffsetFetch) -> GroupTransition:
    results: list[OffsetFetchGroupResult] = []
    for request in event.groups:
        # Answered whatever the group's state: standalone consumers have no group to speak of.
        error = consumer_fetch_error(state, request)
        if error is not Error.NONE:
            results.append(OffsetFetchGroupResult(request.group_id, error, ()))
            continue
        keys = request.partitions
        if keys is None:
            keys = tuple(sorted(state.offsets.get(request.group_id, {})))
        partitions = tuple(
            FetchedOffset(
                key[0], key[1], NO_OFFSET, NO_LEADER_EPOCH, "", Error.UNSTABLE_OFFSET_COMMIT
            )
            if event.require_stable and unstable_offset(state, request.group_id, key)
            else committed_offset(state, request.group_id, key)
            for key in keys
        )
        results.append(OffsetFetchGroupResult(request.group_id, Error.NONE, partitions))
    return _respond(state, Respond(event.request_id, OffsetFetchResponse(tuple(results))))


# ========================================================================================= recovery


def recover(records: Iterable[DurableRecord | TxnMarker]) -> CoordinatorState:
    """The coordinator after a restart: the durable records and the markers replayed in log
    order; every group with offsets (shown or held) is Empty at generation 0; transactional
    offsets whose marker is not in the log are held for it."""
    offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
    held: dict[int, dict[str, dict[TopicPartition, CommittedOffset]]] = {}
    for record in records:
        match record:
            case TxnMarker():
                ended = held.pop(record.producer_id, {})
                if record.commit:
                    for group_id, committed in ended.items():
                        offsets.setdefault(group_id, {}).update(committed)
            case PersistOffsets():
                committed = (
                    offsets.setdefault(record.group_id, {})
                    if record.producer_id < 0
                    else held.setdefault(record.producer_id, {}).setdefault(record.group_id, {})
                )
                for r in record.offsets:
                    committed[(r.topic, r.partition)] = CommittedOffset(
                        r.offset, r.leader_epoch, r.metadata, r.commit_timestamp_ms
                    )
            case PersistOffsetDeletion():
                for key in record.partitions:
                    offsets.get(record.group_id, {}).pop(key, None)
                    for by_group in held.values():
                        by_group.get(record.group_id, {}).pop(key, None)
            case PersistGroupDeletion():
                for group_id in record.group_ids:
                    offsets.pop(group_id, None)
                    for by_group in held.values():
                        by_group.pop(group_id, None)
    kept = {group_id: committed for group_id, committed in offsets.items() if committed}
    # A group is held while it has offsets, shown or held for a transaction's marker (Kafka
    # loads a group with only pending transactional offsets too).
    holding = {gid for by_group in held.values() for gid, pending in by_group.items() if pending}
    groups = {group_id: Group(group_id) for group_id in sorted({*kept, *holding})}
    return CoordinatorState(groups=groups, offsets=kept, txn_offsets=held)
