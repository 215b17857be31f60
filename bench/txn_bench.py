"""Transactional produce against plain idempotent produce, through one broker, side by side.

    python -m bench.txn_bench [--runs 5] [--records 200000] [--per-transaction 1000]
                              [--rounds 10] [--partitions 1]
                              [--targets ours-local,peer-memory]
                              [--modes idempotent,transactional] [--quick] [--dir DIR]
                              [--profile DIR] [--out FILE]

Each run starts a fresh broker per target (the targets of ``bench.broker_bench``: ``ours-local``
is ``automq-ref serve`` on its embedded default, one node, the WAL file and objects under
``log.dirs``; ``peer-memory`` the peer broker in memory, when its script is there) and sends it
``--records`` records of 1 KiB twice, with two confluent-kafka producers, each into a fresh
topic of ``--partitions`` partitions:

- ``idempotent``: ``enable.idempotence=true``, ``acks=all``; records produced in a loop, a
  ``flush`` at the end of each chunk (below);
- ``transactional``: the same settings plus a ``transactional.id``; after ``init_transactions``,
  transactions of ``--per-transaction`` records each (begin, produce them,
  ``commit_transaction``).

Both use ``linger.ms=5`` and ``batch.size=1000000`` (the broker benchmark's throughput settings)
and spread records round-robin over the partitions. Before the clock starts, each producer sends
``--per-transaction`` warm-up records (the transactional one in a committed transaction of its
own), so connections, metadata, the producer id and, for transactions, the coordinator's topic
are in place. The two producers then take turns: each sends its records in ``--rounds`` chunks,
one producer's chunk after the other's (which goes first alternates by round and by run), so
both see the same background load on a shared machine; a workload's throughput is its records
over the sum of its chunks' seconds (from a chunk's first ``produce`` to the end of its
``flush``, or of its last ``commit_transaction``). Commit latency is the wall time of each
``commit_transaction()`` call: librdkafka's flush of the transaction's last records, then
EndTxn to its answer.

After the run, against our broker, each topic's end offsets are checked: the idempotent topic
holds every record; the transactional one every record and one marker per transaction and
partition, and a ``read_committed`` consumer's end offset (the last stable offset) reaches it
once the last markers land (they may land after the last commit returns). Not against the peer:
its ListOffsets answers the last batch's base offset as the end (Tansu 0.6.0), so only its
delivery reports and commits are checked.

*transactional / idempotent* is each run's ratio of records/s, its median over the runs; every
figure is the median over ``--runs``; MiB = 2^20 bytes. ``--modes transactional`` runs one
workload only (with ``--profile DIR``, which runs our broker under cProfile, one ``.prof`` file
per broker process, to profile it alone). ``--quick`` is a smoke run of a few thousand records
(``tests/unit/test_txn_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.broker_bench import (
    PEER_SCRIPT,
    RECORD_BYTES,
    TITLES,
    OursTarget,
    PeerTarget,
    Target,
    create_topics,
    fmt,
    percentile,
)
from bench.producing import Delivery, produce_some

MIB = 2**20
ALL_TARGETS = ("ours-local", "peer-memory")
MODES = ("idempotent", "transactional")
PRODUCER = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1_000_000,
}
TRANSACTION_TIMEOUT_MS = 60_000
CALL_TIMEOUT_S = 120.0
MARKERS_TIMEOUT_S = 30.0


def log(message: str) -> None:
    print(f"[txn_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Settings:
    records: int
    per_transaction: int
    partitions: int
    rounds: int
    modes: tuple[str, ...]


@dataclass
class Outcome:
    """One workload's figures: records, seconds, and each commit's seconds (transactions)."""

    records: int
    seconds: float
    commits_s: list[float] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mib_per_s(self) -> float:
        return self.records * RECORD_BYTES / MIB / self.seconds


class Workload:
    """One producer and its topic: warmed up once, then sent records in chunks, each chunk's
    seconds (and each commit's, for transactions) added to its outcome."""

    def __init__(self, bootstrap: str, topic: str, settings: Settings) -> None:
        self.topic = topic
        self.partitions = settings.partitions
        self.per_transaction = settings.per_transaction
        self.payload = os.urandom(RECORD_BYTES)
        self.delivery = Delivery()
        self.outcome = Outcome(0, 0.0)
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER, **self.extra()})

    def extra(self) -> dict[str, str | int]:
        return {}

    def warm_up(self) -> None:
        """``per_transaction`` records (one transaction) before the clock starts."""
        self.send(self.per_transaction)
        self.delivery.check(f"warm-up of {self.topic}", self.per_transaction)
        self.delivery = Delivery()

    def send(self, count: int) -> None:
        produce_some(self.producer, self.topic, self.partitions, self.payload, count, self.delivery)
        remaining = self.producer.flush(CALL_TIMEOUT_S)
        if remaining:
            raise RuntimeError(f"produce into {self.topic}: {remaining} records not flushed")

    def chunk(self, count: int) -> None:
        started = time.perf_counter()
        self.send(count)
        self.outcome.seconds += time.perf_counter() - started
        self.outcome.records += count

    def check(self) -> None:
        self.delivery.check(f"produce into {self.topic}", self.outcome.records)


