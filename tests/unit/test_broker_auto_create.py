"""Auto-created topics in process: Metadata creates an unknown topic with ``num.partitions``
partitions only when ``auto.create.topics.enable`` and the client allow it; Produce never
creates one (``UNKNOWN_TOPIC_OR_PARTITION``); ``default.replication.factor`` loads as 1 and
nothing else (shared storage keeps one copy)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import i32

from automq_ref.config import BrokerConfig, ConfigError, load_config
from automq_ref.kafka.server import Peer
from automq_ref.node import start_node
from tests.unit.test_broker_node import call

PEER = Peer(1, "127.0.0.1:1")
PRODUCE, METADATA = 0, 3
UNKNOWN_TOPIC_OR_PARTITION = 3


def config(tmp_path: Path, *overrides: str) -> BrokerConfig:
    return load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216", *overrides],
        environment={},
    )


async def metadata(admit: object, name: str, allow: bool) -> object:
    return await call(
        admit,
        PEER,
        METADATA,
        12,
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(name)),),
        allow_auto_topic_creation=allow,
        include_topic_authorized_operations=False,
    )


async def produce_to(admit: object, name: str) -> object:
    return await call(
        admit,
        PEER,
        PRODUCE,
        9,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            TopicProduceData(
                name=TopicName(name),
                partition_data=(PartitionProduceData(index=i32(0), records=None),),
            ),
        ),
    )


@pytest.mark.parametrize("enabled", [True, False])
async def test_switch_and_partition_count(tmp_path: Path, enabled: bool) -> None:
    node = await start_node(
        config(
            tmp_path,
            f"auto.create.topics.enable={str(enabled).lower()}",
            "num.partitions=3",
            "default.replication.factor=1",
        )
    )
    admit = node.front_end.admit
    try:
        produced: object = await produce_to(admit, "by-produce")
        (topic,) = produced.responses  # type: ignore[attr-defined]
        (partition,) = topic.partition_responses
        assert partition.error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert "by-produce" not in node.context.topics.topics

        refused: object = await metadata(admit, "not-allowed", allow=False)
        (answer,) = refused.topics  # type: ignore[attr-defined]
        assert answer.error_code == UNKNOWN_TOPIC_OR_PARTITION

        asked: object = await metadata(admit, "by-metadata", allow=True)
        (answer,) = asked.topics  # type: ignore[attr-defined]
        if enabled:
            assert answer.error_code == 0
            assert len(answer.partitions) == 3
            assert all(list(p.replica_nodes) == [0] for p in answer.partitions)
        else:
            assert answer.error_code == UNKNOWN_TOPIC_OR_PARTITION
            assert "by-metadata" not in node.context.topics.topics
    finally:
        await node.shutdown()


def test_default_replication_factor_is_one_copy(tmp_path: Path) -> None:
    assert config(tmp_path).default_replication_factor == 1
    for value in ("3", "-1", "0"):
        with pytest.raises(ConfigError, match="one copy"):
            config(tmp_path, f"default.replication.factor={value}")
