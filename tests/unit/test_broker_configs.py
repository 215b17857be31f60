"""Topic configs through the config APIs in process (a node, requests of the exact versions):
CreateTopics refuses a bad config with Kafka's message; DescribeConfigs v1 (synonyms) and v4
(types, documentation) describe every config of the catalog; AlterConfigs replaces a topic's set
(and ``validate_only`` stores nothing); IncrementalAlterConfigs refuses a resource named twice
and a duplicate key with INVALID_REQUEST."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.alter_configs.v0 import request as alter_v0
from kio.schema.alter_configs.v2 import request as alter_v2
from kio.schema.create_topics.v7 import request as create_v7
from kio.schema.describe_configs.v1 import request as describe_v1
from kio.schema.describe_configs.v4 import request as describe_v4
from kio.schema.incremental_alter_configs.v1 import request as incremental_v1
from kio.schema.types import TopicName
from kio.static.primitive import i8, i16, i32

from automq_ref.config import load_config
from automq_ref.kafka.server import Peer
from automq_ref.kafka.topic_configs import TOPIC_CONFIGS, ConfigOperation
from automq_ref.node import Node, start_node
from tests.unit.test_broker_node import call

PEER = Peer(1, "127.0.0.1:1")
CREATE_TOPICS, DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 19, 32, 33, 44
TOPIC = i8(2)
INVALID_CONFIG, INVALID_REQUEST = 40, 42
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216", "log.retention.ms=1234"],
        environment={},
    )
    node = await start_node(config)
    try:
        yield node
    finally:
        await node.shutdown()


async def create(node: Node, name: str, **configs: str | None) -> Any:
    response = await call(
        node.front_end.admit,
        PEER,
        CREATE_TOPICS,
        7,
        topics=(
            create_v7.CreatableTopic(
                name=TopicName(name),
                num_partitions=i32(1),
                replication_factor=i16(1),
                assignments=(),
                configs=tuple(
                    create_v7.CreatableTopicConfig(name=key.replace("_", "."), value=value)
                    for key, value in configs.items()
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    (result,) = response.topics
    return result


async def describe(node: Node, name: str, version: int = 4, keys: Any = None) -> Any:
    if version == 1:
        response = await call(
            node.front_end.admit,
            PEER,
            DESCRIBE_CONFIGS,
            1,
            resources=(
                describe_v1.DescribeConfigsResource(
                    resource_type=TOPIC, resource_name=name, configuration_keys=keys
                ),
            ),
            include_synonyms=True,
        )
    else:
        response = await call(
            node.front_end.admit,
            PEER,
            DESCRIBE_CONFIGS,
            4,
            resources=(
                describe_v4.DescribeConfigsResource(
                    resource_type=TOPIC, resource_name=name, configuration_keys=keys
                ),
            ),
            include_synonyms=False,
            include_documentation=True,
        )
    (result,) = response.results
    assert int(result.error_code) == 0
    return {entry.name: entry for entry in result.configs}


async def test_create_topics_refuses_a_bad_config_with_kafkas_message(node: Node) -> None:
    refused = await create(node, "bad", segment_bytes="1000")
    assert int(refused.error_code) == INVALID_CONFIG
    assert refused.error_message == (
        "Invalid value 1000 for configuration segment.bytes: Value must be at least 1048576"
    )
    missing = await create(node, "missing", flush_ms=None)
    assert int(missing.error_code) == INVALID_CONFIG
    assert missing.error_message == "Null value not supported for topic configs: flush.ms"
    assert "bad" not in node.context.topics.topics and "missing" not in node.context.topics.topics

    created = await create(node, "good", cleanup_policy="compact, delete", flush_ms="10")
    assert int(created.error_code) == 0
    listed = {config.name: config for config in created.configs}
    assert set(listed) == set(TOPIC_CONFIGS)
    assert listed["cleanup.policy"].value == "compact,delete"
    assert listed["cleanup.policy"].config_source == DYNAMIC_TOPIC_CONFIG
    assert listed["retention.ms"].value == "1234"  # the broker's log.retention.ms
    assert listed["retention.ms"].config_source == DEFAULT_CONFIG


async def test_describe_configs_v4_types_and_documentation(node: Node) -> None:
    await create(node, "t", retention_ms="60000", preallocate="TRUE")
    described = await describe(node, "t")
    assert set(described) == set(TOPIC_CONFIGS)
    retention = described["retention.ms"]
    assert (retention.value, retention.config_source) == ("60000", DYNAMIC_TOPIC_CONFIG)
    assert retention.config_type == 5  # LONG
    assert not retention.read_only and not retention.is_sensitive
    assert "retention trims" in retention.documentation
    assert described["preallocate"].value == "true"
    assert described["preallocate"].config_type == 1  # BOOLEAN
    assert "without effect" in described["preallocate"].documentation
    assert described["cleanup.policy"].config_type == 7  # LIST
    assert described["min.cleanable.dirty.ratio"].config_type == 6  # DOUBLE
    assert described["segment.bytes"].config_source == DEFAULT_CONFIG
    assert described["segment.bytes"].value == "1073741824"
    # Asked for some keys, only those (unknown ones skipped); an empty list asks for all.
    some = await describe(node, "t", keys=("flush.ms", "no.such.config"))
    assert set(some) == {"flush.ms"}
    assert set(await describe(node, "t", keys=())) == set(TOPIC_CONFIGS)


async def test_describe_configs_v1_synonyms(node: Node) -> None:
    await create(node, "t", retention_ms="60000")
    described = await describe(node, "t", version=1)
    retention = [(s.name, s.value, s.source) for s in described["retention.ms"].synonyms]
    assert retention == [
        ("retention.ms", "60000", DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "1234", DEFAULT_CONFIG),
    ]
    assert [s.name for s in described["max.message.bytes"].synonyms] == ["message.max.bytes"]
    assert list(described["segment.ms"].synonyms) == []  # the broker has no log.roll.ms


async def alter(node: Node, version: int, validate_only: bool, *configs: Any) -> Any:
    module = alter_v0 if version == 0 else alter_v2
    response = await call(
        node.front_end.admit,
        PEER,
        ALTER_CONFIGS,
        version,
        resources=(
            module.AlterConfigsResource(
                resource_type=TOPIC,
                resource_name="t",
                configs=tuple(module.AlterableConfig(name=n, value=v) for n, v in configs),
            ),
        ),
        validate_only=validate_only,
    )
    (result,) = response.responses
    return result


@pytest.mark.parametrize("version", [0, 2])
async def test_alter_configs_replaces_the_whole_set(node: Node, version: int) -> None:
    await create(node, "t", retention_ms="60000", flush_ms="5")
    checked = await alter(node, version, True, ("cleanup.policy", "compact"))
    assert int(checked.error_code) == 0
    assert node.context.topics.topics["t"].configs == {"retention.ms": "60000", "flush.ms": "5"}
    done = await alter(node, version, False, ("cleanup.policy", "compact"), ("flush.ms", " 7"))
    assert int(done.error_code) == 0
    assert node.context.topics.topics["t"].configs == {"cleanup.policy": "compact", "flush.ms": "7"}
    bad = await alter(node, version, False, ("cleanup.policy", "compact"), ("flush.ms", "-1"))
    assert int(bad.error_code) == INVALID_CONFIG
    assert bad.error_message == (
        "Invalid value -1 for configuration flush.ms: Value must be at least 0"
    )
    twice = await alter(node, version, False, ("flush.ms", "1"), ("flush.ms", "2"))
    assert (int(twice.error_code), twice.error_message) == (
        INVALID_REQUEST,
        "Error due to duplicate config keys",
    )
    assert node.context.topics.topics["t"].configs == {"cleanup.policy": "compact", "flush.ms": "7"}


async def test_incremental_alter_configs_refuses_a_resource_named_twice(node: Node) -> None:
    await create(node, "t")

    def resource(name: str, operation: int, value: str) -> Any:
        return incremental_v1.AlterConfigsResource(
            resource_type=TOPIC,
            resource_name="t",
            configs=(
                incremental_v1.AlterableConfig(
                    name=name, config_operation=i8(operation), value=value
                ),
            ),
        )

    response = await call(
        node.front_end.admit,
        PEER,
        INCREMENTAL_ALTER_CONFIGS,
        1,
        resources=(
            resource("cleanup.policy", ConfigOperation.APPEND, "compact"),
            resource("flush.ms", ConfigOperation.SET, "1"),
        ),
        validate_only=False,
    )
    assert [(int(r.error_code), r.error_message) for r in response.responses] == [
        (INVALID_REQUEST, "Each resource must appear at most once."),
    ] * 2
    assert node.context.topics.topics["t"].configs == {}
