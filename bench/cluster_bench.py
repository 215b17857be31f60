"""Three brokers against one on the same machine, partition moves as a client sees them, and what
a cluster costs etcd per GB produced.

    python -m bench.cluster_bench [--sections throughput,moves] [--runs 3] [--mb 2048]
                                  [--partitions 12] [--idle-seconds 5] [--move-runs 1]
                                  [--moves 20] [--rate 500] [--move-interval 2]
                                  [--prefill-mb 0] [--quick] [--keep] [--dir DIR] [--out FILE]

Every cluster here is what ``automq-ref cluster`` starts (``automq_ref/launch.py``): one etcd
member, an S3 server (moto, objects in memory) and N ``automq-ref serve`` brokers with the
launcher's settings (racks az1..azN) but the block WAL, 256 MiB each (:data:`BLOCK_WAL`: the
launcher's object WAL seals a trickle every 250 ms, which the moves' quiet-second gate below
never sees, and the figures stay comparable), on free loopback ports, fresh for each run, its
data in a temporary directory that is removed afterwards (``--keep`` keeps it, logs included;
a failed run always keeps it).

1. **throughput**: the same producer (confluent-kafka, acks=all, linger.ms=5, batch.size=1000000,
   1 KiB records spread round-robin over ``--partitions`` partitions, ``--mb`` MB) against one
   broker and against three, the two alternating run by run (1, 3, then 3, 1, ...) so they see
   the same background load; MB/s from the first ``produce`` to the end of ``flush`` and over
   the second half of the delivery reports, the median over ``--runs``, and the ratio three /
   one. Beside it: the share of the bytes produced that are in objects at the end (what the
   brokers uploaded in the window; the rest is still only in their WALs), librdkafka's count of
   Produce requests (from its statistics), and the CPU seconds each kind of process (brokers,
   etcd, moto, this client) used per MB in the window, read from ``/proc``: on a machine with
   fewer cores than processes these say where the time went.
2. **etcd operations per GB**, from the same runs: etcd's own counters (its ``/metrics`` on the
   client URL) read just before the first ``produce`` and just after ``flush``: gRPC requests by
   method (unary calls handled; messages received on the LeaseKeepAlive and Watch streams), the
   MVCC operations (put, range, delete, multi-operation txn), raft proposals committed and WAL
   fsyncs; per GB produced. An idle window of ``--idle-seconds`` before the produce (topic
   created and settled, no traffic) gives each counter's rate without data (lease keepalives,
   what the brokers do on their own), and the report takes that rate times the produce's
   duration off, leaving what the data cost.
3. **moves**: one producer sends ``--rate`` records a second (1 KiB, acks=all, linger.ms=1) to
   a 1-partition topic on three brokers while the partition is moved ``--moves`` times,
   round-robin to the next broker, with AlterPartitionReassignments (kafka-python's admin
   client: confluent-kafka has no such call). The next move comes ``--move-interval`` seconds
   after one at the earliest, and only once acknowledgements have flowed for a second without
   a gap above 0.1 s, so each move's gap falls in its own window. A move's unavailability is
   the longest gap between consecutive acknowledgements (delivery reports) that ends after the
   move was asked for and before the next was; p50, p99 (of 20: the largest), mean and max,
   against the same measure over a window without moves. The brokers' ``partition given up``
   and ``partition led`` log lines (with how long the close, the open and the open's scan of
   the retained log took) place each move's steps on the same clock. It runs with librdkafka's
   defaults and with quicker metadata refresh and retry backoff (``FAST_CLIENT``), one topic
   each on the same cluster, ``--move-runs`` times, alternating the order. ``--prefill-mb``
   writes that much into the partition first (the open's scan grows with it).

``--quick`` is a smoke run (2 MB, one move per client; ``tests/unit/test_cluster_bench.py``).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import itertools
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from automq_ref.launch import BUCKET, REGION, S3_CREDENTIALS, ClusterSettings, LocalCluster
from bench.broker_bench import (
    GIGABYTE,
    MEGABYTE,
    RECORD_BYTES,
    THROUGHPUT_PRODUCER,
    create_topics,
    fmt,
    percentile,
    wait_due,
)

SECTIONS = ("throughput", "moves")
# librdkafka's defaults, written out (2.x): what the "defaults" run uses by not setting them.
CLIENT_DEFAULTS = {
    "topic.metadata.refresh.fast.interval.ms": 100,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1000,
}
STATS_INTERVAL_MS = 500
FAST_CLIENT = {
    "topic.metadata.refresh.fast.interval.ms": 10,
    "retry.backoff.ms": 10,
    "retry.backoff.max.ms": 100,
}
CLIENTS = {"defaults": {}, "fast": FAST_CLIENT}
MOVE_PRODUCER = {"acks": "all", "linger.ms": 1}
GIVEN_UP = "partition given up "
LED = "partition led "
FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')
MOVE_TIMEOUT_S = 120.0
# A partition serves steadily again when acknowledgements have come for STEADY_S with no gap
# above STEADY_GAP_S.
STEADY_S = 1.0
STEADY_GAP_S = 0.1
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"


def log(message: str) -> None:
    print(f"[cluster_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the cluster


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The brokers' WAL here (see the module docstring): a file under log.dirs, of 256 MiB.
BLOCK_WAL = ("s3.wal.path=", f"s3.wal.capacity={256 * 1024 * 1024}")


@dataclass
class Cluster:
    """``automq-ref cluster``'s children (etcd, moto, ``brokers`` brokers), for one run."""

    workdir: Path
    brokers: int
    overrides: tuple[str, ...] = ()
    keep: bool = False  # leave the logs and data behind
    local: LocalCluster | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[Cluster]:
        data_dir = self.workdir / f"cluster-{self.brokers}-{time.monotonic_ns()}"
        settings = ClusterSettings(
            data_dir=data_dir,
            base_port=0,  # a free port per broker
            overrides=(*BLOCK_WAL, *self.overrides),
            brokers=self.brokers,
        )
        self.local = LocalCluster(settings, threading.Event(), lambda line: log(f"  {line}"))
        try:
            self.local.start()
            yield self
        except BaseException:
            self.local.stop()
            log(f"failed: the cluster's logs are kept in {data_dir}")
            raise
        self.local.stop()
        if self.keep:
            log(f"the cluster's logs are kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)

    @property
    def _cluster(self) -> LocalCluster:
        assert self.local is not None, "not running"
        return self.local

    @property
    def bootstrap(self) -> str:
        return self._cluster.settings.bootstrap

    def broker_logs(self) -> dict[int, Path]:
        return {node_id: child.log_path for node_id, child in self._cluster.brokers.items()}

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the brokers (together), etcd and moto."""
        cluster = self._cluster
        used = {"brokers": sum(cpu_seconds(c.process.pid) for c in cluster.brokers.values())}
        for name, child in (("etcd", cluster.etcd), ("moto", cluster.moto)):
            used[name] = 0.0 if child is None else cpu_seconds(child.process.pid)
        return used

    def objects(self) -> tuple[int, int]:
        """The bucket's objects now (what the brokers have uploaded so far): count, bytes."""
        import botocore.session

        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self._cluster.s3_endpoint,
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        )
        count = total = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for item in page.get("Contents", ()):
                count += 1
                total += int(item["Size"])
        return count, total

    def etcd_counters(self) -> dict[str, float]:
        """etcd's own counters now, from its ``/metrics`` (see :func:`parse_etcd_metrics`)."""
        url = f"http://{self._cluster.etcd_endpoint}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return parse_etcd_metrics(reply.read().decode())


