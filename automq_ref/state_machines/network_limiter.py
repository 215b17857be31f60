"""NetworkLimiter: a token bucket shared by a broker's traffic, whose debt the patient part pays.

Spec: none yet (the rules below are checked by
tests/properties/test_network_limiter.py::NetworkLimiterMachine and a totality test).

Theory of operation
-------------------
A broker's network is shared by traffic that must not wait (a producer's records on their way
into objects, a consumer's read that missed the cache and blocks a Fetch) and traffic that can
(readahead for a catch-up, a catch-up consumer's responses, compaction). AutoMQ puts them all
through one token bucket per direction and lets the first kind run into debt that the second
kind then pays off; this machine is that bucket's decisions, with the clock and the waiting left
to the shell (:mod:`automq_ref.io.network_limiter`).

The bucket holds a balance of ``tokens`` (bytes), at most ``max_tokens``. Time arrives as
``Refill(periods)``: each period (10 ms, AutoMQ's refill interval) adds ``refill_tokens``
(bandwidth x period), never past the maximum. Requests arrive as ``Consume(request_id,
size_bytes, priority)``:

* **BYPASS** takes its bytes at once, whatever the balance and whoever waits: the balance may
  go negative, down to ``-max_tokens`` (a debt deeper than that is forgotten, as AutoMQ's is,
  so one burst cannot stall the patient traffic for longer than two bucketfuls of refills).
  ``Granted`` comes in the same step: a BYPASS request never waits.
* Every other priority joins a queue ordered by ``(priority, arrival)``, the lower value first:
  COMPACTION (1) before TAIL (2) before CATCH_UP (3), AutoMQ's order and values. While the
  balance is positive the head of the queue is given tokens, in chunks of at most
  ``chunk_bytes`` (1 MiB) and never more than the balance, so serving the queue never puts the
  bucket in debt: only BYPASS does. A request whose last byte is given leaves the queue with one
  ``Granted``, the next in line is served, and so on until the balance or the queue runs out.
  A request that arrives at an empty queue with the balance to cover it is granted in the step
  that brought it.

So the queue is *work-conserving*: after every step either the queue is empty or the balance is
not positive (``inv_no_idle_tokens``). A request with a lower priority value that arrives while
another is half served goes first (that is the point of priorities); the tokens the half-served
one already holds stay with it. ``Withdraw(request_id)`` takes a waiting request out (its caller
gave up: a cancelled task); the tokens it held go back to the bucket, and the others are served
with them. A withdrawal of a request that is not waiting (granted just before) changes nothing:
the shell cannot always know which came first. ``Close`` ends the bucket: every waiter gets
``Failed(LIMITER_CLOSED)``, and any later ``Consume`` is refused with the same error.

Invariants (one function each, run after every step by the property test): the balance stays
within ``[-max_tokens, max_tokens]``; the queue is in ``(priority, arrival)`` order; no tokens
idle while requests wait; BYPASS never waits; in every step the requests given tokens come
before, in queue order, every request left untouched; over any run the bytes granted to queued
requests never exceed the refills plus the starting balance; and every request is granted at
most once, for exactly the bytes it asked.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

from automq_ref.state_machines.transition import InvariantViolation, Rejected, Transition

MIB: Final = 1024 * 1024
# AutoMQ's refill interval and the largest piece of the balance a waiting request gets at once.
REFILL_PERIOD_MS: Final = 10
CHUNK_BYTES: Final = MIB


class Priority(enum.IntEnum):
    """AutoMQ's throttle strategies, by their values: the lower is served first."""

    BYPASS = 0
    COMPACTION = 1
    TAIL = 2
    CATCH_UP = 3


class LimiterError(enum.Enum):
    LIMITER_CLOSED = "LIMITER_CLOSED"
    DUPLICATE_REQUEST = "DUPLICATE_REQUEST"
    INVALID_SIZE = "INVALID_SIZE"


