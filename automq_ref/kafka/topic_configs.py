"""Topic configs: the catalog of every topic config Kafka accepts, and how values are checked,
stored and changed.

``TOPIC_CONFIGS`` is the one table: for each config its name, Kafka's type, Kafka's default, the
broker property whose value is the default when this broker has that setting (Kafka's
"synonym"), Kafka's validator, and what the config does here (``effect``; ``None`` is "accepted
without effect": stored, returned by DescribeConfigs, ignored). The names are Kafka 4.x's topic
configs plus the two that Kafka 3.x still accepted (``message.format.version``,
``message.timestamp.difference.max.ms``), so that tools and files written for either load.

Values are checked as Kafka checks them, with Kafka's messages (a client shows them as they
are): the name must be known (``Unknown topic config name: x``), the value must parse as the
config's type (``Invalid value x for configuration y: Not a number of type INT``), and the
validator must accept it (``... Value must be at least 1048576``). A value is stored in Kafka's
canonical form (what DescribeConfigs would print: ``compact,delete`` for ``compact, delete``).
Two values Kafka accepts are refused here with a message saying why:
``message.timestamp.type=LogAppendTime`` (the broker keeps the producer's timestamps) and
``remote.storage.enable=true`` (no tiered storage: Kafka refuses it too when tiered storage is
off).

IncrementalAlterConfigs' four operations are Kafka's: SET, DELETE (of a config the topic does not
set, even an unknown name: nothing to do), and APPEND / SUBTRACT on list configs only
(``cleanup.policy`` and the two replication-throttle lists), item by item, starting from Kafka's
default when the topic does not set the config; APPEND of an item already there does nothing and
SUBTRACT of the last item leaves the empty list (for ``cleanup.policy``: no cleanup at all).
AlterConfigs (the older API) replaces the topic's whole set. Every error is ``INVALID_CONFIG``
except the request-shape ones Kafka answers with ``INVALID_REQUEST`` (a config named twice, a
value missing).

:func:`cleanup_policies` is how the rest of the broker reads ``cleanup.policy``.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from automq_ref.errors import KafkaErrorCode
from automq_ref.kafka.topics import TopicError

# ------------------------------------------------------------------------------------ types


class ConfigType(enum.IntEnum):
    """A config's type, with the ids DescribeConfigs (v3+) reports in ``config_type``."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


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


Parsed = bool | int | float | str | list[str]

_INT_BITS = {ConfigType.INT: 32, ConfigType.LONG: 64}
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
# Java's decimal grammar for doubles (NaN, Infinity and hex floats are left out: none is a ratio).
_DOUBLE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?", re.ASCII)
_LIST_SEPARATOR = re.compile(r"\s*,\s*")
LONG_MAX = 2**63 - 1

# ------------------------------------------------------------------------------- validators


class Validator(abc.ABC):
    """Kafka's check of a parsed value: ``problem`` says what is wrong (None: valid), ``shown``
    is the value as Kafka prints it in the message, ``str()`` its "Valid Values" text."""

    @abc.abstractmethod
    def problem(self, name: str, value: Parsed) -> str | None:
        """What is wrong with ``value`` for config ``name``; None when it is valid."""

    def shown(self, value: Parsed) -> str:
        return _java_string(value)


@dataclass(frozen=True, slots=True)
class Range(Validator):
    """``[low,...]`` or ``[low,...,high]``, inclusive."""

    low: int
    high: int | None = None

    def problem(self, name: str, value: Parsed) -> str | None:
        assert isinstance(value, int | float)
        if value < self.low:
            return f"Value must be at least {self.low}"
        if self.high is not None and value > self.high:
            return f"Value must be no more than {self.high}"
        return None

    def __str__(self) -> str:
        return f"[{self.low},...]" if self.high is None else f"[{self.low},...,{self.high}]"


@dataclass(frozen=True, slots=True)
class RangeOrDefault(Validator):
    """``[low,...,high]`` or one extra value (gzip's ``-1``: the library's default level)."""

    low: int
    high: int
    default: int

    def problem(self, name: str, value: Parsed) -> str | None:
        assert isinstance(value, int)
        if value > self.high or (value < self.low and value != self.default):
            return f"Value must be between {self.low} and {self.high} or equal to {self.default}"
        return None

    def __str__(self) -> str:
        return f"[{self.low},...,{self.high}] or {self.default}"


