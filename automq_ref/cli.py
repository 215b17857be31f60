"""The ``automq-ref`` command: ``serve`` runs the broker in the foreground; ``produce`` and
``verify`` write a topic with a manifest and check it with Spark."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from automq_ref import __version__
from automq_ref.config import ConfigError, load_config

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
    serve.add_argument("--log-level", default="INFO")
    check = commands.add_parser(
        "check", help="run real clients against a broker process under faults and check them"
    )
    check.add_argument("--nemesis", default="kill,pause", help="comma-separated: kill, pause")
    check.add_argument("--duration", type=float, default=60.0, help="seconds of workload")
    check.add_argument("--seed", type=int, default=None, help="fault schedule seed")
    check.add_argument("--partitions", type=int, default=3)
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
        "discard-wal-at-start (test only; repeatable)",
    )
    _add_spark_commands(commands)
    arguments = parser.parse_args(argv)
    if arguments.command == "produce":
        return _produce(arguments)
    if arguments.command == "verify":
        return _verify(arguments)
    if arguments.command == "check":
        return _check(arguments)
    if arguments.command == "serve":
        logging.basicConfig(
            level=arguments.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        try:
            config = load_config(arguments.config, arguments.override)
        except (ConfigError, OSError) as error:
            print(f"automq-ref serve: {error}", file=sys.stderr)
            return 2
        from automq_ref import node

        return node.run(config, node.Seams())
    return 0


def _check(arguments: argparse.Namespace) -> int:
    import random

    from automq_ref.checker.run import run_check
    from automq_ref.checker.workload import WorkloadSettings

    logging.basicConfig(level="WARNING")
    seed = arguments.seed if arguments.seed is not None else random.randrange(2**31)
    nemeses = tuple(name for name in arguments.nemesis.split(",") if name)
    settings = WorkloadSettings(
        partitions=arguments.partitions,
        duration_s=arguments.duration,
        nemeses=nemeses,
        seed=seed,
    )
    outcome = run_check(
        arguments.out, settings, tuple(arguments.broker_override), broken=tuple(arguments.broken)
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
    verify.add_argument("--object-store", help="object store URI (automq-objects source)")
    verify.add_argument("--master", default="local[*]", help="Spark master URL")
    verify.add_argument("--report", type=Path, default=Path("verify-report"), help="directory")
    verify.add_argument("--examples", type=int, default=5, help="examples named per partition")


def _produce(arguments: argparse.Namespace) -> int:
    from automq_ref.spark.produce import ProduceSettings
    from automq_ref.spark.produce import main as produce_main

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
    try:
        from automq_ref.spark.verify import VerifySettings
        from automq_ref.spark.verify import main as verify_main
    except ImportError as error:  # pragma: no cover - the spark extra is missing
        print(f"automq-ref verify needs the spark extra: {error}", file=sys.stderr)
        return 2
    if arguments.source == "automq" and arguments.bootstrap is None:
        print("automq-ref verify: --bootstrap is needed with --source automq", file=sys.stderr)
        return 2
    if arguments.source == "automq-objects" and arguments.path is None:
        print("automq-ref verify: --path is needed with --source automq-objects", file=sys.stderr)
        return 2
    return verify_main(
        VerifySettings(
            manifest=arguments.manifest,
            bootstrap=arguments.bootstrap,
            source=arguments.source,
            path=arguments.path,
            object_store=arguments.object_store,
            master=arguments.master,
            report=arguments.report,
            examples=arguments.examples,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
