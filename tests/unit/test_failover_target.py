"""The failover target's projection of the Failover machine (the steps a target takes, in the
machine's order, with their effects) and the recording of real runs (a trace file per process,
merged by metadata log index, replayed through the machine)."""

from __future__ import annotations

from pathlib import Path

from automq_ref.io.metadata import failover_trace as ft
from automq_ref.state_machines import failover as fo
from automq_ref.state_machines.failover import FailoverContext, FailoverError, Reservation
from automq_ref.state_machines.failover.target import StepRefused, TargetStep, next_step, start_task

CONTEXT = FailoverContext(failed_node_id=1, node_epoch=5, target_node_id=2)


def taken(view: object) -> TargetStep:
    assert isinstance(view, TargetStep), view
    return view


def test_the_target_fences_then_recovers_then_closes() -> None:
    fence = taken(next_step(start_task(2, CONTEXT, 5)))
    assert fence.event == fo.FenceWal(2) and not fence.done
    assert fence.effects == (fo.AcquireReservation(1, Reservation(5, True)),)
    recover = taken(next_step(fence.view))
    assert recover.event == fo.RecoverFailedWal(2)
    assert recover.effects == (fo.CommitRecords(1, frozenset()), fo.ResetWal(1))
    close = taken(next_step(recover.view.with_opened(frozenset({10, 11}))))
    assert close.event == fo.CloseFailedStreams(2) and close.done
    assert close.effects == (
        fo.CloseStreams(1, frozenset({10, 11})),
        fo.RemoveFailoverContext(CONTEXT),
    )


def test_the_target_aborts_once_the_failed_node_runs_a_newer_epoch() -> None:
    for view in (
        start_task(2, CONTEXT, 6),  # restarted before the fence
        taken(next_step(start_task(2, CONTEXT, 5))).view.with_failed_epoch(6),  # after it
    ):
        abort = taken(next_step(view))
        assert abort.event == fo.AbortFailover(2) and abort.done and abort.effects == ()


def test_a_task_with_no_step_left_is_refused() -> None:
    # A broker named as its own target: the machine lets it take no step.
    refused = next_step(start_task(1, FailoverContext(1, 5, 1), 5))
    assert isinstance(refused, StepRefused)
    assert [name for name, _ in refused.refusals] == [
        "AbortFailover",
        "FenceWal",
        "RecoverFailedWal",
        "CloseFailedStreams",
    ]


def test_steps_are_merged_by_index_committed_before_local(tmp_path: Path) -> None:
    index = [0]
    one = ft.FailoverTrace(tmp_path, "node1", lambda: index[0])
    two = ft.FailoverTrace(tmp_path, "node2", lambda: index[0])
    index[0] = 3
    two.record(fo.FenceWal(2))  # local, after index 3
    one.record(fo.Crash(1))  # local, after index 3: concurrent with the fence
    index[0] = 4
    one.record(fo.AssignFailover(1, 2), committed=True, index=3)  # committed at 3
    two.record(fo.CloseFailedStreams(2))
    steps = ft.merge(ft.read_steps(tmp_path))
    assert [s.event for s in steps] == [
        fo.AssignFailover(1, 2),
        fo.Crash(1),
        fo.FenceWal(2),
        fo.CloseFailedStreams(2),
    ]
    assert ft.RecordedStep.from_json(steps[0].to_json()) == steps[0]


def test_sessions_are_recorded_when_they_change(tmp_path: Path) -> None:
    trace = ft.FailoverTrace(tmp_path, "controller", lambda: 7)
    active, fenced = fo.Session.ACTIVE, fo.Session.FENCED
    trace.observe_sessions([(1, active), (2, active)])
    trace.observe_sessions([(1, fenced), (2, active)])
    trace.observe_sessions([(1, fenced), (2, active)])
    trace.observe_sessions([(1, active)])
    events = [s.event for s in ft.merge(ft.read_steps(tmp_path))]
    assert events == [fo.ExpireSession(1), fo.Heartbeat(1)]


def test_the_end_of_a_grace_is_recorded(tmp_path: Path) -> None:
    trace = ft.FailoverTrace(tmp_path, "controller", lambda: 7)
    trace.observe_grace([(1, False), (2, True)])
    trace.observe_grace([(1, False), (2, True)])
    trace.observe_grace([(1, True), (2, False)])
    events = [s.event for s in ft.merge(ft.read_steps(tmp_path))]
    assert events == [fo.EndGrace(2)]


def test_recording_is_off_without_a_directory() -> None:
    assert ft.open_trace(None, "node1", lambda: 0) is None
    assert ft.open_trace("", "node1", lambda: 0) is None


def test_a_replay_reports_what_the_machine_refused() -> None:
    replayed = ft.replay(
        [fo.OpenStream(1, 0), fo.CloseFailedStreams(2), fo.Crash(1), fo.ExpireSession(1)]
    )
    assert [(n, error) for n, _, error in replayed.refused] == [(2, FailoverError.NO_FAILOVER_TASK)]
    assert len(replayed.states) == 5
    assert replayed.states[-1].candidate(1)
    lines = ft.tla_lines(replayed)
    assert [action for action, _ in lines][:2] == ["Init", "OpenStream"]


def test_a_close_the_machine_did_not_make_is_a_mismatch() -> None:
    def step(
        seq: int, event: fo.FailoverEvent, closed: frozenset[int] | None = None
    ) -> ft.RecordedStep:
        return ft.RecordedStep("p", seq, seq, True, event, closed)

    opened = [step(1, fo.OpenStream(1, 0)), step(2, fo.OpenStream(1, 1)), step(3, fo.Crash(1))]
    takeover = [
        step(4, fo.ExpireSession(1)),
        step(5, fo.AssignFailover(1, 2)),
        step(6, fo.FenceWal(2)),
        step(7, fo.RecoverFailedWal(2)),
    ]
    for closed, mismatches in ((frozenset({0, 1}), 0), (frozenset({0}), 1)):
        steps = [*opened, *takeover, step(8, fo.CloseFailedStreams(2), closed)]
        replayed = ft.replay([s.event for s in steps])
        assert replayed.refused == ()
        assert len(ft.effect_mismatches(steps, replayed)) == mismatches
