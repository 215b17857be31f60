"""Jepsen's queue checks for Kafka-style histories: what a log promises, checked in linear time.

History format: :mod:`automq_ref.checker.history` (``send``, ``poll``, final ``read_all`` polls
marked ``"final": true``). This module reads two optional fields that the format allows:

- ``"log_start": {partition: offset}`` on the *completion* value of a poll or final read: the
  partition's log start offset as the broker reported it with that answer (JSON turns the
  partition into a string key; both spellings are accepted). With it the checker can judge
  trimming; without it every log is taken to start at offset 0.
- ``"log_end": {partition: offset}`` on the completion value of a *final* read: the partition's
  end (high watermark, exclusive) that the final read read up to, given only when it got there.
  With it an acked offset at or past the end is a lost write (the log got shorter than an
  acknowledgement); without it such offsets can only be ``unseen``.
- ``"seek": {partition: offset}`` on the *invoke* value of a poll: the consumer moved its
  position on that partition to that offset just before this poll. ``"mode": "subscribe"`` on the
  invoke value marks a poll by a group-managed consumer; such polls are exempt from the
  per-consumer order checks, as in Jepsen, because rebalances move positions legitimately.

Theory of operation
-------------------
A partition is a log: each offset holds at most one record, a record is appended once, an
acknowledged append stays, and a consumer that owns its assignment (``assign``) reads the log in
order without gaps. Jepsen's Kafka workload turns those promises into checks over a client
history; every check here is one pass over the history plus dictionary look-ups (the poll-skip
check bisects a sorted offset list, so it is ``n log n`` at worst).

Three kinds of evidence exist: an *ack* (a send completed ``ok`` with an offset), a *read* (a
record ``[partition, offset, value]`` some poll returned, final or not) and the *final read* (the
union of the final polls: the whole log from its start to its end, after every fault healed).
From them:

- *version order*: per partition, offset -> values, from acks and reads. Two values at one
  offset: ``inconsistent-offsets``.
- *duplicate*: one value read at two places in the log. Acks do not count here: an ack naming
  another offset than the one the value is read at is an ``offset-mismatch``, not a second copy.
- *lost-write*: the final read covers an acked offset (it lies between the final log start and
  the last offset read, or the log end it reports) but the value is not in it; or a sent value
  that some poll read within that range is missing from the final read; or an acked or read
  offset lies at or past the log end the final read reports.
- *aborted-read* (Elle's G1a): a read of a value whose send definitely failed.
- *poll-skip* / *nonmonotonic-poll*: per consumer process and partition, each record read must
  be the next record of the log after the previous one the process read (or after its seek). The
  log's records are the offsets that any read returned; offsets below the log start the poll
  knew of are not skipped, they are gone. Going backwards or repeating is nonmonotonic.
- *nonmonotonic-send*: a producer process's acked offsets on a partition must increase.
- *unseen*: an acked value that no read ever returned, beyond the final read's end (inside it,
  the same fact is a lost write). Offsets below the final log start are exempt: retention may
  delete a record before anyone reads it.
- *offset-mismatch*: the final read holds another value at a send's acked offset, or holds
  nothing there while the value sits at another offset (Jepsen found "spurious zero offsets").
- *log-start-regression*: a poll reports a log start below one reported by a poll that completed
  before it was invoked (the log start never goes back).
- *read-below-log-start*: a poll returns a record below the log start it reports, or below a log
  start reported before it was invoked: trimmed data came back.

Every check returns a list of :class:`Anomaly`; :func:`check_all` runs them all. The checks are
written to attribute one fault to one kind where the evidence allows: a record lost from the log
is a lost write, not also a skip; a wrong ack is an offset mismatch, not also a duplicate.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from automq_ref.checker.history import HistoryError, Op, Operation, pair

AnomalyKind = Literal[
    "inconsistent-offsets",
    "duplicate",
    "lost-write",
    "aborted-read",
    "poll-skip",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "unseen",
    "offset-mismatch",
    "log-start-regression",
    "read-below-log-start",
]
KINDS: tuple[AnomalyKind, ...] = (
    "inconsistent-offsets",
    "duplicate",
    "lost-write",
    "aborted-read",
    "poll-skip",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "unseen",
    "offset-mismatch",
    "log-start-regression",
    "read-below-log-start",
)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One violation: where it is (partition, offsets, values), which operations show it (the
    ``index`` of each operation's invoke entry) and a one-line explanation."""

    kind: str  # one of KINDS, or of the transactional checks' TXN_KINDS
    partition: int | None
    offsets: tuple[int, ...]
    values: tuple[Hashable, ...]
    ops: tuple[int, ...]
    explanation: str


