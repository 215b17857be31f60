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
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

NO_EPOCH: Final = -1  # a stream never opened; a node that holds no epoch of a stream


class Phase(enum.Enum):
    """A node's process, as the node itself would describe it."""

    SERVING = "SERVING"
    DRAINING = "DRAINING"  # graceful shutdown: no new appends, upload, close, stop
    RECOVERING = "RECOVERING"  # restarted: replaying its own WAL before serving
    STOPPED = "STOPPED"  # shut down gracefully
    DOWN = "DOWN"  # crashed or halted


class Session(enum.Enum):
    """The controller's view of a node's heartbeats."""

    ACTIVE = "ACTIVE"
    FENCED = "FENCED"  # the session expired, or the node registered and is not caught up yet
    STOPPED = "STOPPED"  # controlled shutdown done: not a failover candidate


class Stage(enum.Enum):
    """How far a failover target got with its task."""

    ASSIGNED = "ASSIGNED"
    FENCED = "FENCED"
    RECOVERED = "RECOVERED"


class StreamState(enum.Enum):
    CLOSED = "CLOSED"
    OPENED = "OPENED"


class FailoverError(enum.Enum):
    """Why a request is refused. A refusal changes nothing and produces no effect."""

    NONE = "NONE"
    NODE_NOT_RUNNING = "NODE_NOT_RUNNING"
    NODE_NOT_SERVING = "NODE_NOT_SERVING"
    NODE_NOT_DRAINING = "NODE_NOT_DRAINING"
    NODE_NOT_RECOVERING = "NODE_NOT_RECOVERING"
    NODE_NOT_STOPPED = "NODE_NOT_STOPPED"
    SESSION_NOT_ACTIVE = "SESSION_NOT_ACTIVE"
    SESSION_NOT_FENCED = "SESSION_NOT_FENCED"
    NOT_IN_GRACE = "NOT_IN_GRACE"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAMS_STILL_LED = "STREAMS_STILL_LED"
    APPENDS_IN_FLIGHT = "APPENDS_IN_FLIGHT"
    RECORDS_NOT_UPLOADED = "RECORDS_NOT_UPLOADED"
    UNKNOWN_RECORD = "UNKNOWN_RECORD"
    WAL_FENCED = "WAL_FENCED"
    WAL_NOT_FENCED = "WAL_NOT_FENCED"
    NOTHING_TO_UPLOAD = "NOTHING_TO_UPLOAD"
    NOTHING_TO_VERIFY = "NOTHING_TO_VERIFY"
    NOT_A_CANDIDATE = "NOT_A_CANDIDATE"
    FAILOVER_IN_FLIGHT = "FAILOVER_IN_FLIGHT"
    TARGET_NOT_AVAILABLE = "TARGET_NOT_AVAILABLE"
    NO_FAILOVER_TASK = "NO_FAILOVER_TASK"
    WRONG_STAGE = "WRONG_STAGE"
    NODE_EPOCH_EXPIRED = "NODE_EPOCH_EXPIRED"
    NODE_EPOCH_CURRENT = "NODE_EPOCH_CURRENT"
    CONTEXT_STILL_NEEDED = "CONTEXT_STILL_NEEDED"


# ======================================================================================= state


@dataclass(frozen=True, slots=True)
class Reservation:
    """Who may write a node's WAL: the owner at ``epoch``, or a failover target acting for it."""

    epoch: int
    failover: bool


@dataclass(frozen=True, slots=True)
class WalEntry:
    """A record in a WAL, written while its writer believed it led the stream at ``epoch``."""

    record: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class AckEntry:
    """History: a record acknowledged to its producer, by which node at which node epoch."""

    record: int
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int


@dataclass(frozen=True, slots=True)
class FailoverContext:
    """The controller's record of a failover in flight (AutoMQ: KV key ``__a.failover``)."""

    failed_node_id: int
    node_epoch: int
    target_node_id: int


@dataclass(frozen=True, slots=True)
class FailoverTask:
    """A target's own progress on a failover."""

    failed_node_id: int
    node_epoch: int
    stage: Stage
    uploaded: bool = False


