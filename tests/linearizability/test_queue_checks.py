"""Jepsen's queue checks (automq_ref/checker/queue.py) against simulated histories.

A tiny simulation of a correct log (several producers, assign-consumers that sometimes seek or
change assignment, trimming, holes in the offsets, failed and indefinite operations, a final read)
produces histories that must have no anomaly. Each test then seeds one fault into such a history
and expects exactly that kind of anomaly, and no other kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from automq_ref.checker.history import Op, OpType, Recorder, read_history, write_history
from automq_ref.checker.queue import (
    Anomaly,
    AnomalyKind,
    QueueHistory,
    check_all,
    check_polls,
)

PARTITIONS = (0, 1, 2)
FINAL_PROCESS = 1000


@dataclass
class Log:
    records: list[tuple[int, int]] = field(default_factory=list)  # (offset, value)
    next_offset: int = 0
    start: int = 0

    def append(self, value: int, rng: random.Random) -> int:
        offset = self.next_offset
        self.records.append((offset, value))
        self.next_offset += 2 if rng.random() < 0.2 else 1  # a hole: a transaction marker
        return offset

    def trim(self, start: int) -> None:
        self.start = max(self.start, start)
        self.records = [(o, v) for o, v in self.records if o >= self.start]


@dataclass
class Consumer:
    process: int
    assigned: list[int]
    position: dict[int, int]


def simulate(seed: int, steps: int = 160, *, log_end: bool = False) -> list[Op]:
    """A history of a correct log (appends take effect at their acknowledgement). With
    ``log_end`` the final reads report the end they read up to."""
    rng = random.Random(seed)
    logs = {p: Log() for p in PARTITIONS}
    history = Recorder()
    clock = iter(range(1, 10**9))
    next_value = iter(range(1, 10**9))
    next_process = iter(range(100, 999))
    producers = [0, 1, 2]
    consumers = [Consumer(10 + i, [], {}) for i in range(3)]
    open_ops: dict[int, tuple[str, dict[str, Any]]] = {}

    def invoke(process: int, f: str, value: dict[str, Any]) -> None:
        history.add(process, "invoke", f, next(clock), value)
        open_ops[process] = (f, value)

    def assign(consumer: Consumer) -> None:
        consumer.assigned = sorted(rng.sample(PARTITIONS, rng.randint(1, len(PARTITIONS))))
        consumer.position = {p: consumer.position.get(p, logs[p].start) for p in consumer.assigned}

    for consumer in consumers:
        assign(consumer)
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.03:
            p = rng.choice(PARTITIONS)
            if logs[p].records:
                logs[p].trim(rng.choice(logs[p].records)[0])
            continue
        if roll < 0.5:
            slot = rng.randrange(len(producers))
            process = producers[slot]
            if process not in open_ops:
                partition = rng.choice((0, 1))  # partition 2 stays empty
                invoke(process, "send", {"partition": partition, "value": next(next_value)})
                continue
            _, sent = open_ops.pop(process)
            fate = rng.random()
            if fate < 0.8:
                offset = logs[sent["partition"]].append(sent["value"], rng)
                history.add(process, "ok", "send", next(clock), {**sent, "offset": offset})
            elif fate < 0.9:
                history.add(process, "fail", "send", next(clock), sent)
            else:  # indefinite: it may have happened; the process never completes it
                if rng.random() < 0.5:
                    logs[sent["partition"]].append(sent["value"], rng)
                producers[slot] = next(next_process)
            continue
        consumer = rng.choice(consumers)
        if consumer.process not in open_ops:
            if rng.random() < 0.1:
                assign(consumer)
            request: dict[str, Any] = {"partitions": list(consumer.assigned)}
            if rng.random() < 0.1:
                p = rng.choice(consumer.assigned)
                target = rng.randint(logs[p].start, logs[p].next_offset)
                consumer.position[p] = target
                request["seek"] = {str(p): target}
            invoke(consumer.process, "poll", request)
            continue
        _, request = open_ops.pop(consumer.process)
        fate = rng.random()
        if fate < 0.05:
            history.add(consumer.process, "fail", "poll", next(clock), {})
            continue
        if fate < 0.08:  # crashed mid-poll: a new process takes over, positions start afresh
            consumer.process = next(next_process)
            consumer.position = {}
            assign(consumer)
            continue
        records: list[list[int]] = []
        for p in consumer.assigned:
            log = logs[p]
            position = max(consumer.position[p], log.start)  # out of range: reset to earliest
            batch = [(o, v) for o, v in log.records if o >= position][: rng.randint(0, 5)]
            records.extend([p, o, v] for o, v in batch)
            consumer.position[p] = batch[-1][0] + 1 if batch else position
        log_start = {str(p): logs[p].start for p in consumer.assigned}
        history.add(
            consumer.process,
            "ok",
            "poll",
            next(clock),
            {"records": records, "log_start": log_start},
        )
    for p in PARTITIONS:
        history.add(
            FINAL_PROCESS, "invoke", "poll", next(clock), {"partitions": [p], "final": True}
        )
        history.add(
            FINAL_PROCESS,
            "ok",
            "poll",
            next(clock),
            {
                "records": [[p, o, v] for o, v in logs[p].records],
                "log_start": {str(p): logs[p].start},
                "final": True,
                **({"log_end": {str(p): logs[p].next_offset}} if log_end else {}),
            },
        )
    return history.ops


# --- mutations: each seeds one fault and returns the changed history, or None if it cannot ----


def _records(op: Op) -> list[list[Any]]:
    return [list(r) for r in op.value.get("records", ())]


def _with_records(op: Op, records: list[list[Any]]) -> Op:
    return replace(op, value={**op.value, "records": records})


def _is_final(op: Op) -> bool:
    return bool(op.value.get("final"))


def _consumer_polls(ops: list[Op]) -> list[int]:
    return [
        i for i, op in enumerate(ops) if op.f == "poll" and op.type == "ok" and not _is_final(op)
    ]


def _final_positions(ops: list[Op]) -> list[int]:
    return [i for i, op in enumerate(ops) if op.type == "ok" and _is_final(op)]


def _acked(ops: list[Op]) -> dict[int, tuple[int, int, int]]:
    """value -> (entry position of the ok, partition, offset)."""
    return {
        op.value["value"]: (i, op.value["partition"], op.value["offset"])
        for i, op in enumerate(ops)
        if op.f == "send" and op.type == "ok"
    }


Mutation = Callable[[list[Op], random.Random], list[Op] | None]


def seed_inconsistent_offset(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """A consumer reads a never-written value at an offset that holds another."""
    # Only an offset something else saw (an ack, another read) shows two values: a record read
    # once and trimmed before the final read, of a send never acked, would not.
    seen: dict[tuple[int, int], int] = {}
    for _, partition, offset in _acked(ops).values():
        seen[(partition, offset)] = seen.get((partition, offset), 0) + 1
    for op in ops:
        if op.f == "poll" and op.type == "ok":
            for partition, offset, _ in _records(op):
                seen[(partition, offset)] = seen.get((partition, offset), 0) + 1
    candidates = [
        (i, j)
        for i in _consumer_polls(ops)
        for j, (partition, offset, _) in enumerate(_records(ops[i]))
        if seen[(partition, offset)] > 1
    ]
    if not candidates:
        return None
    i, j = rng.choice(candidates)
    records = _records(ops[i])
    records[j][2] = -1
    return [*ops[:i], _with_records(ops[i], records), *ops[i + 1 :]]


def seed_duplicate(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """The log holds an acked value a second time, at its end."""
    acked = _acked(ops)
    for i in _final_positions(ops):
        records = _records(ops[i])
        present = [r for r in records if r[2] in acked]
        if present:
            p, _, v = rng.choice(present)
            records.append([p, records[-1][1] + 1, v])
            return [*ops[:i], _with_records(ops[i], records), *ops[i + 1 :]]
    return None


def seed_lost_write(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """An acked record vanishes from the middle of the log."""
    acked = _acked(ops)
    for i in _final_positions(ops):
        records = _records(ops[i])
        middle = [j for j in range(len(records) - 1) if records[j][2] in acked]
        if middle:
            del records[rng.choice(middle)]
            return [*ops[:i], _with_records(ops[i], records), *ops[i + 1 :]]
    return None


def seed_aborted_read(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """An acked send that is in the log is reported as failed."""
    acked = _acked(ops)
    final_values = {r[2] for i in _final_positions(ops) for r in _records(ops[i])}
    choices = [v for v in acked if v in final_values]
    if not choices:
        return None
    i, _, _ = acked[rng.choice(choices)]
    sent = {k: v for k, v in ops[i].value.items() if k != "offset"}
    return [*ops[:i], replace(ops[i], type="fail", value=sent), *ops[i + 1 :]]


def seed_poll_skip(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """A consumer's poll misses a record in the middle of a run of one partition."""
    final = {(r[0], r[1]) for i in _final_positions(ops) for r in _records(ops[i])}
    candidates = []
    for i in _consumer_polls(ops):
        records = _records(ops[i])
        for j in range(1, len(records) - 1):
            same_partition = records[j - 1][0] == records[j][0] == records[j + 1][0]
            if same_partition and (records[j][0], records[j][1]) in final:
                candidates.append((i, j))
    if not candidates:
        return None
    i, j = rng.choice(candidates)
    records = _records(ops[i])
    del records[j]
    return [*ops[:i], _with_records(ops[i], records), *ops[i + 1 :]]


