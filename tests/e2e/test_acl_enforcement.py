"""ACLs enforced for a real client: docs/broker.md's example ("ACLs") started in this process
(its port a free one): the StandardAuthorizer on a SASL_PLAINTEXT listener, ``admin`` its super
user; confluent-kafka logged in as ``alice`` is refused (its produce, its group's consumption,
CreateTopics, and Metadata names none of the topics) until the admin's AdminClient creates ACLs
for her with CreateAcls, and then served; a topic she has no ACL on stays out of her
Metadata."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
)

from automq_ref.config import load_config
from automq_ref.node import Node, start_node
from automq_ref.state_machines.acl import STANDARD_AUTHORIZER
from tests.security_clients import TIMEOUT_S, alice_may, bootstrap_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "broker.md"


def documented_properties() -> str:
    """The properties block of docs/broker.md's "ACLs" section."""
    section = DOCS.read_text().split("\n## ACLs\n", 1)[1]
    start = section.index("```properties\n") + len("```properties\n")
    return section[start : section.index("```", start)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    """The documented example, its port a free one."""
    directory = tmp_path_factory.mktemp("acls")
    block = documented_properties()
    assert "127.0.0.1:9094" in block and STANDARD_AUTHORIZER in block
    properties = directory / "acls.properties"
    properties.write_text(block.replace("127.0.0.1:9094", "127.0.0.1:0"))
    config = load_config(
        properties,
        overrides=[
            f"log.dirs={directory / 'data'}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
        ],
        environment={},
    )
    assert config.authorizer.super_users == {"User:admin"}
    node = await start_node(config)
    try:
        await node.listen()
        yield node
    finally:
        await node.shutdown()


def login(node: Node, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(node),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": f"{user}-secret",
    }


def create_topic(settings: dict[str, Any], topic: str) -> int:
    """CreateTopics of one topic: 0, or the error's code."""
    admin = AdminClient(settings)  # kept while its futures are waited for
    future = admin.create_topics([NewTopic(topic, 1)], request_timeout=10)[topic]
    try:
        future.result(TIMEOUT_S)
    except KafkaException as error:
        return int(error.args[0].code())
    return 0


def topics_seen(settings: dict[str, Any]) -> set[str]:
    return set(AdminClient(settings).list_topics(timeout=TIMEOUT_S).topics)


def produce(settings: dict[str, Any], topic: str, value: bytes) -> int:
    """One record: 0 once delivered, or the delivery error's code."""
    outcome: list[int] = []

    def delivered(error: KafkaError | None, _message: Any) -> None:
        outcome.append(0 if error is None else error.code())

    producer = Producer({**settings, "message.timeout.ms": 10_000})
    producer.produce(topic, value, on_delivery=delivered)
    producer.flush(TIMEOUT_S)
    assert outcome, "no delivery report"
    return outcome[0]


def consume(settings: dict[str, Any], topic: str, group: str) -> bytes | int:
    """The first record group ``group`` reads from the beginning, or the first error's code."""
    consumer = Consumer({**settings, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        for _ in range(TIMEOUT_S * 2):
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                return int(error.code())
            value = message.value()
            assert value is not None
            return value
    finally:
        consumer.close()
    raise AssertionError("nothing read and no error")


def grant(settings: dict[str, Any], *bindings: AclBinding) -> None:
    admin = AdminClient(settings)
    for future in admin.create_acls(list(bindings)).values():
        future.result(TIMEOUT_S)


async def test_alice_is_refused_until_the_admin_grants_her_acls(broker: Node) -> None:
    admin, alice = login(broker, "admin"), login(broker, "alice")
    group = f"orders-{uuid.uuid4().hex}"
    assert await asyncio.to_thread(create_topic, admin, "orders") == 0
    assert await asyncio.to_thread(create_topic, admin, "secret") == 0
    assert await asyncio.to_thread(produce, admin, "orders", b"from-admin") == 0

    # No ACL names alice (and allow.everyone.if.no.acl.found is off): every door is shut.
    assert {"orders", "secret"} <= await asyncio.to_thread(topics_seen, admin)
    assert not {"orders", "secret"} & await asyncio.to_thread(topics_seen, alice)
    assert (
        await asyncio.to_thread(create_topic, alice, "alices")
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert (
        await asyncio.to_thread(produce, alice, "orders", b"from-alice")
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    # With READ on the topic but none on the group, the group refuses her.
    await asyncio.to_thread(grant, admin, alice_may(AclOperation.READ))
    assert (
        await asyncio.to_thread(consume, alice, "orders", group)
        == KafkaError.GROUP_AUTHORIZATION_FAILED
    )

    await asyncio.to_thread(
        grant,
        admin,
        alice_may(AclOperation.WRITE),
        alice_may(AclOperation.READ, ResourceType.GROUP, group),
        alice_may(AclOperation.CREATE, ResourceType.BROKER, "kafka-cluster"),
    )
    assert await asyncio.to_thread(produce, alice, "orders", b"from-alice") == 0
    assert await asyncio.to_thread(consume, alice, "orders", group) == b"from-admin"
    assert await asyncio.to_thread(create_topic, alice, "alices") == 0
    # Metadata: the topics she may describe (READ and WRITE imply DESCRIBE), never "secret".
    seen = await asyncio.to_thread(topics_seen, alice)
    assert "orders" in seen and "secret" not in seen
