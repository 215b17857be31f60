"""SASL/SCRAM (RFC 5802, with RFC 7677's SCRAM-SHA-256 and SCRAM-SHA-512), pure: the four
messages, the salted credential, and the server's side of the exchange as a small immutable
machine, with the rules and answers of Kafka's ``ScramSaslServer``.

The messages (UTF-8 text, attributes ``x=value`` joined by ``,``):

- *client-first*: a gs2 header, then the bare message ``n=<saslname>,r=<client nonce>`` and
  optional extensions ``,<name>=<value>``. The gs2 header is ``n,,`` or ``n,a=<authzid>,``
  (``n``: the client does not use channel binding; ``y`` and ``p=`` are refused, as Kafka refuses
  them). In a saslname ``,`` is written ``=2C`` and ``=`` ``=3D``; no other ``=`` may appear. A
  mandatory extension (``m=``) is refused (RFC 5802: a server that does not know it must fail);
- *server-first*: ``r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>``;
- *client-final*: ``c=<base64 channel binding>,r=<nonce>[,extensions],p=<base64 proof>``; the
  channel binding is the gs2 header itself (``biws`` for ``n,,``), the nonce the server-first's;
- *server-final*: ``v=<base64 server signature>`` or ``e=<error>``.

A nonce is printable ASCII but ``,``; base64 is canonical (padded, nothing after the padding, no
stray bits), so that one value has one spelling.

The credential (what the broker keeps per user and mechanism; never the password): the salted
password ``Hi(password, salt, i)`` is PBKDF2-HMAC with the mechanism's hash, ``ClientKey =
HMAC(salted, "Client Key")``, ``StoredKey = H(ClientKey)``, ``ServerKey = HMAC(salted, "Server
Key")``. Kafka's iteration bounds: at least :data:`MIN_ITERATIONS` (both mechanisms' minimum)
and, for a credential an admin sets, at most :data:`MAX_ITERATIONS` (its controller's limit).

The exchange (:func:`start`, :func:`step`): the server awaits the client-first, answers the
server-first, awaits the client-final, checks the proof (``ClientKey = proof XOR ClientSignature``
must hash to the stored key, compared with :func:`hmac.compare_digest`) and answers the
server-final; any other input ends in :class:`Failed`, whose ``message`` is what Kafka tells the
client (:data:`INVALID_CREDENTIALS` and the mechanism for every refusal but an authorization id
other than the username, which Kafka names) and whose ``reason`` says why, for the broker's log.
A malformed message is a refusal like any other, never an exception. The server's nonce comes in
with the client-first (this module draws nothing at random), and so does the user's credential,
looked up by the caller's function. A ``tokenauth`` extension (a delegation token's login) is
refused: no delegation tokens are served; other extensions are ignored, as Kafka ignores them.

The client's side (:class:`ClientLogin`, :func:`check_server_final`) is what a broker uses to log
in to another broker's SCRAM listener.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
# Mechanism -> hashlib's name of its hash.
HASHES: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
MECHANISMS: Final = tuple(HASHES)
# The mechanism codes of AlterUserScramCredentials and DescribeUserScramCredentials (Kafka's
# ScramMechanism types; 0 is UNKNOWN).
MECHANISM_TYPES: Final = {1: SCRAM_SHA_256, 2: SCRAM_SHA_512}
TYPE_OF: Final = {name: code for code, name in MECHANISM_TYPES.items()}
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
TOKEN_AUTH: Final = "tokenauth"

INVALID_CREDENTIALS: Final = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism"
)
AUTHZID_MISMATCH: Final = (
    "Authentication failed: Client requested an authorization id that is different from username"
)


class ScramFormatError(ValueError):
    """Bytes that are not the SCRAM message expected (the message says what is wrong)."""


def digest_size(mechanism: str) -> int:
    return hashlib.new(HASHES[mechanism]).digest_size


# ------------------------------------------------------------------------- the credential


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps of one user's password for one mechanism."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, HASHES[mechanism]).digest()


def _hash(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(HASHES[mechanism], data).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(password, salt, iterations)``: the password as UTF-8 bytes (Kafka applies no
    SASLprep)."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def client_key(mechanism: str, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Client Key")


def credential_of_salted(
    mechanism: str, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """The credential of a salted password (what AlterUserScramCredentials sends)."""
    return ScramCredential(
        salt=salt,
        stored_key=_hash(mechanism, client_key(mechanism, salted)),
        server_key=_hmac(mechanism, salted, b"Server Key"),
        iterations=iterations,
    )


def credential_of_password(
    mechanism: str, password: str, salt: bytes, iterations: int
) -> ScramCredential:
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_of_salted(mechanism, salted, salt, iterations)


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right, strict=True))


def client_proof(mechanism: str, salted: bytes, auth_message: bytes) -> bytes:
    """The client's proof: ``ClientKey XOR HMAC(StoredKey, AuthMessage)``."""
    key = client_key(mechanism, salted)
    return _xor(key, _hmac(mechanism, _hash(mechanism, key), auth_message))


