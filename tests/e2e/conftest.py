"""The end-to-end tests' broker process: the ``broker`` fixture lives in ``tests/conftest.py``
(one process per test module); ``BrokerProcess`` is re-exported for the tests that start their
own."""

from __future__ import annotations

from automq_ref.checker.cluster import BrokerProcess

__all__ = ["BrokerProcess"]
