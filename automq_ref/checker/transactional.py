"""Jepsen's transactional checks for Kafka histories with ``txn`` operations (the workload of
:mod:`automq_ref.checker.txn_workload`).

A ``txn`` operation is a transaction of micro-operations: sends of unique values and polls of
the process's ``read_committed`` consumer (its invoke value lists the partitions that consumer
is assigned, ``"partitions"``, beside the planned ``"mops"``). Its outcome says what happened
to its sends: ``ok``, committed; ``fail``, aborted (none of them may ever be read); ``info``,
unknown (it may have committed). The checks, in two layers:

- **The queue checks** (:mod:`automq_ref.checker.queue`) on the history *projected* to sends
  and polls (:func:`project`): each micro-send becomes a send with its transaction's outcome
  (and its delivery report's offset), each micro-poll a poll, in order, under the transaction's
  process. They find inconsistent offsets, duplicates, lost writes, aborted reads (a read value
  of a ``fail`` transaction, Elle's G1a), poll skips and non-monotonic polls, non-monotonic
  sends, unseen and mismatched offsets. A skip or a non-monotonic poll between two polls of one
  transaction is reported as the *internal* kind (``int-poll-skip``,
  ``int-nonmonotonic-poll``), between transactions (or plain polls) as the *external* one.
- **The transactions' own checks:**

  - ``lost-write`` of a whole transaction: a transaction that committed (``ok``, or ``info``
    with one of its values read anywhere: then it committed) must be visible entirely; a value
    of it missing from a final read that reached its partition's end is lost (a torn
    transaction: some partitions got its COMMIT marker, others an ABORT).
  - ``precommitted-read``: a transaction's poll returned one of its own sends (its consumer is
    ``read_committed``: nothing of an open transaction is visible, its own writes neither).
  - ``G1c``: a cycle of write-read dependencies between transactions (T1 read what T2 wrote
    and T2, directly or through others, read what T1 wrote): cyclic information flow. Only
    write-read edges are used: Kafka orders no writes of concurrent transactions, so with
    write-write edges (per partition, the order of the two transactions' records) every
    interleaving of two transactions' sends would make a cycle; Jepsen's Kafka checker allows
    G1c with those edges for that reason.
  - ``G0``: cycles of write-write edges, counted and shown as *allowed* (not against the
    verdict): two concurrent transactions writing two partitions in opposite orders is legal
    Kafka. The count tells how much the run interleaved transactions.

Cycles are found as the strongly connected components of the dependency graph (networkx); each
component of more than one transaction is one anomaly, with one cycle of it as the example.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from automq_ref.checker import queue
from automq_ref.checker.history import Op, Operation, OpType, Recorder, pair
from automq_ref.checker.queue import Anomaly, QueueHistory, Report

TXN_KINDS: tuple[str, ...] = (
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "precommitted-read",
    "G1c",
)
ALLOWED_KINDS: tuple[str, ...] = ("G0",)


@dataclass(frozen=True, slots=True)
class Transaction:
    op: int  # the invoke entry's index
    process: int
    outcome: str
    sends: tuple[tuple[int, Hashable, int | None], ...]  # (partition, value, offset)
    reads: tuple[tuple[int, int, Hashable], ...]  # (partition, offset, value), in poll order


@dataclass(frozen=True, slots=True)
class TxnReport:
    """The anomalies against the verdict (``report``), the allowed ones counted apart, the
    projected history the queue checks and the plot read, and the transactions per outcome."""

    report: Report
    allowed: dict[str, int]
    allowed_examples: tuple[Anomaly, ...]
    projected: list[Op]
    outcomes: dict[str, int]

    @property
    def valid(self) -> bool:
        return self.report.valid


def transactions(operations: Iterable[Operation]) -> list[Transaction]:
    found = []
    for operation in operations:
        if operation.f != "txn":
            continue
        done = operation.completion.value.get("mops") if operation.completion else None
        mops: Sequence[Any] = done if done is not None else operation.invoke.value["mops"]
        sends = []
        reads = []
        for mop in mops:
            if mop[0] == "send":
                offset = mop[3] if len(mop) > 3 and done is not None else None
                sends.append((int(mop[1]), queue._hashable(mop[2]), _offset(offset)))
            elif len(mop) > 1:
                reads += [(int(p), int(o), queue._hashable(v)) for p, o, v in mop[1]]
        found.append(
            Transaction(
                operation.invoke.index,
                operation.invoke.process,
                operation.outcome,
                tuple(sends),
                tuple(reads),
            )
        )
    return found


def _offset(raw: Any) -> int | None:
    return None if raw is None or int(raw) < 0 else int(raw)


def project(ops: Iterable[Op]) -> tuple[list[Op], dict[int, int]]:
    """The history with each ``txn`` replaced by its micro-operations as sends and polls
    (emitted where the transaction completes, one after another under its process), and for
    each projected operation's invoke index the index of the transaction it came from."""
    recorder = Recorder()
    owner: dict[int, int] = {}
    open_txns: dict[int, Op] = {}
    for op in ops:
        if op.f != "txn":
            recorder.add(op.process, op.type, op.f, op.time_ns, op.value)
            continue
        if op.type == "invoke":
            open_txns[op.process] = op
            continue
        invoke = open_txns.pop(op.process)
        _emit(recorder, owner, invoke, op)
    for invoke in open_txns.values():  # never completed: as info
        _emit(recorder, owner, invoke, None)
    return recorder.ops, owner


