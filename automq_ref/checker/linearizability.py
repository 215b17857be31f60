"""Linearizability of partition logs: Wing & Gong's search with Lowe's memoisation.

Theory of operation
-------------------

**What is checked.** A history (see ``history.py``) of ``send`` and ``poll`` operations is
linearizable if every operation can be given one instant inside its real-time interval (between
its invoke and its completion) such that, taken in that order, the operations are legal steps of
an atomic, append-only log per topic-partition. A log is P-compositional: the history is
linearizable iff its projection on every partition is, so each partition is searched on its own
(Porcupine's ``Partition``) and the exponential search stays per partition.

**Projection.** A ``send`` touches the one partition it names. A ``poll`` that returned records is
split into one sub-operation per partition it returned records for, each with the poll's interval
and the records of that partition; a poll that returned nothing for a partition says nothing
there (the fetch position and the high watermark are not in the history, so "nothing" may mean
"nothing new past my position"). A ``fail`` send never took effect and is left out; so are polls
that completed ``fail`` or ``info`` (they observed nothing).

**The model.** The state of one partition is the log itself: its end offset, the chained hash of
every value from offset 0 (as in S2's verifier: ``h' = blake2b(h || value)``, so equal
(end, hash) means equal prefix) and the values, which polls are checked against. Every send
occupies exactly one offset and offsets are dense (no transaction markers, no compaction). Steps:

- ``send`` ok with offset ``o`` and value ``v``: legal iff ``end == o``; then ``end = o + 1`` and
  the hash is chained with ``v``. An ok send without an offset (an ``acks=0`` style answer, or a
  negative offset) appends wherever the log ends.
- ``send`` info (a timeout, a disconnect, or no completion at all): it may take effect at any
  instant after its invoke, or never. It has no return entry (its return is at +infinity), its
  step appends wherever the log ends, and the search may finish without linearizing it at all,
  which is its "never happened" branch.
- ``poll`` ok observing pairs ``(o, v)`` in a partition: legal iff at its instant the log holds
  ``v`` at each ``o``. A poll's records of one partition are one contiguous fetch, so it also
  observes that nothing else exists between them: the observed offsets must form one gap-free run
  with one value per offset. A poll whose run has a gap, or two values at one offset, can never
  be linearized (in a dense log a gap is a record the poll skipped).

Consequences: an acked send whose offset a later poll reads with another value (a lost write, or
an offset handed out twice), two sends whose offsets contradict their real-time order, one value
at two offsets (a duplicate, or two polls disagreeing on where a value is), a read of a value that
was never sent or whose send failed, and a poll that reads past an offset without seeing the
record there (a stale or skipping read) all leave some operation without a legal instant.

**The search** (Wing & Gong, with Lowe's cache; Porcupine's ``checker.go``). Every operation gets
a call entry at its invoke time and, unless its outcome is info, a return entry at its completion
time; entries are sorted by time with calls before returns on a tie, and kept in a doubly-linked
list. Scanning from the head, each call entry met before the first return entry is a candidate to
be linearized next (its operation was invoked before every pending operation returned). A
candidate whose step is legal, and whose (linearized set, state) pair is not in the cache, is
lifted out of the list with its return entry, pushed on the stack, and the scan restarts. Reaching
a return entry means that operation's deadline passed without it being linearized: pop the last
choice, put its entries back, and try the next candidate after it. The partition is linearizable
once every non-info operation is linearized (remaining info sends are the ones that never
happened); it is not when the stack is empty at a return entry. The linearized set is a Python
int used as a bitset; the cache key is (bitset, end, hash).

**Verdicts.** Per partition ``ok`` (with a witness order), ``fail`` (with the longest prefix the
search linearized and the operation whose return entry stopped that attempt) or ``unknown`` (the
per-partition time limit ran out first; the longest prefix so far is reported). Overall: ``fail``
if any partition fails, else ``unknown`` if any is unknown, else ``ok``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from automq_ref.checker.history import HistoryError, Op, Operation, pair

Verdict = Literal["ok", "fail", "unknown"]
PartitionKey = Hashable

DEFAULT_TIME_LIMIT_S = 10.0
_DEADLINE_CHECK_EVERY_STEPS = 256


# --------------------------------------------------------------------------------------------
# Per-partition operations


@dataclass(frozen=True, slots=True, eq=False)
class PartitionOp:
    """One operation as seen by one partition: a send, or one partition's share of a poll."""

    id: int
    f: Literal["send", "poll"]
    operation: Operation
    definite: bool
    """False for a send whose outcome is info: it may or may not have taken effect."""
    value: Any = None
    """send: the value sent."""
    offset: int | None = None
    """send ok: the offset the broker answered (None if it gave none)."""
    observed: tuple[tuple[int, Any], ...] = ()
    """poll: the (offset, value) pairs it returned for this partition, in the order received."""

    @property
    def call_ns(self) -> int:
        return self.operation.invoke.time_ns

    @property
    def return_ns(self) -> int | None:
        """None when the return is at +infinity (an info send)."""
        if not self.definite or self.operation.completion is None:
            return None
        return self.operation.completion.time_ns

    def describe(self) -> str:
        invoke = self.operation.invoke
        where = f"entry {invoke.index} (process {invoke.process})"
        if self.f == "send":
            at = "" if self.offset is None else f" at {self.offset}"
            return f"send {self.value!r}{at} [{self.operation.outcome}] {where}"
        shown = ", ".join(f"{o}:{v!r}" for o, v in self.observed[:6])
        more = ", ..." if len(self.observed) > 6 else ""
        return f"poll [{shown}{more}] {where}"


