"""``step``: the dispatch of one event to its handler. Time never runs backwards: a request
stamped earlier than the coordinator's clock happens now.
"""

from __future__ import annotations

from dataclasses import replace

from automq_ref.state_machines.group.admin import (
    _on_delete_groups,
    _on_describe_groups,
    _on_list_groups,
)
from automq_ref.state_machines.group.events import (
    DeleteGroups,
    DescribeGroups,
    GroupEvent,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    ListGroups,
    OffsetCommit,
    OffsetFetch,
    OffsetsPersisted,
    OffsetsPersistFailed,
    SyncGroup,
    Tick,
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
)
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupParams,
    Transition,
)


def step(state: CoordinatorState, event: GroupEvent, params: GroupParams) -> Transition:
    if not isinstance(event, OffsetsPersisted | OffsetsPersistFailed):
        # Time never runs backwards: a late-stamped event happens now.
        state = replace(state, now_ms=max(state.now_ms, event.now_ms))
        if event.now_ms != state.now_ms:
            event = replace(event, now_ms=state.now_ms)
    match event:
        case JoinGroup():
            return _on_join_group(state, event, params)
        case SyncGroup():
            return _on_sync_group(state, event, params)
        case Heartbeat():
            return _on_heartbeat(state, event)
        case LeaveGroup():
            return _on_leave_group(state, event, params)
        case OffsetCommit():
            return _on_offset_commit(state, event, params)
        case OffsetFetch():
            return _on_offset_fetch(state, event)
        case ListGroups():
            return _on_list_groups(state, event)
        case DescribeGroups():
            return _on_describe_groups(state, event)
        case DeleteGroups():
            return _on_delete_groups(state, event)
        case Tick():
            return _on_tick(state, params)
        case OffsetsPersisted():
            return _on_offsets_persisted(state, event)
        case OffsetsPersistFailed():
            return _on_offsets_persist_failed(state, event)
