"""The driver keeps its contract: one decision at a time, effects in order, advance last, a
failed effect advances nothing, a stale decision is taken again after a refresh."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from automq_ref.io.driver import Driver, Stale, StaleDecisions
from automq_ref.state_machines.transition import Transition


@dataclass(frozen=True)
class Say:
    """An effect: the executor records ``word``."""

    word: str


@dataclass(frozen=True)
class Answer:
    """An effect left to the caller."""

    value: int


def counter(state: int, event: str) -> Transition[int, Say | Answer]:
    """A machine: each event adds one to the state and says the event, then ``after``."""
    return Transition(state + 1, (Say(event), Say("after"), Answer(state + 1)))


def test_effects_run_in_order_before_the_state_advances() -> None:
    seen: list[tuple[str, int]] = []
    driver: Driver[int, str, Say | Answer] = Driver(
        counter, 0, {Say: lambda e: seen.append((e.word, driver.state)), Answer: None}
    )
    driver.apply("a")
    driver.apply("b")
    assert seen == [("a", 0), ("after", 0), ("b", 1), ("after", 1)]
    assert driver.state == 2


def test_an_event_applied_from_an_executor_waits_for_the_transition() -> None:
    seen: list[tuple[str, int]] = []

    def say(effect: Say) -> None:
        seen.append((effect.word, driver.state))
        if effect.word == "a":
            driver.apply("from-a")  # queued: stepped after "a" advanced

    driver: Driver[int, str, Say | Answer] = Driver(counter, 0, {Say: say, Answer: None})
    driver.apply("a")
    assert seen == [("a", 0), ("after", 0), ("from-a", 1), ("after", 1)]
    assert driver.state == 2


def test_a_failed_effect_advances_nothing_and_drops_what_waited() -> None:
    seen: list[str] = []

    def say(effect: Say) -> None:
        seen.append(effect.word)
        if effect.word == "a":
            driver.apply("queued")
        if effect.word == "after":
            raise RuntimeError("disk full")

    driver: Driver[int, str, Say | Answer] = Driver(counter, 0, {Say: say, Answer: None})
    with pytest.raises(RuntimeError, match="disk full"):
        driver.apply("a")
    assert driver.state == 0 and seen == ["a", "after"]
    seen.clear()
    with pytest.raises(RuntimeError):
        driver.apply("b")  # the queued event was dropped, not stepped now
    assert seen == ["b", "after"]


def test_every_effect_needs_an_executor_and_apply_takes_only_synchronous_ones() -> None:
    with pytest.raises(TypeError, match="no executor for Answer"):
        Driver(counter, 0, {Say: lambda e: None}).apply("a")

    async def later(effect: object) -> None:
        pass

    driver: Driver[int, str, Say | Answer] = Driver(counter, 0, {Say: later, Answer: None})
    with pytest.raises(TypeError, match="asynchronous"):
        driver.apply("a")
    assert driver.state == 0


async def test_apply_async_awaits_each_effect_then_advances_and_returns_the_transition() -> None:
    seen: list[tuple[str, int]] = []

    async def say(effect: Say) -> None:
        await asyncio.sleep(0)
        seen.append((effect.word, driver.state))

    driver: Driver[int, str, Say | Answer] = Driver(counter, 0, {Say: say, Answer: None})
    first, second = await asyncio.gather(driver.apply_async("a"), driver.apply_async("b"))
    assert seen == [("a", 0), ("after", 0), ("b", 1), ("after", 1)]  # one at a time, in order
    assert (first.state, second.state, driver.state) == (1, 2, 2)
    assert second.effects[-1] == Answer(2)  # left to the caller, after the advance


async def test_a_stale_decision_is_refreshed_and_taken_again() -> None:
    rival_writes = [10, 20]
    decided_on: list[int] = []

    async def say(effect: Say) -> None:
        if effect.word == "after":
            decided_on.append(driver.state)
            if rival_writes:
                raise Stale

    async def refresh() -> None:
        driver.reset(rival_writes.pop(0))

    driver: Driver[int, str, Say | Answer] = Driver(
        counter, 0, {Say: say, Answer: None}, refresh=refresh, max_decisions=3
    )
    transition = await driver.apply_async("a")
    assert decided_on == [0, 10, 20] and transition.state == driver.state == 21


async def test_decisions_that_stay_stale_give_up() -> None:
    refreshes = 0

    async def stale(effect: Say) -> None:
        raise Stale

    async def refresh() -> None:
        nonlocal refreshes
        refreshes += 1

    driver: Driver[int, str, Say | Answer] = Driver(
        counter, 0, {Say: stale, Answer: None}, refresh=refresh, max_decisions=2
    )
    with pytest.raises(StaleDecisions, match="str: 2 decisions"):
        await driver.apply_async("a")
    assert refreshes == 2 and driver.state == 0


async def test_between_decisions_holds_decisions_off() -> None:
    driver: Driver[int, str, Say | Answer] = Driver(counter, 0, {Say: lambda e: None, Answer: None})
    async with driver.between_decisions() as state:
        pending = asyncio.ensure_future(driver.apply_async("a"))
        await asyncio.sleep(0.01)
        assert not pending.done() and state == driver.state == 0
    await pending
    assert driver.state == 1
