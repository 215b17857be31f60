"""An internal topic whose partitions hold coordinators' state: ``__consumer_offsets`` for the
group coordinator (:mod:`automq_ref.kafka.groups`), ``__transaction_state`` for the transaction
coordinator (:mod:`automq_ref.kafka.transactions`).

A key (a group id, a transactional id) lives in partition ``abs(hashCode(key)) % partitions``
(:func:`coordinator_partition`, Kafka's own formula, so a key lands where Kafka would put it),
and its coordinator is the broker placement assigns that partition. A coordinator runs one
*shard* per partition of its topic this broker holds (loaded from the partition's log, then
serving); :meth:`CoordinatorTopic.route` says which shard serves a key here, or the error a
client is answered: ``COORDINATOR_LOAD_IN_PROGRESS`` while the shard loads or while the
partition is placed here but not taken yet, ``NOT_COORDINATOR`` for a key coordinated elsewhere
(or any key before the topic exists), and the client asks FindCoordinator again
(:meth:`CoordinatorTopic.coordinator`: the partition's broker, ``COORDINATOR_NOT_AVAILABLE``
while the topic does not exist or the partition has no broker).

The topic is created through the controller like any topic, by the first request that needs it
(``CreateTopic`` is put-if-absent, so any broker may): :meth:`CoordinatorTopic.ensure` starts the
creation in the background, and retries while no broker is live or the controller is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

from automq_ref.errors import KafkaErrorCode
from automq_ref.io.metadata.view import MetadataView
from automq_ref.kafka.topics import TopicError
from automq_ref.state_machines import stream_metadata as sm

if TYPE_CHECKING:
    from automq_ref.kafka.topic_registry import TopicRegistry

log = logging.getLogger(__name__)

CREATE_RETRY_S = 1.0  # creating the topic failed (no live broker yet, no controller)
INT32_MIN = -(2**31)


def java_string_hashcode(text: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over the UTF-16 code units,
    in 32-bit two's complement arithmetic."""
    encoded = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for position in range(0, len(encoded), 2):
        unit = (encoded[position] << 8) | encoded[position + 1]
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The coordinator partition of ``key``: Kafka's ``Utils.abs(key.hashCode) % partitions``,
    where ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0."""
    hashed = java_string_hashcode(key)
    return (0 if hashed == INT32_MIN else abs(hashed)) % partitions


class Shard(Protocol):
    @property
    def serving(self) -> bool: ...


ShardT = TypeVar("ShardT", bound=Shard)


class CoordinatorTopic:
    """The placement of one internal topic as this broker's image shows it, its creation, and
    the routing of keys to its partitions."""

    def __init__(
        self,
        view: MetadataView,
        node_id: int,
        name: str,
        partitions: int,
        configs: Mapping[str, str],
    ) -> None:
        self._view = view
        self._node_id = node_id
        self.name = name
        self._partitions = partitions
        self._configs = dict(configs)
        self._registry: TopicRegistry | None = None
        self.creating: asyncio.Task[None] | None = None
        self._placed_image: sm.StreamMetadataImage | None = None
        self._placed: sm.TopicPlacement | None = None

    def start(self, registry: TopicRegistry) -> None:
        self._registry = registry

    async def close(self) -> None:
        if self.creating is not None:
            self.creating.cancel()
            with contextlib.suppress(BaseException):
                await self.creating

    # ------------------------------------------------------------------------- placement

    def placement(self) -> sm.TopicPlacement | None:
        """The topic's placement in the current image (looked up once per image)."""
        image = self._view.image
        if image is not self._placed_image:
            self._placed_image = image
            self._placed = sm.placed_topic(image, self.name)
        return self._placed

    def partition_count(self) -> int | None:
        placed = self.placement()
        return None if placed is None or not placed.partitions else len(placed.partitions)

    def partition_of(self, key: str) -> int | None:
        """The partition ``key`` lives in (None before the topic exists)."""
        partitions = self.partition_count()
        return None if partitions is None else coordinator_partition(key, partitions)

    # -------------------------------------------------------------------------- creation

    def ensure(self) -> None:
        """Create the topic in the background unless it exists or is being created."""
        if self._registry is None or self.placement() is not None:
            return
        if self.creating is None or self.creating.done():
            self.creating = asyncio.create_task(self._create(), name=f"create {self.name}")

    async def _create(self) -> None:
        registry = self._registry
        assert registry is not None
        while self.placement() is None:
            try:
                await registry.create_topic(self.name, self._partitions, self._configs)
            except TopicError as error:
                if error.code is KafkaErrorCode.TOPIC_ALREADY_EXISTS:
                    return  # another broker's: this broker's image shows it soon
                log.warning("%s not created yet: %s", self.name, error)
            except Exception as error:  # the controller unreachable: try again
                log.warning("%s not created yet: %r", self.name, error)
            else:
                return
            await asyncio.sleep(CREATE_RETRY_S)

    # --------------------------------------------------------------------------- routing

    def coordinator(self, key: str) -> int | KafkaErrorCode:
        """The broker coordinating ``key``: the broker its partition is assigned to, whether or
        not that broker has loaded it yet."""
        placed = self.placement()
        index = self.partition_of(key)
        if placed is None or index is None:
            return KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
        assignment = placed.partitions.get(index)
        if assignment is None or assignment.leader < 0:
            return KafkaErrorCode.COORDINATOR_NOT_AVAILABLE
        return assignment.leader

    def route(self, key: str, shards: Mapping[int, ShardT]) -> ShardT | KafkaErrorCode:
        """The shard of ``shards`` (by partition) serving ``key``, or the error to answer."""
        placed = self.placement()
        index = self.partition_of(key)
        if placed is None or index is None:
            return KafkaErrorCode.NOT_COORDINATOR
        shard = shards.get(index)
        if shard is not None:
            return shard if shard.serving else KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assignment = placed.partitions.get(index)
        if assignment is not None and assignment.leader == self._node_id:
            return KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS  # placed here, not taken yet
        return KafkaErrorCode.NOT_COORDINATOR
