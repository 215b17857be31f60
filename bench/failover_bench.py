"""Crash failover as clients see it: from a broker's SIGKILL until each of its partitions takes
records again, with the partition-open hold off and on, for two session settings.

    python -m bench.failover_bench [--runs 5] [--partitions 12] [--interval-ms 20]
                                   [--sessions 2000/500,9000/2000] [--holds 0,1000]
                                   [--victims broker] [--grace-ms 1000] [--quick]
                                   [--breakdown] [--save FILE] [--from FILE ...]
                                   [--keep] [--dir DIR] [--out FILE]

Every run is a fresh cluster as ``automq-ref cluster`` starts it (``automq_ref/launch.py``): one
etcd member, an S3 server (moto, objects in memory) and three ``automq-ref serve`` brokers on
the object WAL in the shared bucket (what crash failover needs: a survivor reads the dead
broker's WAL there), on free loopback ports, its data in a temporary directory removed
afterwards (``--keep`` keeps it, logs included; a failed run always keeps it). The brokers get
``broker.session.timeout.ms`` / ``broker.heartbeat.interval.ms`` from ``--sessions`` (Kafka's
defaults are 9000 / 2000), ``partition.open.wait.ms`` from ``--holds`` (0: a broker that has not
opened a partition placed on it answers ``NOT_LEADER_OR_FOLLOWER`` at once, as before the
hold) and ``failover.new.epoch.grace.ms`` from ``--grace-ms``: a broker whose node epoch is
younger than the grace is left to recover its own WAL, and every victim here was started only
seconds before its kill (a fresh cluster per run), so the grace must be below that to let the
failover happen at all; once below it, it has no effect on the figure.

In each run: a topic of ``--partitions`` partitions (placed evenly over the three brokers), one
idempotent confluent-kafka producer (acks=all, linger.ms=5, librdkafka's retry and metadata
defaults) sending one record to every partition each ``--interval-ms``; once every partition
has acknowledged records for a second, the victim is killed with SIGKILL: a broker that is not
the active controller and leads partitions (``--victims broker``), or the active controller
(``controller``: its lease must lapse and a new controller gives every broker a whole session
first). A partition of the victim's is *writable again* at the acknowledgement that ends its
longest silence around the kill (the victim's last acknowledgements, already on the wire, may
be read just after the kill; the silence separates them from the new broker's), measured from
the kill. p50 and p99 are over the victim's partitions of all runs of a setting. The other
partitions' longest silence over the same window says what the failover cost the survivors'
own partitions. The brokers' logs place the failover's steps on the same clock: the
controller's ``failover assigned``, the target's ``failover done`` and the last ``partition
led`` of the topic after the kill (medians over runs); "writable after led" is the median over
runs of each run's median kill to writable less its last ``partition led``: the part the client
adds once the brokers are done.

``--breakdown`` follows each of the victim's partitions through the chain (``POINTS``): its
session deadline and the fence (the controller's ``session expired``, which says how long after
the deadline), the failover assigned, the takeover begun and done (with its steps' seconds from
``failover done``), the new leader's open begun and done (``partition led``), the moment
librdkafka hands the partition to the new leader (its debug log, read through a logger), and
the first acknowledgement; it reports each point's median and max after the kill and each step's,
and how many partitions librdkafka parked on its internal broker on the way. ``--save FILE``
appends each run to FILE (JSON lines) and ``--from FILE ...`` reports saved runs instead of
running any: runs of two commits made alternately (one ``--runs 1`` on each in turn, each with
its own file) compare under the same background load.

The settings are run alternately, run by run (the order turning each round), so that they see
the same background load: the machine is shared and noisy, and the medians of per-run figures
are the ones to compare. ``--quick`` is a smoke run: one run of each hold with the short
session, 4 partitions.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from automq_ref.launch import ClusterSettings, LocalCluster
from bench.broker_bench import create_topics, fmt, percentile

PRODUCER = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    # A record whose partition has no broker for a while waits rather than fails.
    "message.timeout.ms": 120_000,
}
STEADY_S = 1.0  # every partition acknowledged for this long before the kill
WRITABLE_TIMEOUT_S = 120.0
AFTER_S = 1.0  # acknowledgements taken in after the last partition is writable again
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
TOPIC = "crash"


def log(message: str) -> None:
    print(f"[failover_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Setting:
    session_ms: int
    heartbeat_ms: int
    hold_ms: int

    @property
    def label(self) -> str:
        return f"session {self.session_ms} / heartbeat {self.heartbeat_ms} ms, hold {self.hold_ms}"


@dataclass
class Run:
    """One kill: per partition of the victim's, kill to writable (s); the others' longest
    silence (s); the failover's steps from the brokers' logs (s after the kill)."""

    setting: Setting
    victim: str
    writable_s: list[float]
    others_gap_s: list[float]
    assigned_s: float | None
    done_s: float | None
    led_s: float | None
    # With --breakdown: per partition of the victim's, each point of the chain (s after the
    # kill; see POINTS), and whether the client parked it on its internal broker.
    chain: list[dict[str, float]] = field(default_factory=list)
    detours: int = 0


# ------------------------------------------------------------------------------- the producer


@dataclass
class Acks:
    """Delivery-report times (monotonic) per partition."""

    times: dict[int, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        now = time.monotonic()
        with self.lock:
            if error is None:
                self.times.setdefault(message.partition() or 0, []).append(now)
            else:
                self.failures.append(str(error))

    def after(self, partition: int, since: float) -> list[float]:
        with self.lock:
            return [t for t in self.times.get(partition, ()) if t >= since]


class PacedProducer:
    """One record to every partition each ``interval_s``, in a thread, until stopped."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        interval_s: float,
        debug: str = "",
        client_log: ClientLog | None = None,
    ) -> None:
        self.acks = Acks()
        extra: dict[str, object] = {"debug": debug} if debug else {}
        if client_log is not None:
            extra["logger"] = client_log.logger
        self._producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER, **extra})
        self._topic, self._partitions, self._interval_s = topic, partitions, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-bench-producer")

    def __enter__(self) -> PacedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        tick = time.monotonic()
        sequence = 0
        while not self._stop.is_set():
            for partition in range(self._partitions):
                self._producer.produce(
                    self._topic,
                    value=f"{partition}-{sequence}".encode(),
                    partition=partition,
                    on_delivery=self.acks,
                )
            sequence += 1
            tick = max(tick + self._interval_s, time.monotonic() - self._interval_s)
            while (left := tick - time.monotonic()) > 0:
                self._producer.poll(left)
        self._producer.flush(10)


