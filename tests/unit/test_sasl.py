"""SASL/PLAIN on the listener (automq_ref/kafka/sasl.py): SASL_PLAINTEXT and SASL_SSL, the users
from Kafka's JAAS property; confluent-kafka, kafka-python, aiokafka and kcat produce and consume;
wrong credentials and requests before authentication are served nothing; the refused settings
name the property; a fuzz of the exchange through the dispatcher."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError as AIOKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from hypothesis import event, given, settings
from hypothesis import strategies as st

from automq_ref.checker.certificates import Certificates, make_certificates
from automq_ref.config import ConfigError, load_config
from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import scram
from automq_ref.formats.jaas import JaasError, parse_jaas, plain_users
from automq_ref.formats.scram_credential import encode_credential
from automq_ref.kafka import sasl
from automq_ref.kafka.dispatch import ROUTES, Dispatcher, Route
from automq_ref.kafka.notices import Notices
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.server import CloseConnection, Peer, Reply
from automq_ref.node import Node, start_node
from automq_ref.protocol.kio_codec import build, decode_response, encode_request, request_class
from automq_ref.vocabulary.naming import scram_credential_key
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

LISTENER = "listeners=SASL_PLAINTEXT://127.0.0.1:0"
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
USERS = {"admin": "admin-secret", "alice": "alice-secret"}


def sasl_settings(listener: str = "sasl_plaintext") -> list[str]:
    return [
        "sasl.enabled.mechanisms=PLAIN",
        f"listener.name.{listener}.plain.sasl.jaas.config={JAAS}",
    ]


# --------------------------------------------------------------------------------- settings


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(overrides=list(overrides), environment={})
    return str(raised.value)


def test_the_users_come_from_the_listeners_jaas_property() -> None:
    config = load_config(overrides=[LISTENER, *sasl_settings()], environment={})
    (listener,) = config.listener_specs
    assert listener.protocol == "SASL_PLAINTEXT" and listener.sasl is not None
    assert listener.sasl.plain_users == USERS
    assert listener.sasl.mechanisms == ("PLAIN",)
    assert listener.sasl.login("PLAIN") == ("admin", "admin-secret")


def test_refused_settings_name_the_property() -> None:
    jaas = "listener.name.sasl_plaintext.plain.sasl.jaas.config"
    # Kafka's default mechanism is GSSAPI, not served here.
    assert (
        "sasl.enabled.mechanisms=GSSAPI: only PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 are served"
        in refused(LISTENER, f"{jaas}={JAAS}")
    )
    assert "OAUTHBEARER is not" in refused(
        LISTENER, "sasl.enabled.mechanisms=PLAIN,OAUTHBEARER", f"{jaas}={JAAS}"
    )
    assert f"needs its users: {jaas}=" in refused(LISTENER, "sasl.enabled.mechanisms=PLAIN")
    for malformed, why in (
        (JAAS.removesuffix(";"), "does not end with ';'"),
        (JAAS.replace("required", "always"), "not a login module control flag"),
        (JAAS.replace('"alice-secret";', '"alice-secret;'), "not closed"),
        (JAAS.replace('user_alice="alice-secret"', "user_alice="), "no value for option"),
        ("com.example.Other required;", "no org.apache.kafka.common.security.plain"),
        (JAAS.replace("user_", "u_"), "names no user"),
    ):
        message = refused(LISTENER, "sasl.enabled.mechanisms=PLAIN", f"{jaas}={malformed}")
        assert f"{jaas}:" in message and why in message, message
    # The property of a listener that is not in listeners is refused, naming it.
    assert "OTHER is not a listener of listeners" in refused(
        LISTENER,
        "sasl.enabled.mechanisms=PLAIN",
        f"listener.name.other.plain.sasl.jaas.config={JAAS}",
    )
    assert "unknown setting 'listener.name.sasl_plaintext.plain.sasl.jass.config'" in refused(
        LISTENER, *sasl_settings(), f"listener.name.sasl_plaintext.plain.sasl.jass.config={JAAS}"
    )
    # In a cluster, the SASL inter-broker listener needs the broker's own login.
    cluster = "metadata.etcd.endpoints=http://127.0.0.1:2379"
    assert "sasl.mechanism.inter.broker.protocol=GSSAPI" in refused(
        LISTENER, *sasl_settings(), cluster
    )
    no_login = JAAS.replace('username="admin" password="admin-secret" ', "")
    assert "logs in to the others with the username and password" in refused(
        LISTENER,
        "sasl.enabled.mechanisms=PLAIN",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={no_login}",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        cluster,
    )
    assert "needs its certificate and key" in refused(
        "listeners=SASL_SSL://127.0.0.1:0", *sasl_settings("sasl_ssl"), "ssl.keystore.type=PEM"
    )


def test_jaas_text_as_kafka_reads_it() -> None:
    (entry,) = parse_jaas(
        "org.apache.kafka.common.security.plain.PlainLoginModule REQUIRED /* a comment */\n"
        "  user_bob='b\\'s \\\"secret\\\"' // the rest of the line\n"
        "  user_carol=plainword;"
    )
    assert entry.flag == "required"
    assert entry.options == {"user_bob": 'b\'s "secret"', "user_carol": "plainword"}
    assert plain_users(JAAS) == USERS
    with pytest.raises(JaasError, match="no login module"):
        parse_jaas("  // nothing\n")
    with pytest.raises(JaasError, match="no value"):
        parse_jaas("a.B required user_x=12;")  # a number, not a value (quote it)


# ------------------------------------------------------------------------------- a broker


@pytest.fixture
async def sasl_node(tmp_path: Path) -> AsyncIterator[Node]:
    node = await started(tmp_path, LISTENER, *sasl_settings())
    try:
        yield node
    finally:
        await node.shutdown()


def login(bootstrap: str, user: str, password: str) -> dict[str, Any]:
    """aiokafka's and kafka-python's keyword arguments for a SASL/PLAIN login."""
    return {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def confluent_settings(bootstrap: str, password: str = "alice-secret") -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": password,
    }


async def test_clients_produce_and_consume_with_sasl_plain(sasl_node: Node) -> None:
    bootstrap = bootstrap_of(sasl_node)
    admin = login(bootstrap, "admin", "admin-secret")
    assert await aiokafka_round_trip(admin, "sasl-aiokafka") == [b"one", b"two"]
    settings_ = confluent_settings(bootstrap)
    alice = login(bootstrap, "alice", "alice-secret")
    assert await asyncio.to_thread(confluent_round_trip, settings_, "sasl-confluent") == [
        b"three",
        b"four",
    ]
    assert await asyncio.to_thread(kafka_python_round_trip, alice, "sasl-kafka-python") == [
        b"five",
        b"six",
    ]


async def test_kcat_with_sasl_plain(sasl_node: Node) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (.ci/run installs the Debian package)")
    plain = ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN"]
    plain += ["sasl.username=alice", "sasl.password=alice-secret"]
    found = await asyncio.to_thread(
        kcat_round_trip, kcat, bootstrap_of(sasl_node), plain, "sasl-kcat"
    )
    assert found == [f"kcat-{index}" for index in range(10)]


def confluent_create_topic(settings_: dict[str, Any], topic: str) -> str:
    from confluent_kafka.admin import NewTopic

    admin = AdminClient(settings_)
    future = admin.create_topics([NewTopic(topic, 1)], request_timeout=5)[topic]
    try:
        future.result(TIMEOUT_S)
    except KafkaException as error:
        return str(error)
    return "created"


async def test_a_wrong_password_is_served_nothing(sasl_node: Node) -> None:
    bootstrap = bootstrap_of(sasl_node)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password="wrong",
        request_timeout_ms=3000,
    )
    with pytest.raises(AIOKafkaError):
        await asyncio.wait_for(producer.start(), TIMEOUT_S)
    await producer.stop()
    wrong = confluent_settings(bootstrap, password="wrong")
    answer = await asyncio.to_thread(confluent_create_topic, wrong, "never")
    assert answer != "created"
    assert not sasl_node.topics.topics  # nothing was served: no topic was created
    # The right password creates it: the refusal was the password's.
    right = confluent_settings(bootstrap)
    assert await asyncio.to_thread(confluent_create_topic, right, "created") == "created"
    assert "created" in sasl_node.topics.topics


# ----------------------------------------------------------------------- the raw exchange


def request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    body = build(request_class(api_key, version), fields)
    frame = encode_request(api_key, version, correlation_id, "raw", body)
    return len(frame).to_bytes(4, "big") + frame


class Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, node: Node) -> Raw:
        host, port = node.advertised_address
        return cls(*await asyncio.open_connection(host, port))

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    async def frame(self) -> bytes | None:
        """The next frame, or None when the broker closed the connection."""
        try:
            size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), 10), "big")
            return await asyncio.wait_for(self.reader.readexactly(size), 10)
        except asyncio.IncompleteReadError:
            return None

    async def answer(self, api_key: int, version: int) -> Any:
        frame = await self.frame()
        assert frame is not None, "closed without an answer"
        return decode_response(api_key, version, frame)[1]

    async def close(self) -> None:
        self.writer.close()
        with _suppress():
            await self.writer.wait_closed()


def _suppress() -> Any:
    import contextlib

    return contextlib.suppress(ConnectionError)


def metadata_request(correlation_id: int) -> bytes:
    fields = {"topics": None, "allow_auto_topic_creation": True}
    return request(3, 12, correlation_id, include_topic_authorized_operations=False, **fields)


def plain(user: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\0{user}\0{password}".encode()


async def test_a_request_before_authentication_closes_unanswered(sasl_node: Node) -> None:
    raw = await Raw.connect(sasl_node)
    await raw.send(metadata_request(1))
    assert await raw.frame() is None
    await raw.close()
    # After ApiVersions and the handshake, too (Kafka: "during SASL authentication").
    raw = await Raw.connect(sasl_node)
    await raw.send(request(18, 3, 1, client_software_name="raw", client_software_version="1"))
    assert (await raw.answer(18, 3)).error_code == 0
    await raw.send(request(17, 1, 2, mechanism="PLAIN"))
    assert (await raw.answer(17, 1)).error_code == 0
    await raw.send(metadata_request(3))
    assert await raw.frame() is None
    await raw.close()
    assert not sasl_node.topics.topics


async def test_the_exchange_answers_as_kafka(sasl_node: Node) -> None:
    # A mechanism not enabled: UNSUPPORTED_SASL_MECHANISM with the enabled ones, then closed.
    raw = await Raw.connect(sasl_node)
    await raw.send(request(17, 1, 1, mechanism="SCRAM-SHA-256"))
    answer = await raw.answer(17, 1)
    assert answer.error_code == KafkaErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert list(answer.mechanisms) == ["PLAIN"]
    assert await raw.frame() is None
    await raw.close()
    # A wrong password: SASL_AUTHENTICATION_FAILED with Kafka's message, then closed.
    for token, message in (
        (plain("alice", "nope"), sasl.INVALID_CREDENTIALS),
        (plain("mallory", "x"), sasl.INVALID_CREDENTIALS),
        (b"no separators", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (plain("alice", "alice-secret", authzid="admin"), "authorization id that is different"),
    ):
        raw = await Raw.connect(sasl_node)
        await raw.send(request(17, 1, 1, mechanism="PLAIN"))
        await raw.answer(17, 1)
        await raw.send(request(36, 2, 2, auth_bytes=token))
        answer = await raw.answer(36, 2)
        assert answer.error_code == KafkaErrorCode.SASL_AUTHENTICATION_FAILED
        assert message in answer.error_message
        assert await raw.frame() is None
        await raw.close()
    # Success; then Metadata is served, and a second SaslAuthenticate is ILLEGAL_SASL_STATE.
    raw = await Raw.connect(sasl_node)
    await raw.send(request(17, 1, 1, mechanism="PLAIN"))
    assert (await raw.answer(17, 1)).error_code == 0
    await raw.send(request(36, 2, 2, auth_bytes=plain("alice", "alice-secret", "alice")))
    answer = await raw.answer(36, 2)
    assert (answer.error_code, answer.auth_bytes, answer.error_message) == (0, b"", None)
    await raw.send(metadata_request(3))
    assert (await raw.answer(3, 12)).brokers
    await raw.send(request(36, 2, 4, auth_bytes=plain("alice", "alice-secret")))
    again = await raw.answer(36, 2)
    assert again.error_code == KafkaErrorCode.ILLEGAL_SASL_STATE
    assert again.error_message == sasl.AFTER_SUCCESS
    await raw.send(request(17, 1, 5, mechanism="PLAIN"))
    assert (await raw.answer(17, 1)).error_code == KafkaErrorCode.ILLEGAL_SASL_STATE
    await raw.close()


async def test_handshake_v0_takes_the_bare_token(sasl_node: Node) -> None:
    raw = await Raw.connect(sasl_node)
    await raw.send(request(17, 0, 1, mechanism="PLAIN"))
    assert (await raw.answer(17, 0)).error_code == 0
    token = plain("admin", "admin-secret")
    await raw.send(len(token).to_bytes(4, "big") + token)
    assert await raw.frame() == b""  # the empty PLAIN server token
    await raw.send(metadata_request(2))
    assert (await raw.answer(3, 12)).brokers
    await raw.close()
    # A wrong bare token: closed, unanswered.
    raw = await Raw.connect(sasl_node)
    await raw.send(request(17, 0, 1, mechanism="PLAIN"))
    await raw.answer(17, 0)
    token = plain("admin", "wrong")
    await raw.send(len(token).to_bytes(4, "big") + token)
    assert await raw.frame() is None
    await raw.close()


async def test_a_plaintext_listener_answers_sasl_illegal_state(tmp_path: Path) -> None:
    node = await started(tmp_path, "listeners=PLAINTEXT://127.0.0.1:0")
    try:
        raw = await Raw.connect(node)
        await raw.send(request(17, 1, 1, mechanism="PLAIN"))
        assert (await raw.answer(17, 1)).error_code == KafkaErrorCode.ILLEGAL_SASL_STATE
        await raw.close()
    finally:
        await node.shutdown()


# ------------------------------------------------------------------------------- SASL_SSL


async def test_sasl_ssl_with_confluent(tmp_path: Path) -> None:
    certificates: Certificates = make_certificates()
    broker = certificates.broker
    keystore = write(tmp_path, "broker.pem", broker.certificate + broker.key)
    node = await started(
        tmp_path,
        "listeners=SASL_SSL://127.0.0.1:0",
        *sasl_settings("sasl_ssl"),
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
    )
    try:
        ca = write(tmp_path, "ca.pem", certificates.ca.certificate)
        settings_ = {
            **confluent_settings(bootstrap_of(node)),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": ca,
        }
        found = await asyncio.to_thread(confluent_round_trip, settings_, "sasl-ssl")
        assert found == [b"three", b"four"]
        wrong = {**settings_, "sasl.password": "wrong"}
        assert await asyncio.to_thread(confluent_create_topic, wrong, "never") != "created"
        assert "never" not in node.topics.topics
    finally:
        await node.shutdown()


async def test_the_documented_properties_file_starts_a_sasl_broker(tmp_path: Path) -> None:
    """docs/broker.md's example ("SASL"), its port a free one."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "broker.md").read_text()
    section = page[page.index("## SASL") :]
    start = section.index("```properties\n") + len("```properties\n")
    block = section[start : section.index("```", start)]
    assert "127.0.0.1:9094" in block
    properties = tmp_path / "sasl.properties"
    properties.write_text(block.replace("127.0.0.1:9094", "127.0.0.1:0"))
    config = load_config(properties, overrides=[f"log.dirs={tmp_path / 'data'}"], environment={})
    (listener,) = config.listener_specs
    assert listener.protocol == "SASL_PLAINTEXT" and listener.sasl is not None
    assert listener.sasl.plain_users == USERS
    node = await start_node(config)
    try:
        await node.listen()
        assert await aiokafka_round_trip(
            login(bootstrap_of(node), "admin", "admin-secret"), "documented"
        ) == [b"one", b"two"]
    finally:
        await node.shutdown()