class Transactional(Workload):
    def extra(self) -> dict[str, str | int]:
        return {
            "transactional.id": f"txn-bench-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        }

    def warm_up(self) -> None:
        self.producer.init_transactions(CALL_TIMEOUT_S)
        super().warm_up()
        self.outcome.commits_s.clear()

    def send(self, count: int) -> None:
        sent = 0
        while sent < count:
            size = min(self.per_transaction, count - sent)
            self.producer.begin_transaction()
            produce_some(
                self.producer, self.topic, self.partitions, self.payload, size, self.delivery
            )
            began = time.perf_counter()
            self.producer.commit_transaction(CALL_TIMEOUT_S)
            self.outcome.commits_s.append(time.perf_counter() - began)
            sent += size


def transactions_of(records: int, per_transaction: int) -> int:
    return -(-records // per_transaction)


def expected_end_offsets(
    records: int, per_transaction: int, partitions: int, *, transactional: bool
) -> int:
    """The sum over the topic's partitions of their end offsets after a workload (warm-up
    included): every record, and with transactions one marker per transaction per partition it
    wrote to (all of them, as long as a transaction holds at least one record per partition)."""
    total = records + per_transaction
    if transactional:
        total += (transactions_of(records, per_transaction) + 1) * min(partitions, per_transaction)
    return total


def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: str) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-bench-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, index), timeout=30)[1]
            for index in range(partitions)
        )
    finally:
        consumer.close()


def check_offsets(bootstrap: str, topic: str, partitions: int, expected: int) -> None:
    """Wait until the topic's end offsets, and then its read_committed end offsets (the last
    stable offsets), sum to ``expected``; more than that is an error. The last markers land after
    the last ``commit_transaction`` returns (its EndTxn is answered once the decision is durable,
    before the markers)."""
    started = time.perf_counter()
    for isolation in ("read_uncommitted", "read_committed"):
        while (found := end_offsets(bootstrap, topic, partitions, isolation)) != expected:
            if found > expected or time.perf_counter() - started > MARKERS_TIMEOUT_S:
                raise RuntimeError(f"{topic}: {isolation} end offsets {found}, not {expected}")
            time.sleep(0.02)


