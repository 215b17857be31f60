"""SASL/PLAIN and SASL/SCRAM (SCRAM-SHA-256, SCRAM-SHA-512) on a SASL_PLAINTEXT or SASL_SSL
listener, with the steps and answers of Kafka's ``SaslServerAuthenticator``, ``PlainSaslServer``
and ``ScramSaslServer``.

A connection is authenticated before anything else is served. Its steps (kept in its
:class:`~automq_ref.kafka.server.Session`, so they go with the connection):

- *first*: ApiVersions (served as usual) or SaslHandshake; anything else closes the connection
  unanswered (Kafka: ``IllegalSaslStateException``, "Unexpected Kafka request of type ... during
  SASL handshake"), and so does a frame that is not a Kafka request (Kafka would take it for a
  Kafka 0.9 GSSAPI token, and GSSAPI is not enabled here);
- *after ApiVersions*: SaslHandshake only (a second ApiVersions closes, as Kafka's
  ``IllegalStateException`` does);
- SaslHandshake names a mechanism: one not in ``sasl.enabled.mechanisms`` is answered
  ``UNSUPPORTED_SASL_MECHANISM`` with the enabled ones, then the connection is closed; PLAIN is
  answered NONE with the enabled ones, and so is SCRAM-SHA-256 or SCRAM-SHA-512. SaslHandshake
  v1 means the tokens come in SaslAuthenticate requests; v0 (the older flow) means the next
  frames are the bare tokens, each answered with the bare server token on success and closed
  unanswered on failure;
- *authenticating*: SaslAuthenticate only; any other request is answered with its error response
  (``ILLEGAL_SASL_STATE``, when it has a top-level error code) and the connection closed, as Kafka
  does ("Unexpected Kafka request of type ... during SASL authentication");
- the PLAIN token is ``authzid NUL username NUL password`` (UTF-8, RFC 4616): not three parts,
  an empty username or password, an unknown user or a wrong password, or an authzid other than
  empty or the username is answered ``SASL_AUTHENTICATION_FAILED`` with Kafka's message
  ("Authentication failed: Invalid username or password" for the credentials), then closed;
  success is answered NONE with an empty token and a session lifetime of 0
  (``connections.max.reauth.ms``' default: no re-authentication), and the connection's
  principal becomes ``User:<username>``;
- SCRAM takes two tokens (:mod:`automq_ref.formats.scram`, RFC 5802): the client-first is
  answered with the server-first (the server's nonce drawn here, the salt and iterations of
  the user's credential), the client-final, once its proof checks against the stored key, with
  the server-final (``v=`` and the server's signature), and the principal becomes
  ``User:<username>``. The credential is looked up by the gate's ``credentials`` function
  (mechanism, username), which on a broker reads the followed image's KV (the credentials
  AlterUserScramCredentials wrote: :mod:`automq_ref.kafka.handlers.scram`), so every broker of
  a cluster knows every user, and a user whose credential is deleted logs in no more (a
  connection already authenticated stays so, as in Kafka). Any refusal (a malformed message,
  an unknown user, a wrong proof, a ``tokenauth`` extension: no delegation tokens here) is
  answered ``SASL_AUTHENTICATION_FAILED`` with Kafka's "Authentication failed during
  authentication due to invalid credentials with SASL mechanism SCRAM-SHA-..." and closed; an
  authzid other than the username is answered with Kafka's message for it, as for PLAIN;
- *authenticated*: every request is routed as usual. SaslHandshake and SaslAuthenticate then
  reach :func:`handle_sasl_handshake` and :func:`handle_sasl_authenticate`, which answer
  ``ILLEGAL_SASL_STATE`` as Kafka's ``KafkaApis`` does when re-authentication is off (and as it
  does on a listener without SASL).

Passwords (PLAIN) and stored keys (SCRAM) are compared in constant time
(``hmac.compare_digest``), as Kafka's ``PlainServerCallbackHandler`` and ``ScramSaslServer`` do.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, cast

from automq_ref.errors import KafkaErrorCode
from automq_ref.formats import scram
from automq_ref.formats.listeners import Listener
from automq_ref.kafka.request import ApiKey, Context, Request
from automq_ref.kafka.responses import Response, encode, respond
from automq_ref.kafka.server import Chunks, CloseConnection, Peer, Reply, Session
from automq_ref.protocol.kio_codec import (
    RequestDecodeError,
    api_name,
    decode_request,
    encode_error_response,
    has_error_code,
    peek_header,
)

SASL_HANDSHAKE: Final = int(ApiKey.SASL_HANDSHAKE)
SASL_AUTHENTICATE: Final = int(ApiKey.SASL_AUTHENTICATE)
API_VERSIONS: Final = int(ApiKey.API_VERSIONS)
HANDSHAKE_VERSIONS: Final = (0, 1)
AUTHENTICATE_VERSIONS: Final = (0, 2)

# The steps of Session.sasl_step.
FIRST: Final = 0
AFTER_VERSIONS: Final = 1
AUTHENTICATING: Final = 2  # SaslHandshake v1: tokens in SaslAuthenticate
RAW_TOKEN: Final = 3  # SaslHandshake v0: the next frame is the token itself
AUTHENTICATED: Final = 4

INVALID_CREDENTIALS: Final = "Authentication failed: Invalid username or password"
AFTER_SUCCESS: Final = "SaslAuthenticate request received after successful authentication"


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Response):
    API_KEY = ApiKey.SASL_HANDSHAKE
    error_code: KafkaErrorCode
    mechanisms: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Response):
    API_KEY = ApiKey.SASL_AUTHENTICATE
    error_code: KafkaErrorCode
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime: int = 0


# A user's SCRAM credential for a mechanism: (mechanism, username) -> credential, or None.
CredentialLookup: TypeAlias = Callable[[str, str], scram.ScramCredential | None]


def no_credentials(mechanism: str, username: str) -> None:
    """The lookup of a gate given none: no SCRAM user logs in."""
    return None


def server_nonce() -> str:
    """The server's part of a SCRAM nonce: 32 random URL-safe characters (printable, no ``,``)."""
    return secrets.token_urlsafe(24)


