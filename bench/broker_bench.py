"""The same Kafka client workload against automq-ref and against a peer broker, side by side.

    python -m bench.broker_bench [--runs 3] [--mb 128] [--latency-seconds 10]
                                 [--targets ours-local,ours-s3,peer-memory,peer-s3]
                                 [--moto-whole-object-ranges] [--quick] [--profile DIR]
                                 [--out FILE]

Four targets, each a fresh broker process per run:

- ``ours-local``: ``automq-ref serve`` with its objects in a local directory under log.dirs;
- ``ours-s3``: ``automq-ref serve`` with ``s3.data.buckets`` on a moto S3 server started here;
- ``peer-memory`` / ``peer-s3``: a Kafka-compatible peer broker (Tansu), with in-memory storage or
  S3 storage on a moto server of its own, started by an optional peer script that is not part of
  this repository: the path in the ``PEER_SCRIPT`` environment variable, by default the peer
  script beside the checkout, when present. Without one, run only the ``ours-*`` targets.

Both moto servers count the HTTP requests they see by method, through the same WSGI wrapper.
Ours also answers a ranged GET by reading just that range (``--moto-whole-object-ranges`` turns
this off): stock moto reads the whole object and slices it, so a ranged GET into one of our
100+ MB objects costs tens of ms of moto CPU and about 0.1 s of wall time: an artifact of the
test double that real S3 does not have and that the peer's small objects (tens of KB) hardly
feel.

The workloads, run in this order against each target with the confluent-kafka client:

1. produce throughput: ``--mb`` MB of 1 KiB records (acks=all, linger.ms=5, batch.size=1000000,
   records spread round-robin over the partitions) into a topic with 1 and with 16 partitions,
   at most ``--max-seconds`` each; MB/s from the first ``produce`` to the end of ``flush``;
2. produce latency: ``--rate`` records/s (1 KiB, acks=all, linger.ms ``--latency-linger-ms``)
   paced for ``--latency-seconds`` into a 1-partition topic; p50/p99 of librdkafka's own
   per-message latency (``produce`` call to delivery report);
3. catch-up consume: a fresh consumer (assign, offset 0, librdkafka's default fetch settings)
   reads each throughput topic from the beginning; MB/s until the last record. Before that our
   broker is restarted gracefully (SIGTERM uploads the WAL's data, the new process reads it from
   objects); the peer is read as it is;
4. object-store write requests per GB: PUT and POST requests (multipart uploads included) seen by
   the moto server from the broker's start to the end of the run (for ours: including the upload
   at the graceful stop), divided by the payload produced (all three produce workloads).

Each figure is the median over ``--runs`` runs; targets are interleaved within a run so they see
the same background load. Just before the latency run, a 4 KiB write+fdatasync loop measures
the disk's own latency at that moment (the machine is shared; a WAL cannot beat its disk).
``--profile DIR`` runs our broker under cProfile (one ``.prof`` file per broker process).
``--quick`` is a smoke run of a few MB (``--quick --targets ours`` is the unit test).
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
# Optional and external: the peer script beside the checkout unless PEER_SCRIPT names another.
PEER_SCRIPT = Path(os.environ.get("PEER_SCRIPT", REPO.parent / "shared" / "bench" / "peer.sh"))
SERVING = "serving Kafka on "
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 600.0
RECORD_BYTES = 1024
MEGABYTE = 1_000_000
GIGABYTE = 1_000_000_000
BUCKET = "automq-bench"
ALL_TARGETS = ("ours-local", "ours-s3", "peer-memory", "peer-s3")
ALIASES = {"ours": ("ours-local", "ours-s3"), "peer": ("peer-memory", "peer-s3")}
TITLES = {
    "ours-local": "ours (local objects)",
    "ours-s3": "ours (S3 on moto)",
    "peer-memory": "peer (memory)",
    "peer-s3": "peer (S3 on moto)",
}
PARTITION_COUNTS = (1, 16)
THROUGHPUT_PRODUCER = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000}


# ------------------------------------------------------------------------------- moto, counted


def serve_counting_moto(port: int, *, fast_ranges: bool = False) -> None:
    """A moto S3 server on 127.0.0.1:``port`` that counts requests by method (``GET /__stats``).

    A conditional write (If-Match / If-None-Match) is counted as ``PUT+cond``. moto answers a
    ranged GET by reading the whole object and slicing it, so its cost grows with the object's
    size, which real S3 does not do; ``fast_ranges`` answers ``Range: bytes=a-b`` GETs by reading
    only those bytes from moto's own copy of the object (anything else still goes to moto).
    """
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.s3.models import s3_backends
    from werkzeug.serving import make_server

    lock = threading.Lock()
    stats: dict[str, int] = {}
    backend = DomainDispatcherApplication(create_backend_app)

    def ranged_get(
        environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> list[bytes] | None:
        unit, _, spec = environ.get("HTTP_RANGE", "").partition("=")
        first_text, _, last_text = spec.partition("-")
        bucket_name, _, key_name = environ.get("PATH_INFO", "").lstrip("/").partition("/")
        if unit != "bytes" or not first_text.isdigit() or not last_text.isdigit() or not key_name:
            return None
        bucket = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets.get(bucket_name)
        key = None if bucket is None else bucket.keys.get(key_name)
        first, last = int(first_text), int(last_text)
        if key is None or first > last or first >= key.size:
            return None
        last = min(last, key.size - 1)
        with key.lock:
            key._value_buffer.seek(first)
            body: bytes = key._value_buffer.read(last - first + 1)
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(len(body))),
            ("Content-Range", f"bytes {first}-{last}/{key.size}"),
            ("ETag", key.etag),
            ("Accept-Ranges", "bytes"),
        ]
        start_response("206 Partial Content", headers)
        return [body]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith("/__stats"):
            with lock:
                body = json.dumps(stats).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        conditional = environ.get("HTTP_IF_MATCH") or environ.get("HTTP_IF_NONE_MATCH")
        key = environ["REQUEST_METHOD"] + ("+cond" if conditional else "")
        with lock:
            stats[key] = stats.get(key, 0) + 1
        if fast_ranges and key == "GET" and "HTTP_RANGE" in environ:
            answered = ranged_get(environ, start_response)
            if answered is not None:
                return answered
        result: Iterable[bytes] = backend(environ, start_response)
        return result

    make_server("127.0.0.1", port, app, threaded=True).serve_forever()


def write_requests(stats: dict[str, int]) -> int:
    """PUT (plain or conditional) and POST (multipart create/complete, batch delete) requests."""
    return sum(count for method, count in stats.items() if method.startswith(("PUT", "POST")))


def free_port(*, also_plus: int = 0) -> int:
    """A port free on 127.0.0.1 now (and, with ``also_plus``, so is ``port + also_plus``)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not also_plus:
            return port
        if port + also_plus <= 65535:
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.bind(("127.0.0.1", port + also_plus))
                return port
    raise RuntimeError("no free port pair found")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