# ----------------------------------------------------------------------------------- fuzz

FUZZ_EXAMPLES = int(os.environ.get("SASL_FUZZ_EXAMPLES", "0")) or None
MECHANISMS = (
    st.just("PLAIN")
    | st.sampled_from(["plain", "SCRAM-SHA-256", "GSSAPI", ""])
    | st.text(max_size=20)
)
CREDENTIALS = st.sampled_from(["admin", "alice", "mallory", "", "admin-secret", "alice-secret"])
# SCRAM-SHA-256 on the fuzzed listener too: alice's credential, the server's nonce fixed, so that
# a valid client-final can be drawn (and one with its proof changed).
SCRAM_PASSWORD, SERVER_NONCE = "alice-scram", "fuzzserver"
SCRAM_CREDENTIAL = scram.credential_of_password("SCRAM-SHA-256", SCRAM_PASSWORD, b"salt", 4096)
SCRAM_CLIENT = scram.ClientLogin("SCRAM-SHA-256", "alice", SCRAM_PASSWORD, "fuzzclient")
SCRAM_FINAL, _ = SCRAM_CLIENT.final(
    scram.format_server_first(scram.ServerFirst("fuzzclient" + SERVER_NONCE, b"salt", 4096))
)
SCRAM_TOKENS = st.sampled_from(
    [
        SCRAM_CLIENT.first,
        SCRAM_FINAL,
        SCRAM_FINAL,
        SCRAM_FINAL[:-3] + b"AA=",  # the proof changed
        scram.format_client_first("mallory", "fuzzclient"),
        scram.format_client_first("alice", "fuzzclient", "admin"),  # another authzid
        b"n,,n=alice,r=fuzzclient,m=x",
        b"y,,n=alice,r=fuzzclient",
    ]
)


