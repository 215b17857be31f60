"""The spec's safety invariants (specs/Failover.tla) as checks on a state; the property test runs
``check_invariants`` after every step.
"""

from __future__ import annotations

from typing import Final

from automq_ref.state_machines.failover.state import (
    AckEntry,
    FailoverState,
    StreamState,
)
from automq_ref.state_machines.transition import InvariantViolation


def _settled(state: FailoverState, ack: AckEntry) -> bool:
    stream = state.streams[ack.stream_id]
    return not (
        stream.state is StreamState.OPENED
        and stream.owner == ack.node_id
        and stream.epoch == ack.stream_epoch
    )


def inv_no_acked_record_lost(state: FailoverState) -> None:
    """NoAckedRecordLost: an acknowledged record whose stream range is no longer open on its
    writer (closed by it, by a failover target, or reopened elsewhere) is committed."""
    for ack in state.acked:
        if _settled(state, ack) and ack.record not in state.committed:
            raise InvariantViolation(f"record {ack.record} acknowledged by {ack} is lost")


def inv_acked_record_durable(state: FailoverState) -> None:
    """AckedRecordDurable: an acknowledged record is committed or still in its writer's WAL."""
    for ack in state.acked:
        in_wal = any(entry.record == ack.record for entry in state.nodes[ack.node_id].wal)
        if ack.record not in state.committed and not in_wal:
            raise InvariantViolation(f"record {ack.record} is neither committed nor in a WAL")


def inv_zombie_never_acked(state: FailoverState) -> None:
    """ZombieNeverAcked: no record was acknowledged while its writer's WAL was fenced."""
    if state.zombie_acks:
        raise InvariantViolation(f"records {sorted(state.zombie_acks)} acknowledged after fence")


def inv_single_opener_per_epoch(state: FailoverState) -> None:
    """SingleOpenerPerEpoch: no two nodes believe they lead one stream at one epoch."""
    seen: dict[tuple[int, int], int] = {}
    for node_id, node in state.nodes.items():
        for stream_id, epoch in node.leads.items():
            other = seen.setdefault((stream_id, epoch), node_id)
            if other != node_id:
                raise InvariantViolation(
                    f"nodes {other} and {node_id} both lead stream {stream_id} at epoch {epoch}"
                )


def inv_one_failover_in_flight(state: FailoverState) -> None:
    """OneFailoverInFlight: at most one context, one per failed node, never self-targeted."""
    if len(state.contexts) > 1:
        raise InvariantViolation(f"{len(state.contexts)} failovers in flight")
    for context in state.contexts:
        if context.target_node_id == context.failed_node_id:
            raise InvariantViolation(f"{context} targets the failed node itself")
    for node_id, node in state.nodes.items():
        if node.task is not None and node.task.failed_node_id == node_id:
            raise InvariantViolation(f"node {node_id} fails itself over")


INVARIANTS: Final = (
    inv_no_acked_record_lost,
    inv_acked_record_durable,
    inv_zombie_never_acked,
    inv_single_opener_per_epoch,
    inv_one_failover_in_flight,
)


def check_invariants(state: FailoverState) -> None:
    for invariant in INVARIANTS:
        invariant(state)
