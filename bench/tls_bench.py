"""Produce throughput over TLS against plaintext, through our broker, side by side (issue 21).

    python -m bench.tls_bench [--runs 5] [--mb 200] [--rounds 10] [--partitions 1]
                              [--separate-cores] [--quick] [--dir DIR] [--out FILE]

Each run starts three brokers (``automq-ref serve`` on its embedded default, one node, the WAL
file and objects under ``log.dirs``): one on a PLAINTEXT listener, one on an SSL listener
(``ssl.keystore.type=PEM``, certificates made for the run, ``automq_ref/checker/certificates.py``;
ECDSA P-256, TLS 1.3 as negotiated by librdkafka and Python's ``ssl``) and one on a SASL_SSL
listener (the same TLS, SASL/PLAIN inside). A confluent-kafka producer per broker (``acks=all``,
``linger.ms=5``, ``batch.size=1000000``, idempotence on, the TLS ones with the CA, the SASL one
with its user) sends ``--mb`` MB of 1 KiB records into a fresh topic of ``--partitions``
partitions, after 1,000 warm-up records. The three take turns in ``--rounds`` chunks (which
goes first turns by round and by run), so all see the same
background load; a workload's throughput is its bytes over the sum of its chunks' seconds (from
a chunk's first ``produce`` to the end of its ``flush``).

With ``--separate-cores`` every broker (each of its threads) runs on the machine's last CPU and
the producers (this process, librdkafka's threads included) on the others, as a client and a
broker on two hosts would, so that neither side's TLS work takes the other's CPU; without it
they share every CPU.

Each chunk also takes the CPU time this process (the client: the producer's librdkafka threads
and the Python calls feeding it) and its broker process spent meanwhile: per MB, and as a share
of one CPU over the chunk's wall time, which tells which side a workload is bound by (a side at
100% of the one CPU it is pinned to). *broker CPU per MB, plaintext / TLS* is the ratio a
broker-bound setup would measure (clients with CPU to spare).

*TLS / plaintext* and *SASL_SSL / plaintext* are each run's ratios, their medians over the runs;
every figure is the median over ``--runs``; MB = 10^6 bytes. ``--quick`` is a smoke run
(``tests/unit/test_tls_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_ref.checker.certificates import make_certificates
from bench.broker_bench import MEGABYTE, RECORD_BYTES, OursTarget
from bench.producing import Delivery, produce_some

MODES = ("plaintext", "tls", "sasl_ssl")
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_bench="bench-secret";'
PRODUCER = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "enable.idempotence": True}
WARM_UP_RECORDS = 1000
CALL_TIMEOUT_S = 120.0


def log(message: str) -> None:
    print(f"[tls_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` (all its threads, ended ones too) so far,
    in nanoseconds' resolution: Linux's CPU clock of a process (the clock id glibc's
    ``clock_getcpuclockid`` gives, ``CPUCLOCK_SCHED`` of ``pid``). ``/proc/<pid>/stat`` counts
    in clock ticks (10 ms), coarser than a quick run's chunk of the broker's work."""
    return time.clock_gettime((~pid << 3) | 2)