@dataclass(frozen=True, slots=True)
class Completion:
    """History: a failover that closed the failed node's streams."""

    failed_node_id: int
    node_epoch: int
    uploaded: bool


@dataclass(frozen=True, slots=True)
class NodeState:
    phase: Phase = Phase.SERVING
    node_epoch: int = 0
    session: Session = Session.ACTIVE
    grace: bool = False
    reservation: Reservation = Reservation(0, False)
    wal: frozenset[WalEntry] = frozenset()
    pending: frozenset[WalEntry] = frozenset()
    # stream id -> the stream epoch the node believes it leads the stream at (absent: it does
    # not lead it). Never mutated: handlers build new dicts.
    leads: Mapping[int, int] = field(default_factory=dict)
    task: FailoverTask | None = None

    @property
    def up(self) -> bool:
        return self.phase in (Phase.SERVING, Phase.DRAINING, Phase.RECOVERING)

    @property
    def running(self) -> bool:
        """Recovered and alive: may append, upload and work as a failover target."""
        return self.phase in (Phase.SERVING, Phase.DRAINING)

    @property
    def own_reservation(self) -> Reservation:
        return Reservation(self.node_epoch, False)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    state: StreamState = StreamState.CLOSED
    owner: int | None = None
    epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class FailoverState:
    nodes: Mapping[int, NodeState]
    streams: Mapping[int, StreamInfo]
    next_record: int = 1
    acked: frozenset[AckEntry] = frozenset()
    committed: frozenset[int] = frozenset()
    contexts: frozenset[FailoverContext] = frozenset()
    completed: frozenset[Completion] = frozenset()
    zombie_acks: frozenset[int] = frozenset()

    def opened_by(self, node_id: int) -> frozenset[int]:
        return frozenset(
            stream_id
            for stream_id, stream in self.streams.items()
            if stream.state is StreamState.OPENED and stream.owner == node_id
        )

    def committable(self, node_id: int, entry: WalEntry) -> bool:
        """The controller accepts ``entry``, written by ``node_id``, into a commit."""
        stream = self.streams[entry.stream_id]
        return (
            stream.state is StreamState.OPENED
            and stream.owner == node_id
            and stream.epoch == entry.stream_epoch
        )

    def acked_records(self) -> frozenset[int]:
        return frozenset(ack.record for ack in self.acked)

    def candidate(self, node_id: int) -> bool:
        """The controller would fail this node over (given a free slot and a target)."""
        node = self.nodes[node_id]
        return node.session is Session.FENCED and not node.grace and bool(self.opened_by(node_id))


def initial_state(node_ids: Iterable[int], stream_ids: Iterable[int]) -> FailoverState:
    """Every node SERVING with an ACTIVE session at epoch 0; every stream CLOSED, never opened."""
    return FailoverState(
        nodes={node_id: NodeState() for node_id in node_ids},
        streams={stream_id: StreamInfo() for stream_id in stream_ids},
    )


# ============================================================================ events (actions)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node_id: int


@dataclass(frozen=True, slots=True)
class ExpireSession:
    node_id: int


@dataclass(frozen=True, slots=True)
class EndGrace:
    node_id: int


@dataclass(frozen=True, slots=True)
class Crash:
    node_id: int


@dataclass(frozen=True, slots=True)
class Restart:
    node_id: int


@dataclass(frozen=True, slots=True)
class RecoverOwnWal:
    node_id: int


@dataclass(frozen=True, slots=True)
class BeginShutdown:
    node_id: int


@dataclass(frozen=True, slots=True)
class FinishShutdown:
    node_id: int


@dataclass(frozen=True, slots=True)
class OpenStream:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class CloseStream:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class AppendRecord:
    node_id: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class AckAppend:
    node_id: int
    record: int


@dataclass(frozen=True, slots=True)
class DetectFence:
    node_id: int


@dataclass(frozen=True, slots=True)
class UploadWal:
    node_id: int


