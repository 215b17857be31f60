"""The topic-config catalog (``automq_ref/kafka/topic_configs.py``): every name Kafka accepts,
each validator's bounds just inside and just outside with Kafka's messages, the canonical form
values are stored in, IncrementalAlterConfigs' four operations (APPEND and SUBTRACT against a
model of a list), AlterConfigs' replacement, and the table in ``docs/broker.md`` equal to the
catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_ref.config import BrokerConfig
from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.topic_configs import (
    TOPIC_CONFIGS,
    ConfigChange,
    ConfigOperation,
    ConfigType,
    TopicConfig,
    altered_configs,
    check_config,
    check_configs,
    cleanup_policies,
    effective_defaults,
    replaced_configs,
)
from automq_ref.kafka.topics import TopicError

SET, DELETE, APPEND, SUBTRACT = (
    ConfigOperation.SET,
    ConfigOperation.DELETE,
    ConfigOperation.APPEND,
    ConfigOperation.SUBTRACT,
)
INVALID_CONFIG, INVALID_REQUEST = KafkaErrorCode.INVALID_CONFIG, KafkaErrorCode.INVALID_REQUEST
LONG_MAX, LONG_MIN = 2**63 - 1, -(2**63)

# Kafka 4's topic configs (LogConfig's definitions), and the two Kafka 3.x also accepted.
KAFKA_4 = {
    "cleanup.policy",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "follower.replication.throttled.replicas",
    "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes",
    "local.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.downconversion.enable",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "remote.storage.enable",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
}
KAFKA_3_ONLY = {"message.format.version", "message.timestamp.difference.max.ms"}


def refused(name: str, value: str | None) -> str:
    with pytest.raises(TopicError) as error:
        check_config(name, value)
    assert error.value.code is INVALID_CONFIG
    return str(error.value)


def test_every_kafka_name_is_in_the_catalog_and_accepts_its_default() -> None:
    assert set(TOPIC_CONFIGS) == KAFKA_4 | KAFKA_3_ONLY
    assert {n for n, c in TOPIC_CONFIGS.items() if c.only_kafka_3} == KAFKA_3_ONLY
    assert list(TOPIC_CONFIGS) == sorted(TOPIC_CONFIGS)
    for name, config in TOPIC_CONFIGS.items():
        assert config.name == name
        assert check_config(name, config.default) == config.default, name


def test_an_unknown_name_and_a_missing_value() -> None:
    assert refused("retention.minutes", "1") == "Unknown topic config name: retention.minutes"
    assert (
        refused("retention.ms", None) == "Null value not supported for topic configs: retention.ms"
    )


# (config, the value just inside its range, the value just outside, Kafka's complaint)
BOUNDS = [
    ("segment.bytes", "1048576", "1048575", "Value must be at least 1048576"),
    ("segment.ms", "1", "0", "Value must be at least 1"),
    ("segment.jitter.ms", "0", "-1", "Value must be at least 0"),
    ("segment.index.bytes", "4", "3", "Value must be at least 4"),
    ("flush.messages", "1", "0", "Value must be at least 1"),
    ("flush.ms", "0", "-1", "Value must be at least 0"),
    ("retention.ms", "-1", "-2", "Value must be at least -1"),
    ("max.message.bytes", "0", "-1", "Value must be at least 0"),
    ("index.interval.bytes", "0", "-1", "Value must be at least 0"),
    ("delete.retention.ms", "0", "-1", "Value must be at least 0"),
    ("min.compaction.lag.ms", "0", "-1", "Value must be at least 0"),
    ("max.compaction.lag.ms", "1", "0", "Value must be at least 1"),
    ("file.delete.delay.ms", "0", "-1", "Value must be at least 0"),
    ("min.cleanable.dirty.ratio", "0", "-0.01", "Value must be at least 0"),
    ("min.cleanable.dirty.ratio", "1", "1.01", "Value must be no more than 1"),
    ("min.insync.replicas", "1", "0", "Value must be at least 1"),
    ("compression.gzip.level", "1", "0", "Value must be between 1 and 9 or equal to -1"),
    ("compression.gzip.level", "9", "10", "Value must be between 1 and 9 or equal to -1"),
    ("compression.gzip.level", "-1", "-2", "Value must be between 1 and 9 or equal to -1"),
    ("compression.lz4.level", "1", "0", "Value must be at least 1"),
    ("compression.lz4.level", "17", "18", "Value must be no more than 17"),
    ("compression.zstd.level", "-131072", "-131073", "Value must be at least -131072"),
    ("compression.zstd.level", "22", "23", "Value must be no more than 22"),
    ("message.timestamp.before.max.ms", "0", "-1", "Value must be at least 0"),
    ("message.timestamp.after.max.ms", "0", "-1", "Value must be at least 0"),
    ("message.timestamp.difference.max.ms", "0", "-1", "Value must be at least 0"),
    ("local.retention.ms", "-2", "-3", "Value must be at least -2"),
    ("local.retention.bytes", "-2", "-3", "Value must be at least -2"),
    ("compression.type", "producer", "gzip2", None),
    ("message.timestamp.type", "CreateTime", "createtime", None),
    ("cleanup.policy", "compact,delete", "compact,remove", None),
    ("leader.replication.throttled.replicas", "0:1,2:3", "0:1,*", None),
    ("follower.replication.throttled.replicas", "*", "1", None),
    ("message.format.version", "3.9-IV0", "4.0", None),
    ("message.format.version", "2.8.1", "3.10", None),
]


@pytest.mark.parametrize(("name", "inside", "outside", "problem"), BOUNDS)
def test_each_validator_just_inside_and_just_outside(
    name: str, inside: str, outside: str, problem: str | None
) -> None:
    check_config(name, inside)
    message = refused(name, outside)
    assert message.startswith("Invalid value ") and f" for configuration {name}: " in message
    if problem is not None:
        assert message.endswith(problem)


def test_every_range_is_tested_at_its_bounds() -> None:
    bounded = {name for name, config in TOPIC_CONFIGS.items() if config.validator is not None}
    assert bounded == {name for name, *_ in BOUNDS}


def test_kafkas_messages_for_types_and_choices() -> None:
    assert refused("segment.bytes", "1MB") == (
        "Invalid value 1MB for configuration segment.bytes: Not a number of type INT"
    )
    # INT and LONG are Java's 32 and 64 bits.
    assert check_config("segment.bytes", "2147483647") == "2147483647"
    assert refused("segment.bytes", "2147483648").endswith("Not a number of type INT")
    assert check_config("retention.ms", str(LONG_MAX)) == str(LONG_MAX)
    assert refused("retention.ms", str(LONG_MAX + 1)).endswith("Not a number of type LONG")
    assert check_config("retention.bytes", str(LONG_MIN)) == str(LONG_MIN)  # no validator
    assert refused("retention.ms", "1_000").endswith("Not a number of type LONG")
    assert refused("min.cleanable.dirty.ratio", "half").endswith("Not a number of type DOUBLE")
    assert refused("preallocate", "yes") == (
        "Invalid value yes for configuration preallocate: Expected value to be either true or false"
    )
    assert refused("compression.type", "GZIP") == (
        "Invalid value GZIP for configuration compression.type: String must be one of: "
        "uncompressed, zstd, lz4, snappy, gzip, producer"
    )
    # A list is checked item by item; the message names the item.
    assert refused("cleanup.policy", "delete, remove") == (
        "Invalid value remove for configuration cleanup.policy: String must be one of: "
        "compact, delete"
    )
    assert refused("cleanup.policy", "compact,").startswith("Invalid value  for configuration")
    assert refused("leader.replication.throttled.replicas", "a, 1:2") == (
        "Invalid value [a, 1:2] for configuration leader.replication.throttled.replicas: "
        "leader.replication.throttled.replicas must be the literal '*' or a list of replicas in "
        "the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."
    )
    assert refused("message.format.version", "4.0") == (
        "Invalid value 4.0 for configuration message.format.version: "
        "Version 4.0 is not a valid version"
    )


def test_values_kafka_accepts_that_this_broker_refuses() -> None:
    assert "only CreateTime is supported" in refused("message.timestamp.type", "LogAppendTime")
    assert refused("remote.storage.enable", "TRUE") == (
        "Tiered Storage functionality is disabled in the broker. "
        "Topic cannot be configured with remote log storage."
    )
    assert check_config("remote.storage.enable", "false") == "false"


@pytest.mark.parametrize(
    ("name", "given", "stored"),
    [
        ("retention.ms", " 100 ", "100"),
        ("retention.ms", "+5", "5"),
        ("retention.ms", "007", "7"),
        ("preallocate", "TRUE", "true"),
        ("cleanup.policy", " compact , delete ", "compact,delete"),
        ("cleanup.policy", "  ", ""),
        ("compression.type", " zstd", "zstd"),
        ("min.cleanable.dirty.ratio", "1", "1.0"),
        ("min.cleanable.dirty.ratio", "5e-1", "0.5"),
        ("min.cleanable.dirty.ratio", "0.0001", "1.0E-4"),
        ("min.cleanable.dirty.ratio", ".25", "0.25"),
        ("leader.replication.throttled.replicas", "0:1 , 1:2", "0:1,1:2"),
    ],
)
def test_values_are_stored_in_kafkas_canonical_form(name: str, given: str, stored: str) -> None:
    assert check_config(name, given) == stored


def test_cleanup_policies() -> None:
    assert cleanup_policies("compact,delete") == {"compact", "delete"}
    assert cleanup_policies("delete") == {"delete"}
    assert cleanup_policies(" Compact , delete ") == {"compact", "delete"}
    assert cleanup_policies("") == frozenset()


def test_a_whole_set_checks_names_values_and_across() -> None:
    assert check_configs({"cleanup.policy": "compact, delete", "retention.ms": " 1"}) == {
        "cleanup.policy": "compact,delete",
        "retention.ms": "1",
    }
    with pytest.raises(TopicError, match=r"^Null value not supported for topic configs: a,b$"):
        check_configs({"a": None, "retention.ms": "1", "b": None})
    with pytest.raises(TopicError, match=r"^Unknown topic config name: zzz$"):
        check_configs({"retention.ms": "1", "zzz": "1"})
    with pytest.raises(TopicError) as conflict:
        check_configs({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert conflict.value.code is INVALID_CONFIG
    assert str(conflict.value) == (
        "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"
    )
    # Across checks see the defaults under what is set.
    check_configs({"min.compaction.lag.ms": "10"})
    with pytest.raises(TopicError, match="conflict"):
        check_configs({"min.compaction.lag.ms": "10"}, {"max.compaction.lag.ms": "9"})


def change(name: str, operation: int, value: str | None = None) -> ConfigChange:
    return ConfigChange(name, operation, value)


def test_set_and_delete() -> None:
    configs = {"retention.ms": "1"}
    assert altered_configs(configs, [change("retention.ms", SET, " 2")]) == {"retention.ms": "2"}
    assert altered_configs(configs, [change("retention.ms", DELETE)]) == {}
    # DELETE of what the topic does not set, even of an unknown name, does nothing.
    assert altered_configs(configs, [change("segment.ms", DELETE)]) == configs
    assert altered_configs(configs, [change("no.such.config", DELETE)]) == configs
    assert configs == {"retention.ms": "1"}  # the input is left alone


def test_append_and_subtract_on_cleanup_policy() -> None:
    # Unset, the list starts from Kafka's default, delete.
    assert altered_configs({}, [change("cleanup.policy", APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"
    }
    both = {"cleanup.policy": "compact,delete"}
    assert altered_configs(both, [change("cleanup.policy", APPEND, "delete")]) == both
    assert altered_configs(both, [change("cleanup.policy", SUBTRACT, "delete")]) == {
        "cleanup.policy": "compact"
    }
    assert altered_configs(both, [change("cleanup.policy", SUBTRACT, "compact,delete")]) == {
        "cleanup.policy": ""
    }
    assert altered_configs({}, [change("cleanup.policy", SUBTRACT, "compact")]) == {
        "cleanup.policy": "delete"
    }
    with pytest.raises(TopicError, match=r"Invalid value remove for configuration cleanup\.policy"):
        altered_configs(both, [change("cleanup.policy", APPEND, "remove")])


def test_append_and_subtract_need_a_list() -> None:
    for operation, word in ((APPEND, "APPEND"), (SUBTRACT, "SUBTRACT")):
        for name in ("flush.ms", "no.such.config"):
            with pytest.raises(TopicError) as error:
                altered_configs({}, [change(name, operation, "1")])
            assert error.value.code is INVALID_CONFIG
            assert str(error.value) == f"Can't {word} to key {name} because its type is not LIST."
    assert altered_configs(
        {}, [change("leader.replication.throttled.replicas", APPEND, "0:1")]
    ) == {"leader.replication.throttled.replicas": "0:1"}


def test_request_shape_errors_are_invalid_request() -> None:
    for changes, message in [
        (
            [change("retention.ms", SET, "1"), change("retention.ms", DELETE)],
            "Error due to duplicate config keys",
        ),
        (
            [change("retention.ms", SET), change("cleanup.policy", APPEND)],
            "Null value not supported for : retention.ms, cleanup.policy",
        ),
        ([change("retention.ms", 7, "1")], "Unknown operations type 7"),
    ]:
        with pytest.raises(TopicError) as error:
            altered_configs({}, changes)
        assert error.value.code is INVALID_REQUEST
        assert str(error.value) == message


def test_changes_are_all_or_none() -> None:
    with pytest.raises(TopicError, match=r"segment\.bytes"):
        altered_configs({}, [change("retention.ms", SET, "5"), change("segment.bytes", SET, "1")])
    with pytest.raises(TopicError, match="conflict"):
        altered_configs({"max.compaction.lag.ms": "5"}, [change("min.compaction.lag.ms", SET, "6")])


def test_alter_configs_replaces_the_whole_set() -> None:
    assert replaced_configs([("retention.ms", "5"), ("cleanup.policy", "compact")]) == {
        "retention.ms": "5",
        "cleanup.policy": "compact",
    }
    assert replaced_configs([]) == {}
    with pytest.raises(TopicError) as error:
        replaced_configs([("retention.ms", "5"), ("retention.ms", "6")])
    assert error.value.code is INVALID_REQUEST
    with pytest.raises(TopicError) as missing:
        replaced_configs([("retention.ms", None)])
    assert missing.value.code is INVALID_REQUEST
    assert str(missing.value) == "Null value not supported for : retention.ms"


POLICIES = st.sampled_from(["compact", "delete"])


@given(
    st.lists(
        st.tuples(st.sampled_from([APPEND, SUBTRACT]), st.lists(POLICIES, min_size=1, max_size=2))
    ),
)
def test_append_and_subtract_follow_a_list_model(
    operations: list[tuple[ConfigOperation, list[str]]],
) -> None:
    configs: dict[str, str] = {}
    model: list[str] | None = None  # None: unset, the default
    for operation, items in operations:
        value = ",".join(items)
        configs = altered_configs(configs, [change("cleanup.policy", operation, value)])
        model = ["delete"] if model is None else model
        for item in items:
            if operation == APPEND and item not in model:
                model.append(item)
            elif operation == SUBTRACT and item in model:
                model.remove(item)
        assert configs == {"cleanup.policy": ",".join(model)}
        assert cleanup_policies(configs["cleanup.policy"]) == set(model)


@given(st.integers(min_value=LONG_MIN, max_value=LONG_MAX))
def test_a_long_range_accepts_exactly_the_values_from_its_minimum(value: int) -> None:
    accepted = value >= -1
    try:
        assert check_config("retention.ms", str(value)) == str(value)
    except TopicError:
        assert not accepted
    else:
        assert accepted


def test_the_brokers_settings_are_the_defaults_where_it_has_them() -> None:
    defaults = effective_defaults(
        {"log.retention.ms": 5, "message.max.bytes": 7, "log.preallocate": True}
    )
    assert defaults["retention.ms"] == "5"
    assert defaults["max.message.bytes"] == "7"
    assert defaults["preallocate"] == "true"
    assert defaults["segment.bytes"] == "1073741824"
    assert set(defaults) == set(TOPIC_CONFIGS)


# ------------------------------------------------------------------------------- the docs


def docs_row(config: TopicConfig, broker_properties: set[str]) -> str:
    name = f"`{config.name}`" + (" (Kafka 3.x)" if config.only_kafka_3 else "")
    default = f"`{config.default}`" if config.default != "" else "empty"
    if config.synonym in broker_properties:
        default = f"broker's `{config.synonym}` ({default})"
    if config.validator is not None:
        valid = f"`{config.validator}`"
    elif config.type == ConfigType.BOOLEAN:
        valid = "true, false"
    else:
        valid = "any"
    effect = "accepted without effect" if config.effect is None else config.effect
    return f"| {name} | {config.type.name.lower()} | {default} | {valid} | {effect} |"


def test_the_docs_table_is_the_catalog() -> None:
    broker_md = (Path(__file__).parents[2] / "docs" / "broker.md").read_text()
    properties = {field.alias for field in BrokerConfig.model_fields.values() if field.alias}
    expected = [docs_row(config, properties) for config in TOPIC_CONFIGS.values()]
    header = (
        "| config | type | default | valid values | effect here |\n"
        "| --- | --- | --- | --- | --- |\n"
    )
    assert header + "\n".join(expected) + "\n" in broker_md
