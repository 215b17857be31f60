"""Topic records in the controller's KV store: a topic's id, partition count and configs.

Under :func:`~automq_ref.vocabulary.naming.topic_key` the broker keeps the JSON
``{"configs": {...}, "id": "<uuid>", "partitions": n}`` (keys sorted); the name is the key's
suffix, not part of the value. The broker writes it when it creates a topic or changes its
configs, and reads every topic back at start-up; the ``automq-objects`` Spark source reads them
to plan its reads. Both go through :func:`topics_in`.

:class:`Topic` is plain data; which names and configs are legal is the broker's business
(:mod:`automq_ref.kafka.topics`), not the codec's: the codec checks only that the fields have
their types.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from automq_ref.formats.errors import InvalidFieldError
from automq_ref.formats.json_document import (
    Json,
    decode_json,
    encode_json,
    require_field,
    require_int,
    require_object,
    require_str,
)
from automq_ref.vocabulary.naming import topic_name

MAX_PARTITIONS = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The KV value of this topic (see :func:`encode_topic`)."""
        return encode_topic(self)

    @classmethod
    def decode(cls, name: str, raw: bytes | bytearray | memoryview) -> Topic:
        """Topic ``name`` from its KV value (see :func:`decode_topic`)."""
        return decode_topic(name, raw)


def encode_topic(topic: Topic) -> bytes:
    configs: dict[str, Json] = dict(topic.configs)
    document: dict[str, Json] = {
        "id": str(topic.topic_id),
        "partitions": topic.partitions,
        "configs": configs,
    }
    return encode_json(document, sort_keys=True)


def decode_topic(name: str, raw: bytes | bytearray | memoryview) -> Topic:
    what = f"topic record {name!r}"
    document = require_object(decode_json(raw, what), what)
    raw_id = require_str(require_field(document, "id", what), f"{what} id")
    try:
        topic_id = uuid.UUID(raw_id)
    except ValueError as error:
        raise InvalidFieldError(f"{what}: id {raw_id!r} is not a UUID") from error
    partitions = require_int(
        require_field(document, "partitions", what), f"{what} partitions", minimum=0
    )
    if partitions > MAX_PARTITIONS:
        raise InvalidFieldError(f"{what}: {partitions} partitions")
    configs = require_object(require_field(document, "configs", what), f"{what} configs")
    checked = {key: require_str(value, f"{what} config {key!r}") for key, value in configs.items()}
    return Topic(name, topic_id, partitions, checked)


def topics_in(kv: Mapping[str, bytes]) -> dict[str, Topic]:
    """Every topic recorded in the controller's KV store ``kv``, by name."""
    topics: dict[str, Topic] = {}
    for key, value in kv.items():
        name = topic_name(key)
        if name is not None:
            topics[name] = decode_topic(name, value)
    return topics