class ClientLog(logging.Handler):
    """librdkafka's debug lines (``--breakdown``), each with the monotonic time it was read
    (the producer polls every few ms), kept in memory instead of printed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, str]] = []
        self.logger = logging.getLogger(f"failover_bench.client.{id(self)}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))

    def delegated(self, topic: str, partition: int) -> list[tuple[float, str]]:
        """When librdkafka handed the partition to a broker: (time, ``ID`` or ``internal``)."""
        found = re.compile(
            rf"{re.escape(topic)} \[{partition}\]: delegating to broker (\S+) for partition"
        )
        handed = []
        for at, line in self.lines:
            if (match := found.search(line)) is not None:
                target = match.group(1)
                handed.append((at, "internal" if "internal" in target else target.split("/")[-1]))
        return handed


def longest_silence(times: Sequence[float], start: float, end: float) -> tuple[float, float]:
    """The longest gap between consecutive acknowledgements in ``[start, end]`` (the window's
    edges count as acknowledgements): (its length, when it ended)."""
    points = [start, *(t for t in times if start < t < end), end]
    return max(((b - a, b) for a, b in itertools.pairwise(points)), key=lambda gap: gap[0])


def steady(acks: Acks, partitions: int, now: float) -> bool:
    """Every partition acknowledged within the last STEADY_S, and a STEADY_S earlier too."""
    for partition in range(partitions):
        times = acks.after(partition, now - 2 * STEADY_S)
        if not times or times[0] > now - STEADY_S or times[-1] < now - 0.2:
            return False
    return True


# ---------------------------------------------------------------------------------- one run


@contextlib.contextmanager
def running_cluster(
    workdir: Path, setting: Setting, grace_ms: int, keep: bool
) -> Iterator[LocalCluster]:
    data_dir = workdir / f"cluster-{time.monotonic_ns()}"
    overrides = (
        f"broker.session.timeout.ms={setting.session_ms}",
        f"broker.heartbeat.interval.ms={setting.heartbeat_ms}",
        f"partition.open.wait.ms={setting.hold_ms}",
        f"failover.new.epoch.grace.ms={grace_ms}",
    )
    cluster = LocalCluster(
        ClusterSettings(data_dir=data_dir, base_port=0, overrides=overrides),
        threading.Event(),
        lambda line: None,
    )
    try:
        cluster.start()
        yield cluster
    except BaseException:
        cluster.stop()
        log(f"failed: the cluster's logs are kept in {data_dir}")
        raise
    cluster.stop()
    if keep:
        log(f"the cluster's logs are kept in {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)


def leaders(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's leader once every partition has one."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions
        led = {index: int(p.leader) for index, p in found.items()}
        if len(led) == partitions and all(n > 0 for n in led.values()):
            return led
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} has no leader for every partition")


def line_after(
    cluster: LocalCluster, wall_s: float, until_s: float, pattern: str, last: bool = False
) -> float | None:
    """Seconds from ``wall_s`` (time.time()) to the first line between it and ``until_s``
    matching ``pattern`` in any broker's log (``last``: to the last such line); None if there
    is none."""
    found = re.compile(pattern)
    stamps = []
    for child in cluster.brokers.values():
        for line in child.log_path.read_text(errors="replace").splitlines():
            if not found.search(line):
                continue
            with contextlib.suppress(ValueError):
                stamp = datetime.datetime.strptime(line[:23], LOG_TIME).timestamp()
                if wall_s < stamp < until_s:
                    stamps.append(stamp - wall_s)
    if not stamps:
        return None
    return max(stamps) if last else min(stamps)


def lines_after(
    cluster: LocalCluster, wall_s: float, until_s: float, pattern: str
) -> list[tuple[float, re.Match[str]]]:
    """Every line of any broker's log between ``wall_s`` and ``until_s`` matching ``pattern``:
    (seconds after ``wall_s``, the match), in time order."""
    found = re.compile(pattern)
    hits = []
    for child in cluster.brokers.values():
        for line in child.log_path.read_text(errors="replace").splitlines():
            if (match := found.search(line)) is None:
                continue
            with contextlib.suppress(ValueError):
                stamp = datetime.datetime.strptime(line[:23], LOG_TIME).timestamp()
                if wall_s < stamp < until_s:
                    hits.append((stamp - wall_s, match))
    return sorted(hits, key=lambda hit: hit[0])


# The chain of a crash failover, per partition of the victim's, in the order it runs
# (``--breakdown``); each point in seconds after the kill.
POINTS = (
    ("deadline", "the victim's session deadline (its last heartbeat + the session)"),
    ("fenced", "the controller fences it (`session expired`)"),
    ("assigned", "the failover context written (`failover assigned`)"),
    ("takeover began", "the target starts (`failover started`)"),
    ("takeover done", "WAL taken, recovered, uploaded, committed, streams closed"),
    ("open began", "the new leader starts the open that succeeds (`partition led` - seconds)"),
    ("led", "the partition open on its new leader (`partition led`)"),
    ("client at new leader", "librdkafka hands the partition to the new leader (last time)"),
    ("writable", "the first acknowledgement after the silence"),
)
# The takeover's parts, from `failover done`'s fields (seconds, not points).
PARTS = ("wal_seconds", "recover_seconds", "close_seconds", "attempts")


def failover_chain(
    cluster: LocalCluster,
    client_log: ClientLog,
    victim: int,
    orphaned: Sequence[int],
    writable: Sequence[float],
    killed: tuple[float, float],
    end_wall: float,
) -> tuple[list[dict[str, float]], int]:
    """Each of ``orphaned``'s points (POINTS, PARTS) from the brokers' logs and librdkafka's,
    and how many partitions librdkafka parked on its internal broker after the kill."""
    killed_wall, killed_at = killed
    common: dict[str, float] = {}
    fenced = lines_after(
        cluster,
        killed_wall,
        end_wall,
        rf"session expired node_id={victim} .*after_deadline_ms=(-?\d+)",
    )
    if fenced:
        at, match = fenced[0]
        common["fenced"] = at
        common["deadline"] = at - int(match.group(1)) / 1000
    for point, pattern in (
        ("assigned", rf"failover assigned failed_node={victim} "),
        ("takeover began", rf"failover started failed_node={victim} "),
    ):
        if hits := lines_after(cluster, killed_wall, end_wall, pattern):
            common[point] = hits[0][0]
    done = lines_after(cluster, killed_wall, end_wall, rf"failover done failed_node={victim} (.*)")
    if done:
        at, match = done[0]
        common["takeover done"] = at
        for part in PARTS:
            if (value := re.search(rf"\b{part}=([\d.]+)", match.group(1))) is not None:
                common[part] = float(value.group(1))
    chain, detours = [], 0
    for partition, writable_s in zip(orphaned, writable, strict=True):
        points = dict(common)
        led = lines_after(
            cluster,
            killed_wall,
            end_wall,
            rf"partition led topic={TOPIC} partition={partition} .*seconds=([\d.]+) ",
        )
        if led:
            at, match = led[0]
            points["led"], points["open began"] = at, at - float(match.group(1))
        handed = [
            (at - killed_at, to)
            for at, to in client_log.delegated(TOPIC, partition)
            if killed_at < at <= killed_at + writable_s
        ]
        if any(to == "internal" for _, to in handed):
            detours += 1
        moved = [at for at, to in handed if to not in ("internal", str(victim))]
        if moved:
            points["client at new leader"] = moved[-1]
        points["writable"] = writable_s
        chain.append(points)
    return chain, detours


def one_run(
    workdir: Path, setting: Setting, victim_kind: str, arguments: argparse.Namespace
) -> Run:
    partitions = arguments.partitions
    client_log = ClientLog() if arguments.breakdown else None
    debug = arguments.client_debug or ("metadata,topic,broker" if client_log else "")
    with running_cluster(workdir, setting, arguments.grace_ms, arguments.keep) as cluster:
        bootstrap = cluster.settings.bootstrap
        create_topics(bootstrap, {TOPIC: partitions})
        led = leaders(bootstrap, TOPIC, partitions)
        interval_s = arguments.interval_ms / 1000
        with PacedProducer(bootstrap, TOPIC, partitions, interval_s, debug, client_log) as producer:
            deadline = time.monotonic() + 60
            while not steady(producer.acks, partitions, time.monotonic()):
                if time.monotonic() > deadline:
                    raise RuntimeError("the producer never acknowledged on every partition")
                time.sleep(0.1)
            controller = cluster.controller()
            led = leaders(bootstrap, TOPIC, partitions)
            candidates = sorted(
                {n for n in led.values() if (n == controller) == (victim_kind == "controller")}
            )
            if not candidates:
                raise RuntimeError(f"no {victim_kind} leads a partition: {led}, {controller}")
            victim = candidates[0]
            orphaned = sorted(p for p, n in led.items() if n == victim)
            others = sorted(p for p, n in led.items() if n != victim)
            killed_wall, killed_at = time.time(), time.monotonic()
            cluster.brokers[victim].process.kill()
            # Writable again: an acknowledgement past the kill's silence. The session alone
            # keeps the partition away for longer than half of it.
            quiet_s = setting.session_ms / 2000
            deadline = killed_at + WRITABLE_TIMEOUT_S
            while not all(producer.acks.after(p, killed_at + quiet_s) for p in orphaned):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker {victim}'s partitions not writable again")
                time.sleep(0.05)
            time.sleep(AFTER_S)
            end, end_wall = time.monotonic(), time.time()
        start = killed_at - STEADY_S
        writable = [
            longest_silence(producer.acks.after(p, start), start, end)[1] - killed_at
            for p in orphaned
        ]
        others_gap = [longest_silence(producer.acks.after(p, start), start, end)[0] for p in others]
        run = Run(
            setting,
            f"{victim_kind} {victim}",
            writable,
            others_gap,
            line_after(cluster, killed_wall, end_wall, rf"failover assigned failed_node={victim} "),
            line_after(cluster, killed_wall, end_wall, rf"failover done failed_node={victim} "),
            line_after(cluster, killed_wall, end_wall, rf"partition led topic={TOPIC} ", last=True),
        )
        if client_log is not None:
            run.chain, run.detours = failover_chain(
                cluster,
                client_log,
                victim,
                orphaned,
                writable,
                (killed_wall, killed_at),
                end_wall,
            )
        if producer.acks.failures:
            raise RuntimeError(f"records failed: {producer.acks.failures[:3]}")
    log(
        f"{setting.label}, {run.victim} killed: writable again after "
        + ", ".join(f"{s:.2f}" for s in writable)
        + f" s; failover assigned +{fmt(run.assigned_s)}, done +{fmt(run.done_s)}, "
        f"last partition led +{fmt(run.led_s)} s"
    )
    return run


# ----------------------------------------------------------------------------------- report


def _median(values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    return fmt(statistics.median(present)) if present else "-"


def report(runs: Sequence[Run], settings: Sequence[Setting], victims: Sequence[str]) -> list[str]:
    lines = [
        "| victim | session / heartbeat ms | hold ms | runs | partitions | kill to writable "
        "p50 s | p99 s | max s | median of runs' p50 s | failover assigned s | failover done "
        "s | last partition led s | writable after led s | others' longest silence p50 s "
        "| p99 s |",
        "|" + " --- |" * 15,
    ]
    for kind, setting in itertools.product(victims, settings):
        mine = [r for r in runs if r.setting == setting and r.victim.startswith(kind)]
        if not mine:
            continue
        writable = sorted(s for r in mine for s in r.writable_s)
        others = sorted(s for r in mine for s in r.others_gap_s)
        per_run = [statistics.median(r.writable_s) for r in mine]
        # What the client added after the last partition opened, per run.
        after_led = [statistics.median(r.writable_s) - r.led_s for r in mine if r.led_s is not None]
        lines.append(
            f"| {kind} | {setting.session_ms} / {setting.heartbeat_ms} | {setting.hold_ms} | "
            f"{len(mine)} | {len(writable)} | {fmt(percentile(writable, 0.5))} | "
            f"{fmt(percentile(writable, 0.99))} | {fmt(writable[-1])} | "
            f"{fmt(statistics.median(per_run))} | {_median([r.assigned_s for r in mine])} | "
            f"{_median([r.done_s for r in mine])} | {_median([r.led_s for r in mine])} | "
            f"{_median(after_led)} | "
            f"{fmt(percentile(others, 0.5)) if others else '-'} | "
            f"{fmt(percentile(others, 0.99)) if others else '-'} |"
        )
    return lines


def breakdown(runs: Sequence[Run]) -> list[str]:
    """Where the time went: each point of the chain (s after the kill) and each step between
    consecutive points, median and max over the victim's partitions of ``runs``."""
    chains = [points for run in runs for points in run.chain]
    if not chains:
        return []
    lines = [
        f"{len(chains)} partitions of {len(runs)} runs; librdkafka parked "
        f"{sum(r.detours for r in runs)} of them on its internal broker after the kill.",
        "",
        "| point | s after kill, median | max | step from the previous point, median | max |",
        "|" + " --- |" * 5,
    ]
    previous: str | None = None
    for point, meaning in POINTS:
        at = sorted(c[point] for c in chains if point in c)
        steps = sorted(
            c[point] - c[previous]
            for c in chains
            if previous is not None and point in c and previous in c
        )
        lines.append(
            f"| {point}: {meaning} | {fmt(statistics.median(at)) if at else '-'} | "
            f"{fmt(at[-1]) if at else '-'} | "
            f"{fmt(statistics.median(steps)) if steps else '-'} | "
            f"{fmt(steps[-1]) if steps else '-'} |"
        )
        previous = point
    for part in PARTS:
        values = sorted(r.chain[0][part] for r in runs if r.chain and part in r.chain[0])
        if values:
            lines.append(
                f"| takeover: {part} (per run) | | | {fmt(statistics.median(values))} | "
                f"{fmt(values[-1])} |"
            )
    return lines


