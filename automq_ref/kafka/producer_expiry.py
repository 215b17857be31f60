"""Producer state expiry, as Kafka's brokers do it: a partition forgets a producer id once it has
been idle for ``producer.id.expiration.ms`` (one day), checked every
``producer.id.expiration.check.interval.ms`` (ten minutes) on every partition led here, and
once when a partition opens, after its state is rebuilt (as Kafka skips expired producers when
it loads a snapshot).

The rule is :meth:`~automq_ref.kafka.partition_transactions.PartitionTransactions.expire`'s
(an id whose last activity is the expiration old or older and that has no transaction open
goes, from the idempotent producer state and from the transaction state); this module holds
what a partition needs to apply it (:class:`ProducerExpiry`: the node's clock and the
expiration) and the loop that applies it to every partition. After expiry the partition
answers the forgotten producer as a new one: its next batch lands whatever its sequence
(:func:`~automq_ref.kafka.log_state.check_sequences`), and DescribeProducers no longer lists it.

Time is the node's :class:`~automq_ref.io.clock.Clock` (the ``Seams`` clock), compared with
record timestamps (a batch's max timestamp, as Kafka's ``lastTimestamp``): a test runs a node
on a clock of its own and moves it past the expiration.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from automq_ref.io.clock import Clock, SystemClock
from automq_ref.io.logfmt import fields

if TYPE_CHECKING:
    from automq_ref.kafka.topic_registry import TopicRegistry

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_MS: Final = 86_400_000  # Kafka's producer.id.expiration.ms


@dataclass(frozen=True, slots=True)
class ProducerExpiry:
    """What a partition reads time from (the node's clock: marker timestamps, verifications,
    expiry) and how long an idle producer id is kept (``producer.id.expiration.ms``)."""

    clock: Clock = field(default_factory=SystemClock)
    expiration_ms: int = DEFAULT_EXPIRATION_MS

    def now_ms(self) -> int:
        return self.clock.now_ms()


async def producer_expiry_forever(registry: TopicRegistry, interval_ms: int) -> None:
    """Every ``interval_ms`` (``producer.id.expiration.check.interval.ms``), expire the idle
    producers of every partition led here; a round that fails is logged, the next retries."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            expire_producers(registry)
        except Exception:
            log.exception("producer expiry round failed; the next round retries")


def expire_producers(registry: TopicRegistry) -> int:
    """One round over the partitions led here, each on its own clock and expiration; the
    producer ids forgotten, in all."""
    forgotten = 0
    for (name, index), partition in list(registry.partitions.items()):
        expired = partition.expire_producers()
        if expired:
            forgotten += len(expired)
            log.info(
                "producers expired %s",
                fields(topic=name, partition=index, producers=len(expired)),
            )
    return forgotten
