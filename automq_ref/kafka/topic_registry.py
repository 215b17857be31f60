"""The topic registry: this node's topics and their open partitions, and the changes to them.

It owns the map from topic name to :class:`Topic` and from (name, index) to :class:`Partition`,
and the one lock under which topics are created, deleted, grown and reconfigured, so that two
admin requests never interleave their KV writes and partition creations. The order of each
change keeps :mod:`automq_ref.kafka.topics`' rule: a topic's KV entry is written after its
partitions exist and removed before they are deleted, so a topic that can be found always has all
its partitions.

``topic_config`` answers a topic's effective config: its own setting, else the documented
default, else the broker's setting (``log.retention.ms``, ...).
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats.topic_record import Topic, topics_in
from automq_ref.io.metadata.client import ControllerClient
from automq_ref.io.metadata.view import MetadataView
from automq_ref.io.storage.s3stream import S3Storage
from automq_ref.kafka.partition import Partition
from automq_ref.kafka.topics import (
    TOPIC_CONFIG_DEFAULTS,
    TopicError,
    check_topic_config,
    check_topic_name,
)
from automq_ref.state_machines import log_cache as lc
from automq_ref.state_machines import stream_metadata as sm
from automq_ref.vocabulary.naming import topic_key


class ConfigOperation(enum.IntEnum):
    """IncrementalAlterConfigs' operations (Kafka's ``AlterConfigOp.OpType`` ids)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class ConfigChange:
    name: str
    operation: int  # a ConfigOperation, as the client sent it (unknown ones are refused)
    value: str | None


class TopicRegistry:
    def __init__(
        self,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        config: BrokerConfig,
    ) -> None:
        self._storage = storage
        self._client = client
        self._view = view
        self._config = config
        self.topics: dict[str, Topic] = {}
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        storage: S3Storage,
        client: ControllerClient,
        view: MetadataView,
        config: BrokerConfig,
    ) -> TopicRegistry:
        """The registry of the topics in the controller's KV, every partition opened."""
        registry = cls(storage, client, view, config)
        for name, topic in sorted(topics_in(view.image.kv).items()):
            registry.topics[name] = topic
            for index in range(topic.partitions):
                registry.partitions[(name, index)] = await Partition.open(
                    storage, client, view, name, topic.topic_id, index
                )
        return registry

    def topic_by_id(self, topic_id: uuid.UUID) -> Topic | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    def topic_config(self, topic: Topic, name: str) -> str:
        if name in topic.configs:
            return topic.configs[name]
        default = TOPIC_CONFIG_DEFAULTS[name]
        if default is not None:
            return default
        return str(
            {
                "retention.ms": self._config.log_retention_ms,
                "retention.bytes": self._config.log_retention_bytes,
                "max.message.bytes": self._config.message_max_bytes,
            }[name]
        )

    # ----------------------------------------------------------------------------- changes

    async def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str], validate_only: bool = False
    ) -> Topic:
        check_topic_name(name)
        if partitions < 1:
            raise TopicError(KafkaErrorCode.INVALID_PARTITIONS, f"{partitions} partitions")
        for key, value in configs.items():
            check_topic_config(key, value)
        async with self._lock:
            if name in self.topics:
                raise TopicError(KafkaErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name} exists")
            topic = Topic(name, uuid.uuid4(), partitions, dict(configs))
            if validate_only:
                return topic
            for index in range(partitions):
                self.partitions[(name, index)] = await Partition.create(
                    self._storage, self._client, name, topic.topic_id, index
                )
            # The partitions' MetaStream records go to objects now rather than at the next
            # upload: a topic's skeleton then never depends on the WAL.
            await self._storage.force_upload(lc.ALL_STREAMS)
            await self._put_topic(topic)
            self.topics[name] = topic
            return topic

    async def delete_topic(self, name: str) -> Topic:
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            await self._client.submit(sm.DeleteKV(topic_key(name)))
            del self.topics[name]
            for index in range(topic.partitions):
                partition = self.partitions.pop((name, index))
                partition.wake_waiters()
                await partition.delete()
            return topic

    async def add_partitions(
        self, name: str, count: int, *, manual_assignment: bool, validate_only: bool
    ) -> None:
        """Grow topic ``name`` to ``count`` partitions (CreatePartitions)."""
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            if count <= topic.partitions:
                raise TopicError(
                    KafkaErrorCode.INVALID_PARTITIONS,
                    f"topic {name} has {topic.partitions} partitions; {count} would not add any",
                )
            if manual_assignment:
                raise TopicError(
                    KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    "manual replica assignment is not supported",
                )
            if validate_only:
                return
            for index in range(topic.partitions, count):
                self.partitions[(topic.name, index)] = await Partition.create(
                    self._storage, self._client, topic.name, topic.topic_id, index
                )
            grown = Topic(topic.name, topic.topic_id, count, topic.configs)
            await self._put_topic(grown)
            self.topics[topic.name] = grown

    async def alter_configs(
        self, name: str, changes: Sequence[ConfigChange], *, validate_only: bool
    ) -> None:
        """Apply ``changes`` to topic ``name``'s configs (IncrementalAlterConfigs): all or none."""
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(KafkaErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            configs = dict(topic.configs)
            for change in changes:
                if change.operation == ConfigOperation.SET:
                    check_topic_config(change.name, change.value)
                    if change.value is None:
                        raise TopicError(KafkaErrorCode.INVALID_CONFIG, "SET without value")
                    configs[change.name] = change.value
                elif change.operation == ConfigOperation.DELETE:
                    check_topic_config(change.name, None)
                    configs.pop(change.name, None)
                else:
                    raise TopicError(
                        KafkaErrorCode.INVALID_CONFIG,
                        f"{change.name}: APPEND/SUBTRACT apply to list configs only",
                    )
            if not validate_only:
                altered = Topic(topic.name, topic.topic_id, topic.partitions, configs)
                await self._put_topic(altered)
                self.topics[topic.name] = altered

    async def _put_topic(self, topic: Topic) -> None:
        response = await self._client.submit(sm.PutKV(topic_key(topic.name), topic.encode(), True))
        if not response.ok:
            raise TopicError(KafkaErrorCode.KAFKA_STORAGE_ERROR, str(response.message))
