"""``config/secure.properties`` starts a secured broker, as the README says: in a fresh directory,
``automq-ref certificates data/secure/certs`` then ``automq-ref serve --config
config/secure.properties`` (only the ports overridden: free ones, since 9092 and 9464 are
``make run``'s).

Then, with confluent-kafka over SASL_SSL: the admin (PLAIN, the file's super user) creates a
SCRAM-SHA-512 user and a topic; the user is refused the topic (TOPIC_AUTHORIZATION_FAILED) until
the admin grants it WRITE and READ and READ on a group through CreateAcls; then the user
produces and its group reads the record back; a wrong password is served nothing; the metrics
endpoint answers.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    NewTopic,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from automq_ref.checker.cluster import SERVING
from automq_ref.checker.etcd_member import free_port
from tests.security_clients import alice_may

REPO = Path(__file__).resolve().parents[2]
PROPERTIES = REPO / "config" / "secure.properties"
TIMEOUT_S = 30


def cli(*arguments: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "automq_ref.cli", *arguments],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=(cwd / "broker.log").open("a"),
        text=True,
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """(bootstrap, the CA file, the metrics port) of the broker the file configures."""
    directory = tmp_path_factory.mktemp("secure")
    certificates = cli("certificates", "data/secure/certs", cwd=directory)
    assert certificates.wait(TIMEOUT_S) == 0, (directory / "broker.log").read_text()
    metrics = free_port()
    process = cli(
        "serve",
        "--config",
        str(PROPERTIES),
        "--override",
        "listeners=SASL_SSL://127.0.0.1:0",
        "--override",
        f"s3.telemetry.metrics.exporter.uri=prometheus://?host=127.0.0.1&port={metrics}",
        cwd=directory,
    )
    try:
        assert process.stdout is not None
        found = None
        for line in process.stdout:
            found = SERVING.search(line)
            if found:
                break
        assert found, (directory / "broker.log").read_text()
        yield f"127.0.0.1:{found.group(2)}", str(directory / "data/secure/certs/ca.pem"), metrics
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def login(broker: tuple[str, str, int], mechanism: str, user: str, password: str) -> dict[str, Any]:
    bootstrap, ca, _ = broker
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": ca,
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def produce(settings: dict[str, Any], topic: str, value: bytes) -> KafkaError | None:
    """The delivery's error (None: delivered)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**settings, "message.timeout.ms": 15_000})
    producer.produce(topic, value, on_delivery=lambda error, _: outcome.append(error))
    producer.flush(TIMEOUT_S)
    assert len(outcome) == 1
    return outcome[0]


def test_the_secure_properties_serve_only_what_acls_allow(broker: tuple[str, str, int]) -> None:
    admin = AdminClient(login(broker, "PLAIN", "admin", "admin-secret"))
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"alice-secret"
    )
    admin.alter_user_scram_credentials([upsert])["alice"].result(TIMEOUT_S)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1)])[topic].result(TIMEOUT_S)
    alice = login(broker, "SCRAM-SHA-512", "alice", "alice-secret")

    refused = produce(alice, topic, b"before")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    grants = [
        alice_may(AclOperation.WRITE, ResourceType.TOPIC, topic),
        alice_may(AclOperation.READ, ResourceType.TOPIC, topic),
        alice_may(AclOperation.READ, ResourceType.GROUP, group),
    ]
    for future in admin.create_acls(grants).values():
        future.result(TIMEOUT_S)

    assert produce(alice, topic, b"after") is None
    consumer = Consumer({**alice, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        read = None
        for _ in range(TIMEOUT_S * 2):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read = message.value()
                break
        assert read == b"after"
    finally:
        consumer.close()


def test_a_wrong_password_is_served_nothing(broker: tuple[str, str, int]) -> None:
    stranger = AdminClient(login(broker, "SCRAM-SHA-512", "alice", "wrong"))
    never = f"never-{uuid.uuid4().hex[:6]}"
    future = stranger.create_topics([NewTopic(never, 1)], request_timeout=5)[never]
    with pytest.raises(KafkaException):
        future.result(TIMEOUT_S)
    admin = AdminClient(login(broker, "PLAIN", "admin", "admin-secret"))
    assert never not in admin.list_topics(timeout=TIMEOUT_S).topics


def test_the_metrics_endpoint_answers(broker: tuple[str, str, int]) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker[2]}/metrics", timeout=10) as answer:
        assert b"kafka_request_count_total" in answer.read()
