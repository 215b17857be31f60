"""The one shape every machine's step returns, the refusal effect, and the invariant error.

``step(state, event[, params]) -> Transition(state, effects)``: the state after the event, and
what the shell must do about it, as data, in the order it must be done. The shell's one driver
(``automq_ref/io/driver.py``) hands each effect to the executor registered for its type and
advances to ``state`` once they have all run; each machine's docstring says what its effects
mean and which must come before which.

Errors are values. A machine never raises for an event it refuses: the refusal is an effect,
``Rejected(error, message)`` with the machine's own error enum (AutoMQ's or Kafka's names), and
the state is left as it was; or, where the protocol answers every request (StreamMetadata's
``Response``, the group coordinator's Kafka responses), the error is a field of the response
effect. ``InvariantViolation`` is for bugs, not input: a machine, or a check run on its state,
raises it when the machine's own rules are broken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

S = TypeVar("S")
E = TypeVar("E")
C = TypeVar("C")


class InvariantViolation(AssertionError):
    """A machine's invariant does not hold: a bug in the machine (or in a deliberately broken
    variant a test runs), never a refused event."""


@dataclass(frozen=True, slots=True)
class Rejected(Generic[C]):
    """The event was refused: ``error`` says why (a member of the machine's error enum), the
    message says it for people. A refusal changes nothing: the transition's state is the state
    the event was stepped on (a stutter, in a trace)."""

    error: C
    message: str = ""


@dataclass(frozen=True, slots=True)
class Transition(Generic[S, E]):
    """The state after one event and the effects to execute, in order."""

    state: S
    effects: tuple[E, ...] = ()

    @property
    def rejection(self) -> Rejected[Any] | None:
        """The refusal among the effects; None when the event was taken."""
        for effect in self.effects:
            if isinstance(effect, Rejected):
                return effect
        return None

    @property
    def refusal(self) -> Any:
        """The refusal's error (a member of the machine's error enum); None when the event was
        taken. A machine that answers every request (StreamMetadata, the group coordinator)
        refuses in its answer instead, so this is None for all its transitions."""
        rejection = self.rejection
        return None if rejection is None else rejection.error