@dataclass(frozen=True, slots=True)
class AssignFailover:
    failed_node_id: int
    target_node_id: int


@dataclass(frozen=True, slots=True)
class FenceWal:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class RecoverFailedWal:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class CloseFailedStreams:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class AbortFailover:
    target_node_id: int


@dataclass(frozen=True, slots=True)
class ClearFailover:
    failed_node_id: int


FailoverEvent: TypeAlias = (
    Heartbeat
    | ExpireSession
    | EndGrace
    | Crash
    | Restart
    | RecoverOwnWal
    | BeginShutdown
    | FinishShutdown
    | OpenStream
    | CloseStream
    | AppendRecord
    | AckAppend
    | DetectFence
    | UploadWal
    | AssignFailover
    | FenceWal
    | RecoverFailedWal
    | CloseFailedStreams
    | AbortFailover
    | ClearFailover
)

# ===================================================================================== effects


@dataclass(frozen=True, slots=True)
class AcquireReservation:
    """Write ``wal_node_id``'s reservation (S3 WAL: PUT the reservation object; block WAL:
    attach the volume and NVMe Reservation Acquire)."""

    wal_node_id: int
    reservation: Reservation


@dataclass(frozen=True, slots=True)
class WriteWal:
    """Append the record to the node's WAL, then verify the reservation; report AckAppend or
    DetectFence."""

    node_id: int
    entry: WalEntry


@dataclass(frozen=True, slots=True)
class AcknowledgeProduce:
    node_id: int
    record: int


@dataclass(frozen=True, slots=True)
class CommitRecords:
    """Upload and commit ``records`` from ``wal_node_id``'s WAL, acting as that node."""

    wal_node_id: int
    records: frozenset[int]


@dataclass(frozen=True, slots=True)
class TrimWal:
    wal_node_id: int
    records: frozenset[int]


@dataclass(frozen=True, slots=True)
class ResetWal:
    wal_node_id: int


@dataclass(frozen=True, slots=True)
class CloseStreams:
    """closeStream for each stream, as ``node_id`` (by itself or by its failover target)."""

    node_id: int
    stream_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class HaltNode:
    node_id: int


@dataclass(frozen=True, slots=True)
class PutFailoverContext:
    context: FailoverContext


@dataclass(frozen=True, slots=True)
class RemoveFailoverContext:
    context: FailoverContext


Effect: TypeAlias = (
    AcquireReservation
    | WriteWal
    | AcknowledgeProduce
    | CommitRecords
    | TrimWal
    | ResetWal
    | CloseStreams
    | HaltNode
    | PutFailoverContext
    | RemoveFailoverContext
)


@dataclass(frozen=True, slots=True)
class Transition:
    state: FailoverState
    effects: tuple[Effect, ...] = ()
    error: FailoverError = FailoverError.NONE

    @property
    def ok(self) -> bool:
        return self.error is FailoverError.NONE


@dataclass(frozen=True, slots=True)
class FailoverParams:
    """The protocol's knobs. The switches are True in the real protocol; a test turns one off
    to show the invariant it protects fails (as the spec's mutation models do)."""

    max_in_flight: int = 1
    fence_before_read: bool = True
    verify_reservation: bool = True
    open_bumps_epoch: bool = True
    upload_before_close: bool = True


DEFAULT_PARAMS: Final = FailoverParams()


# ============================================================================ transition table
# Every change of a node's phase, a session and a failover task's stage, as data: handlers go
# through _to_phase / _to_session / _to_stage, which assert that the change is a row here, and
# docs/machines/failover.md draws its diagrams from these rows (mermaid_diagrams()).

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


class InvariantViolation(AssertionError):
    pass


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


# ======================================================================================== step


