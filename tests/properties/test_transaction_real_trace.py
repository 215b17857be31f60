"""The transaction coordinator of a real broker, validated against specs/Transaction.tla with TLC.

An embedded broker (``start_node``: the metadata log, the WAL, object storage in a local
directory, the transaction coordinator over ``__transaction_state``) with tracing on
(``TransactionCoordinator.trace``, set before the first transactional request): its shard
records every step of one transactional id as the shell takes it (a request once it is
stepped, a record once it is durable in ``__transaction_state``, a marker once it is durable in
its partition). The test plays two producer instances through the coordinator's API (what the
request handlers call) and writes their transactional batches into two partitions, verified
as the produce handler does: a commit over both partitions, an abort, a new instance fencing
the first's transaction (the zombie's EndTxn refused), a late write refused by verification
after a KIP-360 bump, a transaction aborted by the coordinator's timeout.

The trace observes the coordinator (every variable of it) and, on each marker's line, the
markers the shell wrote to that partition; the instances, the writes and the history are left
to TLC (docs/trace_validation.md, "Transaction traces from a real run"). TLC accepts it; a copy
with a marker moved before its decision, and the run of a broker with the checker's broken
mode ``txn-markers-before-decision`` (the ``before_decision`` seam: every marker written
before the decision is appended), are rejected at that marker.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Producer

from automq_ref.config import load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.record_batch_builder import build_record_batch
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.transaction_shard import TransactionTrace
from automq_ref.node import Node, Seams, start_node
from automq_ref.state_machines import transaction as tx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.properties.trace_batches import line_of

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

E = KafkaErrorCode
S = tx.TransactionState
TID = "traced"
LONG_MS = 60_000  # a transaction timeout no step of the test reaches
SHORT_MS = 300  # the last transaction's timeout, which it runs past
TICK_MS = 100  # transaction.abort.timed.out.transaction.cleanup.interval.ms


async def broker(tmp_path: Path, seams: Seams | None = None) -> Node:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "s3.wal.capacity=16777216",
            "transaction.state.log.num.partitions=1",
            f"transaction.abort.timed.out.transaction.cleanup.interval.ms={TICK_MS}",
        ],
        environment={},
    )
    return await start_node(config, Seams() if seams is None else seams)


async def until(done: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s} s"
        await asyncio.sleep(0.01)


class Producers:
    """The test's producer instances of ``TID``: the coordinator's API, and transactional
    writes verified as the produce handler verifies them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.coordinator = node.transactions
        self.sequences: dict[tuple[str, int, int], int] = {}

    def status(self) -> S | None:
        ((_, _, metadata),) = self.coordinator.describe([TID])
        return None if metadata is None else metadata.state

    async def completed(self, state: S) -> None:
        await until(lambda: self.status() is state, state.name)

    async def init(
        self, timeout_ms: int, pid: int = -1, epoch: int = -1
    ) -> tx.InitProducerIdAnswer:
        return await self.coordinator.init_producer_id(TID, timeout_ms, pid, epoch)

    async def add(self, pid: int, epoch: int, *partitions: Partition) -> None:
        keys = [(p.topic, p.index) for p in partitions]
        answer = await self.coordinator.add_partitions(TID, pid, epoch, keys)
        assert {error for _, error in answer.errors} == {E.NONE}, answer

    async def end(self, pid: int, epoch: int, commit: bool) -> KafkaErrorCode:
        return await self.coordinator.end_txn(TID, pid, epoch, commit)

    async def write(self, partition: Partition, pid: int, epoch: int) -> KafkaErrorCode:
        """One transactional batch: verified with the coordinator first if it would begin a
        transaction at the partition (``verify_produce``), then appended and made durable."""
        guard = 0
        if partition.transaction_needs_verification(pid, epoch):
            guard = partition.begin_transaction_verification(pid, epoch)
            error = await self.coordinator.verify(
                TID, pid, epoch, (partition.topic, partition.index)
            )
            if error is not E.NONE:
                return error
        key = (partition.topic, pid, epoch)
        sequence = self.sequences.get(key, 0)
        self.sequences[key] = sequence + 1
        batch = build_record_batch(
            [(b"k", b"v%d" % sequence, (), int(time.time() * 1000))],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=True,
        )
        result = partition.append_nowait(batch, 1 << 20, verification_guard=guard)
        assert result.error is E.NONE, result.message
        assert result.durable is not None
        await result.durable
        return E.NONE


