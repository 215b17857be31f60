"""RouteEpochMachine: every TLA+ action of specs/RouteEpoch.tla as a rule on the real step.

Each rule is one action of the spec; its ``@precondition`` is the action's enabling condition,
and the rule draws the action's parameters among the values that enable it. One more rule sends
any event at all and checks that an event the spec would not take leaves the state unchanged.
After every step the spec's invariants are checked (``@invariant``, same names in snake_case),
and ``EpochsNeverDecrease`` between the states before and after. At the end of a run the
machine drains the cluster the way the spec's fairness does (KRaft delivers, requests are
handled, mains report, the controller publishes, crashed nodes are failed over) and checks the
liveness properties: the committed epoch reaches the fenced one and every running proxy trims up
to it. The run is recorded as a TLA+ trace (``self.trace``: Init, then one line per step).

The projections the shell runs (``route_epoch_projections``: the controller's round, a
broker's fence check and report) are checked against the machine at every such step: given
only what a real controller or broker sees, they decide what the machine's step does.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.state_machines import route_epoch as re_
from automq_ref.state_machines import route_epoch_projections as rp
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
    RequestState,
    RestartNode,
    RouteEpochError,
    RouteEpochEvent,
    RouteEpochParams,
    RouteEpochState,
    TraceRecorder,
)

NODES = (1, 2, 3)
PARAMS = RouteEpochParams()  # AutoMQ's gap of 2 and every check on
MAX_EPOCH = 8
MAX_WRITES = 12
MAX_CRASHES = 2
ROOT = Path(__file__).resolve().parents[2]


def enabled(state: RouteEpochState, event: RouteEpochEvent) -> bool:
    return re_.step(state, event, PARAMS).rejection is None


class RouteEpochMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = re_.initial_state(NODES, PARAMS)
        self.trace = TraceRecorder()
        self.trace.init(self.state)

    # ----------------------------------------------------------------------------- helpers

    def apply(self, event: RouteEpochEvent) -> re_.RouteEpochTransition:
        before = self.state
        transition = re_.step(before, event, PARAMS)
        if (refused := transition.rejection) is not None:
            assert transition.state == before and transition.effects == (refused,), transition
        self.state = transition.state
        re_.check_epochs_never_decrease(before, self.state)
        self.trace.record(event, self.state)
        return transition

    def up_nodes(self) -> list[int]:
        return [n for n, node in self.state.nodes.items() if node.up]

    def down_nodes(self) -> list[int]:
        return [n for n, node in self.state.nodes.items() if not node.up]

    def ids_in(self, request_state: RequestState) -> list[int]:
        return [
            i
            for i, r in enumerate(self.state.requests, start=1)
            if r.state is request_state and self.state.nodes[r.main_id].up
        ]

    def learners(self) -> list[int]:
        return [n for n in self.up_nodes() if self.state.nodes[n].view != self.state.controller]

    def controller_views(self) -> list[rp.NodeView]:
        """What a real controller sees of each node."""
        return [
            rp.NodeView(n, node.up, node.open_streams, node.reported)
            for n, node in self.state.nodes.items()
        ]

    def reporters(self) -> list[int]:
        """Up nodes whose waiting epoch is above their last report."""
        found = []
        for node_id in self.up_nodes():
            epoch = re_.node_waiting_epoch(self.state, node_id, PARAMS)
            reported = self.state.nodes[node_id].reported
            if epoch is not None and (reported is None or epoch > reported):
                found.append(node_id)
        return found

    # ------------------------------------------------------------------ rules (TLA+ actions)

    @precondition(lambda self: self.state.controller.route < MAX_EPOCH)
    @rule()
    def bump_route_epoch(self) -> None:
        before = self.state.controller
        decided = rp.controller_round(before, self.controller_views(), bump_due=True)
        self.apply(BumpRouteEpoch())
        after = self.state.controller
        assert after.route == before.route + 1 and after.fenced == before.fenced + 1
        # The controller's projection, on what a real controller sees, decides the same.
        assert decided is not None and decided.record == after

    @precondition(lambda self: enabled(self.state, PublishCommittedEpoch()))
    @rule()
    def publish_committed_epoch(self) -> None:
        before = self.state.controller.committed
        decided = rp.controller_round(
            self.state.controller, self.controller_views(), bump_due=False
        )
        self.apply(PublishCommittedEpoch())
        assert decided is not None and decided.record == self.state.controller
        assert self.state.controller.committed > before
        assert self.state.controller.committed == re_.committed_minimum(self.state.nodes)

    @precondition(lambda self: bool(self.learners()))
    @rule(data=st.data())
    def learn_route_epoch(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.learners()))
        transition = self.apply(LearnRouteEpoch(node_id))
        node = self.state.nodes[node_id]
        assert node.view == self.state.controller
        assert transition.effects == (re_.TrimRouterChannel(node_id, node.trimmed),)

    @precondition(lambda self: len(self.state.requests) < MAX_WRITES and len(self.up_nodes()) >= 1)
    @rule(data=st.data())
    def forward_write(self, data: st.DataObject) -> None:
        proxy_id = data.draw(st.sampled_from(self.up_nodes()))
        main_id = data.draw(st.sampled_from([n for n in NODES if n != proxy_id]))
        self.apply(ForwardWrite(proxy_id, main_id))
        request = self.state.requests[-1]
        assert request.state is RequestState.SENT
        assert request.epoch == self.state.nodes[proxy_id].view.route

    @precondition(lambda self: bool(self.ids_in(RequestState.SENT)))
    @rule(data=st.data())
    def receive_request(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.ids_in(RequestState.SENT)))
        request = self.state.requests[request_id - 1]
        fenced = self.state.nodes[request.main_id].view.fenced
        admitted = rp.admits(self.state.nodes[request.main_id].view, request.epoch)
        transition = self.apply(ReceiveRequest(request_id))
        assert admitted is (self.state.requests[request_id - 1].state is RequestState.ACCEPTED)
        after = self.state.requests[request_id - 1]
        if request.epoch <= fenced:
            assert transition.effects == (
                re_.RespondZoneRouteRequest(request_id, RouteEpochError.ROUTE_EPOCH_FENCED),
            )
            assert after.state is RequestState.REJECTED
        else:
            assert re_.outcome(transition) is RouteEpochError.NONE
            assert after.state is RequestState.ACCEPTED

    @precondition(lambda self: bool(self.ids_in(RequestState.ACCEPTED)))
    @rule(data=st.data())
    def append_link_record(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.ids_in(RequestState.ACCEPTED)))
        self.apply(AppendLinkRecord(request_id))
        assert self.state.requests[request_id - 1].state is RequestState.APPENDED

    @precondition(lambda self: bool(self.reporters()))
    @rule(data=st.data())
    def report_committed_epoch(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.reporters()))
        before = self.state.nodes[node_id]
        in_flight = Counter(
            r.epoch
            for r in self.state.requests
            if r.main_id == node_id and r.state is RequestState.ACCEPTED
        )
        decided = rp.epoch_to_report(before.view, in_flight, before.reported)
        self.apply(ReportCommittedEpoch(node_id))
        node = self.state.nodes[node_id]
        # A broker's projection, on its own view, counts and report, reports the same.
        assert decided == node.reported
        assert node.reported is not None and node.reported <= node.view.fenced
        # The upload came first: nothing this main appended is left outside committed storage.
        assert all(
            r.state is not RequestState.APPENDED
            for r in self.state.requests
            if r.main_id == node_id
        )

    @precondition(lambda self: self.state.crashes < MAX_CRASHES and len(self.up_nodes()) >= 2)
    @rule(data=st.data())
    def crash_node(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.up_nodes()))
        self.apply(CrashNode(node_id))
        assert not self.state.nodes[node_id].up
        assert not self.ids_in(RequestState.ACCEPTED) or all(
            r.main_id != node_id or r.state is not RequestState.ACCEPTED
            for r in self.state.requests
        )

    @precondition(
        lambda self: (
            any(self.state.nodes[n].open_streams for n in self.down_nodes())
            and bool(self.up_nodes())
        )
    )
    @rule(data=st.data())
    def failover_node(self, data: st.DataObject) -> None:
        candidates = [n for n in self.down_nodes() if self.state.nodes[n].open_streams]
        node_id = data.draw(st.sampled_from(candidates))
        self.apply(FailoverNode(node_id))
        assert not self.state.nodes[node_id].open_streams

    @precondition(lambda self: bool(self.down_nodes()))
    @rule(data=st.data())
    def restart_node(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.down_nodes()))
        self.apply(RestartNode(node_id))
        node = self.state.nodes[node_id]
        assert node.up and node.open_streams and node.view == self.state.controller

    @rule(
        kind=st.sampled_from(
            [
                BumpRouteEpoch,
                PublishCommittedEpoch,
                LearnRouteEpoch,
                ForwardWrite,
                ReceiveRequest,
                AppendLinkRecord,
                ReportCommittedEpoch,
                FailoverNode,
                RestartNode,
            ]
        ),
        first=st.integers(min_value=0, max_value=4),
        second=st.integers(min_value=0, max_value=4),
    )
    def any_event(self, kind: type, first: int, second: int) -> None:
        """Any event, enabled or not: a refused one must leave the state as it was."""
        if kind is BumpRouteEpoch and self.state.controller.route >= MAX_EPOCH:
            return
        if kind is ForwardWrite and len(self.state.requests) >= MAX_WRITES:
            return
        event: RouteEpochEvent
        if kind in (BumpRouteEpoch, PublishCommittedEpoch):
            event = kind()
        elif kind is ForwardWrite:
            event = ForwardWrite(first, second)
        else:
            event = kind(first)
        self.apply(event)

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def trim_safe(self) -> None:
        re_.inv_trim_safe(self.state)

    @invariant()
    def no_append_at_or_below_fenced(self) -> None:
        re_.inv_no_append_at_or_below_fenced(self.state)

    @invariant()
    def epochs_ordered(self) -> None:
        re_.inv_epochs_ordered(self.state)

    @invariant()
    def no_rejection_within_one_bump(self) -> None:
        re_.inv_no_rejection_within_one_bump(self.state)

    # ---------------------------------------------------------------- liveness, at the end

    def teardown(self) -> None:
        """Run the fair actions until none is enabled, then check CommittedAdvances and
        ChannelsTrimmed: committed = fenced, and every running proxy is trimmed up to it."""
        for _ in range(1000):
            events: list[RouteEpochEvent] = [PublishCommittedEpoch()]
            events += [LearnRouteEpoch(n) for n in NODES]
            events += [ReceiveRequest(i) for i in range(1, len(self.state.requests) + 1)]
            events += [AppendLinkRecord(i) for i in range(1, len(self.state.requests) + 1)]
            events += [ReportCommittedEpoch(n) for n in NODES]
            events += [FailoverNode(n) for n in NODES]
            ready = [event for event in events if enabled(self.state, event)]
            if not ready:
                break
            self.apply(ready[0])
            re_.check_invariants(self.state)
        else:
            raise AssertionError("the fair actions did not come to rest")
        controller = self.state.controller
        assert controller.committed == controller.fenced, controller
        for node_id in self.up_nodes():
            assert self.state.nodes[node_id].trimmed == controller.committed, node_id
        json.dumps(self.trace.lines)  # the trace is plain JSON


TestRouteEpochMachine = RouteEpochMachine.TestCase
TestRouteEpochMachine.settings = settings(TestRouteEpochMachine.settings, stateful_step_count=40)


# ------------------------------------------------- TLC's counterexamples, replayed in Python


def _run(events: list[RouteEpochEvent], params: RouteEpochParams) -> RouteEpochState:
    state = re_.initial_state((1, 2), params)
    for event in events:
        transition = re_.step(state, event, params)
        assert transition.rejection is None, (event, transition.rejection)
        state = transition.state
    return state


def test_route_epoch_no_wait_earlier_counterexample_trims_in_flight_data() -> None:
    """MCRouteEpochNoWaitEarlier.cfg's trace: node 1 has a slow request of epoch 0 and a finished
    one of epoch 1; AutoMQ's loop reports 1 and node 2 trims the slow request's data."""
    head: list[RouteEpochEvent] = [
        BumpRouteEpoch(),
        ForwardWrite(2, 1),  # epoch 0
        LearnRouteEpoch(2),
        BumpRouteEpoch(),
        BumpRouteEpoch(),
        ForwardWrite(2, 1),  # epoch 1
        LearnRouteEpoch(2),
        ReceiveRequest(1),  # node 1 still fences nothing
        ReceiveRequest(2),
        LearnRouteEpoch(1),  # node 1 now fences epoch 1 and below
        AppendLinkRecord(2),  # request 1 (epoch 0) is still in flight
    ]
    tail: list[RouteEpochEvent] = [
        ReportCommittedEpoch(1),
        ReportCommittedEpoch(2),
        PublishCommittedEpoch(),
        LearnRouteEpoch(2),
    ]
    mutated = RouteEpochParams(wait_earlier_epochs=False)
    state = _run(head + tail, mutated)
    assert state.requests[0].state is RequestState.ACCEPTED
    with pytest.raises(re_.InvariantViolation, match="request 1"):
        re_.inv_trim_safe(state)
    # The protocol's rule reports only epoch -1 for node 1, so the same run trims nothing of it.
    state = _run(head, PARAMS)
    assert re_.node_waiting_epoch(state, 1, PARAMS) == -1
    state = _run(head + tail, PARAMS)
    re_.check_invariants(state)
    assert state.controller.committed == -1


def test_route_epoch_gap_one_rejects_a_proxy_one_bump_behind() -> None:
    """MCRouteEpochGap1Reject.cfg: with the design issue's gap of 1, a main that learned a bump
    before the proxy rejects its write; with AutoMQ's gap of 2 the same write goes through."""
    events: list[RouteEpochEvent] = [
        BumpRouteEpoch(),
        LearnRouteEpoch(2),  # the proxy tags epoch 1
        ForwardWrite(2, 1),
        BumpRouteEpoch(),
        LearnRouteEpoch(1),  # the main knows route 2
        ReceiveRequest(1),
    ]
    gap_one = _run(events, RouteEpochParams(fence_gap=1))
    assert gap_one.requests[0].state is RequestState.REJECTED
    with pytest.raises(re_.InvariantViolation):
        re_.inv_no_rejection_within_one_bump(gap_one)
    re_.check_invariants(gap_one)  # still safe
    gap_two = _run(events, PARAMS)
    assert gap_two.requests[0].state is RequestState.ACCEPTED


def test_route_epoch_trace_starts_with_init_and_names_actions() -> None:
    recorder = TraceRecorder()
    state = re_.initial_state((1, 2))
    recorder.init(state)
    for event in (BumpRouteEpoch(), ForwardWrite(1, 2), CrashNode(2), FailoverNode(2)):
        state = re_.step(state, event).state
        recorder.record(event, state)
    actions = [line["action"] for line in recorder.lines]
    assert actions == ["Init", "BumpRouteEpoch", "ForwardWrite", "CrashNode", "FailoverNode"]
    last = json.loads(json.dumps(recorder.lines[-1]["state"]))
    assert last["reported"] == {"fn": [[{"model": "n1"}, -4], [{"model": "n2"}, -4]]}
    assert last["reqs"]["seq"][0]["record"]["epoch"] == 0
    assert last["openStreams"]["fn"][1] == [{"model": "n2"}, False]


def test_route_epoch_doc_diagram_is_generated_from_the_code() -> None:
    doc = (ROOT / "docs" / "machines" / "route_epoch.md").read_text()
    assert re_.request_state_diagram() in doc