class Serve:
    """What :meth:`SaslGate.admit` returns for a request served as usual (ApiVersions)."""


SERVE: Final = Serve()


class AuthenticationFailed(Exception):
    """A PLAIN token refused; the message is Kafka's, sent to the client."""


def check_plain_token(token: bytes, users: Mapping[str, str]) -> str:
    """The username a PLAIN token authenticates (``PlainSaslServer.evaluateResponse``);
    :class:`AuthenticationFailed` with Kafka's message otherwise."""
    parts = token.decode("utf-8", "replace").split("\0", 3)
    if len(parts) != 3:
        raise AuthenticationFailed(
            f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
        )
    authorization_id, username, password = parts
    if not username:
        raise AuthenticationFailed("Authentication failed: username not specified")
    if not password:
        raise AuthenticationFailed("Authentication failed: password not specified")
    expected = users.get(username)
    if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
        raise AuthenticationFailed(INVALID_CREDENTIALS)
    if authorization_id and authorization_id != username:
        raise AuthenticationFailed(
            "Authentication failed: Client requested an authorization id that is different "
            "from username"
        )
    return username


class SaslGate:
    """The steps before a SASL listener's connection is authenticated (the module docstring).
    The dispatcher hands it every frame of a connection not yet authenticated."""

    def __init__(
        self,
        mechanisms: Sequence[str],
        users: Mapping[str, str],
        *,
        credentials: CredentialLookup = no_credentials,
        nonces: Callable[[], str] = server_nonce,
    ) -> None:
        self.mechanisms = list(mechanisms)
        self.users = dict(users)
        self.credentials = credentials
        self.nonces = nonces

    def with_credentials(self, credentials: CredentialLookup) -> SaslGate:
        """This gate, its SCRAM users looked up by ``credentials`` (mechanism, username)."""
        return SaslGate(self.mechanisms, self.users, credentials=credentials, nonces=self.nonces)

    @classmethod
    def of(cls, listener: Listener) -> SaslGate | None:
        """The gate of a SASL_PLAINTEXT or SASL_SSL listener; None for another."""
        if listener.sasl is None:
            return None
        return cls(listener.sasl.mechanisms, listener.sasl.plain_users)

    def admit(self, frame: bytes | bytearray, peer: Peer, api_versions_max: int) -> Reply | Serve:
        session = peer.session
        if session.sasl_step == RAW_TOKEN:
            return self._raw_token(bytes(frame), session)
        try:
            api_key, version, correlation_id = peek_header(cast(bytes, frame))
        except RequestDecodeError as error:
            message = "a frame that is not a Kafka request before SASL authentication"
            raise _refused(message) from error
        name = api_name(api_key)
        if session.sasl_step == AUTHENTICATING:
            if api_key != SASL_AUTHENTICATE:
                raise _refused(
                    f"the client sent {name} during SASL authentication (only SaslAuthenticate "
                    "is served then)",
                    answer=_illegal_state(frame, api_key, version, correlation_id),
                )
            body = _decoded(frame, name, version, AUTHENTICATE_VERSIONS)
            return self._authenticate(bytes(body.auth_bytes), version, correlation_id, session)
        if api_key == API_VERSIONS and session.sasl_step == FIRST:
            if version <= api_versions_max:
                session.sasl_step = AFTER_VERSIONS
            return SERVE
        if api_key != SASL_HANDSHAKE:
            raise _refused(
                f"the client sent {name} before SASL authentication (only ApiVersions, "
                "SaslHandshake and SaslAuthenticate are served then)"
            )
        body = _decoded(frame, name, version, HANDSHAKE_VERSIONS)
        if body.mechanism not in self.mechanisms:
            response = SaslHandshakeResponse(
                KafkaErrorCode.UNSUPPORTED_SASL_MECHANISM, self.mechanisms
            )
            raise _refused(
                f"the client asked for SASL mechanism {body.mechanism!r}, which is not enabled "
                f"(sasl.enabled.mechanisms: {', '.join(self.mechanisms)})",
                answer=encode(version, correlation_id, response),
            )
        session.sasl_step = AUTHENTICATING if version >= 1 else RAW_TOKEN
        is_scram = body.mechanism in scram.HASHES
        session.sasl_exchange = scram.start(body.mechanism) if is_scram else None
        return encode(
            version, correlation_id, SaslHandshakeResponse(KafkaErrorCode.NONE, self.mechanisms)
        )

    def _authenticate(
        self, token: bytes, version: int, correlation_id: int, session: Session
    ) -> Chunks:
        if session.sasl_exchange is not None:
            try:
                answer = self._scram(token, session)
            except _ScramRefused as refused:
                failed = refused.failed
                response = SaslAuthenticateResponse(
                    KafkaErrorCode.SASL_AUTHENTICATION_FAILED, failed.message
                )
                raise _refused(
                    f"SASL/{failed.mechanism} authentication failed: {failed.reason}",
                    answer=encode(version, correlation_id, response),
                ) from None
            response = SaslAuthenticateResponse(KafkaErrorCode.NONE, auth_bytes=answer)
            return encode(version, correlation_id, response)
        try:
            username = check_plain_token(token, self.users)
        except AuthenticationFailed as error:
            response = SaslAuthenticateResponse(
                KafkaErrorCode.SASL_AUTHENTICATION_FAILED, str(error)
            )
            raise _refused(
                f"SASL/PLAIN authentication failed: {error}",
                answer=encode(version, correlation_id, response),
            ) from error
        _authenticated(session, username)
        return encode(version, correlation_id, SaslAuthenticateResponse(KafkaErrorCode.NONE))

    def _raw_token(self, token: bytes, session: Session) -> Chunks:
        if session.sasl_exchange is not None:
            try:
                return [self._scram(token, session)]
            except _ScramRefused as refused:
                failed = refused.failed
                message = f"SASL/{failed.mechanism} authentication failed: {failed.reason}"
                raise _refused(message) from None
        try:
            username = check_plain_token(token, self.users)
        except AuthenticationFailed as error:
            raise _refused(f"SASL/PLAIN authentication failed: {error}") from error
        _authenticated(session, username)
        return [b""]  # the empty PLAIN server token, size-prefixed by the listener

    def _scram(self, token: bytes, session: Session) -> bytes:
        """The server's next SCRAM token; :class:`_ScramRefused` when the exchange failed.
        Authenticates the session once the client's proof checked."""
        exchange = cast(scram.Exchange, session.sasl_exchange)
        mechanism = exchange.mechanism

        def lookup(username: str) -> scram.ScramCredential | None:
            return self.credentials(mechanism, username)

        exchange, answer = scram.step(exchange, token, self.nonces(), lookup)
        if isinstance(exchange, scram.Failed):
            session.sasl_exchange = None
            raise _ScramRefused(exchange)
        assert answer is not None  # an exchange that goes on answers
        if isinstance(exchange, scram.Authenticated):
            session.sasl_exchange = None
            _authenticated(session, exchange.username)
        else:
            session.sasl_exchange = exchange
        return answer


