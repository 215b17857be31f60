"""``step``: one event, handled by ``_on_<action>``. A handler either refuses the event (the state
is unchanged, a stutter) or moves the state as the TLA+ action does and lists the effects.
"""

from __future__ import annotations

from dataclasses import replace

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
)
from automq_ref.state_machines.failover.table import (
    _to_phase,
    _to_session,
    _to_stage,
)
from automq_ref.state_machines.transition import Rejected, Transition


def step(
    state: FailoverState, event: FailoverEvent, params: FailoverParams = DEFAULT_PARAMS
) -> FailoverTransition:
    """Apply one event: a refusal returns the state unchanged with a ``Rejected`` effect."""
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


def _reject(state: FailoverState, error: FailoverError) -> FailoverTransition:
    return Transition(state, (Rejected(error),))


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


def _on_heartbeat(state: FailoverState, event: Heartbeat) -> FailoverTransition:
    if (error := _ignore_heartbeat(state, event)) is not None:
        return _reject(state, error)
    node = _to_session(state.nodes[event.node_id], "Heartbeat", Session.ACTIVE)
    return Transition(_with_node(state, event.node_id, node))


def _on_expire_session(state: FailoverState, event: ExpireSession) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if node.session is not Session.ACTIVE:
        return _reject(state, FailoverError.SESSION_NOT_ACTIVE)
    node = _to_session(node, "ExpireSession", Session.FENCED)
    return Transition(_with_node(state, event.node_id, node))


def _on_end_grace(state: FailoverState, event: EndGrace) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if not node.grace:
        return _reject(state, FailoverError.NOT_IN_GRACE)
    return Transition(_with_node(state, event.node_id, replace(node, grace=False)))


# ---------------------------------------------------------------------------- a node's life


def _on_crash(state: FailoverState, event: Crash) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if not node.up:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    return Transition(_with_node(state, event.node_id, _gone(node, "Crash")))


def _on_restart(state: FailoverState, event: Restart) -> FailoverTransition:
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
) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.RECOVERING:
        return _reject(state, FailoverError.NODE_NOT_RECOVERING)
    if not _verified(node, params):
        return _reject(state, FailoverError.WAL_FENCED)
    uploaded = frozenset(e.record for e in node.wal if state.committable(event.node_id, e))
    state = replace(state, committed=state.committed | uploaded)
    state, closing = _close_all_of(state, event.node_id)
    node = replace(_to_phase(node, "RecoverOwnWal", Phase.SERVING), wal=frozenset())
    effects: tuple[FailoverEffect, ...] = (
        CommitRecords(event.node_id, uploaded),
        ResetWal(event.node_id),
        CloseStreams(event.node_id, closing),
    )
    return Transition(_with_node(state, event.node_id, node), effects)


def _on_begin_shutdown(state: FailoverState, event: BeginShutdown) -> FailoverTransition:
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


def _on_finish_shutdown(state: FailoverState, event: FinishShutdown) -> FailoverTransition:
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


def _on_open_stream(
    state: FailoverState, event: OpenStream, params: FailoverParams
) -> FailoverTransition:
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
) -> FailoverTransition:
    if (error := _ignore_close_stream(state, event, params)) is not None:
        return _reject(state, error)
    node = state.nodes[event.node_id]
    stream = state.streams[event.stream_id]
    believed = node.leads[event.stream_id]
    effects: tuple[FailoverEffect, ...] = ()
    owned = stream.owner == event.node_id and stream.epoch == believed
    if stream.state is StreamState.OPENED and owned:
        closed = replace(stream, state=StreamState.CLOSED)
        state = replace(state, streams={**state.streams, event.stream_id: closed})
        effects = (CloseStreams(event.node_id, frozenset({event.stream_id})),)
    # Otherwise STREAM_FENCED from the controller: the node only drops its stale belief.
    leads = {s: e for s, e in node.leads.items() if s != event.stream_id}
    return Transition(_with_node(state, event.node_id, replace(node, leads=leads)), effects)


def _on_append_record(state: FailoverState, event: AppendRecord) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if node.phase is not Phase.SERVING:
        return _reject(state, FailoverError.NODE_NOT_SERVING)
    if event.stream_id not in node.leads:
        return _reject(state, FailoverError.NOT_LEADER_OR_FOLLOWER)
    entry = WalEntry(state.next_record, event.stream_id, node.leads[event.stream_id])
    node = replace(node, wal=node.wal | {entry}, pending=node.pending | {entry})
    state = replace(state, next_record=state.next_record + 1)
    return Transition(_with_node(state, event.node_id, node), (WriteWal(event.node_id, entry),))


def _on_ack_append(
    state: FailoverState, event: AckAppend, params: FailoverParams
) -> FailoverTransition:
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
) -> FailoverTransition:
    node = state.nodes[event.node_id]
    if not params.verify_reservation or not node.up:
        return _reject(state, FailoverError.NODE_NOT_RUNNING)
    if node.reservation == node.own_reservation:
        return _reject(state, FailoverError.WAL_NOT_FENCED)
    if not node.pending and node.phase is not Phase.RECOVERING:
        return _reject(state, FailoverError.NOTHING_TO_VERIFY)
    node = _gone(node, "DetectFence")
    return Transition(_with_node(state, event.node_id, node), (HaltNode(event.node_id),))


def _on_upload_wal(state: FailoverState, event: UploadWal) -> FailoverTransition:
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
) -> FailoverTransition:
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


def _on_fence_wal(state: FailoverState, event: FenceWal) -> FailoverTransition:
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
) -> FailoverTransition:
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


def _on_close_failed_streams(state: FailoverState, event: CloseFailedStreams) -> FailoverTransition:
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
    effects: tuple[FailoverEffect, ...] = (
        CloseStreams(task.failed_node_id, closing),
        *(RemoveFailoverContext(context) for context in sorted(done, key=repr)),
    )
    return Transition(_with_node(state, event.target_node_id, target), effects)


def _on_abort_failover(state: FailoverState, event: AbortFailover) -> FailoverTransition:
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


def _on_clear_failover(state: FailoverState, event: ClearFailover) -> FailoverTransition:
    contexts = [c for c in state.contexts if c.failed_node_id == event.failed_node_id]
    obsolete = [c for c in contexts if _context_obsolete(state, c)]
    if not obsolete:
        error = FailoverError.CONTEXT_STILL_NEEDED if contexts else FailoverError.NO_FAILOVER_TASK
        return _reject(state, error)
    (context,) = obsolete  # at most one context per failed node
    state = replace(state, contexts=state.contexts - {context})
    return Transition(state, (RemoveFailoverContext(context),))