@st.composite
def tokens(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["valid", "parts", "scram", "random"]))
    if kind == "scram":
        return draw(SCRAM_TOKENS)
    if kind == "valid":  # a user's own credentials, with an authzid that may or may not match
        user, password = draw(st.sampled_from(sorted(USERS.items())))
        authzid = draw(st.sampled_from(["", user, "admin", "alice"]))
        return plain(user, password, authzid)
    if kind == "parts":
        parts = [draw(CREDENTIALS | st.text(max_size=8)) for _ in range(draw(st.integers(1, 5)))]
        return "\0".join(parts).encode()
    return draw(st.binary(max_size=40))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kinds = ["versions", "handshake", "authenticate", "scram", "token", "other", "random"]
    kind = draw(st.sampled_from(kinds))
    correlation_id = draw(st.integers(0, 2**31 - 1))
    if kind == "versions":
        version = draw(st.integers(0, 5))
        if version > 4:  # above ours: answered v0 UNSUPPORTED_VERSION (KIP-511)
            return b"\x00\x12" + version.to_bytes(2, "big") + correlation_id.to_bytes(4, "big")
        fields = {"client_software_name": "fuzz", "client_software_version": "1"}
        return request(18, version, correlation_id, **fields)[4:]
    if kind == "handshake":
        version = draw(st.integers(0, 1))
        return request(17, version, correlation_id, mechanism=draw(MECHANISMS))[4:]
    if kind == "authenticate":
        version = draw(st.integers(0, 2))
        return request(36, version, correlation_id, auth_bytes=draw(tokens()))[4:]
    if kind == "scram":  # the SCRAM exchange's messages, valid or nearly
        version = draw(st.integers(0, 2))
        return request(36, version, correlation_id, auth_bytes=draw(SCRAM_TOKENS))[4:]
    if kind == "token":  # a bare token (the SaslHandshake v0 flow), or a frame that looks like one
        return draw(tokens())
    if kind == "other":
        api_key = draw(st.integers(-1, 80))
        version = draw(st.integers(-1, 15))
        header = api_key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big", signed=True)
        return header + correlation_id.to_bytes(4, "big") + draw(st.binary(max_size=30))
    return draw(st.binary(max_size=40))