class Workload:
    """One broker, its producer and topic; chunks of records timed into ``seconds``, with the
    CPU time the client (this process) and the broker (``broker_pid``) spent meanwhile."""

    def __init__(
        self,
        bootstrap: str,
        client: dict[str, str],
        topic: str,
        partitions: int,
        broker_pid: int,
    ):
        self.client: dict[str, str | int | float | bool] = {
            "bootstrap.servers": bootstrap,
            **client,
        }
        self.topic = topic
        self.partitions = partitions
        self.payload = os.urandom(RECORD_BYTES)
        self.delivery = Delivery()
        self.records = 0
        self.seconds = 0.0
        self.broker_pid = broker_pid
        self.client_cpu_s = 0.0
        self.broker_cpu_s = 0.0
        admin = AdminClient(self.client)
        for future in admin.create_topics(
            [NewTopic(topic, partitions, 1)], operation_timeout=30
        ).values():
            future.result(timeout=60)
        self.producer = Producer({**self.client, **PRODUCER})
        self.send(WARM_UP_RECORDS)

    def send(self, count: int) -> None:
        produce_some(self.producer, self.topic, self.partitions, self.payload, count, self.delivery)
        if self.producer.flush(CALL_TIMEOUT_S):
            raise RuntimeError(f"{self.topic}: records not flushed")
        if self.delivery.error is not None:
            raise RuntimeError(f"{self.topic}: delivery failed: {self.delivery.error}")

    def chunk(self, count: int) -> None:
        client, broker = cpu_seconds(os.getpid()), cpu_seconds(self.broker_pid)
        began = time.perf_counter()
        self.send(count)
        self.seconds += time.perf_counter() - began
        self.client_cpu_s += cpu_seconds(os.getpid()) - client
        self.broker_cpu_s += cpu_seconds(self.broker_pid) - broker
        self.records += count

    @property
    def megabytes(self) -> float:
        return self.records * RECORD_BYTES / MEGABYTE

    @property
    def mb_per_s(self) -> float:
        return self.megabytes / self.seconds

    def figures(self, mode: str) -> dict[str, float]:
        """Throughput, and each side's CPU: milliseconds per MB and the share of one CPU."""
        return {
            f"{mode}_mb_s": self.mb_per_s,
            f"{mode}_client_ms_mb": 1000 * self.client_cpu_s / self.megabytes,
            f"{mode}_broker_ms_mb": 1000 * self.broker_cpu_s / self.megabytes,
            f"{mode}_client_cpu": self.client_cpu_s / self.seconds,
            f"{mode}_broker_cpu": self.broker_cpu_s / self.seconds,
        }


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (threads started later inherit it)."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(thread), cpus)


def run_once(
    workdir: Path,
    records: int,
    rounds: int,
    partitions: int,
    run: int,
    cpus: tuple[int, ...] | None = None,
) -> dict[str, float]:
    """One run; ``cpus``: the CPUs to separate the brokers (the last) and producers onto."""
    files = make_certificates().write(workdir / f"certificates-{run}")
    tls_overrides = (
        "listeners=SSL://127.0.0.1:0",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={files['broker']}",
    )
    sasl_overrides = (
        "listeners=SASL_SSL://127.0.0.1:0",
        *tls_overrides[1:],
        "sasl.enabled.mechanisms=PLAIN",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={JAAS}",
    )
    tls_client = {"security.protocol": "SSL", "ssl.ca.location": str(files["ca"])}
    clients = {
        "plaintext": {},
        "tls": tls_client,
        "sasl_ssl": {
            **tls_client,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "bench",
            "sasl.password": "bench-secret",
        },
    }
    overrides = {"plaintext": (), "tls": tls_overrides, "sasl_ssl": sasl_overrides}
    targets = {
        mode: OursTarget(
            "ours-local", workdir / f"{mode}-{run}", 1 << 30, None, extra_overrides=overrides[mode]
        )
        for mode in MODES
    }
    try:
        bootstraps = {mode: target.start() for mode, target in targets.items()}
        if cpus is not None:
            *client_cpus, broker_cpu = cpus
            for target in targets.values():
                assert target.process is not None
                pin(target.process.pid, {broker_cpu})
            pin(os.getpid(), set(client_cpus))
        workloads = {}
        for mode, target in targets.items():
            assert target.process is not None
            workloads[mode] = Workload(
                bootstraps[mode],
                clients[mode],
                f"bench-{mode}-{run}",
                partitions,
                target.process.pid,
            )
        chunk = records // rounds
        for number in range(rounds):
            order = list(workloads.values())
            shift = (number + run) % len(order)  # who goes first turns by round and by run
            for workload in order[shift:] + order[:shift]:
                workload.chunk(chunk)
        figures = {
            name: value
            for mode, workload in workloads.items()
            for name, value in workload.figures(mode).items()
        }
        figures["ratio"] = figures["tls_mb_s"] / figures["plaintext_mb_s"]
        figures["sasl_ratio"] = figures["sasl_ssl_mb_s"] / figures["plaintext_mb_s"]
        # What a broker-bound setup (clients with CPU to spare) would see: the broker's CPU
        # per MB over plaintext against over TLS.
        figures["broker_ratio"] = figures["plaintext_broker_ms_mb"] / figures["tls_broker_ms_mb"]
        log(
            f"run {run}: plaintext {figures['plaintext_mb_s']:.1f} MB/s, TLS "
            f"{figures['tls_mb_s']:.1f} MB/s, SASL_SSL {figures['sasl_ssl_mb_s']:.1f} MB/s, "
            f"ratios {figures['ratio']:.2f} and {figures['sasl_ratio']:.2f}; CPU ms/MB "
            f"client {figures['plaintext_client_ms_mb']:.2f} and "
            f"{figures['tls_client_ms_mb']:.2f}, broker {figures['plaintext_broker_ms_mb']:.2f} "
            f"and {figures['tls_broker_ms_mb']:.2f}"
        )
        return figures
    finally:
        for target in targets.values():
            target.stop()
        if cpus is not None:
            pin(os.getpid(), set(cpus))


