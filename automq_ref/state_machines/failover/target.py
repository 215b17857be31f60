"""The failover target's projection of the Failover machine: which step a target takes next on
its task, and the I/O that step asks for, decided by the machine's own rules.

A target knows its task (the context the controller stored for it: failed node, node epoch,
and how far it got), the failed node's node epoch as its image shows it (newer than the task's
once the node restarted), and, once the controller answered ``FenceNode``, the streams still
OPENED on the failed node. :func:`project_target` builds a :class:`FailoverState` of exactly
that: the target SERVING with the task; the failed node DOWN at its current epoch, its WAL
reserved for the target from ``FenceWal`` on; its streams OPENED on it. :func:`next_step` then
offers the machine the target's actions in the protocol's order (``AbortFailover``,
``FenceWal``, ``RecoverFailedWal``, ``CloseFailedStreams``) and returns the first it accepts,
with its effects:

- ``FenceWal``: ``AcquireReservation`` of the failed node's WAL (the shell opens the WAL in
  failover mode, which overwrites the reservation);
- ``RecoverFailedWal``: ``CommitRecords`` and ``ResetWal`` of the failed node's WAL (the shell
  recovers the WAL as the failed node, uploads and commits what it holds in failover mode and
  resets it; the projection does not know the WAL's records, so ``CommitRecords`` names none:
  it stands for "what the WAL holds");
- ``CloseFailedStreams``: ``CloseStreams`` of the failed node's streams, as that node (and the
  machine's ``RemoveFailoverContext``, which the controller's next round does: the target does
  not write the context);
- ``AbortFailover``: nothing; the task ends (the failed node restarted and recovers itself).

A step the machine refuses in every way leaves the task where it is: the shell reports the
refusal (``StepRefused``) and retries later. Pure: the shell does the I/O and reports what it
learnt (``with_opened``, ``with_failed_epoch``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from automq_ref.state_machines.failover.events import (
    AbortFailover,
    CloseFailedStreams,
    FailoverEffect,
    FailoverError,
    FenceWal,
    RecoverFailedWal,
)
from automq_ref.state_machines.failover.state import (
    FailoverContext,
    FailoverState,
    FailoverTask,
    NodeState,
    Phase,
    Reservation,
    Session,
    Stage,
    StreamInfo,
    StreamState,
)
from automq_ref.state_machines.failover.step import step

TargetEvent = AbortFailover | FenceWal | RecoverFailedWal | CloseFailedStreams


@dataclass(frozen=True, slots=True)
class TargetView:
    """One failover task as its target sees it."""

    target_node_id: int
    task: FailoverTask
    failed_node_epoch: int  # the failed node's epoch now (the task's, or newer: it restarted)
    opened: frozenset[int] = frozenset()  # streams OPENED on the failed node (from FenceNode)

    @property
    def context(self) -> FailoverContext:
        return FailoverContext(self.task.failed_node_id, self.task.node_epoch, self.target_node_id)

    def with_opened(self, stream_ids: frozenset[int]) -> TargetView:
        return replace(self, opened=stream_ids)

    def with_failed_epoch(self, node_epoch: int) -> TargetView:
        return replace(self, failed_node_epoch=node_epoch)


@dataclass(frozen=True, slots=True)
class TargetStep:
    """The step the machine took: its event, the effects to carry out, and the view after it
    (``done``: the task ended, by ``CloseFailedStreams`` or ``AbortFailover``)."""

    event: TargetEvent
    effects: tuple[FailoverEffect, ...]
    view: TargetView
    done: bool


@dataclass(frozen=True, slots=True)
class StepRefused:
    """No target action is enabled: the machine's refusal of each, in the order offered."""

    refusals: tuple[tuple[str, FailoverError], ...]


def start_task(target_node_id: int, context: FailoverContext, failed_node_epoch: int) -> TargetView:
    """The view of a task just assigned (``AssignFailover``: stage ASSIGNED)."""
    task = FailoverTask(context.failed_node_id, context.node_epoch, Stage.ASSIGNED)
    return TargetView(target_node_id, task, failed_node_epoch)


def project_target(view: TargetView) -> FailoverState:
    """The machine's state for the target's view (see the module docstring)."""
    task = view.task
    fenced = task.stage is not Stage.ASSIGNED
    # Before the fence the target does not know the WAL's reservation: the failed node's own at
    # its current epoch is what a node of that epoch last wrote.
    reservation = (
        Reservation(task.node_epoch, True) if fenced else Reservation(view.failed_node_epoch, False)
    )
    failed = NodeState(
        phase=Phase.DOWN,
        node_epoch=view.failed_node_epoch,
        session=Session.FENCED,
        reservation=reservation,
    )
    streams = {
        stream_id: StreamInfo(StreamState.OPENED, task.failed_node_id, 0)
        for stream_id in sorted(view.opened)
    }
    return FailoverState(
        nodes={view.target_node_id: NodeState(task=task), task.failed_node_id: failed},
        streams=streams,
        contexts=frozenset({view.context}),
    )


ORDER: tuple[type[TargetEvent], ...] = (
    AbortFailover,
    FenceWal,
    RecoverFailedWal,
    CloseFailedStreams,
)


def next_step(view: TargetView) -> TargetStep | StepRefused:
    """The first target action (in :data:`ORDER`) the machine accepts on the view."""
    state = project_target(view)
    refusals: list[tuple[str, FailoverError]] = []
    for kind in ORDER:
        event: TargetEvent = kind(view.target_node_id)
        transition = step(state, event)
        if transition.refusal is not None:
            refusals.append((kind.__name__, transition.refusal))
            continue
        task = transition.state.nodes[view.target_node_id].task
        if task is None:
            return TargetStep(event, transition.effects, view, done=True)
        return TargetStep(event, transition.effects, replace(view, task=task), done=False)
    return StepRefused(tuple(refusals))
