"""Catch-up reads beside producers: what a many-partition catch-up from objects costs a producer
on the same broker, and what it costs the object store and the block cache.

    python -m bench.catchup_bench [--partitions 1000] [--backlog-mb 1000] [--cache-mb 64]
                                  [--rate 1000] [--before-seconds 20] [--max-catchup-seconds 300]
                                  [--targets ours-local,ours-s3,peer-memory,peer-s3]
                                  [--pyspy PATH] [--quick] [--dir DIR] [--out FILE] [--plot FILE]
                                  [--override NAME=VALUE ...]

Each target is a fresh broker (the targets of ``bench.broker_bench``: ours on local objects or on
S3 over a counting moto server, the peer broker in memory or on S3 when its script is there; by
default ours on both and, with the script, the peer in memory and on S3, in memory only with
``--quick``). Against each, in order:

1. fill: a backlog topic of ``--partitions`` partitions gets ``--backlog-mb`` MB of 1 KiB records
   (acks=all, runs of 64 records per partition so that batches are full); before it, one
   coordinator lookup has the broker create its group coordinator's topic, which a running
   cluster has long had (the catch-up consumer has a group);
2. settle: ours is restarted gracefully, so the whole backlog is in objects and the new process
   has nothing of it in its LogCache (``s3.block.cache.size`` is ``--cache-mb``, a fraction of the
   backlog, so the catch-up cannot be served from the cache), and the bench waits until it has
   opened every backlog partition; the peer is read as it is;
3. before: a producer on another topic (1 partition, acks=all, linger.ms 1, 100-byte records,
   confluent-kafka) sends ``--rate`` records/s, paced, for ``--before-seconds``; it goes on
   sending through the rest of the run;
4. during: a catch-up consumer (a separate process, one confluent-kafka consumer assigned every
   backlog partition at offset 0, librdkafka's default fetch settings) reads the whole backlog;
   catch-up MB/s is the record bytes it received over the seconds from its start to the last
   record.

Produce latency is librdkafka's own (``produce`` to delivery report) of each record, placed in
time by its send time: *before* is every record sent in phase 3 (the first second left out),
*during* every record sent while the consumer read.

The store and the cache, for ours: the broker logs a ``read objects`` line every few seconds in
which it read objects (GETs, the bytes they returned, the block cache's largest size, sampled
each second; ``automq_ref/node.py``, counted by ``CountingReads`` in
``automq_ref/io/storage/object_store.py``), whatever the store; the bench sums the lines logged
from the catch-up's start on (the reopened partitions' own reads come before it: phase 3 lasts
at least one log interval and a margin, ``READ_LOG_WAIT_S``). *Store bytes per delivered byte*
is those GET bytes over the record bytes the consumer received; *cache bytes per reading
stream* is the cache's peak over the partitions read. On S3, the counting moto server's GET
count is reported beside the broker's as a cross-check (and for the peer on S3, the only figure
there is).

``--pyspy PATH`` samples our broker with py-spy (``PATH`` is the py-spy binary) while the
catch-up runs and reports the frames that took most samples (self and inclusive). ``--out``
writes the report and the figures (JSON), ``--plot`` a PNG of produce latency over time. The
last line printed is a JSON object with the first of our targets' ``produce_p99_ratio_during_
catchup``, ``store_bytes_per_delivered_byte`` and ``cache_bytes_per_reading_stream``.
``--quick`` is a smaller run (256 MB backlog, 16 MiB cache, 8 s before) of two to three minutes.
``--override NAME=VALUE`` (repeatable) gives our brokers a setting of their own, e.g. a low
``s3.network.baseline.bandwidth`` to watch the network limiter hold the catch-up back.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from bench.broker_bench import (
    MEGABYTE,
    PEER_SCRIPT,
    REPO,
    TITLES,
    OursTarget,
    PeerTarget,
    Target,
    create_topics,
    fmt,
    percentile,
    wait_due,
)

MIB = 2**20
BACKLOG_TOPIC = "catchup-backlog"
LATENCY_TOPIC = "catchup-produce"
BACKLOG_RECORD_BYTES = 1024
PRODUCE_RECORD_BYTES = 100
RUN_PER_PARTITION = 64  # backlog records sent to one partition before the next
ALL_TARGETS = ("ours-local", "ours-s3", "peer-memory", "peer-s3")
READ_LINE = "read objects "
# A line's log interval plus a margin: the last "read objects" line comes this long after the
# catch-up's last read.
READ_LOG_WAIT_S = 6.5


def log(message: str) -> None:
    print(f"[catchup_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- pure helpers


def parse_fields(text: str) -> dict[str, str]:
    """``key=value`` fields of a broker log line (a value may be a JSON string)."""
    found: dict[str, str] = {}
    for match in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', text):
        value = match.group(2)
        found[match.group(1)] = json.loads(value) if value.startswith('"') else value
    return found


@dataclass(frozen=True)
class ReadTotals:
    """What the broker's ``read objects`` lines add up to."""

    lines: int = 0
    gets: int = 0
    get_bytes: int = 0
    cache_peak_bytes: int = 0


