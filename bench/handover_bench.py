"""A broker stopped gracefully as clients see it, and the WAL's recovery after a kill.

    python -m bench.handover_bench [--sections handover,recovery] [--runs 3] [--partitions 12]
                                   [--rate 50] [--clients defaults,fast] [--recovery-mb 100,200]
                                   [--recovery-wals block,object]
                                   [--recovery-runs 3] [--quick] [--keep] [--dir DIR] [--out FILE]

1. **handover**: a three-broker cluster as ``automq-ref cluster`` starts it (etcd, moto, the
   launcher's settings; ``bench/cluster_bench.py``'s ``Cluster``), a ``--partitions``-partition
   topic and one idempotent producer (confluent-kafka, acks=all, linger.ms=1) sending one 1 KiB
   record to every partition ``--rate`` times a second. Once every partition acknowledges
   steadily, one broker that is not the active controller (a different one each run) gets
   SIGTERM. A partition's unavailability is the longest gap between consecutive
   acknowledgements on it whose later one comes after the signal and before the broker is
   started again (its partitions come back then, which is a move of its own; the topic is
   deleted after each run, so every run hands over the same count); p50 and p99 over
   the partitions the stopped broker led (the others' gaps beside them), over ``--runs`` runs
   per client setting: librdkafka's defaults and quicker metadata refresh and retry backoff
   (``FAST_CLIENT``), alternating. Also: seconds from the signal to the process's exit (and its
   exit code), the broker's own ``controlled shutdown`` log line, and what the restarted broker
   recovered from its WAL (nothing, when the stop uploaded everything). Every record sent must
   be acknowledged, none refused.
2. **recovery**: one broker alone (``automq-ref serve``, objects in a local directory; the
   block WAL on a file, and the object WAL in a directory: ``--recovery-wals``) with an upload
   threshold and interval too large to upload anything, so that ``--recovery-mb`` MB produced
   stay only in the WAL; then SIGKILL and a restart. The
   restart's ``WAL recovered`` line gives the bytes replayed and the seconds from the WAL's
   open to the recovered records uploaded and their streams ready; reported per 100 MB, with
   the restart's wall time to serving beside it. The median over ``--recovery-runs``.

``--quick`` is a smoke run (one handover with librdkafka's defaults, 4 partitions; 5 MB
recovered).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from automq_ref.checker.cluster import BrokerProcess
from automq_ref.launch import S3_CREDENTIALS
from bench.broker_bench import MEGABYTE, RECORD_BYTES, create_topics, percentile, wait_due
from bench.cluster_bench import FAST_CLIENT, Cluster, longest_gap, produce_timed

SECTIONS = ("handover", "recovery")
CLIENTS: dict[str, Mapping[str, Any]] = {"defaults": {}, "fast": FAST_CLIENT}
PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 1}
FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')
STEADY_S = 2.0
STEADY_GAP_S = 0.25
WAIT_S = 120.0
SETTLE_S = 3.0  # after the stopped broker exits, before it is started again


def log(message: str) -> None:
    print(f"[handover_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def line_fields(path: Path, marker: str, after: int = 0) -> list[dict[str, str]]:
    """The ``key=value`` fields of every line of ``path`` holding ``marker``, from byte
    ``after`` on."""
    with path.open("rb") as stream:
        stream.seek(after)
        text = stream.read().decode(errors="replace")
    found = []
    for line in text.splitlines():
        _, hit, rest = line.partition(marker)
        if hit:
            found.append({k: v.strip('"') for k, v in FIELD.findall(rest)})
    return found


def wait_for(what: str, ready: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------- handover


@dataclass
class PartitionAcks:
    """Acknowledgement times (wall clock) per partition, and what failed."""

    times: dict[int, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        now = time.time()
        with self.lock:
            if error is not None:
                self.errors.append(str(error))
            else:
                self.times.setdefault(message.partition() or 0, []).append(now)

    def steady(self, partitions: Iterable[int], now: float) -> bool:
        """Every partition acknowledged for the last STEADY_S with no gap above STEADY_GAP_S."""
        with self.lock:
            for partition in partitions:
                recent = [t for t in self.times.get(partition, [])[-2000:] if t > now - STEADY_S]
                if not recent or now - recent[-1] > STEADY_GAP_S:
                    return False
                if recent[0] > now - STEADY_S + STEADY_GAP_S:
                    return False
                if any(b - a > STEADY_GAP_S for a, b in itertools.pairwise(recent)):
                    return False
        return True

    def sorted_times(self, partition: int) -> list[float]:
        with self.lock:
            return sorted(self.times.get(partition, []))


class SteadyProducer:
    """One record to every partition ``rate`` times a second, in a thread."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, rate: int, client: Mapping[str, Any]
    ) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER, **client})
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.acks = PartitionAcks()
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        payload = os.urandom(RECORD_BYTES)
        started = time.perf_counter()
        ticks = 0
        while not self._stop.is_set():
            due = started + ticks / self.rate
            wait_due(self.producer, due)
            for partition in range(self.partitions):
                self.producer.produce(
                    self.topic, payload, partition=partition, on_delivery=self.acks
                )
                self.sent += 1
            ticks += 1
            self.producer.poll(0)
        self.producer.flush(WAIT_S)


