"""Telling the operator once, not once per request: what clients do that this broker refuses.

A client that asks for something the broker does not implement (transactions, the KIP-848
consumer group protocol, an API key it does not know) or that speaks something other than Kafka
to the listener (TLS, HTTP) usually retries, often several times a second. The broker answers
every attempt, but logs the reason at WARNING only the first time for that client (its client id
and address, or the address alone where no request was read) and reason; the repetitions go to
DEBUG. The memory of who was told is bounded: past :data:`CAPACITY` keys the oldest is forgotten
(and would be told again).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Hashable

from automq_ref.io.logfmt import fields

log = logging.getLogger(__name__)

CAPACITY = 4096


class Notices:
    """Logs each (reason, client) pair's first occurrence at WARNING, later ones at DEBUG."""

    def __init__(self, logger: logging.Logger = log, capacity: int = CAPACITY) -> None:
        self._log = logger
        self._capacity = capacity
        self._seen: collections.OrderedDict[Hashable, None] = collections.OrderedDict()

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (or once it was forgotten)."""
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True

    def tell(self, key: Hashable, message: str, **values: object) -> None:
        """Log ``message`` and ``values`` (``key=value`` fields): at WARNING the first time for
        ``key`` (the reason and the client), at DEBUG afterwards."""
        level = logging.WARNING if self.first(key) else logging.DEBUG
        if self._log.isEnabledFor(level):
            self._log.log(level, "%s %s", message, fields(**values))


def unsupported_request(
    notices: Notices,
    reason: str,
    *,
    client_id: str | None,
    host: str,
    api: str,
    error: str,
    hint: str,
) -> None:
    """The one line for a request the broker answered with an error because it lacks the
    feature (``reason`` names it): once per client id and host."""
    notices.tell(
        (reason, client_id, host),
        f"unsupported request: {hint}",
        feature=reason,
        api=api,
        answer=error,
        client_id=client_id or "",
        client=host,
    )