def step(
    state: FailoverState, event: FailoverEvent, params: FailoverParams = DEFAULT_PARAMS
) -> Transition:
    """Apply one event: a refusal returns the state unchanged with its error."""
    match event:
        case Heartbeat():
            return _on_heartbeat(state, event)
        case ExpireSession():
            return _on_expire_session(state, event)
        case EndGrace():
            return _on_end_grace(state, event)
        case Crash():
            return _on_crash(state, event)
        case Restart():
            return _on_restart(state, event)
        case RecoverOwnWal():
            return _on_recover_own_wal(state, event, params)
        case BeginShutdown():
            return _on_begin_shutdown(state, event)
        case FinishShutdown():
            return _on_finish_shutdown(state, event)
        case OpenStream():
            return _on_open_stream(state, event, params)
        case CloseStream():
            return _on_close_stream(state, event, params)
        case AppendRecord():
            return _on_append_record(state, event)
        case AckAppend():
            return _on_ack_append(state, event, params)
        case DetectFence():
            return _on_detect_fence(state, event, params)
        case UploadWal():
            return _on_upload_wal(state, event)
        case AssignFailover():
            return _on_assign_failover(state, event, params)
        case FenceWal():
            return _on_fence_wal(state, event)
        case RecoverFailedWal():
            return _on_recover_failed_wal(state, event, params)
        case CloseFailedStreams():
            return _on_close_failed_streams(state, event)
        case AbortFailover():
            return _on_abort_failover(state, event)
        case ClearFailover():
            return _on_clear_failover(state, event)


def _reject(state: FailoverState, error: FailoverError) -> Transition:
    return Transition(state, (), error)


def _with_node(state: FailoverState, node_id: int, node: NodeState) -> FailoverState:
    return replace(state, nodes={**state.nodes, node_id: node})


def _verified(node: NodeState, params: FailoverParams) -> bool:
    """The node still holds its own WAL reservation (a failover target's fences it out); on
    booleans ``a <= b`` reads "a implies b".

    post: implies(params.verify_reservation and node.reservation.failover, not __return__)
    post: __return__ <= (node.reservation.epoch == node.node_epoch or not params.verify_reservation)
    """
    return not params.verify_reservation or node.reservation == node.own_reservation


def _gone(node: NodeState, action: str) -> NodeState:
    """The node's process ends (crash or halt): beliefs, in-flight appends and its task go."""
    node = _to_stage(_to_phase(node, action, Phase.DOWN), action, None)
    return replace(node, leads={}, pending=frozenset())


def _close_all_of(state: FailoverState, node_id: int) -> tuple[FailoverState, frozenset[int]]:
    closing = state.opened_by(node_id)
    streams = {
        stream_id: replace(stream, state=StreamState.CLOSED) if stream_id in closing else stream
        for stream_id, stream in state.streams.items()
    }
    return replace(state, streams=streams), closing


# ----------------------------------------------------------------------- sessions and time


def _ignore_heartbeat(state: FailoverState, event: Heartbeat) -> FailoverError | None:
    node = state.nodes[event.node_id]
    if not node.running:
        return FailoverError.NODE_NOT_RUNNING
    if node.session is not Session.FENCED:
        return FailoverError.SESSION_NOT_FENCED  # on an ACTIVE session: nothing to change
    return None


def _on_heartbeat(state: FailoverState, event: Heartbeat) -> Transition:
    if (error := _ignore_heartbeat(state, event)) is not None:
        return _reject(state, error)
    node = _to_session(state.nodes[event.node_id], "Heartbeat", Session.ACTIVE)
    return Transition(_with_node(state, event.node_id, node))


def _on_expire_session(state: FailoverState, event: ExpireSession) -> Transition:
    node = state.nodes[event.node_id]
    if node.session is not Session.ACTIVE:
        return _reject(state, FailoverError.SESSION_NOT_ACTIVE)
    node = _to_session(node, "ExpireSession", Session.FENCED)
    return Transition(_with_node(state, event.node_id, node))


def _on_end_grace(state: FailoverState, event: EndGrace) -> Transition:
    node = state.nodes[event.node_id]
    if not node.grace:
        return _reject(state, FailoverError.NOT_IN_GRACE)
    return Transition(_with_node(state, event.node_id, replace(node, grace=False)))


# ---------------------------------------------------------------------------- a node's life


