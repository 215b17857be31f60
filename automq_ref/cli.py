"""The ``automq-ref`` command: ``serve`` runs the broker in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from automq_ref import __version__
from automq_ref.config import BrokerConfig, ConfigError, load_config

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
        help="a property for the broker under test (e.g. a test-only broken mode)",
    )
    arguments = parser.parse_args(argv)
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
        return _run(config)
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
    outcome = run_check(arguments.out, settings, tuple(arguments.broker_override))
    return 0 if outcome.valid else 1


def _run(config: BrokerConfig) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio works too
        return asyncio.run(_serve(config))
    return uvloop.run(_serve(config))


async def _serve(config: BrokerConfig) -> int:
    from automq_ref.io.broker import Broker
    from automq_ref.io.kafka_server import KafkaServer

    broker = await Broker.start(config)
    server = KafkaServer(broker, max_request_bytes=config.socket_request_max_bytes)
    host, port = await server.start(config.host, config.port)
    broker.advertised_host, broker.advertised_port = host, port
    print(
        f"automq-ref: serving Kafka on {host}:{port} (bootstrap.servers={host}:{port})", flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("shutting down: uploading the WAL's data, then closing")
    await server.close()
    await broker.shutdown()
    print("automq-ref: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