def fuzz_dispatcher(served: list[tuple[int, int]]) -> Dispatcher:
    """A dispatcher on a SASL listener whose routes only note what they serve (key, step)."""
    config = load_config(
        overrides=[LISTENER, *sasl_settings(), "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256"],
        environment={},
    )

    def noting(route: Route) -> Route:
        async def handler(context: Context, request: Request) -> Reply:
            served.append((request.api_key, request.peer.session.sasl_step))
            return [b"served"]

        return Route(handler, route.min_version, route.max_version)

    kv = {scram_credential_key("SCRAM-SHA-256", "alice"): encode_credential(SCRAM_CREDENTIAL)}
    context = SimpleNamespace(
        config=config,
        router_in=None,
        notices=Notices(logging.getLogger(__name__)),
        view=SimpleNamespace(image=SimpleNamespace(kv=kv)),
    )
    routes = {key: noting(route) for key, route in ROUTES.items()}
    dispatcher = Dispatcher(cast(Context, context), routes)
    for gate in dispatcher._sasl.values():
        if gate is not None:
            gate.nonces = lambda: SERVER_NONCE
    return dispatcher


# How a connection may begin before the random frames: nothing, ApiVersions, a handshake.
VERSIONS = request(18, 3, 1, client_software_name="fuzz", client_software_version="1")[4:]
PREFIXES = st.sampled_from(
    [
        [],
        [VERSIONS],
        [request(17, 1, 2, mechanism="PLAIN")[4:]],
        [VERSIONS, request(17, 1, 2, mechanism="PLAIN")[4:]],
        [request(17, 0, 2, mechanism="PLAIN")[4:]],
        [request(17, 1, 2, mechanism="SCRAM-SHA-256")[4:]],
        [
            request(17, 1, 2, mechanism="SCRAM-SHA-256")[4:],
            request(36, 2, 3, auth_bytes=SCRAM_CLIENT.first)[4:],
        ],
        [request(17, 0, 2, mechanism="SCRAM-SHA-256")[4:], SCRAM_CLIENT.first],
    ]
)


