"""The pure SCRAM module (automq_ref/formats/scram.py), the credential's KV record
(formats/scram_credential.py) and its key (vocabulary/naming.py): RFC 7677's SCRAM-SHA-256
exchange byte for byte, SCRAM-SHA-512, every refusal with Kafka's message, and a fuzz: no input
raises, and none but the right proof authenticates."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from automq_ref.formats import scram
from automq_ref.formats.scram_credential import (
    ScramCredentialFormatError,
    decode_credential,
    encode_credential,
)
from automq_ref.vocabulary.naming import parse_scram_credential_key, scram_credential_key

# RFC 7677, section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_CREDENTIAL = scram.credential_of_password(scram.SCRAM_SHA_256, "pencil", RFC_SALT, 4096)


def rfc_users(username: str) -> scram.ScramCredential | None:
    return RFC_CREDENTIAL if username == "user" else None


def no_users(username: str) -> None:
    return None


def test_rfc_7677_exchange_byte_for_byte() -> None:
    state: Any = scram.start(scram.SCRAM_SHA_256)
    state, answer = scram.step(state, RFC_CLIENT_FIRST, RFC_SERVER_NONCE, rfc_users)
    assert isinstance(state, scram.AwaitingFinal)
    assert answer == RFC_SERVER_FIRST
    state, answer = scram.step(state, RFC_CLIENT_FINAL, "unused", no_users)
    assert state == scram.Authenticated(scram.SCRAM_SHA_256, "user")
    assert answer == RFC_SERVER_FINAL
    # Nothing more is taken once authenticated.
    after, nothing = scram.step(state, RFC_CLIENT_FINAL, "x", rfc_users)
    assert isinstance(after, scram.Failed) and nothing is None


def test_the_client_side_computes_the_rfc_proof() -> None:
    salted = scram.salted_password(scram.SCRAM_SHA_256, "pencil", RFC_SALT, 4096)
    first = scram.parse_client_first(RFC_CLIENT_FIRST)
    final = scram.parse_client_final(RFC_CLIENT_FINAL)
    server_first = scram.parse_server_first(RFC_SERVER_FIRST)
    auth = scram.auth_message(first.bare, server_first.text, final.without_proof)
    assert scram.client_proof(scram.SCRAM_SHA_256, salted, auth) == final.proof
    assert scram.format_client_final(b"n,,", server_first.nonce, final.proof) == RFC_CLIENT_FINAL
    signature = scram.parse_server_final(RFC_SERVER_FINAL).signature
    assert signature == scram.server_signature(scram.SCRAM_SHA_256, RFC_CREDENTIAL.server_key, auth)
    # The credential of the salted password (what AlterUserScramCredentials sends) is the same.
    assert scram.credential_of_salted(scram.SCRAM_SHA_256, salted, RFC_SALT, 4096) == RFC_CREDENTIAL


def client_exchange(
    mechanism: str,
    username: str,
    password: str,
    credential: scram.ScramCredential | None,
    authzid: str = "",
    extensions: tuple[tuple[str, str], ...] = (),
) -> tuple[scram.Exchange, bytes | None]:
    """A client's whole exchange against the machine; the last state and answer."""
    first_message = scram.format_client_first(username, "clientnonce", authzid, extensions)

    def lookup(name: str) -> scram.ScramCredential | None:
        return credential if name == username else None

    state, answer = scram.step(scram.start(mechanism), first_message, "servernonce", lookup)
    if not isinstance(state, scram.AwaitingFinal):
        return state, answer
    assert answer is not None
    server_first = scram.parse_server_first(answer)
    salted = scram.salted_password(mechanism, password, server_first.salt, server_first.iterations)
    header = state.client_first.gs2_header.encode()
    without = scram.client_final_without_proof(header, server_first.nonce)
    auth = scram.auth_message(state.client_first.bare, server_first.text, without)
    proof = scram.client_proof(mechanism, salted, auth)
    return scram.step(
        state, scram.format_client_final(header, server_first.nonce, proof), "", lookup
    )


@pytest.mark.parametrize("mechanism", scram.MECHANISMS)
def test_both_mechanisms_authenticate_and_sign(mechanism: str) -> None:
    credential = scram.credential_of_password(mechanism, "s3cret", b"salt" * 4, 8192)
    state, answer = client_exchange(mechanism, "alice", "s3cret", credential)
    assert state == scram.Authenticated(mechanism, "alice")
    assert answer is not None and answer.startswith(b"v=")
    assert len(scram.parse_server_final(answer).signature or b"") == scram.digest_size(mechanism)
    # The authzid may name the user itself; a username with , and = is escaped and read back.
    state, _ = client_exchange(mechanism, "alice", "s3cret", credential, authzid="alice")
    assert state == scram.Authenticated(mechanism, "alice")
    odd = "a,b=c"
    state, _ = client_exchange(mechanism, odd, "s3cret", credential)
    assert state == scram.Authenticated(mechanism, odd)


