"""Processes for tests and checks: a broker (``automq-ref serve`` on a free port, data in a
directory) and, for a checked cluster, an etcd member.

It runs through ``automq_ref.checker.serve``, which builds the node with the checker's broken
modes (``broken``: :mod:`automq_ref.checker.broken`) when asked.

``BrokerProcess`` starts the command, waits for its "serving Kafka on HOST:PORT" line, and can
stop it gracefully (SIGTERM), kill it (SIGKILL), pause and resume it (SIGSTOP / SIGCONT) and start
it again on the same data directory and port.

The broker runs with ``-W error::RuntimeWarning``: a RuntimeWarning is a bug of the broker's, so
it raises where it is issued. One kind cannot raise, because the interpreter issues it while it
collects the object: a coroutine dropped without being awaited (an answer the broker lost). It is
printed to the log instead, and :meth:`BrokerProcess.unawaited_coroutines` finds it there.

``EtcdProcess`` is the checker's own etcd member (Debian's ``etcd`` on PATH, never a system
service): free loopback ports, data in a directory it removes when stopped, a log beside it,
paused and resumed by the ``etcd-pause`` nemesis, and killed with the checker if the checker
itself dies (Linux).
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
import time
import urllib.request
from collections.abc import Collection
from pathlib import Path

SERVING = re.compile(r"serving Kafka on ([\d.]+):(\d+)")
START_TIMEOUT_S = 60
ETCD_START_ATTEMPTS = 3
PR_SET_PDEATHSIG = 1
FENCED = "broker fenced"


def free_port() -> int:
    """A port nothing listens on right now (to fix a broker's port before its first start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class BrokerProcess:
    def __init__(
        self,
        data_dir: Path,
        *overrides: str,
        broken: Collection[str] = (),
        env: dict[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.data_dir = data_dir
        self.overrides = overrides
        self.broken = tuple(broken)
        self.env = env or {}
        self.process: subprocess.Popen[str] | None = None
        self.port = port
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def wal_path(self) -> Path:
        """The WAL file (the default ``s3.wal.path``: ``log.dirs``/wal)."""
        return self.data_dir / "wal"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the broker and wait until it serves."""
        self.spawn()
        self.wait_serving()

    def spawn(self) -> None:
        """Start the process without waiting (several brokers of a cluster start together);
        :meth:`wait_serving` then waits for it."""
        # The port is kept across restarts so clients' bootstrap addresses stay valid.
        listener = f"listeners=PLAINTEXT://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-W",
            "error::RuntimeWarning",
            "-m",
            "automq_ref.checker.serve",
            "--override",
            listener,
            "--override",
            f"log.dirs={self.data_dir}",
            "--override",
            "s3.wal.capacity=67108864",
            "--override",
            "group.initial.rebalance.delay.ms=0",
        ]
        for override in self.overrides:
            command += ["--override", override]
        for mode in self.broken:
            command += ["--broken", mode]
        with self.log_path.open("a") as log_file:  # the child has its own descriptor
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                env={**os.environ, **self.env},
            )

    def wait_serving(self) -> None:
        """Until the started process prints where it serves (its port is kept from then on)."""
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            match = SERVING.search(line)
            if match:
                self.port = int(match.group(2))
                return
        raise RuntimeError(
            f"broker did not start; see {self.log_path}:\n{self.log_path.read_text()}"
        )

    def stop(self) -> int:
        """Graceful: SIGTERM, wait for the upload and exit."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.process = None
        return code

    def terminate(self) -> None:
        """SIGTERM without waiting (several brokers stop together); then :meth:`wait_stopped`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 60) -> int | None:
        """The exit code of a terminated broker; None when it had to be killed after
        ``timeout_s``."""
        assert self.process is not None
        try:
            code: int | None = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            code = None
        self.process = None
        return code

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def unawaited_coroutines(self) -> list[str]:
        """The lines of the log that report a coroutine collected without being awaited."""
        if not self.log_path.exists():
            return []
        text = self.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if "was never awaited" in line]

    def fenced_restarts(self) -> int:
        """How often the broker was fenced and started again in its process (its log says)."""
        if not self.log_path.exists():
            return 0
        return self.log_path.read_text(errors="replace").count(FENCED)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


def _die_with_parent() -> None:
    """In the child before exec: be killed when the checker dies (Linux only), so a checker
    killed from outside leaves no etcd behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class EtcdProcess:
    """One etcd member on loopback, its data in ``directory`` and its log at
    ``<directory>.log``; :meth:`stop` kills it and removes ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.log_path = directory.parent / f"{directory.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.client_port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start the member and wait until ``/health`` answers; ports taken between the probe
        and etcd's bind are tried again with fresh ones."""
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError(
                "etcd is not on PATH: a cluster check needs Debian's etcd-server "
                "(apt-get install -y etcd-server)"
            )
        for _ in range(ETCD_START_ATTEMPTS):
            self.client_port, peer_port = free_port(), free_port()
            client_url = f"http://127.0.0.1:{self.client_port}"
            peer_url = f"http://127.0.0.1:{peer_port}"
            with self.log_path.open("ab") as log_file:
                self.process = subprocess.Popen(
                    [
                        binary,
                        "--name=automq-ref-check",
                        f"--data-dir={self.directory}",
                        f"--listen-client-urls={client_url}",
                        f"--advertise-client-urls={client_url}",
                        f"--listen-peer-urls={peer_url}",
                        f"--initial-advertise-peer-urls={peer_url}",
                        f"--initial-cluster=automq-ref-check={peer_url}",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            if self._wait_healthy(f"{client_url}/health"):
                return
            self._kill()
            shutil.rmtree(self.directory, ignore_errors=True)
        raise RuntimeError(f"etcd did not start; see {self.log_path}")

    def _wait_healthy(self, url: str) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(url, timeout=1) as reply,
            ):
                if json.loads(reply.read()).get("health") == "true":
                    return True
            time.sleep(0.05)
        return False

    def range_value(self, key: bytes) -> bytes | None:
        """The value of ``key`` (through etcd's JSON gateway), or None when it is absent or
        etcd does not answer within a second."""
        body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
        request = urllib.request.Request(
            f"http://{self.endpoint}/v3/kv/range", data=body, method="POST"
        )
        with (
            contextlib.suppress(OSError, ValueError, KeyError, IndexError),
            urllib.request.urlopen(request, timeout=1) as reply,
        ):
            return base64.b64decode(json.loads(reply.read())["kvs"][0]["value"])
        return None

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """Kill the member and remove its data (its log stays, beside the brokers')."""
        self._kill()
        shutil.rmtree(self.directory, ignore_errors=True)