def _on_crash(state: FailoverState, event: Crash) -> Transition:
    node = state.nodes[event.node_id]
    if not node.up:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    return Transition(_with_node(state, event.node_id, _gone(node, "Crash")))


def _on_restart(state: FailoverState, event: Restart) -> Transition:
    node = state.nodes[event.node_id]
    if node.phase not in (Phase.DOWN, Phase.STOPPED):
        return _reject(state, FailoverError.NODE_NOT_STOPPED)
    epoch = node.node_epoch + 1
    node = _to_session(_to_phase(node, "Restart", Phase.RECOVERING), "Restart", Session.FENCED)
    node = replace(node, node_epoch=epoch, grace=True, reservation=Reservation(epoch, False))
    effects = (AcquireReservation(event.node_id, node.reservation),)
    return Transition(_with_node(state, event.node_id, node), effects)


def _on_recover_own_wal(
    state: FailoverState, event: RecoverOwnWal, params: FailoverParams
) -> Transition:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.RECOVERING:
        return _reject(state, FailoverError.NODE_NOT_RECOVERING)
    if not _verified(node, params):
        return _reject(state, FailoverError.WAL_FENCED)
    uploaded = frozenset(e.record for e in node.wal if state.committable(event.node_id, e))
    state = replace(state, committed=state.committed | uploaded)
    state, closing = _close_all_of(state, event.node_id)
    node = replace(_to_phase(node, "RecoverOwnWal", Phase.SERVING), wal=frozenset())
    effects: tuple[Effect, ...] = (
        CommitRecords(event.node_id, uploaded),
        ResetWal(event.node_id),
        CloseStreams(event.node_id, closing),
    )
    return Transition(_with_node(state, event.node_id, node), effects)


def _on_begin_shutdown(state: FailoverState, event: BeginShutdown) -> Transition:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.SERVING:
        return _reject(state, FailoverError.NODE_NOT_SERVING)
    node = _to_phase(node, "BeginShutdown", Phase.DRAINING)
    return Transition(_with_node(state, event.node_id, node))


def _ignore_finish_shutdown(node: NodeState) -> FailoverError | None:
    """post: implies(__return__ is None, not node.leads and not node.pending)"""
    if node.phase is not Phase.DRAINING:
        return FailoverError.NODE_NOT_DRAINING
    if node.leads:
        return FailoverError.STREAMS_STILL_LED
    if node.pending:
        return FailoverError.APPENDS_IN_FLIGHT
    return None


def _on_finish_shutdown(state: FailoverState, event: FinishShutdown) -> Transition:
    node = state.nodes[event.node_id]
    if (error := _ignore_finish_shutdown(node)) is not None:
        return _reject(state, error)
    node = _to_phase(node, "FinishShutdown", Phase.STOPPED)
    node = _to_stage(_to_session(node, "FinishShutdown", Session.STOPPED), "FinishShutdown", None)
    return Transition(_with_node(state, event.node_id, node))


# --------------------------------------------------------------------- streams and records


def _new_stream_epoch(stream: StreamInfo, params: FailoverParams) -> int:
    """The epoch an open gives the stream: the next one, unless the epoch bump is turned off.

    post: __return__ >= stream.epoch
    post: implies(params.open_bumps_epoch or stream.epoch == NO_EPOCH, __return__ > stream.epoch)
    """
    if params.open_bumps_epoch or stream.epoch == NO_EPOCH:
        return stream.epoch + 1
    return stream.epoch


def _on_open_stream(state: FailoverState, event: OpenStream, params: FailoverParams) -> Transition:
    node = state.nodes[event.node_id]
    stream = state.streams[event.stream_id]
    if node.phase is not Phase.SERVING:
        return _reject(state, FailoverError.NODE_NOT_SERVING)
    if node.session is not Session.ACTIVE:
        return _reject(state, FailoverError.SESSION_NOT_ACTIVE)
    if stream.state is not StreamState.CLOSED:
        return _reject(state, FailoverError.STREAM_NOT_CLOSED)
    epoch = _new_stream_epoch(stream, params)
    streams = {
        **state.streams,
        event.stream_id: StreamInfo(StreamState.OPENED, event.node_id, epoch),
    }
    node = replace(node, leads={**node.leads, event.stream_id: epoch})
    return Transition(_with_node(replace(state, streams=streams), event.node_id, node))


