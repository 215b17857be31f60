"""The WGL linearizability checker on hand-built, generated and seeded-anomaly histories."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from automq_ref.checker.history import Op, Recorder, pair
from automq_ref.checker.linearizability import (
    LinearizabilityResult,
    check_history,
    check_operations,
)

# --------------------------------------------------------------------------------------------
# Hand-built histories: every operation gets its own process and explicit times.


@dataclass
class Builder:
    recorder: Recorder = field(default_factory=Recorder)
    next_process: int = 0

    def _process(self) -> int:
        self.next_process += 1
        return self.next_process

    def send(
        self,
        value: Any,
        at: tuple[int, int | None],
        *,
        offset: int | None = None,
        outcome: str = "ok",
        partition: Any = 0,
    ) -> None:
        """outcome ok/fail/info; a None completion time leaves the send open (info)."""
        process = self._process()
        start, end = at
        self.recorder.add(
            process, "invoke", "send", start, {"partition": partition, "value": value}
        )
        if end is None:
            return
        done: dict[str, Any] = {"partition": partition, "value": value}
        if outcome == "ok" and offset is not None:
            done["offset"] = offset
        self.recorder.add(process, outcome, "send", end, done)  # type: ignore[arg-type]

    def poll(
        self, records: list[tuple[Any, int, Any]], at: tuple[int, int], *, outcome: str = "ok"
    ) -> None:
        process = self._process()
        partitions = sorted({p for p, _, _ in records}, key=repr) or [0]
        self.recorder.add(process, "invoke", "poll", at[0], {"partitions": partitions})
        done = {"records": [list(r) for r in records]} if outcome == "ok" else {}
        self.recorder.add(process, outcome, "poll", at[1], done)  # type: ignore[arg-type]

    def check(self, time_limit_s: float | None = 5.0) -> LinearizabilityResult:
        return check_history(self.recorder.ops, time_limit_s=time_limit_s)


def assert_ok(result: LinearizabilityResult) -> None:
    assert result.verdict == "ok", result.describe()


def assert_fail(result: LinearizabilityResult) -> None:
    assert result.verdict == "fail", result.describe()


def test_empty_history_is_ok() -> None:
    result = Builder().check()
    assert result.verdict == "ok"
    assert result.partitions == ()


def test_sequential_sends_and_a_final_read() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0)
    h.send("b", (3, 4), offset=1)
    h.poll([(0, 0, "a"), (0, 1, "b")], (5, 6))
    result = h.check()
    assert_ok(result)
    part = result.partition(0)
    assert (part.sends_ok, part.polls) == (2, 1)
    assert [op.f for op in part.linearization] == ["send", "send", "poll"]


def test_concurrent_sends_may_take_offsets_in_either_order() -> None:
    h = Builder()
    h.send("a", (1, 10), offset=1)
    h.send("b", (2, 9), offset=0)
    h.poll([(0, 0, "b"), (0, 1, "a")], (11, 12))
    assert_ok(h.check())


def test_info_send_that_happened_and_one_that_did_not() -> None:
    h = Builder()
    h.send("x", (1, 2), outcome="info")  # happened: a later poll sees it
    h.send("y", (3, None))  # never completed, never seen: it did not happen
    h.send("a", (4, 5), offset=1)
    h.poll([(0, 0, "x"), (0, 1, "a")], (6, 7))
    result = h.check()
    assert_ok(result)
    part = result.partition(0)
    assert part.sends_info == 2
    witness = [op.value for op in part.linearization if op.f == "send"]
    assert witness[:2] == ["x", "a"]  # y may or may not be in the witness: nothing saw it


def test_info_send_may_take_effect_long_after_its_info() -> None:
    h = Builder()
    h.send("x", (1, 2), outcome="info")
    h.send("a", (3, 4), offset=0)
    h.send("b", (5, 6), offset=1)
    h.poll([(0, 2, "x")], (7, 8))
    assert_ok(h.check())


def test_poll_concurrent_with_a_send_may_see_it_or_not() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0)
    h.send("b", (3, 10), offset=1)
    h.poll([(0, 0, "a")], (4, 5))  # before b
    h.poll([(0, 0, "a"), (0, 1, "b")], (6, 7))  # sees b before b's ack
    assert_ok(h.check())


def test_failed_operations_and_empty_polls_constrain_nothing() -> None:
    h = Builder()
    h.send("f", (1, 2), outcome="fail")
    h.send("a", (3, 4), offset=0)
    h.poll([], (5, 6))
    h.poll([], (7, 8), outcome="info")
    h.poll([(0, 0, "a")], (9, 10))
    result = h.check()
    assert_ok(result)
    assert result.counts["send_fail"] == 1
    assert result.counts["poll_info"] == 1


def test_partitions_are_checked_separately() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0, partition="t-0")
    h.send("b", (1, 2), offset=0, partition="t-1")
    h.poll([("t-0", 0, "a"), ("t-1", 0, "b")], (3, 4))
    h.send("c", (5, 6), offset=0, partition="t-2")
    h.send("d", (7, 8), offset=0, partition="t-2")  # t-2 is broken, t-0 and t-1 are not
    result = h.check()
    assert result.verdict == "fail"
    verdicts = {r.partition: r.verdict for r in result.partitions}
    assert verdicts == {"t-0": "ok", "t-1": "ok", "t-2": "fail"}
    assert result.counts["partitions_fail"] == 1
    assert result.counts["partitions_ok"] == 2


def test_ok_send_without_offset_appends_somewhere() -> None:
    h = Builder()
    h.send("a", (1, 2))
    h.send("b", (3, 4), offset=1)
    h.poll([(0, 0, "a")], (5, 6))
    assert_ok(h.check())


# --------------------------------------------------------------------------------------------
# Seeded anomalies


def test_lost_write_is_caught() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0)
    h.send("b", (3, 4), offset=0)  # the log lost a and handed its offset out again
    h.poll([(0, 0, "b")], (5, 6))
    result = h.check()
    assert_fail(result)
    part = result.partition(0)
    assert part.first_unlinearizable is not None
    assert part.first_unlinearizable.value == "b"
    assert [op.value for op in part.linearization] == ["a"]


def test_lost_write_overwritten_by_an_info_send_is_caught() -> None:
    h = Builder()
    h.send("x", (1, 2), outcome="info")
    h.send("a", (3, 4), offset=0)
    h.poll([(0, 0, "x"), (0, 1, "b")], (7, 8))  # reads past 0 and never sees a
    h.send("b", (5, 6), offset=1)
    assert_fail(h.check())


def test_reorder_is_caught() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=1)
    h.send("b", (3, 4), offset=0)  # invoked after a was acked, yet placed before it
    result = h.check()
    assert_fail(result)
    assert result.partition(0).first_unlinearizable is not None


def test_duplicate_is_caught() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0)
    h.poll([(0, 0, "a"), (0, 1, "a")], (3, 4))  # a retried send landed twice
    assert_fail(h.check())


def test_stale_read_is_caught() -> None:
    h = Builder()
    h.send("x", (1, 20), outcome="info")
    h.send("a", (2, 3), offset=0)
    h.send("b", (4, 5), offset=1)
    # invoked after b was acked, reads past offset 1 without seeing b
    h.poll([(0, 0, "a"), (0, 2, "x")], (6, 7))
    result = h.check()
    assert_fail(result)
    blocker = result.partition(0).first_unlinearizable
    assert blocker is not None
    assert blocker.f == "poll"


def test_a_value_read_at_two_offsets_is_caught() -> None:
    h = Builder()
    h.send("x", (1, 2), outcome="info")
    h.send("y", (1, 2), outcome="info")
    h.poll([(0, 0, "x")], (3, 4))
    h.poll([(0, 0, "y"), (0, 1, "x")], (5, 6))
    assert_fail(h.check())


def test_returned_offset_must_hold_the_value() -> None:
    h = Builder()
    h.send("a", (1, 2), offset=0)
    h.send("b", (1, 2), offset=1)
    h.poll([(0, 0, "b"), (0, 1, "a")], (3, 4))
    assert_fail(h.check())


def test_reads_of_failed_or_unsent_values_are_caught() -> None:
    aborted = Builder()
    aborted.send("f", (1, 2), outcome="fail")
    aborted.poll([(0, 0, "f")], (3, 4))
    assert_fail(aborted.check())
    garbage = Builder()
    garbage.poll([(0, 0, "never-sent")], (1, 2))
    assert_fail(garbage.check())


def test_two_values_at_one_offset_are_caught() -> None:
    h = Builder()
    h.send("x", (1, 2), outcome="info")
    h.send("y", (1, 2), outcome="info")
    h.poll([(0, 0, "x")], (3, 4))
    h.poll([(0, 0, "y")], (5, 6))
    assert_fail(h.check())


def test_a_hard_history_with_no_time_is_unknown() -> None:
    h = Builder()
    for n in range(14):
        h.send(f"v{n}", (1, None))  # fourteen concurrent sends of unknown outcome
    h.poll([(0, 14, "never-sent")], (2, 3))
    result = h.check(time_limit_s=0.0)
    assert result.verdict == "unknown", result.describe()
    assert result.counts["partitions_unknown"] == 1


# --------------------------------------------------------------------------------------------
# Generated histories: a correct log, random concurrency, random outcomes


@dataclass
class _Pending:
    f: str
    partitions: list[int]
    value: int = -1
    effected: bool = False
    offset: int = -1
    records: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class Generated:
    ops: list[Op]
    ends: list[int]
    """each partition's end offset when the run stopped (info sends never land after it)."""


