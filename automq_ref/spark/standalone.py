"""A Spark standalone cluster on this machine: one master and N workers, for tests and people.

The ``automq`` and ``automq-objects`` sources and ``automq-ref verify`` run on any Spark master;
this module starts a real cluster to run them on, so that executors are separate JVMs with their
own Python workers, as on a cluster of machines, and not threads of the driver as on
``local[*]``. The pyspark wheel ships ``bin/spark-class`` but not Spark's ``sbin/start-*.sh``
scripts, so each daemon is started with ``spark-class`` itself::

    SPARK_HOME=<pyspark package> SPARK_LOCAL_IP=127.0.0.1 \\
        spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    SPARK_HOME=<pyspark package> SPARK_LOCAL_IP=127.0.0.1 \\
        spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P \\
        --cores 1 --memory 1g --webui-port 0 --work-dir DIR

:func:`start_cluster` does that on free ports, waits until the master's JSON status
(``http://HOST:W/json/``) lists every worker alive, and returns a :class:`StandaloneCluster`
whose :meth:`~StandaloneCluster.stop` ends the daemons and the executors they started (each
daemon leads its own process group; executors are the workers' children) and removes the
directory it made. ``python -m automq_ref.spark.standalone`` does the same for a person: it
prints ``spark.master=spark://...`` and runs until Ctrl-C or SIGTERM.

The daemons inherit this process's environment, so executors started by the workers see the same
``PYTHONPATH`` (the project importable); ``PYSPARK_PYTHON`` defaults to this interpreter. The
master's REST submission server is turned off: it would take the fixed port 6066.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 20


class StandaloneError(RuntimeError):
    """The cluster did not start (a daemon exited, or the workers never registered)."""


def spark_home() -> Path:
    """The pyspark package folder: it holds ``bin/spark-class`` and Spark's jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just handed out and released (another process could take it first)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class StandaloneCluster:
    """A running master and its workers; a context manager that stops them on exit."""

    host: str
    port: int
    webui_port: int
    directory: Path  # daemon logs and the workers' work dirs
    workers: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    owns_directory: bool = False

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def worker_dir(self, index: int) -> Path:
        """Where worker ``index`` (from 1) puts its executors' directories."""
        return self.directory / f"worker-{index}"

    def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The master's JSON status: workers, alive workers, active and completed apps."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=timeout_s) as answer:
            document: dict[str, Any] = json.load(answer)
        return document

    def alive_workers(self) -> int:
        try:
            return int(self.status().get("aliveworkers", 0))
        except (OSError, ValueError):  # the web UI is not up yet
            return 0

    def wait_for_workers(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            for process in self.processes:
                if process.poll() is not None:
                    raise StandaloneError(
                        f"a Spark daemon exited with {process.returncode}:\n{self.log_tails()}"
                    )
            if time.monotonic() > deadline:
                raise StandaloneError(
                    f"{self.alive_workers()} of {self.workers} workers registered with "
                    f"{self.master_url} after {timeout_s:.0f} s:\n{self.log_tails()}"
                )
            time.sleep(0.5)

    def log_tails(self) -> str:
        tails = []
        for log in sorted(self.directory.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every daemon's process group (workers first: their executors are in their
        group), SIGKILL to what is left after ``timeout_s``; then the directory is removed if
        this cluster made it. Safe to call twice."""
        for process in reversed(self.processes):  # the master was started first
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            _signal_group(process, signal.SIGKILL)  # executors outliving their worker, too
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self.processes.clear()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen[bytes], number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, number)


def daemon_environment(host: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus what the daemons need: ``SPARK_HOME``, the address to
    bind, small daemon heaps, no REST server, and this interpreter for Python workers."""
    environment = dict(os.environ)
    environment.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": host,
            "SPARK_MASTER_OPTS": (
                environment.get("SPARK_MASTER_OPTS", "") + " -Dspark.master.rest.enabled=false"
            ).strip(),
        }
    )
    environment.setdefault("SPARK_DAEMON_MEMORY", "256m")  # master and worker heaps, not executors
    environment.setdefault("PYSPARK_PYTHON", sys.executable)
    environment.update(env or {})
    return environment


