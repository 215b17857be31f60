"""NetworkLimiterMachine: requests of every priority, refills, withdrawals and a close, with the
limiter's invariants checked after every step.

The test plays the shell: it consumes with fresh request ids, refills by any number of periods,
withdraws waiting requests (a cancelled caller) and, once in a while, closes. Beside the
machine's per-step invariants it keeps what only a whole run shows: the bytes granted to queued
requests against the refills plus the starting balance, each request granted once and whole,
and every request either granted, failed, withdrawn or still waiting at the end.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from automq_ref.state_machines import network_limiter as nl
from automq_ref.state_machines.network_limiter import (
    Close,
    Consume,
    Failed,
    Granted,
    LimiterParams,
    Priority,
    Refill,
    Withdraw,
)

PARAMS = LimiterParams(max_tokens=100, refill_tokens=7, chunk_bytes=16)
SIZES = st.integers(min_value=0, max_value=260)


class NetworkLimiterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = nl.initial_state(PARAMS)
        self.ids = itertools.count()
        self.requested: dict[int, int] = {}
        self.priorities: dict[int, Priority] = {}
        self.grants: list[Granted] = []
        self.failed: set[int] = set()
        self.withdrawn: set[int] = set()
        self.refilled_periods = 0
        self.granted_queued_bytes = 0

    def apply(self, event: nl.LimiterEvent) -> nl.LimiterTransition:
        transition = nl.step(self.state, event, PARAMS)
        nl.check_step(self.state, event, transition, PARAMS)
        if transition.refusal is not None:
            assert transition.state == self.state
        for effect in transition.effects:
            if isinstance(effect, Granted):
                self.grants.append(effect)
                if self.priorities[effect.request_id] is not Priority.BYPASS:
                    self.granted_queued_bytes += effect.size_bytes
            elif isinstance(effect, Failed):
                self.failed.add(effect.request_id)
        self.state = transition.state
        return transition

    @rule(size=SIZES, priority=st.sampled_from(list(Priority)))
    def consume(self, size: int, priority: Priority) -> None:
        request_id = next(self.ids)
        self.requested[request_id] = size
        self.priorities[request_id] = priority
        transition = self.apply(Consume(request_id, size, priority))
        if self.state.closed:
            assert transition.refusal is nl.LimiterError.LIMITER_CLOSED

    @rule(periods=st.integers(min_value=1, max_value=40))
    def refill(self, periods: int) -> None:
        if not self.state.closed:
            self.refilled_periods += periods
        self.apply(Refill(periods))

    @precondition(lambda self: bool(self.state.queue))
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        waiting = data.draw(st.sampled_from(self.state.queue))
        self.withdrawn.add(waiting.request_id)
        self.apply(Withdraw(waiting.request_id))

    @rule(request_id=st.integers(min_value=0, max_value=5))
    def withdraw_what_may_be_gone(self, request_id: int) -> None:
        # A caller that gave up after its grant: nothing changes.
        if self.state.waiting(request_id) is None:
            before = self.state
            transition = self.apply(Withdraw(request_id))
            assert transition.state == before and not transition.effects

    @precondition(lambda self: len(self.requested) > 20)
    @rule()
    def close(self) -> None:
        self.apply(Close())
        assert not self.state.queue

    @invariant()
    def grants_within_refills(self) -> None:
        nl.inv_grants_within_refills(self.granted_queued_bytes, self.refilled_periods, PARAMS)

    @invariant()
    def each_request_granted_once_and_whole(self) -> None:
        nl.inv_granted_once_and_whole(self.requested, self.grants)

    @invariant()
    def every_request_accounted_for(self) -> None:
        granted = {grant.request_id for grant in self.grants}
        waiting = {item.request_id for item in self.state.queue}
        refused = set(self.requested) - granted - waiting - self.failed - self.withdrawn
        # Only consumes after the close are refused, and those were never anything else.
        assert not refused or self.state.closed
        assert not (granted & waiting) and not (granted & self.failed)


TestNetworkLimiterMachine = NetworkLimiterMachine.TestCase


def test_a_refill_serves_the_queue_by_priority_then_arrival() -> None:
    state = nl.LimiterState(tokens=0)
    order = [
        (1, Priority.CATCH_UP),
        (2, Priority.TAIL),
        (3, Priority.COMPACTION),
        (4, Priority.TAIL),
    ]
    for request_id, priority in order:
        transition = nl.step(state, Consume(request_id, 10, priority), PARAMS)
        assert not transition.effects
        state = transition.state
    transition = nl.step(state, Refill(periods=20), PARAMS)
    assert [e.request_id for e in transition.effects if isinstance(e, Granted)] == [3, 2, 4, 1]


def test_bypass_goes_into_debt_down_to_the_maximum_only() -> None:
    state = nl.initial_state(PARAMS)
    transition = nl.step(state, Consume(1, 1000, Priority.BYPASS), PARAMS)
    assert transition.effects == (Granted(1, 1000),)
    assert transition.state.tokens == -PARAMS.max_tokens


def test_a_half_served_request_keeps_its_tokens_when_a_higher_priority_arrives() -> None:
    state = nl.LimiterState(tokens=30)
    state = nl.step(state, Consume(1, 50, Priority.CATCH_UP), PARAMS).state
    assert state.queue[0].granted_bytes == 30 and state.tokens == 0
    state = nl.step(state, Consume(2, 10, Priority.COMPACTION), PARAMS).state
    assert [item.request_id for item in state.queue] == [2, 1]
    transition = nl.step(state, Refill(periods=2), PARAMS)  # 14 tokens: 2's 10, then 4 for 1
    assert transition.effects == (Granted(2, 10),)
    assert transition.state.queue[0].granted_bytes == 34
    # Withdrawn, it gives back what it held, capped at the maximum.
    withdrawn = nl.step(transition.state, Withdraw(1), PARAMS).state
    assert withdrawn.tokens == 34 and not withdrawn.queue


def test_refusals_change_nothing() -> None:
    state = nl.step(nl.LimiterState(tokens=0), Consume(1, 10, Priority.TAIL), PARAMS).state
    refusals = {
        Consume(1, 5, Priority.TAIL): nl.LimiterError.DUPLICATE_REQUEST,
        Consume(2, -1, Priority.TAIL): nl.LimiterError.INVALID_SIZE,
    }
    for event, error in refusals.items():
        transition = nl.step(state, event, PARAMS)
        assert transition.refusal is error and transition.state == state
    closed = nl.step(state, Close(), PARAMS)
    assert closed.effects == (Failed(1, nl.LimiterError.LIMITER_CLOSED),)
    for priority in Priority:
        later = nl.step(closed.state, Consume(3, 1, priority), PARAMS)
        assert later.refusal is nl.LimiterError.LIMITER_CLOSED
