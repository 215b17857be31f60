"""Trace validation of Transaction: runs of the coordinator and the partitions are behaviours of
the TLA+ spec.

The world is the property test's ``TransactionMachine`` (tests/properties/test_transaction.py):
the coordinator machine (``automq_ref.state_machines.transaction``) steps every request, record
and marker, each partition keeps ``transaction_partition``'s producer state and a log, and the
producer instances and the network are the spec's. Each run is recorded as a trace: the
coordinator's and the partitions' variables from the machines' ``tla_state``, the instances',
the network's and the logs from the world, one line per step, labelled with the spec's action
(``tla_action``: a request's decision takes effect when its record is durable, so the persist
is the request's step and the request itself a stutter). The history variables (``decisions``,
``aborts``, ``fenced``) and ``verified`` are left to TLC. A scripted scenario, the runs of a few
hypothesis examples and four broken traces, each rejected at the line that breaks it, go to
TLC in one batch; two more runs check the runs of the machine with the spec's two mutations
against the spec with the same mutation. docs/trace_validation.md explains the mapping.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from automq_ref.state_machines import transaction_partition as tp
from automq_ref.state_machines.transaction import (
    AddPartitionsToTxn,
    Tick,
    TransactionParams,
    TransactionPersistFailed,
    TransactionState,
)
from tests.properties.test_transaction import (
    PARTITIONS,
    TID,
    TIMEOUT_MS,
    TransactionMachine,
    Write,
    _add,
    _end,
    _init,
    _land,
    _late_write_run,
    _markers,
    _persist_all,
    _write,
    _zombie_run,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "specs"))
import trace_validate as tv

from tests.properties.trace_batches import (
    Batch,
    assert_generated_accepted,
    assert_mutation_breaks,
    assert_rejected_where_broken,
    assert_scenario_accepted,
    changed,
    line_of,
    relabelled,
    trace_lines,
    validate_batch,
)

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="TLC needs a Java runtime")

SPEC = "Transaction"
A, B = PARTITIONS


class TracedMachine(TransactionMachine):
    """The property test's world, recorded, within the spec's fragment: ids never expire (the
    spec has no Dead), the coordinator's own abort is always durable (a failed one is undone,
    which the spec, whose writes never fail, cannot do), and a partition verifies one write at
    a time: a write that would be verified while another write holds the guard waits until
    that one landed, was refused or was lost (the shell admits a connection's requests one at a
    time; both keep one guard per epoch, but the spec verifies an epoch once, where the
    partition verifies each write and the later ones share the guard)."""

    params = TransactionParams()
    traced = True
    fail_fences = False

    def held(self) -> set[tuple[str, int]]:
        """Partitions where a write in flight holds the partition's current guard."""
        return {
            w.partition
            for w in self.in_flight
            if w.guard != tp.NO_GUARD and w.guard == self.partitions[w.partition].entry.guard
        }

    def unverified(self) -> list[Write]:
        held = self.held()
        return [w for w in super().unverified() if w.partition not in held]

    def arriving(self) -> list[Write]:
        waiting = TransactionMachine.unverified(self)  # every write that needs a verification
        return [w for w in self.in_flight if w not in waiting]


def lines_of(machine: TransactionMachine) -> list[tv.TraceLine]:
    return trace_lines(machine.trace)


# ================================================================================= scenario


