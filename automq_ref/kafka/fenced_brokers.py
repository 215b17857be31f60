"""The brokers Metadata keeps listing for a moment after their session lapsed.

When a broker dies, the controller fences it and moves its partitions in one decision, and a
crash failover closes its streams a fraction of a second later. A Metadata answer that names the
partitions' new leaders *and* no longer lists the dead broker makes librdkafka drop the
partitions from the dead broker's connection onto its internal broker in the same pass; it sends
them to their new leaders only at its next leader query, a second later (measured:
``bench.failover_bench --breakdown``). Listed a little longer, the dead broker leaves the list in
a later answer than the one that moved its partitions, and the client goes to the new leaders at
once. :class:`RecentlyFenced` remembers when this broker first saw each broker fenced by its
session (not a broker in controlled shutdown: Metadata lists that one while it hands over), and
answers those seen less than :data:`FENCED_LINGER_S` ago. A client's periodic query for a
partition whose broker is down comes once a second (librdkafka), so two seconds let it see one
answer with both.
"""

from __future__ import annotations

from automq_ref.state_machines import stream_metadata as sm

FENCED_LINGER_S = 2.0


class RecentlyFenced:
    """When this broker first saw each broker fenced by its session, per node epoch."""

    def __init__(self, linger_s: float = FENCED_LINGER_S) -> None:
        self._linger_s = linger_s
        self._seen: dict[tuple[int, int], float] = {}

    def lingering(self, image: sm.StreamMetadataImage, now_s: float) -> frozenset[int]:
        """The brokers ``image`` shows fenced by their session that this broker first saw so
        less than the linger before ``now_s`` (a monotonic time)."""
        fenced = {
            (broker.node_id, broker.node_epoch)
            for broker in image.brokers.values()
            if broker.fenced and not broker.in_controlled_shutdown
        }
        for key in [key for key in self._seen if key not in fenced]:
            del self._seen[key]
        for key in fenced:
            self._seen.setdefault(key, now_s)
        return frozenset(
            node_id
            for (node_id, _), seen_s in self._seen.items()
            if now_s - seen_s < self._linger_s
        )
