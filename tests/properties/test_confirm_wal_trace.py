"""Trace validation of ConfirmWal: runs of the Python machine are behaviours of the TLA+ spec.

Events go through the real ``step``; each run is recorded as a trace (``tla_state`` after every
event, labelled with the event's class name, which is its TLA+ action; a refused event is a
stutter), and TLC checks, through specs/trace_validate.py, that some behaviour of
specs/ConfirmWal.tla produces exactly those states with exactly those actions. Every variable of
the spec is observed (``lostFrom``, the spec's history variable, is kept by the machine too), so
TLC follows one state per line. A scripted scenario, the runs of a few hypothesis examples of
``ConfirmWalMachine`` and three broken traces, each of which must be rejected at the line that
breaks it, go to TLC in one batch (one JVM start); a second run checks a link resolved through
the wrong channel against the spec's ``ResolveViaSource`` mutation. docs/trace_validation.md
explains the method and the mapping.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from automq_ref.state_machines import confirm_wal as cw
from automq_ref.state_machines.confirm_wal import (
    AdvanceConfirm,
    AppendDirect,
    AppendLink,
    AppendMeta,
    ApplySnapshot,
    ConfirmWalError,
    ConfirmWalEvent,
    ConfirmWalState,
    Poll,
    PollAnswer,
    Produce,
    ReceiveAnswer,
    ReplayDuplicate,
    ReplayRecord,
    ResolveLink,
    RestartMain,
    ServeRead,
)
from tests.properties.test_confirm_wal import SOURCES, ConfirmWalMachine

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

SPEC = "ConfirmWal"
E = ConfirmWalError


def Recorder() -> TraceRecorder[ConfirmWalState, ConfirmWalEvent]:
    """A recorder of the machine from its initial state over ``SOURCES``."""
    return TraceRecorder(cw.initial_state(SOURCES), cw.step, cw.tla_state)


# ================================================================================= scenarios


def replay_and_restart() -> list[tv.TraceLine]:
    """Source 2's produce is linked, an index record and a direct produce follow; the proxy
    takes a fresh and a stale answer, replays (one record twice), resolves the link through
    source 2's channel, applies the snapshot and serves it. The main links source 1's produce
    and crashes before it is durable; the restarted main links it again at the offset the lost
    direct produce had, and the proxy serves that. Refused events are stutters, and so are a
    duplicate replay, a poll whose answer was sent already and a restart with nothing to lose."""
    r = Recorder()
    r.ok(Produce(1, b"a"), Produce(2, b"b"), AppendLink(2, 0, 5))
    r.refused(AppendLink(2, 0), E.ALREADY_LINKED)
    r.refused(AppendLink(1, 3), E.CHANNEL_OFFSET_OUT_OF_RANGE)
    r.ok(AppendMeta("time index"), AppendDirect(b"c", 6), Poll(), AdvanceConfirm(2), Poll())
    durable = PollAnswer(wal_end=2, partition_end=1)
    r.ok(ReceiveAnswer(durable))
    r.refused(ReceiveAnswer(PollAnswer(0, 0)), E.STALE_ANSWER)
    r.refused(ReceiveAnswer(PollAnswer(3, 2)), E.UNKNOWN_ANSWER)  # past the confirm offset
    r.ok(ReplayRecord())
    r.refused(ApplySnapshot(), E.REPLAY_INCOMPLETE)  # the replay is behind
    r.ok(ReplayRecord())  # the index record: the cache is unchanged
    r.refused(ReplayRecord(), E.NOTHING_TO_REPLAY)
    r.ok(ReplayDuplicate(0))
    r.refused(ApplySnapshot(), E.REPLAY_INCOMPLETE)  # a link is not resolved
    r.ok(ResolveLink(0), ReplayDuplicate(0), ApplySnapshot(), ServeRead(0))
    r.refused(ServeRead(1), E.OFFSET_OUT_OF_RANGE)
    r.ok(Poll())  # the same answer again
    r.ok(AppendLink(1, 0, 7), RestartMain())  # the direct produce and the link are lost
    r.ok(RestartMain())  # nothing to lose
    r.ok(AppendLink(1, 0, 8), AdvanceConfirm(3), Poll(), ReceiveAnswer(PollAnswer(3, 2)))
    r.ok(ReplayRecord(), ResolveLink(1), ApplySnapshot(), ServeRead(1), ServeRead(0))
    r.refused(Produce(7, b"x"), E.UNKNOWN_SOURCE)
    assert r.state.main.lost_from == 1 and r.state.main.restarts == 1
    return r.lines


# ============================================================================ broken traces


def resolved_locally() -> list[tv.TraceLine]:
    """The scenario up to its first ResolveLink, whose link of source 2's channel offset 0 is
    read from the reading proxy's own channel (source 1's produce 1 instead of produce 2), as a
    proxy that ignores sourceNodeId would; the forged trace ends there."""
    good = replay_and_restart()
    resolve = line_of(good, "ResolveLink")
    cache = good[resolve - 1].state["cache"]
    assert cache == {
        "fn": [[0, {"record": {"kind": "DATA", "src": {"model": "n2"}, "ch": 0, "prod": 2}}]]
    }
    wrong = {"fn": [[0, {"record": {"kind": "DATA", "src": {"model": "n2"}, "ch": 0, "prod": 1}}]]}
    return changed(good, resolve, "cache", wrong)[:resolve]


def broken_cases() -> dict[str, tuple[list[tv.TraceLine], int]]:
    """Name -> (a broken trace, the line where it must be rejected)."""
    good = replay_and_restart()
    first_poll = line_of(good, "Poll", 2)  # the answer after AdvanceConfirm(2)
    apply = line_of(good, "ApplySnapshot")
    local = resolved_locally()
    return {
        # The main answers with its WAL end (3 records), not its confirm offset (2).
        "answer past confirm": (
            changed(
                good,
                first_poll,
                "answers",
                {"set": [{"record": {"walEnd": w, "partEnd": p}} for w, p in ((0, 0), (3, 2))]},
            ),
            first_poll,
        ),
        # The snapshot applied, reported as a read.
        "relabelled": (relabelled(good, apply, "ServeRead"), apply),
        # The link resolved through the wrong channel.
        "resolved locally": (local, len(local)),
    }


def generated_runs(examples: int = 8, steps: int = 60) -> list[list[tv.TraceLine]]:
    """The traces of a few hypothesis runs of the property test's machine (up to 60 steps): two
    sources, up to eight produces and six WAL records, crashes of the main, stale and duplicated
    answers."""
    return recorded_runs(
        ConfirmWalMachine, lambda run: trace_lines(run.trace), examples=examples, steps=steps
    )


@pytest.fixture(scope="module")
def batch() -> Batch:
    """Every trace of this file but the mutation's, validated in one TLC run."""
    return validate_batch(
        ("replay and restart", replay_and_restart()), generated_runs(), broken_cases(), SPEC
    )


def test_the_scenario_is_a_behaviour_of_the_spec(batch: Batch) -> None:
    assert_scenario_accepted(batch, "replay and restart", min_stutters=10)


def test_generated_runs_are_behaviours_of_the_spec(batch: Batch) -> None:
    assert_generated_accepted(batch)


def test_broken_traces_are_rejected_where_they_break(batch: Batch) -> None:
    assert_rejected_where_broken(batch, broken_cases())


def test_the_local_resolution_is_a_step_of_the_mutated_spec_that_breaks_an_invariant() -> None:
    """With ResolveViaSource = FALSE (MCConfirmWalResolveLocal.cfg; the Reader is source 1) the
    forged resolution is a step of the spec, and TLC reports ResolvedDataMatches on it."""
    assert_mutation_breaks(
        resolved_locally(), SPEC, {"ResolveViaSource": "FALSE"}, "ResolvedDataMatches"
    )