def read_totals(log_lines: Iterable[str]) -> ReadTotals:
    lines = gets = get_bytes = peak = 0
    for line in log_lines:
        if READ_LINE not in line:
            continue
        found = parse_fields(line.split(READ_LINE, 1)[1])
        lines += 1
        gets += int(found["gets"])
        get_bytes += int(found["bytes"])
        peak = max(peak, int(found["cache_peak_bytes"]))
    return ReadTotals(lines, gets, get_bytes, peak)


def latencies_between(
    samples: Sequence[tuple[float, float]], start: float, end: float
) -> list[float]:
    """Sorted latencies of the (send time, latency) samples sent in ``[start, end)``."""
    return sorted(latency for sent, latency in samples if start <= sent < end)


def safe_ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def per_second(
    samples: Sequence[tuple[float, float]], origin: float
) -> list[tuple[float, float, float]]:
    """(second since ``origin``, p50, p99) of the samples sent in each whole second."""
    buckets: dict[int, list[float]] = collections.defaultdict(list)
    for sent, latency in samples:
        buckets[int(sent - origin)].append(latency)
    rows = []
    for second in sorted(buckets):
        values = sorted(buckets[second])
        rows.append((float(second), percentile(values, 0.50), percentile(values, 0.99)))
    return rows


# Frames at the root of every stack of a thread (the interpreter's start, the event loop's
# run, a thread's bootstrap): in every sample of their thread, they say nothing.
ROOT_FRAME = re.compile(
    r"^(_run_module_as_main|_run_code|<module>|main|run|Runner\.run|Thread\._bootstrap\w*|"
    r"Thread\.run|_worker) \("
)


