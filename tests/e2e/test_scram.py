"""SASL/SCRAM with real clients: users created with confluent-kafka's AdminClient
(alter_user_scram_credentials) over a SASL/PLAIN admin login, then confluent-kafka producers and
consumers with SCRAM-SHA-512 and SCRAM-SHA-256 on SASL_SSL and SASL_PLAINTEXT, kafka-python too;
a wrong password is served nothing; describe_user_scram_credentials lists the users; a deleted
credential logs in no more. One broker (in this process) for the module, every port a free one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from automq_ref.checker.certificates import make_certificates
from automq_ref.config import load_config
from automq_ref.node import Node, start_node
from tests.security_clients import TIMEOUT_S, confluent_round_trip, kafka_python_round_trip

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret";'
)
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Node, Path]]:
    """SECURE (SASL_SSL: PLAIN for the admin, SCRAM-SHA-256 and -512) and AUTH
    (SASL_PLAINTEXT, SCRAM only: no JAAS users)."""
    directory = tmp_path_factory.mktemp("scram")
    certificates = make_certificates()
    keystore = directory / "broker.pem"
    keystore.write_text(certificates.broker.certificate + certificates.broker.key)
    (directory / "ca.pem").write_text(certificates.ca.certificate)
    config = load_config(
        overrides=[
            f"log.dirs={directory / 'data'}",
            "s3.wal.capacity=16777216",
            "group.initial.rebalance.delay.ms=0",
            "listeners=SECURE://127.0.0.1:0,AUTH://127.0.0.1:0",
            "listener.security.protocol.map=SECURE:SASL_SSL,AUTH:SASL_PLAINTEXT",
            "listener.name.secure.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            f"listener.name.secure.plain.sasl.jaas.config={ADMIN_JAAS}",
            "listener.name.auth.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={keystore}",
        ],
        environment={},
    )
    node = await start_node(config)
    try:
        await node.listen()
        yield node, directory
    finally:
        await node.shutdown()


def secure(broker: tuple[Node, Path], mechanism: str, user: str, password: str) -> dict[str, Any]:
    node, directory = broker
    host, port = node.bound_listeners["SECURE"]
    return {
        "bootstrap.servers": f"{host}:{port}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(directory / "ca.pem"),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def auth(broker: tuple[Node, Path], mechanism: str, user: str, password: str) -> dict[str, Any]:
    host, port = broker[0].bound_listeners["AUTH"]
    return {
        "bootstrap.servers": f"{host}:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def admin_settings(broker: tuple[Node, Path]) -> dict[str, Any]:
    return secure(broker, "PLAIN", "admin", "admin-secret")


def alter(settings: dict[str, Any], alterations: list[Any]) -> dict[str, str]:
    """Each user's outcome: "ok" or the error's text."""
    admin = AdminClient(settings)
    outcome = {}
    for user, future in admin.alter_user_scram_credentials(alterations).items():
        try:
            future.result(TIMEOUT_S)
            outcome[user] = "ok"
        except KafkaException as error:
            outcome[user] = str(error)
    return outcome


def described(settings: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    admin = AdminClient(settings)
    future: Any = admin.describe_user_scram_credentials()  # all users: one future
    result = future.result(TIMEOUT_S)
    return {
        user: sorted(
            (info.mechanism.value, info.iterations) for info in found.scram_credential_infos
        )
        for user, found in result.items()
    }


def create_topic(settings: dict[str, Any], topic: str) -> str:
    admin = AdminClient(settings)
    future = admin.create_topics([NewTopic(topic, 1)], request_timeout=5)[topic]
    try:
        future.result(TIMEOUT_S)
    except KafkaException as error:
        return str(error)
    return "created"


async def test_users_created_over_plain_log_in_with_scram(broker: tuple[Node, Path]) -> None:
    admin = admin_settings(broker)
    created = await asyncio.to_thread(
        alter,
        admin,
        [
            UserScramCredentialUpsertion("alice", ScramCredentialInfo(SHA512, 8192), b"alice-pw"),
            UserScramCredentialUpsertion("bob", ScramCredentialInfo(SHA256, 4096), b"bob-pw"),
        ],
    )
    assert created == {"alice": "ok", "bob": "ok"}
    # The same user twice in one request: Kafka's DUPLICATE_RESOURCE for that user.
    twice = await asyncio.to_thread(
        alter,
        admin,
        [
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(SHA256, 4096), b"c"),
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(SHA512, 4096), b"c"),
        ],
    )
    assert "cannot be altered twice" in twice["carol"]
    assert await asyncio.to_thread(
        alter,
        admin,
        [UserScramCredentialUpsertion("alice", ScramCredentialInfo(SHA256, 4096), b"alice-pw")],
    ) == {"alice": "ok"}
    assert await asyncio.to_thread(described, admin) == {
        "alice": [(SHA256.value, 4096), (SHA512.value, 8192)],
        "bob": [(SHA256.value, 4096)],
    }
    for settings, topic in (
        (auth(broker, "SCRAM-SHA-512", "alice", "alice-pw"), "scram-512-plaintext"),
        (auth(broker, "SCRAM-SHA-256", "bob", "bob-pw"), "scram-256-plaintext"),
        (secure(broker, "SCRAM-SHA-512", "alice", "alice-pw"), "scram-512-ssl"),
        (secure(broker, "SCRAM-SHA-256", "alice", "alice-pw"), "scram-256-ssl"),
    ):
        found = await asyncio.to_thread(confluent_round_trip, settings, topic, (b"one", b"two"))
        assert found == [b"one", b"two"], topic


async def test_kafka_python_with_scram(broker: tuple[Node, Path]) -> None:
    admin = admin_settings(broker)
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(SHA512, 8192), b"alice-pw")
    assert await asyncio.to_thread(alter, admin, [upsert]) == {"alice": "ok"}
    host, port = broker[0].bound_listeners["AUTH"]
    options: dict[str, Any] = {
        "bootstrap_servers": f"{host}:{port}",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-pw",
    }
    found = await asyncio.to_thread(kafka_python_round_trip, options, "scram-kafka-python")
    assert found == [b"five", b"six"]


async def test_a_wrong_password_and_a_deleted_credential_are_refused(
    broker: tuple[Node, Path],
) -> None:
    node = broker[0]
    admin = admin_settings(broker)
    upsert = UserScramCredentialUpsertion("dave", ScramCredentialInfo(SHA512, 4096), b"dave-pw")
    assert await asyncio.to_thread(alter, admin, [upsert]) == {"dave": "ok"}
    for settings in (
        auth(broker, "SCRAM-SHA-512", "dave", "wrong"),
        secure(broker, "SCRAM-SHA-512", "dave", "wrong"),
        auth(broker, "SCRAM-SHA-256", "dave", "dave-pw"),  # dave has no SCRAM-SHA-256
        auth(broker, "SCRAM-SHA-512", "nobody", "x"),
    ):
        assert await asyncio.to_thread(create_topic, settings, "never") != "created"
    assert "never" not in node.topics.topics
    right = auth(broker, "SCRAM-SHA-512", "dave", "dave-pw")
    assert await asyncio.to_thread(create_topic, right, "dave-topic") == "created"
    gone = await asyncio.to_thread(alter, admin, [UserScramCredentialDeletion("dave", SHA512)])
    assert gone == {"dave": "ok"}
    assert "dave" not in await asyncio.to_thread(described, admin)
    assert await asyncio.to_thread(create_topic, right, "after-delete") != "created"
    assert "after-delete" not in node.topics.topics