async def topics(node: Node) -> tuple[Partition, Partition]:
    for name in ("a", "b"):
        await node.topics.create_topic(name, 1, {})
    return node.topics.partitions[("a", 0)], node.topics.partitions[("b", 0)]


async def one_commit(node: Node) -> TransactionTrace:
    """Tracing on; one instance commits one transaction over two partitions."""
    trace = node.transactions.trace = TransactionTrace(TID)
    a, b = await topics(node)
    producers = Producers(node)
    first = await producers.init(LONG_MS)
    assert first.error is E.NONE
    pid, epoch = first.producer_id, first.producer_epoch
    await producers.add(pid, epoch, a, b)
    assert await producers.write(a, pid, epoch) is E.NONE
    assert await producers.write(b, pid, epoch) is E.NONE
    assert await producers.end(pid, epoch, commit=True) is E.NONE
    await producers.completed(S.CompleteCommit)
    return trace


async def lifecycle(node: Node) -> TransactionTrace:
    trace = await one_commit(node)
    a, b = node.topics.partitions[("a", 0)], node.topics.partitions[("b", 0)]
    p = Producers(node)
    ((_, _, metadata),) = p.coordinator.describe([TID])
    assert metadata is not None
    pid, epoch = metadata.producer_id, metadata.producer_epoch
    # An abort.
    await p.add(pid, epoch, a)
    assert await p.write(a, pid, epoch) is E.NONE
    assert await p.end(pid, epoch, commit=False) is E.NONE
    await p.completed(S.CompleteAbort)
    # A new instance over the first's ongoing transaction: the coordinator fences it.
    await p.add(pid, epoch, b)
    assert await p.write(b, pid, epoch) is E.NONE
    assert (await p.init(LONG_MS)).error is E.CONCURRENT_TRANSACTIONS
    await p.completed(S.CompleteAbort)
    second = await p.init(LONG_MS)
    assert second.error is E.NONE and second.producer_epoch == epoch + 2
    assert await p.end(pid, epoch, commit=True) is E.PRODUCER_FENCED  # the zombie
    epoch = second.producer_epoch
    # A write given up on: the instance aborts and bumps its epoch (KIP-360); the write
    # arrives after, and verification refuses it.
    await p.add(pid, epoch, a)
    assert await p.end(pid, epoch, commit=False) is E.NONE
    await p.completed(S.CompleteAbort)
    bumped = await p.init(SHORT_MS, pid, epoch)
    assert bumped.error is E.NONE and bumped.producer_epoch == epoch + 1
    assert await p.write(a, pid, epoch) is E.PRODUCER_FENCED
    epoch = bumped.producer_epoch
    # A transaction past its timeout: the coordinator aborts it; the instance is not told.
    await p.add(pid, epoch, b)
    assert await p.write(b, pid, epoch) is E.NONE
    await p.completed(S.CompleteAbort)
    assert await p.end(pid, epoch, commit=True) is E.PRODUCER_FENCED
    return trace


