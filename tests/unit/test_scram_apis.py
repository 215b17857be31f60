"""AlterUserScramCredentials and DescribeUserScramCredentials (automq_ref/kafka/handlers/scram.py)
through a broker's dispatcher, with Kafka's errors and order; the credentials they write in the
controller KV; and SCRAM logins on a SCRAM-only SASL listener (automq_ref/kafka/sasl.py), raw:
both mechanisms, SaslHandshake v1 and v0, a wrong password, a deleted credential."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.alter_user_scram_credentials.v0.request import (
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from kio.schema.describe_user_scram_credentials.v0.request import UserName
from kio.static.primitive import i8, i32

from automq_ref.config import ConfigError, load_config
from automq_ref.errors import KafkaErrorCode as E
from automq_ref.formats import scram
from automq_ref.formats.scram_credential import decode_credential, encode_credential
from automq_ref.kafka.handlers import scram as handlers
from automq_ref.kafka.listeners import (
    LinkLogin,
    LinkLoginError,
    LinkSecurity,
    link_security,
    open_link,
)
from automq_ref.kafka.sasl import AUTHENTICATED
from automq_ref.kafka.server import CloseConnection, Peer
from automq_ref.node import Node, start_node
from automq_ref.protocol.kio_codec import decode_response
from automq_ref.vocabulary.naming import scram_credential_key
from tests.unit.test_broker_node import call, request_frame

LISTENERS = [
    "listeners=PLAINTEXT://127.0.0.1:0,AUTH://127.0.0.1:0",
    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,AUTH:SASL_PLAINTEXT",
    "listener.name.auth.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512",
]
SHA256, SHA512 = 1, 2


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = load_config(
        overrides=[f"log.dirs={tmp_path}", "s3.wal.capacity=16777216", *LISTENERS],
        environment={},
    )
    started = await start_node(config)
    try:
        yield started
    finally:
        await started.shutdown()


def admin() -> Peer:
    return Peer(1, "127.0.0.1:1", "PLAINTEXT")


def upsertion(name: str, mechanism: int, password: str, iterations: int = 4096) -> Any:
    salt = os.urandom(16)
    hashed = scram.MECHANISM_TYPES.get(mechanism, scram.SCRAM_SHA_256)
    salted = scram.salted_password(hashed, password, salt, max(iterations, 1))
    return ScramCredentialUpsertion(
        name=name,
        mechanism=i8(mechanism),
        iterations=i32(iterations),
        salt=salt,
        salted_password=salted,
    )


def deletion(name: str, mechanism: int) -> Any:
    return ScramCredentialDeletion(name=name, mechanism=i8(mechanism))


async def alter(
    node: Node, deletions: Any = (), upsertions: Any = ()
) -> list[tuple[str, int, Any]]:
    response = await call(
        node.front_end.admit,
        admin(),
        51,
        0,
        deletions=tuple(deletions),
        upsertions=tuple(upsertions),
    )
    return [(r.user, int(r.error_code), r.error_message) for r in response.results]


async def describe(node: Node, *users: str, all_users: bool = False) -> dict[str, Any]:
    names = None if all_users else tuple(UserName(name=user) for user in users)
    response = await call(node.front_end.admit, admin(), 50, 0, users=names)
    assert int(response.error_code) == 0
    return {
        r.user: (
            int(r.error_code),
            r.error_message,
            [(int(i.mechanism), int(i.iterations)) for i in r.credential_infos],
        )
        for r in response.results
    }


async def test_alter_and_describe_as_kafka(node: Node) -> None:
    assert await alter(
        node, upsertions=[upsertion("alice", SHA256, "a"), upsertion("bob", SHA512, "b", 8192)]
    ) == [("alice", 0, None), ("bob", 0, None)]
    assert await alter(node, upsertions=[upsertion("alice", SHA512, "a2", 16384)]) == [
        ("alice", 0, None)
    ]
    assert await describe(node, all_users=True) == {
        "alice": (0, None, [(SHA256, 4096), (SHA512, 16384)]),
        "bob": (0, None, [(SHA512, 8192)]),
    }
    assert await describe(node) == await describe(node, all_users=True)  # empty: all
    assert await describe(node, "bob", "carol", "bob") == {
        "bob": (
            E.DUPLICATE_RESOURCE,
            "Cannot describe SCRAM credentials for the same user twice in a single request: bob",
            [],
        ),
        "carol": (
            E.RESOURCE_NOT_FOUND,
            "Attempt to describe a user credential that does not exist: carol",
            [],
        ),
    }
    # The KV holds the stored and server keys of the salted password, never the password.
    value = node.view.image.kv[scram_credential_key("SCRAM-SHA-512", "bob")]
    credential = decode_credential(value)
    assert credential.iterations == 8192 and len(credential.stored_key) == 64
    # Deleting one mechanism leaves the other; deleting the last leaves no user.
    assert await alter(node, deletions=[deletion("alice", SHA256)]) == [("alice", 0, None)]
    assert (await describe(node, "alice"))["alice"] == (0, None, [(SHA512, 16384)])
    assert await alter(node, deletions=[deletion("alice", SHA512)]) == [("alice", 0, None)]
    assert (await describe(node, "alice"))["alice"][0] == E.RESOURCE_NOT_FOUND


async def test_alter_refusals_are_kafkas(node: Node) -> None:
    await alter(node, upsertions=[upsertion("held", SHA256, "x")])
    twice = (E.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    results = await alter(
        node,
        deletions=[
            deletion("held", SHA256),  # valid alone: done, answered first
            deletion("ghost", SHA256),
            deletion("", SHA256),
            deletion("dup", SHA256),  # refused (no such credential), then named again
        ],
        upsertions=[
            upsertion("new", SHA512, "n"),
            upsertion("low", SHA256, "x", 4095),
            upsertion("high", SHA256, "x", 16385),
            upsertion("unknown", 0, "x"),
            upsertion("other", 3, "x"),
            upsertion("twice", SHA256, "x"),
            upsertion("twice", SHA512, "x"),  # same user, another mechanism: still twice
            upsertion("twice", SHA512, "x"),  # a third time: one answer for the user
            upsertion("dup", SHA256, "x"),
        ],
    )
    assert results == [
        ("held", 0, None),
        ("new", 0, None),
        ("ghost", E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        ("", E.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        ("dup", E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        ("low", E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
        ("high", E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
        ("unknown", E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        ("other", E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        ("twice", *twice),
    ]
    assert set(await describe(node, all_users=True)) == {"new"}


# ------------------------------------------------------------------------- SCRAM logins


def sasl_peer(connection_id: int) -> Peer:
    return Peer(connection_id, "127.0.0.1:2", "AUTH")


async def authenticate(node: Node, peer: Peer, token: bytes) -> Any:
    return await call(node.front_end.admit, peer, 36, 2, auth_bytes=token)


async def login(
    node: Node, peer: Peer, mechanism: str, username: str, password: str, *, version: int = 1
) -> tuple[int, str | None]:
    """A client's SCRAM login through the dispatcher: (error code, message); the server's
    signature is checked on success."""
    handshake = await call(node.front_end.admit, peer, 17, version, mechanism=mechanism)
    assert int(handshake.error_code) == 0
    client = scram.ClientLogin(mechanism, username, password, "clientnonce")

    async def send(token: bytes) -> tuple[int, str | None, bytes]:
        if version == 1:
            answer = await authenticate(node, peer, token)
            return int(answer.error_code), answer.error_message, bytes(answer.auth_bytes)
        try:
            reply = await node.front_end.admit(token, peer)
        except CloseConnection as closed:
            return E.SASL_AUTHENTICATION_FAILED, str(closed), b""
        return 0, None, b"".join(bytes(chunk) for chunk in reply)  # type: ignore[union-attr]

    code, message, answer = await send(client.first)
    if code:
        return code, message
    final, expected = client.final(answer)
    code, message, answer = await send(final)
    if code:
        return code, message
    scram.check_server_final(answer, expected)
    return code, message


async def test_scram_logins_on_a_scram_only_listener(node: Node) -> None:
    (_, listener) = node.config.listener_specs
    assert listener.sasl is not None and listener.sasl.plain_users == {}
    await alter(
        node,
        upsertions=[upsertion("alice", SHA512, "alice-secret"), upsertion("bob", SHA256, "b")],
    )
    peer = sasl_peer(10)
    assert await login(node, peer, "SCRAM-SHA-512", "alice", "alice-secret") == (0, None)
    assert peer.session.sasl_step == AUTHENTICATED and peer.session.principal == "User:alice"
    # The bare tokens of SaslHandshake v0, and the other mechanism.
    raw = sasl_peer(11)
    assert await login(node, raw, "SCRAM-SHA-256", "bob", "b", version=0) == (0, None)
    assert raw.session.principal == "User:bob"
    # Alice has no SCRAM-SHA-256 credential; a wrong password; both closed with Kafka's text.
    generic = "Authentication failed during authentication due to invalid credentials with SASL"
    for mechanism, user, password in (
        ("SCRAM-SHA-256", "alice", "alice-secret"),
        ("SCRAM-SHA-512", "alice", "wrong"),
    ):
        with pytest.raises(CloseConnection) as closed:
            await login(node, sasl_peer(12), mechanism, user, password)
        answer = closed.value.answer
        assert answer is not None and generic.encode() in b"".join(answer)
        assert f"mechanism {mechanism}".encode() in b"".join(answer)
    # A deleted credential logs in no more (an authenticated connection stays so).
    assert await alter(node, deletions=[deletion("alice", SHA512)]) == [("alice", 0, None)]
    with pytest.raises(CloseConnection, match="no SCRAM-SHA-512 credential for user 'alice'"):
        await login(node, sasl_peer(13), "SCRAM-SHA-512", "alice", "alice-secret")
    assert peer.session.sasl_step == AUTHENTICATED
    # PLAIN is not enabled there.
    with pytest.raises(CloseConnection) as closed:
        await node.front_end.admit(request_frame(17, 1, 1, mechanism="PLAIN"), sasl_peer(14))
    assert closed.value.answer is not None
    refused = decode_response(17, 1, b"".join(closed.value.answer))[1]
    assert int(refused.error_code) == E.UNSUPPORTED_SASL_MECHANISM
    assert list(refused.mechanisms) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]


async def test_a_request_before_the_scram_exchange_ends_closes(node: Node) -> None:
    await alter(node, upsertions=[upsertion("carol", SHA256, "c")])
    peer = sasl_peer(20)
    await call(node.front_end.admit, peer, 17, 1, mechanism="SCRAM-SHA-256")
    answer = await authenticate(node, peer, scram.format_client_first("carol", "n0nce"))
    assert int(answer.error_code) == 0 and bytes(answer.auth_bytes).startswith(b"r=n0nce")
    fields = {"topics": None, "allow_auto_topic_creation": False}
    frame = request_frame(3, 12, 1, include_topic_authorized_operations=False, **fields)
    with pytest.raises(CloseConnection, match="during SASL authentication"):
        await node.front_end.admit(frame, peer)
    assert peer.session.principal is None


def test_credentials_of_the_kv() -> None:
    credential = scram.credential_of_password(scram.SCRAM_SHA_256, "p", b"salt", 4096)
    kv = {
        scram_credential_key("SCRAM-SHA-256", "a/b"): encode_credential(credential),
        scram_credential_key("SCRAM-SHA-512", "bad"): b"not a credential",
        scram_credential_key("SCRAM-SHA-1", "old"): encode_credential(credential),
        "topics/x": b"{}",
    }
    assert handlers.credentials_in(kv) == {"a/b": {"SCRAM-SHA-256": credential}}
    assert handlers.credential_in(kv, "SCRAM-SHA-256", "a/b") == credential
    assert handlers.credential_in(kv, "SCRAM-SHA-512", "bad") is None


SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="alice" password="alice-secret";'
)


def cluster_config(*overrides: str) -> Any:
    return load_config(
        overrides=[
            "listeners=SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "metadata.etcd.endpoints=http://127.0.0.1:2379",
            *overrides,
        ],
        environment={},
    )


def test_the_inter_broker_login_may_be_scram() -> None:
    config = cluster_config(
        f"listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config={SCRAM_JAAS}"
    )
    assert link_security(config).login == LinkLogin("SCRAM-SHA-512", "alice", "alice-secret")
    property_ = "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"
    with pytest.raises(ConfigError, match=property_):
        cluster_config()  # no login of its own
    plain_module = SCRAM_JAAS.replace("scram.ScramLoginModule", "plain.PlainLoginModule")
    with pytest.raises(ConfigError, match=property_):
        cluster_config(f"{property_}={plain_module}")  # SCRAM's login is ScramLoginModule's


async def test_a_broker_link_logs_in_with_scram(node: Node) -> None:
    await alter(node, upsertions=[upsertion("alice", SHA512, "alice-secret")])
    await node.listen()
    host, port = node.bound_listeners["AUTH"]
    right = LinkSecurity(login=LinkLogin("SCRAM-SHA-512", "alice", "alice-secret"))
    reader, writer = await open_link(host, port, right)
    try:
        # The link is served: a request after the login is answered.
        frame = request_frame(18, 3, 9, client_software_name="t", client_software_version="1")
        writer.write(len(frame).to_bytes(4, "big") + frame)
        size = int.from_bytes(await reader.readexactly(4), "big")
        assert decode_response(18, 3, await reader.readexactly(size))[1].error_code == 0
    finally:
        writer.close()
    for login in (
        LinkLogin("SCRAM-SHA-512", "alice", "wrong"),
        LinkLogin("SCRAM-SHA-256", "alice", "alice-secret"),  # no credential of that mechanism
    ):
        with pytest.raises(LinkLoginError, match="login as alice refused"):
            await open_link(host, port, LinkSecurity(login=login))


def test_the_client_checks_the_server() -> None:
    client = scram.ClientLogin("SCRAM-SHA-256", "alice", "pw", "abc")
    credential = scram.credential_of_password("SCRAM-SHA-256", "pw", b"salt", 4096)
    server_first = scram.format_server_first(scram.ServerFirst("abcdef", b"salt", 4096))
    final, expected = client.final(server_first)
    state, answer = scram.step(
        scram.AwaitingFinal(
            "SCRAM-SHA-256",
            scram.parse_client_first(client.first),
            scram.parse_server_first(server_first),
            credential,
        ),
        final,
        "",
        lambda _: None,
    )
    assert isinstance(state, scram.Authenticated) and answer is not None
    scram.check_server_final(answer, expected)
    other = scram.credential_of_password("SCRAM-SHA-256", "not pw", b"salt", 4096)
    forged = scram.format_server_final(
        scram.ServerFinal(scram.server_signature("SCRAM-SHA-256", other.server_key, b"x"))
    )
    with pytest.raises(scram.ScramFormatError, match="signature"):
        scram.check_server_final(forged, expected)
    with pytest.raises(scram.ScramFormatError, match="refused the login"):
        scram.check_server_final(b"e=invalid-proof", expected)
    with pytest.raises(scram.ScramFormatError, match="does not extend"):
        client.final(scram.format_server_first(scram.ServerFirst("xyz123", b"salt", 4096)))
    with pytest.raises(scram.ScramFormatError, match="less than the minimum"):
        client.final(scram.format_server_first(scram.ServerFirst("abcdef", b"salt", 4095)))