def top_frames(
    collapsed: Iterable[str], count: int = 12
) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """From py-spy's raw (collapsed) stacks ``frame;frame;... samples``: the total samples, and
    the frames with most samples where they are the innermost (self) and anywhere (inclusive;
    the root frames of a thread are left out)."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in collapsed:
        stack, _, number = line.rstrip().rpartition(" ")
        if not stack or not number.isdigit():
            continue
        samples = int(number)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] += samples
        for frame in set(frames):
            if not ROOT_FRAME.match(frame):
                inclusive[frame] += samples
    return total, own.most_common(count), inclusive.most_common(count)


# ---------------------------------------------------------------------------------- workloads


def fill_backlog(bootstrap: str, partitions: int, total_bytes: int) -> int:
    """Produce the backlog; the records delivered."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1_000_000}
    )
    payload = os.urandom(BACKLOG_RECORD_BYTES)
    records = max(partitions, total_bytes // BACKLOG_RECORD_BYTES)
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    sent = 0
    while sent < records:
        try:
            partition = (sent // RUN_PER_PARTITION) % partitions
            producer.produce(BACKLOG_TOPIC, payload, partition=partition, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
            continue
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
    if producer.flush(600) or errors:
        raise RuntimeError(f"backlog: {len(errors)} failed deliveries ({errors[:1]})")
    return sent


class PacedProducer:
    """``rate`` records/s of 100 bytes into the latency topic from a thread, until stopped; each
    delivered record's (send time, latency), times in ``time.time()`` seconds."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
        self.rate = rate
        self.samples: list[tuple[float, float]] = []
        self.errors: list[KafkaError] = []
        self.started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, sent: float, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.errors.append(error)
            return
        latency = message.latency()
        if latency is not None:
            self.samples.append((sent, latency))

    def start(self) -> None:
        payload = os.urandom(PRODUCE_RECORD_BYTES)
        for _ in range(100):  # connection and metadata in place before the clock starts
            self.producer.produce(LATENCY_TOPIC, payload, partition=0)
        self.producer.flush(60)
        self.started = time.time()
        self._thread.start()

    def _run(self) -> None:
        payload = os.urandom(PRODUCE_RECORD_BYTES)
        began = time.perf_counter()
        index = 0
        while not self._stop.is_set():
            due = began + index / self.rate
            wait_due(self.producer, due)
            callback = functools.partial(self._delivered, time.time())
            self.producer.produce(LATENCY_TOPIC, payload, partition=0, on_delivery=callback)
            self.producer.poll(0)
            index += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.flush(60)
        if self.errors:
            raise RuntimeError(f"paced produce: {len(self.errors)} failed ({self.errors[:1]})")


def create_group_coordinator_topic(bootstrap: str) -> None:
    """Have the broker create its group coordinator's topic (``__consumer_offsets``) now: the
    catch-up consumer has a group, and on a running cluster that topic exists long before any
    catch-up; created by the consumer's first coordinator lookup, it would open its partitions
    inside the catch-up's first second."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"warm-{uuid.uuid4().hex}"})
    try:
        consumer.committed([TopicPartition(LATENCY_TOPIC, 0)], timeout=60)
    finally:
        consumer.close()


def consume_backlog(
    bootstrap: str, partitions: int, records: int, timeout_s: float
) -> dict[str, float]:
    """Read ``records`` records of the backlog from offset 0 of every partition (run in a child
    process, so that the bench's producer does not share an interpreter with it)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"catchup-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        started = time.time()
        consumer.assign([TopicPartition(BACKLOG_TOPIC, index, 0) for index in range(partitions)])
        seen = value_bytes = 0
        while seen < records:
            if time.time() - started > timeout_s:
                break
            for message in consumer.consume(num_messages=min(10_000, records - seen), timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"catch-up: {error}")
                seen += 1
                value_bytes += len(message.value() or b"")
        return {"started": started, "ended": time.time(), "records": seen, "bytes": value_bytes}
    finally:
        consumer.close()


def run_consumer_process(
    bootstrap: str, partitions: int, records: int, timeout_s: float
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.catchup_bench", "--consume"]
    command += [bootstrap, str(partitions), str(records), str(timeout_s)]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)


class PySpy:
    """py-spy sampling a process until stopped; its raw (collapsed) stacks in ``path``."""

    def __init__(self, binary: str, pid: int, path: Path) -> None:
        self.path = path
        command = [binary, "record", "--pid", str(pid), "--rate", "100", "--nonblocking", "--gil"]
        command += ["--format", "raw", "--output", str(path)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.began = time.perf_counter()
        self.seconds = 0.0

    def stop(self) -> list[str]:
        self.seconds = time.perf_counter() - self.began
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.path.read_text().splitlines() if self.path.exists() else []


# ------------------------------------------------------------------------------------ one run


@dataclass(frozen=True)
class Settings:
    partitions: int
    backlog_bytes: int
    cache_bytes: int
    rate: int
    before_s: float
    max_catchup_s: float
    pyspy: str | None
    workdir: Path
    overrides: tuple[str, ...] = ()  # our broker's settings, name=value


@dataclass
class Outcome:
    figures: dict[str, float] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)
    window: tuple[float, float, float] = (0.0, 0.0, 0.0)  # producer start, catch-up start, end
    profile: list[str] = field(default_factory=list)


def broker_log(target: Target) -> list[str]:
    if not isinstance(target, OursTarget):
        return []
    path = target.data_dir.parent / "broker.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def wait_opened(target: OursTarget, partitions: int, since: int, timeout_s: float = 300) -> None:
    """Until the restarted broker has logged ``partition led`` for every backlog partition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        led = [line for line in broker_log(target)[since:] if "partition led " in line]
        if sum(f"topic={BACKLOG_TOPIC} " in line for line in led) >= partitions:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{target.name}: the backlog's partitions did not open in {timeout_s} s")


def moto_gets(target: Target) -> int | None:
    stats = target.object_stats()
    return (
        None if stats is None else sum(n for method, n in stats.items() if method.startswith("GET"))
    )


def make_target(name: str, settings: Settings) -> Target:
    if name.startswith("ours"):
        overrides = [f"s3.block.cache.size={settings.cache_bytes}", *settings.overrides]
        wal_bytes = max(256 * MIB, min(2 * settings.backlog_bytes, 1024 * MIB))
        return OursTarget(name, settings.workdir, wal_bytes, None, extra_overrides=overrides)
    return PeerTarget(name)


def run_target(name: str, settings: Settings) -> Outcome:
    outcome = Outcome()
    figures = outcome.figures
    target = make_target(name, settings)
    try:
        bootstrap = target.start()
        create_topics(bootstrap, {BACKLOG_TOPIC: settings.partitions, LATENCY_TOPIC: 1})
        create_group_coordinator_topic(bootstrap)
        began = time.perf_counter()
        records = fill_backlog(bootstrap, settings.partitions, settings.backlog_bytes)
        figures["fill_s"] = time.perf_counter() - began
        figures["backlog_mb"] = records * BACKLOG_RECORD_BYTES / MEGABYTE
        log(f"{name}: backlog of {figures['backlog_mb']:.0f} MB in {figures['fill_s']:.0f} s")
        restarted_at = len(broker_log(target))
        target.settle()
        if isinstance(target, OursTarget):
            # The reopened partitions read their own state from objects: done before the clock.
            wait_opened(target, settings.partitions, restarted_at)
        gets_before = moto_gets(target)
        producer = PacedProducer(bootstrap, settings.rate)
        producer.start()
        time.sleep(settings.before_s)
        spy = None
        if settings.pyspy and isinstance(target, OursTarget) and target.process is not None:
            spy = PySpy(settings.pyspy, target.process.pid, settings.workdir / f"{name}.pyspy")
        caught_up_at = len(broker_log(target))  # read lines logged so far are the opens'
        consumer = run_consumer_process(
            bootstrap, settings.partitions, records, settings.max_catchup_s
        )
        out, _ = consumer.communicate(timeout=settings.max_catchup_s + 120)
        if consumer.returncode != 0:
            raise RuntimeError(f"{name}: the catch-up consumer exited with {consumer.returncode}")
        read = json.loads(out.strip().splitlines()[-1])
        if spy is not None:
            outcome.profile = spy.stop()
            figures["profile_s"] = spy.seconds
        time.sleep(READ_LOG_WAIT_S)  # the broker's last "read objects" line; still producing
        producer.stop()
        outcome.samples = producer.samples
        outcome.window = (producer.started, read["started"], read["ended"])
        seconds = read["ended"] - read["started"]
        figures["catchup_records"] = read["records"]
        figures["catchup_complete"] = float(read["records"] >= records)
        figures["catchup_s"] = seconds
        figures["catchup_mb_s"] = read["bytes"] / MEGABYTE / seconds
        before = latencies_between(producer.samples, producer.started + 1.0, read["started"])
        during = latencies_between(producer.samples, read["started"], read["ended"])
        for label, values in (("before", before), ("during", during)):
            if values:
                figures[f"p50_{label}_ms"] = percentile(values, 0.50) * 1000
                figures[f"p99_{label}_ms"] = percentile(values, 0.99) * 1000
                figures[f"max_{label}_ms"] = values[-1] * 1000
        ratio = safe_ratio(figures.get("p99_during_ms"), figures.get("p99_before_ms"))
        if ratio is not None:
            figures["p99_ratio"] = ratio
        gets_after = moto_gets(target)
        if gets_before is not None and gets_after is not None:
            figures["moto_gets"] = gets_after - gets_before
            figures["moto_gets_per_mb"] = (gets_after - gets_before) / (read["bytes"] / MEGABYTE)
        totals = read_totals(broker_log(target)[caught_up_at:])
        if totals.lines:
            figures["store_gets"] = totals.gets
            figures["store_gets_per_mb"] = totals.gets / (read["bytes"] / MEGABYTE)
            figures["store_bytes_per_delivered_byte"] = totals.get_bytes / read["bytes"]
            figures["cache_peak_mib"] = totals.cache_peak_bytes / MIB
            figures["cache_bytes_per_stream"] = totals.cache_peak_bytes / settings.partitions
        log(
            f"{name}: catch-up {figures['catchup_mb_s']:.1f} MB/s; produce p99 "
            f"{figures.get('p99_before_ms', 0):.1f} -> {figures.get('p99_during_ms', 0):.1f} ms"
        )
    finally:
        target.stop()
    return outcome


# ------------------------------------------------------------------------------------- report


ROWS = (
    ("backlog_mb", "backlog MB"),
    ("fill_s", "backlog fill s"),
    ("catchup_mb_s", "catch-up MB/s"),
    ("catchup_s", "catch-up s"),
    ("catchup_complete", "catch-up read the whole backlog (1 = yes)"),
    ("p50_before_ms", "produce p50 ms before"),
    ("p99_before_ms", "produce p99 ms before"),
    ("p50_during_ms", "produce p50 ms during catch-up"),
    ("p99_during_ms", "produce p99 ms during catch-up"),
    ("max_during_ms", "produce max ms during catch-up"),
    ("p99_ratio", "produce p99 during / before"),
    ("store_gets_per_mb", "store GETs per MB delivered (broker's count)"),
    ("moto_gets_per_mb", "store GETs per MB delivered (moto's count)"),
    ("store_bytes_per_delivered_byte", "store bytes fetched per byte delivered"),
    ("cache_peak_mib", "block cache peak MiB"),
    ("cache_bytes_per_stream", "block cache bytes per reading stream"),
)


def results_table(results: Mapping[str, Outcome]) -> str:
    names = list(results)
    lines = ["| metric | " + " | ".join(TITLES[name] for name in names) + " |"]
    lines.append("|---" + "|---:" * len(names) + "|")
    for key, label in ROWS:
        values = [results[name].figures.get(key) for name in names]
        if all(value is None for value in values):
            continue
        lines.append(f"| {label} | " + " | ".join(fmt(value) for value in values) + " |")
    return "\n".join(lines)


def loop_share(collapsed: Iterable[str]) -> float | None:
    """The share of samples taken on the event loop's thread (the interpreter's main thread)
    rather than on another thread (the store's and the WAL's I/O threads)."""
    main = total = 0
    for line in collapsed:
        stack, _, number = line.rstrip().rpartition(" ")
        if stack and number.isdigit():
            total += int(number)
            main += int(number) * stack.startswith("_run_module_as_main ")
    return main / total if total else None


def profile_section(name: str, collapsed: Sequence[str], seconds: float) -> list[str]:
    total, own, inclusive = top_frames(collapsed)
    if not total:
        return []
    share = loop_share(collapsed) or 0.0
    lines = [
        f"py-spy on {TITLES[name]} while the catch-up ran ({seconds:.1f} s, 100 samples/s, only "
        f"while a thread holds the GIL): {total} samples, so the GIL was held "
        f"{total / max(seconds * 100, 1) * 100:.0f}% of the time, {100 * share:.0f}% of it by "
        "the event loop's thread.",
        "",
    ]
    lines += ["| self % | frame |", "|---:|---|"]
    lines += [f"| {100 * samples / total:.1f} | `{frame}` |" for frame, samples in own]
    lines += ["", "| inclusive % | frame |", "|---:|---|"]
    lines += [f"| {100 * samples / total:.1f} | `{frame}` |" for frame, samples in inclusive]
    return lines


def plot(results: Mapping[str, Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(results), 1, figsize=(9, 3 * len(results)), squeeze=False)
    for axis, (name, outcome) in zip(axes[:, 0], results.items(), strict=True):
        origin, start, end = outcome.window
        rows = per_second(outcome.samples, origin)
        axis.plot([r[0] for r in rows], [r[2] * 1000 for r in rows], label="p99 per second")
        axis.plot([r[0] for r in rows], [r[1] * 1000 for r in rows], label="p50 per second")
        axis.axvspan(start - origin, end - origin, color="orange", alpha=0.2, label="catch-up")
        axis.set_yscale("log")
        axis.set_ylabel("produce ms")
        axis.set_title(TITLES[name])
        axis.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("seconds since the producer started")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summary(results: Mapping[str, Outcome]) -> dict[str, Any]:
    """The last line's object: the first of our targets' three figures (None when missing)."""
    ours = [name for name in results if name.startswith("ours")]
    figures = results[ours[0]].figures if ours else {}
    return {
        "target": ours[0] if ours else None,
        "produce_p99_ratio_during_catchup": figures.get("p99_ratio"),
        "store_bytes_per_delivered_byte": figures.get("store_bytes_per_delivered_byte"),
        "cache_bytes_per_reading_stream": figures.get("cache_bytes_per_stream"),
    }


# --------------------------------------------------------------------------------------- main


def parse_targets(text: str) -> list[str]:
    chosen = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        if name not in ALL_TARGETS:
            raise SystemExit(f"unknown target {name!r}; choose from {ALL_TARGETS}")
        if name not in chosen:
            chosen.append(name)
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--backlog-mb", type=float, default=1000.0)
    parser.add_argument("--cache-mb", type=float, default=64.0, help="s3.block.cache.size, MiB")
    parser.add_argument("--rate", type=int, default=1000, help="produce records/s")
    parser.add_argument("--before-seconds", type=float, default=20.0)
    parser.add_argument("--max-catchup-seconds", type=float, default=300.0)
    parser.add_argument("--targets", default=None, help=f"comma-separated, of {ALL_TARGETS}")
    parser.add_argument("--pyspy", default=None, help="the py-spy binary: profile our broker")
    parser.add_argument("--quick", action="store_true", help="a smaller run (a few minutes)")
    parser.add_argument("--dir", type=Path, default=None, help="where our brokers keep data")
    parser.add_argument("--out", type=Path, default=None, help="the report and figures, JSON")
    parser.add_argument("--plot", type=Path, default=None, help="produce latency over time, PNG")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of our broker (repeatable), e.g. s3.network.baseline.bandwidth=20971520",
    )
    parser.add_argument("--consume", nargs=4, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.consume is not None:
        bootstrap, partitions, records, timeout_s = arguments.consume
        result = consume_backlog(bootstrap, int(partitions), int(records), float(timeout_s))
        print(json.dumps(result), flush=True)
        return
    if arguments.quick:
        arguments.backlog_mb = min(arguments.backlog_mb, 256.0)
        arguments.cache_mb = min(arguments.cache_mb, 16.0)
        arguments.before_seconds = min(arguments.before_seconds, 8.0)
        arguments.max_catchup_seconds = min(arguments.max_catchup_seconds, 90.0)
    # The open's reads of a restarted broker are logged before the catch-up starts.
    arguments.before_seconds = max(arguments.before_seconds, READ_LOG_WAIT_S)
    default_targets = ["ours-local", "ours-s3"]
    if PEER_SCRIPT.exists():
        default_targets += ["peer-memory"] if arguments.quick else ["peer-memory", "peer-s3"]
    targets = parse_targets(arguments.targets) if arguments.targets else default_targets
    workdir = Path(tempfile.mkdtemp(prefix="catchup-bench-", dir=arguments.dir))
    settings = Settings(
        partitions=arguments.partitions,
        backlog_bytes=int(arguments.backlog_mb * MEGABYTE),
        cache_bytes=int(arguments.cache_mb * MIB),
        rate=arguments.rate,
        before_s=arguments.before_seconds,
        max_catchup_s=arguments.max_catchup_seconds,
        pyspy=arguments.pyspy,
        workdir=workdir,
        overrides=tuple(arguments.override),
    )
    load_before = os.getloadavg()
    began = time.perf_counter()
    results: dict[str, Outcome] = {}
    failed: dict[str, str] = {}
    try:
        for name in targets:
            log(f"{name}: starting")
            try:
                results[name] = run_target(name, settings)
            except Exception as error:  # the other targets still run; the report says so
                log(f"{name}: failed: {error!r}")
                failed[name] = repr(error)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    command = "python -m bench.catchup_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    report = [
        f"`{command.strip()}`: {settings.partitions} partitions, a backlog of "
        f"{settings.backlog_bytes / MEGABYTE:.0f} MB, block cache {settings.cache_bytes / MIB:.0f} "
        f"MiB, {settings.rate} records/s produced; {time.perf_counter() - began:.0f} s in all; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} CPUs).",
        "",
        results_table(results),
    ]
    report += [f"\n{TITLES[name]} failed: {error}" for name, error in failed.items()]
    for name, outcome in results.items():
        section = profile_section(name, outcome.profile, outcome.figures.get("profile_s", 0.0))
        if section:
            report += ["", *section]
    text = "\n".join(report)
    print(text, flush=True)
    if arguments.out is not None:
        saved = {
            "report": text,
            "figures": {name: outcome.figures for name, outcome in results.items()},
            # time.time() of the producer's start, the catch-up's start and end; and per second
            # since the producer's start, produce p50 and p99 in seconds (what the plot shows).
            "windows": {name: outcome.window for name, outcome in results.items()},
            "per_second": {
                name: per_second(outcome.samples, outcome.window[0])
                for name, outcome in results.items()
            },
        }
        arguments.out.write_text(json.dumps(saved, indent=1) + "\n")
    if arguments.plot is not None:
        plot(results, arguments.plot)
    print(json.dumps(summary(results)), flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
