"""A real broker process per test module (see ``automq_ref.checker.cluster``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from automq_ref.checker.cluster import BrokerProcess

__all__ = ["BrokerProcess"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker") / "data")
    process.start()
    yield process
    if process.alive():
        process.stop()
