"""Admin conformance against a broker process: authorized operations (KIP-430) as a broker
without an authorizer answers them."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess

TOPIC_OPERATIONS = {
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
}
CLUSTER_OPERATIONS = {
    AclOperation.CREATE,
    AclOperation.ALTER,
    AclOperation.DESCRIBE,
    AclOperation.CLUSTER_ACTION,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE,
}
GROUP_OPERATIONS = {AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_confluent_kafka_sees_every_operation_when_asked(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("ops")
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()

    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[
        topic
    ].result(10)
    assert set(described.authorized_operations) == TOPIC_OPERATIONS
    assert len(described.authorized_operations) == 8
    plain = admin.describe_topics(TopicCollection([topic]))[topic].result(10)
    assert not plain.authorized_operations

    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == CLUSTER_OPERATIONS
    assert not admin.describe_cluster().result(10).authorized_operations

    group = unique("ops-group")
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    try:
        future = admin.describe_consumer_groups([group], include_authorized_operations=True)
        described_group = future[group].result(10)
        assert set(described_group.authorized_operations) == GROUP_OPERATIONS
        plain_group = admin.describe_consumer_groups([group])[group].result(10)
        assert not plain_group.authorized_operations
    finally:
        consumer.close()
