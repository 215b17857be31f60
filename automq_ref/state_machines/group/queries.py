"""What the shell asks of a state: when the next timer is due, which requests still wait for an
answer.
"""

from __future__ import annotations

from automq_ref.state_machines.group.consumer_admin import consumer_deadlines
from automq_ref.state_machines.group.state import (
    CoordinatorState,
    GroupState,
)


def next_deadline_ms(state: CoordinatorState) -> int | None:
    """When the next timer is due (the shell sends a Tick then); None when nothing is."""
    deadlines: list[int] = []
    for group in state.groups.values():
        deadlines.extend(group.pending_members.values())
        deadlines.extend(
            member.session_deadline_ms
            for member in group.members.values()
            if member.is_new or (member.awaiting_join is None and member.awaiting_sync is None)
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.join_deadline_ms is not None:
            deadlines.append(group.join_deadline_ms)
        if group.sync_deadline_ms is not None and group.pending_sync:
            deadlines.append(group.sync_deadline_ms)
    deadlines.extend(consumer_deadlines(state))
    return min(deadlines, default=None)


def waiting_requests(state: CoordinatorState) -> list[int]:
    """Request ids the coordinator owes an answer."""
    waiting = list(state.pending_writes)
    for group in state.groups.values():
        for member in group.members.values():
            waiting.extend(
                rid for rid in (member.awaiting_join, member.awaiting_sync) if rid is not None
            )
    return waiting