@dataclass(frozen=True, slots=True)
class OneOf(Validator):
    """One of a few strings, case-sensitive; for a list config, every item."""

    choices: tuple[str, ...]

    def problem(self, name: str, value: Parsed) -> str | None:
        if value not in self.choices:
            return f"String must be one of: {', '.join(self.choices)}"
        return None

    def __str__(self) -> str:
        return f"[{', '.join(self.choices)}]"


@dataclass(frozen=True, slots=True)
class ThrottledReplicas(Validator):
    """The replication-throttle lists: ``*`` or items ``partition:broker``."""

    def problem(self, name: str, value: Parsed) -> str | None:
        assert isinstance(value, list)
        items = [item.strip() for item in value]
        if all(re.fullmatch(r"([0-9]+:[0-9]+)?", item, re.ASCII) for item in items):
            return None
        if "".join(items) == "*":
            return None
        return (
            f"{name} must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
        )

    def shown(self, value: Parsed) -> str:
        assert isinstance(value, list)
        return f"[{', '.join(value)}]"

    def __str__(self) -> str:
        return "[partitionId]:[brokerId],[partitionId]:[brokerId],..."


# The inter-broker protocol versions Kafka 3.9 knew (the last to accept message.format.version):
# each release with how many internal versions it had ("2.8" had 2.8-IV0 and 2.8-IV1; the 0.8
# and 0.9 releases had none). A version is valid by its release alone or with an internal one.
_RELEASES = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1,
    "0.11.0": 3, "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1,
    "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3,
    "3.6": 3, "3.7": 5, "3.8": 1, "3.9": 1,
}  # fmt: skip
_IBP_VERSIONS = [
    release if count == 0 else f"{release}-IV{index}"
    for release, count in _RELEASES.items()
    for index in range(max(count, 1))
]
_KNOWN_VERSIONS = frozenset(_IBP_VERSIONS) | frozenset(_RELEASES)


@dataclass(frozen=True, slots=True)
class ProtocolVersion(Validator):
    """A Kafka version string; a patch release names its minor one (``2.8.1`` is ``2.8``)."""

    def problem(self, name: str, value: Parsed) -> str | None:
        assert isinstance(value, str)
        segments = value.split(".")
        kept = 3 if value.startswith("0.") else 2
        key = value if kept >= len(segments) else ".".join(segments[:kept])
        if key not in _KNOWN_VERSIONS:
            return f"Version {value} is not a valid version"
        return None

    def __str__(self) -> str:
        return f"[{_IBP_VERSIONS[0]}, ..., {_IBP_VERSIONS[-1]}] or a release alone (2.8)"


