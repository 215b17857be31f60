"""Topics: which names and configs the broker accepts.

A topic's record (id, partition count, configs) lives in the controller's KV under
:func:`~automq_ref.vocabulary.naming.topic_key`, encoded by
:mod:`automq_ref.formats.topic_record` (which also holds the :class:`Topic` value); each
partition's MetaStream is found under :func:`~automq_ref.vocabulary.naming.partition_key` (see
:mod:`automq_ref.kafka.partition`). The KV entry of a topic is written after its partitions exist
and removed before they are deleted, so a topic that can be found always has all its partitions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from automq_ref.errors import KafkaErrorCode

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")

# Topic configs this broker understands, with their defaults as Kafka documents them. A value of
# None means "the broker's setting" (log.retention.ms, ...), filled in by the broker.
TOPIC_CONFIG_DEFAULTS: Mapping[str, str | None] = {
    "retention.ms": None,
    "retention.bytes": None,
    "cleanup.policy": "delete",
    "max.message.bytes": None,
    "message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "segment.bytes": "1073741824",
    "min.insync.replicas": "1",
}
_INTEGER_CONFIGS = {"retention.ms", "retention.bytes", "max.message.bytes", "segment.bytes"}


class TopicError(Exception):
    def __init__(self, code: KafkaErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise TopicError(KafkaErrorCode.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise TopicError(
            KafkaErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name of {len(name)} characters exceeds {MAX_TOPIC_NAME_LENGTH}",
        )
    if not _LEGAL_NAME.fullmatch(name):
        raise TopicError(
            KafkaErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} may hold only ASCII letters, digits, '.', '_' and '-'",
        )


def check_topic_config(name: str, value: str | None) -> None:
    if name not in TOPIC_CONFIG_DEFAULTS:
        raise TopicError(KafkaErrorCode.INVALID_CONFIG, f"unknown or unsupported config {name}")
    if value is None:
        return
    if name in _INTEGER_CONFIGS:
        try:
            number = int(value)
        except ValueError:
            raise TopicError(
                KafkaErrorCode.INVALID_CONFIG, f"{name}={value!r} is not an integer"
            ) from None
        if number < -1:
            raise TopicError(KafkaErrorCode.INVALID_CONFIG, f"{name}={value} is below -1")
    if name == "cleanup.policy" and value != "delete":
        raise TopicError(KafkaErrorCode.INVALID_CONFIG, "only cleanup.policy=delete is supported")
    if name == "message.timestamp.type" and value != "CreateTime":
        raise TopicError(
            KafkaErrorCode.INVALID_CONFIG, "only message.timestamp.type=CreateTime is supported"
        )
