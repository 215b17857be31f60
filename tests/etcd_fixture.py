"""A real etcd server for tests and benchmarks: its own process, free loopback ports, a temp data
directory, stopped and removed however the test ends.

The tests run against Debian's ``etcd`` binary (``etcd-server``; ``make test`` installs it when it
is missing), never a system service. :class:`EtcdServer` is the checker's launcher
(:class:`automq_ref.checker.etcd_member.EtcdMember`, which starts its own member with
``--data-dir``, ``--listen-client-urls`` and ``--listen-peer-urls`` on ports the OS handed out and
waits for ``/health`` to answer) with the tests' layout: the data in ``<directory>/data``, the log
in ``<directory>/etcd.log``, the directory a temporary one unless given, and
:meth:`EtcdServer.stop` kills the member and deletes the directory it made (a member whose test
process is killed from outside dies with it, on Linux). :meth:`pause` / :meth:`resume`
(SIGSTOP / SIGCONT) make it unreachable without losing anything.

``ETCD_PREFIX`` gives each test a key prefix of its own, so one server serves a whole module.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from automq_ref.checker.etcd_member import EtcdMember
from automq_ref.checker.etcd_member import etcd_binary as _etcd_binary

START_TIMEOUT_S = 30
INSTALL_HINT = (
    "`make pytest` installs Debian's etcd-server (or run `apt-get install -y etcd-server`)"
)


def etcd_binary() -> str:
    """The etcd on PATH; a clear failure when it is missing (``make test`` installs it)."""
    return _etcd_binary(INSTALL_HINT)


class EtcdServer(EtcdMember):
    """One etcd member on loopback; ``endpoint`` is ``host:port`` of its client URL."""

    def __init__(self, directory: Path | None = None, *extra_args: str) -> None:
        self._owns_directory = directory is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="etcd-")) if directory is None else Path(directory)
        )
        super().__init__(
            self.directory / "data",
            *extra_args,
            log_path=self.directory / "etcd.log",
            name="automq-ref-test",
            start_timeout_s=START_TIMEOUT_S,
            install_hint=INSTALL_HINT,
        )

    def start(self) -> EtcdServer:
        super().start()
        return self

    def stop(self) -> None:
        """Kill the member and remove its directory (when this server made it)."""
        self.kill()
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
