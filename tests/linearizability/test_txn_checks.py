"""The transactional checks (``automq_ref.checker.transactional``) on hand-made histories: each
anomaly kind is found where it is, and nothing is found in a history that has none."""

from __future__ import annotations

from typing import Any

from automq_ref.checker.history import Op, OpType, Recorder
from automq_ref.checker.transactional import check_all, project


class Builder:
    def __init__(self) -> None:
        self.recorder = Recorder()
        self.time_ns = 0

    def _add(self, process: int, type_: OpType, f: str, value: dict[str, Any]) -> Op:
        self.time_ns += 1
        return self.recorder.add(process, type_, f, self.time_ns, value)

    def txn(self, process: int, outcome: OpType, *mops: list[Any]) -> int:
        """A transaction: ``["send", p, v, offset]`` and ``["poll", [[p, o, v], ...]]``."""
        planned = [m[:3] if m[0] == "send" else ["poll"] for m in mops]
        invoke = self._add(process, "invoke", "txn", {"mops": planned, "partitions": [0, 1]})
        self._add(process, outcome, "txn", {"mops": [list(m) for m in mops]})
        return invoke.index

    def poll(self, process: int, *records: list[Any]) -> None:
        self._add(process, "invoke", "poll", {"partitions": [0, 1]})
        self._add(process, "ok", "poll", {"records": [list(r) for r in records]})

    def final(self, partition: int, end: int, *records: tuple[int, str]) -> None:
        self._add(1000 + partition, "invoke", "poll", {"partitions": [partition], "final": True})
        self._add(
            1000 + partition,
            "ok",
            "poll",
            {
                "records": [[partition, offset, value] for offset, value in records],
                "final": True,
                "log_start": {str(partition): 0},
                "log_end": {str(partition): end},
            },
        )

    @property
    def ops(self) -> list[Op]:
        return self.recorder.ops


def clean() -> Builder:
    """Two committed transactions over two partitions, an aborted one, reads of both
    committed ones (their markers take offsets 1 and 3 of partition 0, 1 of partition 1)."""
    b = Builder()
    b.txn(1, "ok", ["send", 0, "1-0", 0], ["send", 1, "1-1", 0])
    b.txn(1, "fail", ["send", 0, "1-2", 2])
    b.txn(2, "ok", ["send", 0, "2-0", 4], ["poll", [[0, 0, "1-0"], [1, 0, "1-1"]]])
    b.poll(100, [0, 0, "1-0"], [0, 4, "2-0"], [1, 0, "1-1"])
    b.final(0, 6, (0, "1-0"), (4, "2-0"))
    b.final(1, 2, (0, "1-1"))
    return b


def test_a_clean_history_has_no_anomaly() -> None:
    report = check_all(clean().ops)
    assert report.valid, report.report.anomalies
    assert report.outcomes == {"ok": 2, "fail": 1}
    assert report.allowed == {"G0": 0}


def test_the_projection_gives_each_micro_operation_its_transactions_outcome() -> None:
    projected, owner = project(clean().ops)
    sends = [op for op in projected if op.f == "send" and op.type != "invoke"]
    assert [(op.type, op.value["value"], op.value.get("offset")) for op in sends] == [
        ("ok", "1-0", 0),
        ("ok", "1-1", 0),
        ("fail", "1-2", None),
        ("ok", "2-0", 4),
    ]
    assert len(set(owner.values())) == 3  # every projected operation names its transaction


def test_a_read_of_an_aborted_transaction_is_caught() -> None:
    b = clean()
    b.poll(101, [0, 2, "1-2"])
    report = check_all(b.ops)
    assert report.report.counts["aborted-read"] == 1