def server_signature(mechanism: str, server_key: bytes, auth_message: bytes) -> bytes:
    return _hmac(mechanism, server_key, auth_message)


def auth_message(
    client_first_bare: str, server_first: str, client_final_without_proof: str
) -> bytes:
    return f"{client_first_bare},{server_first},{client_final_without_proof}".encode()


# ---------------------------------------------------------------------------- the messages

_NONCE: Final = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_EXTENSION_NAME: Final = re.compile(r"[A-Za-z]+")


def _text(message: bytes, what: str) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScramFormatError(f"the {what} is not UTF-8 ({error.reason})") from None


def _b64decode(text: str, what: str) -> bytes:
    try:
        value = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramFormatError(f"{what} is not base64: {text[:40]!r}") from None
    if base64.b64encode(value).decode() != text:
        raise ScramFormatError(f"{what} is not canonical base64: {text[:40]!r}")
    return value


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def decode_saslname(text: str, what: str) -> str:
    if not text:
        raise ScramFormatError(f"the {what} is empty")
    if "\0" in text or re.search(r"=(?!2C|3D)", text):
        raise ScramFormatError(f"the {what} {text[:40]!r} is not a saslname (=2C, =3D only)")
    return text.replace("=2C", ",").replace("=3D", "=")


def _nonce(text: str, what: str) -> str:
    if _NONCE.fullmatch(text) is None:
        raise ScramFormatError(f"the {what} {text[:40]!r} is not printable ASCII without ','")
    return text


def _attribute(part: str, name: str, what: str) -> str:
    if not part.startswith(f"{name}="):
        raise ScramFormatError(f"the {what} has {part[:20]!r} where {name}= belongs")
    return part[len(name) + 1 :]


def _extensions(parts: list[str], what: str) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    for part in parts:
        name, equals, value = part.partition("=")
        if not equals or _EXTENSION_NAME.fullmatch(name) is None or not value:
            raise ScramFormatError(f"the {what} has {part[:20]!r}, not an extension name=value")
        found.append((name, value))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str  # "n,," or "n,a=<authzid>,"
    authzid: str  # "" when the header names none
    username: str
    nonce: str
    extensions: tuple[tuple[str, str], ...]
    bare: str  # the message after the gs2 header, as sent (part of the AuthMessage)


def parse_client_first(message: bytes) -> ClientFirst:
    text = _text(message, "client-first message")
    parts = text.split(",")
    if len(parts) < 4:
        raise ScramFormatError("the client-first message is not gs2-header,n=...,r=...")
    flag, authzid_part = parts[0], parts[1]
    if flag in ("y",) or flag.startswith("p="):
        raise ScramFormatError(f"the client asks for channel binding ({flag!r}): not served")
    if flag != "n":
        raise ScramFormatError(f"the gs2 header starts {flag[:10]!r}, not n")
    authzid = ""
    if authzid_part:
        authzid = decode_saslname(_attribute(authzid_part, "a", "gs2 header"), "authzid")
    if parts[2].startswith("m="):
        raise ScramFormatError("the client-first message has a mandatory extension (m=)")
    username = decode_saslname(_attribute(parts[2], "n", "client-first message"), "username")
    nonce = _nonce(_attribute(parts[3], "r", "client-first message"), "client nonce")
    extensions = _extensions(parts[4:], "client-first message")
    bare = text[len(flag) + len(authzid_part) + 2 :]
    return ClientFirst(f"{flag},{authzid_part},", authzid, username, nonce, extensions, bare)


def format_client_first(
    username: str, nonce: str, authzid: str = "", extensions: tuple[tuple[str, str], ...] = ()
) -> bytes:
    header = f"n,a={encode_saslname(authzid)}," if authzid else "n,,"
    bare = f"n={encode_saslname(username)},r={nonce}"
    bare += "".join(f",{name}={value}" for name, value in extensions)
    return (header + bare).encode()


@dataclass(frozen=True, slots=True)
class ServerFirst:
    nonce: str  # the client's nonce and the server's
    salt: bytes
    iterations: int

    @property
    def text(self) -> str:
        return f"r={self.nonce},s={_b64(self.salt)},i={self.iterations}"


def format_server_first(first: ServerFirst) -> bytes:
    return first.text.encode()