def refusal(state: scram.Exchange, answer: bytes | None) -> scram.Failed:
    assert isinstance(state, scram.Failed), state
    assert answer is None
    return state


def test_refusals_tell_the_client_what_kafka_tells_it() -> None:
    mechanism = scram.SCRAM_SHA_512
    generic = f"{scram.INVALID_CREDENTIALS} SCRAM-SHA-512"
    assert generic == (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512"
    )
    credential = scram.credential_of_password(mechanism, "right", b"0123456789abcdef", 4096)
    wrong = refusal(*client_exchange(mechanism, "bob", "wrong", credential))
    assert wrong.message == generic and "invalid client proof" in wrong.reason
    unknown = refusal(*client_exchange(mechanism, "bob", "right", None))
    assert unknown.message == generic and "no SCRAM-SHA-512 credential" in unknown.reason
    other = refusal(*client_exchange(mechanism, "bob", "right", credential, authzid="admin"))
    assert other.message == scram.AUTHZID_MISMATCH
    token = refusal(
        *client_exchange(mechanism, "bob", "right", credential, extensions=(("tokenauth", "true"),))
    )
    assert token.message == generic and "delegation token" in token.reason
    # Another extension is ignored, as Kafka ignores it.
    state, _ = client_exchange(mechanism, "bob", "right", credential, extensions=(("ext", "1"),))
    assert state == scram.Authenticated(mechanism, "bob")
    few = scram.credential_of_password(mechanism, "right", b"salt", 1000)
    weak = refusal(*client_exchange(mechanism, "bob", "right", few))
    assert "less than the minimum 4096" in weak.reason


def awaiting_final() -> scram.AwaitingFinal:
    state, _ = scram.step(
        scram.start(scram.SCRAM_SHA_256), RFC_CLIENT_FIRST, RFC_SERVER_NONCE, rfc_users
    )
    assert isinstance(state, scram.AwaitingFinal)
    return state


NONCE = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"", "not gs2-header"),
        (b"\xff\xfe", "not UTF-8"),
        (b"y,,n=user,r=abc", "channel binding"),
        (b"p=tls-unique,,n=user,r=abc", "channel binding"),
        (b"x,,n=user,r=abc", "not n"),
        (b"n,b=x,n=user,r=abc", "a= belongs"),
        (b"n,a=,n=user,r=abc", "authzid is empty"),
        (b"n,,m=ext,n=user,r=abc", "mandatory extension"),
        (b"n,,n=,r=abc", "username is empty"),
        (b"n,,n=us=er,r=abc", "not a saslname"),
        (b"n,,n=user,r=", "client nonce"),
        (b"n,,n=user,r=a b", "client nonce"),
        (b"n,,n=user,x=abc", "r= belongs"),
        (b"n,,n=user,r=abc,=v", "not an extension"),
        (b"n,,n=user,r=abc,1x=v", "not an extension"),
    ],
)
def test_a_malformed_client_first_is_refused_naming_why(message: bytes, why: str) -> None:
    failed = refusal(*scram.step(scram.start(scram.SCRAM_SHA_256), message, "n", rfc_users))
    assert why in failed.reason, failed.reason
    assert failed.message == f"{scram.INVALID_CREDENTIALS} SCRAM-SHA-256"


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"c=biws", "not c=...,r=...,p=..."),
        (f"c=biws,r={NONCE}x,p={PROOF}".encode(), "invalid client nonce"),
        (f"c=eSws,r={NONCE},p={PROOF}".encode(), "channel binding is not the gs2 header"),
        (f"c=biw,r={NONCE},p={PROOF}".encode(), "not base64"),
        (f"c=biws,r={NONCE},p={PROOF[:-2]}".encode(), "not base64"),
        (f"c=biws,r={NONCE},p={PROOF[:-2]}R=".encode(), "not canonical base64"),
        (f"c=biws,r={NONCE},p=AAAA".encode(), "a proof of 3 bytes"),
        (f"c=biws,r={NONCE},p={'A' * 43}=".encode(), "invalid client proof"),
        (f"c=biws,r={NONCE},x=1".encode(), "p= belongs"),
        (f"r={NONCE},c=biws,p={PROOF}".encode(), "c= belongs"),
    ],
)
def test_a_malformed_client_final_is_refused_naming_why(message: bytes, why: str) -> None:
    failed = refusal(*scram.step(awaiting_final(), message, "", rfc_users))
    assert why in failed.reason, failed.reason