class _ScramRefused(Exception):
    def __init__(self, failed: scram.Failed) -> None:
        super().__init__(failed.reason)
        self.failed = failed


def _authenticated(session: Session, username: str) -> None:
    session.principal = f"User:{username}"
    session.sasl_step = AUTHENTICATED


def _refused(message: str, *, answer: Chunks | None = None) -> CloseConnection:
    return CloseConnection(message, reason=message.split(":")[0][:80], answer=answer)


def _decoded(frame: bytes | bytearray, name: str, version: int, versions: tuple[int, int]) -> Any:
    if not versions[0] <= version <= versions[1]:
        raise _refused(
            f"the client sent {name} v{version}, a version this broker does not serve "
            f"(it serves v{versions[0]}-{versions[1]})"
        )
    try:
        return decode_request(bytes(frame))[1]
    except Exception as error:  # RequestDecodeError, or a FormatError of kio's
        raise _refused(f"undecodable {name} v{version} request: {error}") from error


def _illegal_state(
    frame: bytes | bytearray, api_key: int, version: int, correlation_id: int
) -> Chunks | None:
    """A request's error response with ``ILLEGAL_SASL_STATE`` (Kafka's ``getErrorResponse``), or
    None when it has no top-level error code or does not decode."""
    if not has_error_code(api_key, version):
        return None
    try:
        decode_request(bytes(frame))
    except Exception:  # RequestDecodeError, or a FormatError of kio's
        return None
    return encode_error_response(
        api_key, version, correlation_id, KafkaErrorCode.ILLEGAL_SASL_STATE
    )


async def handle_sasl_handshake(context: Context, request: Request) -> Reply:
    """SaslHandshake on an authenticated connection, or on a listener without SASL."""
    return respond(request, SaslHandshakeResponse(KafkaErrorCode.ILLEGAL_SASL_STATE))


async def handle_sasl_authenticate(context: Context, request: Request) -> Reply:
    """SaslAuthenticate on an authenticated connection, or on a listener without SASL."""
    response = SaslAuthenticateResponse(KafkaErrorCode.ILLEGAL_SASL_STATE, AFTER_SUCCESS)
    return respond(request, response)