def lifecycle() -> TracedMachine:
    """i1 commits a transaction over both partitions (one AddPartitionsToTxn record failing
    first: a stutter), then aborts one. Its third is fenced by a new instance i2's
    InitProducerId (CONCURRENT_TRANSACTIONS, the abort, i2 asks again), and i1, a zombie, is
    PRODUCER_FENCED at EndTxn. i2 gives up on a write, aborts and bumps its epoch (KIP-360); the
    late write arrives and partition verification refuses it. In i2's next transaction a write
    is verified and lost, and another to the same partition is refused at its verification once
    i2 aborts. i2's last transaction runs past its timeout and the coordinator aborts it; i2's
    EndTxn is fenced."""
    m = TracedMachine()
    i1, i2 = m.instances["i1"], m.instances["i2"]
    _init(m, "i1")
    # A record that does not land: answered COORDINATOR_NOT_AVAILABLE, nothing changed.
    m.ask(i1, lambda r: AddPartitionsToTxn(r, TID, i1.producer_id, i1.epoch, (A, B), m.now_ms))
    m.apply(TransactionPersistFailed(TID, m.persists.pop().write_id))
    _add(m, "i1", A)
    _add(m, "i1", B)
    _land(m, _write(m, "i1", A))
    _land(m, _write(m, "i1", B))
    _end(m, "i1", commit=True)
    _markers(m)
    _add(m, "i1", A)
    _land(m, _write(m, "i1", A))
    _end(m, "i1", commit=False)
    _markers(m)
    _add(m, "i1", B)
    _land(m, _write(m, "i1", B))
    _init(m, "i2")  # over i1's ongoing transaction: fenced, aborted; i2 told to retry
    _markers(m)
    _init(m, "i2")
    _end(m, "i1", commit=True)  # the zombie: PRODUCER_FENCED
    assert i1.state == "FatalError" and i2.state == "Ready"
    _add(m, "i2", A)
    late = _write(m, "i2", A)
    m.give_up_write(i2, late.w)
    _end(m, "i2", commit=False)
    _markers(m)
    _init(m, "i2")  # KIP-360: the epoch bumped past the late write's
    _land(m, late)  # verification refuses it
    assert m.in_flight == [] and i2.state == "Ready"
    # Two writes to one partition: the first verified and lost, the second verified once the
    # transaction is aborting, and refused.
    _add(m, "i2", A)
    first, second = _write(m, "i2", A), _write(m, "i2", A)
    m.verify_write(first)
    (first,) = (w for w in m.in_flight if w.w == first.w)
    assert first.guard != tp.NO_GUARD
    m.in_flight.remove(first)
    m.record("Lose")
    m.give_up_write(i2, first.w)
    m.give_up_write(i2, second.w)
    _end(m, "i2", commit=False)
    m.verify_write(second)
    assert m.in_flight == []
    _markers(m)
    _init(m, "i2")
    _add(m, "i2", B)
    _land(m, _write(m, "i2", B))
    m.now_ms += TIMEOUT_MS + 1
    m.apply(Tick(m.now_ms))  # the timeout: FenceOngoing
    _persist_all(m)  # AbortFenced
    _markers(m)
    _end(m, "i2", commit=True)  # i2 was not told: PRODUCER_FENCED
    assert i2.state == "FatalError"
    entry = m.state.entries[TID]
    assert entry.metadata is not None and entry.metadata.state is TransactionState.CompleteAbort
    assert [result for _, result, _ in m.decisions] == ["COMMIT", "ABORT", "ABORT", "ABORT"]
    m.all_or_nothing()
    m.outcome_as_answered()
    m.no_zombie_commit()
    m.no_hanging_transaction()
    return m


def zombie_commit() -> list[tv.TraceLine]:
    """MCTransactionNoFenceBump's counterexample on the machine with that mutation: i1's
    transaction times out, the coordinator aborts it at the same epoch, and i1, not told, adds
    a partition, writes and commits. The trace ends where i1 is told its commit succeeded."""
    machine = _zombie_run(TransactionParams(bump_on_fence=False), TracedMachine)
    with pytest.raises(AssertionError, match="NoZombieCommit"):
        machine.no_zombie_commit()
    lines = lines_of(machine)
    return lines[: line_of(lines, "EndTxn")]


def late_write_lands() -> list[tv.TraceLine]:
    """MCTransactionNoVerify's counterexample on partitions that do not verify: i1 gives up on
    a write, aborts and bumps its epoch; the write lands after the abort marker."""
    machine = _late_write_run(verify=False, kind=TracedMachine)
    with pytest.raises(AssertionError, match="NoHangingTransaction"):
        machine.no_hanging_transaction()
    return lines_of(machine)


# ============================================================================ broken traces