class CountingMoto:
    """``serve_counting_moto`` in a child process, with one bucket created."""

    def __init__(self, *, fast_ranges: bool) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "bench.broker_bench"]
        command += ["--serve-counting-moto", str(self.port)]
        if not fast_ranges:
            command.append("--moto-whole-object-ranges")
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: port_open(self.port), 30, "the moto server")
        import botocore.session

        botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.endpoint}/__stats", timeout=10) as response:
            result: dict[str, int] = json.load(response)
        return result

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


# ------------------------------------------------------------------------------------ brokers


class Target(abc.ABC):
    """One broker under test: start it, settle its data, count its object writes, stop it."""

    name = ""

    @abc.abstractmethod
    def start(self) -> str:
        """Start the broker; return its bootstrap address."""

    def settle(self) -> float | None:
        """Make the produced data durable in its final home; the seconds it took, if anything."""
        return None

    def object_stats(self) -> dict[str, int] | None:
        """Requests seen by its object store so far, by method; None without S3."""
        return None

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the broker and whatever it started."""


class OursTarget(Target):
    def __init__(
        self,
        name: str,
        workdir: Path,
        wal_bytes: int,
        profile_dir: Path | None,
        *,
        fast_ranges: bool = True,
        extra_overrides: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.fast_ranges = fast_ranges
        self.extra_overrides = tuple(extra_overrides)
        self.data_dir = workdir / name / "data"
        self.wal_bytes = wal_bytes
        self.profile_dir = profile_dir
        self.moto: CountingMoto | None = None
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.starts = 0

    def start(self) -> str:
        if self.name == "ours-s3" and self.moto is None:
            self.moto = CountingMoto(fast_ranges=self.fast_ranges)
        overrides = [
            f"listeners=PLAINTEXT://127.0.0.1:{self.port}",  # 0 first; kept across restarts
            f"log.dirs={self.data_dir}",
            f"s3.wal.capacity={self.wal_bytes}",
            *self.extra_overrides,
        ]
        if self.moto is not None:
            overrides.append(
                f"s3.data.buckets=0@s3://{BUCKET}?region=us-east-1&endpoint={self.moto.endpoint}"
                "&pathStyle=true&accessKey=test&secretKey=test"
            )
        command = [sys.executable]
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            stem = f"{self.name}-{os.getpid()}-{self.starts}-{int(time.time())}"
            command += ["-m", "cProfile", "-o", str(self.profile_dir / f"{stem}.prof")]
        command += ["-m", "automq_ref.cli", "serve"]
        for override in overrides:
            command += ["--override", override]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir.parent / "broker.log"
        with log_path.open("a") as log_file:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=subprocess.PIPE, stderr=log_file, text=True
            )
        self.starts += 1
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            if SERVING in line:
                self.port = int(line.split(SERVING, 1)[1].split()[0].rsplit(":", 1)[1])
                return f"127.0.0.1:{self.port}"
        raise RuntimeError(f"{self.name} did not start; see {log_path}")

    def _stop_broker(self) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise RuntimeError(f"{self.name} did not stop within {STOP_TIMEOUT_S} s") from None
        if code != 0:
            raise RuntimeError(f"{self.name} exited with {code}")

    def settle(self) -> float:
        """A graceful restart: the stop uploads everything, the new process reads objects."""
        began = time.perf_counter()
        self._stop_broker()
        seconds = time.perf_counter() - began
        self.start()
        return seconds

    def object_stats(self) -> dict[str, int] | None:
        return None if self.moto is None else self.moto.stats()

    def stop(self) -> None:
        try:
            self._stop_broker()
        finally:
            if self.moto is not None:
                self.moto.stop()
                self.moto = None
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)


class PeerTarget(Target):
    def __init__(self, name: str) -> None:
        self.name = name
        self.engine = name.removeprefix("peer-")
        self.port = 0

    def _script(self, *arguments: str) -> str:
        done = subprocess.run(
            ["bash", str(PEER_SCRIPT), *arguments],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"peer script {arguments}: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> str:
        self.port = free_port(also_plus=1000)  # the script puts its moto server on port + 1000
        return self._script("start", self.engine, str(self.port)).splitlines()[-1]

    def object_stats(self) -> dict[str, int] | None:
        if self.engine != "s3":
            return None
        result: dict[str, int] = json.loads(self._script("s3-stats"))
        return result

    def stop(self) -> None:
        self._script("stop")
        wait_until(lambda: not port_open(self.port), 30, "the peer to stop")
        if self.engine == "s3":
            wait_until(lambda: not port_open(self.port + 1000), 30, "the peer's moto to stop")


# ---------------------------------------------------------------------------------- workloads


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, count, 1) for name, count in partitions.items()], operation_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)
    # Wait until every partition has a leader in the metadata, so the first produce goes out.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=10).topics
        if all(
            name in topics and len(topics[name].partitions) == count
            for name, count in partitions.items()
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topics {sorted(partitions)} did not appear in the metadata")


@dataclass
class Delivery:
    """Counts delivery reports; the first error is kept."""

    delivered: int = 0
    error: KafkaError | None = None
    latencies_s: list[float] = field(default_factory=list)

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.error = self.error or error
            return
        self.delivered += 1
        latency = message.latency()
        if latency is not None:
            self.latencies_s.append(latency)

    def check(self, what: str) -> None:
        if self.error is not None:
            raise RuntimeError(f"{what}: delivery failed: {self.error}")


def produce_throughput(
    bootstrap: str, topic: str, partitions: int, total_bytes: int, max_seconds: float
) -> tuple[int, float]:
    """Records delivered and seconds from the first produce to the end of flush."""
    producer = Producer({"bootstrap.servers": bootstrap, **THROUGHPUT_PRODUCER})
    payload = os.urandom(RECORD_BYTES)
    delivery = Delivery()
    records = max(1, total_bytes // RECORD_BYTES)
    started = time.perf_counter()
    sent = 0
    while sent < records:
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=delivery)
        except BufferError:
            producer.poll(0.005)
            continue
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
            if time.perf_counter() - started > max_seconds:
                break
    remaining = producer.flush(STOP_TIMEOUT_S)
    seconds = time.perf_counter() - started
    delivery.check(f"produce into {topic}")
    if remaining or delivery.delivered != sent:
        raise RuntimeError(f"produce into {topic}: {delivery.delivered} of {sent} delivered")
    return delivery.delivered, seconds


def produce_latency(
    bootstrap: str, topic: str, rate: int, seconds: float, linger_ms: float
) -> tuple[int, list[float]]:
    """Records delivered and their sorted latencies (seconds), paced at ``rate`` per second."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms})
    payload = os.urandom(RECORD_BYTES)
    warmup = Delivery()
    for _ in range(100):  # connections and metadata in place before the clock starts
        producer.produce(topic, payload, partition=0, on_delivery=warmup)
    producer.flush(60)
    warmup.check(f"warm-up of {topic}")
    delivery = Delivery()
    count = int(rate * seconds)
    started = time.perf_counter()
    for index in range(count):
        due = started + index / rate
        wait_due(producer, due)
        producer.produce(topic, payload, partition=0, on_delivery=delivery)
        producer.poll(0)
    producer.flush(60)
    delivery.check(f"paced produce into {topic}")
    if delivery.delivered != count:
        raise RuntimeError(f"paced produce into {topic}: {delivery.delivered} of {count}")
    return count + 100, sorted(delivery.latencies_s)