@dataclass(frozen=True, slots=True)
class LimiterParams:
    max_tokens: int
    refill_tokens: int  # added per refill period
    chunk_bytes: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.max_tokens <= 0 or self.refill_tokens <= 0 or self.chunk_bytes <= 0:
            raise ValueError(f"limiter parameters must be positive: {self!r}")

    @classmethod
    def for_bandwidth(
        cls, bandwidth_bytes_per_s: int, max_tokens: int, refill_period_ms: int = REFILL_PERIOD_MS
    ) -> LimiterParams:
        """A bucket refilled at ``bandwidth_bytes_per_s`` (at least a byte a period)."""
        refill = max(bandwidth_bytes_per_s * refill_period_ms // 1000, 1)
        return cls(max_tokens=max_tokens, refill_tokens=refill)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued request and the tokens it was given so far."""

    request_id: int
    priority: Priority
    arrival: int
    size_bytes: int
    granted_bytes: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return (int(self.priority), self.arrival)

    @property
    def remaining_bytes(self) -> int:
        return self.size_bytes - self.granted_bytes


@dataclass(frozen=True, slots=True)
class LimiterState:
    tokens: int
    queue: tuple[Waiting, ...] = ()  # in (priority, arrival) order
    next_arrival: int = 0
    closed: bool = False

    def waiting(self, request_id: int) -> Waiting | None:
        for waiting in self.queue:
            if waiting.request_id == request_id:
                return waiting
        return None


def initial_state(params: LimiterParams) -> LimiterState:
    """A full bucket, as AutoMQ starts one."""
    return LimiterState(tokens=params.max_tokens)


# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class Consume:
    request_id: int
    size_bytes: int
    priority: Priority


@dataclass(frozen=True, slots=True)
class Refill:
    periods: int = 1


@dataclass(frozen=True, slots=True)
class Withdraw:
    request_id: int


@dataclass(frozen=True, slots=True)
class Close:
    pass


LimiterEvent: TypeAlias = Consume | Refill | Withdraw | Close


# ----------------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Granted:
    """The request may go: all its bytes are accounted for."""

    request_id: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The request will never be granted (the bucket closed while it waited)."""

    request_id: int
    error: LimiterError


LimiterEffect: TypeAlias = Granted | Failed | Rejected[LimiterError]
LimiterTransition: TypeAlias = Transition[LimiterState, LimiterEffect]


def step(state: LimiterState, event: LimiterEvent, params: LimiterParams) -> LimiterTransition:
    match event:
        case Consume():
            return _on_consume(state, event, params)
        case Refill():
            return _on_refill(state, event, params)
        case Withdraw():
            return _on_withdraw(state, event, params)
        case Close():
            return _on_close(state)


def _refuse(state: LimiterState, error: LimiterError, message: str) -> LimiterTransition:
    return Transition(state, (Rejected(error, message),))


def _ignore_consume(state: LimiterState, event: Consume) -> LimiterTransition | None:
    if state.closed:
        return _refuse(state, LimiterError.LIMITER_CLOSED, "the limiter is closed")
    if event.size_bytes < 0:
        return _refuse(state, LimiterError.INVALID_SIZE, f"{event.size_bytes} bytes")
    if state.waiting(event.request_id) is not None:
        return _refuse(
            state, LimiterError.DUPLICATE_REQUEST, f"request {event.request_id} already waits"
        )
    return None


def _on_consume(state: LimiterState, event: Consume, params: LimiterParams) -> LimiterTransition:
    refused = _ignore_consume(state, event)
    if refused is not None:
        return refused
    granted = Granted(event.request_id, event.size_bytes)
    if event.size_bytes == 0:
        return Transition(state, (granted,))
    if event.priority is Priority.BYPASS:
        tokens = max(state.tokens - event.size_bytes, -params.max_tokens)
        return Transition(replace(state, tokens=tokens), (granted,))
    waiting = Waiting(event.request_id, event.priority, state.next_arrival, event.size_bytes)
    queue = list(state.queue)
    bisect.insort(queue, waiting, key=lambda item: item.key)
    return _serve(replace(state, queue=tuple(queue), next_arrival=state.next_arrival + 1), params)


def _on_refill(state: LimiterState, event: Refill, params: LimiterParams) -> LimiterTransition:
    if state.closed or event.periods <= 0:
        return Transition(state)
    tokens = min(state.tokens + event.periods * params.refill_tokens, params.max_tokens)
    return _serve(replace(state, tokens=tokens), params)


def _on_withdraw(state: LimiterState, event: Withdraw, params: LimiterParams) -> LimiterTransition:
    waiting = state.waiting(event.request_id)
    if waiting is None:
        return Transition(state)  # granted (or failed) before its caller gave up: nothing to do
    queue = tuple(item for item in state.queue if item is not waiting)
    tokens = min(state.tokens + waiting.granted_bytes, params.max_tokens)
    return _serve(replace(state, queue=queue, tokens=tokens), params)


def _on_close(state: LimiterState) -> LimiterTransition:
    if state.closed:
        return Transition(state)
    failed = tuple(Failed(item.request_id, LimiterError.LIMITER_CLOSED) for item in state.queue)
    return Transition(replace(state, queue=(), closed=True), failed)


def _serve(state: LimiterState, params: LimiterParams) -> LimiterTransition:
    """Give the balance to the queue's head, chunk by chunk, until one of them runs out."""
    tokens = state.tokens
    queue = list(state.queue)
    effects: list[LimiterEffect] = []
    while queue and tokens > 0:
        head = queue[0]
        chunk = min(head.remaining_bytes, params.chunk_bytes, tokens)
        tokens -= chunk
        head = replace(head, granted_bytes=head.granted_bytes + chunk)
        if head.remaining_bytes == 0:
            queue.pop(0)
            effects.append(Granted(head.request_id, head.size_bytes))
        else:
            queue[0] = head
    return Transition(replace(state, tokens=tokens, queue=tuple(queue)), tuple(effects))


# -------------------------------------------------------------------------------- invariants


def _check(holds: bool, message: str) -> None:
    if not holds:
        raise InvariantViolation(message)


def inv_balance_within_bounds(state: LimiterState, params: LimiterParams) -> None:
    _check(
        -params.max_tokens <= state.tokens <= params.max_tokens,
        f"balance {state.tokens} outside [-{params.max_tokens}, {params.max_tokens}]",
    )


def inv_queue_in_order(state: LimiterState) -> None:
    keys = [item.key for item in state.queue]
    _check(keys == sorted(set(keys)), f"queue out of (priority, arrival) order: {keys}")
    ids = [item.request_id for item in state.queue]
    _check(len(ids) == len(set(ids)), f"a request waits twice: {ids}")
    for item in state.queue:
        _check(item.priority is not Priority.BYPASS, f"a BYPASS request waits: {item}")
        _check(0 <= item.granted_bytes < item.size_bytes, f"served wrongly: {item}")


def inv_no_idle_tokens(state: LimiterState) -> None:
    _check(
        not (state.queue and state.tokens > 0),
        f"{state.tokens} tokens idle while {len(state.queue)} requests wait",
    )


def inv_bypass_never_waits(
    before: LimiterState, event: LimiterEvent, transition: LimiterTransition
) -> None:
    if not isinstance(event, Consume) or event.priority is not Priority.BYPASS:
        return
    if transition.refusal is not None:  # closed, a negative size, or an id already waiting
        return
    _check(
        Granted(event.request_id, event.size_bytes) in transition.effects,
        f"BYPASS request {event.request_id} not granted at once: {transition.effects}",
    )
    _check(transition.state.waiting(event.request_id) is None, "a BYPASS request waits")


def inv_served_in_order(
    before: LimiterState, event: LimiterEvent, transition: LimiterTransition
) -> None:
    """The requests a step gave tokens to all come before, in queue order, the ones it left."""
    candidates = {item.request_id: item for item in before.queue}
    if isinstance(event, Consume) and event.priority is not Priority.BYPASS and event.size_bytes:
        candidates[event.request_id] = Waiting(
            event.request_id, event.priority, before.next_arrival, event.size_bytes
        )
    granted = {e.request_id for e in transition.effects if isinstance(e, Granted)}
    served: list[tuple[int, int]] = []
    untouched: list[tuple[int, int]] = []
    for request_id, item in candidates.items():
        after = transition.state.waiting(request_id)
        previously = before.waiting(request_id)
        held_before = previously.granted_bytes if previously is not None else 0
        if request_id in granted or (after is not None and after.granted_bytes > held_before):
            served.append(item.key)
        elif after is not None:
            untouched.append(item.key)
    if served and untouched:
        _check(max(served) < min(untouched), f"served {served} out of order past {untouched}")


def inv_grants_within_refills(
    granted_queued_bytes: int, refilled_periods: int, params: LimiterParams
) -> None:
    """Over a run from a full bucket: queued requests were granted no more than it ever held."""
    budget = params.max_tokens + refilled_periods * params.refill_tokens
    _check(
        granted_queued_bytes <= budget,
        f"{granted_queued_bytes} bytes granted to queued requests, more than {budget}",
    )


def inv_granted_once_and_whole(requested: Mapping[int, int], grants: Iterable[Granted]) -> None:
    """Each grant names a request once, for the bytes it asked (``requested``: id -> size)."""
    seen: set[int] = set()
    for grant in grants:
        _check(grant.request_id not in seen, f"request {grant.request_id} granted twice")
        seen.add(grant.request_id)
        _check(
            requested.get(grant.request_id) == grant.size_bytes,
            f"grant {grant} is not what was asked ({requested.get(grant.request_id)})",
        )


def check_step(
    before: LimiterState, event: LimiterEvent, transition: LimiterTransition, params: LimiterParams
) -> None:
    """Every invariant of one step (the run-long ones are the caller's)."""
    inv_balance_within_bounds(transition.state, params)
    inv_queue_in_order(transition.state)
    inv_no_idle_tokens(transition.state)
    inv_bypass_never_waits(before, event, transition)
    inv_served_in_order(before, event, transition)