# ---------------------------------------------------------------------------------- catalog


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic config. ``default`` is Kafka's, in canonical form (``""``: the empty list);
    ``synonym`` the broker property whose value is the default where this broker has it;
    ``refused_here`` says why a value Kafka accepts is refused here (None: accepted);
    ``effect`` what the config does here (None: accepted without effect); ``only_kafka_3`` marks
    the names Kafka 4 no longer accepts."""

    name: str
    type: ConfigType
    default: str
    validator: Validator | None
    documentation: str
    effect: str | None = None
    synonym: str | None = None
    refused_here: Callable[[Parsed], str | None] | None = None
    only_kafka_3: bool = False


def _log_append_time(value: Parsed) -> str | None:
    if value == "LogAppendTime":
        return (
            "Invalid value LogAppendTime for configuration message.timestamp.type: this "
            "broker keeps the producer's timestamps, so only CreateTime is supported"
        )
    return None


def _tiered_storage(value: Parsed) -> str | None:
    if value is True:
        return (
            "Tiered Storage functionality is disabled in the broker. "
            "Topic cannot be configured with remote log storage."
        )
    return None


_NO_SEGMENTS = "there are no log segments: a partition is a stream in object storage"
_NO_REPLICAS = "there is one copy, in shared storage, and no follower replicas"
_NO_FLUSH = "every write is durable in the WAL before it is acknowledged"
_LONG_MAX = str(LONG_MAX)
_INT, _LONG, _BOOL, _STR, _LIST = (
    ConfigType.INT,
    ConfigType.LONG,
    ConfigType.BOOLEAN,
    ConfigType.STRING,
    ConfigType.LIST,
)


def _catalog(*configs: TopicConfig) -> Mapping[str, TopicConfig]:
    return {config.name: config for config in sorted(configs, key=lambda c: c.name)}


# fmt: off
TOPIC_CONFIGS: Mapping[str, TopicConfig] = _catalog(
    TopicConfig(
        "cleanup.policy", _LIST, "delete", OneOf(("compact", "delete")),
        "What happens to old records: delete (retention.ms and retention.bytes remove them), "
        "compact (only the last record of each key is kept), both, or neither (empty list).",
        effect="delete: retention trims; compact: compaction keeps the last record per key",
        synonym="log.cleanup.policy",
    ),
    TopicConfig(
        "compression.gzip.level", _INT, "-1", RangeOrDefault(1, 9, -1),
        "The gzip level used when compression.type is gzip.",
        synonym="compression.gzip.level",
    ),
    TopicConfig(
        "compression.lz4.level", _INT, "9", Range(1, 17),
        "The lz4 level used when compression.type is lz4.",
        synonym="compression.lz4.level",
    ),
    TopicConfig(
        "compression.type", _STR, "producer",
        OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        "The codec the broker stores batches in; producer keeps the producer's. Here batches "
        "are always stored as the producer sent them.",
        synonym="compression.type",
    ),
    TopicConfig(
        "compression.zstd.level", _INT, "3", Range(-131072, 22),
        "The zstd level used when compression.type is zstd.",
        synonym="compression.zstd.level",
    ),
    TopicConfig(
        "delete.retention.ms", _LONG, "86400000", Range(0),
        "How long a compacted topic keeps a tombstone (a record with a key and no value).",
        effect="compaction keeps tombstones this long",
        synonym="log.cleaner.delete.retention.ms",
    ),
    TopicConfig(
        "file.delete.delay.ms", _LONG, "60000", Range(0),
        f"How long a deleted segment file waits before removal; {_NO_SEGMENTS}.",
        synonym="log.segment.delete.delay.ms",
    ),
    TopicConfig(
        "flush.messages", _LONG, _LONG_MAX, Range(1),
        f"Records between forced fsyncs of the log; {_NO_FLUSH}.",
        synonym="log.flush.interval.messages",
    ),
    TopicConfig(
        "flush.ms", _LONG, _LONG_MAX, Range(0),
        f"Milliseconds between forced fsyncs of the log; {_NO_FLUSH}.",
        synonym="log.flush.interval.ms",
    ),
    TopicConfig(
        "follower.replication.throttled.replicas", _LIST, "", ThrottledReplicas(),
        f"Replicas whose follower fetches are throttled; {_NO_REPLICAS}.",
    ),
    TopicConfig(
        "index.interval.bytes", _INT, "4096", Range(0),
        f"Bytes between offset-index entries; {_NO_SEGMENTS}.",
        synonym="log.index.interval.bytes",
    ),
    TopicConfig(
        "leader.replication.throttled.replicas", _LIST, "", ThrottledReplicas(),
        f"Replicas whose leader-side replication is throttled; {_NO_REPLICAS}.",
    ),
    TopicConfig(
        "local.retention.bytes", _LONG, "-2", Range(-2),
        "Bytes kept on local disk when tiered storage is on (-2: retention.bytes); there is no "
        "tiered storage here.",
        synonym="log.local.retention.bytes",
    ),
    TopicConfig(
        "local.retention.ms", _LONG, "-2", Range(-2),
        "Milliseconds kept on local disk when tiered storage is on (-2: retention.ms); there is "
        "no tiered storage here.",
        synonym="log.local.retention.ms",
    ),
    TopicConfig(
        "max.compaction.lag.ms", _LONG, _LONG_MAX, Range(1),
        "The longest a record may stay uncompacted in a compacted topic.",
        effect="compaction cleans a record no later than this after it was written",
        synonym="log.cleaner.max.compaction.lag.ms",
    ),
    TopicConfig(
        "max.message.bytes", _INT, "1048588", Range(0),
        "The largest record batch a producer may write.",
        effect="a larger batch is refused with MESSAGE_TOO_LARGE",
        synonym="message.max.bytes",
    ),
    TopicConfig(
        "message.downconversion.enable", _BOOL, "true", None,
        "Whether old consumers get batches converted to old formats; Kafka 4 no longer converts, "
        "nor does this broker.",
        synonym="log.message.downconversion.enable",
    ),
    TopicConfig(
        "message.format.version", _STR, "3.0-IV1", ProtocolVersion(),
        "The record format version of appended batches (Kafka 3.x only); batches are stored "
        "in format v2 as sent.",
        synonym="log.message.format.version", only_kafka_3=True,
    ),
    TopicConfig(
        "message.timestamp.after.max.ms", _LONG, "3600000", Range(0),
        "How far in the future a record's timestamp may be; not checked here.",
        synonym="log.message.timestamp.after.max.ms",
    ),
    TopicConfig(
        "message.timestamp.before.max.ms", _LONG, _LONG_MAX, Range(0),
        "How far in the past a record's timestamp may be; not checked here.",
        synonym="log.message.timestamp.before.max.ms",
    ),
    TopicConfig(
        "message.timestamp.difference.max.ms", _LONG, _LONG_MAX, Range(0),
        "How far a record's timestamp may be from the broker's clock (Kafka 3.x only); not "
        "checked here.",
        synonym="log.message.timestamp.difference.max.ms", only_kafka_3=True,
    ),
    TopicConfig(
        "message.timestamp.type", _STR, "CreateTime", OneOf(("CreateTime", "LogAppendTime")),
        "Whether a record's timestamp is the producer's (CreateTime) or the broker's append "
        "time (LogAppendTime).",
        effect="CreateTime only: the producer's timestamps are kept; LogAppendTime is refused",
        synonym="log.message.timestamp.type", refused_here=_log_append_time,
    ),
    TopicConfig(
        "min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5", Range(0, 1),
        "The share of uncompacted records at which a compacted topic is cleaned.",
        effect="compaction cleans once this share of the log is uncleaned",
        synonym="log.cleaner.min.cleanable.ratio",
    ),
    TopicConfig(
        "min.compaction.lag.ms", _LONG, "0", Range(0),
        "The shortest a record stays uncompacted in a compacted topic.",
        effect="compaction leaves records younger than this uncleaned",
        synonym="log.cleaner.min.compaction.lag.ms",
    ),
    TopicConfig(
        "min.insync.replicas", _INT, "1", Range(1),
        f"Replicas that must have a write for acks=all to succeed; {_NO_REPLICAS}.",
        synonym="min.insync.replicas",
    ),
    TopicConfig(
        "preallocate", _BOOL, "false", None,
        f"Whether segment files are preallocated; {_NO_SEGMENTS}.",
        synonym="log.preallocate",
    ),
    TopicConfig(
        "remote.log.copy.disable", _BOOL, "false", None,
        "Whether tiered storage stops copying segments; there is no tiered storage here.",
    ),
    TopicConfig(
        "remote.log.delete.on.disable", _BOOL, "false", None,
        "Whether turning tiered storage off deletes the remote data; there is no tiered storage "
        "here.",
    ),
    TopicConfig(
        "remote.storage.enable", _BOOL, "false", None,
        "Whether the topic uses tiered storage; there is none here (all data is in object "
        "storage already), so only false is accepted.",
        effect="false only: true is refused, as Kafka does without tiered storage",
        refused_here=_tiered_storage,
    ),
    TopicConfig(
        "retention.bytes", _LONG, "-1", None,
        "The size a partition may grow to before the oldest records are deleted (negative: "
        "no limit).",
        effect="retention trims whole batches beyond this size from the start",
        synonym="log.retention.bytes",
    ),
    TopicConfig(
        "retention.ms", _LONG, "604800000", Range(-1),
        "How long records are kept before they are deleted (-1: no limit).",
        effect="retention trims whole batches older than this from the start",
        synonym="log.retention.ms",
    ),
    TopicConfig(
        "segment.bytes", _INT, "1073741824", Range(1024 * 1024),
        f"The size of a log segment file; {_NO_SEGMENTS}.",
        synonym="log.segment.bytes",
    ),
    TopicConfig(
        "segment.index.bytes", _INT, "10485760", Range(4),
        f"The size of a segment's offset index; {_NO_SEGMENTS}.",
        synonym="log.index.size.max.bytes",
    ),
    TopicConfig(
        "segment.jitter.ms", _LONG, "0", Range(0),
        f"Random jitter subtracted from segment.ms; {_NO_SEGMENTS}.",
        synonym="log.roll.jitter.ms",
    ),
    TopicConfig(
        "segment.ms", _LONG, "604800000", Range(1),
        f"How long before a segment is rolled; {_NO_SEGMENTS}.",
        synonym="log.roll.ms",
    ),
    TopicConfig(
        "unclean.leader.election.enable", _BOOL, "false", None,
        f"Whether an out-of-sync replica may become leader; {_NO_REPLICAS}.",
        synonym="unclean.leader.election.enable",
    ),
)
# fmt: on


def cleanup_policies(value: str) -> frozenset[str]:
    """The policies a ``cleanup.policy`` value names: ``"compact,delete"`` is
    ``{"compact", "delete"}``, ``""`` is none (keep everything)."""
    return frozenset(item.lower() for item in _split_list(value))


# ------------------------------------------------------------------------------- checking


def check_config(name: str, value: str | None) -> str:
    """``value`` for topic config ``name`` in canonical form; ``INVALID_CONFIG`` with Kafka's
    message when the name is unknown or the value is missing, of the wrong type, or refused by
    the validator (or refused here)."""
    config = TOPIC_CONFIGS.get(name)
    if config is None:
        raise _invalid(f"Unknown topic config name: {name}")
    if value is None:
        raise _invalid(f"Null value not supported for topic configs: {name}")
    parsed = _parse(config, value)
    validator = config.validator
    if validator is not None:
        # A list's items are checked one by one against a choice; other validators see it whole.
        items: list[Parsed] = [parsed]
        if isinstance(validator, OneOf) and isinstance(parsed, list):
            items = list(parsed)
        for item in items:
            problem = validator.problem(name, item)
            if problem is not None:
                raise _invalid(
                    f"Invalid value {validator.shown(item)} for configuration {name}: {problem}"
                )
    if config.refused_here is not None:
        refusal = config.refused_here(parsed)
        if refusal is not None:
            raise _invalid(refusal)
    return _canonical(config, parsed)


def check_configs(
    configs: Mapping[str, str | None], defaults: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A topic's whole set of configs (CreateTopics, AlterConfigs), canonical: every name and
    value as :func:`check_config`, then the checks across configs Kafka makes, over ``configs``
    on top of ``defaults`` (the broker's effective defaults; Kafka's when not given)."""
    missing = [name for name, value in configs.items() if value is None]
    if missing:
        raise _invalid(f"Null value not supported for topic configs: {','.join(missing)}")
    for name in configs:
        if name not in TOPIC_CONFIGS:
            raise _invalid(f"Unknown topic config name: {name}")
    checked = {name: check_config(name, value) for name, value in configs.items()}
    _check_across(checked, defaults)
    return checked


