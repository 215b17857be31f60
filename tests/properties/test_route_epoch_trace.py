"""Trace validation of RouteEpoch: runs of the Python machine are behaviours of the TLA+ spec.

Events go through the real ``step``; each run is recorded as a trace (``tla_state`` after every
event, labelled with the event's class name, which is its TLA+ action; a refused event is a
stutter), and TLC checks, through specs/trace_validate.py, that some behaviour of
specs/RouteEpoch.tla produces exactly those states with exactly those actions. Every variable of
the spec is observed, so TLC follows one state per line. A scripted scenario, the runs of a few
hypothesis examples of ``RouteEpochMachine`` and four broken traces, each of which must be
rejected at the line that breaks it, go to TLC in one batch (one JVM start); a second run checks
the run of the machine with the ``WaitEarlierEpochs`` mutation against the spec with the same
mutation. docs/trace_validation.md explains the method and the mapping.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from automq_ref.state_machines import route_epoch as re_
from automq_ref.state_machines.route_epoch import (
    AppendLinkRecord,
    BumpRouteEpoch,
    CrashNode,
    FailoverNode,
    ForwardWrite,
    LearnRouteEpoch,
    PublishCommittedEpoch,
    ReceiveRequest,
    ReportCommittedEpoch,
    RestartNode,
    RouteEpochError,
    RouteEpochEvent,
    RouteEpochParams,
    RouteEpochState,
)
from tests.properties.test_route_epoch import NODES, RouteEpochMachine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.properties.trace_batches import (
    Batch,
    TraceRecorder,
    assert_generated_accepted,
    assert_mutation_breaks,
    assert_rejected_where_broken,
    assert_scenario_accepted,
    changed,
    line_of,
    recorded_runs,
    relabelled,
    trace_lines,
    validate_batch,
)

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

SPEC = "RouteEpoch"
PARAMS = RouteEpochParams()  # the protocol: AutoMQ's gap of 2, every check on
E = RouteEpochError


def route_outcome(transition: re_.RouteEpochTransition) -> object:
    """A refusal's error or the error a request's answer carries; None when all went well."""
    error = re_.outcome(transition)
    return None if error is E.NONE else error


def Recorder(params: RouteEpochParams = PARAMS) -> TraceRecorder[RouteEpochState, RouteEpochEvent]:
    """A recorder of the machine from its initial state over ``NODES``."""
    return TraceRecorder(
        re_.initial_state(NODES, params),
        lambda state, event: re_.step(state, event, params),
        re_.tla_state,
        route_outcome,
    )


# ================================================================================= scenarios


def lifecycle() -> list[tv.TraceLine]:
    """Three nodes: a write goes the whole way and its channel data is trimmed; a write from a
    proxy two bumps behind is rejected; a main crashes with a Link Record in its WAL and is
    failed over, another with a request in flight (lost); both restart. Refused events (a main
    reporting twice, unknown or running nodes) are stutters."""
    r = Recorder()
    r.ok(ForwardWrite(2, 1), ReceiveRequest(1), AppendLinkRecord(1))  # request 1, epoch 0
    r.ok(BumpRouteEpoch(), BumpRouteEpoch(), LearnRouteEpoch(1))  # node 1 fences epoch 0
    r.ok(ForwardWrite(3, 1))  # request 2: node 3 still tags epoch 0
    r.answers(ReceiveRequest(2), E.ROUTE_EPOCH_FENCED)
    r.ok(ReportCommittedEpoch(1))  # uploads request 1, reports 0
    r.answers(ReportCommittedEpoch(1), E.NOTHING_TO_DO)
    r.ok(LearnRouteEpoch(2), LearnRouteEpoch(3), ReportCommittedEpoch(2), ReportCommittedEpoch(3))
    r.ok(PublishCommittedEpoch())  # committed 0
    r.ok(LearnRouteEpoch(2))  # proxy 2 trims epoch 0: request 1 is in object storage
    r.ok(ForwardWrite(2, 3), ReceiveRequest(3), AppendLinkRecord(3))  # request 3, epoch 2
    r.ok(CrashNode(3))
    r.answers(AppendLinkRecord(3), E.WRONG_REQUEST_STATE)
    r.answers(FailoverNode(1), E.NODE_UP)
    r.ok(FailoverNode(3))  # a survivor uploads request 3; node 3 is no longer counted
    r.answers(FailoverNode(3), E.STREAMS_CLOSED)
    r.ok(BumpRouteEpoch())
    r.ok(ForwardWrite(1, 2), ReceiveRequest(4))  # request 4 in flight at node 2 ...
    r.ok(CrashNode(2))  # ... is lost
    r.answers(CrashNode(7), E.UNKNOWN_NODE)
    r.ok(RestartNode(3), RestartNode(2), LearnRouteEpoch(1), ReportCommittedEpoch(1))
    r.ok(ReportCommittedEpoch(2), ReportCommittedEpoch(3), PublishCommittedEpoch())
    r.ok(LearnRouteEpoch(1), LearnRouteEpoch(2), LearnRouteEpoch(3))
    return r.lines


def no_wait_earlier() -> list[tv.TraceLine]:
    """MCRouteEpochNoWaitEarlier.cfg's counterexample on the machine with that mutation: node 1
    has a slow request of epoch 0 and a finished one of epoch 1, reports 1 (AutoMQ's loop as
    read), and proxy 2 trims the slow request's channel data: the last state breaks TrimSafe."""
    r = Recorder(RouteEpochParams(wait_earlier_epochs=False))
    r.ok(BumpRouteEpoch(), ForwardWrite(2, 1), LearnRouteEpoch(2))  # request 1, epoch 0
    r.ok(BumpRouteEpoch(), BumpRouteEpoch(), ForwardWrite(2, 1), LearnRouteEpoch(2))  # epoch 1
    r.ok(ReceiveRequest(1), ReceiveRequest(2), LearnRouteEpoch(1), AppendLinkRecord(2))
    r.ok(ReportCommittedEpoch(1))  # the mutation reports 1 with epoch 0 in flight
    r.ok(LearnRouteEpoch(3), ReportCommittedEpoch(2), ReportCommittedEpoch(3))
    r.ok(PublishCommittedEpoch(), LearnRouteEpoch(2))
    with pytest.raises(re_.InvariantViolation, match="request 1"):
        re_.inv_trim_safe(r.state)
    return r.lines


