"""The one machine driver: step a pure machine, hand its effects to executors, then advance.

Every machine in ``automq_ref/state_machines/`` answers an event with ``Transition(state,
effects)``. A ``Driver`` holds a machine's current state and turns that answer into action, the
way a raft library hands the application a *Ready* (entries to persist, messages to send) and
waits for *Advance* before it moves on. The contract, which every shell that drives a machine
relies on:

1. **One decision at a time.** An event is stepped on the current state. An event that arrives
   while a transition's effects are being executed (an executor that feeds a completion back at
   once, a callback) waits: it is stepped after that transition has advanced, in arrival order.
2. **Effects in the order the machine emitted them.** Each effect goes to the executor registered
   for its type; the next effect is handed over only when that executor has returned (or, with
   ``apply_async``, when its awaitable has completed). Work that may run concurrently is started
   by an executor (a spawned task) and reports back later as an event.
3. **Advance last.** Only when every effect has been executed does ``transition.state`` become
   the driver's state. So whatever an effect makes durable is durable before any reader sees the
   state that assumes it (StreamMetadata's ``AppendRecords`` before its next image), and what
   comes after it in the list (its ``Respond``) is released after it.
4. **A failed effect advances nothing.** If an executor raises, the transition is dropped (its
   state is never published), the events queued behind it are dropped, and the exception goes to
   whoever applied the event. An executor that finds the decision was taken on a state that is
   out of date raises ``Stale``: the driver runs its ``refresh`` hook (which brings the state up
   to date, e.g. by replaying what another writer appended) and decides the event again, at most
   ``max_decisions`` times in all, then raises ``StaleDecisions``.
5. **Effects returned, not executed.** An effect type registered with ``None`` as its executor is
   left to the caller: ``apply_async`` returns the transition once it has advanced, and the
   caller reads the effect from it (the controller's answer to a request).

Two ways in, one per kind of machine: ``apply`` for machines whose executors only start work and
return at once (LogCache, the group coordinator: state must advance synchronously, because the
shell reads it right after), and ``apply_async`` for machines whose effects must complete before
the state may advance (StreamMetadata: records durable on the metadata log). A shell uses one of
the two for a driver.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from automq_ref.state_machines.transition import Transition

S = TypeVar("S")
Ev = TypeVar("Ev")
Ef = TypeVar("Ef")

# An effect's executor: returns None when done, or an awaitable (apply_async awaits it).
Executor = Callable[[Any], Awaitable[None] | None]


class Stale(Exception):
    """Raised by an executor: the transition was decided on an out-of-date state; decide again."""


class StaleDecisions(Exception):
    """Every decision the driver was allowed to take for an event turned out stale."""

    def __init__(self, event: object, decisions: int) -> None:
        super().__init__(f"{type(event).__name__}: {decisions} decisions, each one stale")
        self.event = event
        self.decisions = decisions


class Driver(Generic[S, Ev, Ef]):
    def __init__(
        self,
        step: Callable[[S, Ev], Transition[S, Ef]],
        state: S,
        executors: Mapping[type[Any], Executor | None],
        *,
        refresh: Callable[[], Awaitable[None]] | None = None,
        max_decisions: int = 1,
    ) -> None:
        self._step = step
        self._state = state
        self._executors = dict(executors)
        self._refresh = refresh
        self._max_decisions = max_decisions
        self._executing = False
        self._waiting: collections.deque[Ev] = collections.deque()
        self._lock = asyncio.Lock()

    @property
    def state(self) -> S:
        """The state of the last transition that advanced."""
        return self._state

    @contextlib.asynccontextmanager
    async def between_decisions(self) -> AsyncIterator[S]:
        """Hold ``apply_async`` off while the caller works on a stable state (it waits for the
        decision in progress, and the next one waits for the caller)."""
        async with self._lock:
            yield self._state

    def reset(self, state: S) -> None:
        """Replace the state from outside the machine: a replay of what another writer appended
        (a ``refresh``), a fresh start. Between decisions only."""
        self._state = state

    # ------------------------------------------------------------------------- synchronous

    def apply(self, event: Ev) -> None:
        """Step ``event`` and execute its effects now (every executor must be synchronous).
        Called again from inside an executor, the event waits for the current transition."""
        if self._executing:
            self._waiting.append(event)
            return
        self._executing = True
        try:
            self._decide(event)
            while self._waiting:
                self._decide(self._waiting.popleft())
        except BaseException:
            self._waiting.clear()
            raise
        finally:
            self._executing = False

    def _decide(self, event: Ev) -> None:
        transition = self._step(self._state, event)
        for effect in transition.effects:
            executor = self._executor(effect)
            result = None if executor is None else executor(effect)
            if result is not None:
                if inspect.iscoroutine(result):
                    result.close()
                raise TypeError(f"the executor of {type(effect).__name__} is asynchronous")
        self._state = transition.state

    # ------------------------------------------------------------------------ asynchronous

    async def apply_async(self, event: Ev) -> Transition[S, Ef]:
        """Step ``event``, await each executor in turn, advance, and return the transition.
        Calls are served one at a time, in the order they were made."""
        async with self._lock:
            for _ in range(self._max_decisions):
                transition = self._step(self._state, event)
                try:
                    for effect in transition.effects:
                        executor = self._executor(effect)
                        if executor is not None:
                            result = executor(effect)
                            if inspect.isawaitable(result):
                                await result
                except Stale:
                    if self._refresh is not None:
                        await self._refresh()
                    continue
                self._state = transition.state
                return transition
            raise StaleDecisions(event, self._max_decisions)

    def _executor(self, effect: object) -> Executor | None:
        try:
            return self._executors[type(effect)]
        except KeyError:
            raise TypeError(f"no executor for {type(effect).__name__}") from None