def consume_all(
    bootstrap: str, topic: str, partitions: int, records: int, timeout_s: float
) -> float:
    """Seconds for a fresh consumer to read ``records`` records of ``topic`` from offset 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, index, 0) for index in range(partitions)])
        seen = 0
        while seen < records:
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"consume {topic}: {seen} of {records} in {timeout_s} s")
            # Ask for no more than remain: consume() waits its timeout for a fuller batch.
            batch = consumer.consume(num_messages=min(10_000, records - seen), timeout=1.0)
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consume {topic}: {error}")
                seen += 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def disk_sync_latency(directory: Path, seconds: float) -> list[float]:
    """Sorted latencies (seconds) of one 4 KiB ``pwrite`` + ``fdatasync``, in a loop: the disk's
    own figure at this moment, beside which a WAL's produce latency can be read."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "disk-probe"
    file_bytes = 16 * 2**20
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, file_bytes)
        os.fsync(fd)
        data = os.urandom(4096)
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            begin = time.perf_counter()
            os.pwrite(fd, data, (len(latencies) * 4096) % file_bytes)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - begin)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(latencies)


# ----------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Settings:
    total_bytes: int
    max_seconds: float
    rate: int
    latency_seconds: float
    latency_linger_ms: float
    disk_dir: Path
    disk_probe_seconds: float


