"""Shared test settings: hypothesis profiles `dev` (default) and `ci` (derandomized, more examples).
Neither has a deadline or the too-slow health check: a property's verdict must not depend on how
busy the machine is (waiting in tests: ``tests/waiting.py``).

Also the session-wide moto S3 server (`moto_s3`) that object-store tests run against, and a
broker process per test module (`broker`, see ``automq_ref.checker.cluster``) for the end-to-end
and Spark tests. A coroutine collected without being awaited fails the test (``filterwarnings``
in ``pyproject.toml``), in this process and, through its log, in a broker process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings

from automq_ref.checker.cluster import BrokerProcess

settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@dataclass(frozen=True, slots=True)
class MotoS3:
    """Where the test S3 server listens and the dummy credentials to sign requests with."""

    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 (a free port), shared by the session.

    Credentials are handed to clients explicitly; the process environment is left alone.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield MotoS3(
            endpoint_url=f"http://{host}:{port}",
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker process for the module; it fails the module's last test if the broker dropped
    a coroutine unawaited (an answer lost) at any point."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker") / "data")
    process.start()
    yield process
    if process.alive():
        process.stop()
    dropped = process.unawaited_coroutines()
    assert not dropped, f"the broker dropped coroutines unawaited: {dropped}"