def parse_server_first(message: bytes) -> ServerFirst:
    text = _text(message, "server-first message")
    parts = text.split(",")
    if len(parts) < 3:
        raise ScramFormatError("the server-first message is not r=...,s=...,i=...")
    if parts[0].startswith("m="):
        raise ScramFormatError("the server-first message has a mandatory extension (m=)")
    nonce = _nonce(_attribute(parts[0], "r", "server-first message"), "nonce")
    salt = _b64decode(_attribute(parts[1], "s", "server-first message"), "the salt")
    count = _attribute(parts[2], "i", "server-first message")
    if not count.isascii() or not count.isdigit() or len(count) > 9 or int(count) <= 0:
        raise ScramFormatError(f"the iteration count {count[:12]!r} is not a positive integer")
    _extensions(parts[3:], "server-first message")
    return ServerFirst(nonce, salt, int(count))


@dataclass(frozen=True, slots=True)
class ClientFinal:
    channel_binding: bytes
    nonce: str
    proof: bytes
    without_proof: str  # the message before ",p=", as sent (part of the AuthMessage)


def parse_client_final(message: bytes) -> ClientFinal:
    text = _text(message, "client-final message")
    parts = text.split(",")
    if len(parts) < 3:
        raise ScramFormatError("the client-final message is not c=...,r=...,p=...")
    binding = _b64decode(_attribute(parts[0], "c", "client-final message"), "the channel binding")
    nonce = _nonce(_attribute(parts[1], "r", "client-final message"), "nonce")
    _extensions(parts[2:-1], "client-final message")
    proof = _b64decode(_attribute(parts[-1], "p", "client-final message"), "the proof")
    return ClientFinal(binding, nonce, proof, text[: len(text) - len(parts[-1]) - 1])


def format_client_final(channel_binding: bytes, nonce: str, proof: bytes) -> bytes:
    return f"{client_final_without_proof(channel_binding, nonce)},p={_b64(proof)}".encode()


def client_final_without_proof(channel_binding: bytes, nonce: str) -> str:
    return f"c={_b64(channel_binding)},r={nonce}"


@dataclass(frozen=True, slots=True)
class ServerFinal:
    signature: bytes | None  # v=
    error: str | None = None  # e=


def format_server_final(final: ServerFinal) -> bytes:
    if final.error is not None:
        return f"e={final.error}".encode()
    assert final.signature is not None
    return f"v={_b64(final.signature)}".encode()


def parse_server_final(message: bytes) -> ServerFinal:
    text = _text(message, "server-final message")
    parts = text.split(",")
    if parts[0].startswith("e="):
        error = parts[0][2:]
        if not error or "=" in error:
            raise ScramFormatError(f"the server error {error[:40]!r} is not a server-error-value")
        return ServerFinal(None, error)
    signature = _b64decode(_attribute(parts[0], "v", "server-final message"), "the signature")
    _extensions(parts[1:], "server-final message")
    return ServerFinal(signature)


# ---------------------------------------------------------------------------- the exchange


@dataclass(frozen=True, slots=True)
class AwaitingFirst:
    mechanism: str


@dataclass(frozen=True, slots=True)
class AwaitingFinal:
    mechanism: str
    client_first: ClientFirst
    server_first: ServerFirst
    credential: ScramCredential


@dataclass(frozen=True, slots=True)
class Authenticated:
    mechanism: str
    username: str


@dataclass(frozen=True, slots=True)
class Failed:
    mechanism: str
    reason: str  # why, for the broker's log
    message: str  # what the client is told (Kafka's text)


Exchange: TypeAlias = AwaitingFirst | AwaitingFinal | Authenticated | Failed
CredentialLookup: TypeAlias = Callable[[str], ScramCredential | None]


def start(mechanism: str) -> AwaitingFirst:
    if mechanism not in HASHES:
        raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(MECHANISMS)})")
    return AwaitingFirst(mechanism)


def _failed(mechanism: str, reason: str, message: str | None = None) -> Failed:
    return Failed(mechanism, reason, message or f"{INVALID_CREDENTIALS} {mechanism}")


def step(
    state: Exchange, message: bytes, server_nonce: str, credentials: CredentialLookup
) -> tuple[Exchange, bytes | None]:
    """The exchange after the client's ``message``, and the server's answer (None on failure).
    ``server_nonce`` (used with the client-first only) must be printable ASCII without ``,``;
    ``credentials`` gives a username's credential for this mechanism, or None."""
    if isinstance(state, AwaitingFirst):
        return _first(state, message, server_nonce, credentials)
    if isinstance(state, AwaitingFinal):
        return _final(state, message)
    done = "complete" if isinstance(state, Authenticated) else "failed"
    return _failed(state.mechanism, f"a SCRAM message after the exchange {done}"), None


