"""What the trace-validation tests of RouteEpoch, ConfirmWal and Failover share: a recorder that
drives a machine and keeps its trace, recording hypothesis runs as traces, validating named
traces in one TLC run, the edits that break a trace, and the acceptance and rejection checks."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from automq_ref.state_machines.transition import Transition

Batch = dict[str, tuple[list[tv.TraceLine], tv.Verdict]]
S = TypeVar("S")
Ev = TypeVar("Ev")


def refusal_of(transition: Transition[Any, Any]) -> object:
    """How most machines say an event was not taken: the refusal's error, None when taken."""
    return transition.refusal


class TraceRecorder(Generic[S, Ev]):
    """Drives a machine's ``step`` and keeps the trace: the Init line, then one line per event,
    labelled with the event's class name (the TLA+ action's). ``outcome`` says how an event
    ended: None when it was taken, else its error."""

    def __init__(
        self,
        state: S,
        step: Callable[[S, Ev], Transition[S, Any]],
        tla_state: Callable[[S], dict[str, object]],
        outcome: Callable[[Transition[S, Any]], object] = refusal_of,
    ) -> None:
        self.state = state
        self._step = step
        self._tla_state = tla_state
        self._outcome = outcome
        self.lines = [tv.TraceLine("Init", tla_state(state))]

    def apply(self, event: Ev) -> Transition[S, Any]:
        transition = self._step(self.state, event)
        self.state = transition.state
        self.lines.append(tv.TraceLine(type(event).__name__, self._tla_state(self.state)))
        return transition

    def ok(self, *events: Ev) -> None:
        for event in events:
            transition = self.apply(event)
            assert self._outcome(transition) is None, (event, transition.effects)

    def answers(self, event: Ev, error: object) -> Transition[S, Any]:
        """The event ends in ``error`` (a refusal, or an error its answer carries)."""
        transition = self.apply(event)
        assert self._outcome(transition) is error, (event, transition.effects)
        return transition

    def refused(self, event: Ev, error: object) -> None:
        """The event is refused with ``error`` and changes nothing: a stutter."""
        before = self.state
        self.answers(event, error)
        assert self.state == before


def trace_lines(recorded: Sequence[Mapping[str, object]]) -> list[tv.TraceLine]:
    """A property machine's trace (plain dicts) as trace lines."""
    lines = []
    for entry in recorded:
        action, state = entry["action"], entry["state"]
        assert isinstance(action, str) and isinstance(state, dict)
        lines.append(tv.TraceLine(action, state))
    return lines


def recorded_runs(
    machine: type[RuleBasedStateMachine],
    to_lines: Callable[[Any], list[tv.TraceLine]],
    *,
    examples: int,
    steps: int,
) -> list[list[tv.TraceLine]]:
    """The traces of a few hypothesis runs of ``machine``; ``to_lines`` turns a finished
    machine into its trace."""
    traces: list[list[tv.TraceLine]] = []

    class Recorded(machine):  # type: ignore[valid-type, misc]
        def teardown(self) -> None:
            super().teardown()
            traces.append(to_lines(self))

    run_state_machine_as_test(
        Recorded, settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None)
    )
    return traces


def validate_batch(
    scenario: tuple[str, list[tv.TraceLine]],
    generated: Sequence[list[tv.TraceLine]],
    broken: Mapping[str, tuple[list[tv.TraceLine], int]],
    spec: str,
) -> Batch:
    """The scenario, the generated runs and the broken traces, validated in one TLC run."""
    traces = {scenario[0]: scenario[1]}
    traces.update((f"generated {n}", lines) for n, lines in enumerate(generated, start=1))
    traces.update((name, lines) for name, (lines, _) in broken.items())
    verdicts = tv.validate_many(list(traces.values()), spec)
    return {
        name: (lines, verdict)
        for (name, lines), verdict in zip(traces.items(), verdicts, strict=True)
    }


def relabelled(lines: Sequence[tv.TraceLine], number: int, action: str) -> list[tv.TraceLine]:
    """The trace with line ``number`` (1-based) claiming ``action`` instead."""
    broken = list(lines)
    broken[number - 1] = tv.TraceLine(action, lines[number - 1].state)
    return broken


def changed(
    lines: Sequence[tv.TraceLine], number: int, var: str, value: object
) -> list[tv.TraceLine]:
    """The trace with ``var`` set to ``value`` on line ``number`` (1-based)."""
    broken = list(lines)
    line = broken[number - 1]
    broken[number - 1] = tv.TraceLine(line.action, {**line.state, var: value})
    return broken


def line_of(lines: Sequence[tv.TraceLine], action: str, nth: int = 1) -> int:
    """The 1-based number of the nth line labelled ``action`` that changes the state."""
    found = [
        number
        for number in range(2, len(lines) + 1)
        if lines[number - 1].action == action and lines[number - 1].state != lines[number - 2].state
    ]
    return found[nth - 1]


def ndjson(lines: Sequence[tv.TraceLine]) -> str:
    return "".join(line.to_json() + "\n" for line in lines)


def stutters(lines: Sequence[tv.TraceLine]) -> int:
    return sum(a.state == b.state for a, b in itertools.pairwise(lines))


def assert_scenario_accepted(batch: Batch, name: str, min_stutters: int) -> None:
    lines, verdict = batch[name]
    assert stutters(lines) >= min_stutters
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}\n{ndjson(lines)}"
    assert verdict.matched == len(lines)


def assert_generated_accepted(batch: Batch, at_least: int = 8) -> None:
    generated = [(lines, v) for name, (lines, v) in batch.items() if name.startswith("generated")]
    assert len(generated) >= at_least
    rejected = [(lines, v) for lines, v in generated if not v.accepted]
    if rejected:
        lines, verdict = rejected[0]
        pytest.fail(
            f"{len(rejected)} of {len(generated)} rejected; first: {verdict}\n{ndjson(lines)}"
        )


def assert_rejected_where_broken(
    batch: Batch, broken: Mapping[str, tuple[list[tv.TraceLine], int]]
) -> None:
    """Each broken trace matches up to the line before its break, and no further."""
    for name, (_, broken_at) in broken.items():
        lines, verdict = batch[name]
        assert not verdict.accepted, (name, str(verdict))
        assert verdict.violated is None, (name, str(verdict))
        assert verdict.matched == broken_at - 1, (name, str(verdict))
        assert f"line {broken_at} ({lines[broken_at - 1].action})" in verdict.message


def assert_mutation_breaks(
    lines: Sequence[tv.TraceLine], spec: str, overrides: Mapping[str, str], invariant: str
) -> None:
    """Under the spec's mutation (``overrides`` of its constants) every line of ``lines`` is a
    step of the spec, and TLC reports ``invariant`` violated on the last state."""
    verdict = tv.validate(lines, spec, overrides=overrides)
    assert not verdict.accepted
    assert verdict.violated == invariant, f"{verdict}\n{verdict.log_tail}"
    assert verdict.matched == len(lines)
