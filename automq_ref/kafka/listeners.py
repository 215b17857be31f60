"""Which of a broker's listeners a request is answered for, and how brokers reach each other.

Every broker registers one endpoint per advertised listener (its name, host and port). A client
is answered in the terms of the listener its connection came to: Metadata, DescribeCluster and
FindCoordinator give each broker's endpoint of that name (:func:`endpoint_of`), so a client of
an SSL listener is sent to the other brokers' SSL listeners, one behind a proxy to the proxied
addresses. A broker without an endpoint of that name is left out, as Kafka does.

A broker's links to another (transaction markers, the zone router's forwarded writes) go to the
other broker's endpoint of ``inter.broker.listener.name`` and speak that listener's protocol
(:class:`LinkSecurity`): TLS with the listener's truststore and keystore, SASL (PLAIN, or
SCRAM-SHA-256/512 with the server's signature checked) with the broker's own login from the
listener's JAAS text for ``sasl.mechanism.inter.broker.protocol``.
"""

from __future__ import annotations

import asyncio
import errno
import secrets
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from automq_ref.config import BrokerConfig
from automq_ref.formats import scram
from automq_ref.formats.listeners import Listener
from automq_ref.kafka.tls import client_ssl_context
from automq_ref.protocol.kio_codec import build, decode_response, encode_request, request_class
from automq_ref.state_machines import stream_metadata as sm


@dataclass(frozen=True, slots=True)
class LinkLogin:
    """A broker's SASL login on another broker's listener."""

    mechanism: str  # PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class LinkSecurity:
    """How a link connects: TLS (a context) and a SASL login, each None when not spoken."""

    ssl_context: ssl.SSLContext | None = None
    login: LinkLogin | None = None


PLAINTEXT_LINK = LinkSecurity()
SASL_HANDSHAKE_KEY: Final = 17
SASL_AUTHENTICATE_KEY: Final = 36
_SIZE: Final = struct.Struct(">i")
Connect = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class LinkLoginError(ConnectionError):
    """The other broker refused this broker's login (or answered the exchange with nonsense)."""