# ============================================================================ broken traces


def with_request_state(line: tv.TraceLine, request_id: int, state: str) -> tv.TraceLine:
    """The line with request ``request_id`` (1-based) of ``reqs`` in ``state``."""
    reqs = line.state["reqs"]
    assert isinstance(reqs, dict)
    entries = [dict(entry["record"]) for entry in reqs["seq"]]
    assert entries[request_id - 1]["state"] != state
    entries[request_id - 1]["state"] = state
    return tv.TraceLine(
        line.action, {**line.state, "reqs": {"seq": [{"record": e} for e in entries]}}
    )


def broken_cases() -> dict[str, tuple[list[tv.TraceLine], int]]:
    """Name -> (a broken trace, the line where it must be rejected)."""
    good = lifecycle()
    publish = line_of(good, "PublishCommittedEpoch")
    rejection = line_of(good, "ReceiveRequest", 2)
    mutated = no_wait_earlier()
    return {
        # The controller publishes committed 1 while every report is 0.
        "committed above the reports": (changed(good, publish, "committed", 1), publish),
        # The main accepts the write its fence check rejects (the forged trace ends there).
        "fenced write accepted": (
            [*good[: rejection - 1], with_request_state(good[rejection - 1], 2, "ACCEPTED")],
            rejection,
        ),
        # The rejection reported as a Link Record append.
        "relabelled": (relabelled(good, rejection, "AppendLinkRecord"), rejection),
        # The mutated machine's report: the protocol's waiting epoch is -1 there, not 1.
        "no wait earlier": (mutated, line_of(mutated, "ReportCommittedEpoch")),
    }


def generated_runs(examples: int = 8, steps: int = 40) -> list[list[tv.TraceLine]]:
    """The traces of a few hypothesis runs of the property test's machine, its end-of-run
    drain included: three nodes, at most two crashes, any event (refused ones are stutters)."""
    return recorded_runs(
        RouteEpochMachine, lambda run: trace_lines(run.trace.lines), examples=examples, steps=steps
    )


@pytest.fixture(scope="module")
def batch() -> Batch:
    """Every trace of this file but the mutation's, validated in one TLC run."""
    return validate_batch(("lifecycle", lifecycle()), generated_runs(), broken_cases(), SPEC)


def test_the_scenario_is_a_behaviour_of_the_spec(batch: Batch) -> None:
    assert_scenario_accepted(batch, "lifecycle", min_stutters=5)


def test_generated_runs_are_behaviours_of_the_spec(batch: Batch) -> None:
    assert_generated_accepted(batch)


def test_broken_traces_are_rejected_where_they_break(batch: Batch) -> None:
    assert_rejected_where_broken(batch, broken_cases())


def test_the_mutation_trace_is_a_behaviour_of_the_mutated_spec_that_breaks_trim_safe() -> None:
    """With WaitEarlierEpochs = FALSE (MCRouteEpochNoWaitEarlier.cfg) every step of the mutated
    machine's run is a step of the spec, and TLC reports TrimSafe on its last state."""
    assert_mutation_breaks(no_wait_earlier(), SPEC, {"WaitEarlierEpochs": "FALSE"}, "TrimSafe")
