"""Topics: which names the broker accepts, and the error every topic change raises.

A topic's record (id, partition count, configs) lives in the controller's KV under
:func:`~automq_ref.vocabulary.naming.topic_key`, encoded by
:mod:`automq_ref.formats.topic_record` (which also holds the :class:`Topic` value); each
partition's MetaStream is found under :func:`~automq_ref.vocabulary.naming.partition_key` (see
:mod:`automq_ref.kafka.partition`). The KV entry of a topic is written after its partitions exist
and removed before they are deleted, so a topic that can be found always has all its partitions.
Topic configs have their own module, :mod:`automq_ref.kafka.topic_configs`.

Manual replica assignments (CreateTopics, CreatePartitions) are checked here too: shared storage
keeps one copy, so a valid assignment gives each partition exactly one replica, a known broker
(this node). Nothing of it is stored: the node is every partition's leader.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from automq_ref.errors import KafkaErrorCode

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


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


def check_replica_assignment(
    assignments: Sequence[tuple[int, Sequence[int]]], first: int, brokers: Sequence[int]
) -> None:
    """``assignments`` (partition index, its replicas' broker ids) for the partitions from
    ``first`` on: each index once, the indices ``first``.. without gaps, and each partition's
    replicas exactly one known broker of ``brokers``. INVALID_REPLICA_ASSIGNMENT otherwise."""
    seen: set[int] = set()
    for index, replicas in assignments:
        if index in seen:
            raise _invalid(f"partition {index} is assigned more than once")
        seen.add(index)
        if not replicas:
            raise _invalid(f"partition {index} is assigned no replica")
        for broker in replicas:
            if list(replicas).count(broker) > 1:
                raise _invalid(f"partition {index} lists broker {broker} more than once")
            if broker not in brokers:
                raise _invalid(
                    f"partition {index} is assigned to broker {broker}, which is not registered "
                    f"and live (live brokers: {', '.join(map(str, brokers))})"
                )
        if len(replicas) != 1:
            raise _invalid(
                f"partition {index} is assigned {len(replicas)} replicas: shared storage keeps "
                "one copy, so a partition has exactly one replica"
            )
    expected = set(range(first, first + len(assignments)))
    if seen != expected:
        raise _invalid(
            f"partitions {sorted(seen)} are not the consecutive indices "
            f"{first}..{first + len(assignments) - 1}"
        )


def _invalid(message: str) -> TopicError:
    return TopicError(KafkaErrorCode.INVALID_REPLICA_ASSIGNMENT, message)