async def open_link(
    host: str, port: int, security: LinkSecurity = PLAINTEXT_LINK, client_id: str = "automq-ref"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to another broker's listener at ``host:port``, TLS and SASL done as
    ``security`` says (SaslHandshake v1, then SaslAuthenticate v2 with PLAIN's token or the
    SCRAM exchange's two);
    :class:`LinkLoginError` when the login is refused, OSError when the connection fails."""
    context = security.ssl_context
    reader, writer = await asyncio.open_connection(
        host, port, ssl=context, server_hostname=host if context is not None else None
    )
    if security.login is None:
        return reader, writer
    try:
        await _log_in(reader, writer, security.login, client_id)
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _log_in(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, login: LinkLogin, client_id: str
) -> None:
    async def exchange(api_key: int, version: int, correlation_id: int, body: Any) -> Any:
        frame = encode_request(api_key, version, correlation_id, client_id, body)
        writer.write(_SIZE.pack(len(frame)) + frame)
        await writer.drain()
        (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
        return decode_response(api_key, version, await reader.readexactly(size))[1]

    handshake = build(request_class(SASL_HANDSHAKE_KEY, 1), {"mechanism": login.mechanism})
    answer = await exchange(SASL_HANDSHAKE_KEY, 1, 1, handshake)
    if int(answer.error_code.value) != 0:
        raise LinkLoginError(
            f"SASL {login.mechanism} refused ({answer.error_code.name}); the listener "
            f"enables {', '.join(answer.mechanisms)}"
        )

    async def authenticate(correlation_id: int, token: bytes) -> bytes:
        body = build(request_class(SASL_AUTHENTICATE_KEY, 2), {"auth_bytes": token})
        answer = await exchange(SASL_AUTHENTICATE_KEY, 2, correlation_id, body)
        if int(answer.error_code.value) != 0:
            refusal = answer.error_message or answer.error_code.name
            raise LinkLoginError(f"login as {login.username} refused: {refusal}")
        return bytes(answer.auth_bytes)

    if login.mechanism == "PLAIN":
        await authenticate(2, b"\0" + login.username.encode() + b"\0" + login.password.encode())
        return
    client = scram.ClientLogin(
        login.mechanism, login.username, login.password, secrets.token_urlsafe(24)
    )
    try:
        final, expected = client.final(await authenticate(2, client.first))
        scram.check_server_final(await authenticate(3, final), expected)
    except scram.ScramFormatError as error:
        raise LinkLoginError(f"{login.mechanism} login as {login.username}: {error}") from error


def link_connect(config: BrokerConfig, client_id: str) -> Connect:
    """:func:`open_link` with this broker's :func:`link_security` and ``client_id``."""
    security = link_security(config)

    async def connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_link(host, port, security, client_id)

    return connect


def link_security(config: BrokerConfig) -> LinkSecurity:
    """The protocol of this broker's links: that of its inter-broker listener (the other
    brokers' listener of the same name is assumed configured alike, as Kafka assumes)."""
    listener = config.inter_broker_listener
    login = None
    if listener.sasl is not None:
        mechanism = config.sasl_mechanism_inter_broker_protocol.upper()
        credentials = listener.sasl.login(mechanism)
        if credentials is not None:
            login = LinkLogin(mechanism, *credentials)
    if listener.ssl is None and login is None:
        return PLAINTEXT_LINK
    return LinkSecurity(client_ssl_context(listener), login)


def endpoint_of(broker: sm.BrokerRegistration, listener: str) -> sm.Endpoint | None:
    """``broker``'s endpoint for the listener named ``listener`` (case-insensitive); None when
    it registered none of that name. ``""`` (a connection of a server without named
    listeners, as tests build them) is its first endpoint."""
    if not broker.listeners:
        return None
    if not listener:
        return broker.listeners[0]
    wanted = listener.upper()
    return next((e for e in broker.listeners if e.name.upper() == wanted), None)


def inter_broker_address(
    broker: sm.BrokerRegistration, config: BrokerConfig
) -> tuple[str, int] | None:
    """Where this broker's links reach ``broker``: its inter-broker listener's endpoint."""
    endpoint = endpoint_of(broker, config.inter_broker_listener.name)
    return None if endpoint is None else (endpoint.host, endpoint.port)


def advertised_endpoints(
    listeners: tuple[Listener, ...], bound: dict[str, tuple[str, int]]
) -> tuple[sm.Endpoint, ...]:
    """What this broker registers: an endpoint per advertised listener, the bound address
    where ``advertised.listeners`` does not name one (with port 0, the port bound)."""
    found = []
    for listener in listeners:
        if listener.advertised is None:
            continue
        host, port = bound[listener.name]
        if listener.advertised != listener.address:
            host, port = listener.advertised.host, listener.advertised.port
        found.append(sm.Endpoint(listener.name, host, port))
    return tuple(found)


class ListenerUnavailable(Exception):
    """The listener's address cannot be bound: ``reason`` says why (the port is taken, the host
    is not this machine's, ...)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host, self.port, self.reason = host, port, reason


def check_listener_free(config: BrokerConfig) -> None:
    """Bind, then release, every address the listeners would bind (as they will: with
    ``SO_REUSEADDR``, so a port left in TIME_WAIT passes); raise :class:`ListenerUnavailable`
    for the first that fails. Port 0 always binds."""
    for listener in config.listener_specs:
        if listener.port != 0:
            _check_address_free(listener.host, listener.port)


def _check_address_free(host: str, port: int) -> None:
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        raise ListenerUnavailable(host, port, f"unknown host ({error.strerror})") from error
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                reason = (
                    "the port is already in use"
                    if error.errno == errno.EADDRINUSE
                    else (error.strerror or str(error)).lower()
                )
                raise ListenerUnavailable(host, port, reason) from error


def on_bound_ports(config: BrokerConfig, bound: dict[str, tuple[str, int]]) -> BrokerConfig:
    """``config`` with each port-0 listener on the port it was given."""
    specs = config.listener_specs
    if all(listener.port != 0 for listener in specs):
        return config
    listeners = ",".join(
        str(replace(listener.address, port=bound[listener.name][1])) for listener in specs
    )
    return config.model_copy(update={"listeners": listeners})