def test_a_torn_transaction_is_a_lost_write() -> None:
    b = Builder()
    # Its commit is unknown, but one of its writes is visible: the other must be too.
    b.txn(1, "info", ["send", 0, "1-0", 0], ["send", 1, "1-1", None])
    b.final(0, 2, (0, "1-0"))
    b.final(1, 2)
    report = check_all(b.ops)
    lost = [a for a in report.report.anomalies if a.kind == "lost-write"]
    assert [a.values for a in lost] == [("1-1",)], report.report.anomalies
    assert "torn" in lost[0].explanation


def test_an_unknown_transaction_seen_nowhere_is_no_anomaly() -> None:
    b = Builder()
    b.txn(1, "info", ["send", 0, "1-0", None], ["send", 1, "1-1", None])
    b.final(0, 1)
    b.final(1, 1)
    assert check_all(b.ops).valid


def test_a_transaction_reading_its_own_writes_is_caught() -> None:
    b = Builder()
    b.txn(1, "ok", ["send", 0, "1-0", 0], ["poll", [[0, 0, "1-0"]]])
    b.final(0, 2, (0, "1-0"))
    assert check_all(b.ops).report.counts["precommitted-read"] == 1


def test_cyclic_information_flow_is_g1c() -> None:
    b = Builder()
    b.txn(1, "ok", ["send", 0, "1-0", 0], ["poll", [[1, 0, "2-0"]]])
    b.txn(2, "ok", ["send", 1, "2-0", 0], ["poll", [[0, 0, "1-0"]]])
    b.final(0, 2, (0, "1-0"))
    b.final(1, 2, (0, "2-0"))
    report = check_all(b.ops)
    assert report.report.counts["G1c"] == 1, report.report.anomalies


def test_interleaved_writes_are_g0_and_allowed() -> None:
    b = Builder()
    b.txn(1, "ok", ["send", 0, "1-0", 0], ["send", 1, "1-1", 1])
    b.txn(2, "ok", ["send", 0, "2-0", 1], ["send", 1, "2-1", 0])
    b.final(0, 4, (0, "1-0"), (1, "2-0"))
    b.final(1, 4, (0, "2-1"), (1, "1-1"))
    report = check_all(b.ops)
    assert report.allowed == {"G0": 1}
    assert report.valid, report.report.anomalies


def test_polls_going_back_inside_one_transaction_are_internal() -> None:
    b = Builder()
    b.txn(3, "ok", ["poll", [[0, 4, "2-0"]]], ["poll", [[0, 0, "1-0"]]])
    b.txn(1, "ok", ["send", 0, "1-0", 0])
    b.txn(2, "ok", ["send", 0, "2-0", 4])
    b.final(0, 6, (0, "1-0"), (4, "2-0"))
    counts = check_all(b.ops).report.counts
    assert counts["int-nonmonotonic-poll"] == 1
    assert counts["nonmonotonic-poll"] == 0


def test_polls_going_back_across_transactions_are_external() -> None:
    b = Builder()
    b.txn(3, "ok", ["poll", [[0, 4, "2-0"]]])
    b.txn(3, "ok", ["poll", [[0, 0, "1-0"]]])
    b.txn(1, "ok", ["send", 0, "1-0", 0])
    b.txn(2, "ok", ["send", 0, "2-0", 4])
    b.final(0, 6, (0, "1-0"), (4, "2-0"))
    counts = check_all(b.ops).report.counts
    assert counts["nonmonotonic-poll"] == 1
    assert counts["int-nonmonotonic-poll"] == 0


def test_a_skip_inside_one_transaction_is_internal() -> None:
    b = Builder()
    b.txn(1, "ok", ["send", 0, "1-0", 0], ["send", 0, "1-1", 1], ["send", 0, "1-2", 2])
    b.txn(3, "ok", ["poll", [[0, 0, "1-0"]]], ["poll", [[0, 2, "1-2"]]])
    b.poll(100, [0, 0, "1-0"], [0, 1, "1-1"], [0, 2, "1-2"])
    b.final(0, 4, (0, "1-0"), (1, "1-1"), (2, "1-2"))
    assert check_all(b.ops).report.counts["int-poll-skip"] == 1