def run_target(target: Target, settings: Settings, run: int) -> dict[str, Outcome]:
    """Both workloads against one freshly started broker, alternating in ``settings.rounds``
    chunks of the records (which goes first alternates too, by round and by run)."""
    outcomes: dict[str, Outcome] = {}
    try:
        bootstrap = target.start()
        topics = {mode: f"bench-{mode}-{run}" for mode in settings.modes}
        create_topics(bootstrap, {topic: settings.partitions for topic in topics.values()})
        workloads = {
            mode: (Transactional if mode == "transactional" else Workload)(
                bootstrap, topics[mode], settings
            )
            for mode in settings.modes
        }
        for workload in workloads.values():
            workload.warm_up()
        chunk = settings.records // settings.rounds
        for number in range(settings.rounds):
            order = list(workloads.values())
            for workload in order[::-1] if (number + run) % 2 else order:
                workload.chunk(chunk)
        for mode, workload in workloads.items():
            workload.check()
            workload.producer.flush(CALL_TIMEOUT_S)
            if isinstance(target, OursTarget):  # the peer's end offsets are not the log's
                expected = expected_end_offsets(
                    settings.records,
                    settings.per_transaction,
                    settings.partitions,
                    transactional=mode == "transactional",
                )
                check_offsets(bootstrap, workload.topic, settings.partitions, expected)
            outcome = outcomes[mode] = workload.outcome
            outcome.commits_s.sort()
            commits = (
                f", commit p50 {percentile(outcome.commits_s, 0.5) * 1000:.1f} ms, p99 "
                f"{percentile(outcome.commits_s, 0.99) * 1000:.1f} ms"
                if outcome.commits_s
                else ""
            )
            log(
                f"{target.name} run {run}: {mode}: {outcome.records_per_s:.0f} records/s, "
                f"{outcome.mib_per_s:.1f} MiB/s{commits}"
            )
    finally:
        target.stop()
    return outcomes


# ------------------------------------------------------------------------------------ report


def run_figures(outcomes: dict[str, Outcome]) -> dict[str, float]:
    """One run's figures by name."""
    figures: dict[str, float] = {}
    for mode, outcome in outcomes.items():
        figures[f"{mode}_records_s"] = outcome.records_per_s
        figures[f"{mode}_mib_s"] = outcome.mib_per_s
        if outcome.commits_s:
            figures["commit_p50_ms"] = percentile(outcome.commits_s, 0.50) * 1000
            figures["commit_p99_ms"] = percentile(outcome.commits_s, 0.99) * 1000
            figures["commit_max_ms"] = outcome.commits_s[-1] * 1000
    if "idempotent" in outcomes and "transactional" in outcomes:
        idempotent = outcomes["idempotent"].records_per_s
        figures["ratio"] = outcomes["transactional"].records_per_s / idempotent
    return figures


ROWS = (
    ("idempotent_records_s", "idempotent records/s"),
    ("transactional_records_s", "transactional records/s"),
    ("idempotent_mib_s", "idempotent MiB/s"),
    ("transactional_mib_s", "transactional MiB/s"),
    ("ratio", "transactional / idempotent (records/s, paired per run)"),
    ("commit_p50_ms", "commit_transaction p50 ms"),
    ("commit_p99_ms", "commit_transaction p99 ms"),
    ("commit_max_ms", "commit_transaction max ms"),
)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    names = {name for run in runs for name in run}
    return {name: statistics.median(run[name] for run in runs if name in run) for name in names}


def results_table(runs: dict[str, list[dict[str, float]]]) -> str:
    targets = [target for target, figures in runs.items() if figures]
    result = {target: medians(runs[target]) for target in targets}
    header = ["metric (median)", *(TITLES[target] for target in targets)]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * len(targets) + "|"]
    for key, label in ROWS:
        values = [result[target].get(key) for target in targets]
        if all(value is None for value in values):
            continue
        lines.append("| " + " | ".join([label, *(fmt(value) for value in values)]) + " |")
    return "\n".join(lines)