def report(command: str, runs: list[dict[str, float]], settings: str) -> str:
    medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    met = "yes" if medians["ratio"] >= 0.7 else "**no**"
    lines = [
        f"`{command}`: {settings}.",
        "",
        "| metric (median) | ours (local objects) |",
        "|---|---:|",
        f"| plaintext MB/s | {medians['plaintext_mb_s']:.1f} |",
        f"| TLS MB/s | {medians['tls_mb_s']:.1f} |",
        f"| SASL_SSL (PLAIN) MB/s | {medians['sasl_ssl_mb_s']:.1f} |",
        f"| TLS / plaintext (paired per run) | {medians['ratio']:.2f} |",
        f"| SASL_SSL / plaintext (paired per run) | {medians['sasl_ratio']:.2f} |",
        f"| broker CPU per MB, plaintext / TLS (paired per run) | {medians['broker_ratio']:.2f} |",
        "",
        "| CPU (median) | plaintext | TLS | SASL_SSL |",
        "|---|---:|---:|---:|",
        *(
            f"| {label} | "
            + " | ".join(f"{medians[f'{mode}_{key}']:{form}}" for mode in MODES)
            + " |"
            for label, key, form in (
                ("client ms per MB", "client_ms_mb", ".2f"),
                ("broker ms per MB", "broker_ms_mb", ".2f"),
                ("client, share of one CPU", "client_cpu", ".0%"),
                ("broker, share of one CPU", "broker_cpu", ".0%"),
            )
        ),
        "",
        "| run | plaintext MB/s | TLS MB/s | SASL_SSL MB/s | TLS ratio | SASL_SSL ratio |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {number} | {run['plaintext_mb_s']:.1f} | {run['tls_mb_s']:.1f} | "
            f"{run['sasl_ssl_mb_s']:.1f} | {run['ratio']:.2f} | {run['sasl_ratio']:.2f} |"
            for number, run in enumerate(runs, 1)
        ),
        "",
        "| target | figure (median) | met |",
        "|---|---|:---:|",
        f"| TLS / plaintext >= 0.7 | {medians['ratio']:.2f} | {met} |",
    ]
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200, help="MB per workload, measured")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument(
        "--separate-cores",
        action="store_true",
        help="brokers on the last CPU, the producers on the others (as on two hosts)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few MB")
    parser.add_argument("--dir", type=Path, default=None, help="where the brokers keep data")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.runs, arguments.mb, arguments.rounds = 1, 4, 2
    for name in ("runs", "mb", "rounds", "partitions"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if arguments.separate_cores and len(os.sched_getaffinity(0)) < 2:
        parser.error("--separate-cores needs at least 2 CPUs")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    records = arguments.mb * MEGABYTE // RECORD_BYTES
    records -= records % arguments.rounds
    workdir = Path(tempfile.mkdtemp(prefix="tls-bench-", dir=arguments.dir))
    cpus = tuple(sorted(os.sched_getaffinity(0))) if arguments.separate_cores else None
    load_before = os.getloadavg()
    began = time.perf_counter()
    try:
        runs = [
            run_once(
                workdir,
                records,
                arguments.rounds,
                arguments.partitions,
                run,
                cpus,
            )
            for run in range(1, arguments.runs + 1)
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    command = "python -m bench.tls_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    settings = (
        f"{arguments.runs} run(s), {records} records of {RECORD_BYTES} bytes per workload, "
        f"{arguments.rounds} rounds, {arguments.partitions} partition(s)"
        f"{', brokers and producers on separate cores' if arguments.separate_cores else ''}; "
        f"{time.perf_counter() - began:.0f} s in all; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after ({os.cpu_count()} CPUs)"
    )
    text = report(command.strip(), runs, settings)
    print(text, flush=True)
    if arguments.out is not None:
        arguments.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
