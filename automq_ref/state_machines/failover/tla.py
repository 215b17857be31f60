"""Trace validation: a state as the variables of specs/Failover.tla, in the trace format of
specs/trace_validate.py (docs/trace_validation.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from automq_ref.state_machines.failover.state import (
    NO_EPOCH,
    FailoverState,
    FailoverTask,
    WalEntry,
)
from automq_ref.state_machines.failover.table import (
    NO_TASK,
)


def _node(node_id: int) -> dict[str, object]:
    return {"model": f"n{node_id}"}


def _fn(pairs: Iterable[tuple[object, object]]) -> dict[str, object]:
    return {"fn": [[key, value] for key, value in pairs]}


def _set(items: Iterable[object]) -> dict[str, object]:
    return {"set": sorted(items, key=repr)}


def _record(**fields: object) -> dict[str, object]:
    return {"record": fields}


def _entry(entry: WalEntry) -> dict[str, object]:
    return _record(rec=entry.record, stream=entry.stream_id, sepoch=entry.stream_epoch)


def _task(task: FailoverTask | None) -> dict[str, object]:
    if task is None:
        return _record(stage=NO_TASK)
    return _record(
        failed=_node(task.failed_node_id),
        epoch=task.node_epoch,
        stage=task.stage.value,
        uploaded=task.uploaded,
    )


def tla_state(state: FailoverState) -> dict[str, object]:
    """The spec's variables (all but the model's bounds ``crashes`` and ``perturbed``)."""
    nodes = sorted(state.nodes.items())
    streams = sorted(state.streams.items())
    no_node = "NONE"
    return {
        "phase": _fn((_node(i), n.phase.value) for i, n in nodes),
        "nodeEpoch": _fn((_node(i), n.node_epoch) for i, n in nodes),
        "session": _fn((_node(i), n.session.value) for i, n in nodes),
        "grace": _fn((_node(i), n.grace) for i, n in nodes),
        "reservation": _fn(
            (_node(i), _record(epoch=n.reservation.epoch, failover=n.reservation.failover))
            for i, n in nodes
        ),
        "wal": _fn((_node(i), _set(_entry(e) for e in n.wal)) for i, n in nodes),
        "pending": _fn((_node(i), _set(_entry(e) for e in n.pending)) for i, n in nodes),
        "leads": _fn(
            (_node(i), _fn((s, n.leads.get(s, NO_EPOCH)) for s, _ in streams)) for i, n in nodes
        ),
        "streamState": _fn((s, info.state.value) for s, info in streams),
        "streamOwner": _fn(
            (s, no_node if info.owner is None else _node(info.owner)) for s, info in streams
        ),
        "streamEpoch": _fn((s, info.epoch) for s, info in streams),
        "nextRecord": state.next_record,
        "acked": _set(
            _record(
                rec=a.record,
                node=_node(a.node_id),
                nepoch=a.node_epoch,
                stream=a.stream_id,
                sepoch=a.stream_epoch,
            )
            for a in state.acked
        ),
        "committed": _set(state.committed),
        "contexts": _set(
            _record(
                failed=_node(c.failed_node_id), epoch=c.node_epoch, target=_node(c.target_node_id)
            )
            for c in state.contexts
        ),
        "task": _fn((_node(i), _task(n.task)) for i, n in nodes),
        "completed": _set(
            _record(failed=_node(c.failed_node_id), epoch=c.node_epoch, uploaded=c.uploaded)
            for c in state.completed
        ),
        "zombieAcks": _set(state.zombie_acks),
    }