def broken_cases() -> dict[str, tuple[list[tv.TraceLine], int]]:
    """Name -> (a broken trace, the line where it must be rejected)."""
    good = lines_of(lifecycle())
    commit_marker = line_of(good, "MarkerWritten")
    fence = line_of(good, "FenceOngoing")
    zombie = zombie_commit()
    late = late_write_lands()
    return {
        # The first marker of the commit recorded as an ABORT.
        "marker result": (
            changed(
                good,
                commit_marker,
                "log",
                _with_first_marker(good[commit_marker - 1].state["log"], "ABORT"),
            ),
            commit_marker,
        ),
        # The fence of i1's transaction reported as the persist of its abort.
        "relabelled": (relabelled(good, fence, "AbortFenced"), fence),
        # The mutated coordinator's fence keeps the epoch: the spec's bumps it.
        "no fence bump": (zombie, line_of(zombie, "FenceOngoing")),
        # The late write lands unverified after the abort marker.
        "no verification": (late, len(late)),
    }


def _with_first_marker(log: object, result: str) -> dict[str, object]:
    """``log`` (a function of partitions to sequences) with its first marker's kind changed."""
    assert isinstance(log, dict)
    pairs = []
    done = False
    for partition, body in log["fn"]:
        batches = []
        for batch in body["seq"]:
            record = dict(batch["record"])
            if not done and record["kind"] != "DATA":
                assert record["kind"] != result
                record["kind"], done = result, True
            batches.append({"record": record})
        pairs.append([partition, {"seq": batches}])
    assert done
    return {"fn": pairs}


# =========================================================================== generated runs


def generated_runs(examples: int = 8, steps: int = 100) -> list[list[tv.TraceLine]]:
    """The traces of a few hypothesis runs of the world (derandomized: the same runs each
    time, so that the check that they commit is stable)."""
    traces: list[list[tv.TraceLine]] = []

    class Recorded(TracedMachine):
        def teardown(self) -> None:
            super().teardown()
            traces.append(lines_of(self))

    run_state_machine_as_test(
        Recorded,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            database=None,
        ),
    )
    return traces


def commits(lines: list[tv.TraceLine]) -> int:
    """COMMIT markers in the trace's last state."""
    log = lines[-1].state["log"]
    assert isinstance(log, dict)
    return sum(
        batch["record"]["kind"] == "COMMIT" for _, body in log["fn"] for batch in body["seq"]
    )


@pytest.fixture(scope="module")
def batch() -> Batch:
    """Every trace of this file but the mutations', validated in one TLC run."""
    scenario = ("lifecycle", lines_of(lifecycle()))
    return validate_batch(scenario, generated_runs(), broken_cases(), SPEC)


def test_the_scenario_is_a_behaviour_of_the_spec(batch: Batch) -> None:
    assert_scenario_accepted(batch, "lifecycle", min_stutters=10)


def test_generated_runs_are_behaviours_of_the_spec_and_commit(batch: Batch) -> None:
    assert_generated_accepted(batch)
    generated = [lines for name, (lines, _) in batch.items() if name.startswith("generated")]
    assert sum(commits(lines) > 0 for lines in generated) >= 2


def test_broken_traces_are_rejected_where_they_break(batch: Batch) -> None:
    assert_rejected_where_broken(batch, broken_cases())


def test_the_zombie_commit_is_a_step_of_the_mutated_spec_that_breaks_invariants() -> None:
    """With BumpOnFence = FALSE (MCTransactionNoFenceBump.cfg) every step of the mutated
    coordinator's run is a step of the spec, and on the state where i1 is told its commit
    succeeded TLC reports OutcomeAsAnswered (its first write is under an ABORT marker), the
    first of the invariants that state breaks (NoZombieCommit is the next)."""
    assert_mutation_breaks(zombie_commit(), SPEC, {"BumpOnFence": "FALSE"}, "OutcomeAsAnswered")


def test_the_late_write_is_a_step_of_the_mutated_spec_that_breaks_an_invariant() -> None:
    """With VerifyPartitions = FALSE (MCTransactionNoVerify.cfg) the unverified landing is a
    step of the spec, and TLC reports NoHangingTransaction on it."""
    assert_mutation_breaks(
        late_write_lands(), SPEC, {"VerifyPartitions": "FALSE"}, "NoHangingTransaction"
    )