@dataclass
class Handover:
    client: str
    node: int
    led: list[int]  # partitions the stopped broker led
    gaps: dict[int, float]  # partition -> its longest gap after the signal
    exit_s: float
    exit_code: int | None
    shutdown: dict[str, str]  # the broker's "controlled shutdown" line
    recovered: dict[str, str]  # the restart's "WAL recovered" line


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {index: p.leader for index, p in found.topics[topic].partitions.items()}


def restart(cluster: Cluster, node: int) -> None:
    """Broker ``node`` started again on its data, as the launcher started it."""
    local = cluster.local
    assert local is not None
    command = [sys.executable, "-m", "automq_ref.cli", "serve"]
    for override in local.broker_overrides(node):
        command += ["--override", override]
    child = local.brokers[node]
    served = child.log_path.read_text(errors="replace").count("serving Kafka on")
    local.brokers[node] = local._spawn(f"broker-{node}", command, {**os.environ, **S3_CREDENTIALS})
    wait_for(
        f"broker {node} serving again",
        lambda: child.log_path.read_text(errors="replace").count("serving Kafka on") > served,
    )


def handover_run(cluster: Cluster, client: str, run: int, settings: argparse.Namespace) -> Handover:
    local = cluster.local
    assert local is not None
    topic = f"handover-{client}-{run}"
    create_topics(cluster.bootstrap, {topic: settings.partitions})
    every = range(settings.partitions)
    with SteadyProducer(
        cluster.bootstrap, topic, settings.partitions, settings.rate, CLIENTS[client]
    ) as producer:
        wait_for(f"{topic} steady", lambda: producer.acks.steady(every, time.time()))
        controller = local.controller()
        candidates = [n for n in sorted(local.brokers) if n != controller]
        node = candidates[run % len(candidates)]
        led = sorted(p for p, leader in leaders(cluster.bootstrap, topic).items() if leader == node)
        child = local.brokers[node]
        log_from = child.log_path.stat().st_size
        signalled = time.time()
        child.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = child.process.wait(timeout=WAIT_S)
        except Exception:
            child.process.kill()
            child.process.wait()
            code = None
        exit_s = time.time() - signalled
        time.sleep(SETTLE_S)
        wait_for(f"{topic} steady without {node}", lambda: producer.acks.steady(every, time.time()))
        restarted = time.time()
        shutdown = line_fields(child.log_path, "controlled shutdown done ", log_from)
        recovered_from = child.log_path.stat().st_size
        restart(cluster, node)
        recovered = line_fields(child.log_path, "WAL recovered ", recovered_from)
        # Its share comes back (moves of their own) before the next run.
        wait_for(
            f"broker {node} leading again",
            lambda: node in leaders(cluster.bootstrap, topic).values(),
        )
        time.sleep(SETTLE_S)
        wait_for(f"{topic} steady again", lambda: producer.acks.steady(every, time.time()))
    # Each run starts from the same partitions: this run's topic goes.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(WAIT_S)
    if producer.acks.errors or sum(len(t) for t in producer.acks.times.values()) != producer.sent:
        acked = sum(len(t) for t in producer.acks.times.values())
        raise RuntimeError(
            f"{topic}: {acked} of {producer.sent} acknowledged, errors {producer.acks.errors[:3]}"
        )
    gaps = {p: longest_gap(producer.acks.sorted_times(p), signalled, restarted)[0] for p in every}
    return Handover(
        client,
        node,
        led,
        gaps,
        exit_s,
        code,
        shutdown[-1] if shutdown else {},
        recovered[-1] if recovered else {},
    )