def save_runs(path: Path, runs: Sequence[Run]) -> None:
    """Append ``runs`` to ``path``, one JSON object a line (``--save``)."""
    with path.open("a") as out:
        for run in runs:
            out.write(json.dumps(dataclasses.asdict(run)) + "\n")


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """The runs ``--save`` wrote to ``paths``."""
    runs = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                fields = json.loads(line)
                fields["setting"] = Setting(**fields["setting"])
                runs.append(Run(**fields))
    return runs


def parse_sessions(text: str) -> list[tuple[int, int]]:
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        session, _, heartbeat = part.partition("/")
        pairs.append((int(session), int(heartbeat)))
    return pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="kills per setting")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between records")
    parser.add_argument("--sessions", default="2000/500,9000/2000", help="session/heartbeat ms")
    parser.add_argument("--holds", default="0,1000", help="partition.open.wait.ms values")
    parser.add_argument("--victims", default="broker", help="broker, controller or both")
    parser.add_argument("--grace-ms", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--client-debug", default="", help="librdkafka debug contexts")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="report where the time went, step by step, from the brokers' and the client's logs",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the clusters keep data")
    parser.add_argument("--keep", action="store_true", help="keep the clusters' logs and data")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument("--save", type=Path, default=None, help="append the runs here (JSON)")
    parser.add_argument(
        "--from",
        dest="saved",
        type=Path,
        nargs="+",
        default=None,
        help="report the runs --save wrote to these files instead of running any",
    )
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.runs, arguments.partitions, arguments.sessions = 1, 4, "2000/500"
    victims = [v.strip() for v in arguments.victims.split(",") if v.strip()]
    if set(victims) - {"broker", "controller"}:
        raise SystemExit("--victims: broker, controller or both")
    settings = [
        Setting(session, heartbeat, int(hold))
        for session, heartbeat in parse_sessions(arguments.sessions)
        for hold in arguments.holds.split(",")
    ]
    if arguments.saved is not None:
        # Runs made elsewhere (e.g. alternately on two commits, one --save file each).
        runs = load_runs(arguments.saved)
        found = list(dict.fromkeys(r.setting for r in runs))
        kinds = list(dict.fromkeys(r.victim.split()[0] for r in runs))
        head = f"{len(runs)} runs from {', '.join(str(p) for p in arguments.saved)}."
        emit(head, runs, found, kinds, arguments)
        return
    workdir = Path(tempfile.mkdtemp(prefix="failover-bench-", dir=arguments.dir))
    load_before = os.getloadavg()
    began = time.perf_counter()
    runs = []
    try:
        for round_index in range(arguments.runs):
            # Alternate: each round runs the settings in turn, the order reversed every other
            # round, so that no setting always runs first after a quiet spell.
            order = settings if round_index % 2 == 0 else settings[::-1]
            for kind in victims:
                for setting in order:
                    runs.append(one_run(workdir, setting, kind, arguments))
    except BaseException:
        log(f"failed: kept {workdir}")
        raise
    if not arguments.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    command = "python -m bench.failover_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    head = (
        f"`{command.strip()}`: {time.perf_counter() - began:.0f} s in all; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs); "
        f"grace {arguments.grace_ms} ms, {arguments.partitions} partitions, a record to each "
        f"every {arguments.interval_ms:g} ms."
    )
    if arguments.save is not None:
        save_runs(arguments.save, runs)
    emit(head, runs, settings, victims, arguments)


def emit(
    head: str,
    runs: Sequence[Run],
    settings: Sequence[Setting],
    victims: Sequence[str],
    arguments: argparse.Namespace,
) -> None:
    """Print the report (and write it to ``--out``): the table, then with ``--breakdown`` the
    chain of each setting."""
    sections = [head, "", *report(runs, settings, victims)]
    if arguments.breakdown:
        for kind, setting in itertools.product(victims, settings):
            mine = [r for r in runs if r.setting == setting and r.victim.startswith(kind)]
            if lines := breakdown(mine):
                sections += ["", f"Breakdown, {kind} killed, {setting.label}:", "", *lines]
    text = "\n".join(sections).rstrip()
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
