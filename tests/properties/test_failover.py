"""FailoverMachine: every TLA+ action of specs/Failover.tla as a rule on the real step.

Each rule fires its action with parameters for which the machine accepts it (the action's
enabling condition is the precondition: "some parameters are accepted"), so runs wander through
crashes, restarts, zombies, graceful shutdowns, failovers and reopenings. ``stray_request`` also
sends requests the machine must refuse, and checks that a refusal changes nothing. After every
step the spec's invariants are checked, and between steps what must only grow (acknowledged and
committed records, node epochs, stream epochs). At the end of a run the cluster is left to heal
(only the controller's and the failover targets' steps, as under the spec's fairness): every node
that is down with open streams must then be taken over, which is the spec's DeadNodeRecovered.

The run is recorded as a trace in the project's format (``Init`` then one line per step, the
state mapped by ``failover.tla_state``) so that it can be checked against the spec.

Scripted scenarios below replay the spec's must-fail models: the reachability ones with the real
protocol, the mutations with a switch of ``FailoverParams`` turned off, where the invariant the
switch protects must fail.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from automq_ref.state_machines import failover as fo
from automq_ref.state_machines.failover import (
    AbortFailover,
    AckAppend,
    AppendRecord,
    AssignFailover,
    BeginShutdown,
    ClearFailover,
    CloseFailedStreams,
    CloseStream,
    Crash,
    DetectFence,
    EndGrace,
    ExpireSession,
    FailoverEvent,
    FailoverParams,
    FailoverState,
    FenceWal,
    FinishShutdown,
    Heartbeat,
    OpenStream,
    Phase,
    RecoverFailedWal,
    RecoverOwnWal,
    Restart,
    Session,
    StreamState,
    UploadWal,
)

ROOT = Path(__file__).resolve().parents[2]
NODES = (1, 2, 3)
STREAMS = (0, 1)
MAX_RECORDS = 6
MAX_NODE_EPOCH = 2
MAX_CRASHES = 2
HEAL_STEPS_MAX = 200

TraceLine = dict[str, object]


def candidates(state: FailoverState, action: str) -> list[FailoverEvent]:
    """Every event of ``action`` with every parameter (the spec's Next, one disjunct)."""
    match action:
        case "OpenStream":
            return [OpenStream(n, s) for n in NODES for s in STREAMS]
        case "CloseStream":
            return [CloseStream(n, s) for n in NODES for s in STREAMS]
        case "AppendRecord":
            return [AppendRecord(n, s) for n in NODES for s in STREAMS]
        case "AckAppend":
            records = sorted({e.record for node in state.nodes.values() for e in node.pending})
            return [AckAppend(n, r) for n in NODES for r in records]
        case "AssignFailover":
            return [AssignFailover(n, t) for n in NODES for t in NODES if n != t]
        case _:
            return [ACTIONS[action](n) for n in NODES]


ACTIONS: dict[str, Callable[[int], FailoverEvent]] = {
    cls.__name__: cls
    for cls in (
        Heartbeat,
        ExpireSession,
        EndGrace,
        Crash,
        Restart,
        RecoverOwnWal,
        BeginShutdown,
        FinishShutdown,
        DetectFence,
        UploadWal,
        FenceWal,
        RecoverFailedWal,
        CloseFailedStreams,
        AbortFailover,
        ClearFailover,
    )
}
ALL_ACTIONS = (*ACTIONS, "OpenStream", "CloseStream", "AppendRecord", "AckAppend", "AssignFailover")


# The controller's and the failover targets' steps, and a node noticing its WAL was fenced: what
# the spec's Fairness keeps taking.  Used to heal the cluster at the end of a run.
HEALING = (
    "ExpireSession",
    "DetectFence",
    "RecoverOwnWal",
    "Heartbeat",
    "EndGrace",
    "ClearFailover",
    "AbortFailover",
    "CloseFailedStreams",
    "RecoverFailedWal",
    "FenceWal",
    "AssignFailover",
)


class FailoverMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = fo.initial_state(NODES, STREAMS)
        self.params = fo.DEFAULT_PARAMS
        self.crashes = 0
        self.trace: list[TraceLine] = [{"action": "Init", "state": fo.tla_state(self.state)}]
        self._enabled_for: FailoverState | None = None
        self._enabled: dict[str, list[FailoverEvent]] = {}

    # ----------------------------------------------------------------------------- helpers

    def enabled(self, action: str) -> list[FailoverEvent]:
        """The events of ``action`` the machine accepts in the current state (cached)."""
        if self._enabled_for is not self.state:
            self._enabled = {}
            self._enabled_for = self.state
        if action not in self._enabled:
            self._enabled[action] = [
                e
                for e in candidates(self.state, action)
                if fo.step(self.state, e, self.params).rejection is None
            ]
        return self._enabled[action]

    def apply(self, event: FailoverEvent) -> fo.FailoverTransition:
        before = self.state
        transition = fo.step(self.state, event, self.params)
        if transition.rejection is None:
            self._check_transition(before, transition.state)
        else:
            refused = (transition.rejection,)
            assert transition.state is before and transition.effects == refused, transition
        self.state = transition.state
        self.trace.append({"action": type(event).__name__, "state": fo.tla_state(self.state)})
        return transition

    def fire(self, data: st.DataObject, action: str) -> fo.FailoverTransition:
        event = data.draw(st.sampled_from(self.enabled(action)), label=action)
        transition = self.apply(event)
        assert transition.rejection is None, (event, transition.refusal)
        return transition

    @staticmethod
    def _check_transition(before: FailoverState, after: FailoverState) -> None:
        assert before.acked <= after.acked
        assert before.committed <= after.committed
        assert before.completed <= after.completed
        for node_id, node in before.nodes.items():
            assert after.nodes[node_id].node_epoch >= node.node_epoch
        for stream_id, stream in before.streams.items():
            assert after.streams[stream_id].epoch >= stream.epoch

    # ------------------------------------------------------------------ rules (TLA+ actions)

    @precondition(lambda self: bool(self.enabled("Heartbeat")))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        self.fire(data, "Heartbeat")

    @precondition(lambda self: bool(self.enabled("ExpireSession")))
    @rule(data=st.data())
    def expire_session(self, data: st.DataObject) -> None:
        self.fire(data, "ExpireSession")

    @precondition(lambda self: bool(self.enabled("EndGrace")))
    @rule(data=st.data())
    def end_grace(self, data: st.DataObject) -> None:
        self.fire(data, "EndGrace")

    @precondition(lambda self: self.crashes < MAX_CRASHES and bool(self.enabled("Crash")))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.fire(data, "Crash")
        self.crashes += 1

    @precondition(
        lambda self: any(
            self.state.nodes[e.node_id].node_epoch < MAX_NODE_EPOCH
            for e in self.enabled("Restart")
            if isinstance(e, Restart)
        )
    )
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        events = [
            e
            for e in self.enabled("Restart")
            if isinstance(e, Restart) and self.state.nodes[e.node_id].node_epoch < MAX_NODE_EPOCH
        ]
        event = data.draw(st.sampled_from(events))
        transition = self.apply(event)
        assert transition.rejection is None
        node = self.state.nodes[event.node_id]
        assert node.reservation == node.own_reservation and node.grace

    @precondition(lambda self: bool(self.enabled("RecoverOwnWal")))
    @rule(data=st.data())
    def recover_own_wal(self, data: st.DataObject) -> None:
        self.fire(data, "RecoverOwnWal")

    @precondition(lambda self: bool(self.enabled("BeginShutdown")))
    @rule(data=st.data())
    def begin_shutdown(self, data: st.DataObject) -> None:
        self.fire(data, "BeginShutdown")

    @precondition(lambda self: bool(self.enabled("FinishShutdown")))
    @rule(data=st.data())
    def finish_shutdown(self, data: st.DataObject) -> None:
        self.fire(data, "FinishShutdown")

    @precondition(lambda self: bool(self.enabled("OpenStream")))
    @rule(data=st.data())
    def open_stream(self, data: st.DataObject) -> None:
        self.fire(data, "OpenStream")

    @precondition(lambda self: bool(self.enabled("CloseStream")))
    @rule(data=st.data())
    def close_stream(self, data: st.DataObject) -> None:
        self.fire(data, "CloseStream")

    @precondition(
        lambda self: self.state.next_record <= MAX_RECORDS and bool(self.enabled("AppendRecord"))
    )
    @rule(data=st.data())
    def append_record(self, data: st.DataObject) -> None:
        transition = self.fire(data, "AppendRecord")
        assert any(isinstance(effect, fo.WriteWal) for effect in transition.effects)

    @precondition(lambda self: bool(self.enabled("AckAppend")))
    @rule(data=st.data())
    def ack_append(self, data: st.DataObject) -> None:
        transition = self.fire(data, "AckAppend")
        assert any(isinstance(effect, fo.AcknowledgeProduce) for effect in transition.effects)

    @precondition(lambda self: bool(self.enabled("DetectFence")))
    @rule(data=st.data())
    def detect_fence(self, data: st.DataObject) -> None:
        self.fire(data, "DetectFence")

    @precondition(lambda self: bool(self.enabled("UploadWal")))
    @rule(data=st.data())
    def upload_wal(self, data: st.DataObject) -> None:
        self.fire(data, "UploadWal")

    @precondition(lambda self: bool(self.enabled("AssignFailover")))
    @rule(data=st.data())
    def assign_failover(self, data: st.DataObject) -> None:
        self.fire(data, "AssignFailover")

    @precondition(lambda self: bool(self.enabled("FenceWal")))
    @rule(data=st.data())
    def fence_wal(self, data: st.DataObject) -> None:
        self.fire(data, "FenceWal")

    @precondition(lambda self: bool(self.enabled("RecoverFailedWal")))
    @rule(data=st.data())
    def recover_failed_wal(self, data: st.DataObject) -> None:
        self.fire(data, "RecoverFailedWal")

    @precondition(lambda self: bool(self.enabled("CloseFailedStreams")))
    @rule(data=st.data())
    def close_failed_streams(self, data: st.DataObject) -> None:
        transition = self.fire(data, "CloseFailedStreams")
        closed = [e for e in transition.effects if isinstance(e, fo.CloseStreams)]
        assert closed and not self.state.opened_by(closed[0].node_id)

    @precondition(lambda self: bool(self.enabled("AbortFailover")))
    @rule(data=st.data())
    def abort_failover(self, data: st.DataObject) -> None:
        self.fire(data, "AbortFailover")

    @precondition(lambda self: bool(self.enabled("ClearFailover")))
    @rule(data=st.data())
    def clear_failover(self, data: st.DataObject) -> None:
        self.fire(data, "ClearFailover")

    @rule(data=st.data())
    def stray_request(self, data: st.DataObject) -> None:
        """Any request at all: one the machine refuses must leave everything as it was (the
        trace records it as a stutter of its action)."""
        action = data.draw(st.sampled_from(ALL_ACTIONS))
        events = candidates(self.state, action)
        if not events:
            return
        event = data.draw(st.sampled_from(events))
        if isinstance(event, Crash) and self.crashes >= MAX_CRASHES:
            return
        if isinstance(event, AppendRecord) and self.state.next_record > MAX_RECORDS:
            return
        if isinstance(event, Restart) and (
            self.state.nodes[event.node_id].node_epoch >= MAX_NODE_EPOCH
        ):
            return
        if self.apply(event).rejection is None and isinstance(event, Crash):
            self.crashes += 1

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def no_acked_record_lost(self) -> None:
        fo.inv_no_acked_record_lost(self.state)

    @invariant()
    def acked_record_durable(self) -> None:
        fo.inv_acked_record_durable(self.state)

    @invariant()
    def zombie_never_acked(self) -> None:
        fo.inv_zombie_never_acked(self.state)

    @invariant()
    def single_opener_per_epoch(self) -> None:
        fo.inv_single_opener_per_epoch(self.state)

    @invariant()
    def one_failover_in_flight(self) -> None:
        fo.inv_one_failover_in_flight(self.state)

    # --------------------------------------------------------------------------- teardown

    def teardown(self) -> None:
        """Heal, then check DeadNodeRecovered and that the trace is in the project's format."""
        for _ in range(HEAL_STEPS_MAX):
            events = [e for action in HEALING for e in self.enabled(action)]
            # Only the sessions of nodes that are gone expire; a live node that merely lost its
            # session is not healed by a failover of it.
            events = [
                e
                for e in events
                if not (isinstance(e, ExpireSession) and self.state.nodes[e.node_id].up)
                and not (isinstance(e, AssignFailover) and self.state.nodes[e.failed_node_id].up)
            ]
            if not events:
                break
            self.apply(events[0])
            fo.check_invariants(self.state)
        else:
            raise AssertionError("the cluster did not settle")
        # With a node left to take the failovers, nothing is left on a node that is down.
        if any(node.phase is Phase.SERVING for node in self.state.nodes.values()):
            for node_id, node in self.state.nodes.items():
                if node.phase is Phase.DOWN:
                    assert not self.state.opened_by(node_id), (node_id, self.state)
        for line in self.trace:
            json.loads(json.dumps(line))


TestFailoverMachine = FailoverMachine.TestCase


# ======================================================================== scripted scenarios


def run(
    events: Sequence[FailoverEvent],
    params: FailoverParams = fo.DEFAULT_PARAMS,
    nodes: Sequence[int] = (1, 2),
    streams: Sequence[int] = (0,),
) -> FailoverState:
    """Apply ``events`` in order; each must be accepted."""
    state = fo.initial_state(nodes, streams)
    for event in events:
        transition = fo.step(state, event, params)
        assert transition.rejection is None, (event, transition.refusal)
        state = transition.state
    return state


def crash_failover(*, fence: bool = True) -> list[FailoverEvent]:
    """Node 1 leads stream 0, acknowledges record 1 and crashes; node 2 takes it over."""
    return [
        OpenStream(1, 0),
        AppendRecord(1, 0),
        AckAppend(1, 1),
        Crash(1),
        ExpireSession(1),
        AssignFailover(1, 2),
        *([FenceWal(2)] if fence else []),
        RecoverFailedWal(2),
        CloseFailedStreams(2),
        OpenStream(2, 0),
    ]


def test_reach_crash_failover_hands_off() -> None:
    """MCFailoverReach.cfg: the whole takeover, and the stream reopens on node 2 at epoch 1."""
    state = run(crash_failover())
    assert state.committed == {1}
    assert state.streams[0] == fo.StreamInfo(StreamState.OPENED, 2, 1)
    assert state.completed == {fo.Completion(1, 0, True)}
    assert state.contexts == frozenset()
    fo.check_invariants(state)


def zombie_scenario(*, fence: bool = True) -> list[FailoverEvent]:
    """Node 1 loses its session but keeps running; node 2 takes it over while node 1 appends
    record 1 between the takeover's read and its close."""
    return [
        OpenStream(1, 0),
        ExpireSession(1),
        AssignFailover(1, 2),
        *([FenceWal(2)] if fence else []),
        RecoverFailedWal(2),
        AppendRecord(1, 0),
    ]


def test_reach_zombie_is_refused_and_halts() -> None:
    """MCFailoverReachZombie.cfg: the zombie's append lands in its fenced WAL, is refused, and
    the zombie halts; its record is never acknowledged."""
    state = run([*zombie_scenario(), CloseFailedStreams(2), OpenStream(2, 0)])
    refused = fo.step(state, AckAppend(1, 1))
    assert refused.refusal is fo.FailoverError.WAL_FENCED and refused.state is state
    halted = fo.step(state, DetectFence(1))
    assert halted.rejection is None and halted.state.nodes[1].phase is Phase.DOWN
    fo.check_invariants(halted.state)


def test_reach_graceful_shutdown_hands_off() -> None:
    """MCFailoverReachShutdown.cfg: upload, close, stop; the stream reopens elsewhere."""
    state = run(
        [
            OpenStream(1, 0),
            AppendRecord(1, 0),
            AckAppend(1, 1),
            BeginShutdown(1),
            UploadWal(1),
            CloseStream(1, 0),
            FinishShutdown(1),
            OpenStream(2, 0),
        ]
    )
    assert state.committed == {1} and state.nodes[1].session is Session.STOPPED
    fo.check_invariants(state)


def test_close_refuses_until_uploaded() -> None:
    state = run([OpenStream(1, 0), AppendRecord(1, 0), AckAppend(1, 1), BeginShutdown(1)])
    assert fo.step(state, CloseStream(1, 0)).refusal is fo.FailoverError.RECORDS_NOT_UPLOADED


def test_grace_holds_off_failover_of_a_restarted_node() -> None:
    state = run([OpenStream(1, 0), Crash(1), Restart(1)])
    assert fo.step(state, AssignFailover(1, 2)).refusal is fo.FailoverError.NOT_A_CANDIDATE
    state = run([OpenStream(1, 0), Crash(1), Restart(1), EndGrace(1)])
    assert fo.step(state, AssignFailover(1, 2)).rejection is None


def test_restart_during_failover_aborts_the_task() -> None:
    state = run([OpenStream(1, 0), Crash(1), ExpireSession(1), AssignFailover(1, 2), FenceWal(2)])
    restarted = fo.step(state, Restart(1)).state
    assert fo.step(restarted, RecoverFailedWal(2)).refusal is fo.FailoverError.NODE_EPOCH_EXPIRED
    aborted = fo.step(restarted, AbortFailover(2))
    assert aborted.rejection is None and aborted.state.nodes[2].task is None
    recovered = fo.step(aborted.state, RecoverOwnWal(1))
    assert recovered.rejection is None and not recovered.state.opened_by(1)


@pytest.mark.parametrize(
    ("params", "events", "violated"),
    [
        pytest.param(
            FailoverParams(fence_before_read=False),
            [*zombie_scenario(fence=False), AckAppend(1, 1), CloseFailedStreams(2)],
            fo.inv_no_acked_record_lost,
            id="MCFailoverNoFence",
        ),
        pytest.param(
            FailoverParams(verify_reservation=False),
            [*zombie_scenario(), AckAppend(1, 1)],
            fo.inv_zombie_never_acked,
            id="MCFailoverNoVerify",
        ),
        pytest.param(
            FailoverParams(verify_reservation=False),
            [*zombie_scenario(), AckAppend(1, 1), CloseFailedStreams(2)],
            fo.inv_no_acked_record_lost,
            id="MCFailoverNoVerifyLost",
        ),
        pytest.param(
            FailoverParams(verify_reservation=False),
            [
                *zombie_scenario(),
                AckAppend(1, 1),
                Crash(1),
                CloseFailedStreams(2),
                Restart(1),
                RecoverOwnWal(1),
            ],
            fo.inv_acked_record_durable,
            id="MCFailoverNoVerifyDurable",
        ),
        pytest.param(
            FailoverParams(open_bumps_epoch=False),
            [
                OpenStream(1, 0),
                ExpireSession(1),
                AssignFailover(1, 2),
                FenceWal(2),
                RecoverFailedWal(2),
                CloseFailedStreams(2),
                OpenStream(2, 0),
            ],
            fo.inv_single_opener_per_epoch,
            id="MCFailoverNoEpochBump",
        ),
        pytest.param(
            FailoverParams(upload_before_close=False),
            [
                OpenStream(1, 0),
                AppendRecord(1, 0),
                AckAppend(1, 1),
                BeginShutdown(1),
                CloseStream(1, 0),
            ],
            fo.inv_no_acked_record_lost,
            id="MCFailoverNoUploadBeforeClose",
        ),
    ],
)
def test_mutation_breaks_its_invariant(
    params: FailoverParams,
    events: list[FailoverEvent],
    violated: Callable[[FailoverState], None],
) -> None:
    """The spec's mutation models, replayed: with one safeguard off, its invariant fails; with
    the real protocol the same requests are refused or harmless."""
    with pytest.raises(fo.InvariantViolation):
        violated(run(events, params))
    state = fo.initial_state((1, 2), (0,))
    for event in events:
        state = fo.step(state, event).state
        fo.check_invariants(state)


def test_two_failovers_in_flight_only_when_allowed() -> None:
    """MCFailoverTwoInFlight.cfg: with max_in_flight = 2 two contexts coexist, which
    OneFailoverInFlight forbids; with the real limit the second assignment is refused."""
    events: list[FailoverEvent] = [
        OpenStream(1, 0),
        OpenStream(2, 1),
        ExpireSession(1),
        ExpireSession(2),
        AssignFailover(1, 3),
    ]
    two = FailoverParams(max_in_flight=2)
    state = run([*events, AssignFailover(2, 4)], two, nodes=(1, 2, 3, 4), streams=(0, 1))
    with pytest.raises(fo.InvariantViolation):
        fo.inv_one_failover_in_flight(state)
    state = run(events, nodes=(1, 2, 3, 4), streams=(0, 1))
    refused = fo.step(state, AssignFailover(2, 4))
    assert refused.refusal is fo.FailoverError.FAILOVER_IN_FLIGHT


# ====================================================================== tables, docs, traces


def test_every_table_row_is_taken_by_some_handler() -> None:
    """Each row of the transition tables is an action a handler performs (no dead rows)."""
    actions = {cls.__name__ for cls in fo.FailoverEvent.__args__}
    for table in (fo.PHASE_TRANSITIONS, fo.SESSION_TRANSITIONS, fo.STAGE_TRANSITIONS):
        assert {action for _, action, _ in table} <= actions


def test_docs_diagrams_are_generated_from_the_tables() -> None:
    page = (ROOT / "docs" / "machines" / "failover.md").read_text()
    assert fo.mermaid_diagrams() in page, "regenerate with fo.mermaid_diagrams()"


def test_trace_lines_are_json_in_the_project_format() -> None:
    state = fo.initial_state((1, 2), (0,))
    lines: list[TraceLine] = [{"action": "Init", "state": fo.tla_state(state)}]
    for event in crash_failover():
        state = fo.step(state, event).state
        lines.append({"action": type(event).__name__, "state": fo.tla_state(state)})
    decoded = [json.loads(json.dumps(line)) for line in lines]
    assert [line["action"] for line in decoded][-2:] == ["CloseFailedStreams", "OpenStream"]
    last = decoded[-1]["state"]
    assert last["streamOwner"] == {"fn": [[0, {"model": "n2"}]]}
    assert last["committed"] == {"set": [1]}
    assert set(last) == {
        "phase",
        "nodeEpoch",
        "session",
        "grace",
        "reservation",
        "wal",
        "pending",
        "leads",
        "streamState",
        "streamOwner",
        "streamEpoch",
        "nextRecord",
        "acked",
        "committed",
        "contexts",
        "task",
        "completed",
        "zombieAcks",
    }


def test_two_recoverers_overlap_harmlessly() -> None:
    """A target whose own session expires mid-failover is replaced (ClearFailover, then a new
    AssignFailover) while it keeps working as a zombie: both fence, read, upload and close the
    same node. The random runs rarely meet this; the spec's exhaustive models do not reach it
    (MaxPerturbed = 1), MCFailoverReachOverlap.cfg shows it is reachable."""
    nodes = (1, 2, 3)
    state = run(
        [
            OpenStream(1, 0),
            AppendRecord(1, 0),
            AckAppend(1, 1),
            ExpireSession(1),
            AssignFailover(1, 2),
            FenceWal(2),
            ExpireSession(2),
            ClearFailover(1),
            AssignFailover(1, 3),
            FenceWal(3),
            RecoverFailedWal(3),
            RecoverFailedWal(2),
            CloseFailedStreams(3),
            OpenStream(3, 0),
            CloseFailedStreams(2),
        ],
        nodes=nodes,
    )
    assert state.committed == {1}
    assert state.streams[0] == fo.StreamInfo(StreamState.OPENED, 3, 1)
    assert {c.uploaded for c in state.completed} == {True, False}
    fo.check_invariants(state)