def _partition_key(raw: Any) -> PartitionKey:
    if isinstance(raw, list):
        return tuple(_partition_key(item) for item in raw)
    if isinstance(raw, dict):
        return tuple(sorted((str(k), _partition_key(v)) for k, v in raw.items()))
    if isinstance(raw, Hashable):
        return raw
    raise HistoryError(f"partition {raw!r} is not a usable key")


@dataclass(frozen=True, slots=True)
class _Split:
    by_partition: dict[PartitionKey, list[PartitionOp]]
    counts: Counter[str]


def split_by_partition(operations: Iterable[Operation]) -> _Split:
    """Project a paired history onto its partitions (see the module essay for the rules)."""
    by_partition: dict[PartitionKey, list[PartitionOp]] = {}
    counts: Counter[str] = Counter()

    for operation in operations:
        outcome = operation.outcome
        invoke = operation.invoke
        if operation.f == "send":
            counts[f"send_{outcome}"] += 1
            if outcome == "fail":
                continue
            if "partition" not in invoke.value or "value" not in invoke.value:
                raise HistoryError(f"entry {invoke.index}: send without partition or value")
            key = _partition_key(invoke.value["partition"])
            offset: int | None = None
            if outcome == "ok":
                assert operation.completion is not None
                raw_offset = operation.completion.value.get("offset")
                if raw_offset is not None and int(raw_offset) >= 0:
                    offset = int(raw_offset)
            value = invoke.value["value"]
            definite = outcome == "ok"
            sends = by_partition.setdefault(key, [])
            sends.append(
                PartitionOp(len(sends), "send", operation, definite, value=value, offset=offset)
            )
        elif operation.f in ("poll", "read_all"):
            counts[f"poll_{outcome}"] += 1
            if outcome != "ok":
                continue
            assert operation.completion is not None
            records = operation.completion.value.get("records") or []
            per_partition: dict[PartitionKey, list[tuple[int, Any]]] = {}
            for record in records:
                if not isinstance(record, list | tuple) or len(record) != 3:
                    raise HistoryError(f"entry {operation.completion.index}: record {record!r}")
                partition, offset_raw, value = record
                per_partition.setdefault(_partition_key(partition), []).append(
                    (int(offset_raw), value)
                )
            for key, observed in per_partition.items():
                polls = by_partition.setdefault(key, [])
                polls.append(
                    PartitionOp(len(polls), "poll", operation, True, observed=tuple(observed))
                )
        else:
            counts["ignored"] += 1
    return _Split(by_partition, counts)


# --------------------------------------------------------------------------------------------
# The model: one partition's log


@dataclass(frozen=True, slots=True, eq=False)
class LogState:
    """A partition's log. ``(end, digest)`` identifies it (the digest chains every value)."""

    end: int
    digest: bytes
    values: tuple[Any, ...]


INITIAL_LOG = LogState(0, b"", ())


