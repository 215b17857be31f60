"""The naming rules: the keys a broker writes are the ones its readers look for."""

from __future__ import annotations

import uuid

from automq_ref.vocabulary import naming


def test_object_key_reverses_the_hex_id() -> None:
    assert naming.object_key("_kafka_abc", 27039) == "f9960000/_kafka_abc/27039"


def test_kv_keys() -> None:
    topic_id = uuid.UUID(int=7)
    assert naming.partition_key(topic_id, 3) == f"partitions/{topic_id}/3"
    assert naming.topic_key("orders") == "topics/orders"
    assert naming.topic_name(naming.topic_key("orders")) == "orders"
    assert naming.topic_name(naming.partition_key(topic_id, 0)) is None
    assert naming.OFFSETS_STREAM_KEY == "groups/offsets-stream"
    assert naming.PRODUCER_ID_KEY == "producer-ids/next"


def test_the_broker_and_its_readers_share_the_namespace() -> None:
    from automq_ref.spark import image

    assert naming.NAMESPACE == "_kafka_automq_ref"
    assert image.NAMESPACE is naming.NAMESPACE