def seed_nonmonotonic_poll(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """A consumer's poll delivers a record of a partition again after a later one."""
    candidates = []
    for i in _consumer_polls(ops):
        records = _records(ops[i])
        for j in range(len(records) - 1):
            if records[j][0] == records[j + 1][0]:
                candidates.append((i, j))
    if not candidates:
        return None
    i, j = rng.choice(candidates)
    records = _records(ops[i])
    records.insert(j + 2, list(records[j]))
    return [*ops[:i], _with_records(ops[i], records), *ops[i + 1 :]]


def seed_nonmonotonic_send(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """Two successive acked sends of one producer to one partition trade places in the log."""
    sends = [i for i, op in enumerate(ops) if op.f == "send"]
    pairs = []
    last: dict[tuple[int, int], int] = {}
    for i in sends:
        op = ops[i]
        key = (op.process, op.value["partition"])
        if op.type == "ok":
            if key in last:
                pairs.append((last[key], i))
            last[key] = i
        elif op.type == "fail":
            last.pop(key, None)
    if not pairs:
        return None
    a, b = rng.choice(pairs)

    def invoke_of(k: int) -> int:
        return max(
            j for j in range(k) if ops[j].process == ops[k].process and ops[j].type == "invoke"
        )

    ia, ib = invoke_of(a), invoke_of(b)
    out = list(ops)
    out[a] = replace(ops[a], value=ops[b].value)
    out[b] = replace(ops[b], value=ops[a].value)
    out[ia] = replace(ops[ia], value=ops[ib].value)
    out[ib] = replace(ops[ib], value=ops[ia].value)
    return out


def seed_unseen(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """The last acked record of a partition disappears from every read."""
    acked = _acked(ops)
    for i in _final_positions(ops):
        records = _records(ops[i])
        if records and records[-1][2] in acked:
            gone = records[-1][2]
            out = []
            for op in ops:
                if op.f == "poll" and op.type == "ok":
                    op = _with_records(op, [r for r in _records(op) if r[2] != gone])
                out.append(op)
            return out
    return None


def seed_offset_mismatch(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """A send is acked at the offset of a hole just before where its record really is."""
    acked = _acked(ops)
    candidates = []
    for i in _final_positions(ops):
        records = _records(ops[i])
        start = int(next(iter(ops[i].value["log_start"].values())))
        offsets = {r[1] for r in records}
        for _, o, v in records[1:]:
            if v in acked and o - 1 not in offsets and o - 1 >= start:
                candidates.append(v)
    if not candidates:
        return None
    position, _, offset = acked[rng.choice(candidates)]
    moved = replace(ops[position], value={**ops[position].value, "offset": offset - 1})
    return [*ops[:position], moved, *ops[position + 1 :]]


def seed_log_start_regression(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """A consumer poll reports a log start of 0 after a higher one was reported. Only a poll
    whose true log start is the one reported before is changed: were it higher, the records
    between the two starts (trimmed) would look skipped, evidence of a poll skip as well."""
    known: dict[str, int] = {}
    candidates: list[tuple[int, str]] = []
    invoked: dict[int, dict[str, int]] = {}
    for i, op in enumerate(ops):
        if op.type == "invoke":
            invoked[op.process] = dict(known)
            continue
        floor = invoked.pop(op.process, {})
        starts = op.value.get("log_start", {})
        if op.f == "poll" and not _is_final(op):
            candidates.extend((i, p) for p, s in starts.items() if 0 < floor.get(p, 0) == s)
        for p, s in starts.items():
            known[p] = max(known.get(p, 0), s)
    if not candidates:
        return None
    i, p = rng.choice(candidates)
    changed = replace(
        ops[i], value={**ops[i].value, "log_start": {**ops[i].value["log_start"], p: 0}}
    )
    return [*ops[:i], changed, *ops[i + 1 :]]


def seed_read_below_log_start(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """The final read returns a record that was trimmed (a consumer had read it before)."""
    consumer_reads = [r for i in _consumer_polls(ops) for r in _records(ops[i])]
    for i in _final_positions(ops):
        p = _records(ops[i])[0][0] if _records(ops[i]) else None
        start = int(next(iter(ops[i].value["log_start"].values())))
        trimmed = [r for r in consumer_reads if r[0] == p and r[1] < start]
        if trimmed:
            return [
                *ops[:i],
                _with_records(ops[i], [rng.choice(trimmed), *_records(ops[i])]),
                *ops[i + 1 :],
            ]
    return None


SEEDS: dict[AnomalyKind, Mutation] = {
    "inconsistent-offsets": seed_inconsistent_offset,
    "duplicate": seed_duplicate,
    "lost-write": seed_lost_write,
    "aborted-read": seed_aborted_read,
    "poll-skip": seed_poll_skip,
    "nonmonotonic-poll": seed_nonmonotonic_poll,
    "nonmonotonic-send": seed_nonmonotonic_send,
    "unseen": seed_unseen,
    "offset-mismatch": seed_offset_mismatch,
    "log-start-regression": seed_log_start_regression,
    "read-below-log-start": seed_read_below_log_start,
}

seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _explain(anomalies: tuple[Anomaly, ...]) -> str:
    return "\n".join(f"{a.kind}: {a.explanation} ops={a.ops}" for a in anomalies)


@given(seed=seeds)
def test_a_correct_log_has_no_anomalies(seed: int) -> None:
    report = check_all(simulate(seed))
    assert report.valid, _explain(report.anomalies)
    assert set(report.counts.values()) == {0}


@pytest.mark.parametrize("kind", list(SEEDS))
@settings(max_examples=40)
@given(seed=seeds)
def test_a_seeded_anomaly_is_found_as_its_kind(kind: AnomalyKind, seed: int) -> None:
    rng = random.Random(seed)
    mutated = SEEDS[kind](simulate(seed, steps=220), rng)
    assume(mutated is not None)
    assert mutated is not None
    report = check_all(mutated)
    assert report.kinds() == {kind}, _explain(report.anomalies)
    assert not report.valid
    assert report.counts[kind] >= 1


def seed_lost_tail(ops: list[Op], rng: random.Random) -> list[Op] | None:
    """The log comes back shorter than acknowledged: its last acked records are gone and the
    final read reports the earlier end (an acknowledgement the broker did not keep)."""
    acked = _acked(ops)
    for i in _final_positions(ops):
        records = _records(ops[i])
        tail = [j for j, record in enumerate(records) if record[2] in acked]
        if not tail:
            continue
        cut = rng.choice(tail[-3:])
        partition = records[cut][0]
        value = {**ops[i].value, "log_end": {str(partition): records[cut][1]}}
        return [*ops[:i], replace(ops[i], value={**value, "records": records[:cut]}), *ops[i + 1 :]]
    return None


@given(seed=seeds)
def test_a_correct_log_with_reported_ends_has_no_anomalies(seed: int) -> None:
    report = check_all(simulate(seed, log_end=True))
    assert report.valid, _explain(report.anomalies)


@pytest.mark.parametrize("mutation", [seed_lost_tail, seed_unseen])
@settings(max_examples=40)
@given(seed=seeds)
def test_acks_past_the_reported_end_are_lost_writes(mutation: Mutation, seed: int) -> None:
    """With the final read's log end known, an acknowledged record missing at or past it is a
    lost write (without the end it could only be ``unseen``)."""
    mutated = mutation(simulate(seed, steps=220, log_end=True), random.Random(seed))
    assume(mutated is not None)
    assert mutated is not None
    report = check_all(mutated)
    assert report.kinds() == {"lost-write"}, _explain(report.anomalies)


def test_histories_survive_a_json_round_trip(tmp_path: Path) -> None:
    ops = simulate(7)
    write_history(tmp_path / "history.ndjson", ops)
    assert check_all(read_history(tmp_path / "history.ndjson")) == check_all(ops)


def _history(*entries: tuple[int, OpType, str, dict[str, Any]]) -> list[Op]:
    recorder = Recorder()
    for time_ns, (process, type_, f, value) in enumerate(entries):
        recorder.add(process, type_, f, time_ns, value)
    return recorder.ops


def test_a_seek_is_not_a_skip_and_a_trim_is_not_a_skip() -> None:
    seek = {"partitions": [0], "seek": {"0": 3}}
    ops = _history(
        (3, "invoke", "poll", {"partitions": [0]}),
        (3, "ok", "poll", {"records": [[0, o, v] for o, v in enumerate("abcdef")]}),
        (1, "invoke", "poll", {"partitions": [0]}),
        (1, "ok", "poll", {"records": [[0, 0, "a"], [0, 1, "b"]]}),
        (1, "invoke", "poll", seek),
        (1, "ok", "poll", {"records": [[0, 3, "d"]]}),
        (1, "invoke", "poll", {"partitions": [0]}),
        (1, "ok", "poll", {"records": [[0, 6, "g"]], "log_start": {"0": 6}}),
        (2, "invoke", "poll", {"partitions": [0], "final": True}),
        (2, "ok", "poll", {"records": [[0, 6, "g"]], "log_start": {"0": 6}, "final": True}),
    )
    assert check_polls(QueueHistory.from_ops(ops)) == []
    assert check_all(ops).valid
    no_seek = [replace(op, value={"partitions": [0]}) if op.value is seek else op for op in ops]
    (skip,) = check_all(no_seek).anomalies
    assert (skip.kind, skip.partition, skip.offsets, skip.values) == ("poll-skip", 0, (2,), ("d",))


def test_subscribe_polls_are_exempt_from_order_checks() -> None:
    ops = _history(
        (1, "invoke", "poll", {"partitions": [0], "mode": "subscribe"}),
        (1, "ok", "poll", {"records": [[0, 2, "c"], [0, 0, "a"]]}),
        (2, "invoke", "poll", {"partitions": [0], "final": True}),
        (2, "ok", "poll", {"records": [[0, 0, "a"], [0, 1, "b"], [0, 2, "c"]], "final": True}),
    )
    assert check_all(ops).valid