def wait_due(producer: Producer, due: float) -> None:
    """Serve ``producer``'s delivery reports until ``time.perf_counter()`` reaches ``due``.

    librdkafka's poll waits whole milliseconds (confluent-kafka truncates its timeout), so a
    paced loop that polls the sub-millisecond rest before each record returns at once and spins
    a core: at 1,000 records/s, all of one of this machine's two, taken from the broker under
    test. The rest below a millisecond is slept instead."""
    while (wait := due - time.perf_counter()) > 0:
        if wait >= 0.001:
            producer.poll(wait)
        else:
            time.sleep(wait)


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def log(message: str) -> None:
    print(f"[broker_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_target(target: Target, settings: Settings) -> dict[str, float]:
    """Every workload against one freshly started broker; figures by metric name."""
    figures: dict[str, float] = {}
    try:
        bootstrap = target.start()
        before = target.object_stats()
        topics = {f"bench-p{count}": count for count in PARTITION_COUNTS}
        create_topics(bootstrap, {**topics, "bench-latency": 1})
        produced: dict[str, int] = {}
        records_total = 0
        for topic, count in topics.items():
            records, seconds = produce_throughput(
                bootstrap, topic, count, settings.total_bytes, settings.max_seconds
            )
            produced[topic] = records
            records_total += records
            figures[f"produce_p{count}"] = records * RECORD_BYTES / seconds / MEGABYTE
            log(f"{target.name}: produce {topic}: {figures[f'produce_p{count}']:.1f} MB/s")
        disk = disk_sync_latency(settings.disk_dir, settings.disk_probe_seconds)
        figures["disk_p99"] = percentile(disk, 0.99) * 1000
        figures["disk_max"] = disk[-1] * 1000
        records, latencies = produce_latency(
            bootstrap,
            "bench-latency",
            settings.rate,
            settings.latency_seconds,
            settings.latency_linger_ms,
        )
        records_total += records
        figures["latency_p50"] = percentile(latencies, 0.50) * 1000
        figures["latency_p99"] = percentile(latencies, 0.99) * 1000
        figures["latency_max"] = latencies[-1] * 1000
        log(
            f"{target.name}: latency p50 {figures['latency_p50']:.2f} ms, p99 "
            f"{figures['latency_p99']:.2f} ms"
        )
        settle_s = target.settle()
        if settle_s is not None:
            figures["settle_s"] = settle_s
        for topic, count in topics.items():
            records = produced[topic]
            timeout_s = max(120.0, records * RECORD_BYTES / MEGABYTE)  # >= 1 MB/s
            seconds = consume_all(bootstrap, topic, count, records, timeout_s)
            figures[f"consume_p{count}"] = records * RECORD_BYTES / seconds / MEGABYTE
            log(f"{target.name}: consume {topic}: {figures[f'consume_p{count}']:.1f} MB/s")
        after = target.object_stats()
        if before is not None and after is not None:
            writes = write_requests(after) - write_requests(before)
            figures["writes_per_gb"] = writes / (records_total * RECORD_BYTES / GIGABYTE)
            log(f"{target.name}: {writes} write requests, {after}")
    finally:
        target.stop()
    return figures


# ------------------------------------------------------------------------------------ report


ROWS = (
    ("produce_p1", "produce MB/s, 1 partition"),
    ("produce_p16", "produce MB/s, 16 partitions"),
    ("latency_p50", "produce p50 ms at {rate} msg/s"),
    ("latency_p99", "produce p99 ms at {rate} msg/s"),
    ("latency_max", "produce max ms at {rate} msg/s"),
    ("disk_p99", "disk alone, just before: 4 KiB write+fdatasync p99 ms"),
    ("disk_max", "disk alone, just before: 4 KiB write+fdatasync max ms"),
    ("consume_p1", "catch-up consume MB/s, 1 partition"),
    ("consume_p16", "catch-up consume MB/s, 16 partitions"),
    ("writes_per_gb", "object PUT+POST requests per GB"),
    ("settle_s", "graceful stop (upload) s"),
)


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    names = {name for run in runs for name in run}
    return {name: statistics.median(run[name] for run in runs if name in run) for name in names}


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or peer == 0:
        return "-"
    value = ours / peer
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def results_table(result: dict[str, dict[str, float]], targets: list[str], rate: int) -> str:
    header = ["metric (median)", *(TITLES[target] for target in targets)]
    pairs = [
        (ours, peer)
        for ours, peer in (("ours-local", "peer-memory"), ("ours-s3", "peer-s3"))
        if ours in targets and peer in targets
    ]
    header += [f"{TITLES[ours]} / {TITLES[peer]}" for ours, peer in pairs]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for key, label in ROWS:
        values = [result.get(target, {}).get(key) for target in targets]
        if all(value is None for value in values):
            continue
        cells = [label.format(rate=rate), *(fmt(value) for value in values)]
        cells += [
            "-"
            if key.startswith("disk")  # the machine's figure, not the broker's
            else ratio(result.get(ours, {}).get(key), result.get(peer, {}).get(key))
            for ours, peer in pairs
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_checks(result: dict[str, dict[str, float]]) -> Iterator[tuple[str, str, bool]]:
    """(target, figures, met) for each of the issue's targets the run can judge."""

    def get(target: str, key: str) -> float | None:
        return result.get(target, {}).get(key)

    for ours in ("ours-local", "ours-s3"):
        for count in PARTITION_COUNTS:
            key = f"produce_p{count}"
            mine, peer = get(ours, key), get("peer-memory", key)
            if mine is not None and peer is not None:
                yield (
                    f"produce throughput ({count} partition{'s' * (count > 1)}) of "
                    f"{TITLES[ours]} >= peer (memory)",
                    f"{mine:.1f} vs {peer:.1f} MB/s",
                    mine >= peer,
                )
    for ours in ("ours-local", "ours-s3"):
        p99 = get(ours, "latency_p99")
        if p99 is not None:
            yield (f"produce p99 of {TITLES[ours]} <= 10 ms", f"{p99:.2f} ms", p99 <= 10.0)
    for ours in ("ours-local", "ours-s3"):
        for count in PARTITION_COUNTS:
            key = f"consume_p{count}"
            mine = get(ours, key)
            peer_memory, peer_s3 = get("peer-memory", key), get("peer-s3", key)
            where = f"catch-up consume ({count} partition{'s' * (count > 1)}) of {TITLES[ours]}"
            if mine is not None and peer_memory is not None:
                yield (
                    f"{where} >= peer (memory)",
                    f"{mine:.1f} vs {peer_memory:.1f} MB/s",
                    mine >= peer_memory,
                )
            if mine is not None and peer_s3 is not None:
                yield (
                    f"{where} >= 5 x peer (S3)",
                    f"{mine:.1f} vs 5 x {peer_s3:.1f} MB/s",
                    mine >= 5 * peer_s3,
                )
    mine, peer = get("ours-s3", "writes_per_gb"), get("peer-s3", "writes_per_gb")
    if mine is not None and peer is not None:
        yield (
            "object write requests per GB of ours (S3) <= 1% of peer (S3)",
            f"{mine:.1f} vs {peer:.0f} per GB ({100 * mine / peer:.2f}%)"
            if peer
            else f"{mine:.1f} vs {peer:.0f}",
            mine <= 0.01 * peer,
        )


def targets_table(result: dict[str, dict[str, float]]) -> str:
    lines = ["| target | figures (medians) | met |", "|---|---|:---:|"]
    for what, figures, met in target_checks(result):
        lines.append(f"| {what} | {figures} | {'yes' if met else '**no**'} |")
    return "\n".join(lines) if len(lines) > 2 else ""


# -------------------------------------------------------------------------------------- main


def parse_targets(text: str) -> list[str]:
    chosen: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        for target in ALIASES.get(name, (name,)):
            if target not in ALL_TARGETS:
                raise SystemExit(f"unknown target {target!r}; choose from {ALL_TARGETS}")
            if target not in chosen:
                chosen.append(target)
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mb", type=float, default=128.0, help="MB per produce-throughput run")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="cap per produce run")
    parser.add_argument("--rate", type=int, default=1000, help="records/s in the latency run")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-linger-ms", type=float, default=1.0)
    parser.add_argument("--targets", default=",".join(ALL_TARGETS), help="or 'ours', 'peer'")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few MB")
    parser.add_argument("--dir", type=Path, default=None, help="where our brokers keep data")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile our broker here")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--moto-whole-object-ranges",
        action="store_true",
        help="leave moto's ranged GET as it is (it reads the whole object for every range)",
    )
    parser.add_argument("--serve-counting-moto", type=int, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.serve_counting_moto is not None:
        fast_ranges = not arguments.moto_whole_object_ranges
        serve_counting_moto(arguments.serve_counting_moto, fast_ranges=fast_ranges)
        return
    if arguments.quick:
        arguments.mb, arguments.latency_seconds, arguments.runs = 4.0, 2.0, 1
    workdir = Path(tempfile.mkdtemp(prefix="broker-bench-", dir=arguments.dir))
    settings = Settings(
        total_bytes=int(arguments.mb * MEGABYTE),
        max_seconds=arguments.max_seconds,
        rate=arguments.rate,
        latency_seconds=arguments.latency_seconds,
        latency_linger_ms=arguments.latency_linger_ms,
        disk_dir=workdir / "disk",
        disk_probe_seconds=0.3 if arguments.quick else 1.0,
    )
    targets = parse_targets(arguments.targets)
    wal_bytes = 64 * 2**20 if arguments.quick else 2**30
    load_before = os.getloadavg()
    began = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {target: [] for target in targets}
    try:
        for run in range(1, arguments.runs + 1):
            for name in targets:
                log(f"run {run}/{arguments.runs}: {name}")
                target: Target = (
                    OursTarget(
                        name,
                        workdir,
                        wal_bytes,
                        arguments.profile,
                        fast_ranges=not arguments.moto_whole_object_ranges,
                    )
                    if name.startswith("ours")
                    else PeerTarget(name)
                )
                runs[name].append(run_target(target, settings))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {target: medians(figures) for target, figures in runs.items() if figures}
    load_after = os.getloadavg()
    command = "python -m bench.broker_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    report = [
        f"`{command.strip()}`: {arguments.runs} run(s), {settings.total_bytes / MEGABYTE:.0f} MB "
        f"per produce run (at most {settings.max_seconds:.0f} s), {settings.rate} msg/s for "
        f"{settings.latency_seconds:.0f} s in the latency run; {time.perf_counter() - began:.0f} s "
        f"in all; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} CPUs).",
        "",
        results_table(result, targets, settings.rate),
    ]
    checks = targets_table(result)
    if checks:
        report += ["", checks]
    text = "\n".join(report)
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
