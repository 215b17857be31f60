"""The controller's projection of the Failover machine: which failovers a controller starts and
forgets, decided by the machine's own rules.

The machine (``step``) models the whole cluster; a real controller sees only its part: each
node's session, node epoch, whether it is inside the grace period after a restart, the streams
still OPENED on it, and the failover contexts it stored. :func:`project` builds a
:class:`FailoverState` from exactly that (a node with an ACTIVE session is SERVING, any other is
DOWN as far as the controller can tell; a context's target holds an ASSIGNED task), and
:func:`failover_round` runs the machine's ``ClearFailover`` for every stored context and
``AssignFailover`` for every candidate on it, so candidacy, the limit of failovers in flight, a
target's availability and when a context is no longer needed are the machine's decisions, not
a copy of them. The one rule the machine leaves to the shell is which target to ask:
:func:`target_order` takes the live nodes round-robin, starting after the failed node's id, so
failures of different nodes land on different survivors.

The target's side asks the machine too: :func:`abort_failover` is its ``AbortFailover`` on the
target's view (its task, the failed node's current epoch).

Pure: the caller reads the image and the clock and writes the contexts the round returns.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from automq_ref.state_machines.failover.events import AbortFailover, AssignFailover, ClearFailover
from automq_ref.state_machines.failover.state import (
    DEFAULT_PARAMS,
    FailoverContext,
    FailoverParams,
    FailoverState,
    FailoverTask,
    NodeState,
    Phase,
    Session,
    Stage,
    StreamInfo,
    StreamState,
)
from automq_ref.state_machines.failover.step import step
from automq_ref.state_machines.transition import Rejected


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the controller sees it."""

    node_id: int
    node_epoch: int  # the node's current epoch (bumped when its session lapsed)
    session: Session
    in_grace: bool  # its epoch is younger than the grace period after a (re)start
    opened: frozenset[int]  # ids of the streams OPENED on it


@dataclass(frozen=True, slots=True)
class FailoverRound:
    """What one round decided: the contexts to store, and which it added and removed."""

    contexts: frozenset[FailoverContext]
    assigned: tuple[FailoverContext, ...]
    cleared: tuple[FailoverContext, ...]


def in_grace(node_epoch: int, now_ms: int, grace_ms: int) -> bool:
    """A node epoch is the node's start time in milliseconds (the controller grants one at least
    the proposed clock time): a node younger than ``grace_ms`` may still be recovering itself.

    post: __return__ == (now_ms - node_epoch < grace_ms)
    """
    return now_ms - node_epoch < grace_ms


def project(nodes: Iterable[NodeView], contexts: Collection[FailoverContext]) -> FailoverState:
    """The machine's state for the controller's view (see the module docstring). A node a
    context names but the view does not (unregistered since) is DOWN with a STOPPED session."""
    views = {node.node_id: node for node in nodes}
    tasks = {
        context.target_node_id: FailoverTask(
            context.failed_node_id, context.node_epoch, Stage.ASSIGNED
        )
        for context in contexts
    }
    states: dict[int, NodeState] = {}
    streams: dict[int, StreamInfo] = {}
    mentioned = {c.failed_node_id for c in contexts} | {c.target_node_id for c in contexts}
    for node_id in sorted(set(views) | mentioned):
        view = views.get(node_id)
        if view is None:
            states[node_id] = NodeState(
                phase=Phase.DOWN, session=Session.STOPPED, task=tasks.get(node_id)
            )
            continue
        live = view.session is Session.ACTIVE
        states[node_id] = NodeState(
            phase=Phase.SERVING if live else Phase.DOWN,
            node_epoch=view.node_epoch,
            session=view.session,
            grace=view.in_grace,
            task=tasks.get(node_id),
        )
        for stream_id in view.opened:
            streams[stream_id] = StreamInfo(StreamState.OPENED, node_id, 0)
    return FailoverState(nodes=states, streams=streams, contexts=frozenset(contexts))


def target_order(nodes: Sequence[int], failed_node_id: int) -> list[int]:
    """``nodes`` round-robin from the first id after ``failed_node_id``, without it.

    post: failed_node_id not in __return__
    post: sorted(__return__) == sorted(set(nodes) - {failed_node_id})
    """
    ordered = sorted(set(nodes) - {failed_node_id})
    after = [node_id for node_id in ordered if node_id > failed_node_id]
    return after + [node_id for node_id in ordered if node_id < failed_node_id]


def failover_round(
    nodes: Sequence[NodeView],
    contexts: Collection[FailoverContext],
    params: FailoverParams = DEFAULT_PARAMS,
) -> FailoverRound:
    """Forget the contexts no longer needed, then assign every candidate a target while the
    machine accepts (one failover in flight by default)."""
    state = project(nodes, contexts)
    cleared: list[FailoverContext] = []
    for failed_node_id in sorted({c.failed_node_id for c in contexts}):
        transition = step(state, ClearFailover(failed_node_id), params)
        if not _refused(transition.effects):
            cleared.extend(state.contexts - transition.state.contexts)
            state = transition.state
    # A target's task is only its context, as the controller sees it: a forgotten context frees
    # its target (the machine leaves a task to its own node, which finishes or aborts it).
    state = project(nodes, state.contexts)
    assigned: list[FailoverContext] = []
    node_ids = [node.node_id for node in nodes]
    for failed_node_id in sorted(node_ids):
        if not state.candidate(failed_node_id):
            continue
        for target in target_order(node_ids, failed_node_id):
            transition = step(state, AssignFailover(failed_node_id, target), params)
            if not _refused(transition.effects):
                assigned.extend(transition.state.contexts - state.contexts)
                state = transition.state
                break
    return FailoverRound(state.contexts, tuple(assigned), tuple(cleared))


def _refused(effects: Sequence[object]) -> bool:
    return any(isinstance(effect, Rejected) for effect in effects)


def abort_failover(target_node_id: int, context: FailoverContext, failed_node_epoch: int) -> bool:
    """Whether a target working on ``context`` drops it: the machine's ``AbortFailover``
    accepts, because the failed node runs another epoch now (it restarted and recovers its WAL
    itself)."""
    task = FailoverTask(context.failed_node_id, context.node_epoch, Stage.ASSIGNED)
    state = FailoverState(
        nodes={
            target_node_id: NodeState(task=task),
            context.failed_node_id: NodeState(phase=Phase.DOWN, node_epoch=failed_node_epoch),
        },
        streams={},
        contexts=frozenset({context}),
    )
    return not _refused(step(state, AbortFailover(target_node_id)).effects)