@settings(max_examples=FUZZ_EXAMPLES or 400)
@given(PREFIXES, st.lists(frames(), max_size=8))
def test_fuzz_nothing_but_the_three_is_served_before_authentication(
    prefix: list[bytes], frames_: list[bytes]
) -> None:
    sequence = prefix + frames_
    served: list[tuple[int, int]] = []
    dispatcher = fuzz_dispatcher(served)
    peer = Peer(1, "127.0.0.1:1")

    async def run() -> None:
        for frame in sequence:
            try:
                reply = await dispatcher.admit(frame, peer)
            except CloseConnection:
                assert peer.session.sasl_step != sasl.AUTHENTICATED
                return
            if asyncio.iscoroutine(reply):
                await reply
            if peer.session.sasl_step == sasl.AUTHENTICATED:
                return  # what follows is the broker's ordinary serving

    asyncio.run(run())
    for api_key, step in served:
        assert step == sasl.AUTHENTICATED or api_key == ApiKey.API_VERSIONS, (api_key, step)
    authenticated = peer.session.sasl_step == sasl.AUTHENTICATED
    scram_final = any(frame.endswith(SCRAM_FINAL) for frame in sequence)
    event(f"authenticated: {authenticated}, a valid SCRAM final sent: {scram_final}")
    if peer.session.sasl_step == sasl.AUTHENTICATED:
        assert peer.session.principal in {"User:admin", "User:alice"}
    else:
        assert peer.session.principal is None