def _emit(recorder: Recorder, owner: dict[int, int], invoke: Op, done: Op | None) -> None:
    outcome: OpType = "info" if done is None else done.type
    mops = invoke.value["mops"] if done is None else done.value.get("mops", [])
    end_ns = invoke.time_ns if done is None else done.time_ns
    for mop in mops:
        if mop[0] == "send":
            sent = {"partition": mop[1], "value": mop[2]}
            first = recorder.add(invoke.process, "invoke", "send", invoke.time_ns, sent)
            completed = dict(sent)
            if outcome == "ok" and len(mop) > 3 and mop[3] is not None:
                completed["offset"] = mop[3]
            recorder.add(invoke.process, outcome, "send", end_ns, completed)
        elif len(mop) > 1:
            assigned = {"partitions": invoke.value.get("partitions", [])}
            first = recorder.add(invoke.process, "invoke", "poll", invoke.time_ns, assigned)
            recorder.add(invoke.process, "ok", "poll", end_ns, {"records": mop[1]})
        else:
            continue
        owner[first.index] = invoke.index


def check_all(ops: Sequence[Op]) -> TxnReport:
    operations = pair(ops)
    txns = transactions(operations)
    projected, owner = project(ops)
    history = QueueHistory.from_ops(projected)
    queued = queue.check_all(history)
    anomalies = [_internal(anomaly, owner) for anomaly in queued.anomalies]
    lost = {
        value for anomaly in anomalies if anomaly.kind == "lost-write" for value in anomaly.values
    }
    anomalies += check_torn(txns, history, lost)
    anomalies += check_precommitted_reads(txns)
    anomalies += check_g1c(txns)
    g0 = check_g0(txns, history)
    counts: dict[str, int] = dict.fromkeys((*queue.KINDS, *TXN_KINDS), 0)
    for anomaly in anomalies:
        counts[anomaly.kind] += 1
    outcomes: dict[str, int] = defaultdict(int)
    for txn in txns:
        outcomes[txn.outcome] += 1
    return TxnReport(
        Report(tuple(anomalies), counts),
        {"G0": len(g0)},
        tuple(g0[:5]),
        projected,
        dict(outcomes),
    )


def _internal(anomaly: Anomaly, owner: dict[int, int]) -> Anomaly:
    """A poll skip or non-monotonic poll whose polls belong to one transaction: internal."""
    if anomaly.kind not in ("poll-skip", "nonmonotonic-poll"):
        return anomaly
    txns = {owner.get(op, -1) for op in anomaly.ops}
    if len(txns) != 1 or -1 in txns:
        return anomaly
    (txn,) = txns
    return Anomaly(
        f"int-{anomaly.kind}",
        anomaly.partition,
        anomaly.offsets,
        anomaly.values,
        (txn,),
        f"within transaction {txn}: {anomaly.explanation}",
    )


