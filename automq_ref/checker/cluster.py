"""A broker process for tests and checks: ``automq-ref serve`` on a free port, data in a directory.

It runs through ``automq_ref.checker.serve``, which builds the node with the checker's broken
modes (``broken``: :mod:`automq_ref.checker.broken`) when asked.

``BrokerProcess`` starts the command, waits for its "serving Kafka on HOST:PORT" line, and can
stop it gracefully (SIGTERM), kill it (SIGKILL), pause and resume it (SIGSTOP / SIGCONT) and start
it again on the same data directory and port.

The broker runs with ``-W error::RuntimeWarning``: a RuntimeWarning is a bug of the broker's, so
it raises where it is issued. One kind cannot raise, because the interpreter issues it while it
collects the object: a coroutine dropped without being awaited (an answer the broker lost). It is
printed to the log instead, and :meth:`BrokerProcess.unawaited_coroutines` finds it there.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

SERVING = re.compile(r"serving Kafka on ([\d.]+):(\d+)")
START_TIMEOUT_S = 60


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
        log_file = self.log_path.open("a")
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env={**os.environ, **self.env},
        )
        assert self.process.stdout is not None
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

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
