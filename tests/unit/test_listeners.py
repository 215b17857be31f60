"""Several listeners at once (formats/listeners.py, kafka/listeners.py): the settings and their
refusals; one broker serving PLAINTEXT, SSL and SASL_PLAINTEXT together, each listener's clients
told that listener's addresses (Metadata, FindCoordinator) and the SASL one refusing strangers; two
brokers on etcd whose inter-broker listener is SASL_SSL, a transaction across both committed
through their links; a broker link with a wrong login refused."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from automq_ref.checker.certificates import Certificates, make_certificates
from automq_ref.config import ConfigError, load_config
from automq_ref.formats.listeners import ListenerAddress, parse_listeners
from automq_ref.kafka.listeners import (
    LinkLogin,
    LinkLoginError,
    LinkSecurity,
    advertised_endpoints,
    link_security,
    open_link,
)
from automq_ref.kafka.server import CloseConnection, KafkaServer, Peer, Reply
from automq_ref.kafka.tls import (
    ANONYMOUS,
    certificate_principal,
    client_ssl_context,
    server_ssl_context,
)
from automq_ref.node import Node, start_node
from automq_ref.state_machines import stream_metadata as sm
from tests.etcd_fixture import EtcdServer, running_etcd, unique_cluster_id
from tests.security_clients import started, write

TIMEOUT_S = 30
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="broker" password="broker-secret" '
    'user_broker="broker-secret" user_alice="alice-secret";'
)
THREE = (
    "listeners=PLAINTEXT://127.0.0.1:0,SECURE://127.0.0.1:0,AUTH://127.0.0.1:0",
    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SECURE:SSL,AUTH:SASL_PLAINTEXT",
    "listener.name.auth.sasl.enabled.mechanisms=PLAIN",
    f"listener.name.auth.plain.sasl.jaas.config={JAAS}",
)


KEYSTORE = ("ssl.keystore.type=PEM", "ssl.keystore.location=/k.pem")


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return make_certificates()


def keystore(directory: Path, certificates: Certificates) -> list[str]:
    chain = write(
        directory, "broker.pem", certificates.broker.certificate + certificates.broker.key
    )
    trust = write(directory, "ca.pem", certificates.ca.certificate)
    return [
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={chain}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={trust}",
    ]


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(overrides=list(overrides), environment={})
    return str(raised.value)


# --------------------------------------------------------------------------------- settings


def test_listener_lists() -> None:
    assert parse_listeners("plaintext://:9092, SSL://[::1]:9093") == (
        ListenerAddress("PLAINTEXT", "", 9092),
        ListenerAddress("SSL", "::1", 9093),
    )
    assert str(ListenerAddress("SSL", "::1", 9093)) == "SSL://[::1]:9093"
    assert len(parse_listeners("A://h:0,B://h:0")) == 2  # free ports each
    with pytest.raises(ValueError, match="'B://h': a listener is NAME://host:port"):
        parse_listeners("A://h:1,B://h")


def test_each_listener_has_its_protocol_and_settings(tmp_path: Path) -> None:
    trust = write(tmp_path, "other-ca.pem", "x")
    config = load_config(
        overrides=[
            *THREE,
            "ssl.keystore.type=PEM",
            "ssl.keystore.location=/k.pem",
            f"listener.name.secure.ssl.truststore.location={trust}",
            "listener.name.secure.ssl.truststore.type=PEM",
            "listener.name.secure.ssl.client.auth=required",
            "advertised.listeners=PLAINTEXT://proxy.example:19092,AUTH://127.0.0.1:29092",
            "inter.broker.listener.name=auth",
        ],
        environment={},
    )
    plain, secure, auth = config.listener_specs
    assert [(s.name, s.protocol) for s in config.listener_specs] == [
        ("PLAINTEXT", "PLAINTEXT"),
        ("SECURE", "SSL"),
        ("AUTH", "SASL_PLAINTEXT"),
    ]
    assert plain.ssl is None and plain.sasl is None
    assert secure.ssl is not None and secure.ssl.get("ssl.client.auth") == "required"
    assert secure.ssl.get("ssl.keystore.location") == "/k.pem"  # the global one
    assert secure.ssl.get("ssl.truststore.location") == trust  # the listener's own
    assert auth.sasl is not None and auth.sasl.plain_users == {
        "broker": "broker-secret",
        "alice": "alice-secret",
    }
    assert secure.advertised is None  # advertised.listeners names PLAINTEXT and AUTH only
    assert config.inter_broker_listener is auth
    bound = {"PLAINTEXT": ("127.0.0.1", 1), "SECURE": ("127.0.0.1", 2), "AUTH": ("127.0.0.1", 3)}
    assert advertised_endpoints(config.listener_specs, bound) == (
        sm.Endpoint("PLAINTEXT", "proxy.example", 19092),
        sm.Endpoint("AUTH", "127.0.0.1", 29092),
    )
    # Without advertised.listeners: every listener at its bound address; the inter-broker
    # listener defaults to the one named PLAINTEXT.
    bare = load_config(
        overrides=[*THREE, *KEYSTORE],
        environment={},
    )
    assert bare.inter_broker_listener.name == "PLAINTEXT"
    assert [e.port for e in advertised_endpoints(bare.listener_specs, bound)] == [1, 2, 3]


def test_refused_listener_settings_name_the_problem() -> None:
    assert "listener B is given more than once" in refused(
        "listeners=B://h:1,b://h:2", "listener.security.protocol.map=B:SSL"
    )
    assert "several listeners bind port 9" in refused(
        "listeners=PLAINTEXT://h:9,SSL://g:9", "ssl.keystore.type=PEM", "ssl.keystore.location=/k"
    )
    assert "listener OTHER is not in listeners" in refused("advertised.listeners=OTHER://h:1")
    assert "is not an address a client can connect to" in refused(
        "advertised.listeners=PLAINTEXT://0.0.0.0:9092"
    )
    assert "inter.broker.listener.name=NONE: not a listener" in refused(
        "inter.broker.listener.name=NONE"
    )
    assert "the listener is not in advertised.listeners" in refused(
        *THREE,
        *KEYSTORE,
        "advertised.listeners=PLAINTEXT://h:1",
        "inter.broker.listener.name=AUTH",
    )
    assert "listener.name.secure.ssl.client.auth=always: one of" in refused(
        *THREE,
        *KEYSTORE,
        "listener.name.secure.ssl.client.auth=always",
    )
    assert "listener.name.secure.ssl.keystore.type=JKS" in refused(
        *THREE, "ssl.keystore.location=/k.pem", "listener.name.secure.ssl.keystore.type=JKS"
    )
    assert "listener.name.auth.sasl.enabled.mechanisms=GSSAPI" in refused(
        *THREE[:2], *KEYSTORE, "listener.name.auth.sasl.enabled.mechanisms=GSSAPI"
    )


# ------------------------------------------------------------------- one broker, three listeners


@pytest.fixture
async def three(tmp_path: Path, certificates: Certificates) -> AsyncIterator[Node]:
    node = await started(tmp_path, *THREE, *keystore(tmp_path, certificates))
    try:
        yield node
    finally:
        await node.shutdown()


def address(bound: tuple[str, int]) -> str:
    return f"{bound[0]}:{bound[1]}"


def clients(node: Node, directory: Path) -> dict[str, dict[str, Any]]:
    """Confluent settings per listener name."""
    bound = node.bound_listeners
    ca = str(directory / "ca.pem")
    return {
        "PLAINTEXT": {"bootstrap.servers": address(bound["PLAINTEXT"])},
        "SECURE": {
            "bootstrap.servers": address(bound["SECURE"]),
            "security.protocol": "SSL",
            "ssl.ca.location": ca,
        },
        "AUTH": {
            "bootstrap.servers": address(bound["AUTH"]),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        },
    }


def brokers_told(settings: dict[str, Any]) -> dict[int, tuple[str, int]]:
    metadata = AdminClient(settings).list_topics(timeout=TIMEOUT_S)
    return {b.id: (str(b.host), b.port) for b in metadata.brokers.values()}


def consume(settings: dict[str, Any], topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            **settings,
            "group.id": f"listeners-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    found: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            value = None if message is None or message.error() else message.value()
            if value is not None:
                found.append(value)
    finally:
        consumer.close()
    return found


async def test_each_listener_is_told_its_own_addresses(three: Node, tmp_path: Path) -> None:
    settings = clients(three, tmp_path)
    for name, options in settings.items():
        told = await asyncio.to_thread(brokers_told, options)
        assert told == {0: three.bound_listeners[name]}, name


async def test_one_topic_through_all_three_listeners(three: Node, tmp_path: Path) -> None:
    settings = clients(three, tmp_path)

    def produce_everywhere() -> None:
        for name, options in settings.items():
            producer = Producer(options)
            producer.produce("shared", name.encode())
            assert producer.flush(TIMEOUT_S) == 0, name

    await asyncio.to_thread(produce_everywhere)
    # A group on each listener: its coordinator is found at that listener's address.
    for name, options in settings.items():
        found = await asyncio.to_thread(consume, options, "shared", 3)
        assert sorted(found) == [b"AUTH", b"PLAINTEXT", b"SECURE"], name


async def test_only_the_sasl_listener_wants_a_login(three: Node, tmp_path: Path) -> None:
    settings = clients(three, tmp_path)
    wrong = {**settings["AUTH"], "sasl.password": "wrong"}

    def refused_metadata() -> None:
        with pytest.raises(KafkaException):
            AdminClient(wrong).list_topics(timeout=5)

    await asyncio.to_thread(refused_metadata)
    # The same login on the other listeners is not asked for at all.
    assert await asyncio.to_thread(brokers_told, settings["PLAINTEXT"])


async def test_a_broker_link_logs_in_or_is_refused(three: Node) -> None:
    host, port = three.bound_listeners["AUTH"]
    _, writer = await open_link(
        host, port, LinkSecurity(login=LinkLogin("PLAIN", "broker", "broker-secret"))
    )
    writer.close()
    with pytest.raises(LinkLoginError, match="Invalid username or password"):
        await open_link(host, port, LinkSecurity(login=LinkLogin("PLAIN", "broker", "nope")))


# --------------------------------------------------------- two brokers, a SASL_SSL inter-broker


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd() as server:
        yield server


async def until(condition: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_brokers_link_over_their_sasl_ssl_listener(
    tmp_path: Path, etcd: EtcdServer, certificates: Certificates
) -> None:
    cluster_id = unique_cluster_id("listeners")
    security = keystore(tmp_path, certificates)
    nodes: list[Node] = []

    def overrides(node_id: int) -> list[str]:
        return [
            "listeners=CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
            "listener.security.protocol.map=CLIENT:PLAINTEXT,BROKER:SASL_SSL",
            "inter.broker.listener.name=BROKER",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            "listener.name.broker.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.broker.plain.sasl.jaas.config={JAAS}",
            *security,
            f"node.id={node_id}",
            f"s3.data.buckets={(tmp_path / 'objects').as_uri()}",
            f"metadata.etcd.endpoints={etcd.endpoint}",
            f"cluster.id={cluster_id}",
            "controller.lease.ttl.ms=2000",
            "transaction.state.log.num.partitions=1",
        ]

    try:
        for node_id in (1, 2):
            nodes.append(await started(tmp_path / f"broker-{node_id}", *overrides(node_id)))
        first, second = nodes
        await until(lambda: len(sm.live_brokers(second.view.image)) == 2)
        # Each broker registered both listeners; a client of CLIENT is told CLIENT addresses.
        registered = second.view.image.brokers[1].listeners
        assert [e.name for e in registered] == ["CLIENT", "BROKER"]
        client: dict[str, Any] = {"bootstrap.servers": address(first.bound_listeners["CLIENT"])}
        told = await asyncio.to_thread(brokers_told, client)
        assert told == {n.config.node_id: n.bound_listeners["CLIENT"] for n in nodes}
        # The links speak TLS with SASL: the context checks the broker's certificate.
        assert link_security(first.config).login == LinkLogin("PLAIN", "broker", "broker-secret")
        assert client_ssl_context(first.config.inter_broker_listener) is not None

        def transaction() -> list[bytes]:
            admin = AdminClient(client)
            for future in admin.create_topics([NewTopic("linked", 2, 1)]).values():
                future.result(TIMEOUT_S)
            producer = Producer({**client, "transactional.id": f"t-{uuid.uuid4().hex}"})
            producer.init_transactions(TIMEOUT_S)
            producer.begin_transaction()
            for partition in (0, 1):
                producer.produce("linked", f"p{partition}".encode(), partition=partition)
            producer.commit_transaction(TIMEOUT_S)
            return consume(client, "linked", 2)

        # The two partitions are led by the two brokers: the coordinator's commit markers go to
        # the other broker over the SASL_SSL link.
        assert sorted(await asyncio.to_thread(transaction)) == [b"p0", b"p1"]
        placed = [sm.partition_assignment(second.view.image, "linked", i) for i in (0, 1)]
        assert {p.leader for p in placed if p is not None} == {1, 2}
    finally:
        for node in reversed(nodes):
            await node.shutdown()


async def test_the_documented_example_starts(tmp_path: Path, certificates: Certificates) -> None:
    page = (Path(__file__).parents[2] / "docs" / "broker.md").read_text()
    section = page[page.index("## Listeners") :]
    start = section.index("```properties\n") + len("```properties\n")
    block = section[start : section.index("```", start)]
    files = {
        "/etc/automq-ref/broker.pem": write(
            tmp_path, "broker.pem", certificates.broker.certificate + certificates.broker.key
        ),
        "/etc/automq-ref/ca.pem": write(tmp_path, "ca.pem", certificates.ca.certificate),
    }
    for documented, ours in {**files, ":9092": ":0", ":9093": ":0", ":9095": ":0"}.items():
        assert documented in block, documented
        block = block.replace(documented, ours)
    properties = tmp_path / "listeners.properties"
    properties.write_text(block)
    config = load_config(properties, overrides=[f"log.dirs={tmp_path / 'data'}"], environment={})
    node = await start_node(config)
    try:
        await node.listen()
        plain = {"bootstrap.servers": address(node.bound_listeners["CLIENT"])}
        secure = {
            "bootstrap.servers": address(node.bound_listeners["SECURE"]),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": files["/etc/automq-ref/ca.pem"],
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
        for options, name in ((plain, "CLIENT"), (secure, "SECURE")):
            told = await asyncio.to_thread(brokers_told, options)
            assert told == {0: node.bound_listeners[name]}
        # The broker listener wants a client certificate: a broker's link offers its own.
        _, writer = await open_link(*node.bound_listeners["BROKER"], link_security(config))
        writer.close()
        # Without a certificate, the handshake is refused and nothing is read (TLS 1.3 says so
        # after the client's handshake ends: the connection is closed unanswered).
        stranger = LinkSecurity(ssl.create_default_context(cadata=certificates.ca.certificate))
        try:
            reader, writer = await open_link(*node.bound_listeners["BROKER"], stranger)
            got = await asyncio.wait_for(reader.read(1), 10)
            writer.close()
        except (ConnectionError, ssl.SSLError):  # not a timeout: that would be an answer
            got = b""
        assert got == b""
    finally:
        await node.shutdown()


# ------------------------------------------------------------------- the principal of a client


class _Recorder:
    """A handler that notes each connection's principal and serves nothing."""

    def __init__(self) -> None:
        self.principals: list[str | None] = []
        self.seen = asyncio.Event()

    async def admit(self, frame: bytes | bytearray, peer: Peer) -> Reply:
        self.principals.append(peer.session.principal)
        self.seen.set()
        raise CloseConnection("recorded")


