"""``node.serve`` when no controller answers: it starts the broker again after a growing,
bounded pause (each failure logged) until a start succeeds or the process is stopped.

A start fails that way when etcd answers but no controller is elected yet (the request times out
with ``ControllerUnavailable``), or when etcd does not answer (``MetadataUnavailable``). On the
process's first start only the second is fatal (a wrong address is the likelier cause, and
``automq-ref serve`` says so: ``tests/unit/test_cli_errors.py``); a broker started again in its
process (after a fence or a storage failure) waits for either. The failures are injected in
front of :func:`automq_ref.node.start_node`, so each test runs one embedded broker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from automq_ref import node as node_module
from automq_ref.config import BrokerConfig, load_config
from automq_ref.io.metadata.controller import ControllerError, ControllerUnavailable
from automq_ref.node import (
    MetadataUnavailable,
    Node,
    Seams,
    serve,
    start_node,
    start_retry_pause_s,
)


def config_in(tmp_path: Path) -> BrokerConfig:
    return load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "s3.wal.capacity=16777216",
            "listeners=PLAINTEXT://127.0.0.1:0",
        ],
        environment={},
    )


class FailingStarts:
    """In place of ``start_node``: the calls numbered in ``failures`` raise what is given there
    (or, for ``hang``, never return); the others start the node."""

    def __init__(self, failures: dict[int, BaseException | str]) -> None:
        self.failures = failures
        self.calls = 0
        self.started: list[Node] = []

    async def __call__(self, config: BrokerConfig, seams: Seams) -> Node:
        self.calls += 1
        failure = self.failures.get(self.calls)
        if failure == "hang":
            await asyncio.Event().wait()
        if isinstance(failure, BaseException):
            raise failure
        self.started.append(await start_node(config, seams))
        return self.started[-1]


@pytest.fixture
async def signals() -> AsyncIterator[None]:
    """serve installs SIGINT/SIGTERM handlers on the running loop: removed afterwards."""
    yield
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(signum)


def test_the_pause_doubles_and_is_bounded() -> None:
    pauses = [start_retry_pause_s(attempt) for attempt in range(12)]
    assert pauses[0] == node_module.START_RETRY_BASE_S
    bound = node_module.START_RETRY_MAX_S
    assert all(b == min(2 * a, bound) for a, b in itertools.pairwise(pauses))
    assert max(pauses) == node_module.START_RETRY_MAX_S
    assert start_retry_pause_s(10_000) == node_module.START_RETRY_MAX_S


async def test_a_first_start_waits_for_a_controller(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    signals: None,
) -> None:
    """etcd answered but no controller did: started again, after pauses that grow, and logged."""
    caplog.set_level(logging.INFO, logger="automq_ref.node")
    monkeypatch.setattr(node_module, "START_RETRY_BASE_S", 0.05)
    starts = FailingStarts(
        {
            1: ControllerUnavailable("no controller answered within 1000 ms"),
            2: ControllerError("RegisterNode: outcome unknown"),
        }
    )
    monkeypatch.setattr(node_module, "start_node", starts)
    serving = asyncio.ensure_future(serve(config_in(tmp_path), Seams()))
    try:
        await _until(lambda: len(starts.started) == 1)
        assert starts.calls == 3
        waits = re.findall(r"no controller answers; starting again (.*)", caplog.text)
        assert len(waits) == 2, caplog.text
        assert "attempt=1 pause_seconds=0.05 " in waits[0]
        assert "attempt=2 pause_seconds=0.1 " in waits[1]
        assert "ControllerUnavailable: no controller answered" in waits[0]
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 30) == 0
    finally:
        if not serving.done():
            serving.cancel()


async def test_a_first_start_that_never_reaches_etcd_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals: None
) -> None:
    unreachable = MetadataUnavailable(("127.0.0.1:1",), "connection refused")
    starts = FailingStarts({1: unreachable})
    monkeypatch.setattr(node_module, "start_node", starts)
    with pytest.raises(MetadataUnavailable):
        await asyncio.wait_for(serve(config_in(tmp_path), Seams()), 30)
    assert starts.calls == 1


async def test_a_broker_started_again_in_its_process_waits_for_etcd(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    signals: None,
) -> None:
    """A broker whose storage failed is started again; etcd (here: its stand-in) does not
    answer twice, then does: the broker serves again, on the same port."""
    caplog.set_level(logging.INFO, logger="automq_ref.node")
    monkeypatch.setattr(node_module, "START_RETRY_BASE_S", 0.05)
    unreachable = MetadataUnavailable(("127.0.0.1:1",), "connection refused")
    starts = FailingStarts({2: unreachable, 3: unreachable})
    monkeypatch.setattr(node_module, "start_node", starts)
    serving = asyncio.ensure_future(serve(config_in(tmp_path), Seams()))
    try:
        await _until(lambda: len(starts.started) == 1)
        first = starts.started[0]
        await asyncio.sleep(0.2)  # serve waits on the storage by now
        first.storage._fail("a test", ControllerError("CommitStreamSetObject: outcome unknown"))
        await _until(lambda: len(starts.started) == 2)
        assert starts.calls == 4
        second = starts.started[1]
        assert second.session.node_epoch > first.session.node_epoch
        assert second.advertised_address[1] == first.advertised_address[1]
        assert caplog.text.count("no controller answers; starting again") == 2
        assert "cannot reach etcd at 127.0.0.1:1" in caplog.text
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 30) == 0
    finally:
        if not serving.done():
            serving.cancel()


@pytest.mark.parametrize("failure", ["pause", "hang"])
async def test_a_stop_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, signals: None
) -> None:
    """SIGTERM while serve waits for a controller, in its pause (a long one here) or in a start
    that does not return: serve returns 0 at once, having started nothing."""
    monkeypatch.setattr(node_module, "START_RETRY_BASE_S", 60.0)
    first: BaseException | str = (
        ControllerUnavailable("no controller answered") if failure == "pause" else "hang"
    )
    starts = FailingStarts({1: first})
    monkeypatch.setattr(node_module, "start_node", starts)
    serving = asyncio.ensure_future(serve(config_in(tmp_path), Seams()))
    try:
        await _until(lambda: starts.calls == 1)
        await asyncio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 5) == 0
        assert starts.started == []
    finally:
        if not serving.done():
            serving.cancel()


async def _until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)
