"""Faults for checked runs: what each nemesis breaks, how it heals, and the setup it needs.

A checked run happens in an :class:`Environment`: one broker process, and, when a nemesis needs
them, an S3 endpoint (moto's server) behind a fault proxy holding the broker's objects, and a TCP
proxy that the clients go through (the broker advertises the proxy's address, so clients never
bypass it). The nemesis thread picks a nemesis at random (seeded), calls ``inject``, waits the
fault's length, and calls ``heal``; the window between is recorded and shaded in the plot.

=============  =============================================================================
``kill``       SIGKILL the broker; heal: start it again on the same data and port.
``pause``      SIGSTOP the broker; heal: SIGCONT.
``wal-loss``   SIGKILL, then undo what the WAL wrote since its last fsync (an arbitrary subset
               of the sectors of each such write, as a power cut may leave them), as if the
               machine had lost power; heal: start again. Needs the broker's undo journal
               (a test-only setting switched on automatically).
``s3``         the object store misbehaves: 503 SlowDown answers, added latency, or ambiguous
               success (the write lands, the caller sees an error); heal: transparent again.
``net``        the clients' connections are delayed, partitioned (bytes held back), black-holed
               (bytes discarded: a connection is useless afterwards) or reset; heal:
               transparent.
=============  =============================================================================
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from automq_ref.checker.cluster import BrokerProcess, free_port

if TYPE_CHECKING:
    from automq_ref.checker.proxies import S3FaultProxy, TcpProxy

log = logging.getLogger(__name__)

S3_BUCKET = "automq-ref-check"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Environment:
    """The broker under test and the proxies around it; ``close`` stops everything."""

    broker: BrokerProcess
    tcp_proxy: TcpProxy | None = None
    s3_proxy: S3FaultProxy | None = None
    _closers: list[Any] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the TCP proxy when there is one, else the broker."""
        if self.tcp_proxy is not None:
            return f"127.0.0.1:{self.tcp_proxy.port}"
        return self.broker.bootstrap

    @classmethod
    def start(
        cls,
        data_dir: Path,
        nemeses: tuple[str, ...],
        broker_overrides: tuple[str, ...] = (),
        *,
        broken: tuple[str, ...] = (),
        seed: int = 0,
    ) -> Environment:
        unknown = sorted(set(nemeses) - set(NEMESES))
        if unknown:
            raise ValueError(
                f"unknown nemesis {', '.join(unknown)} (known: {', '.join(sorted(NEMESES))})"
            )
        overrides = list(broker_overrides)
        modes = list(broken)
        env: dict[str, str] = {}
        closers: list[Any] = []
        s3_proxy = tcp_proxy = None
        for name in nemeses:
            overrides += NEMESES[name].broker_overrides
            modes += NEMESES[name].broken
        try:
            if "s3" in nemeses:
                s3_proxy, stop_moto = _start_s3(seed)
                closers += [s3_proxy.stop, stop_moto]
                overrides += [
                    f"s3.data.buckets=s3://{S3_BUCKET}?region=us-east-1"
                    f"&endpoint={s3_proxy.url}&pathStyle=true",
                ]
                env.update(S3_CREDENTIALS)
            port = 0
            if "net" in nemeses:
                from automq_ref.checker.proxies import TcpProxy

                port = free_port()
                tcp_proxy = TcpProxy("127.0.0.1", port)
                tcp_proxy.start()
                closers.append(tcp_proxy.stop)
                overrides.append(f"advertised.listeners=PLAINTEXT://127.0.0.1:{tcp_proxy.port}")
            broker = BrokerProcess(data_dir, *overrides, broken=modes, env=env, port=port)
            broker.start()
        except BaseException:
            for close in reversed(closers):
                close()
            raise
        return cls(broker, tcp_proxy, s3_proxy, closers)

    def close(self) -> None:
        try:
            if self.broker.process is not None:
                self.broker.resume()  # a stop while paused would wait forever
            if self.broker.alive():
                self.broker.stop()
        finally:
            for close in reversed(self._closers):
                close()


