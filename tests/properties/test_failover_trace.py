"""Trace validation of Failover: runs of the Python machine are behaviours of the TLA+ spec.

Events go through the real ``step``; each run is recorded as a trace (``tla_state`` after every
event, labelled with the event's class name, which is its TLA+ action; a refused event is a
stutter), and TLC checks, through specs/trace_validate.py, that some behaviour of
specs/Failover.tla produces exactly those states with exactly those actions. Every variable is
observed but the model's bounds ``crashes`` and ``perturbed``, which TLC computes. A scripted
scenario, the runs of a few hypothesis examples of ``FailoverMachine`` and two broken traces, each
of which must be rejected at the line that breaks it, go to TLC in one batch (one JVM start); a
second run checks the run of the machine without the reservation check against the spec with the
same mutation. docs/trace_validation.md explains the method and the mapping.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from automq_ref.state_machines import failover as fo
from automq_ref.state_machines.failover import (
    AckAppend,
    AppendRecord,
    AssignFailover,
    BeginShutdown,
    CloseFailedStreams,
    CloseStream,
    Crash,
    DetectFence,
    EndGrace,
    ExpireSession,
    FailoverError,
    FailoverEvent,
    FailoverParams,
    FailoverState,
    FenceWal,
    FinishShutdown,
    Heartbeat,
    OpenStream,
    RecoverFailedWal,
    RecoverOwnWal,
    Restart,
    UploadWal,
)
from tests.properties.test_failover import NODES, STREAMS, FailoverMachine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.properties.trace_batches import (
    Batch,
    TraceRecorder,
    assert_generated_accepted,
    assert_mutation_breaks,
    assert_rejected_where_broken,
    assert_scenario_accepted,
    line_of,
    recorded_runs,
    relabelled,
    trace_lines,
    validate_batch,
)

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

SPEC = "Failover"
E = FailoverError


def Recorder(
    params: FailoverParams = fo.DEFAULT_PARAMS,
) -> TraceRecorder[FailoverState, FailoverEvent]:
    """A recorder of the machine from its initial state over ``NODES`` and ``STREAMS``."""
    return TraceRecorder(
        fo.initial_state(NODES, STREAMS),
        lambda state, event: fo.step(state, event, params),
        fo.tla_state,
    )


# ================================================================================= scenarios


def takeovers() -> list[tv.TraceLine]:
    """Node 1 acknowledges a record and crashes; node 2 fences, recovers and closes its streams
    and reopens the stream; node 1 restarts. Node 3 shuts down gracefully (its close refused until
    it uploaded). Node 2 loses its session while running: node 1 takes it over, node 2's
    append lands in its fenced WAL, is refused, and node 2 halts. Refused requests are
    stutters."""
    r = Recorder()
    r.ok(OpenStream(1, 0), AppendRecord(1, 0), AckAppend(1, 1), OpenStream(3, 1))
    r.refused(OpenStream(2, 0), E.STREAM_NOT_CLOSED)
    r.ok(Crash(1))
    r.refused(AssignFailover(1, 2), E.NOT_A_CANDIDATE)  # its session is still ACTIVE
    r.ok(ExpireSession(1), AssignFailover(1, 2), FenceWal(2), RecoverFailedWal(2))
    r.ok(CloseFailedStreams(2), OpenStream(2, 0))
    r.ok(Restart(1), RecoverOwnWal(1), Heartbeat(1), EndGrace(1))
    r.ok(AppendRecord(3, 1), AckAppend(3, 2), BeginShutdown(3))
    r.refused(CloseStream(3, 1), E.RECORDS_NOT_UPLOADED)
    r.ok(UploadWal(3), CloseStream(3, 1), FinishShutdown(3))
    r.ok(ExpireSession(2), AssignFailover(2, 1), FenceWal(1), RecoverFailedWal(1))
    r.ok(AppendRecord(2, 0))
    r.refused(AckAppend(2, 3), E.WAL_FENCED)
    r.ok(DetectFence(2), CloseFailedStreams(1), OpenStream(1, 0))
    r.refused(Heartbeat(3), E.NODE_NOT_RUNNING)
    return r.lines


def zombie_acked() -> list[tv.TraceLine]:
    """MCFailoverNoVerify.cfg's counterexample on the machine with that mutation: node 1 loses
    its session, node 2 fences and reads its WAL, and node 1 acknowledges a record it appended
    to the fenced WAL (the writer does not verify its reservation)."""
    r = Recorder(FailoverParams(verify_reservation=False))
    r.ok(OpenStream(1, 0), ExpireSession(1), AssignFailover(1, 2), FenceWal(2))
    r.ok(RecoverFailedWal(2), AppendRecord(1, 0), AckAppend(1, 1))
    with pytest.raises(fo.InvariantViolation):
        fo.inv_zombie_never_acked(r.state)
    return r.lines


# ============================================================================ broken traces


def broken_cases() -> dict[str, tuple[list[tv.TraceLine], int]]:
    """Name -> (a broken trace, the line where it must be rejected)."""
    good = takeovers()
    fence = line_of(good, "FenceWal")
    zombie = zombie_acked()
    return {
        # The target's fencing of the failed node's WAL reported as its recovery.
        "relabelled": (relabelled(good, fence, "RecoverFailedWal"), fence),
        # The zombie's acknowledgement: the protocol's writer refuses it.
        "zombie acked": (zombie, len(zombie)),
    }


def generated_runs(examples: int = 8, steps: int = 30) -> list[list[tv.TraceLine]]:
    """The traces of a few hypothesis runs of the property test's machine, its healing at the
    end included: three nodes, two streams, up to six records and two crashes."""
    return recorded_runs(
        FailoverMachine, lambda run: trace_lines(run.trace), examples=examples, steps=steps
    )


@pytest.fixture(scope="module")
def batch() -> Batch:
    """Every trace of this file but the mutation's, validated in one TLC run."""
    return validate_batch(("takeovers", takeovers()), generated_runs(), broken_cases(), SPEC)


def test_the_scenario_is_a_behaviour_of_the_spec(batch: Batch) -> None:
    assert_scenario_accepted(batch, "takeovers", min_stutters=5)


def test_generated_runs_are_behaviours_of_the_spec(batch: Batch) -> None:
    assert_generated_accepted(batch)


def test_broken_traces_are_rejected_where_they_break(batch: Batch) -> None:
    assert_rejected_where_broken(batch, broken_cases())


def test_the_zombie_ack_is_a_step_of_the_mutated_spec_that_breaks_an_invariant() -> None:
    """With VerifyReservation = FALSE (MCFailoverNoVerify.cfg) every step of the mutated
    machine's run is a step of the spec, and TLC reports ZombieNeverAcked on its last state."""
    assert_mutation_breaks(zombie_acked(), SPEC, {"VerifyReservation": "FALSE"}, "ZombieNeverAcked")
