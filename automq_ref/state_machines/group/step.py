"""``step``: the dispatch of one event to its handler, after the checks of the shell's side of
the contract. Time never runs backwards: a request stamped earlier than the coordinator's clock
happens now.
"""

from __future__ import annotations

from dataclasses import replace

from automq_ref.errors import KafkaErrorCode
from automq_ref.state_machines.group.admin import (
    _on_delete_groups,
    _on_describe_groups,
    _on_list_groups,
    _on_offset_delete,
)
from automq_ref.state_machines.group.consumer_admin import (
    consumer_group_empty,
    expire_consumer_groups,
    on_consumer_group_describe,
)
from automq_ref.state_machines.group.consumer_heartbeat import on_consumer_heartbeat
from automq_ref.state_machines.group.events import (
    ConsumerGroupDescribe,
    ConsumerGroupHeartbeat,
    DeleteGroups,
    DescribeGroups,
    GroupEvent,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    ListGroups,
    OffsetCommit,
    OffsetDelete,
    OffsetFetch,
    OffsetsPersisted,
    OffsetsPersistFailed,
    SyncGroup,
    Tick,
    TxnMarker,
    TxnOffsetCommit,
)
from automq_ref.state_machines.group.membership import (
    _on_heartbeat,
    _on_join_group,
    _on_leave_group,
    _on_sync_group,
    _on_tick,
)
from automq_ref.state_machines.group.offsets import (
    _on_offset_commit,
    _on_offset_fetch,
    _on_offsets_persist_failed,
    _on_offsets_persisted,
    _on_txn_marker,
)
from automq_ref.state_machines.group.rebalance import _join_error
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupParams,
    GroupTransition,
    _respond,
)
from automq_ref.state_machines.transition import Rejected, Transition


def step(state: CoordinatorState, event: GroupEvent, params: GroupParams) -> GroupTransition:
    """One event. An event that breaks the shell's contract is refused (``Rejected`` with
    ``INVALID_REQUEST``, the state unchanged); every other one is handled."""
    if (refused := _refusal(state, event)) is not None:
        return Transition(state, (refused,))
    if isinstance(event, TxnMarker):
        return _on_txn_marker(state, event)
    if not isinstance(event, OffsetsPersisted | OffsetsPersistFailed):
        # Time never runs backwards: a late-stamped event happens now.
        state = replace(state, now_ms=max(state.now_ms, event.now_ms))
        if event.now_ms != state.now_ms:
            event = replace(event, now_ms=state.now_ms)
    match event:
        case JoinGroup():
            consumer = state.consumer_groups.get(event.group_id)
            if consumer is not None:
                if not consumer_group_empty(consumer):
                    # A classic member cannot join a KIP-848 group with members here.
                    error = KafkaErrorCode.INCONSISTENT_GROUP_PROTOCOL
                    return _respond(state, _join_error(event.request_id, error, event.member_id))
                # An Empty consumer group (offsets only) turns classic on a join, as in Kafka.
                groups = {g: c for g, c in state.consumer_groups.items() if g != event.group_id}
                state = replace(state, consumer_groups=groups)
            return _on_join_group(state, event, params)
        case SyncGroup():
            return _on_sync_group(state, event, params)
        case Heartbeat():
            return _on_heartbeat(state, event)
        case LeaveGroup():
            return _on_leave_group(state, event, params)
        case OffsetCommit() | TxnOffsetCommit():
            return _on_offset_commit(state, event, params)
        case OffsetFetch():
            return _on_offset_fetch(state, event)
        case ListGroups():
            return _on_list_groups(state, event)
        case DescribeGroups():
            return _on_describe_groups(state, event)
        case DeleteGroups():
            return _on_delete_groups(state, event)
        case OffsetDelete():
            return _on_offset_delete(state, event)
        case ConsumerGroupHeartbeat():
            return on_consumer_heartbeat(state, event, params)
        case ConsumerGroupDescribe():
            return on_consumer_group_describe(state, event, params)
        case Tick():
            ticked = _on_tick(state, params)
            return Transition(expire_consumer_groups(ticked.state), ticked.effects)
        case OffsetsPersisted():
            return _on_offsets_persisted(state, event)
        case OffsetsPersistFailed():
            return _on_offsets_persist_failed(state, event)


def _refusal(state: CoordinatorState, event: GroupEvent) -> Rejected[KafkaErrorCode] | None:
    """The shell's side of the contract: a completion names a write in flight, and a request
    that starts a write does not reuse the request id of one still in flight (its answer would
    go to the wrong request)."""
    match event:
        case OffsetsPersisted() | OffsetsPersistFailed():
            if event.request_id not in state.pending_writes:
                message = f"no write in flight for request {event.request_id}"
                return Rejected(KafkaErrorCode.INVALID_REQUEST, message)
        case OffsetCommit() | TxnOffsetCommit() | DeleteGroups() | OffsetDelete():
            if event.request_id in state.pending_writes:
                message = f"request id {event.request_id} is already waiting for a write"
                return Rejected(KafkaErrorCode.INVALID_REQUEST, message)
    return None