# ----------------------------------------------------------------------------- etcd counters

_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$")
_PLAIN = {
    "etcd_mvcc_put_total": "mvcc put",
    "etcd_mvcc_range_total": "mvcc range",
    "etcd_mvcc_delete_total": "mvcc delete",
    "etcd_mvcc_txn_total": "mvcc txn (multi-op)",
    "etcd_server_proposals_committed_total": "raft proposals committed",
    "etcd_disk_wal_fsync_duration_seconds_count": "etcd WAL fsyncs",
    "etcd_disk_wal_fsync_duration_seconds_sum": "etcd WAL fsync seconds",
}
_STREAMS = ("LeaseKeepAlive", "Watch")


def parse_etcd_metrics(text: str) -> dict[str, float]:
    """The counters the report uses, by a readable name: each unary gRPC method's handled calls
    (``grpc Range``, ``grpc Txn``, ...), the messages received on the two streams the brokers
    keep open (``grpc LeaseKeepAlive msgs``, ``grpc Watch msgs``), and the plain counters of
    :data:`_PLAIN`."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None:
            continue
        name, label_text, value_text = match.groups()
        labels = dict(re.findall(r'(\w+)="([^"]*)"', label_text or ""))
        value = float(value_text)
        method = labels.get("grpc_method", "")
        if name == "grpc_server_handled_total" and labels.get("grpc_type") == "unary":
            key = f"grpc {method}"
        elif name == "grpc_server_msg_received_total" and method in _STREAMS:
            key = f"grpc {method} msgs"
        elif name in _PLAIN:
            key = _PLAIN[name]
        else:
            continue
        found[key] = found.get(key, 0.0) + value
    return found


def difference(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


# -------------------------------------------------------------------------------- throughput


@dataclass
class Progress:
    """Delivery reports of the throughput producer: how many, and every ``STEP``-th one's
    time, so the rate of the second half can be read apart from the start."""

    STEP = 1000
    delivered: int = 0
    marks: list[float] = field(default_factory=list)
    error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.error = self.error or error
            return
        self.delivered += 1
        if self.delivered % self.STEP == 0:
            self.marks.append(time.perf_counter())


def produce_requests(stats_json: str) -> tuple[int, int]:
    """Produce requests librdkafka sent, and the bytes it sent, over every broker connection
    (from one of its statistics reports)."""
    brokers = json.loads(stats_json).get("brokers", {}).values()
    requests = sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)
    return requests, sum(int(b.get("txbytes", 0)) for b in brokers)


@dataclass(frozen=True)
class Produced:
    records: int
    seconds: float  # from the first produce to the end of flush
    second_half_mb_s: float  # MB/s of the second half of the delivery reports
    requests: int  # Produce requests sent (librdkafka's count)
    request_bytes: int  # bytes sent to the brokers


def produce_timed(
    bootstrap: str, topic: str, partitions: int, total_bytes: int, max_seconds: float
) -> Produced:
    """The throughput workload: records delivered, seconds, the rate of the second half of the
    delivery reports (the brokers uploading as they go by then), Produce requests sent."""
    stats: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **THROUGHPUT_PRODUCER,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": stats.append,
        }
    )
    payload = os.urandom(RECORD_BYTES)
    progress = Progress()
    records = max(1, total_bytes // RECORD_BYTES)
    started = time.perf_counter()
    sent = 0
    while sent < records:
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=progress)
        except BufferError:
            producer.poll(0.005)
            continue
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
            if time.perf_counter() - started > max_seconds:
                break
    remaining = producer.flush(600)
    ended = time.perf_counter()
    # One more statistics report, taken after the last acknowledgement.
    time.sleep(2 * STATS_INTERVAL_MS / 1000)
    producer.poll(0)
    requests, request_bytes = produce_requests(stats[-1]) if stats else (0, 0)
    if progress.error is not None or remaining or progress.delivered != sent:
        raise RuntimeError(
            f"produce into {topic}: {progress.delivered} of {sent} delivered ({progress.error})"
        )
    half = len(progress.marks) // 2
    if half and ended > progress.marks[half - 1]:
        second_half = (sent - half * Progress.STEP) * RECORD_BYTES / MEGABYTE
        second_half_rate = second_half / (ended - progress.marks[half - 1])
    else:
        second_half_rate = sent * RECORD_BYTES / MEGABYTE / (ended - started)
    return Produced(sent, ended - started, second_half_rate, requests, request_bytes)


def throughput_run(
    workdir: Path, brokers: int, partitions: int, total_bytes: int, settings: Settings
) -> dict[str, Any]:
    """One fresh cluster of ``brokers`` brokers: an idle window, then the produce; MB/s, CPU
    seconds per role, etcd's counters over each window and the bytes in objects at the end."""
    with Cluster(workdir, brokers, keep=settings.keep).running() as cluster:
        topic = f"bench-p{partitions}"
        create_topics(cluster.bootstrap, {topic: partitions})
        # The partitions' creation settles (their first uploads) before the idle window.
        time.sleep(settings.idle_seconds)
        idle_before = cluster.etcd_counters()
        idle_started = time.perf_counter()
        time.sleep(settings.idle_seconds)
        idle_s = time.perf_counter() - idle_started
        idle = difference(cluster.etcd_counters(), idle_before)
        before, cpu_before = cluster.etcd_counters(), cluster.cpu()
        client_before = time.process_time()
        delivered = produce_timed(
            cluster.bootstrap, topic, partitions, total_bytes, settings.max_seconds
        )
        client_cpu = time.process_time() - client_before
        produced = difference(cluster.etcd_counters(), before)
        cpu = difference(cluster.cpu(), cpu_before)
        cpu["client"] = client_cpu
        objects, in_objects = cluster.objects()
    megabytes = delivered.records * RECORD_BYTES / MEGABYTE
    return {
        "mb_s": megabytes / delivered.seconds,
        "mb_s_second_half": delivered.second_half_mb_s,
        "megabytes": megabytes,
        "uploaded_share": in_objects / (delivered.records * RECORD_BYTES),
        "objects_per_gb": objects / (megabytes * MEGABYTE / GIGABYTE),
        "seconds": delivered.seconds,
        "requests_per_mb": delivered.requests / megabytes,
        "kb_per_request": delivered.request_bytes / max(delivered.requests, 1) / 1000,
        "cpu_per_mb": {role: used / megabytes for role, used in cpu.items()},
        "etcd": produced,
        "etcd_idle_per_s": {key: value / idle_s for key, value in idle.items()},
    }


