"""One etcd member of our own, for checked clusters, tests and benchmarks: the one launcher both
the checker (``check --brokers N``) and the test fixture (``tests/etcd_fixture.py``) use.

:class:`EtcdMember` runs Debian's ``etcd`` from PATH (never a system service) with its data in a
directory, its client and peer URLs on loopback ports the OS handed out, and its log in a file.
:meth:`EtcdMember.start` waits until ``/health`` answers; ports taken between the probe and etcd's
bind are tried again with fresh ones, on a fresh data directory. The member runs in its own
session and, on Linux, is killed when the process that started it dies, so a checker or test run
killed from outside leaves no etcd behind. :meth:`pause` / :meth:`resume` (SIGSTOP / SIGCONT)
make it unreachable without losing anything (the ``etcd-pause`` nemesis); :meth:`restart` stops
it and starts it again on the same ports and data; :meth:`stop` kills it and removes its data.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

START_ATTEMPTS = 3
PR_SET_PDEATHSIG = 1
# What a missing binary's error says to do, unless the caller says better.
INSTALL_HINT = "apt-get install -y etcd-server"


def free_port() -> int:
    """A port nothing listens on right now (to fix a process's port before its first start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def die_with_parent() -> None:
    """In a child before exec: be killed when the parent dies (Linux only), so a parent killed
    from outside (a timeout, SIGKILL) leaves no child behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def etcd_binary(hint: str = INSTALL_HINT) -> str:
    """The etcd on PATH; a clear failure naming ``hint`` (how to install it) when missing."""
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError(f"etcd is not on PATH: {hint}")
    return found


class EtcdMember:
    """One etcd member on loopback; ``endpoint`` is ``host:port`` of its client URL."""

    def __init__(
        self,
        data_dir: Path,
        *extra_args: str,
        log_path: Path | None = None,
        name: str = "automq-ref",
        start_timeout_s: float = 60,
        install_hint: str = INSTALL_HINT,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = extra_args
        # By default beside the data: ``<data_dir>.log``.
        self.log_path = log_path or self.data_dir.parent / f"{self.data_dir.name}.log"
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.install_hint = install_hint
        self.process: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.peer_port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> EtcdMember:
        """Start the member and wait until it is healthy. Ports already chosen (a restart) are
        kept; ports that turn out taken are replaced with fresh ones, on fresh data."""
        binary = etcd_binary(self.install_hint)
        for _ in range(START_ATTEMPTS):
            if not self.client_port:
                self.client_port, self.peer_port = free_port(), free_port()
            client_url = f"http://127.0.0.1:{self.client_port}"
            peer_url = f"http://127.0.0.1:{self.peer_port}"
            command = [
                binary,
                f"--name={self.name}",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster={self.name}={peer_url}",
                *self.extra_args,
            ]
            with self.log_path.open("ab") as log_file:  # the child has its own descriptor
                self.process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            if self._wait_healthy():
                return self
            self.kill()
            self.client_port = self.peer_port = 0
            shutil.rmtree(self.data_dir, ignore_errors=True)
        raise RuntimeError(f"etcd did not start; see {self.log_path}:\n{self._log_tail()}")

    def _wait_healthy(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
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
        """SIGCONT, when the member runs (a no-op otherwise)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Stop the member (SIGTERM) and start it again on the same ports and data."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None
        self.start()

    def kill(self) -> None:
        """SIGKILL the member's whole session; its data stays."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """Kill the member and remove its data (its log stays)."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
