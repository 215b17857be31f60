"""Totality: every NetworkLimiter event kind, in every kind of state, gives a transition that
keeps the invariants, never an exception."""

from __future__ import annotations

import pytest

from automq_ref.state_machines import network_limiter as nl
from automq_ref.state_machines.network_limiter import (
    Close,
    Consume,
    LimiterEvent,
    LimiterParams,
    LimiterState,
    Priority,
    Refill,
    Withdraw,
)

PARAMS = LimiterParams(max_tokens=100, refill_tokens=10, chunk_bytes=16)


def run(state: LimiterState, *events: LimiterEvent) -> LimiterState:
    for event in events:
        transition = nl.step(state, event, PARAMS)
        assert transition.refusal is None, (event, transition.effects)
        state = transition.state
    return state


FULL = nl.initial_state(PARAMS)
IN_DEBT = run(FULL, Consume(1, 170, Priority.BYPASS))
AT_MOST_DEBT = run(FULL, Consume(1, 10_000, Priority.BYPASS))
WAITING = run(IN_DEBT, Consume(2, 40, Priority.CATCH_UP), Consume(3, 5, Priority.COMPACTION))
HALF_SERVED = run(WAITING, Refill(8))  # 3 done, 2 holds 5 of its 40
CLOSED = run(WAITING, Close())

STATES = {
    "full": FULL,
    "in_debt": IN_DEBT,
    "at_most_debt": AT_MOST_DEBT,
    "waiting": WAITING,
    "half_served": HALF_SERVED,
    "closed": CLOSED,
}
EVENTS: dict[str, list[LimiterEvent]] = {
    "Consume": [
        Consume(request_id, size, priority)
        for request_id in (2, 9)  # one that may be waiting, one new
        for size in (-1, 0, 1, 99, 1000)
        for priority in Priority
    ],
    "Refill": [Refill(periods) for periods in (0, 1, 3, 1000)],
    "Withdraw": [Withdraw(request_id) for request_id in (1, 2, 3, 9)],
    "Close": [Close()],
}


def test_the_states_are_what_their_names_say() -> None:
    assert IN_DEBT.tokens == -70 and AT_MOST_DEBT.tokens == -100
    assert [item.request_id for item in WAITING.queue] == [3, 2]
    assert [(item.request_id, item.granted_bytes) for item in HALF_SERVED.queue] == [(2, 5)]
    assert CLOSED.closed and not CLOSED.queue


def test_every_event_class_is_covered() -> None:
    assert {cls.__name__ for cls in LimiterEvent.__args__} == set(EVENTS)


@pytest.mark.parametrize("state_name", sorted(STATES))
@pytest.mark.parametrize("event_name", sorted(EVENTS))
def test_step_is_total(state_name: str, event_name: str) -> None:
    state = STATES[state_name]
    for event in EVENTS[event_name]:
        transition = nl.step(state, event, PARAMS)
        nl.check_step(state, event, transition, PARAMS)
        if transition.refusal is not None:
            assert transition.state == state and len(transition.effects) == 1
        granted = [e for e in transition.effects if isinstance(e, nl.Granted)]
        nl.inv_granted_once_and_whole(
            {**{item.request_id: item.size_bytes for item in state.queue}, **_asked(event)}, granted
        )


def _asked(event: LimiterEvent) -> dict[int, int]:
    return {event.request_id: event.size_bytes} if isinstance(event, Consume) else {}