def _encode(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def chain(digest: bytes, encoded_value: bytes) -> bytes:
    """S2's cumulative hash: the digest of a prefix extended by one value."""
    return hashlib.blake2b(digest + encoded_value, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class _Step:
    """A PartitionOp compiled for the model's step function."""

    send: bool
    encoded: bytes = b""
    value: Any = None
    offset: int | None = None
    first: int = 0
    """poll: the first offset of its run."""
    run: tuple[Any, ...] = ()
    """poll: the values of its run, offsets first..first+len-1."""
    possible: bool = True
    """poll: False when its run has a gap or two values at one offset."""


def _compile(op: PartitionOp) -> _Step:
    if op.f == "send":
        return _Step(True, encoded=_encode(op.value), value=op.value, offset=op.offset)
    at: dict[int, Any] = {}
    possible = bool(op.observed)
    for offset, value in op.observed:
        if offset < 0 or (offset in at and at[offset] != value):
            possible = False
        at.setdefault(offset, value)
    first = min(at, default=0)
    last = max(at, default=-1)
    if last - first + 1 != len(at):
        possible = False
    run = tuple(at.get(o) for o in range(first, last + 1)) if possible else ()
    return _Step(False, first=first, run=run, possible=possible)


def step(state: LogState, compiled: _Step) -> LogState | None:
    """The next log state, or None if the operation is not legal in ``state``."""
    if compiled.send:
        if compiled.offset is not None and compiled.offset != state.end:
            return None
        return LogState(
            state.end + 1,
            chain(state.digest, compiled.encoded),
            (*state.values, compiled.value),
        )
    if not compiled.possible:
        return None
    stop = compiled.first + len(compiled.run)
    if stop > state.end or state.values[compiled.first : stop] != compiled.run:
        return None
    return state


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class PartitionResult:
    partition: PartitionKey
    verdict: Verdict
    operations: int
    sends_ok: int
    sends_info: int
    polls: int
    linearization: tuple[PartitionOp, ...]
    """ok: a witness order (info sends left out never happened); fail/unknown: the operations
    linearized in the deepest attempt, in order (the longest linearizable prefix found)."""
    first_unlinearizable: PartitionOp | None
    """fail/unknown: the operation whose return ended the deepest attempt unlinearized."""
    steps: int
    cache_size: int
    elapsed_s: float

    def describe(self) -> str:
        head = (
            f"partition {self.partition!r}: {self.verdict} ({self.operations} ops: "
            f"{self.sends_ok} ok sends, {self.sends_info} info sends, {self.polls} polls; "
            f"{self.steps} steps, {self.elapsed_s:.3f}s)"
        )
        if self.verdict == "ok":
            return head
        lines = [head, f"  longest linearizable prefix ({len(self.linearization)} ops):"]
        lines += [f"    {op.describe()}" for op in self.linearization[-10:]]
        if self.first_unlinearizable is not None:
            lines.append(f"  could not linearize: {self.first_unlinearizable.describe()}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class LinearizabilityResult:
    verdict: Verdict
    partitions: tuple[PartitionResult, ...]
    counts: dict[str, int] = field(default_factory=dict)
    """operations by f and outcome (``send_ok``, ``poll_info``, ...), ``ignored``, and
    partitions by verdict (``partitions_ok``, ``partitions_fail``, ``partitions_unknown``)."""

    def partition(self, key: PartitionKey) -> PartitionResult:
        for result in self.partitions:
            if result.partition == key:
                return result
        raise KeyError(key)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        lines = [f"linearizability: {self.verdict} ({shown})"]
        lines += [r.describe() for r in self.partitions if r.verdict != "ok"]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The search

_CALL = 0
_RETURN = 1
_END = 2


def check_partition(
    partition: PartitionKey,
    ops: Sequence[PartitionOp],
    *,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> PartitionResult:
    """WGL over one partition's operations (ids must be 0..len-1, as split_by_partition makes)."""
    started = time.monotonic()
    deadline = None if time_limit_s is None else started + time_limit_s
    compiled = [_compile(op) for op in ops]

    # Entries: node 0 is the head, node len(entries)+1 the tail sentinel.
    raw: list[tuple[int, int, int, int]] = []  # (time, call-before-return, op id, kind)
    for op in ops:
        raw.append((op.call_ns, 0, op.id, _CALL))
        returned = op.return_ns
        if returned is not None:
            raw.append((returned, 1, op.id, _RETURN))
    raw.sort()
    size = len(raw) + 2
    tail = size - 1
    kind = [_END] * size
    op_of = [-1] * size
    match = [0] * size
    call_node = [0] * len(ops)
    for node, (_, _, op_id, entry_kind) in enumerate(raw, start=1):
        kind[node] = entry_kind
        op_of[node] = op_id
        if entry_kind == _CALL:
            call_node[op_id] = node
        else:
            match[call_node[op_id]] = node
    nxt = [*range(1, size), tail]
    prv = [0, *range(size - 1)]

    def lift(node: int) -> None:
        nxt[prv[node]] = nxt[node]
        prv[nxt[node]] = prv[node]
        ret = match[node]
        if ret:
            nxt[prv[ret]] = nxt[ret]
            prv[nxt[ret]] = prv[ret]

    def unlift(node: int) -> None:
        ret = match[node]
        if ret:
            nxt[prv[ret]] = ret
            prv[nxt[ret]] = ret
        nxt[prv[node]] = node
        prv[nxt[node]] = node

    state = INITIAL_LOG
    linearized = 0
    remaining = sum(1 for op in ops if op.definite)
    stack: list[tuple[int, LogState]] = []
    cache: set[tuple[int, int, bytes]] = set()
    best: tuple[PartitionOp, ...] = ()
    best_depth = -1
    blocker: PartitionOp | None = None
    steps = 0
    entry = nxt[0]

    def finish(verdict: Verdict) -> PartitionResult:
        order = tuple(ops[op_of[node]] for node, _ in stack)
        return PartitionResult(
            partition=partition,
            verdict=verdict,
            operations=len(ops),
            sends_ok=sum(1 for op in ops if op.f == "send" and op.definite),
            sends_info=sum(1 for op in ops if op.f == "send" and not op.definite),
            polls=sum(1 for op in ops if op.f == "poll"),
            linearization=order if verdict == "ok" else best,
            first_unlinearizable=None if verdict == "ok" else blocker,
            steps=steps,
            cache_size=len(cache),
            elapsed_s=time.monotonic() - started,
        )

    while True:
        if remaining == 0:
            return finish("ok")
        steps += 1
        if (
            deadline is not None
            and steps % _DEADLINE_CHECK_EVERY_STEPS == 0
            and time.monotonic() >= deadline
        ):
            return finish("unknown")
        if kind[entry] == _CALL:
            op_id = op_of[entry]
            after = step(state, compiled[op_id])
            if after is not None:
                bits = linearized | (1 << op_id)
                key = (bits, after.end, after.digest)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state = after
                    linearized = bits
                    if ops[op_id].definite:
                        remaining -= 1
                    lift(entry)
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
            continue
        # A return entry (or, defensively, the tail): this attempt cannot be extended.
        if len(stack) > best_depth:
            best_depth = len(stack)
            best = tuple(ops[op_of[node]] for node, _ in stack)
            blocker = ops[op_of[entry]] if kind[entry] == _RETURN else None
        if not stack:
            return finish("fail")
        node, state = stack.pop()
        op_id = op_of[node]
        linearized &= ~(1 << op_id)
        if ops[op_id].definite:
            remaining += 1
        unlift(node)
        entry = nxt[node]


def _overall(verdicts: Iterable[Verdict]) -> Verdict:
    seen = set(verdicts)
    if "fail" in seen:
        return "fail"
    if "unknown" in seen:
        return "unknown"
    return "ok"


def check_operations(
    operations: Iterable[Operation],
    *,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> LinearizabilityResult:
    """Check a paired history; ``time_limit_s`` applies to each partition (None: no limit)."""
    split = split_by_partition(operations)
    results = tuple(
        check_partition(key, ops, time_limit_s=time_limit_s)
        for key, ops in sorted(split.by_partition.items(), key=lambda item: repr(item[0]))
    )
    counts: dict[str, int] = dict(split.counts)
    for verdict in ("ok", "fail", "unknown"):
        counts[f"partitions_{verdict}"] = sum(1 for r in results if r.verdict == verdict)
    return LinearizabilityResult(_overall(r.verdict for r in results), results, counts)


def check_history(
    ops: Iterable[Op],
    *,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> LinearizabilityResult:
    """Pair a history's entries (``history.pair``) and check it."""
    return check_operations(pair(ops), time_limit_s=time_limit_s)
