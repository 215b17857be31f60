"""Failover: node sessions, graceful shutdown, crash failover and WAL fencing.

Spec: specs/Failover.tla. Properties: tests/properties/test_failover.py::FailoverMachine.
Prose and diagrams: docs/machines/failover.md.

Theory of operation
-------------------
Every node writes its own WAL. A produce request is acknowledged once its record is durable in
that WAL; the record reaches committed objects later, when the node uploads it. So while a node
is away, its acknowledged records live only in its WAL, and its streams stay OPENED on it, so no
other node may take its partitions. Two ways out:

* **Graceful shutdown** (SIGTERM): the node stops taking appends (``BeginShutdown``), uploads
  what it acknowledged (``UploadWal``), closes each stream (``CloseStream``, which refuses while
  an acknowledged record of the stream is not yet uploaded) and stops (``FinishShutdown``). Only
  then can the partitions reopen elsewhere (``OpenStream``, a higher stream epoch).
* **Crash failover**: the controller's session timer fires (``ExpireSession``); once the node is
  a candidate (session FENCED, streams still OPENED on it, not inside the grace period after a
  restart: ``EndGrace``) and no other failover is in flight, the controller picks a live target
  (``AssignFailover``). The target first takes the failed node's WAL reservation (``FenceWal``:
  an NVMe reservation on a block WAL, the reservation object on the S3 WAL), then reads the WAL
  and uploads it acting as the failed node (``RecoverFailedWal``), then closes its streams
  (``CloseFailedStreams``). ``AbortFailover`` drops a task whose node restarted meanwhile;
  ``ClearFailover`` is the controller forgetting a context that is no longer needed.

"Dead" is only the controller's opinion: a node whose session expired may still run (a long
pause, a partition from the controller but not from storage) and keep appending: a **zombie**.
Safety rests on one ordering. A writer acknowledges a record (``AckAppend``) only after the
record landed in the WAL (``AppendRecord``) *and* its reservation still verifies; a target reads
the WAL only after it took the reservation. So a zombie's record either landed before the fence,
and the target reads and uploads it, or it is never acknowledged: the zombie finds out
(``DetectFence``) and halts. Uploads and closes are checked by the controller against the
stream's owner and epoch, so nothing a zombie does after its streams were closed is accepted.

Time arrives as events (``ExpireSession``, ``EndGrace``; the shell owns the timers and the
heartbeat deadlines); I/O completions arrive as events (``AckAppend`` after the WAL write and
the reservation check, ``DetectFence`` when that check fails); effects are data.

The machine is the whole cluster as the protocol sees it (the controller's sessions, contexts
and stream owners; each node's phase, WAL, reservation, in-flight appends and beliefs), the same
state as the spec's variables, so that every step is one TLA+ action. ``tla_state`` maps a state
onto those variables for trace validation.

Layout
------
``state`` holds the cluster as the protocol sees it and the protocol's knobs; ``events`` the
events (one per TLA+ action), the effects and the refusals; ``table`` the allowed changes of a
node's phase, a session and a failover task's stage, as data, and the diagrams drawn from them;
``step`` the handlers; ``invariants`` the spec's invariants as checks; ``tla`` the mapping onto
the spec's variables. ``controller`` and ``target`` are the machine's projections the shell runs:
the active controller's failover round (``ClearFailover``, ``AssignFailover``) and a failover
target's next step (``AbortFailover``, ``FenceWal``, ``RecoverFailedWal``,
``CloseFailedStreams``), each a ``FailoverState`` built from what that side knows, stepped.
"""

from __future__ import annotations

from automq_ref.state_machines.failover.events import (
    AbortFailover,
    AckAppend,
    AcknowledgeProduce,
    AcquireReservation,
    AppendRecord,
    AssignFailover,
    BeginShutdown,
    ClearFailover,
    CloseFailedStreams,
    CloseStream,
    CloseStreams,
    CommitRecords,
    Crash,
    DetectFence,
    EndGrace,
    ExpireSession,
    FailoverEffect,
    FailoverError,
    FailoverEvent,
    FailoverTransition,
    FenceWal,
    FinishShutdown,
    HaltNode,
    Heartbeat,
    OpenStream,
    PutFailoverContext,
    RecoverFailedWal,
    RecoverOwnWal,
    RemoveFailoverContext,
    ResetWal,
    Restart,
    TrimWal,
    UploadWal,
    WriteWal,
)
from automq_ref.state_machines.failover.invariants import (
    INVARIANTS,
    check_invariants,
    inv_acked_record_durable,
    inv_no_acked_record_lost,
    inv_one_failover_in_flight,
    inv_single_opener_per_epoch,
    inv_zombie_never_acked,
)
from automq_ref.state_machines.failover.state import (
    DEFAULT_PARAMS,
    NO_EPOCH,
    AckEntry,
    Completion,
    FailoverContext,
    FailoverParams,
    FailoverState,
    FailoverTask,
    NodeState,
    Phase,
    Reservation,
    Session,
    Stage,
    StreamInfo,
    StreamState,
    WalEntry,
    initial_state,
)
from automq_ref.state_machines.failover.step import (
    step,
)
from automq_ref.state_machines.failover.table import (
    NO_TASK,
    PHASE_TRANSITIONS,
    SESSION_TRANSITIONS,
    STAGE_TRANSITIONS,
    mermaid_diagrams,
)
from automq_ref.state_machines.failover.tla import (
    tla_state,
)
from automq_ref.state_machines.transition import InvariantViolation, Rejected, Transition

__all__ = [
    "DEFAULT_PARAMS",
    "INVARIANTS",
    "NO_EPOCH",
    "NO_TASK",
    "PHASE_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "STAGE_TRANSITIONS",
    "AbortFailover",
    "AckAppend",
    "AckEntry",
    "AcknowledgeProduce",
    "AcquireReservation",
    "AppendRecord",
    "AssignFailover",
    "BeginShutdown",
    "ClearFailover",
    "CloseFailedStreams",
    "CloseStream",
    "CloseStreams",
    "CommitRecords",
    "Completion",
    "Crash",
    "DetectFence",
    "EndGrace",
    "ExpireSession",
    "FailoverContext",
    "FailoverEffect",
    "FailoverError",
    "FailoverEvent",
    "FailoverParams",
    "FailoverState",
    "FailoverTask",
    "FailoverTransition",
    "FenceWal",
    "FinishShutdown",
    "HaltNode",
    "Heartbeat",
    "InvariantViolation",
    "NodeState",
    "OpenStream",
    "Phase",
    "PutFailoverContext",
    "RecoverFailedWal",
    "RecoverOwnWal",
    "Rejected",
    "RemoveFailoverContext",
    "Reservation",
    "ResetWal",
    "Restart",
    "Session",
    "Stage",
    "StreamInfo",
    "StreamState",
    "Transition",
    "TrimWal",
    "UploadWal",
    "WalEntry",
    "WriteWal",
    "check_invariants",
    "initial_state",
    "inv_acked_record_durable",
    "inv_no_acked_record_lost",
    "inv_one_failover_in_flight",
    "inv_single_opener_per_epoch",
    "inv_zombie_never_acked",
    "mermaid_diagrams",
    "step",
    "tla_state",
]