def _spawn(
    arguments: Sequence[str], log: Path, environment: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *arguments],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(environment),
            start_new_session=True,  # its own process group, killed as one in stop()
        )


def start_cluster(
    workers: int = 2,
    *,
    cores: int = 1,
    memory: str = "1g",
    host: str = "127.0.0.1",
    port: int = 0,
    webui_port: int = 0,
    directory: Path | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    timeout_s: float = START_TIMEOUT_S,
) -> StandaloneCluster:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) and, if ``wait``,
    wait until all registered (otherwise call ``wait_for_workers`` before using it: the JVMs
    take seconds to start, which other work can overlap). Port 0 means a free one. Logs go to
    ``directory`` (a new temporary directory, removed by ``stop``, when None); ``env`` is added
    to the daemons' environment."""
    if workers < 1:
        raise ValueError("a cluster needs at least one worker")
    owns = directory is None
    root = Path(tempfile.mkdtemp(prefix="spark-standalone-")) if directory is None else directory
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()  # as executors see their working directories
    cluster = StandaloneCluster(
        host=host,
        port=port or free_port(host),
        webui_port=webui_port or free_port(host),
        directory=root,
        workers=workers,
        owns_directory=owns,
    )
    environment = daemon_environment(host, env)
    try:
        cluster.processes.append(
            _spawn(
                [
                    MASTER_CLASS,
                    "--host",
                    host,
                    "--port",
                    str(cluster.port),
                    "--webui-port",
                    str(cluster.webui_port),
                ],
                root / "master.log",
                environment,
            )
        )
        for index in range(1, workers + 1):
            work_dir = cluster.worker_dir(index)
            work_dir.mkdir(exist_ok=True)
            cluster.processes.append(
                _spawn(
                    [
                        WORKER_CLASS,
                        cluster.master_url,
                        "--host",
                        host,
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--webui-port",
                        "0",  # a free one: the default 8081 would collide with a second worker
                        "--work-dir",
                        str(work_dir),
                    ],
                    root / f"worker-{index}.log",
                    environment,
                )
            )
        if wait:
            cluster.wait_for_workers(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# ------------------------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m automq_ref.spark.standalone",
        description="Run a Spark standalone cluster (a master and workers) on this machine "
        "until Ctrl-C or SIGTERM.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores each worker offers")
    parser.add_argument("--memory", default="1g", help="memory each worker offers")
    parser.add_argument("--host", default="127.0.0.1", help="address every daemon binds")
    parser.add_argument("--port", type=int, default=0, help="master port (0: a free one)")
    parser.add_argument("--webui-port", type=int, default=0, help="master web UI (0: free)")
    parser.add_argument(
        "--directory", type=Path, help="logs and work dirs (default: a temporary one, removed)"
    )
    arguments = parser.parse_args(argv)
    # SIGTERM as Ctrl-C: either one, even while the daemons start, stops them all.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(arguments)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(arguments: argparse.Namespace) -> int:
    try:
        cluster = start_cluster(
            arguments.workers,
            cores=arguments.cores,
            memory=arguments.memory,
            host=arguments.host,
            port=arguments.port,
            webui_port=arguments.webui_port,
            directory=arguments.directory,
        )
    except KeyboardInterrupt:
        return 130
    except (StandaloneError, OSError, ValueError) as error:
        print(f"automq_ref.spark.standalone: {error}", file=sys.stderr)
        return 2
    with cluster:
        print(f"spark.master={cluster.master_url}", flush=True)
        print(f"web UI: {cluster.webui_url}  logs: {cluster.directory}", flush=True)
        try:
            while all(process.poll() is None for process in cluster.processes):
                time.sleep(1.0)
        except KeyboardInterrupt:
            return 0
        print(f"a Spark daemon exited; stopping:\n{cluster.log_tails()}", file=sys.stderr)
        return 1


def _interrupt(number: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