def throughput_section(arguments: argparse.Namespace, settings: Settings) -> list[str]:
    runs: dict[int, list[dict[str, Any]]] = {1: [], 3: []}
    for run in range(arguments.runs):
        for brokers in (1, 3) if run % 2 == 0 else (3, 1):
            log(f"throughput run {run + 1}/{arguments.runs}: {brokers} broker(s)")
            result = throughput_run(
                settings.workdir,
                brokers,
                arguments.partitions,
                int(arguments.mb * MEGABYTE),
                settings,
            )
            log(
                f"  {result['mb_s']:.1f} MB/s ({result['megabytes']:.0f} MB in "
                f"{result['seconds']:.1f} s); CPU s/MB "
                + ", ".join(f"{k} {v:.4f}" for k, v in result["cpu_per_mb"].items())
            )
            runs[brokers].append(result)
    return [*throughput_report(runs, arguments), "", *etcd_report(runs)]


def throughput_report(
    runs: dict[int, list[dict[str, Any]]], arguments: argparse.Namespace
) -> list[str]:
    def row(label: str, key: str, scale: float = 1.0) -> str:
        one = statistics.median(r[key] for r in runs[1]) * scale
        three = statistics.median(r[key] for r in runs[3]) * scale
        return (
            f"| {label} | {fmt(one)} | {fmt(three)} | {three / one:.2f} |"
            if one
            else (f"| {label} | {fmt(one)} | {fmt(three)} | - |")
        )

    one = [r["mb_s"] for r in runs[1]]
    three = [r["mb_s"] for r in runs[3]]
    # Runs are paired in the order they ran (1 and 3 side by side): the ratio of each pair.
    ratios = [t / o for o, t in zip(one, three, strict=True)]
    lines = [
        f"Produce: {arguments.mb:g} MB of 1 KiB records into {arguments.partitions} partitions, "
        f"acks=all; {arguments.runs} run(s) of each, alternating.",
        "",
        "| median | 1 broker | 3 brokers | 3 / 1 |",
        "|---|---:|---:|---:|",
        row("produce MB/s", "mb_s"),
        f"| produce MB/s, each run | {', '.join(fmt(v) for v in one)} | "
        f"{', '.join(fmt(v) for v in three)} | {', '.join(f'{r:.2f}' for r in ratios)} |",
        row("produce MB/s, second half of the acknowledgements", "mb_s_second_half"),
        row("share of the bytes produced in objects at the end (%)", "uploaded_share", 100),
        row("objects in the bucket at the end, per GB produced", "objects_per_gb"),
        row("Produce requests per MB (librdkafka's count)", "requests_per_mb"),
        row("KB per Produce request", "kb_per_request"),
    ]
    for role in ("brokers", "etcd", "moto", "client"):
        for n in (1, 3):
            for r in runs[n]:
                r[f"cpu_{role}"] = r["cpu_per_mb"][role]
        lines.append(row(f"CPU ms per MB: {role}", f"cpu_{role}", 1000))
    for n in (1, 3):
        for r in runs[n]:
            r["cpu_all"] = sum(r["cpu_per_mb"].values())
    lines.append(row("CPU ms per MB: all", "cpu_all", 1000))
    return lines


