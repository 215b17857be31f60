"""Topic configs with real admin clients against a broker process: topics created with Kafka's
topic configs (those without effect here too) and described back; ``cleanup.policy`` as a list
under IncrementalAlterConfigs APPEND and SUBTRACT (down to the empty list); APPEND on a config
that is not a list, unknown names and values out of range refused with ``INVALID_CONFIG`` and
Kafka's message; AlterConfigs replacing a topic's set; ``validate_only`` storing nothing.
confluent-kafka (librdkafka) and kafka-python each do all of it."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp, ConfigResourceType
from kafka.admin import ConfigResource as KpConfigResource
from kafka.errors import InvalidConfigurationError

from tests.e2e.conftest import BrokerProcess

# Kafka topic configs that change nothing here, with values inside Kafka's ranges.
WITHOUT_EFFECT = {
    "flush.ms": "1000",
    "flush.messages": "10",
    "min.insync.replicas": "2",
    "segment.bytes": "1048576",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "true",
    "compression.type": "zstd",
    "min.cleanable.dirty.ratio": "0.25",
    "message.timestamp.after.max.ms": "60000",
    "leader.replication.throttled.replicas": "*",
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- confluent-kafka


def confluent_describe(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource("topic", topic)
    return dict(admin.describe_configs([resource])[resource].result(10))


def confluent_incremental(admin: AdminClient, topic: str, *changes: ConfigEntry) -> None:
    resource = ConfigResource("topic", topic)
    for change in changes:
        resource.add_incremental_config(change)
    admin.incremental_alter_configs([resource])[resource].result(10)


def op(name: str, operation: AlterConfigOpType, value: str | None = None) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=operation)


def invalid_config(error: pytest.ExceptionInfo[KafkaException]) -> str:
    kafka_error = error.value.args[0]
    assert kafka_error.code() == KafkaError.INVALID_CONFIG, kafka_error
    return str(kafka_error.str())


def test_confluent_kafka_creates_and_describes_topics_with_configs(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("configs")
    configs = {"cleanup.policy": "compact", "delete.retention.ms": "100", **WITHOUT_EFFECT}
    admin.create_topics([NewTopic(topic, num_partitions=1, config=configs)])[topic].result(10)
    described = confluent_describe(admin, topic)
    for name, value in configs.items():
        assert described[name].value == value, name
        assert ConfigSource(described[name].source) is ConfigSource.DYNAMIC_TOPIC_CONFIG, name
    assert ConfigSource(described["retention.ms"].source) is ConfigSource.DEFAULT_CONFIG
    assert described["preallocate"].value == "false"
    assert not described["flush.ms"].is_read_only


def test_confluent_kafka_append_and_subtract_cleanup_policy(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("policy")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(10)

    def policy() -> str:
        return str(confluent_describe(admin, topic)["cleanup.policy"].value)

    assert policy() == "delete"
    confluent_incremental(admin, topic, op("cleanup.policy", AlterConfigOpType.APPEND, "compact"))
    assert policy() == "delete,compact"
    confluent_incremental(admin, topic, op("cleanup.policy", AlterConfigOpType.APPEND, "delete"))
    assert policy() == "delete,compact"
    confluent_incremental(admin, topic, op("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"))
    assert policy() == "compact"
    confluent_incremental(admin, topic, op("cleanup.policy", AlterConfigOpType.SUBTRACT, "compact"))
    assert policy() == ""
    confluent_incremental(admin, topic, op("cleanup.policy", AlterConfigOpType.DELETE))
    assert policy() == "delete"

    with pytest.raises(KafkaException) as not_a_list:
        confluent_incremental(admin, topic, op("flush.ms", AlterConfigOpType.APPEND, "1"))
    assert "Can't APPEND to key flush.ms because its type is not LIST." in invalid_config(
        not_a_list
    )
    with pytest.raises(KafkaException) as bad_item:
        confluent_incremental(
            admin, topic, op("cleanup.policy", AlterConfigOpType.APPEND, "archive")
        )
    assert "Invalid value archive for configuration cleanup.policy" in invalid_config(bad_item)
    assert policy() == "delete"


def test_confluent_kafka_bad_configs_are_invalid_config(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for configs, message in [
        ({"segment.bytes": "1024"}, "Value must be at least 1048576"),
        ({"min.insync.replicas": "0"}, "Value must be at least 1"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "Value must be no more than 1"),
        ({"message.timestamp.type": "WallClock"}, "String must be one of"),
        ({"retention.ms": "forever"}, "Not a number of type LONG"),
        ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
    ]:
        topic = unique("bad")
        with pytest.raises(KafkaException) as refused:
            admin.create_topics([NewTopic(topic, num_partitions=1, config=configs)])[topic].result(
                10
            )
        assert message in invalid_config(refused), configs
        assert topic not in admin.list_topics(timeout=10).topics

    topic = unique("altered")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(10)
    with pytest.raises(KafkaException) as refused:
        confluent_incremental(admin, topic, op("segment.ms", AlterConfigOpType.SET, "0"))
    assert "Invalid value 0 for configuration segment.ms" in invalid_config(refused)


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_confluent_kafka_alter_configs_replaces_the_set(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("replace")
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, config={"retention.ms": "60000", "flush.ms": "5"})]
    )[topic].result(10)
    resource = ConfigResource("topic", topic, set_config={"cleanup.policy": "compact,delete"})
    admin.alter_configs([resource], validate_only=True)[resource].result(10)
    assert confluent_describe(admin, topic)["cleanup.policy"].value == "delete"
    admin.alter_configs([resource])[resource].result(10)
    described = confluent_describe(admin, topic)
    assert described["cleanup.policy"].value == "compact,delete"
    assert ConfigSource(described["retention.ms"].source) is ConfigSource.DEFAULT_CONFIG  # replaced
    assert ConfigSource(described["flush.ms"].source) is ConfigSource.DEFAULT_CONFIG


# ----------------------------------------------------------------------------- kafka-python


def kp_describe(admin: KafkaAdminClient, topic: str) -> dict[str, dict[str, object]]:
    resource = KpConfigResource(ConfigResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], config_filter="all")
    return dict(described["topic"][topic])


def kp_alter(admin: KafkaAdminClient, topic: str, configs: dict[str, object], **kw: object) -> str:
    resource = KpConfigResource(ConfigResourceType.TOPIC, topic, configs)
    return str(admin.alter_configs([resource], **kw)["topic"][topic])


def test_kafka_python_configs(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        topic = unique("kp-configs")
        configs = {"cleanup.policy": "compact, delete", **WITHOUT_EFFECT}
        admin.create_topics({topic: {"num_partitions": 1, "configs": configs}})
        described = kp_describe(admin, topic)
        assert described["cleanup.policy"]["value"] == "compact,delete"
        assert described["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert described["cleanup.policy"]["config_type"] == "LIST"
        assert described["flush.ms"]["value"] == "1000"
        assert described["segment.index.bytes"]["config_source"] == "DEFAULT_CONFIG"

        policy = "cleanup.policy"
        assert kp_alter(admin, topic, {policy: (AlterConfigOp.SUBTRACT, "delete")}) == "OK"
        assert kp_describe(admin, topic)[policy]["value"] == "compact"
        assert kp_alter(admin, topic, {policy: (AlterConfigOp.APPEND, "delete")}) == "OK"
        assert kp_alter(admin, topic, {policy: (AlterConfigOp.APPEND, "compact")}) == "OK"
        assert kp_describe(admin, topic)[policy]["value"] == "compact,delete"
        assert kp_alter(admin, topic, {policy: (AlterConfigOp.SUBTRACT, "compact,delete")}) == "OK"
        assert kp_describe(admin, topic)[policy]["value"] == ""

        refused = kp_alter(admin, topic, {"segment.ms": (AlterConfigOp.APPEND, "5")})
        assert "InvalidConfigurationError" in refused
        assert "Can't APPEND to key segment.ms because its type is not LIST." in refused
        refused = kp_alter(admin, topic, {"segment.bytes": "1048575"})
        assert "InvalidConfigurationError" in refused and "at least 1048576" in refused

        # The older AlterConfigs: the set given replaces the topic's (the client adds back the
        # configs the topic set before, as Kafka's clients do).
        assert kp_alter(admin, topic, {"retention.ms": "60000"}, incremental=False) == "OK"
        described = kp_describe(admin, topic)
        assert described["retention.ms"]["value"] == "60000"
        assert described["flush.ms"]["value"] == "1000"

        bad = unique("kp-bad")
        with pytest.raises(InvalidConfigurationError, match="Value must be at least 1"):
            admin.create_topics({bad: {"num_partitions": 1, "configs": {"segment.ms": "0"}}})
        assert bad not in admin.list_topics()
    finally:
        admin.close()