def runs_table(runs: dict[str, list[dict[str, float]]]) -> str:
    """Every run's figures, so the spread behind each median shows."""
    lines = [
        "| target | run | idempotent records/s | transactional records/s | ratio "
        "| commit p50 ms | commit p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for target, figures in runs.items():
        for number, run in enumerate(figures, 1):
            cells = [
                fmt(run.get(key))
                for key in (
                    "idempotent_records_s",
                    "transactional_records_s",
                    "ratio",
                    "commit_p50_ms",
                    "commit_p99_ms",
                )
            ]
            lines.append(f"| {TITLES[target]} | {number} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_table(runs: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| target | figures (medians) | met |", "|---|---|:---:|"]
    for target, figures in runs.items():
        ratios = [run["ratio"] for run in figures if "ratio" in run]
        if ratios:
            value = statistics.median(ratios)
            met = "yes" if value >= 0.8 else "**no**"
            lines.append(
                f"| transactional / idempotent of {TITLES[target]} >= 0.8 | {value:.2f} "
                f"(runs: {', '.join(f'{ratio:.2f}' for ratio in ratios)}) | {met} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


# -------------------------------------------------------------------------------------- main


def parse_choice(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    chosen: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        if name not in allowed:
            raise SystemExit(f"unknown {what} {name!r}; choose from {', '.join(allowed)}")
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise SystemExit(f"no {what} chosen; choose from {', '.join(allowed)}")
    return tuple(chosen)


def default_targets() -> str:
    return ",".join(ALL_TARGETS) if PEER_SCRIPT.exists() else "ours-local"


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000, help="measured, per workload")
    parser.add_argument("--per-transaction", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10, help="chunks per workload, in turns")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--targets", default=None, help="ours-local and/or peer-memory")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few records")
    parser.add_argument("--dir", type=Path, default=None, help="where our broker keeps data")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile our broker here")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.records, arguments.per_transaction, arguments.runs = 5000, 500, 1
        arguments.rounds = 2
    for name in ("runs", "records", "per_transaction", "rounds", "partitions"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if arguments.records % (arguments.rounds * arguments.per_transaction):
        parser.error("--records must be a multiple of --rounds times --per-transaction")
    arguments.targets = parse_choice(
        arguments.targets or ("ours-local" if arguments.quick else default_targets()),
        ALL_TARGETS,
        "target",
    )
    arguments.modes = parse_choice(arguments.modes, MODES, "mode")
    if any(name.startswith("peer") for name in arguments.targets) and not PEER_SCRIPT.exists():
        parser.error(f"no peer script at {PEER_SCRIPT} (set PEER_SCRIPT)")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    settings = Settings(
        records=arguments.records,
        per_transaction=arguments.per_transaction,
        partitions=arguments.partitions,
        rounds=arguments.rounds,
        modes=arguments.modes,
    )
    workdir = Path(tempfile.mkdtemp(prefix="txn-bench-", dir=arguments.dir))
    wal_bytes = 64 * 2**20 if arguments.quick else 2**30
    load_before = os.getloadavg()
    began = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {target: [] for target in arguments.targets}
    try:
        for run in range(1, arguments.runs + 1):
            for name in arguments.targets:
                log(f"run {run}/{arguments.runs}: {name}")
                target: Target = (
                    OursTarget(name, workdir, wal_bytes, arguments.profile)
                    if name.startswith("ours")
                    else PeerTarget(name)
                )
                runs[name].append(run_figures(run_target(target, settings, run)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    command = "python -m bench.txn_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    report = [
        f"`{command.strip()}`: {arguments.runs} run(s), {settings.records} records of "
        f"{RECORD_BYTES} bytes per workload, {settings.per_transaction} per transaction, "
        f"{settings.rounds} rounds, {settings.partitions} partition(s); "
        f"{time.perf_counter() - began:.0f} s in all; load average {load_before[0]:.1f} "
        f"before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs).",
        "",
        results_table(runs),
        "",
        runs_table(runs),
    ]
    checks = targets_table(runs)
    if checks:
        report += ["", checks]
    text = "\n".join(report)
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