async def markers_first(writers: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """The checker's ``txn-markers-before-decision``: every marker before the decision."""
    for write in writers:
        await write()


def lines(trace: TransactionTrace) -> list[tv.TraceLine]:
    found = []
    for entry in trace.lines:
        action, state = entry["action"], entry["state"]
        assert isinstance(action, str) and isinstance(state, dict)
        found.append(tv.TraceLine(action, state))
    return found


async def test_a_real_coordinators_trace_is_a_behaviour_of_the_spec(tmp_path: Path) -> None:
    node = await broker(tmp_path / "good")
    try:
        good = lines(await lifecycle(node))
    finally:
        await node.shutdown()
    node = await broker(tmp_path / "broken", Seams(before_decision=markers_first))
    try:
        broken = lines(await one_commit(node))
    finally:
        await node.shutdown()

    actions = [line.action for line in good]
    for action in ("EndTxn", "MarkerWritten", "CompleteTransaction", "FenceOngoing"):
        assert action in actions, action
    decision = line_of(good, "EndTxn")
    marker = line_of(good, "MarkerWritten")
    assert decision < marker
    early = line_of(broken, "MarkerWritten")
    # The forged copy: the commit's first marker stepped just before its decision (the states
    # of the later lines unchanged: the marker's line still shows PrepareCommit).
    swapped = [*good[: decision - 1], good[marker - 1], *good[decision - 1 :]]
    del swapped[marker]
    verdicts = tv.validate_many([good, swapped, broken], "Transaction")
    accepted, forged, seam = verdicts
    assert accepted.accepted, f"{accepted}\n{accepted.log_tail}\n{tv_lines(good)}"
    assert not forged.accepted and forged.matched == decision - 1, str(forged)
    assert not seam.accepted and seam.matched == early - 1, f"{seam}\n{tv_lines(broken)}"
    assert f"line {early} (MarkerWritten)" in seam.message


def tv_lines(trace: list[tv.TraceLine]) -> str:
    return "".join(line.to_json() + "\n" for line in trace)


def confluent_transactions(bootstrap: str, transactional_id: str) -> None:
    """A real client: one committed and one aborted transaction over two partitions. The
    records are flushed before the abort: librdkafka aborts a transaction whose partitions it
    has not yet added on its own, without an EndTxn, so unflushed the broker may never see the
    second transaction."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        for topic in ("a", "b"):
            producer.produce(topic, b"v")
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


async def test_the_trace_dir_records_each_new_id_for_validation(tmp_path: Path) -> None:
    """``transaction.trace.dir``: a broker's coordinator writes the steps of each transactional
    id it first served into ``<id>.ndjson``; a confluent-kafka producer's run is accepted by
    ``specs/trace_validate.py``; an id loaded from the log at the next start is not traced."""
    traces = tmp_path / "traces"
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path / 'data'}",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "s3.wal.capacity=16777216",
            "transaction.state.log.num.partitions=1",
            f"transaction.trace.dir={traces}",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        await node.listen()
        await topics(node)
        host, port = node.advertised_address
        await asyncio.to_thread(confluent_transactions, f"{host}:{port}", "real/client")
        path = traces / "real%2Fclient.ndjson"
        await until(
            lambda: path.exists() and path.read_text().count('"CompleteTransaction"') == 2,
            "the abort completed in the trace",
        )
    finally:
        await node.shutdown()
    recorded = [json.loads(line) for line in path.read_text().splitlines()]
    trace = [tv.TraceLine(line["action"], line["state"]) for line in recorded]
    actions = [line.action for line in trace]
    # Each EndTxn is two steps: the request, then its Prepare* record landing.
    assert actions[0] == "Init" and actions.count("EndTxn") == 4, actions
    assert trace[-1].state["txnState"] == "CompleteAbort", trace[-1]
    (verdict,) = tv.validate_many([trace], "Transaction")
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}\n{tv_lines(trace)}"
    # The next start loads the id from the log: not traced again (its trace would not begin
    # at the spec's Init).
    node = await start_node(config)
    try:
        await node.listen()
        host, port = node.advertised_address
        await asyncio.to_thread(confluent_transactions, f"{host}:{port}", "real/client")
    finally:
        await node.shutdown()
    assert len(path.read_text().splitlines()) == len(recorded)


async def test_the_next_transaction_begins_in_the_last_markers_step(tmp_path: Path) -> None:
    """EndTxn is answered before the markers; the same producer's next AddPartitionsToTxn,
    asked at once, waits for them instead of CONCURRENT_TRANSACTIONS and is stepped in the
    step of the last one, with the Complete* record still on its way: its Ongoing record is
    durable behind it (the trace: the request a stutter after MarkerWritten, then
    CompleteTransaction and AddPartitionsToTxn as their records land), and TLC accepts the
    run."""
    node = await broker(tmp_path)
    try:
        trace = node.transactions.trace = TransactionTrace(TID)
        a, _ = await topics(node)
        p = Producers(node)
        first = await p.init(LONG_MS)
        pid, epoch = first.producer_id, first.producer_epoch
        for _ in range(3):
            await p.add(pid, epoch, a)
            assert await p.write(a, pid, epoch) is E.NONE
            assert await p.end(pid, epoch, commit=True) is E.NONE
            assert p.status() is S.PrepareCommit  # answered before its marker
        await p.add(pid, epoch, a)
        assert p.status() is S.Ongoing
        assert await p.end(pid, epoch, commit=False) is E.NONE
        await p.completed(S.CompleteAbort)
    finally:
        await node.shutdown()
    good = lines(trace)
    actions = [line.action for line in good]
    after_marker = ["MarkerWritten", "AddPartitionsToTxn", "CompleteTransaction"]
    assert sum(actions[i : i + 3] == after_marker for i in range(len(actions))) == 3, actions
    (verdict,) = tv.validate_many([good], "Transaction")
    assert verdict.accepted, f"{verdict}\n{verdict.log_tail}\n{tv_lines(good)}"
