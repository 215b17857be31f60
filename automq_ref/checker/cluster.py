"""Processes for tests and checks: a broker (``automq-ref serve`` on a free port, data in a
directory) and, for a checked cluster, an etcd member (:class:`EtcdProcess`, the checker's
settings of the shared launcher in :mod:`automq_ref.checker.etcd_member`).

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

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

from automq_ref.checker.etcd_member import EtcdMember, free_port

SERVING = re.compile(r"serving Kafka on ([\d.]+):(\d+)")
START_TIMEOUT_S = 60
FENCED = "broker fenced"
__all__ = ["FENCED", "SERVING", "BrokerProcess", "EtcdProcess", "free_port"]


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


class EtcdProcess(EtcdMember):
    """The checker's etcd member: its data in ``directory`` and its log at
    ``<directory>.log``; :meth:`stop` kills it and removes ``directory``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(
            directory,
            name="automq-ref-check",
            start_timeout_s=START_TIMEOUT_S,
            install_hint="a cluster check needs Debian's etcd-server "
            "(apt-get install -y etcd-server)",
        )

    @property
    def directory(self) -> Path:
        return self.data_dir