def _start_s3(seed: int) -> tuple[S3FaultProxy, Any]:
    import boto3  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

    from automq_ref.checker.proxies import S3FaultProxy

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=S3_BUCKET)
    proxy = S3FaultProxy(endpoint, seed=seed)
    proxy.start()
    return proxy, server.stop


class Nemesis(ABC):
    """One kind of fault. ``inject`` breaks something and returns a short description of what;
    ``heal`` undoes it. Both run on the nemesis thread, one fault at a time."""

    name: ClassVar[str]
    broker_overrides: ClassVar[tuple[str, ...]] = ()
    broken: ClassVar[tuple[str, ...]] = ()  # the checker's broker modes it needs

    @abstractmethod
    def inject(self, env: Environment, rng: random.Random) -> str: ...

    @abstractmethod
    def heal(self, env: Environment) -> None: ...


class Kill(Nemesis):
    name = "kill"

    def inject(self, env: Environment, rng: random.Random) -> str:
        env.broker.kill()
        return "SIGKILL"

    def heal(self, env: Environment) -> None:
        env.broker.start()


class Pause(Nemesis):
    name = "pause"

    def inject(self, env: Environment, rng: random.Random) -> str:
        env.broker.pause()
        return "SIGSTOP"

    def heal(self, env: Environment) -> None:
        env.broker.resume()


class WalLoss(Nemesis):
    name = "wal-loss"
    broken = ("wal-undo-journal",)

    def inject(self, env: Environment, rng: random.Random) -> str:
        from automq_ref.checker.faults import lose_unsynced_tail

        env.broker.kill()
        # Its own generator: how many draws the loss takes depends on timing, and the schedule's
        # generator must not depend on timing (one seed, one schedule).
        lost = lose_unsynced_tail(env.broker.wal_path, random.Random(rng.getrandbits(64)))
        return "SIGKILL, unsynced WAL tail lost: " + ", ".join(
            f"{key} {value}" for key, value in sorted(lost.items())
        )

    def heal(self, env: Environment) -> None:
        env.broker.start()


class S3Faults(Nemesis):
    name = "s3"
    # Upload often so that uploads (and their retries) fall inside the fault windows.
    broker_overrides = ("s3.wal.upload.interval.ms=1000", "s3.wal.upload.threshold=1048576")
    MODES = ("503", "latency", "ambiguous")

    def inject(self, env: Environment, rng: random.Random) -> str:
        assert env.s3_proxy is not None
        mode = rng.choice(self.MODES)
        if mode == "503":
            rate = rng.choice((0.5, 1.0))
            env.s3_proxy.set_faults(error_rate=rate)
            return f"503 SlowDown on {rate:.0%} of requests"
        if mode == "latency":
            latency = rng.uniform(0.2, 1.0)
            env.s3_proxy.set_faults(latency_s=latency)
            return f"{latency * 1000:.0f} ms latency"
        rate = rng.choice((0.3, 1.0))
        env.s3_proxy.set_faults(ambiguous_rate=rate)
        return f"ambiguous success on {rate:.0%} of requests"

    def heal(self, env: Environment) -> None:
        assert env.s3_proxy is not None
        env.s3_proxy.heal()


class NetFaults(Nemesis):
    name = "net"
    MODES = ("delay", "partition", "drop", "reset")

    def inject(self, env: Environment, rng: random.Random) -> str:
        assert env.tcp_proxy is not None
        mode = rng.choice(self.MODES)
        if mode == "delay":
            delay = rng.uniform(0.05, 0.5)
            env.tcp_proxy.set_delay(delay)
            return f"{delay * 1000:.0f} ms delay"
        if mode == "partition":
            env.tcp_proxy.set_stall(True)
            return "partition (bytes held until healed)"
        if mode == "drop":
            env.tcp_proxy.set_drop(True)
            return "black hole (bytes discarded)"
        return f"reset {env.tcp_proxy.reset_all()} connections"

    def heal(self, env: Environment) -> None:
        assert env.tcp_proxy is not None
        env.tcp_proxy.heal()


NEMESES: dict[str, Nemesis] = {
    nemesis.name: nemesis for nemesis in (Kill(), Pause(), WalLoss(), S3Faults(), NetFaults())
}
