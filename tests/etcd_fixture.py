"""A real etcd server for tests and benchmarks: its own process, free loopback ports, a temp data
directory, stopped and removed however the test ends.

The tests run against Debian's ``etcd`` binary (``etcd-server``; ``make test`` installs it when it
is missing), never a system service: :class:`EtcdServer` starts its own member with
``--data-dir``, ``--listen-client-urls`` and ``--listen-peer-urls`` on ports the OS handed out,
waits for ``/health`` to answer, and :meth:`EtcdServer.stop` kills it and deletes the directory
(a member whose test process is killed from outside dies with it, on Linux).
:meth:`pause` / :meth:`resume` (SIGSTOP / SIGCONT) make it unreachable without losing anything.

``ETCD_PREFIX`` gives each test a key prefix of its own, so one server serves a whole module.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 30
PR_SET_PDEATHSIG = 1
START_ATTEMPTS = 3


def etcd_binary() -> str:
    """The etcd on PATH; a clear failure when it is missing (``make test`` installs it)."""
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError(
            "etcd is not on PATH: `make pytest` installs Debian's etcd-server "
            "(or run `apt-get install -y etcd-server`)"
        )
    return found


def _die_with_parent() -> None:
    """In the child before exec: on Linux, be killed when the test process dies, so a test run
    killed from outside (a timeout, SIGKILL) leaves no etcd behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class EtcdServer:
    """One etcd member on loopback; ``endpoint`` is ``host:port`` of its client URL."""

    def __init__(self, directory: Path | None = None, *extra_args: str) -> None:
        self._owns_directory = directory is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="etcd-")) if directory is None else Path(directory)
        )
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.peer_port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "etcd.log"

    def start(self) -> EtcdServer:
        """Start the member and wait until it is healthy (ports that turn out taken between
        the probe and etcd's bind are retried with fresh ones)."""
        binary = etcd_binary()
        for _ in range(START_ATTEMPTS):
            if not self.client_port:
                self.client_port, self.peer_port = _free_port(), _free_port()
            client_url = f"http://127.0.0.1:{self.client_port}"
            peer_url = f"http://127.0.0.1:{self.peer_port}"
            command = [
                binary,
                "--name",
                "automq-ref-test",
                "--data-dir",
                str(self.directory / "data"),
                "--listen-client-urls",
                client_url,
                "--advertise-client-urls",
                client_url,
                "--listen-peer-urls",
                peer_url,
                "--initial-advertise-peer-urls",
                peer_url,
                "--initial-cluster",
                f"automq-ref-test={peer_url}",
                *self.extra_args,
            ]
            log_file = self.log_path.open("ab")
            try:
                self.process = subprocess.Popen(
                    command,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            finally:
                log_file.close()
            if self._wait_healthy():
                return self
            self._kill()
            # Taken ports (or anything else): fresh ports on a fresh data directory.
            self.client_port = self.peer_port = 0
            shutil.rmtree(self.directory / "data", ignore_errors=True)
        raise RuntimeError(f"etcd did not start; see {self.log_path}:\n{self._log_tail()}")

    def _wait_healthy(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"http://127.0.0.1:{self.client_port}/health"
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

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stop the member (SIGTERM) and start it again on the same ports and data."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None
        self.start()

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """Kill the member and remove its directory (when this server made it)."""
        self._kill()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_etcd(*extra_args: str) -> Iterator[EtcdServer]:
    """An etcd member for the ``with`` block."""
    server = EtcdServer(None, *extra_args)
    try:
        yield server.start()
    finally:
        server.stop()


def unique_cluster_id(prefix: str = "test") -> str:
    """A cluster id no other test uses: each test gets its own key range on a shared server."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