def etcd_report(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    """etcd's counters per GB produced, its rate without traffic, and what is left per GB once
    that rate times the produce's duration is taken off (medians over the runs)."""
    keys = sorted({k for n in (1, 3) for r in runs[n] for k in (*r["etcd"], *r["etcd_idle_per_s"])})
    lines = [
        "| etcd counter | 1 broker: per GB | 1 broker: idle, per s | 1 broker: per GB net of idle "
        "| 3 brokers: per GB | 3 brokers: idle, per s | 3 brokers: per GB net of idle |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key in keys:
        cells = []
        for n in (1, 3):
            per_gb, idle, net = [], [], []
            for r in runs[n]:
                gigabytes = r["megabytes"] * MEGABYTE / GIGABYTE
                rate = r["etcd_idle_per_s"].get(key, 0.0)
                count = r["etcd"].get(key, 0.0)
                per_gb.append(count / gigabytes)
                idle.append(rate)
                # Never below 0: a time-driven counter's count jitters around its rate.
                net.append(max(0.0, count - rate * r["seconds"]) / gigabytes)
            cells += [fmt(statistics.median(v)) for v in (per_gb, idle, net)]
        if any(float(cell) != 0 for cell in cells):
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


# ------------------------------------------------------------------------------------- moves


@dataclass
class Acks:
    """Wall-clock times of the delivery reports, in the order they came; errors counted."""

    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.times.append(time.time())


class PacedProducer:
    """A thread producing ``rate`` 1 KiB records a second to partition 0 of ``topic``."""

    def __init__(self, bootstrap: str, topic: str, rate: int, config: Mapping[str, Any]) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, **MOVE_PRODUCER, **config})
        self.topic = topic
        self.rate = rate
        self.acks = Acks()
        self.sent = 0
        self._flush_s = 120.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paced-producer", daemon=True)

    def __enter__(self) -> PacedProducer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:
            self._flush_s = 5.0  # failing anyway: do not wait for what may never be delivered
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        payload = os.urandom(RECORD_BYTES)
        started = time.perf_counter()
        while not self._stop.is_set():
            due = started + self.sent / self.rate
            wait_due(self.producer, due)
            self.producer.produce(self.topic, payload, partition=0, on_delivery=self.acks)
            self.sent += 1
            self.producer.poll(0)
        self.producer.flush(self._flush_s)


