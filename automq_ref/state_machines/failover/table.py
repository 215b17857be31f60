"""Every change of a node's phase, a session and a failover task's stage, as data. Handlers go
through ``_to_phase`` / ``_to_session`` / ``_to_stage``, which assert that the change is a row
here, and docs/machines/failover.md draws its diagrams from these rows (``mermaid_diagrams``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Final

from automq_ref.state_machines.failover.state import (
    FailoverTask,
    NodeState,
    Phase,
    Session,
    Stage,
)

NO_TASK: Final = "NONE"  # the stage column of a node with no failover task

_UP: Final = (Phase.SERVING, Phase.DRAINING, Phase.RECOVERING)

PHASE_TRANSITIONS: Final[frozenset[tuple[Phase, str, Phase]]] = frozenset(
    {
        (Phase.SERVING, "BeginShutdown", Phase.DRAINING),
        (Phase.DRAINING, "FinishShutdown", Phase.STOPPED),
        (Phase.DOWN, "Restart", Phase.RECOVERING),
        (Phase.STOPPED, "Restart", Phase.RECOVERING),
        (Phase.RECOVERING, "RecoverOwnWal", Phase.SERVING),
        *((phase, "Crash", Phase.DOWN) for phase in _UP),
        *((phase, "DetectFence", Phase.DOWN) for phase in _UP),
    }
)

SESSION_TRANSITIONS: Final[frozenset[tuple[Session, str, Session]]] = frozenset(
    {
        (Session.ACTIVE, "ExpireSession", Session.FENCED),
        (Session.FENCED, "Heartbeat", Session.ACTIVE),
        (Session.ACTIVE, "FinishShutdown", Session.STOPPED),
        (Session.FENCED, "FinishShutdown", Session.STOPPED),
        *((session, "Restart", Session.FENCED) for session in Session),
    }
)

STAGE_TRANSITIONS: Final[frozenset[tuple[str, str, str]]] = frozenset(
    {
        (NO_TASK, "AssignFailover", Stage.ASSIGNED.value),
        (Stage.ASSIGNED.value, "FenceWal", Stage.FENCED.value),
        (Stage.ASSIGNED.value, "RecoverFailedWal", Stage.RECOVERED.value),  # no fence: mutation
        (Stage.FENCED.value, "RecoverFailedWal", Stage.RECOVERED.value),
        (Stage.RECOVERED.value, "CloseFailedStreams", NO_TASK),
        *(
            (stage.value, action, NO_TASK)
            for stage in Stage
            for action in ("AbortFailover", "Crash", "DetectFence", "FinishShutdown")
        ),
    }
)


def _to_phase(node: NodeState, action: str, phase: Phase) -> NodeState:
    assert (node.phase, action, phase) in PHASE_TRANSITIONS, (node.phase, action, phase)
    return replace(node, phase=phase)


def _to_session(node: NodeState, action: str, session: Session) -> NodeState:
    assert (node.session, action, session) in SESSION_TRANSITIONS, (node.session, action)
    return replace(node, session=session)


def _stage_name(task: FailoverTask | None) -> str:
    return NO_TASK if task is None else task.stage.value


def _to_stage(node: NodeState, action: str, task: FailoverTask | None) -> NodeState:
    if node.task is None and task is None:  # a node without a task crashing or stopping
        return node
    assert (_stage_name(node.task), action, _stage_name(task)) in STAGE_TRANSITIONS, (
        node.task,
        action,
        task,
    )
    return replace(node, task=task)


def mermaid_diagrams() -> str:
    """The node-phase, session and failover-task diagrams of docs/machines/failover.md, drawn
    from the transition tables above (a test keeps the page equal to this)."""

    def diagram(title: str, initial: str, rows: Iterable[tuple[str, str, str]]) -> list[str]:
        edges: dict[tuple[str, str], list[str]] = {}
        for source, action, target in rows:
            edges.setdefault((source, target), []).append(action)
        lines = ["stateDiagram-v2", f"    [*] --> {initial}"]
        for (source, target), actions in sorted(edges.items()):
            lines.append(f"    {source} --> {target}: {', '.join(sorted(actions))}")
        return [f"**{title}**", "", "```mermaid", *lines, "```"]

    phases = [(s.value, a, t.value) for s, a, t in PHASE_TRANSITIONS]
    sessions = [(s.value, a, t.value) for s, a, t in SESSION_TRANSITIONS]
    stages = [
        (s, a, t) for s, a, t in STAGE_TRANSITIONS if not (s == "ASSIGNED" and t == "RECOVERED")
    ]
    return "\n".join(
        [
            *diagram("A node's process (phase)", Phase.SERVING.value, phases),
            "",
            *diagram("The controller's session of a node", Session.ACTIVE.value, sessions),
            "",
            *diagram("A failover target's task (stage; NONE: no task)", NO_TASK, stages),
        ]
    )