def _ignore_close_stream(
    state: FailoverState, event: CloseStream, params: FailoverParams
) -> FailoverError | None:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.DRAINING:
        return FailoverError.NODE_NOT_DRAINING
    if event.stream_id not in node.leads:
        return FailoverError.NOT_LEADER_OR_FOLLOWER
    if any(entry.stream_id == event.stream_id for entry in node.pending):
        return FailoverError.APPENDS_IN_FLIGHT
    acked = state.acked_records()
    if params.upload_before_close and any(
        entry.stream_id == event.stream_id
        and entry.record in acked
        and state.committable(event.node_id, entry)
        for entry in node.wal
    ):
        return FailoverError.RECORDS_NOT_UPLOADED
    return None


def _on_close_stream(
    state: FailoverState, event: CloseStream, params: FailoverParams
) -> Transition:
    if (error := _ignore_close_stream(state, event, params)) is not None:
        return _reject(state, error)
    node = state.nodes[event.node_id]
    stream = state.streams[event.stream_id]
    believed = node.leads[event.stream_id]
    effects: tuple[Effect, ...] = ()
    owned = stream.owner == event.node_id and stream.epoch == believed
    if stream.state is StreamState.OPENED and owned:
        closed = replace(stream, state=StreamState.CLOSED)
        state = replace(state, streams={**state.streams, event.stream_id: closed})
        effects = (CloseStreams(event.node_id, frozenset({event.stream_id})),)
    # Otherwise STREAM_FENCED from the controller: the node only drops its stale belief.
    leads = {s: e for s, e in node.leads.items() if s != event.stream_id}
    return Transition(_with_node(state, event.node_id, replace(node, leads=leads)), effects)


def _on_append_record(state: FailoverState, event: AppendRecord) -> Transition:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.SERVING:
        return _reject(state, FailoverError.NODE_NOT_SERVING)
    if event.stream_id not in node.leads:
        return _reject(state, FailoverError.NOT_LEADER_OR_FOLLOWER)
    entry = WalEntry(state.next_record, event.stream_id, node.leads[event.stream_id])
    node = replace(node, wal=node.wal | {entry}, pending=node.pending | {entry})
    state = replace(state, next_record=state.next_record + 1)
    return Transition(_with_node(state, event.node_id, node), (WriteWal(event.node_id, entry),))


def _on_ack_append(state: FailoverState, event: AckAppend, params: FailoverParams) -> Transition:
    node = state.nodes[event.node_id]
    if not node.running:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    entries = [entry for entry in node.pending if entry.record == event.record]
    if not entries:
        return _reject(state, FailoverError.UNKNOWN_RECORD)
    if not _verified(node, params):
        return _reject(state, FailoverError.WAL_FENCED)  # the shell reports DetectFence next
    (entry,) = entries
    ack = AckEntry(
        entry.record, event.node_id, node.node_epoch, entry.stream_id, entry.stream_epoch
    )
    zombie_acks = state.zombie_acks
    if node.reservation != node.own_reservation:
        zombie_acks = zombie_acks | {entry.record}
    state = replace(state, acked=state.acked | {ack}, zombie_acks=zombie_acks)
    node = replace(node, pending=node.pending - {entry})
    effects = (AcknowledgeProduce(event.node_id, entry.record),)
    return Transition(_with_node(state, event.node_id, node), effects)


def _on_detect_fence(
    state: FailoverState, event: DetectFence, params: FailoverParams
) -> Transition:
    node = state.nodes[event.node_id]
    if not params.verify_reservation or not node.up:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    if node.reservation == node.own_reservation:
        return _reject(state, FailoverError.WAL_NOT_FENCED)
    if not node.pending and node.phase is not Phase.RECOVERING:
        return _reject(state, FailoverError.NOTHING_TO_VERIFY)
    node = _gone(node, "DetectFence")
    return Transition(_with_node(state, event.node_id, node), (HaltNode(event.node_id),))