def _first(
    state: AwaitingFirst, message: bytes, server_nonce: str, credentials: CredentialLookup
) -> tuple[Exchange, bytes | None]:
    mechanism = state.mechanism
    try:
        first = parse_client_first(message)
    except ScramFormatError as error:
        return _failed(mechanism, f"invalid SCRAM client-first message: {error}"), None
    token = dict(first.extensions).get(TOKEN_AUTH, "")
    if token.lower() == "true":
        reason = "a delegation token's login (tokenauth): no delegation tokens are served"
        return _failed(mechanism, reason), None
    credential = credentials(first.username)
    if credential is None:
        return _failed(mechanism, f"no {mechanism} credential for user {first.username!r}"), None
    if first.authzid and first.authzid != first.username:
        reason = f"authorization id {first.authzid!r} is not the username {first.username!r}"
        return _failed(mechanism, reason, AUTHZID_MISMATCH), None
    if credential.iterations < MIN_ITERATIONS:
        reason = f"iterations {credential.iterations} is less than the minimum {MIN_ITERATIONS}"
        return _failed(mechanism, reason), None
    server_first = ServerFirst(first.nonce + server_nonce, credential.salt, credential.iterations)
    answer = format_server_first(server_first)
    return AwaitingFinal(mechanism, first, server_first, credential), answer


def _final(state: AwaitingFinal, message: bytes) -> tuple[Exchange, bytes | None]:
    mechanism = state.mechanism
    try:
        final = parse_client_final(message)
    except ScramFormatError as error:
        return _failed(mechanism, f"invalid SCRAM client-final message: {error}"), None
    if not hmac.compare_digest(final.nonce.encode(), state.server_first.nonce.encode()):
        return _failed(mechanism, "invalid client nonce in the final client message"), None
    if final.channel_binding != state.client_first.gs2_header.encode():
        return _failed(mechanism, "the channel binding is not the gs2 header"), None
    size = digest_size(mechanism)
    if len(final.proof) != size:
        reason = f"a proof of {len(final.proof)} bytes ({mechanism}'s is {size})"
        return _failed(mechanism, reason), None
    auth = auth_message(state.client_first.bare, state.server_first.text, final.without_proof)
    credential = state.credential
    signature = _hmac(mechanism, credential.stored_key, auth)
    if not hmac.compare_digest(
        _hash(mechanism, _xor(final.proof, signature)), credential.stored_key
    ):
        reason = f"invalid client proof for user {state.client_first.username!r}"
        return _failed(mechanism, reason), None
    answer = format_server_final(
        ServerFinal(server_signature(mechanism, credential.server_key, auth))
    )
    return Authenticated(mechanism, state.client_first.username), answer


# ---------------------------------------------------------------------------- the client's side


@dataclass(frozen=True, slots=True)
class ClientLogin:
    """The client's side of one exchange (a broker logging in to another): its first message,
    then, given the server-first, its final message and the signature the server-final must
    carry. Kafka's ``ScramSaslClient`` rules: the server's nonce must extend the client's, and
    an iteration count below :data:`MIN_ITERATIONS` is refused."""

    mechanism: str
    username: str
    password: str
    nonce: str  # printable ASCII without ","

    @property
    def first(self) -> bytes:
        return format_client_first(self.username, self.nonce)

    def final(self, server_first: bytes) -> tuple[bytes, bytes]:
        """The client-final for ``server_first`` and the server signature to expect;
        :class:`ScramFormatError` for a server-first that is malformed or breaks the rules."""
        first = parse_server_first(server_first)
        if not first.nonce.startswith(self.nonce) or first.nonce == self.nonce:
            raise ScramFormatError("the server's nonce does not extend the client's")
        if first.iterations < MIN_ITERATIONS:
            raise ScramFormatError(
                f"iterations {first.iterations} is less than the minimum {MIN_ITERATIONS}"
            )
        mechanism = self.mechanism
        salted = salted_password(mechanism, self.password, first.salt, first.iterations)
        without = client_final_without_proof(b"n,,", first.nonce)
        bare = self.first.decode()[len("n,,") :]
        auth = auth_message(bare, server_first.decode(), without)
        proof = client_proof(mechanism, salted, auth)
        server_key = credential_of_salted(mechanism, salted, first.salt, first.iterations)
        expected = server_signature(mechanism, server_key.server_key, auth)
        return format_client_final(b"n,,", first.nonce, proof), expected


def check_server_final(message: bytes, expected: bytes) -> None:
    """:class:`ScramFormatError` unless ``message`` is a server-final carrying ``expected`` (a
    server that does not hold the credential cannot sign)."""
    final = parse_server_final(message)
    if final.error is not None:
        raise ScramFormatError(f"the server refused the login: {final.error}")
    assert final.signature is not None
    if not hmac.compare_digest(final.signature, expected):
        raise ScramFormatError("the server's signature is not the credential's")
