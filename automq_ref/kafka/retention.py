"""Retention: the loop that trims every partition to what its topic's retention allows.

Each round asks every partition of a topic whose ``cleanup.policy`` holds ``delete``
(``delete`` or ``compact,delete``; plain ``compact`` keeps every key's last record however old)
for the offset below which its whole batches are older than ``retention.ms`` or beyond
``retention.bytes`` (:meth:`Partition.retention_trim_point`) and trims there; a round that fails
is logged and the next one retries.
"""

from __future__ import annotations

import asyncio
import logging

from automq_ref.io.clock import Clock
from automq_ref.kafka.compaction import cleanup_policies
from automq_ref.kafka.topic_registry import TopicRegistry

log = logging.getLogger(__name__)


async def retention_forever(registry: TopicRegistry, interval_ms: int, clock: Clock) -> None:
    interval_s = interval_ms / 1000
    while True:
        await asyncio.sleep(interval_s)
        try:
            await enforce_retention(registry, clock.now_ms())
        except Exception:
            log.exception("retention round failed; the next round retries")


async def enforce_retention(registry: TopicRegistry, now_ms: int) -> int:
    """Trim every partition to what its topic's retention allows; return offsets dropped."""
    dropped = 0
    for (name, _), partition in list(registry.partitions.items()):
        topic = registry.topics.get(name)
        if topic is None or "delete" not in cleanup_policies(registry, topic):
            continue
        retention_ms = int(registry.topic_config(topic, "retention.ms"))
        retention_bytes = int(registry.topic_config(topic, "retention.bytes"))
        start = partition.log_start_offset
        new_start = partition.retention_trim_point(now_ms, retention_ms, retention_bytes)
        if new_start > start:
            await partition.trim(new_start)
            dropped += new_start - start
    return dropped