def _on_upload_wal(state: FailoverState, event: UploadWal) -> Transition:
    node = state.nodes[event.node_id]
    if not node.running:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    acked = state.acked_records()
    uploaded = frozenset(
        entry
        for entry in node.wal
        if entry.record in acked and state.committable(event.node_id, entry)
    )
    if not uploaded:
        return _reject(state, FailoverError.NOTHING_TO_UPLOAD)
    records = frozenset(entry.record for entry in uploaded)
    state = replace(state, committed=state.committed | records)
    node = replace(node, wal=node.wal - uploaded)
    effects = (CommitRecords(event.node_id, records), TrimWal(event.node_id, records))
    return Transition(_with_node(state, event.node_id, node), effects)


# -------------------------------------------------------------------------------- failover


def _ignore_assign_failover(
    state: FailoverState, event: AssignFailover, params: FailoverParams
) -> FailoverError | None:
    if not state.candidate(event.failed_node_id):
        return FailoverError.NOT_A_CANDIDATE
    if len(state.contexts) >= params.max_in_flight or any(
        context.failed_node_id == event.failed_node_id for context in state.contexts
    ):
        return FailoverError.FAILOVER_IN_FLIGHT
    target = state.nodes[event.target_node_id]
    if (
        event.target_node_id == event.failed_node_id
        or target.phase is not Phase.SERVING
        or target.session is not Session.ACTIVE
        or target.task is not None
    ):
        return FailoverError.TARGET_NOT_AVAILABLE
    return None


def _on_assign_failover(
    state: FailoverState, event: AssignFailover, params: FailoverParams
) -> Transition:
    if (error := _ignore_assign_failover(state, event, params)) is not None:
        return _reject(state, error)
    epoch = state.nodes[event.failed_node_id].node_epoch
    context = FailoverContext(event.failed_node_id, epoch, event.target_node_id)
    task = FailoverTask(event.failed_node_id, epoch, Stage.ASSIGNED)
    target = _to_stage(state.nodes[event.target_node_id], "AssignFailover", task)
    state = replace(state, contexts=state.contexts | {context})
    return Transition(
        _with_node(state, event.target_node_id, target), (PutFailoverContext(context),)
    )


def _task_of(state: FailoverState, target_node_id: int) -> FailoverTask | FailoverError:
    target = state.nodes[target_node_id]
    if not target.running:
        return FailoverError.NODE_NOT_RUNNING
    if target.task is None:
        return FailoverError.NO_FAILOVER_TASK
    return target.task


def _on_fence_wal(state: FailoverState, event: FenceWal) -> Transition:
    task = _task_of(state, event.target_node_id)
    if isinstance(task, FailoverError):
        return _reject(state, task)
    if task.stage is not Stage.ASSIGNED:
        return _reject(state, FailoverError.WRONG_STAGE)
    failed = state.nodes[task.failed_node_id]
    if failed.reservation.epoch > task.node_epoch:
        return _reject(state, FailoverError.NODE_EPOCH_EXPIRED)  # a newer incarnation holds it
    reservation = Reservation(task.node_epoch, True)
    state = _with_node(state, task.failed_node_id, replace(failed, reservation=reservation))
    target = _to_stage(
        state.nodes[event.target_node_id], "FenceWal", replace(task, stage=Stage.FENCED)
    )
    effects = (AcquireReservation(task.failed_node_id, reservation),)
    return Transition(_with_node(state, event.target_node_id, target), effects)