@dataclass(frozen=True, slots=True)
class Send:
    op: int  # index of the invoke entry
    process: int
    partition: int
    value: Hashable
    outcome: str
    offset: int | None  # the acked offset (ok sends only)


@dataclass(frozen=True, slots=True)
class Read:
    op: int
    partition: int
    offset: int
    value: Hashable


@dataclass(frozen=True, slots=True)
class Poll:
    op: int
    process: int
    outcome: str
    final: bool
    subscribe: bool
    partitions: tuple[int, ...]
    seek: Mapping[int, int]
    records: tuple[Read, ...]
    log_start: Mapping[int, int]
    log_end: Mapping[int, int]
    invoke_index: int
    completion_index: int | None


@dataclass(frozen=True, slots=True)
class QueueHistory:
    """A paired history indexed once for all checks."""

    sends: tuple[Send, ...]
    polls: tuple[Poll, ...]
    send_by_value: Mapping[Hashable, Send]
    # the final read: (partition, offset) -> value, per partition its [start, end] coverage
    final: Mapping[tuple[int, int], Hashable]
    final_values: Mapping[Hashable, tuple[int, int]]
    final_ops: tuple[int, ...]
    final_range: Mapping[int, tuple[int, int]]
    # per partition the log end (exclusive) the final read reached, where it reports one
    final_log_end: Mapping[int, int]
    # every offset any read returned, sorted, per partition
    read_offsets: Mapping[int, Sequence[int]]

    @classmethod
    def from_ops(cls, ops: Iterable[Op]) -> QueueHistory:
        return cls.from_operations(pair(ops))

    @classmethod
    def from_operations(cls, operations: Iterable[Operation]) -> QueueHistory:
        sends: list[Send] = []
        polls: list[Poll] = []
        for operation in operations:
            if operation.f == "send":
                sends.append(_send(operation))
            elif operation.f in ("poll", "read_all"):
                polls.append(_poll(operation))
        send_by_value: dict[Hashable, Send] = {}
        for send in sends:
            if send.value in send_by_value:
                raise HistoryError(f"entry {send.op}: value {send.value!r} sent twice")
            send_by_value[send.value] = send
        final: dict[tuple[int, int], Hashable] = {}
        final_values: dict[Hashable, tuple[int, int]] = {}
        final_ops: list[int] = []
        final_start: dict[int, int] = {}
        final_end: dict[int, int] = {}
        final_log_end: dict[int, int] = {}
        offsets: dict[int, set[int]] = defaultdict(set)
        for poll in polls:
            for read in poll.records:
                offsets[read.partition].add(read.offset)
            if not poll.final:
                continue
            final_ops.append(poll.op)
            for partition, start in poll.log_start.items():
                final_start[partition] = max(final_start.get(partition, 0), start)
            for partition, end in poll.log_end.items():
                final_log_end[partition] = end
                final_end[partition] = max(final_end.get(partition, -1), end - 1)
            for read in poll.records:
                final.setdefault((read.partition, read.offset), read.value)
                final_values.setdefault(read.value, (read.partition, read.offset))
                final_end[read.partition] = max(final_end.get(read.partition, -1), read.offset)
        final_range = {p: (final_start.get(p, 0), end) for p, end in final_end.items()}
        return cls(
            tuple(sends),
            tuple(polls),
            send_by_value,
            final,
            final_values,
            tuple(final_ops),
            final_range,
            final_log_end,
            {p: sorted(found) for p, found in offsets.items()},
        )

    def final_covers(self, partition: int, offset: int) -> bool:
        span = self.final_range.get(partition)
        return span is not None and span[0] <= offset <= span[1]

    def past_final_end(self, partition: int, offset: int) -> bool:
        """The offset is at or past the log end the final read reached (when it reports one)."""
        end = self.final_log_end.get(partition)
        return end is not None and offset >= end

    def final_start(self, partition: int) -> int:
        span = self.final_range.get(partition)
        return 0 if span is None else span[0]