def test_the_server_messages_parse_and_refuse() -> None:
    assert scram.parse_server_first(RFC_SERVER_FIRST).iterations == 4096
    assert scram.parse_server_final(b"e=invalid-proof") == scram.ServerFinal(None, "invalid-proof")
    assert scram.format_server_final(scram.ServerFinal(None, "other-error")) == b"e=other-error"
    for bad in (b"r=a,s=!!,i=1", b"r=a,s=AAAA,i=0", b"r=a,s=AAAA,i=x", b"m=1,r=a,s=AAAA,i=1"):
        with pytest.raises(scram.ScramFormatError):
            scram.parse_server_first(bad)
    for bad in (b"", b"v=!", b"e=", b"x=1"):
        with pytest.raises(scram.ScramFormatError):
            scram.parse_server_final(bad)
    with pytest.raises(ValueError, match="not a SCRAM mechanism"):
        scram.start("PLAIN")


# ------------------------------------------------------------------ the credential's record


def test_the_credential_record_round_trips_and_refuses_what_is_not_one() -> None:
    encoded = encode_credential(RFC_CREDENTIAL)
    assert decode_credential(encoded) == RFC_CREDENTIAL
    assert b"pencil" not in encoded and b'"iterations":4096' in encoded
    for bad in (
        b"not json",
        b"[]",
        b'{"version":2}',
        encoded.replace(b'"iterations":4096', b'"iterations":0'),
        encoded.replace(b'"salt":"', b'"salt":"!'),
        encoded.replace(b'"storedKey"', b'"stored"'),
    ):
        with pytest.raises(ScramCredentialFormatError):
            decode_credential(bad)


@given(st.text(min_size=1, max_size=20), st.sampled_from(scram.MECHANISMS))
def test_every_username_has_one_key_read_back(username: str, mechanism: str) -> None:
    key = scram_credential_key(mechanism, username)
    assert parse_scram_credential_key(key) == (mechanism, username)
    assert key.count("/") == 2


def test_keys_that_are_not_credential_keys() -> None:
    for key in ("topics/x", "scram/", "scram/SCRAM-SHA-256", "scram/SCRAM-SHA-256/", "scram//u"):
        assert parse_scram_credential_key(key) is None
    # Not the one spelling of a name (lower-case escape, an unescaped character, bad UTF-8).
    for encoded in ("a%2fb", "a%41", "%ff"):
        assert parse_scram_credential_key(f"scram/SCRAM-SHA-256/{encoded}") is None


# ----------------------------------------------------------------------------------- fuzz


def mutated(draw: st.DrawFn, message: bytes) -> bytes:
    """``message`` with a few bytes replaced, inserted or removed."""
    data = bytearray(message)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        index = draw(st.integers(0, max(len(data) - 1, 0)))
        byte = draw(st.integers(0, 255) | st.sampled_from(list(b",=abn")))
        if kind == "replace" and data:
            data[index] = byte
        elif kind == "insert":
            data.insert(index, byte)
        elif data:
            del data[index]
    return bytes(data)


@st.composite
def client_firsts(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "mutated", "valid"]))
    if kind == "random":
        return draw(st.binary(max_size=60))
    return RFC_CLIENT_FIRST if kind == "valid" else mutated(draw, RFC_CLIENT_FIRST)


@st.composite
def client_finals(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=120))
    return mutated(draw, RFC_CLIENT_FINAL)


@settings(max_examples=500)
@given(client_firsts(), client_finals(), st.sampled_from(scram.MECHANISMS))
def test_fuzz_no_malformed_exchange_raises_or_authenticates(
    first: bytes, final: bytes, mechanism: str
) -> None:
    assume(final != RFC_CLIENT_FINAL)
    # The RFC's credential for either mechanism: SCRAM-SHA-512 never accepts its proof.
    state, answer = scram.step(scram.start(mechanism), first, RFC_SERVER_NONCE, rfc_users)
    if isinstance(state, scram.Failed):
        assert answer is None and state.message
        return
    assert isinstance(state, scram.AwaitingFinal) and answer is not None
    state, answer = scram.step(state, final, RFC_SERVER_NONCE, rfc_users)
    assert isinstance(state, scram.Failed), (first, final)
    assert answer is None
