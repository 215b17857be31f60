"""Faults for checked runs: what each nemesis breaks, how it heals, and the setup it needs.

A checked run happens in an :class:`Environment`: one broker process, or a cluster of them
(``brokers`` > 1: an etcd member the run starts, one object store shared by every broker, node
ids 1..N in racks az1..azN, clients bootstrapped to all); and, when a nemesis needs them, an S3
endpoint (moto's server) behind a fault proxy holding the brokers' objects, and a TCP proxy per
broker that the clients go through (each broker advertises its proxy's address, so clients
never bypass it, and neither do the other brokers' Kafka-protocol requests to it: the zone
router's and the snapshot reads'). With the ``zone-partition`` nemesis the cluster runs with the
zone router on (its channels beside the objects) and the clients declare zones
(:meth:`Environment.client_zone`), each bootstrapped to its zone's broker.

The nemesis thread picks a nemesis at random (seeded), calls ``inject``, waits the fault's
length, and calls the :class:`Injected` fault's ``heal``; the window between is recorded
with what the fault hit (``target``: "broker 2 (active controller)", "etcd") and shaded in the
plot.

In a cluster a fault that hits a broker hits one, chosen at random each time (the same seed
chooses the same ones); with one broker nothing is drawn for the choice, so a seed gives the
schedule it always gave.

==============  ============================================================================
``kill``        SIGKILL a broker; heal: start it again on the same data and port.
``pause``       SIGSTOP a broker; heal: SIGCONT. In a cluster every other pause (at random)
                lasts longer than ``broker.session.timeout.ms`` (and the controller's lease,
                when it hits the active controller), so the controller fences the broker and,
                once resumed, it starts itself again in its process.
``wal-loss``    SIGKILL a broker, then undo what its WAL wrote since its last fsync (an
                arbitrary subset of the sectors of each such write, as a power cut may leave
                them), as if the machine had lost power; heal: start again. Needs the broker's
                undo journal (a test-only setting switched on automatically).
``s3``          the object store misbehaves: 503 SlowDown answers, added latency, or ambiguous
                success (the write lands, the caller sees an error); heal: transparent again.
``net``         a broker's client connections are delayed, partitioned (bytes held back),
                black-holed (bytes discarded: a connection is useless afterwards) or reset;
                heal: transparent.
``etcd-pause``  (a cluster only) SIGSTOP the etcd member for 1.5 to 4.5 s, some pauses longer
                than the controller's lease; heal: SIGCONT.
==============  ============================================================================

Three more, for failover:

======================  ====================================================================
``pause-past-session``  (a cluster only) SIGSTOP a broker until the metadata log shows the
                        controller fenced it (its session lapsed), then ``ZOMBIE_HOLD_S``
                        more; heal: SIGCONT. The resumed broker is a zombie until it learns
                        of the fence: whatever it acknowledges then must still be in the log.
``graceful-restart``    SIGTERM a broker and wait for it to exit (killed, and said so, if it
                        has not within ``GRACEFUL_EXIT_S``); heal: start it again with the
                        same node id, data and port.
``s3-faults``           S3 faults during failover: the object store (moto behind the S3 fault
                        proxy) answers 503 SlowDown (to PUTs or to every request), delays PUTs
                        or loses their answers (the PUT lands), and while it does a broker is
                        killed and kept down past its session (a cluster's controller fences
                        it, so a failover would run under the faults); heal: the broker starts
                        and recovers with the faults still on for ``RECOVER_UNDER_FAULTS_S``,
                        then the store is healed.
======================  ====================================================================

And one for zones:

==================  ========================================================================
``zone-partition``  (a cluster only) one zone (at random) cut off from the other zones for
                    2 to 10 s (uniform), through the brokers' TCP proxies, by the client id
                    of each Kafka connection's first request: connections into the zone's
                    broker from other zones (clients declaring another zone, the other
                    brokers' zone-router requests and snapshot polls) and from the zone into
                    the other zones' brokers are held (bytes delivered in order at the heal,
                    as TCP would retransmit them); the zone's clients still reach its broker.
                    Not cut: the controller RPC (heartbeats), etcd and S3 (regional), and
                    clients that declare no zone. Heal: every connection flows again.
==================  ========================================================================
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from automq_ref.checker.cluster import BrokerProcess, EtcdProcess, free_port
from automq_ref.config import load_config

if TYPE_CHECKING:
    from automq_ref.checker.metadata_dump import Registration
    from automq_ref.checker.proxies import S3FaultProxy, TcpProxy

log = logging.getLogger(__name__)

S3_BUCKET = "automq-ref-check"
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
CLUSTER_ID = "automq-ref-check"
# A checked cluster's sessions: short, so that a pause can outlast one within a short run, yet
# several heartbeats long, so that a loaded machine does not fence brokers nobody paused.
CLUSTER_BROKER_SETTINGS = (
    "broker.heartbeat.interval.ms=1000",
    "broker.session.timeout.ms=5000",
)
# How much longer than the session a long pause lasts: the controller's expiry runs about once
# a second, so the broker is fenced before it resumes.
LONG_PAUSE_MARGIN_S = 2.5
ETCD_PAUSE_S = (1.5, 4.5)
# The checked object WAL's batch interval (AutoMQ's default is 250 ms): each producer waits for
# one send's answer before the next, so the default would leave a run with few operations.
S3_WAL_BATCH_INTERVAL_MS = 50
# pause-past-session: how long the broker stays paused once its fence is in the log (time for
# a survivor to take over its partitions), and how often the log is read meanwhile.
ZOMBIE_HOLD_S = 2.0
FENCE_POLL_S = 0.5
# graceful-restart: how long a broker may take to exit after SIGTERM before it is killed.
GRACEFUL_EXIT_S = 30.0
# s3-faults: how long a restarted broker recovers with the store still failing.
RECOVER_UNDER_FAULTS_S = 2.0
# zone-partition: how long a zone stays cut off (uniform), and what tells a connection's zone:
# a client declaring automq_az=<zone>, or a broker's zone router or snapshot reads (their
# client ids carry the node id; broker N is in zone azN).
ZONE_CUT_S = (2.0, 10.0)
_DECLARED_ZONE = re.compile(r"(?:^|&)automq_az=([^&]*)")
_BROKER_CLIENT = re.compile(r"^(?:automq-ref-router|snapshot-read)-(\d+)$")


@dataclass
class Environment:
    """The brokers under test, etcd for a cluster, and the proxies around them; ``close``
    stops everything (also after a failure)."""

    brokers: list[BrokerProcess]
    tcp_proxies: list[TcpProxy] = field(default_factory=list)  # one per broker, or none
    s3_proxy: S3FaultProxy | None = None
    etcd: EtcdProcess | None = None
    session_timeout_s: float = 0.0  # a cluster's broker.session.timeout.ms
    lease_ttl_s: float = 0.0  # a cluster's controller lease, in the whole seconds etcd counts
    _closers: list[Any] = field(default_factory=list)
    metadata_path: Path | None = None  # where close writes a cluster's metadata log as text
    zone_router: bool = False  # automq.zonerouter.channels set on every broker

    @property
    def broker(self) -> BrokerProcess:
        """The broker of a one-broker run (the first of a cluster)."""
        return self.brokers[0]

    @property
    def cluster(self) -> bool:
        return self.etcd is not None

    @property
    def zoned(self) -> bool:
        """Whether the clients declare zones (the zone router is on): with ``zone-partition``."""
        return self.zone_router

    def client_zone(self, client: int) -> str:
        """The zone client number ``client`` declares when :attr:`zoned` (spread over the
        brokers' zones)."""
        return f"az{client % len(self.brokers) + 1}"

    def zone_bootstrap(self, zone: str) -> str:
        """Where a client of ``zone`` bootstraps: its zone's broker (through its proxy)."""
        index = int(zone.removeprefix("az")) - 1
        if self.tcp_proxies:
            return f"127.0.0.1:{self.tcp_proxies[index].port}"
        return self.brokers[index].bootstrap

    @property
    def bootstrap(self) -> str:
        """Where clients connect: every broker's TCP proxy when there are proxies, else every
        broker."""
        if self.tcp_proxies:
            return ",".join(f"127.0.0.1:{proxy.port}" for proxy in self.tcp_proxies)
        return ",".join(broker.bootstrap for broker in self.brokers)

    def pick(self, rng: random.Random) -> int:
        """The index of the broker a fault hits: at random in a cluster; with one broker, that
        one, without a draw (so a one-broker seed keeps its schedule)."""
        return rng.randrange(len(self.brokers)) if len(self.brokers) > 1 else 0

    def name(self, index: int, controller: int | None = None) -> str:
        """How the report names broker ``index``: "" with one broker, else "broker N", with
        "(active controller)" when it is ``controller`` (a node id)."""
        if not self.cluster:
            return ""
        node_id = index + 1
        return f"broker {node_id}" + (" (active controller)" if controller == node_id else "")

    def registration(self, node_id: int) -> Registration | None:
        """Node ``node_id``'s latest registration in the metadata log (its node epoch, fenced
        or not); None without a cluster or when the log cannot be read now."""
        if self.etcd is None:
            return None
        from automq_ref.checker.metadata_dump import registrations

        found = registrations(self.etcd.endpoint, CLUSTER_ID)
        return None if found is None else found.get(node_id)

    def controller(self) -> int | None:
        """The node id of the active controller (etcd's election key), None when unknown."""
        if self.etcd is None:
            return None
        # Imported here: the election module loads etcd's gRPC client, which the command line
        # (it imports this module for the nemesis names) must not pay for.
        from automq_ref.io.metadata.election import election_key

        value = self.etcd.range_value(election_key(CLUSTER_ID))
        try:
            return None if value is None else int(json.loads(value)["node_id"])
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def start(
        cls,
        data_dir: Path,
        nemeses: tuple[str, ...],
        broker_overrides: tuple[str, ...] = (),
        *,
        broken: tuple[str, ...] = (),
        seed: int = 0,
        brokers: int = 1,
        metadata_path: Path | None = None,
        wal: str = "file",
    ) -> Environment:
        """Start what ``nemeses`` need and the brokers (``data_dir`` is the broker's data with
        one broker; with more, ``data_dir`` holds ``broker-N``, ``etcd`` and ``objects``).
        With a cluster the ``broken`` modes are given to broker 1 only, and ``close`` writes
        the metadata log to ``metadata_path`` (when given) before etcd stops. ``wal`` is
        ``file`` (each broker's block WAL in its data directory) or ``s3`` (the object WAL, in
        the S3 bucket behind the fault proxy, so S3 faults hit WAL writes too)."""
        unknown = sorted(set(nemeses) - set(NEMESES))
        if unknown:
            raise ValueError(
                f"unknown nemesis {', '.join(unknown)} (known: {', '.join(sorted(NEMESES))})"
            )
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, not {brokers}")
        if wal not in WALS:
            raise ValueError(f"unknown wal {wal!r} (known: {', '.join(WALS)})")
        if wal != "file" and "wal-loss" in nemeses:
            raise ValueError("the wal-loss nemesis undoes a WAL file's writes: it needs wal=file")
        zone_router = any(NEMESES[name].needs_zone_router for name in nemeses)
        needs_cluster = sorted(name for name in nemeses if NEMESES[name].needs_cluster)
        if needs_cluster and brokers == 1:
            raise ValueError(f"nemesis {', '.join(needs_cluster)} needs a cluster (brokers > 1)")
        overrides = list(broker_overrides)
        modes: list[str] = []  # every broker's (what the nemeses need)
        env: dict[str, str] = {}
        closers: list[Any] = []
        s3_proxy = None
        tcp_proxies: list[TcpProxy] = []
        etcd = None
        for name in nemeses:
            overrides += NEMESES[name].broker_overrides
            modes += NEMESES[name].broken
        started: list[BrokerProcess] = []
        try:
            if any(NEMESES[name].needs_s3 for name in nemeses) or wal == "s3":
                s3_proxy, stop_moto = _start_s3(seed)
                closers += [s3_proxy.stop, stop_moto]
                overrides += [
                    f"s3.data.buckets=s3://{S3_BUCKET}?region=us-east-1"
                    f"&endpoint={s3_proxy.url}&pathStyle=true",
                ]
                env.update(S3_CREDENTIALS)
                if wal == "s3":  # every broker's WAL in the same bucket, behind the same proxy
                    overrides.append(
                        f"s3.wal.path=0@s3://{S3_BUCKET}?region=us-east-1"
                        f"&endpoint={s3_proxy.url}&pathStyle=true"
                        f"&batchInterval={S3_WAL_BATCH_INTERVAL_MS}"
                    )
            if brokers > 1:
                data_dir.mkdir(parents=True, exist_ok=True)
                etcd = EtcdProcess(data_dir / "etcd")
                closers.append(etcd.stop)
                etcd.start()
                shared = [
                    f"metadata.etcd.endpoints={etcd.endpoint}",
                    f"cluster.id={CLUSTER_ID}",
                    *CLUSTER_BROKER_SETTINGS,
                ]
                if s3_proxy is None:  # one object store for all: a directory they share
                    shared.append(f"s3.data.buckets={(data_dir / 'objects').resolve().as_uri()}")
                if zone_router:  # the router's channels beside the objects
                    # A short batch interval, as for the object WAL: every routed send waits
                    # for a channel batch, and each producer for its send's answer.
                    batch = f"batchInterval={S3_WAL_BATCH_INTERVAL_MS}"
                    if s3_proxy is None:
                        channels = f"0@dir://{(data_dir / 'channels').resolve()}?{batch}"
                    else:
                        channels = (
                            f"0@s3://{S3_BUCKET}?region=us-east-1&endpoint={s3_proxy.url}"
                            f"&pathStyle=true&{batch}"
                        )
                    shared.append(f"automq.zonerouter.channels={channels}")
                overrides = shared + overrides  # the user's and the nemeses' win
            for index in range(brokers):
                own = list(overrides)
                if brokers > 1:
                    own = [f"node.id={index + 1}", f"broker.rack=az{index + 1}", *own]
                port = 0
                if any(NEMESES[name].needs_proxies for name in nemeses):
                    from automq_ref.checker.proxies import TcpProxy

                    port = free_port()
                    proxy = TcpProxy("127.0.0.1", port)
                    proxy.start()
                    closers.append(proxy.stop)
                    tcp_proxies.append(proxy)
                    own.append(f"advertised.listeners=PLAINTEXT://127.0.0.1:{proxy.port}")
                broker_modes = modes + (list(broken) if index == 0 else [])
                broker_dir = data_dir / f"broker-{index + 1}" if brokers > 1 else data_dir
                started.append(
                    BrokerProcess(broker_dir, *own, broken=broker_modes, env=env, port=port)
                )
            session_timeout_s = lease_ttl_s = 0.0
            if brokers > 1:
                config = load_config(None, started[0].overrides, environment={})
                session_timeout_s = config.broker_session_timeout_ms / 1000
                lease_ttl_s = max(2, math.ceil(config.controller_lease_ttl_ms / 1000))
            for broker in started:
                broker.spawn()
            for broker in started:
                broker.wait_serving()
        except BaseException:
            _stop_brokers(started, None)
            for close in reversed(closers):
                close()
            raise
        return cls(
            started,
            tcp_proxies,
            s3_proxy,
            etcd,
            session_timeout_s,
            lease_ttl_s,
            closers,
            metadata_path,
            zone_router,
        )

    def close(self) -> None:
        try:
            if self.etcd is not None:
                self.etcd.resume()  # brokers stopping need it
            controller = self.controller() if self.cluster else None
            _stop_brokers(self.brokers, controller)
            if self.etcd is not None and self.metadata_path is not None:
                from automq_ref.checker.metadata_dump import dump_metadata

                dump_metadata(self.etcd.endpoint, CLUSTER_ID, self.metadata_path)
        finally:
            for close in reversed(self._closers):
                close()


def _stop_brokers(brokers: list[BrokerProcess], controller: int | None) -> None:
    """Stop every running broker gracefully, the active controller (node id) last so the
    others' controlled shutdowns find it; one that does not stop in time is killed."""
    running = [
        (index + 1, broker) for index, broker in enumerate(brokers) if broker.process is not None
    ]
    waves = [
        [broker for node_id, broker in running if node_id != controller],
        [broker for node_id, broker in running if node_id == controller],
    ]
    for wave in waves:
        for broker in wave:
            broker.resume()  # a stop while paused would wait forever
            if broker.alive():
                broker.terminate()
        for broker in wave:
            broker.wait_stopped()


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


@dataclass(frozen=True)
class Injected:
    """A fault in force: what was done (``detail``), to what (``target``: "" with one broker),
    how long it lasts (``length_s``; None: the schedule's length) and how to undo it."""

    detail: str
    heal: Callable[[], None]
    target: str = ""
    length_s: float | None = None
    # What the fault turned out to do, asked once it healed (added to the window's detail).
    outcome: Callable[[], str] | None = None


class Nemesis(ABC):
    """One kind of fault. ``inject`` breaks something and returns the :class:`Injected` fault,
    whose ``heal`` undoes it. Both run on the nemesis thread, one fault at a time."""

    name: ClassVar[str]
    broker_overrides: ClassVar[tuple[str, ...]] = ()
    broken: ClassVar[tuple[str, ...]] = ()  # the checker's broker modes it needs
    needs_cluster: ClassVar[bool] = False
    needs_s3: ClassVar[bool] = False  # the brokers' objects in moto behind the S3 fault proxy
    needs_proxies: ClassVar[bool] = False  # a TCP proxy in front of each broker
    needs_zone_router: ClassVar[bool] = False  # the router on, clients declaring zones

    @abstractmethod
    def inject(self, env: Environment, rng: random.Random) -> Injected: ...


class Kill(Nemesis):
    name = "kill"

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        index = env.pick(rng)
        target = env.name(index, env.controller())
        broker = env.brokers[index]
        broker.kill()
        return Injected("SIGKILL", broker.start, target)


class Pause(Nemesis):
    name = "pause"

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        index = env.pick(rng)
        controller = env.controller()
        target = env.name(index, controller)
        broker = env.brokers[index]
        length_s = None
        if env.cluster and rng.random() < 0.5:
            # Past the session; for the active controller also past its lease, since the
            # broker that takes over gives every broker a whole session from then on.
            length_s = env.session_timeout_s + LONG_PAUSE_MARGIN_S
            if controller == index + 1:
                length_s += env.lease_ttl_s
        broker.pause()
        if length_s is None:
            return Injected("SIGSTOP", broker.resume, target)
        return Injected(
            f"SIGSTOP for {length_s:.1f} s, past the {env.session_timeout_s:.0f} s session "
            "(fenced, restarts itself)",
            broker.resume,
            target,
            length_s,
        )


class WalLoss(Nemesis):
    name = "wal-loss"
    broken = ("wal-undo-journal",)

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        from automq_ref.checker.faults import lose_unsynced_tail

        index = env.pick(rng)
        target = env.name(index, env.controller())
        broker = env.brokers[index]
        broker.kill()
        # Its own generator: how many draws the loss takes depends on timing, and the schedule's
        # generator must not depend on timing (one seed, one schedule).
        lost = lose_unsynced_tail(broker.wal_path, random.Random(rng.getrandbits(64)))
        detail = "SIGKILL, unsynced WAL tail lost: " + ", ".join(
            f"{key} {value}" for key, value in sorted(lost.items())
        )
        return Injected(detail, broker.start, target)


class S3Faults(Nemesis):
    name = "s3"
    needs_s3 = True
    # Upload often so that uploads (and their retries) fall inside the fault windows.
    broker_overrides = ("s3.wal.upload.interval.ms=1000", "s3.wal.upload.threshold=1048576")
    MODES = ("503", "latency", "ambiguous")

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        proxy = env.s3_proxy
        assert proxy is not None
        target = "object store" if env.cluster else ""
        mode = rng.choice(self.MODES)
        if mode == "503":
            rate = rng.choice((0.5, 1.0))
            proxy.set_faults(error_rate=rate)
            return Injected(f"503 SlowDown on {rate:.0%} of requests", proxy.heal, target)
        if mode == "latency":
            latency = rng.uniform(0.2, 1.0)
            proxy.set_faults(latency_s=latency)
            return Injected(f"{latency * 1000:.0f} ms latency", proxy.heal, target)
        rate = rng.choice((0.3, 1.0))
        proxy.set_faults(ambiguous_rate=rate)
        return Injected(f"ambiguous success on {rate:.0%} of requests", proxy.heal, target)


class NetFaults(Nemesis):
    name = "net"
    needs_proxies = True
    MODES = ("delay", "partition", "drop", "reset")

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        index = env.pick(rng)
        target = env.name(index, env.controller())
        proxy = env.tcp_proxies[index]
        mode = rng.choice(self.MODES)
        if mode == "delay":
            delay = rng.uniform(0.05, 0.5)
            proxy.set_delay(delay)
            return Injected(f"{delay * 1000:.0f} ms delay", proxy.heal, target)
        if mode == "partition":
            proxy.set_stall(True)
            return Injected("partition (bytes held until healed)", proxy.heal, target)
        if mode == "drop":
            proxy.set_drop(True)
            return Injected("black hole (bytes discarded)", proxy.heal, target)
        return Injected(f"reset {proxy.reset_all()} connections", proxy.heal, target)


class EtcdPause(Nemesis):
    name = "etcd-pause"
    needs_cluster = True

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        etcd = env.etcd
        assert etcd is not None
        length_s = rng.uniform(*ETCD_PAUSE_S)
        etcd.pause()
        return Injected(f"SIGSTOP for {length_s:.1f} s", etcd.resume, "etcd", length_s)


class PausePastSession(Nemesis):
    """The zombie: paused until the controller has fenced it, resumed after a survivor may
    have taken over."""

    name = "pause-past-session"
    needs_cluster = True

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        index = env.pick(rng)
        node_id = index + 1
        controller = env.controller()
        target = env.name(index, controller)
        broker = env.brokers[index]
        before = env.registration(node_id)
        # The controller expires sessions about once a second; when the paused broker is the
        # controller, a new one must first be elected, and it gives every broker a whole session.
        limit_s = 2 * (env.session_timeout_s + LONG_PAUSE_MARGIN_S)
        if controller == node_id:
            limit_s += env.lease_ttl_s
        started = time.monotonic()
        broker.pause()
        fenced_after = _wait_fenced(env, node_id, before, started + limit_s)
        if fenced_after is None:
            detail = (
                f"SIGSTOP for {time.monotonic() - started:.1f} s: no fence in the metadata log "
                f"(session {env.session_timeout_s:.0f} s)"
            )
            return Injected(detail, broker.resume, target, 0.0)
        detail = (
            f"SIGSTOP; fenced {fenced_after:.1f} s in (session {env.session_timeout_s:.0f} s); "
            f"resumed {ZOMBIE_HOLD_S:.0f} s later, a zombie until it sees the fence"
        )
        return Injected(detail, broker.resume, target, ZOMBIE_HOLD_S)


def _wait_fenced(
    env: Environment, node_id: int, before: Registration | None, deadline: float
) -> float | None:
    """Seconds from now-ish until node ``node_id``'s registration ``before`` (read before the
    pause) is fenced in the metadata log (or replaced, which only a fence allows); None when
    the deadline passes first."""
    started = time.monotonic()
    while time.monotonic() < deadline:
        now = env.registration(node_id)
        replaced = now is not None and before is not None and now.node_epoch != before.node_epoch
        if now is not None and (now.fenced or replaced):
            return time.monotonic() - started
        time.sleep(FENCE_POLL_S)
    return None


class GracefulRestart(Nemesis):
    name = "graceful-restart"

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        index = env.pick(rng)
        target = env.name(index, env.controller())
        broker = env.brokers[index]
        started = time.monotonic()
        broker.terminate()
        code = broker.wait_stopped(GRACEFUL_EXIT_S)
        took = time.monotonic() - started
        if code is None:
            detail = f"SIGTERM: not exited within {GRACEFUL_EXIT_S:.0f} s, killed"
        else:
            detail = f"SIGTERM: exited ({code}) after {took:.1f} s"
        return Injected(detail, broker.start, target)


class S3DuringFailover(Nemesis):
    """S3 faults in force while a broker dies, stays down past its session and recovers."""

    name = "s3-faults"
    needs_s3 = True
    broker_overrides = S3Faults.broker_overrides
    MODES = ("put-503", "any-503", "slow-put", "ambiguous-put")

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        proxy = env.s3_proxy
        assert proxy is not None
        mode = rng.choice(self.MODES)
        if mode == "put-503":
            rate = rng.choice((0.5, 1.0))
            proxy.set_faults(error_rate=rate, methods=("PUT",))
            fault = f"503 SlowDown on {rate:.0%} of PUTs"
        elif mode == "any-503":
            proxy.set_faults(error_rate=0.5)
            fault = "503 SlowDown on 50% of requests"
        elif mode == "slow-put":
            latency = rng.uniform(0.5, 2.0)
            proxy.set_faults(latency_s=latency, methods=("PUT",))
            fault = f"PUTs {latency * 1000:.0f} ms slow"
        else:
            rate = rng.choice((0.5, 1.0))
            proxy.set_faults(ambiguous_rate=rate, methods=("PUT",))
            fault = f"ambiguous success on {rate:.0%} of PUTs"
        index = env.pick(rng)
        target = env.name(index, env.controller())
        broker = env.brokers[index]
        broker.kill()
        length_s = None
        down = "killed"
        if env.cluster:
            # Down past its session: the controller fences it, and a failover, where there is
            # one, runs while the store fails.
            length_s = env.session_timeout_s + LONG_PAUSE_MARGIN_S
            down = f"killed for {length_s:.1f} s, past the {env.session_timeout_s:.0f} s session"

        def heal() -> None:
            broker.spawn()
            try:
                time.sleep(RECOVER_UNDER_FAULTS_S)  # it recovers while the store still fails
            finally:
                proxy.heal()
            broker.wait_serving()

        detail = (
            f"{fault}; broker {down}; restarted {RECOVER_UNDER_FAULTS_S:.0f} s before the "
            "store heals"
        )
        return Injected(detail, heal, f"{target}, object store" if target else "", length_s)


def connection_zone(client_id: str) -> str | None:
    """The zone a Kafka connection comes from, by its client id: the one a client declares
    (``automq_az=``), or the zone of the broker whose zone router or snapshot reads opened it;
    None for anything else (a client without a zone)."""
    declared = _DECLARED_ZONE.search(client_id)
    if declared is not None:
        return declared.group(1)
    broker = _BROKER_CLIENT.match(client_id)
    return None if broker is None else f"az{broker.group(1)}"


class ZonePartition(Nemesis):
    """One zone cut off from the others (module docstring): its broker's proxy holds every
    connection from another zone, the other brokers' proxies every connection from it."""

    name = "zone-partition"
    needs_cluster = True
    needs_proxies = True
    needs_zone_router = True

    def inject(self, env: Environment, rng: random.Random) -> Injected:
        zone = f"az{rng.randrange(len(env.brokers)) + 1}"
        length_s = rng.uniform(*ZONE_CUT_S)
        for index, proxy in enumerate(env.tcp_proxies):
            proxy.set_cut(_zone_cut(f"az{index + 1}", zone))
        controller = env.controller()
        inside = f"broker {zone.removeprefix('az')}" + (
            " (active controller)" if controller == int(zone.removeprefix("az")) else ""
        )

        held: dict[int, set[str]] = {}

        def heal() -> None:
            for index, proxy in enumerate(env.tcp_proxies):
                proxy.set_cut(None)
                held[index + 1] = proxy.held_client_ids()

        def outcome() -> str:
            return "held: " + (
                "; ".join(
                    f"into broker {node_id} from {', '.join(sorted(ids))}"
                    for node_id, ids in sorted(held.items())
                    if ids
                )
                or "nothing"
            )

        detail = (
            f"{zone} cut off for {length_s:.1f} s: Kafka connections between it and the other "
            "zones held (clients, zone router, snapshot reads); controller RPC, etcd and S3 not"
        )
        return Injected(detail, heal, f"zone {zone}, {inside}", length_s, outcome)


def _zone_cut(broker_zone: str, cut: str) -> Callable[[str], bool]:
    """Which connections into the broker of ``broker_zone`` a cut of zone ``cut`` holds."""

    def held(client_id: str) -> bool:
        zone = connection_zone(client_id)
        if zone is None:
            return False
        return zone != cut if broker_zone == cut else zone == cut

    return held


NEMESES: dict[str, Nemesis] = {
    nemesis.name: nemesis
    for nemesis in (
        Kill(),
        Pause(),
        WalLoss(),
        S3Faults(),
        NetFaults(),
        EtcdPause(),
        PausePastSession(),
        GracefulRestart(),
        S3DuringFailover(),
        ZonePartition(),
    )
}
# The WALs a checked run's brokers can run on: each its block WAL file, or the object WAL in S3.
WALS = ("file", "s3")
# The nemeses a run against one broker can use (etcd-pause needs a cluster's etcd).
ONE_BROKER_NEMESES = tuple(name for name, nemesis in NEMESES.items() if not nemesis.needs_cluster)