def _partition_map(raw: Any, where: int, name: str) -> dict[int, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise HistoryError(f"entry {where}: {name} must be an object")
    return {int(partition): int(offset) for partition, offset in raw.items()}


def _send(operation: Operation) -> Send:
    invoke = operation.invoke
    offset: int | None = None
    if operation.completion is not None and operation.outcome == "ok":
        raw = operation.completion.value.get("offset")
        offset = None if raw is None or int(raw) < 0 else int(raw)
    return Send(
        invoke.index,
        invoke.process,
        int(invoke.value["partition"]),
        _hashable(invoke.value["value"]),
        operation.outcome,
        offset,
    )


def _poll(operation: Operation) -> Poll:
    invoke = operation.invoke
    done = operation.completion
    done_value: dict[str, Any] = {} if done is None else done.value
    records = tuple(
        Read(invoke.index, int(p), int(o), _hashable(v))
        for p, o, v in done_value.get("records", ())
    )
    return Poll(
        op=invoke.index,
        process=invoke.process,
        outcome=operation.outcome,
        final=operation.f == "read_all"
        or bool(invoke.value.get("final"))
        or bool(done_value.get("final")),
        subscribe=invoke.value.get("mode") == "subscribe",
        partitions=tuple(int(p) for p in invoke.value.get("partitions", ())),
        seek=_partition_map(invoke.value.get("seek"), invoke.index, "seek"),
        records=records,
        log_start=_partition_map(done_value.get("log_start"), invoke.index, "log_start"),
        log_end=_partition_map(done_value.get("log_end"), invoke.index, "log_end"),
        invoke_index=invoke.index,
        completion_index=None if done is None else done.index,
    )


def _hashable(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    if not isinstance(value, Hashable):
        raise HistoryError(f"value {value!r} is not a JSON scalar, list or object")
    return value


# --- the checks -------------------------------------------------------------------------------


def check_inconsistent_offsets(history: QueueHistory) -> list[Anomaly]:
    """Two different values at one offset of a partition, by acks or reads (Jepsen
    ``:inconsistent-offsets``)."""
    seen: dict[tuple[int, int], dict[Hashable, list[int]]] = defaultdict(dict)
    for send in history.sends:
        if send.offset is not None:
            seen[(send.partition, send.offset)].setdefault(send.value, []).append(send.op)
    for poll in history.polls:
        for read in poll.records:
            seen[(read.partition, read.offset)].setdefault(read.value, []).append(read.op)
    out = []
    for (partition, offset), values in seen.items():
        if len(values) > 1:
            out.append(
                Anomaly(
                    "inconsistent-offsets",
                    partition,
                    (offset,),
                    tuple(values),
                    _ops(op for ops in values.values() for op in ops),
                    f"offset {offset} of partition {partition} holds {len(values)} values",
                )
            )
    return out


def check_duplicates(history: QueueHistory) -> list[Anomaly]:
    """One value read at more than one place in the log (Jepsen ``:duplicate``)."""
    places: dict[Hashable, dict[tuple[int, int], list[int]]] = defaultdict(dict)
    for poll in history.polls:
        for read in poll.records:
            places[read.value].setdefault((read.partition, read.offset), []).append(read.op)
    out = []
    for value, where in places.items():
        if len(where) > 1:
            partitions = {p for p, _ in where}
            out.append(
                Anomaly(
                    "duplicate",
                    partitions.pop() if len(partitions) == 1 else None,
                    tuple(sorted(o for _, o in where)),
                    (value,),
                    _ops(op for ops in where.values() for op in ops),
                    f"value {value!r} is read at {len(where)} places: {sorted(where)}",
                )
            )
    return out


def check_lost_writes(history: QueueHistory) -> list[Anomaly]:
    """Acked or read values missing from the final read where it covers them, or at offsets
    past the end it reached (Jepsen ``:lost-write``)."""
    missing: dict[Hashable, tuple[int, int, list[int], str]] = {}
    for send in history.sends:
        if (
            send.offset is not None
            and send.value not in history.final_values
            and (
                history.final_covers(send.partition, send.offset)
                or history.past_final_end(send.partition, send.offset)
            )
        ):
            missing[send.value] = (send.partition, send.offset, [send.op], "acked")
    for poll in history.polls:
        if poll.final:
            continue
        for read in poll.records:
            sent = history.send_by_value.get(read.value)
            if (
                sent is None
                or sent.outcome == "fail"
                or read.value in history.final_values
                or not (
                    history.final_covers(read.partition, read.offset)
                    or history.past_final_end(read.partition, read.offset)
                )
            ):
                continue
            entry = missing.setdefault(read.value, (read.partition, read.offset, [sent.op], "read"))
            entry[2].append(read.op)
    return [
        Anomaly(
            "lost-write",
            partition,
            (offset,),
            (value,),
            _ops([*ops, *history.final_ops]),
            f"value {value!r} was {how} at offset {offset} of partition {partition}, "
            + (
                f"but after the faults the partition ends at {history.final_log_end[partition]}"
                if history.past_final_end(partition, offset)
                else "which the final read covers, but the final read lacks it"
            ),
        )
        for value, (partition, offset, ops, how) in missing.items()
    ]


def check_aborted_reads(history: QueueHistory) -> list[Anomaly]:
    """A read of a value whose send failed definitely (Elle's G1a, Jepsen ``:G1a``)."""
    out = []
    for poll in history.polls:
        for read in poll.records:
            sent = history.send_by_value.get(read.value)
            if sent is not None and sent.outcome == "fail":
                out.append(
                    Anomaly(
                        "aborted-read",
                        read.partition,
                        (read.offset,),
                        (read.value,),
                        (sent.op, read.op),
                        f"value {read.value!r} was read at offset {read.offset}; its send failed",
                    )
                )
    return out


def check_polls(history: QueueHistory) -> list[Anomaly]:
    """Per consumer process and partition: reads continue exactly after the previous record the
    process read (Jepsen ``:poll-skip``, ``:nonmonotonic-poll`` and their in-poll variants)."""
    out: list[Anomaly] = []
    # process -> partition -> (highest offset read so far or None after a seek, seek target,
    # the poll that set it)
    position: dict[int, dict[int, tuple[int | None, int, int]]] = defaultdict(dict)
    floors = _log_start_floors(history)
    for poll in sorted(history.polls, key=lambda poll: poll.invoke_index):
        if poll.final:
            continue
        state = position[poll.process]
        if poll.subscribe or poll.outcome == "info":
            state.clear()  # rebalanced or crashed: positions unknown from here on
            continue
        for partition in list(state):
            if partition not in poll.partitions:
                del state[partition]  # unassigned: a later assign starts afresh
        for partition, offset in poll.seek.items():
            state[partition] = (None, offset, poll.op)
        if poll.outcome != "ok":
            continue
        for read in poll.records:
            previous = state.get(read.partition)
            if previous is not None:
                last, target, last_op = previous
                floor = max(
                    poll.log_start.get(read.partition, 0),
                    floors.get((poll.op, read.partition), 0),
                )
                if last is not None and read.offset <= last:
                    out.append(_nonmonotonic(poll, read, last, last_op))
                    continue
                low = max(floor, target if last is None else last + 1)
                skipped = _read_offsets_between(history, read.partition, low, read.offset)
                if skipped:
                    out.append(_skip(poll, read, skipped, last, last_op))
                if last is None and read.offset < target:
                    out.append(_nonmonotonic(poll, read, target, last_op))
            high = read.offset if previous is None or previous[0] is None else previous[0]
            state[read.partition] = (max(high, read.offset), read.offset + 1, poll.op)
    return out


def _nonmonotonic(poll: Poll, read: Read, last: int, last_op: int) -> Anomaly:
    return Anomaly(
        "nonmonotonic-poll",
        read.partition,
        (last, read.offset),
        (read.value,),
        _ops((last_op, poll.op)),
        f"process {poll.process} read offset {read.offset} of partition {read.partition} "
        f"after reaching {last}",
    )


def _skip(poll: Poll, read: Read, skipped: Sequence[int], last: int | None, op: int) -> Anomaly:
    after = "its seek" if last is None else f"offset {last}"
    return Anomaly(
        "poll-skip",
        read.partition,
        tuple(skipped),
        (read.value,),
        _ops((op, poll.op)),
        f"process {poll.process} jumped from {after} to offset {read.offset} of partition "
        f"{read.partition}, over {len(skipped)} record(s) of the log",
    )


def _read_offsets_between(history: QueueHistory, partition: int, low: int, high: int) -> list[int]:
    """The log's record offsets (as reads saw them) in ``[low, high)``."""
    offsets = history.read_offsets.get(partition, ())
    return list(offsets[bisect.bisect_left(offsets, low) : bisect.bisect_left(offsets, high)])


def check_nonmonotonic_sends(history: QueueHistory) -> list[Anomaly]:
    """A producer process's acked offsets on a partition go backwards or repeat (Jepsen
    ``:nonmonotonic-send``)."""
    last: dict[tuple[int, int], Send] = {}
    out = []
    for send in sorted(history.sends, key=lambda send: send.op):
        if send.offset is None:
            continue
        key = (send.process, send.partition)
        previous = last.get(key)
        if previous is not None and previous.offset is not None and send.offset <= previous.offset:
            out.append(
                Anomaly(
                    "nonmonotonic-send",
                    send.partition,
                    (previous.offset, send.offset),
                    (previous.value, send.value),
                    (previous.op, send.op),
                    f"process {send.process} was acked offset {send.offset} of partition "
                    f"{send.partition} after offset {previous.offset}",
                )
            )
        last[key] = send
    return out


def check_unseen(history: QueueHistory) -> list[Anomaly]:
    """Acked values no read ever returned, beyond what the final read covers (Jepsen
    ``:unseen``; inside the final read's range the same fact is a lost write)."""
    read_values = {read.value for poll in history.polls for read in poll.records}
    return [
        Anomaly(
            "unseen",
            send.partition,
            (send.offset,),
            (send.value,),
            (send.op,),
            f"value {send.value!r} was acked at offset {send.offset} of partition "
            f"{send.partition} and never read",
        )
        for send in history.sends
        if send.offset is not None
        and send.value not in read_values
        and not history.final_covers(send.partition, send.offset)
        and not history.past_final_end(send.partition, send.offset)
        and send.offset >= history.final_start(send.partition)
    ]


def check_offset_mismatches(history: QueueHistory) -> list[Anomaly]:
    """The record at a send's acked offset (per the final read) is not that send's value."""
    out = []
    for send in history.sends:
        if send.offset is None or not history.final_covers(send.partition, send.offset):
            continue
        there = history.final.get((send.partition, send.offset), _NOTHING)
        place = history.final_values.get(send.value)
        if there == send.value or (there is _NOTHING and place is None):
            continue  # matches, or a lost write (reported as such)
        found = "nothing" if there is _NOTHING else repr(there)
        out.append(
            Anomaly(
                "offset-mismatch",
                send.partition,
                (send.offset,) if place is None else (send.offset, place[1]),
                (send.value,) if there is _NOTHING else (send.value, there),
                _ops([send.op, *history.final_ops]),
                f"value {send.value!r} was acked at offset {send.offset} of partition "
                f"{send.partition}; the final read has {found} there"
                + ("" if place is None else f" and the value at {place}"),
            )
        )
    return out


_NOTHING: Hashable = object()


def _log_start_floors(history: QueueHistory) -> dict[tuple[int, int], int]:
    """For each (poll, partition): the highest log start reported by a poll that completed
    before this poll was invoked (what the poll must not go below)."""
    events: list[tuple[int, int, Poll]] = []
    for poll in history.polls:
        events.append((poll.invoke_index, 1, poll))
        if poll.completion_index is not None and poll.log_start:
            events.append((poll.completion_index, 0, poll))
    events.sort(key=lambda event: (event[0], event[1]))
    known: dict[int, int] = {}
    floors: dict[tuple[int, int], int] = {}
    for _, is_invoke, poll in events:
        if is_invoke:
            for partition, start in known.items():
                floors[(poll.op, partition)] = start
        else:
            for partition, start in poll.log_start.items():
                known[partition] = max(known.get(partition, 0), start)
    return floors


def check_trim_safety(history: QueueHistory) -> list[Anomaly]:
    """The log start never goes back, and nothing below it is read (project-specific; needs the
    optional ``log_start`` field)."""
    floors = _log_start_floors(history)
    out = []
    for poll in history.polls:
        for partition, start in poll.log_start.items():
            floor = floors.get((poll.op, partition), 0)
            if start < floor:
                out.append(
                    Anomaly(
                        "log-start-regression",
                        partition,
                        (floor, start),
                        (),
                        (poll.op,),
                        f"poll reported log start {start} of partition {partition} after "
                        f"{floor} had been reported",
                    )
                )
        for read in poll.records:
            bound = max(
                poll.log_start.get(read.partition, 0), floors.get((poll.op, read.partition), 0)
            )
            if read.offset < bound:
                out.append(
                    Anomaly(
                        "read-below-log-start",
                        read.partition,
                        (read.offset, bound),
                        (read.value,),
                        (poll.op,),
                        f"poll returned offset {read.offset} of partition {read.partition} "
                        f"below log start {bound}",
                    )
                )
    return out


def _ops(ops: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(ops)))


CHECKS: tuple[Callable[[QueueHistory], list[Anomaly]], ...] = (
    check_inconsistent_offsets,
    check_duplicates,
    check_lost_writes,
    check_aborted_reads,
    check_polls,
    check_nonmonotonic_sends,
    check_unseen,
    check_offset_mismatches,
    check_trim_safety,
)


@dataclass(frozen=True, slots=True)
class Report:
    """Every anomaly found, the count per kind (every kind listed, zeros too) and the verdict."""

    anomalies: tuple[Anomaly, ...]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {anomaly.kind for anomaly in self.anomalies}


def check_all(history: Iterable[Op] | QueueHistory) -> Report:
    """Run every check; the history is valid iff no check finds an anomaly."""
    indexed = history if isinstance(history, QueueHistory) else QueueHistory.from_ops(history)
    anomalies = tuple(anomaly for check in CHECKS for anomaly in check(indexed))
    counts: dict[str, int] = dict.fromkeys(KINDS, 0)
    for anomaly in anomalies:
        counts[anomaly.kind] += 1
    return Report(anomalies, counts)