def check_torn(
    txns: Iterable[Transaction], history: QueueHistory, reported: set[Hashable]
) -> list[Anomaly]:
    """Committed transactions not visible entirely in the final read (``lost-write``)."""
    read_values = {read.value for poll in history.polls for read in poll.records}
    out = []
    for txn in txns:
        if txn.outcome == "fail" or not txn.sends:
            continue
        seen = [value for _, value, _ in txn.sends if value in read_values]
        if txn.outcome == "info" and not seen:
            continue
        for partition, value, offset in txn.sends:
            if (
                value in history.final_values
                or value in reported
                or partition not in history.final_log_end
            ):
                continue
            why = (
                "it committed"
                if txn.outcome == "ok"
                else f"its commit is unknown, but {seen[0]!r} of it was read, so it committed"
            )
            out.append(
                Anomaly(
                    "lost-write",
                    partition,
                    () if offset is None else (offset,),
                    (value,),
                    (txn.op, *history.final_ops),
                    f"value {value!r} of transaction {txn.op} is missing from the final read "
                    f"of partition {partition}, which reached the partition's end; {why} "
                    "(a torn transaction)",
                )
            )
    return out


def check_precommitted_reads(txns: Iterable[Transaction]) -> list[Anomaly]:
    out = []
    for txn in txns:
        own = {value for _, value, _ in txn.sends}
        for partition, offset, value in txn.reads:
            if value in own:
                out.append(
                    Anomaly(
                        "precommitted-read",
                        partition,
                        (offset,),
                        (value,),
                        (txn.op,),
                        f"transaction {txn.op} read its own send {value!r} at offset {offset} "
                        "before it committed",
                    )
                )
    return out


def check_g1c(txns: Sequence[Transaction]) -> list[Anomaly]:
    """Cycles of write-read edges: writer -> reader, for a value one transaction wrote and
    another read."""
    writer = {value: txn.op for txn in txns for _, value, _ in txn.sends}
    graph = nx.DiGraph()
    for txn in txns:
        for _, _, value in txn.reads:
            source = writer.get(value)
            if source is not None and source != txn.op:
                graph.add_edge(source, txn.op, value=value)
    return [
        _cycle("G1c", graph, component, "read what the next one wrote")
        for component in _cyclic(graph)
    ]


def check_g0(txns: Sequence[Transaction], history: QueueHistory) -> list[Anomaly]:
    """Cycles of write-write edges, from each partition's order in the final read."""
    writer = {value: txn.op for txn in txns for _, value, _ in txn.sends}
    order: dict[int, list[tuple[int, Hashable]]] = defaultdict(list)
    for (partition, offset), value in history.final.items():
        order[partition].append((offset, value))
    graph = nx.DiGraph()
    for records in order.values():
        previous = None
        for _, value in sorted(records, key=lambda record: record[0]):
            current = writer.get(value)
            if current is None:
                continue
            if previous is not None and previous != current:
                graph.add_edge(previous, current, value=value)
            previous = current
    return [
        _cycle("G0", graph, component, "wrote a partition before the next one did")
        for component in _cyclic(graph)
    ]


def _cyclic(graph: Any) -> list[set[int]]:
    return [c for c in nx.strongly_connected_components(graph) if len(c) > 1]


def _cycle(kind: str, graph: Any, component: set[int], relation: str) -> Anomaly:
    cycle = nx.find_cycle(graph.subgraph(component))
    steps = [int(source) for source, _ in cycle]
    values = tuple(graph.edges[source, target]["value"] for source, target in cycle)
    return Anomaly(
        kind,
        None,
        (),
        values,
        tuple(sorted(component)),
        f"{len(component)} transactions in a cycle; one: "
        + " -> ".join(map(str, [*steps, steps[0]]))
        + f" (each {relation}, by values {list(values)})",
    )