@dataclass
class Move:
    to: int
    asked: float  # wall clock, before the admin call
    answered: float  # after it returned
    gap_s: float = 0.0
    gap_end: float = 0.0  # the acknowledgement that ended the longest gap
    given_up: LogLine | None = None  # the old broker's line (written after its close)
    led: LogLine | None = None  # the new broker's line (written after its open)


@dataclass(frozen=True)
class LogLine:
    """A ``partition given up`` or ``partition led`` line: its time and its fields."""

    at: float  # wall clock
    fields: dict[str, str]

    def number(self, name: str) -> float | None:
        value = self.fields.get(name)
        return None if value is None else float(value)


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest gap between consecutive times whose later one is in (start, end]: its
    length and its end."""
    first = bisect.bisect_right(times, start)
    last = bisect.bisect_right(times, end)
    best, best_end = 0.0, start
    for index in range(max(first, 1), last):
        gap = times[index] - times[index - 1]
        if gap > best:
            best, best_end = gap, times[index]
    return best, best_end


def serving_steadily(times: list[float], now: float) -> bool:
    """Acknowledgements have come for the last :data:`STEADY_S` with no gap above
    :data:`STEADY_GAP_S` (``times`` grows in another thread; a copy of its tail is read)."""
    recent = [t for t in times[-5000:] if t > now - STEADY_S]
    if not recent or now - recent[-1] > STEADY_GAP_S or recent[0] > now - STEADY_S + STEADY_GAP_S:
        return False
    return all(b - a <= STEADY_GAP_S for a, b in itertools.pairwise(recent))


def log_lines(
    paths: Mapping[int, Path], topic: str
) -> tuple[dict[int, LogLine], dict[int, LogLine]]:
    """From the brokers' logs, for ``topic``-0: the ``partition given up`` line of each leader
    epoch, and the ``partition led`` line of each."""
    given_up: dict[int, LogLine] = {}
    led: dict[int, LogLine] = {}
    for path in paths.values():
        for line in path.read_text(errors="replace").splitlines():
            for marker, into in ((GIVEN_UP, given_up), (LED, led)):
                head, found, rest = line.partition(marker)
                if not found:
                    continue
                fields = dict(FIELD.findall(rest))
                if fields.get("topic") == topic and fields.get("partition") == "0":
                    stamp = datetime.datetime.strptime(head[:23], LOG_TIME).timestamp()
                    into[int(fields["leader_epoch"])] = LogLine(stamp, fields)
    return given_up, led


def move_series(
    cluster: Cluster, client: str, run: int, settings: Settings
) -> tuple[list[Move], float, int]:
    """Moves of one partition under a paced producer; the moves, the longest gap over a window
    without moves, and the records acknowledged."""
    from kafka import KafkaAdminClient, TopicPartition

    topic = f"moves-{client}-{run}"
    create_topics(cluster.bootstrap, {topic: 1})
    if settings.prefill_mb:
        # A partition with history: its new broker's open reads all of it (see the report).
        produce_timed(cluster.bootstrap, topic, 1, int(settings.prefill_mb * MEGABYTE), 600)
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    leader = metadata.topics[topic].partitions[0].leader
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    moves: list[Move] = []
    try:
        with PacedProducer(cluster.bootstrap, topic, settings.rate, CLIENTS[client]) as producer:
            time.sleep(settings.move_interval)  # connections and metadata in place
            quiet_start = time.time()
            time.sleep(settings.move_interval)
            quiet_end = time.time()
            for _ in range(settings.moves):
                to = leader % 3 + 1
                asked = time.time()
                answer = admin.alter_partition_reassignments({TopicPartition(topic, 0): [to]})
                if any(error is not None for error in answer.values()):
                    raise RuntimeError(f"move of {topic}-0 to {to}: {answer}")
                moves.append(Move(to, asked, time.time()))
                leader = to
                # The next move once this one is over: the interval has passed and the
                # partition acknowledges steadily again (so each gap falls in its own window).
                while True:
                    now = time.time()
                    if now > asked + settings.move_interval and serving_steadily(
                        producer.acks.times, now
                    ):
                        break
                    if now > asked + MOVE_TIMEOUT_S:
                        raise RuntimeError(f"{topic}-0 not served {MOVE_TIMEOUT_S} s after a move")
                    time.sleep(0.05)
            time.sleep(settings.move_interval)
    finally:
        admin.close()
    acks = producer.acks
    if acks.errors or len(acks.times) != producer.sent:
        raise RuntimeError(
            f"{topic}: {len(acks.times)} of {producer.sent} acknowledged, errors {acks.errors[:3]}"
        )
    times = sorted(acks.times)
    quiet_gap, _ = longest_gap(times, quiet_start, quiet_end)
    given_up, led = log_lines(cluster.broker_logs(), topic)
    for number, move in enumerate(moves):
        following = moves[number + 1].asked if number + 1 < len(moves) else times[-1]
        move.gap_s, move.gap_end = longest_gap(times, move.asked, following)
        move.given_up = given_up.get(number)  # move k takes epoch k to k + 1
        move.led = led.get(number + 1)
    return moves, quiet_gap, producer.sent


def moves_section(arguments: argparse.Namespace, settings: Settings) -> list[str]:
    series: dict[str, list[Move]] = {client: [] for client in CLIENTS}
    quiet: dict[str, list[float]] = {client: [] for client in CLIENTS}
    sent: dict[str, int] = dict.fromkeys(CLIENTS, 0)
    with Cluster(settings.workdir, 3, keep=settings.keep).running() as cluster:
        for run in range(arguments.move_runs):
            order = list(CLIENTS) if run % 2 == 0 else list(reversed(CLIENTS))
            for client in order:
                log(f"moves run {run + 1}: client {client}, {settings.moves} moves")
                moves, quiet_gap, count = move_series(cluster, client, run, settings)
                series[client] += moves
                quiet[client].append(quiet_gap)
                sent[client] += count
                gaps = sorted(m.gap_s for m in moves)
                log(
                    f"  gaps p50 {percentile(gaps, 0.5):.3f} s, mean {statistics.mean(gaps):.3f} "
                    f"s, max {gaps[-1]:.3f} s; no-move window {quiet_gap:.3f} s"
                )
    return moves_report(series, quiet, sent, settings)


def _median(values: Iterable[float | None], scale: float = 1.0) -> str:
    known = [v * scale for v in values if v is not None]
    return f"{statistics.median(known):.3f}" if known else "-"


def _since(line: LogLine | None, move: Move) -> float | None:
    return None if line is None else line.at - move.asked


def _field(line: LogLine | None, name: str) -> float | None:
    return None if line is None else line.number(name)


def moves_report(
    series: dict[str, list[Move]],
    quiet: dict[str, list[float]],
    sent: dict[str, int],
    settings: Settings,
) -> list[str]:
    prefilled = (
        f", the partition first filled with {settings.prefill_mb:g} MB"
        if settings.prefill_mb
        else ""
    )
    lines = [
        f"Moves: {settings.rate} records/s of 1 KiB (acks=all, linger.ms=1) to one partition, "
        f"moved round-robin over 3 brokers, a move every {settings.move_interval:g} s at the "
        f"earliest and once the partition acknowledges steadily again{prefilled}.",
        "",
        "| client settings | moves | records acknowledged | gap p50 s | gap p99 s | gap mean s | "
        "gap max s | longest gap without a move s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client, moves in series.items():
        gaps = sorted(m.gap_s for m in moves)
        shown = CLIENTS[client] or CLIENT_DEFAULTS
        settings_text = ", ".join(f"{k}={v}" for k, v in shown.items())
        lines.append(
            f"| {client} ({settings_text}) | {len(moves)} | {sent[client]} | "
            f"{percentile(gaps, 0.5):.3f} | {percentile(gaps, 0.99):.3f} | "
            f"{statistics.mean(gaps):.3f} | {gaps[-1]:.3f} | {max(quiet[client]):.3f} |"
        )
    lines += [
        "",
        "Where a move's time goes: medians over the moves, in seconds from the admin request "
        "(the client's clock and the brokers' log lines: one machine, one clock). The old "
        "broker's close uploads what its WAL holds for the partition, closes its data streams, "
        "writes a checkpoint of the batch index and the producer state to the MetaStream and "
        "closes it; the new broker's open reads the MetaStream, loads the checkpoint and scans "
        "the log past it (the whole retained log without one).",
        "",
        "| client settings | decision answered | old broker closed | its close took | "
        "new broker opened | its open took | of which the scan | MB scanned | "
        "longest gap ended | opened -> gap end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client, moves in series.items():
        lines.append(
            "| "
            + " | ".join(
                [
                    client,
                    _median(m.answered - m.asked for m in moves),
                    _median(_since(m.given_up, m) for m in moves),
                    _median(_field(m.given_up, "close_seconds") for m in moves),
                    _median(_since(m.led, m) for m in moves),
                    _median(_field(m.led, "seconds") for m in moves),
                    _median(_field(m.led, "scan_seconds") for m in moves),
                    _median((_field(m.led, "scanned_bytes") for m in moves), 1 / MEGABYTE),
                    _median(m.gap_end - m.asked for m in moves),
                    _median(None if m.led is None else m.gap_end - m.led.at for m in moves),
                ]
            )
            + " |"
        )
    lines += ["", "Each move: " + moves_detail(series)]
    return lines


def moves_detail(series: dict[str, list[Move]]) -> str:
    """Per move: closed / opened / gap end, seconds after the request, (gap), [scan s]."""
    parts = []
    for client, moves in series.items():
        cells = []
        for m in moves:
            closed, opened = _since(m.given_up, m), _since(m.led, m)
            scan = _field(m.led, "scan_seconds")
            cells.append(
                f"{'-' if closed is None else f'{closed:.2f}'}/"
                f"{'-' if opened is None else f'{opened:.2f}'}/{m.gap_end - m.asked:.2f}"
                f"({m.gap_s:.2f})[{'-' if scan is None else f'{scan:.2f}'}]"
            )
        parts.append(f"{client}: closed/opened/gap-end(gap)[scan] " + " ".join(cells))
    return "; ".join(parts)


# -------------------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Settings:
    workdir: Path
    max_seconds: float
    idle_seconds: float
    rate: int
    moves: int
    move_interval: float
    prefill_mb: float
    keep: bool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--runs", type=int, default=3, help="throughput runs of each size")
    parser.add_argument("--move-runs", type=int, default=1, help="move series per client")
    parser.add_argument("--mb", type=float, default=2048.0, help="MB per produce run")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="cap per produce run")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--rate", type=int, default=500, help="records/s during the moves")
    parser.add_argument("--move-interval", type=float, default=2.0)
    parser.add_argument(
        "--prefill-mb", type=float, default=0.0, help="MB in the moved partition before moves"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of tiny sizes")
    parser.add_argument("--dir", type=Path, default=None, help="where the clusters keep data")
    parser.add_argument("--keep", action="store_true", help="keep the clusters' logs and data")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.runs, arguments.move_runs, arguments.mb = 1, 1, 2.0
        arguments.idle_seconds, arguments.moves, arguments.move_interval = 0.3, 1, 0.5
    sections = [s.strip() for s in arguments.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    workdir = Path(tempfile.mkdtemp(prefix="cluster-bench-", dir=arguments.dir))
    settings = Settings(
        workdir=workdir,
        max_seconds=arguments.max_seconds,
        idle_seconds=arguments.idle_seconds,
        rate=arguments.rate,
        moves=arguments.moves,
        move_interval=arguments.move_interval,
        prefill_mb=arguments.prefill_mb,
        keep=arguments.keep,
    )
    load_before = os.getloadavg()
    began = time.perf_counter()
    report: list[str] = []
    try:
        if "throughput" in sections:
            report += [*throughput_section(arguments, settings), ""]
        if "moves" in sections:
            report += [*moves_section(arguments, settings), ""]
    except BaseException:
        log(f"failed: kept {workdir}")
        raise
    if not arguments.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    command = "python -m bench.cluster_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    head = (
        f"`{command.strip()}`: {time.perf_counter() - began:.0f} s in all; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs)."
    )
    text = "\n".join([head, "", *report]).rstrip()
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
