"""The ``automq-ref`` command: ``serve`` runs the broker in the foreground; ``cluster`` runs three
brokers with etcd and an S3 server on this machine; ``produce`` and ``verify`` write a topic with a
manifest and check it with Spark; ``certificates`` writes a CA and keystores for trying the TLS
listeners (``config/secure.properties``).

A command that cannot do its work says so in one line, ``automq-ref <command>: <what went
wrong>; <what to do>``, and exits 2 (a usage error, or nothing to run against); a check that ran
and failed exits 1. What can be known before the work starts is checked first: the listener's
port before the broker writes anything, the broker's address before a client or Spark starts.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import socket
import sys
from pathlib import Path

from automq_ref import __version__
from automq_ref.checker.nemesis import NEMESES
from automq_ref.config import ConfigError, did_you_mean, load_config

# How long the broker's address may take to accept a connection before a command gives up.
PROBE_TIMEOUT_S = 3.0
LOG_LEVELS = ("debug", "info", "warning", "error")
# The checked topic's partitions in a cluster: two led by each of three brokers.
CLUSTER_PARTITIONS = 6
# The transactional workload's processes: each waits for its commit before the next
# transaction, so more of them keep the coordinator busy (and a kill meets a commit in flight).
TXN_PRODUCERS = 4
# The workload's (automq_ref/checker/workload.py), repeated here: the command line does not load
# the checker's clients to print its help.
WORKLOAD_FAULT_INTERVAL_S = 6.0

log = logging.getLogger("automq_ref")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="automq-ref", description=__doc__)
    parser.add_argument("--version", action="version", version=f"automq-ref {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the broker (embedded default: ./data, :9092)")
    serve.add_argument("--config", type=Path, help="a properties file (AutoMQ/Kafka names)")
    serve.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one property (repeatable), e.g. --override listeners=PLAINTEXT://127.0.0.1:0",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=LOG_LEVELS,
        help="what the broker logs to stderr: info (default) has a line per topic created or "
        "deleted, group rebalance, burst of client connections, upload and object-read summary "
        "and recovery; "
        "warning only what needs attention; debug every connection and request refused",
    )
    cluster = commands.add_parser(
        "cluster",
        help="run etcd, an S3 server (moto) and three brokers on this machine (make cluster)",
    )
    cluster.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one property on every broker (repeatable), as with serve",
    )
    cluster.add_argument(
        "--base-port",
        type=int,
        default=9092,
        help=(
            "Kafka ports of brokers 1, 2, 3: this one and the next two (default 9092; 0: a "
            "free port each, named in the bootstrap.servers line printed once all serve)"
        ),
    )
    cluster.add_argument(
        "--metrics-base-port",
        type=int,
        default=9464,
        help=(
            "Prometheus endpoints of brokers 1, 2, 3: this port and the next two (default "
            "9464; 0, or --base-port 0: a free port each, named in the launcher's lines; -1: "
            "no metrics)"
        ),
    )
    cluster.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where etcd, the brokers and every log live; emptied at start (default "
        "data/cluster, with --zones data/cluster-zones)",
    )
    cluster.add_argument(
        "--zones",
        action="store_true",
        help="run it in a three-zone network of namespaces (make cluster-zones; root and "
        "iproute2): broker N in zone azN on its own address, etcd and S3 in the region",
    )
    cluster.add_argument(
        "--wal",
        choices=("object", "device"),
        default="object",
        help="each broker's WAL: the object WAL in the bucket (default), or a block WAL on a "
        "WAL device process of its own (NVMe-like reservations; crash failover preempts them)",
    )
    check = commands.add_parser(
        "check",
        help="run real clients against a broker process (or a cluster) under faults and check them",
    )
    check.add_argument(
        "--nemesis",
        default=None,
        help=f"comma-separated, any of: {', '.join(NEMESES)} (default: kill,pause; with "
        "--brokers above 1: kill,pause,etcd-pause; docs/verification.md says what each does)",
    )
    check.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="1 (default): one broker process; more: a cluster of that many on an etcd member "
        "the check starts, one shared object store, node ids 1..N in racks az1..azN",
    )
    check.add_argument("--duration", type=float, default=60.0, help="seconds of workload")
    check.add_argument(
        "--fault-interval",
        type=float,
        default=WORKLOAD_FAULT_INTERVAL_S,
        help=f"a fault starts about this often, in seconds (default {WORKLOAD_FAULT_INTERVAL_S:g})",
    )
    check.add_argument(
        "--seed",
        type=int,
        default=None,
        help="fault schedule seed (with --runs: of the first run; run i uses seed+i)",
    )
    check.add_argument(
        "--runs",
        type=int,
        default=None,
        help="repeat the whole run this many times on fresh data, each in <out>/seed-<seed>, "
        "with a line per run and the aggregate (runs passed and failed, the failed seeds)",
    )
    check.add_argument(
        "--wal",
        default="file",
        choices=("file", "s3"),
        help="the brokers' WAL: file (default: each broker's block WAL in its data) or s3 "
        "(the object WAL in the checked bucket, behind the S3 fault proxy)",
    )
    check.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="of the checked topic (default 3; 6 in a cluster)",
    )
    check.add_argument(
        "--workload",
        default="queue",
        choices=("queue", "txn"),
        help="queue (default): idempotent sends and polls, the queue checks and "
        "linearizability; txn: Kafka transactions of sends and read_committed polls, committed "
        "and aborted, with the transactional checks (aborted reads, lost and duplicated "
        "writes, G1c, internal and external non-monotonic polls; G0 counted as allowed)",
    )
    check.add_argument("--out", type=Path, default=Path("check-out"), help="report directory")
    check.add_argument(
        "--broker-override",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a property for the broker under test",
    )
    check.add_argument(
        "--broken",
        action="append",
        default=[],
        metavar="MODE",
        help="run a deliberately broken broker, for the checker to catch: ack-before-fsync, "
        "discard-wal-at-start, txn-markers-before-decision (with --workload txn) (test only; "
        "repeatable; in a cluster broker 1 alone)",
    )
    certificates = commands.add_parser(
        "certificates",
        help="write ca.pem, broker.pem (for 127.0.0.1 and localhost) and client.pem, PEM files "
        "made for trying TLS (config/secure.properties), not for production",
    )
    certificates.add_argument("directory", type=Path)
    _add_spark_commands(commands)
    arguments = parser.parse_args(argv)
    if arguments.command == "certificates":
        return _certificates(arguments.directory)
    if arguments.command == "produce":
        return _produce(arguments)
    if arguments.command == "verify":
        return _verify(arguments)
    if arguments.command == "check":
        return _check(arguments)
    if arguments.command == "cluster":
        from automq_ref.launch import ClusterSettings
        from automq_ref.launch import run as run_cluster
        from automq_ref.netzones import ZoneNetwork

        default_dir = Path("data/cluster-zones" if arguments.zones else "data/cluster")
        return run_cluster(
            ClusterSettings(
                data_dir=arguments.data_dir or default_dir,
                base_port=arguments.base_port,
                metrics_base_port=(
                    None if arguments.metrics_base_port < 0 else arguments.metrics_base_port
                ),
                overrides=tuple(arguments.override),
                wal=arguments.wal,
                network=ZoneNetwork() if arguments.zones else None,
            )
        )
    if arguments.command == "serve":
        logging.basicConfig(
            level=arguments.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        try:
            config = load_config(arguments.config, arguments.override)
        except ConfigError as error:
            for problem in error.problems:
                print(f"automq-ref serve: {problem}", file=sys.stderr)
            return 2
        except OSError as error:
            print(
                f"automq-ref serve: cannot read --config {arguments.config}: "
                f"{error.strerror or error}; pass a readable properties file",
                file=sys.stderr,
            )
            return 2
        from automq_ref import node

        try:
            return node.run(config, node.Seams())
        except node.ListenerUnavailable as error:
            print(
                f"automq-ref serve: {error}; choose another address with the listeners "
                f"setting, e.g. --override listeners=PLAINTEXT://{error.host}:{error.port + 1}",
                file=sys.stderr,
            )
            return 2
        except node.MetadataUnavailable as error:
            print(
                f"automq-ref serve: {error}; start etcd there or correct metadata.etcd.endpoints",
                file=sys.stderr,
            )
            return 2
    return 0


def _certificates(directory: Path) -> int:
    from automq_ref.checker.certificates import make_certificates

    existing = [
        name for name in ("ca.pem", "broker.pem", "client.pem") if (directory / name).exists()
    ]
    if existing:
        print(
            f"automq-ref certificates: {directory} already holds {', '.join(existing)}; "
            "remove them or name another directory",
            file=sys.stderr,
        )
        return 2
    try:
        written = make_certificates().write(directory)
    except OSError as error:
        print(f"automq-ref certificates: cannot write {directory}: {error}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def _unreachable(command: str, bootstrap: str) -> str | None:
    """Why no broker answers at ``bootstrap`` (``HOST:PORT[,HOST:PORT...]``), as the one line
    to print, or None when one of its addresses accepts a connection."""
    addresses: list[tuple[str, int]] = []
    for address in bootstrap.split(","):
        host, separator, port = address.strip().rpartition(":")
        if not separator or not host or not port.isdigit():
            return (
                f"automq-ref {command}: --bootstrap {address!r} is not HOST:PORT; "
                "pass e.g. --bootstrap 127.0.0.1:9092"
            )
        addresses.append((host, int(port)))
    reasons = _refusals(addresses)
    if reasons is None:
        return None
    return (
        f"automq-ref {command}: no broker answers at {', '.join(reasons)}; start one with "
        f"`automq-ref serve` (or `make run`) or pass the --bootstrap of a running broker"
    )


def _refusals(addresses: list[tuple[str, int]]) -> list[str] | None:
    """Why each of ``addresses`` refuses a connection (``host:port (reason)``), or None as soon
    as one accepts."""
    reasons = []
    for host, port in addresses:
        try:
            with socket.create_connection((host.strip("[]"), port), PROBE_TIMEOUT_S):
                return None
        except OSError as error:
            reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or error
            reasons.append(f"{host}:{port} ({str(reason).lower()})")
    return reasons


def _needs_extras(command: str, error: ImportError) -> str:
    """The one line for a command whose clients (test extra) or Spark (spark extra) are not
    installed: `make run` installs only what the broker needs."""
    return (
        f"automq-ref {command}: {error}; this command needs the test and spark extras: "
        "pip install -e '.[test,spark]' (the venv `make test` builds has them)"
    )


def _check(arguments: argparse.Namespace) -> int:
    import random

    try:
        from automq_ref.checker.run import BROKEN_MODES, run_check
        from automq_ref.checker.workload import WorkloadSettings
    except ImportError as error:
        print(_needs_extras("check", error), file=sys.stderr)
        return 2

    if arguments.brokers < 1:
        print(
            f"automq-ref check: --brokers must be at least 1, not {arguments.brokers}; 1 checks "
            "one broker, 3 a cluster",
            file=sys.stderr,
        )
        return 2
    cluster = arguments.brokers > 1
    nemesis = arguments.nemesis
    if nemesis is None:
        nemesis = "kill,pause,etcd-pause" if cluster else "kill,pause"
    requested = [name for name in nemesis.split(",") if name]
    for name in requested:
        if name not in NEMESES:
            print(
                f"automq-ref check: unknown nemesis {name!r}; --nemesis takes a comma-separated "
                f"list of {', '.join(NEMESES)}{did_you_mean(name, NEMESES)}",
                file=sys.stderr,
            )
            return 2
        if NEMESES[name].needs_cluster and not cluster:
            print(
                f"automq-ref check: the {name} nemesis needs a cluster (one broker runs without "
                "etcd); add --brokers 3, or leave it out of --nemesis",
                file=sys.stderr,
            )
            return 2
    if arguments.wal != "file" and "wal-loss" in requested:
        print(
            "automq-ref check: the wal-loss nemesis undoes what a WAL file wrote; with --wal "
            f"{arguments.wal} leave it out of --nemesis",
            file=sys.stderr,
        )
        return 2
    if arguments.fault_interval <= 0:
        print(
            f"automq-ref check: --fault-interval must be positive, not {arguments.fault_interval}",
            file=sys.stderr,
        )
        return 2
    if arguments.runs is not None and arguments.runs < 1:
        print(
            f"automq-ref check: --runs must be at least 1, not {arguments.runs}",
            file=sys.stderr,
        )
        return 2
    if cluster and shutil.which("etcd") is None:
        print(
            "automq-ref check: etcd is not on PATH; a cluster check (--brokers above 1) runs "
            "Debian's etcd: apt-get install -y etcd-server",
            file=sys.stderr,
        )
        return 2
    for mode in arguments.broken:
        if mode not in BROKEN_MODES:
            print(
                f"automq-ref check: unknown --broken mode {mode!r}; the modes are "
                f"{', '.join(sorted(BROKEN_MODES))}{did_you_mean(mode, BROKEN_MODES)}",
                file=sys.stderr,
            )
            return 2
    logging.basicConfig(level="WARNING")
    seed = arguments.seed if arguments.seed is not None else random.randrange(2**31)
    nemeses = tuple(requested)
    partitions = arguments.partitions
    if partitions is None:
        partitions = CLUSTER_PARTITIONS if cluster else WorkloadSettings.partitions
    # Clients declaring zones (the zone-partition nemesis): a producer and a consumer per zone.
    zoned = any(NEMESES[name].needs_zone_router for name in nemeses)
    clients = arguments.brokers if zoned else None
    settings = WorkloadSettings(
        partitions=partitions,
        duration_s=arguments.duration,
        fault_interval_s=arguments.fault_interval,
        nemeses=nemeses,
        seed=seed,
        producers=clients
        or (TXN_PRODUCERS if arguments.workload == "txn" else WorkloadSettings.producers),
        consumers=clients or WorkloadSettings.consumers,
        workload=arguments.workload,
    )
    if arguments.runs is not None:
        from automq_ref.checker.soak import run_checks

        total = run_checks(
            arguments.out,
            settings,
            arguments.runs,
            tuple(arguments.broker_override),
            broken=tuple(arguments.broken),
            brokers=arguments.brokers,
            wal=arguments.wal,
        )
        return 0 if total.ok else 1
    outcome = run_check(
        arguments.out,
        settings,
        tuple(arguments.broker_override),
        broken=tuple(arguments.broken),
        brokers=arguments.brokers,
        wal=arguments.wal,
    )
    return 0 if outcome.valid else 1


def _add_spark_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = commands.add_parser(
        "produce", help="produce self-describing records and write a manifest of the acknowledged"
    )
    produce.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--partitions", type=int, default=8, help="if the topic is created")
    produce.add_argument("--records", type=int, required=True)
    produce.add_argument(
        "--codec", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd")
    )
    produce.add_argument("--value-bytes", type=int, default=100, help="each value's size")
    produce.add_argument("--producer", default=None, help="name in the values ([a-z0-9]{1,16})")
    produce.add_argument("--manifest", type=Path, required=True, help="JSON file to write")
    verify = commands.add_parser(
        "verify", help="read a produced topic with Spark and check it against the manifest"
    )
    verify.add_argument("--manifest", type=Path, required=True)
    verify.add_argument("--bootstrap", metavar="HOST:PORT", help="for the automq source")
    verify.add_argument("--source", default="automq", choices=("automq", "automq-objects"))
    verify.add_argument("--path", help="the broker's log.dirs (automq-objects source)")
    verify.add_argument(
        "--metadata-etcd-endpoints",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="instead of --path, a cluster's metadata log: its brokers' metadata.etcd.endpoints "
        "(automq-objects source; needs --object-store)",
    )
    verify.add_argument(
        "--cluster-id",
        help="with --metadata-etcd-endpoints: the brokers' cluster.id "
        "(default: the broker's default)",
    )
    verify.add_argument("--object-store", help="object store URI (automq-objects source)")
    verify.add_argument("--master", default="local[*]", help="Spark master URL")
    verify.add_argument("--report", type=Path, default=Path("verify-report"), help="directory")
    verify.add_argument("--examples", type=int, default=5, help="examples named per partition")
    verify.add_argument(
        "--verbose", action="store_true", help="show Spark's own log lines and stage bars"
    )


def _produce(arguments: argparse.Namespace) -> int:
    unreachable = _unreachable("produce", arguments.bootstrap)
    if unreachable is not None:
        print(unreachable, file=sys.stderr)
        return 2
    # A broker lost mid-run fails the deliveries (counted in the summary); librdkafka's line
    # per retry would bury that summary.
    logging.getLogger("automq_ref.librdkafka").setLevel(logging.CRITICAL)
    try:
        from automq_ref.spark.produce import ProduceSettings
        from automq_ref.spark.produce import main as produce_main
    except ImportError as error:
        print(_needs_extras("produce", error), file=sys.stderr)
        return 2

    extra = {} if arguments.producer is None else {"producer": arguments.producer}
    settings = ProduceSettings(
        bootstrap=arguments.bootstrap,
        topic=arguments.topic,
        partitions=arguments.partitions,
        records=arguments.records,
        codec=arguments.codec,
        value_bytes=arguments.value_bytes,
        **extra,
    )
    return produce_main(settings, arguments.manifest)


def _verify(arguments: argparse.Namespace) -> int:
    if not arguments.manifest.is_file():
        print(
            f"automq-ref verify: no manifest at {arguments.manifest}; pass the file "
            "`automq-ref produce --manifest` wrote",
            file=sys.stderr,
        )
        return 2
    if arguments.source == "automq" and arguments.bootstrap is None:
        print("automq-ref verify: --bootstrap is needed with --source automq", file=sys.stderr)
        return 2
    problem = _objects_source_problem(arguments)
    if problem is not None:
        print(f"automq-ref verify: {problem}", file=sys.stderr)
        return 2
    if arguments.source == "automq":
        unreachable = _unreachable("verify", arguments.bootstrap)
        if unreachable is not None:
            print(unreachable, file=sys.stderr)
            return 2
    try:
        from automq_ref.spark.verify import VerifySettings
        from automq_ref.spark.verify import main as verify_main
    except ImportError as error:
        print(_needs_extras("verify", error), file=sys.stderr)
        return 2
    return verify_main(
        VerifySettings(
            manifest=arguments.manifest,
            bootstrap=arguments.bootstrap,
            source=arguments.source,
            path=arguments.path,
            object_store=arguments.object_store,
            etcd_endpoints=arguments.metadata_etcd_endpoints,
            cluster_id=arguments.cluster_id,
            master=arguments.master,
            report=arguments.report,
            examples=arguments.examples,
            verbose=arguments.verbose,
        )
    )


def _objects_source_problem(arguments: argparse.Namespace) -> str | None:
    """What is wrong with where ``automq-objects`` is pointed (a broker's ``--path`` or a
    cluster's ``--metadata-etcd-endpoints``), or None; an etcd that no endpoint of answers is
    found here, before Spark starts."""
    etcd, cluster_id = arguments.metadata_etcd_endpoints, arguments.cluster_id
    if arguments.source != "automq-objects":
        if etcd is not None or cluster_id is not None:
            return (
                "--metadata-etcd-endpoints and --cluster-id apply only to --source "
                "automq-objects; the automq source finds everything through --bootstrap"
            )
        return None
    if etcd is None:
        if cluster_id is not None:
            return "--cluster-id needs --metadata-etcd-endpoints (a cluster's metadata log)"
        if arguments.path is None:
            return (
                "--path (a broker's log.dirs) or --metadata-etcd-endpoints (a cluster's etcd) "
                "is needed with --source automq-objects"
            )
        return None
    if arguments.path is not None:
        return (
            "--path and --metadata-etcd-endpoints name two metadata logs; give --path for a "
            "broker's log.dirs or --metadata-etcd-endpoints for a cluster's, not both"
        )
    if arguments.object_store is None:
        return (
            "--object-store is needed with --metadata-etcd-endpoints; pass the brokers' "
            "s3.data.buckets"
        )
    from automq_ref.spark.image import SettingError, etcd_log

    try:
        log = etcd_log(etcd, cluster_id)
    except SettingError as error:
        flag = "--" + error.setting.replace(".", "-")
        return f"{flag}: {error.problem}; pass the brokers' {error.setting}"
    addresses = []
    for endpoint in log.endpoints:
        host, _, port = endpoint.rpartition(":")
        addresses.append((host, int(port)))
    reasons = _refusals(addresses)
    if reasons is not None:
        return (
            f"no etcd answers at {', '.join(reasons)}; start it or pass the brokers' "
            "metadata.etcd.endpoints"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