@st.composite
def correct_histories(draw: st.DrawFn, max_steps: int = 100) -> Generated:
    """Run clients against an atomic log; each effect happens strictly inside its interval."""
    partitions = draw(st.integers(1, 3))
    processes = draw(st.integers(1, 5))
    logs: list[list[int]] = [[] for _ in range(partitions)]
    pending: dict[int, _Pending] = {}
    ghosts: list[tuple[int, int]] = []  # info sends that may still take effect
    recorder = Recorder()
    clock = 0
    next_value = 0

    def record(process: int, type_: Any, f: str, value: dict[str, Any]) -> None:
        nonlocal clock
        clock += 1
        recorder.add(process, type_, f, clock, value)

    def read(partition: int, start: int, count: int) -> list[list[int]]:
        log = logs[partition]
        return [[partition, o, log[o]] for o in range(start, min(len(log), start + count))]

    for _ in range(
        draw(st.integers(max_steps // 3, max_steps))
    ):  # a step: one client or one info send moves
        who = draw(st.integers(0, processes))
        if who == processes:  # an info send's late effect, or its loss
            if ghosts:
                index = draw(st.integers(0, len(ghosts) - 1))
                partition, value = ghosts.pop(index)
                if draw(st.booleans()):
                    logs[partition].append(value)
            continue
        op = pending.get(who)
        if op is None:
            if draw(st.booleans()):
                partition = draw(st.integers(0, partitions - 1))
                op = _Pending("send", [partition], value=next_value)
                next_value += 1
                record(who, "invoke", "send", {"partition": partition, "value": op.value})
            else:
                chosen = draw(st.lists(st.integers(0, partitions - 1), min_size=1, unique=True))
                op = _Pending("poll", chosen)
                record(who, "invoke", "poll", {"partitions": chosen})
            pending[who] = op
            continue
        action = draw(
            st.sampled_from(["effect", "effect", "effect", "complete", "complete", "info"])
        )
        if action == "effect" and not op.effected:
            op.effected = True
            if op.f == "send":
                op.offset = len(logs[op.partitions[0]])
                logs[op.partitions[0]].append(op.value)
            else:
                for partition in op.partitions:
                    start = draw(st.integers(0, len(logs[partition])))
                    op.records += read(partition, start, draw(st.integers(0, 4)))
            continue
        del pending[who]
        if action == "info":
            sent = {"partition": op.partitions[0], "value": op.value} if op.f == "send" else {}
            record(who, "info", op.f, sent)
            if op.f == "send" and not op.effected:
                ghosts.append((op.partitions[0], op.value))
        elif op.f == "send":
            if op.effected:
                record(
                    who,
                    "ok",
                    "send",
                    {"partition": op.partitions[0], "value": op.value, "offset": op.offset},
                )
            else:
                record(who, "fail", "send", {"partition": op.partitions[0], "value": op.value})
        elif op.effected:
            record(who, "ok", "poll", {"records": op.records})
        else:
            record(who, "fail", "poll", {})
    if draw(st.booleans()):  # a final read of everything, by a fresh process
        everything = list(range(partitions))
        record(processes + 1, "invoke", "poll", {"partitions": everything, "final": True})
        records = [r for p in everything for r in read(p, 0, len(logs[p]))]
        record(processes + 1, "ok", "poll", {"records": records})
    return Generated(recorder.ops, [len(log) for log in logs])


@settings(max_examples=120)
@given(correct_histories())
def test_generated_correct_histories_are_linearizable(generated: Generated) -> None:
    result = check_history(generated.ops, time_limit_s=10.0)
    assert result.verdict == "ok", result.describe()


def _append_tail(generated: Generated, mutate: str) -> list[Op]:
    """Two acked sends after the run, then a read of them in partition 0, maybe mutated."""
    base = generated.ends[0]
    recorder = Recorder()
    recorder.ops.extend(generated.ops)
    clock = max((op.time_ns for op in generated.ops), default=0)
    process = 1000
    for n, value in enumerate(("tail-a", "tail-b")):
        recorder.add(process, "invoke", "send", clock + 1, {"partition": 0, "value": value})
        done = {"partition": 0, "value": value, "offset": base + n}
        recorder.add(process, "ok", "send", clock + 2, done)
        clock += 2
    read = [[0, base, "tail-a"], [0, base + 1, "tail-b"]]
    if mutate == "lost":  # tail-a vanished, tail-b slid down into its offset
        read = [[0, base, "tail-b"]]
    elif mutate == "reorder":
        read = [[0, base, "tail-b"], [0, base + 1, "tail-a"]]
    elif mutate == "duplicate":
        read = [*read, [0, base + 2, "tail-a"]]
    recorder.add(process, "invoke", "poll", clock + 1, {"partitions": [0]})
    recorder.add(process, "ok", "poll", clock + 2, {"records": read})
    return recorder.ops


@settings(max_examples=40)
@given(correct_histories(max_steps=40), st.sampled_from(["lost", "reorder", "duplicate"]))
def test_generated_histories_with_seeded_anomalies_fail(generated: Generated, mutate: str) -> None:
    baseline = check_history(_append_tail(generated, "none"), time_limit_s=10.0)
    assert baseline.verdict == "ok", baseline.describe()
    result = check_history(_append_tail(generated, mutate), time_limit_s=10.0)
    assert result.verdict == "fail", result.describe()
    assert result.partition(0).verdict == "fail"


def test_a_long_random_history_checks_quickly() -> None:
    """2,000 operations over four partitions with eight concurrent clients. Quickly is counted
    in search steps, not seconds (a busy machine must not fail it): a correct log is linearized
    almost without backtracking, one step per operation, where a search gone exponential takes
    many times more."""
    rng = random.Random(20240601)
    recorder = Recorder()
    logs: list[list[int]] = [[] for _ in range(4)]
    clock = 0
    in_flight: list[tuple[int, str, dict[str, Any], dict[str, Any]]] = []

    def add(process: int, type_: Any, f: str, value: dict[str, Any]) -> None:
        nonlocal clock
        clock += 1
        recorder.add(process, type_, f, clock, value)

    for n in range(2000):
        process = n % 8
        if len(in_flight) == 8:  # complete the oldest before its process invokes again
            old_process, f, _, done = in_flight.pop(0)
            add(old_process, "ok", f, done)
        partition = rng.randrange(4)
        if rng.random() < 0.7:
            add(process, "invoke", "send", {"partition": partition, "value": n})
            offset = len(logs[partition])
            logs[partition].append(n)
            done = {"partition": partition, "value": n, "offset": offset}
            in_flight.append((process, "send", {}, done))
        else:
            add(process, "invoke", "poll", {"partitions": [partition]})
            start = rng.randrange(len(logs[partition]) + 1)
            log = logs[partition]
            records = [[partition, o, log[o]] for o in range(start, min(len(log), start + 5))]
            in_flight.append((process, "poll", {}, {"records": records}))
    for old_process, f, _, done in in_flight:
        add(old_process, "ok", f, done)
    result = check_operations(pair(recorder.ops), time_limit_s=20.0)
    assert result.verdict == "ok", result.describe()
    assert result.counts["send_ok"] + result.counts["poll_ok"] == 2000
    assert all(r.steps <= 2 * r.operations for r in result.partitions), result.partitions
