"""``automq-ref cluster`` (``make cluster``): a three-broker cluster on one machine, in one command.

It starts, as child processes, one etcd member (the metadata quorum), an S3 server (moto) with
one bucket (the shared object store) and three ``automq-ref serve`` brokers: node ids 1, 2, 3 in
racks ``az1``, ``az2``, ``az3``, Kafka on three consecutive ports from ``--base-port`` (9092; 0:
each broker binds a free port of its own, read back from its log, which is how tests and
benchmarks start clusters: a port probed free and handed to a broker later could meanwhile be
taken by any outgoing connection, since both come from the OS's ephemeral range), each
with its data and log under ``--data-dir`` (``./data/cluster``), and the zone router's channel in
the bucket (``automq.zonerouter.channels``), so that Metadata answers a client by its zone.
Once all three accept Kafka connections it prints ``bootstrap.servers=...`` and waits. SIGINT or
SIGTERM stops everything gracefully: the brokers that are not the active controller first, then
the controller (so the others' last requests still find one), then etcd and moto. A child that
dies on its own stops the rest, and the command exits 1 naming it.

Each broker's WAL is, by default, the object WAL in the bucket (its keys are per node). With
``--wal device`` each broker's block WAL lives on a WAL device process of its own instead
(:mod:`automq_ref.io.storage.wal_device`, the stand-in for an EBS volume multi-attached with
NVMe reservations): one child per broker, serving a file under ``--data-dir``
(``wal-device-N/wal``) on a free loopback port, started before the brokers and stopped after
them. A broker killed there is failed over like one on the object WAL: a survivor preempts the
reservation on the dead broker's device, recovers and uploads what it holds.

moto keeps its objects in memory, so a cluster cannot outlive its run: every start begins with
an empty ``--data-dir``. The launcher installs nothing; ``make cluster`` installs etcd and moto
when they are missing. Every child runs in a session of its own, so a Ctrl-C in the terminal
reaches only the launcher, which stops the children in order, and (on Linux) a child is killed
when the launcher dies, so a launcher killed from outside leaves nothing running.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from automq_ref.config import ConfigError, load_config
from automq_ref.io.metadata.election import election_key
from automq_ref.netzones import REGION as REGION_NS
from automq_ref.netzones import ZoneNetwork, ZoneNetworkError

BROKERS = 3
DEFAULT_BASE_PORT = 9092
DEFAULT_DATA_DIR = Path("data/cluster")
CLUSTER_ID = "automq-ref-cluster"
BUCKET = "automq-ref"
REGION = "us-east-1"
# moto accepts any credentials; the brokers' S3 client needs some.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "automq-ref", "AWS_SECRET_ACCESS_KEY": "automq-ref"}
WAL_KINDS = ("object", "device")
# Each WAL device's file (allocated when the device starts); a broker's WAL capacity
# (s3.wal.capacity) is cut to it.
WAL_DEVICE_BYTES = 256 * 1024 * 1024
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05
PR_SET_PDEATHSIG = 1
PREFIX = "automq-ref cluster:"
SERVING = re.compile(r"serving Kafka on \S+:(\d+)")
METRICS = re.compile(r"metrics on (\S+)")
DEFAULT_METRICS_BASE_PORT = 9464


class LaunchError(Exception):
    """The cluster cannot start: one line saying what and what to do."""


def _die_with_parent() -> None:
    """In the child before exec: be killed when the launcher dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _accepts(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
        return True
    return False


def wal_device_command(path: Path, size_bytes: int, listen: str = "127.0.0.1:0") -> list[str]:
    """The command running a WAL device process on ``path`` (port 0: a free one)."""
    return [
        sys.executable,
        "-m",
        "automq_ref.io.storage.wal_device",
        "--path",
        str(path),
        "--size",
        str(size_bytes),
        "--listen",
        listen,
    ]


def wal_device_address(output: str) -> str | None:
    """The address a WAL device process printed it listens on, once it did."""
    found = re.search(r"^wal-device listening (\S+)$", output, re.MULTILINE)
    return found.group(1) if found else None


def _http(method: str, url: str, body: bytes | None = None, timeout_s: float = 2.0) -> bytes:
    request = urllib.request.Request(url, data=body, method=method)
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        data: bytes = reply.read()
        return data


@dataclass(slots=True)
class Child:
    """One process of the cluster, its output in ``log_path``."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
            return "\n".join(f"  | {line}" for line in text)
        return "  | (no log)"

    def terminate(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)  # a paused child cannot stop
                self.process.terminate()

    def wait_stopped(self, timeout_s: float) -> int | None:
        """Its exit code, or None when it had to be killed after ``timeout_s``."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None


@dataclass
class ClusterSettings:
    data_dir: Path = DEFAULT_DATA_DIR
    base_port: int = DEFAULT_BASE_PORT
    overrides: tuple[str, ...] = ()
    start_timeout_s: float = START_TIMEOUT_S
    # `make cluster` runs three; the cluster benchmark also runs one, on the same etcd and S3.
    brokers: int = BROKERS
    wal: str = "object"  # one of WAL_KINDS: the object WAL in the bucket, or WAL devices
    wal_device_bytes: int = WAL_DEVICE_BYTES
    # In a three-zone network (`--zones`): broker N in zone azN's namespace on its address,
    # etcd and S3 in the region's; None runs everything on loopback.
    network: ZoneNetwork | None = None
    # With base_port 0, the port each broker bound (read from its log once it serves).
    bound: dict[int, int] = field(default_factory=dict)
    # Each broker's Prometheus endpoint on this port and the next ones (with base_port 0: a free
    # port each); None: no metrics.
    metrics_base_port: int | None = DEFAULT_METRICS_BASE_PORT
    # The endpoints' URLs, by node id (read from the brokers' logs once they serve).
    metrics_urls: dict[int, str] = field(default_factory=dict)

    @property
    def metrics_ports(self) -> list[int]:
        """Each broker's metrics port (0: a free one), by node id from 1; empty: none."""
        if self.metrics_base_port is None:
            return []
        if self.base_port == 0 or self.metrics_base_port == 0:
            return [0] * self.brokers
        return [self.metrics_base_port + index for index in range(self.brokers)]

    @property
    def ports(self) -> list[int]:
        """Each broker's port, by node id from 1 (with base_port 0: 0 until it serves)."""
        if self.base_port == 0:
            return [self.bound.get(node_id, 0) for node_id in range(1, self.brokers + 1)]
        return [self.base_port + index for index in range(self.brokers)]

    def host(self, node_id: int) -> str:
        """The address broker ``node_id`` listens on."""
        return "127.0.0.1" if self.network is None else self.network.zone_address(f"az{node_id}")

    @property
    def service_host(self) -> str:
        """The address etcd and S3 listen on."""
        return "127.0.0.1" if self.network is None else self.network.region_address

    @property
    def bootstrap(self) -> str:
        return ",".join(
            f"{self.host(node_id)}:{port}" for node_id, port in enumerate(self.ports, start=1)
        )

    def where(self, name: str) -> str:
        """The namespace a child runs in: its broker's zone, else the region."""
        return f"az{name.removeprefix('broker-')}" if name.startswith("broker-") else REGION_NS

    @contextlib.contextmanager
    def reach(self, where: str) -> Iterator[None]:
        """Run the block where the launcher can reach a child in ``where``."""
        if self.network is None:
            yield
        else:
            with self.network.inside(where):
                yield


@dataclass
class LocalCluster:
    """The children of one ``automq-ref cluster`` run; :meth:`start`, then :meth:`serve`."""

    settings: ClusterSettings
    stopping: threading.Event
    say: Callable[[str], None]
    etcd: Child | None = None
    moto: Child | None = None
    brokers: dict[int, Child] = field(default_factory=dict)
    devices: dict[int, Child] = field(default_factory=dict)
    device_addresses: dict[int, str] = field(default_factory=dict)
    etcd_endpoint: str = ""
    s3_endpoint: str = ""

    @property
    def children(self) -> Iterator[Child]:
        yield from self.brokers.values()
        yield from self.devices.values()
        if self.etcd is not None:
            yield self.etcd
        if self.moto is not None:
            yield self.moto

    def broker_overrides(self, node_id: int) -> list[str]:
        """The settings of broker ``node_id``: the cluster's, then the user's (which win)."""
        port = self.settings.ports[node_id - 1]
        bucket = f"{BUCKET}?region={REGION}&endpoint={self.s3_endpoint}&pathStyle=true"
        if self.settings.wal == "device":
            # Its own WAL device; before the devices run (the settings' check), a stand-in.
            wal = f"0@device://{self.device_addresses.get(node_id, '127.0.0.1:1')}"
        else:
            # The object WAL in the shared bucket (its keys are per node).
            wal = f"0@s3://{bucket}"
        return [
            # Either way any survivor can reach a dead broker's WAL and take it over.
            f"s3.wal.path={wal}",
            f"node.id={node_id}",
            f"broker.rack=az{node_id}",
            f"cluster.id={CLUSTER_ID}",
            f"listeners=PLAINTEXT://{self.settings.host(node_id)}:{port}",
            f"log.dirs={self.settings.data_dir / f'broker-{node_id}'}",
            f"metadata.etcd.endpoints={self.etcd_endpoint}",
            f"s3.data.buckets=0@s3://{bucket}",
            # The zone router on, its channel in the same bucket: a client declaring its zone
            # (client.id=automq_az=az2) is told its zone's broker leads every partition.
            f"automq.zonerouter.channels=0@s3://{bucket}",
            *(
                [
                    "s3.telemetry.metrics.exporter.uri=prometheus://?host="
                    f"{self.settings.host(node_id)}&port={self.settings.metrics_ports[node_id - 1]}"
                ]
                if self.settings.metrics_ports
                else []
            ),
            *self.settings.overrides,
        ]

    def _spawn(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.settings.data_dir / f"{name}.log"
        if self.settings.network is not None:
            command = self.settings.network.command(self.settings.where(name), command)
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only
                preexec_fn=_die_with_parent,
                env=env,
            )
        return Child(name, process, log_path)

    def _wait_until(self, what: str, ready: Callable[[], bool], children: Sequence[Child]) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not ready():
            for child in children:
                if not child.alive():
                    raise LaunchError(
                        f"{child.name} exited with code {child.process.returncode} while "
                        f"starting; its log ({child.log_path}):\n{child.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{what} not ready after {self.settings.start_timeout_s:.0f} s; see "
                    + ", ".join(str(child.log_path) for child in children)
                )
            if self.stopping.wait(POLL_S):
                raise InterruptedError

    def start(self) -> None:
        """Start etcd, moto (and its bucket) and the brokers; return once all three serve.
        Raises :class:`LaunchError`, or InterruptedError when a signal came first."""
        shutil.rmtree(self.settings.data_dir, ignore_errors=True)
        self.settings.data_dir.mkdir(parents=True)
        self._start_etcd()
        self._start_moto()
        if self.settings.wal == "device":
            self._start_devices()
        for node_id in range(1, self.settings.brokers + 1):
            command = [sys.executable, "-m", "automq_ref.cli", "serve"]
            for override in self.broker_overrides(node_id):
                command += ["--override", override]
            env = {**os.environ, **S3_CREDENTIALS}
            self.brokers[node_id] = self._spawn(f"broker-{node_id}", command, env)

        def serves(node_id: int, child: Child) -> bool:
            serving = SERVING.search(child.log_path.read_text(errors="replace"))
            if serving is None:
                return False
            if self.settings.base_port == 0:
                self.settings.bound[node_id] = int(serving.group(1))
            metrics = METRICS.search(child.log_path.read_text(errors="replace"))
            if metrics is not None:
                self.settings.metrics_urls[node_id] = metrics.group(1)
            with self.settings.reach(f"az{node_id}"):
                return _accepts(self.settings.ports[node_id - 1], self.settings.host(node_id))

        def all_serve() -> bool:
            return all(serves(node_id, child) for node_id, child in self.brokers.items())

        self._wait_until("the brokers", all_serve, list(self.children))
        for node_id, child in self.brokers.items():
            port = self.settings.ports[node_id - 1]
            address = f"{self.settings.host(node_id)}:{port}"
            zone = "" if self.settings.network is None else f" in zone az{node_id}"
            metrics = self.settings.metrics_urls.get(node_id)
            self.say(
                f"broker {node_id} (rack az{node_id}){zone} on {address}, log {child.log_path}"
                + (f", metrics {metrics}" if metrics else "")
            )

    def _start_etcd(self) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise LaunchError(
                "etcd is not on PATH; `make cluster` installs Debian's etcd-server "
                "(or run `apt-get install -y etcd-server`)"
            )
        host = self.settings.service_host
        client_url = f"http://{host}:{free_port()}"
        peer_url = f"http://{host}:{free_port()}"
        self.etcd_endpoint = client_url.removeprefix("http://")
        self.etcd = self._spawn(
            "etcd",
            [
                binary,
                "--name=automq-ref",
                f"--data-dir={self.settings.data_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=automq-ref={peer_url}",
            ],
        )

        def healthy() -> bool:
            with contextlib.suppress(OSError, ValueError), self.settings.reach(REGION_NS):
                reply = json.loads(_http("GET", f"{client_url}/health", timeout_s=1))
                return bool(reply.get("health") == "true")
            return False

        self._wait_until("etcd", healthy, [self.etcd])
        self.say(f"etcd on {self.etcd_endpoint}, log {self.etcd.log_path}")

    def _start_moto(self) -> None:
        port, host = free_port(), self.settings.service_host
        self.s3_endpoint = f"http://{host}:{port}"
        self.moto = self._spawn(
            "s3-moto", [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
        )

        def bucket_created() -> bool:
            with contextlib.suppress(OSError), self.settings.reach(REGION_NS):
                _http("PUT", f"{self.s3_endpoint}/{BUCKET}", b"")
                return True
            return False

        self._wait_until("the S3 server (moto)", bucket_created, [self.moto])
        self.say(f"S3 (moto) on {self.s3_endpoint}, bucket {BUCKET}, log {self.moto.log_path}")

    def _start_devices(self) -> None:
        for node_id in range(1, self.settings.brokers + 1):
            home = self.settings.data_dir / f"wal-device-{node_id}"
            home.mkdir()
            command = wal_device_command(home / "wal", self.settings.wal_device_bytes)
            self.devices[node_id] = self._spawn(f"wal-device-{node_id}", command)

        def all_listen() -> bool:
            for node_id, child in self.devices.items():
                address = wal_device_address(child.log_path.read_text(errors="replace"))
                if address is None:
                    return False
                self.device_addresses[node_id] = address
            return True

        self._wait_until("the WAL devices", all_listen, list(self.devices.values()))
        for node_id, child in self.devices.items():
            self.say(
                f"WAL device of broker {node_id} on {self.device_addresses[node_id]}, "
                f"log {child.log_path}"
            )

    def controller(self) -> int | None:
        """The node id in etcd's election key (through etcd's JSON gateway), or None."""
        key = base64.b64encode(election_key(CLUSTER_ID)).decode()
        url = f"http://{self.etcd_endpoint}/v3/kv/range"
        with (
            contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError),
            self.settings.reach(REGION_NS),
        ):
            reply = json.loads(_http("POST", url, json.dumps({"key": key}).encode()))
            value = json.loads(base64.b64decode(reply["kvs"][0]["value"]))
            return int(value["node_id"])
        return None

    def serve(self) -> int:
        """Wait for a signal (exit 0) or a child's death (exit 1), then stop everything."""
        while not self.stopping.wait(0.2):
            dead = [child for child in self.children if not child.alive()]
            if dead:
                for child in dead:
                    self.say(
                        f"{child.name} exited on its own with code {child.process.returncode}; "
                        f"its log ({child.log_path}):\n{child.log_tail()}"
                    )
                self.say("stopping the rest")
                self.stop()
                return 1
        return 0 if self.stop() else 1

    def stop(self) -> bool:
        """Stop every child still running, brokers first and the controller last among them;
        True when every broker stopped gracefully (exit 0 within the timeout)."""
        graceful = True
        running = {node_id: child for node_id, child in self.brokers.items() if child.alive()}
        controller = self.controller() if self.etcd is not None and self.etcd.alive() else None
        waves = [[n for n in running if n != controller], [n for n in running if n == controller]]
        if running:
            order = ", ".join(str(n) for n in waves[0])
            last = f", then the active controller {controller}" if waves[1] else ""
            devices = "the WAL devices, " if self.devices else ""
            self.say(f"stopping brokers {order}{last}, then {devices}etcd and S3")
        for wave in waves:
            for node_id in wave:
                running[node_id].terminate()
            for node_id in wave:
                code = running[node_id].wait_stopped(STOP_TIMEOUT_S)
                if code != 0:
                    graceful = False
                    how = "was killed" if code is None else f"exited with code {code}"
                    self.say(f"broker {node_id} {how} while stopping; see its log")
        for child in self.brokers.values():
            if child.process.returncode is None:  # exited before the stop: collect it
                child.process.wait()
        # The WAL devices outlive their brokers: a broker's graceful stop writes its WAL last.
        for service in (*self.devices.values(), self.etcd, self.moto):
            if service is not None:
                service.terminate()
                service.wait_stopped(STOP_TIMEOUT_S)
        return graceful


def run(settings: ClusterSettings, out: IO[str] = sys.stdout) -> int:
    """The command: start, print the bootstrap line, serve until a signal; the exit code."""

    def say(line: str) -> None:
        print(f"{PREFIX} {line}", file=out, flush=True)

    if settings.wal not in WAL_KINDS:
        print(f"{PREFIX} --wal must be one of {', '.join(WAL_KINDS)}", file=sys.stderr)
        return 2
    if settings.network is not None and settings.wal != "object":
        print(f"{PREFIX} --zones runs the brokers on the object WAL only", file=sys.stderr)
        return 2
    try:
        load_config(overrides=LocalCluster(settings, threading.Event(), say).broker_overrides(1))
    except ConfigError as error:
        for problem in error.problems:
            print(f"{PREFIX} {problem}", file=sys.stderr)
        return 2
    # In zones the brokers listen on the zones' own addresses, never on the host's.
    taken = [
        port
        for port in [*settings.ports, *settings.metrics_ports]
        if port and settings.network is None and _port_taken(port)
    ]
    if taken:
        print(
            f"{PREFIX} 127.0.0.1:{taken[0]} is in use (a broker of `make run` or an earlier "
            "cluster?); stop it or choose other ports with --base-port or --metrics-base-port",
            file=sys.stderr,
        )
        return 2
    stopping = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stopping.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    cluster = LocalCluster(settings, stopping, say)
    network = settings.network
    try:
        if network is not None:
            try:
                network.build()
            except ZoneNetworkError as error:
                print(f"{PREFIX} --zones: {error}", file=sys.stderr)
                return 2
            say(
                f"zones az1-az{settings.brokers} in namespaces {network.namespace('az1')} ..., "
                f"etcd and S3 in {network.namespace(REGION_NS)} on {network.region_address}"
            )
        say(
            f"a fresh cluster in {settings.data_dir} (moto keeps its objects in memory, so "
            "nothing outlives a run)"
        )
        started_s = time.monotonic()
        try:
            cluster.start()
        except LaunchError as error:
            print(f"{PREFIX} {error}", file=sys.stderr)
            cluster.stop()
            return 1
        except InterruptedError:
            say("stopped while starting")
            cluster.stop()
            return 0
        controller = cluster.controller()
        if controller is not None:
            say(f"broker {controller} is the active controller")
        say(f"all {settings.brokers} brokers serve after {time.monotonic() - started_s:.1f} s")
        print(f"bootstrap.servers={settings.bootstrap}", file=out, flush=True)
        if network is not None:
            say("the addresses are reachable inside the zones only; a client in zone az1:")
            say(f"  ip netns exec {network.namespace('az1')} kcat -b {settings.bootstrap} -L")
            say(
                f"  (zones az2, az3: {network.namespace('az2')}, {network.namespace('az3')}; "
                f"cross-zone bytes: ip -n {network.namespace('xz')} -s link)"
            )
        say("Ctrl-C (or SIGTERM) stops the cluster")
        code = cluster.serve()
        say("stopped" if code == 0 else "stopped after a failure")
        return code
    finally:
        if network is not None:
            cluster.stop()
            network.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