async def test_a_client_certificate_is_the_connections_principal(
    tmp_path: Path, certificates: Certificates
) -> None:
    config = load_config(
        overrides=[
            "listeners=SSL://127.0.0.1:0",
            *keystore(tmp_path, certificates),
            "ssl.client.auth=requested",
        ],
        environment={},
    )
    recorder = _Recorder()
    server = KafkaServer(recorder)
    host, port = await server.bind("127.0.0.1", 0, server_ssl_context(config.listener_specs[0]))
    await server.serve()
    try:
        for own in (True, False):
            context = ssl.create_default_context(cadata=certificates.ca.certificate)
            if own:
                chain = certificates.client.certificate + certificates.client.key
                context.load_cert_chain(write(tmp_path, "client.pem", chain))
            recorder.seen.clear()
            _, writer = await asyncio.open_connection(host, port, ssl=context)
            writer.write(b"\0\0\0\4abcd")
            await asyncio.wait_for(recorder.seen.wait(), TIMEOUT_S)
            writer.close()
        assert recorder.principals == ["User:CN=client", ANONYMOUS]
    finally:
        await server.close()


def test_the_principal_names_the_subject_most_specific_first() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "FR"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example, Inc"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "streams"),
            x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    der = certificate.public_bytes(serialization.Encoding.DER)
    peer = SimpleNamespace(getpeercert=lambda binary_form: der)
    # As Java's X500Principal.getName() (RFC 2253) writes it: the comma in a value escaped.
    assert certificate_principal(peer) == "User:CN=alice,OU=streams,O=Example\\, Inc,C=FR"  # type: ignore[arg-type]
    assert certificate_principal(None) == ANONYMOUS