def altered_configs(
    configs: Mapping[str, str],
    changes: Sequence[ConfigChange],
    defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``configs`` after IncrementalAlterConfigs' ``changes`` (all or none), canonical.

    ``INVALID_REQUEST`` for a config named twice, a missing value (but for DELETE) or an unknown
    operation; ``INVALID_CONFIG`` for APPEND/SUBTRACT on a config that is not a list, and for a
    value :func:`check_config` refuses."""
    if _duplicates(change.name for change in changes):
        raise TopicError(KafkaErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    missing = [c.name for c in changes if c.operation != ConfigOperation.DELETE and c.value is None]
    if missing:
        raise TopicError(
            KafkaErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(missing)}"
        )
    altered = dict(configs)
    changed: list[str] = []
    for change in changes:
        name, value = change.name, change.value
        if change.operation == ConfigOperation.SET:
            assert value is not None
            altered[name] = value
            changed.append(name)
        elif change.operation == ConfigOperation.DELETE:
            altered.pop(name, None)
        elif change.operation in (ConfigOperation.APPEND, ConfigOperation.SUBTRACT):
            operation = ConfigOperation(change.operation)
            config = TOPIC_CONFIGS.get(name)
            if config is None or config.type != ConfigType.LIST:
                raise _invalid(
                    f"Can't {operation.name} to key {name} because its type is not LIST."
                )
            assert value is not None
            # Unset, the list starts from Kafka's default (not the broker's), as Kafka does.
            current = altered.get(name, config.default)
            items = [item for item in current.split(",") if item]
            for item in _java_split(value):
                if operation == ConfigOperation.APPEND and item not in items:
                    items.append(item)
                elif operation == ConfigOperation.SUBTRACT and item in items:
                    items.remove(item)
            altered[name] = ",".join(items)
            changed.append(name)
        else:
            raise TopicError(
                KafkaErrorCode.INVALID_REQUEST, f"Unknown operations type {change.operation}"
            )
    for name in changed:
        altered[name] = check_config(name, altered[name])
    _check_across(altered, defaults)
    return altered


def replaced_configs(
    changes: Sequence[tuple[str, str | None]], defaults: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A topic's configs after AlterConfigs, which replaces the whole set with ``changes``."""
    if _duplicates(name for name, _ in changes):
        raise TopicError(KafkaErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    missing = [name for name, value in changes if value is None]
    if missing:
        raise TopicError(
            KafkaErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(missing)}"
        )
    return check_configs(dict(changes), defaults)


def effective_defaults(broker_settings: Mapping[str, object]) -> dict[str, str]:
    """Each topic config's default on a broker with ``broker_settings`` (property name ->
    value): the broker's setting of the config's synonym where it has one, else Kafka's."""
    defaults = {}
    for name, config in TOPIC_CONFIGS.items():
        setting = broker_settings.get(config.synonym) if config.synonym else None
        defaults[name] = config.default if setting is None else _java_string(setting)
    return defaults


# -------------------------------------------------------------------------------- helpers


def _check_across(configs: Mapping[str, str], defaults: Mapping[str, str] | None) -> None:
    """Kafka's one check across configs: the minimum compaction lag is not above the maximum."""
    low_name, high_name = "min.compaction.lag.ms", "max.compaction.lag.ms"
    low = int(configs.get(low_name, _default(TOPIC_CONFIGS[low_name], defaults)))
    high = int(configs.get(high_name, _default(TOPIC_CONFIGS[high_name], defaults)))
    if low > high:
        raise _invalid(f"conflict topic config setting {low_name} ({low}) > {high_name} ({high})")


def _default(config: TopicConfig, defaults: Mapping[str, str] | None) -> str:
    if defaults is not None and config.name in defaults:
        return defaults[config.name]
    return config.default


def _parse(config: TopicConfig, value: str) -> Parsed:
    text = value.strip()
    kind = config.type
    if kind == ConfigType.BOOLEAN:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _bad_value(value, config.name, "Expected value to be either true or false")
    if kind in _INT_BITS:
        bits = _INT_BITS[kind]
        if _INTEGER.fullmatch(text) and -(2 ** (bits - 1)) <= int(text) < 2 ** (bits - 1):
            return int(text)
        raise _bad_value(value, config.name, f"Not a number of type {kind.name}")
    if kind == ConfigType.DOUBLE:
        if _DOUBLE.fullmatch(text):
            return float(text.rstrip("fFdD"))
        raise _bad_value(value, config.name, f"Not a number of type {kind.name}")
    if kind == ConfigType.LIST:
        return _split_list(text)
    return text


def _split_list(value: str) -> list[str]:
    text = value.strip()
    return _LIST_SEPARATOR.split(text) if text else []


def _java_split(value: str) -> list[str]:
    """``value.split(",")`` as Java splits: trailing empty items dropped (but ``""`` is one)."""
    items = value.split(",")
    if value == "":
        return items
    while items and not items[-1]:
        items.pop()
    return items


def _canonical(config: TopicConfig, parsed: Parsed) -> str:
    if isinstance(parsed, list):
        return ",".join(parsed)
    return _java_string(parsed)


def _java_string(value: object) -> str:
    """``value`` as Kafka prints it: booleans in lower case, doubles as Java does."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _java_double(value)
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def _java_double(value: float) -> str:
    """Java's ``Double.toString``: positional from 10^-3 up to 10^7, else ``d.dddE<n>``;
    the shortest digits that read back as ``value``, which Python's ``repr`` also gives."""
    magnitude = abs(value)
    if magnitude == 0 or 1e-3 <= magnitude < 1e7:
        text = repr(value)
        return text if "." in text else f"{text}.0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits)).rstrip("0") or "0"
    power = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{shown[0]}.{shown[1:] or '0'}E{power}"


def _duplicates(names: Iterable[str]) -> bool:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return True
        seen.add(name)
    return False


def _bad_value(value: str, name: str, problem: str) -> TopicError:
    return _invalid(f"Invalid value {value} for configuration {name}: {problem}")


def _invalid(message: str) -> TopicError:
    return TopicError(KafkaErrorCode.INVALID_CONFIG, message)