def handover_section(settings: argparse.Namespace) -> list[str]:
    done: list[Handover] = []
    with Cluster(settings.workdir, 3, keep=settings.keep).running() as cluster:
        for run in range(settings.runs):
            order = settings.clients if run % 2 == 0 else list(reversed(settings.clients))
            for client in order:
                log(f"handover run {run + 1}, client {client}")
                handover = handover_run(cluster, client, run, settings)
                led = [handover.gaps[p] for p in handover.led]
                log(
                    f"  broker {handover.node} (led {handover.led}) exited {handover.exit_code} "
                    f"after {handover.exit_s:.2f} s; gaps on its partitions "
                    + ", ".join(f"{g:.3f}" for g in led)
                    + f"; shutdown {handover.shutdown}; restart recovered {handover.recovered}"
                )
                done.append(handover)
    return handover_report(done, settings)


def _fields(handovers: list[Handover], name: str, key: str) -> str:
    values = [float(getattr(h, name)[key]) for h in handovers if key in getattr(h, name)]
    return f"{statistics.median(values):.2f}" if values else "-"


def handover_report(done: list[Handover], settings: argparse.Namespace) -> list[str]:
    lines = [
        f"## Graceful handover ({settings.partitions} partitions on 3 brokers, one record per "
        f"partition {settings.rate} times a second; SIGTERM to a broker that is not the "
        "controller)",
        "",
        "| client | runs | partitions handed over | p50 s | p99 s | mean s | max s | others' "
        "max s | SIGTERM to exit s (median) | handover s (median) | exit codes | restart "
        "recovered records |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for client in settings.clients:
        mine = [h for h in done if h.client == client]
        if not mine:
            continue
        moved = sorted(h.gaps[p] for h in mine for p in h.led)
        others = [g for h in mine for p, g in h.gaps.items() if p not in h.led]
        codes = ",".join(str(h.exit_code) for h in mine)
        recovered = ",".join(h.recovered.get("records", "?") for h in mine)
        lines.append(
            f"| {client} | {len(mine)} | {len(moved)} | {percentile(moved, 0.5):.3f} | "
            f"{percentile(moved, 0.99):.3f} | {statistics.mean(moved):.3f} | {moved[-1]:.3f} | "
            f"{max(others, default=0.0):.3f} | "
            f"{statistics.median(h.exit_s for h in mine):.2f} | "
            f"{_fields(mine, 'shutdown', 'seconds')} | {codes} | {recovered} |"
        )
    return lines


# ---------------------------------------------------------------------------------- recovery


@dataclass
class Recovery:
    wal: str
    mb: float
    bytes: int
    records: int
    seconds: float  # the broker's own figure
    to_serving_s: float  # from the restart's spawn to serving


def recovery_run(workdir: Path, mb: float, wal: str) -> Recovery:
    data = workdir / f"recovery-{time.monotonic_ns()}"
    never = str(1 << 40)
    broker = BrokerProcess(
        data,
        *([f"s3.wal.path=0@dir://{data}-wal-objects"] if wal == "object" else []),
        f"s3.wal.capacity={int(max(mb * 2, 64) * MEGABYTE)}",
        f"s3.wal.cache.size={int(max(mb * 3, 64) * MEGABYTE)}",
        f"s3.wal.upload.threshold={never}",
        "s3.wal.upload.interval.ms=3600000",
    )
    broker.start()
    try:
        produce_timed(broker.bootstrap, "recovery", 1, int(mb * MEGABYTE), 600)
        broker.kill()
        offset = broker.log_path.stat().st_size
        started = time.monotonic()
        broker.start()
        to_serving = time.monotonic() - started
        found = line_fields(broker.log_path, "WAL recovered ", offset)
        broker.stop()
    except BaseException:
        with contextlib.suppress(Exception):
            broker.kill()
        raise
    line = found[-1]
    return Recovery(
        wal, mb, int(line["bytes"]), int(line["records"]), float(line["seconds"]), to_serving
    )


def recovery_section(settings: argparse.Namespace) -> list[str]:
    results: dict[tuple[str, float], list[Recovery]] = {
        (wal, mb): [] for wal in settings.recovery_wals for mb in settings.recovery_mb
    }
    for run in range(settings.recovery_runs):
        for wal, mb in results:
            log(f"recovery run {run + 1}: {mb} MB only in the {wal} WAL, kill -9, restart")
            found = recovery_run(settings.workdir, mb, wal)
            log(
                f"  recovered {found.records} records, {found.bytes} bytes in "
                f"{found.seconds:.2f} s (serving after {found.to_serving_s:.2f} s)"
            )
            results[(wal, mb)].append(found)
    lines = [
        "## WAL recovery after kill -9 (objects in a local directory; the block WAL on a file, "
        "the object WAL in a directory)",
        "",
        "| WAL | produced MB | runs | replayed MB (median) | recovery s (median) | "
        "s per 100 MB | restart to serving s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (wal, mb), runs in results.items():
        replayed = statistics.median(r.bytes for r in runs) / MEGABYTE
        seconds = statistics.median(r.seconds for r in runs)
        per_100 = statistics.median(r.seconds / (r.bytes / (100 * MEGABYTE)) for r in runs)
        lines.append(
            f"| {wal} | {mb:g} | {len(runs)} | {replayed:.1f} | {seconds:.2f} | {per_100:.2f} | "
            f"{statistics.median(r.to_serving_s for r in runs):.2f} |"
        )
    return lines


# -------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--recovery-mb", default="100,200")
    parser.add_argument("--recovery-runs", type=int, default=3)
    parser.add_argument("--recovery-wals", default="block,object")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    settings = parser.parse_args(argv)
    settings.clients = [c for c in settings.clients.split(",") if c]
    settings.recovery_mb = [float(mb) for mb in settings.recovery_mb.split(",") if mb]
    settings.recovery_wals = [w for w in settings.recovery_wals.split(",") if w]
    if settings.quick:
        settings.runs, settings.partitions, settings.clients = 1, 4, ["defaults"]
        settings.recovery_mb, settings.recovery_runs = [5.0], 1
    sections = [s for s in settings.sections.split(",") if s]
    unknown = (
        set(sections) - set(SECTIONS)
        or set(settings.clients) - set(CLIENTS)
        or set(settings.recovery_wals) - {"block", "object"}
    )
    if unknown:
        parser.error(f"unknown: {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="handover-bench-", dir=settings.dir) as workdir:
        settings.workdir = Path(workdir)
        lines = [f"handover_bench {' '.join(argv if argv is not None else sys.argv[1:])}", ""]
        if "handover" in sections:
            lines += [*handover_section(settings), ""]
        if "recovery" in sections:
            lines += [*recovery_section(settings), ""]
    report = "\n".join(lines)
    print(report)
    if settings.out is not None:
        settings.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
