"""An SSL listener (automq_ref/kafka/tls.py) with Kafka's PEM properties: refused settings named,
and a broker that confluent-kafka, kafka-python, aiokafka and kcat produce to and consume from
over TLS, with client certificates required when ``ssl.client.auth=required``. The certificates are
made for the test (automq_ref/checker/certificates.py)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from cryptography import x509

from automq_ref.checker.certificates import Certificates, make_certificates
from automq_ref.config import ConfigError, load_config
from automq_ref.kafka.tls import TlsConfigError, pem_text
from automq_ref.node import Node, start_node
from tests.security_clients import (
    TIMEOUT_S,
    aiokafka_round_trip,
    bootstrap_of,
    confluent_round_trip,
    kafka_python_round_trip,
    kcat_round_trip,
    started,
    write,
)


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return make_certificates()


def one_line(pem: str) -> str:
    """A PEM text as a properties file holds it: on one line."""
    return " ".join(pem.split())


# --------------------------------------------------------------------------------- settings


def test_refused_settings_name_the_property(tmp_path: Path) -> None:
    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as raised:
            load_config(overrides=list(overrides), environment={})
        return str(raised.value)

    ssl_listener = "listeners=SSL://127.0.0.1:0"
    assert "ssl.keystore.type=JKS" in refused(ssl_listener, "ssl.keystore.location=/x.pem")
    assert "needs its certificate and key" in refused(ssl_listener, "ssl.keystore.type=PEM")
    assert "go together" in refused(
        ssl_listener, "ssl.keystore.type=PEM", "ssl.keystore.certificate.chain=x"
    )
    assert "needs a truststore" in refused(
        ssl_listener,
        "ssl.keystore.type=PEM",
        "ssl.keystore.location=/x.pem",
        "ssl.client.auth=required",
    )
    assert "ssl.client.auth" in refused("ssl.client.auth=always")
    # SASL_SSL is served (tests/unit/test_sasl.py): it needs PLAIN and its users first.
    assert "sasl.enabled.mechanisms=GSSAPI" in refused("listeners=SASL_SSL://127.0.0.1:0")
    assert "not in listener.security.protocol.map" in refused("listeners=INTERNAL://:0")
    assert "listener PLAINTEXT is given more than once" in refused(
        "listeners=PLAINTEXT://127.0.0.1:0,plaintext://127.0.0.1:0"
    )
    assert "several listeners bind port 9092" in refused(
        "listeners=PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092"
    )
    # A name of one's own, mapped to a protocol.
    mapped = load_config(
        overrides=[
            "listeners=internal://127.0.0.1:0",
            "listener.security.protocol.map=INTERNAL:PLAINTEXT",
        ],
        environment={},
    )
    assert [(s.name, s.protocol) for s in mapped.listener_specs] == [("INTERNAL", "PLAINTEXT")]


def test_pem_on_one_line_is_read_back(certificates: Certificates) -> None:
    text = pem_text(one_line(certificates.broker.certificate))
    assert text == certificates.broker.certificate
    x509.load_pem_x509_certificate(text.encode())


async def test_an_unusable_keystore_stops_the_start(tmp_path: Path) -> None:
    config = load_config(
        overrides=[
            f"log.dirs={tmp_path}",
            "listeners=SSL://127.0.0.1:0",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={write(tmp_path, 'junk.pem', 'not a certificate')}",
        ],
        environment={},
    )
    with pytest.raises(TlsConfigError, match=r"ssl\.keystore\.location="):
        await start_node(config)


# ------------------------------------------------------------------------------- a broker


@pytest.fixture
async def tls_node(tmp_path: Path, certificates: Certificates) -> AsyncIterator[Node]:
    keystore = write(
        tmp_path, "broker.pem", certificates.broker.certificate + certificates.broker.key
    )
    node = await started(
        tmp_path,
        "listeners=SSL://127.0.0.1:0",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
    )
    try:
        yield node
    finally:
        await node.shutdown()


def over_tls(bootstrap: str, context: ssl.SSLContext) -> dict[str, Any]:
    return {"bootstrap_servers": bootstrap, "security_protocol": "SSL", "ssl_context": context}


def client_context(certificates: Certificates, directory: Path, *, own: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=certificates.ca.certificate)
    if own:
        chain = write(
            directory, "client.pem", certificates.client.certificate + certificates.client.key
        )
        context.load_cert_chain(chain)
    return context


async def test_clients_produce_and_consume_over_tls(
    tls_node: Node, certificates: Certificates, tmp_path: Path
) -> None:
    bootstrap = bootstrap_of(tls_node)
    context = client_context(certificates, tmp_path, own=False)
    assert await aiokafka_round_trip(over_tls(bootstrap, context), "tls-aiokafka") == [
        b"one",
        b"two",
    ]
    ca = write(tmp_path, "ca.pem", certificates.ca.certificate)
    confluent = {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": ca}
    assert await asyncio.to_thread(confluent_round_trip, confluent, "tls-confluent") == [
        b"three",
        b"four",
    ]
    kafka_python = {"bootstrap_servers": bootstrap, "security_protocol": "SSL", "ssl_cafile": ca}
    assert await asyncio.to_thread(kafka_python_round_trip, kafka_python, "tls-kafka-python") == [
        b"five",
        b"six",
    ]


async def test_kcat_over_tls(tls_node: Node, certificates: Certificates, tmp_path: Path) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (.ci/run installs the Debian package)")
    ca = write(tmp_path, "ca.pem", certificates.ca.certificate)
    tls = ["security.protocol=SSL", f"ssl.ca.location={ca}"]
    found = await asyncio.to_thread(kcat_round_trip, kcat, bootstrap_of(tls_node), tls, "tls-kcat")
    assert found == [f"kcat-{index}" for index in range(10)]


async def test_a_plaintext_client_on_the_tls_listener_is_served_nothing(tls_node: Node) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_of(tls_node), request_timeout_ms=3000)
    with pytest.raises(KafkaConnectionError):
        await asyncio.wait_for(producer.start(), TIMEOUT_S)
    await producer.stop()
    assert not tls_node.topics.topics  # nothing was served: no topic was created


async def test_client_certificates_required(tmp_path: Path, certificates: Certificates) -> None:
    node = await started(
        tmp_path,
        "listeners=SSL://127.0.0.1:0",
        "ssl.keystore.type=PEM",
        # Inline, on one line each, as a properties file holds them.
        f"ssl.keystore.certificate.chain={one_line(certificates.broker.certificate)}",
        f"ssl.keystore.key={one_line(certificates.broker.key)}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.certificates={one_line(certificates.ca.certificate)}",
        "ssl.client.auth=required",
    )
    try:
        bootstrap = bootstrap_of(node)
        anonymous = client_context(certificates, tmp_path, own=False)
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            security_protocol="SSL",
            ssl_context=anonymous,
            request_timeout_ms=3000,
        )
        with pytest.raises(KafkaConnectionError):
            await asyncio.wait_for(producer.start(), TIMEOUT_S)
        await producer.stop()
        assert not node.topics.topics
        known = client_context(certificates, tmp_path, own=True)
        assert await aiokafka_round_trip(over_tls(bootstrap, known), "tls-mutual") == [
            b"one",
            b"two",
        ]
    finally:
        await node.shutdown()


async def test_the_documented_properties_file_starts_a_tls_broker(
    tmp_path: Path, certificates: Certificates
) -> None:
    """docs/broker.md's example ("TLS"), its paths made this test's, its port a free one."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "broker.md").read_text()
    section = page[page.index("## TLS") :]
    start = section.index("```properties\n") + len("```properties\n")
    block = section[start : section.index("```", start)]
    broker = certificates.broker
    paths = {
        "/etc/automq-ref/broker.pem": write(tmp_path, "b.pem", broker.certificate + broker.key),
        "/etc/automq-ref/ca.pem": write(tmp_path, "ca.pem", certificates.ca.certificate),
        "127.0.0.1:9093": "127.0.0.1:0",
    }
    for documented, ours in paths.items():
        assert documented in block, documented
        block = block.replace(documented, ours)
    properties = tmp_path / "secure.properties"
    properties.write_text(block)
    config = load_config(properties, overrides=[f"log.dirs={tmp_path / 'data'}"], environment={})
    (listener,) = config.listener_specs
    assert listener.ssl is not None
    assert (listener.protocol, listener.ssl.get("ssl.client.auth")) == ("SSL", "required")
    node = await start_node(config)
    try:
        await node.listen()
        known = client_context(certificates, tmp_path, own=True)
        assert await aiokafka_round_trip(over_tls(bootstrap_of(node), known), "documented") == [
            b"one",
            b"two",
        ]
    finally:
        await node.shutdown()