def _on_recover_failed_wal(
    state: FailoverState, event: RecoverFailedWal, params: FailoverParams
) -> Transition:
    task = _task_of(state, event.target_node_id)
    if isinstance(task, FailoverError):
        return _reject(state, task)
    allowed = (Stage.FENCED,) if params.fence_before_read else (Stage.ASSIGNED, Stage.FENCED)
    if task.stage not in allowed:
        return _reject(state, FailoverError.WRONG_STAGE)
    failed = state.nodes[task.failed_node_id]
    if failed.node_epoch != task.node_epoch:
        return _reject(state, FailoverError.NODE_EPOCH_EXPIRED)
    if task.stage is Stage.FENCED and failed.reservation != Reservation(task.node_epoch, True):
        return _reject(state, FailoverError.WAL_FENCED)
    uploaded = frozenset(
        entry.record for entry in failed.wal if state.committable(task.failed_node_id, entry)
    )
    state = replace(state, committed=state.committed | uploaded)
    state = _with_node(state, task.failed_node_id, replace(failed, wal=frozenset()))
    recovered = replace(task, stage=Stage.RECOVERED, uploaded=bool(uploaded))
    target = _to_stage(state.nodes[event.target_node_id], "RecoverFailedWal", recovered)
    effects = (CommitRecords(task.failed_node_id, uploaded), ResetWal(task.failed_node_id))
    return Transition(_with_node(state, event.target_node_id, target), effects)


def _on_close_failed_streams(state: FailoverState, event: CloseFailedStreams) -> Transition:
    task = _task_of(state, event.target_node_id)
    if isinstance(task, FailoverError):
        return _reject(state, task)
    if task.stage is not Stage.RECOVERED:
        return _reject(state, FailoverError.WRONG_STAGE)
    if state.nodes[task.failed_node_id].node_epoch != task.node_epoch:
        return _reject(state, FailoverError.NODE_EPOCH_EXPIRED)
    state, closing = _close_all_of(state, task.failed_node_id)
    done = frozenset(
        context
        for context in state.contexts
        if context.failed_node_id == task.failed_node_id and context.node_epoch == task.node_epoch
    )
    state = replace(
        state,
        contexts=state.contexts - done,
        completed=state.completed
        | {Completion(task.failed_node_id, task.node_epoch, task.uploaded)},
    )
    target = _to_stage(state.nodes[event.target_node_id], "CloseFailedStreams", None)
    effects: tuple[Effect, ...] = (
        CloseStreams(task.failed_node_id, closing),
        *(RemoveFailoverContext(context) for context in sorted(done, key=repr)),
    )
    return Transition(_with_node(state, event.target_node_id, target), effects)


def _on_abort_failover(state: FailoverState, event: AbortFailover) -> Transition:
    target = state.nodes[event.target_node_id]
    if not target.up:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    if target.task is None:
        return _reject(state, FailoverError.NO_FAILOVER_TASK)
    if state.nodes[target.task.failed_node_id].node_epoch == target.task.node_epoch:
        return _reject(state, FailoverError.NODE_EPOCH_CURRENT)
    target = _to_stage(target, "AbortFailover", None)
    return Transition(_with_node(state, event.target_node_id, target))


def _context_obsolete(state: FailoverState, context: FailoverContext) -> bool:
    failed = state.nodes[context.failed_node_id]
    target = state.nodes[context.target_node_id]
    return (
        failed.session is not Session.FENCED
        or not state.opened_by(context.failed_node_id)
        or failed.node_epoch != context.node_epoch
        or not target.running
        or target.session is not Session.ACTIVE
    )


def _on_clear_failover(state: FailoverState, event: ClearFailover) -> Transition:
    contexts = [c for c in state.contexts if c.failed_node_id == event.failed_node_id]
    obsolete = [c for c in contexts if _context_obsolete(state, c)]
    if not obsolete:
        error = FailoverError.CONTEXT_STILL_NEEDED if contexts else FailoverError.NO_FAILOVER_TASK
        return _reject(state, error)
    (context,) = obsolete  # at most one context per failed node
    state = replace(state, contexts=state.contexts - {context})
    return Transition(state, (RemoveFailoverContext(context),))


# ================================================================================== invariants


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


# ============================================================================ spec variables


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


# ==================================================================================== diagrams


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
