"""Kafka's listener properties as text: ``listeners`` and ``advertised.listeners`` (comma-separated
``NAME://host:port``), ``listener.security.protocol.map`` (comma-separated ``NAME:PROTOCOL``) and
the per-listener settings ``listener.name.<name>.<setting>``.

A listener's name is case-insensitive (Kafka upper-cases it); each name appears once in a list.
An empty host (``PLAINTEXT://:9092``) binds every address; a host in brackets is an IPv6 address.
Bound ports are distinct across ``listeners`` (port 0, a free port each, excepted);
``advertised.listeners`` may repeat a port (one listener advertising another's address through a
proxy), as Kafka allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from automq_ref.formats.jaas import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    JaasError,
    own_login,
    plain_users,
)

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Kafka's listener.security.protocol.map default: each protocol is a listener name of its own.
DEFAULT_SECURITY_PROTOCOL_MAP: Final = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)
# listener.name.<name>.<setting>: the name as Kafka writes it there (lower case), the setting.
LISTENER_SETTING: Final = re.compile(r"^listener\.name\.([A-Za-z0-9_]+)\.(.+)$")
_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:/\[\]]*):(\d+)$")


@dataclass(frozen=True, slots=True)
class ListenerAddress:
    """One ``NAME://host:port`` (the name upper-cased, brackets taken off an IPv6 host)."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_listener(value: str) -> ListenerAddress:
    """One ``NAME://host:port``; ValueError saying what is wrong."""
    match = _LISTENER.match(value.strip())
    if match is None:
        raise ValueError("a listener is NAME://host:port, e.g. PLAINTEXT://127.0.0.1:9092")
    name, host, port = match.group(1).upper(), match.group(2).strip("[]"), int(match.group(3))
    if port > 65535:
        raise ValueError(f"port {port} is out of range")
    return ListenerAddress(name, host, port)


def parse_listeners(value: str, *, distinct_ports: bool = True) -> tuple[ListenerAddress, ...]:
    """A comma-separated list of listeners, in order; ValueError for an empty list, a malformed
    entry, a name given twice, or (``distinct_ports``) two listeners on one non-zero port."""
    pieces = [piece.strip() for piece in value.split(",") if piece.strip()]
    found = []
    for piece in pieces:
        try:
            found.append(parse_listener(piece))
        except ValueError as error:
            raise ValueError(f"{piece!r}: {error}" if len(pieces) > 1 else str(error)) from None
    if not found:
        raise ValueError("no listener is given (NAME://host:port, comma-separated)")
    names = [listener.name for listener in found]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"listener {', '.join(repeated)} is given more than once")
    if distinct_ports:
        ports = [listener.port for listener in found if listener.port != 0]
        shared = sorted({port for port in ports if ports.count(port) > 1})
        if shared:
            raise ValueError(f"several listeners bind port {', '.join(map(str, shared))}")
    return tuple(found)


def parse_protocol_map(value: str) -> dict[str, str]:
    """``listener.security.protocol.map``: listener name (upper-cased) -> security protocol."""
    found: dict[str, str] = {}
    for pair in (piece.strip() for piece in value.split(",")):
        if not pair:
            continue
        name, separator, protocol = pair.partition(":")
        protocol = protocol.strip().upper()
        if not separator or not name.strip() or protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"{pair!r}: a pair is NAME:PROTOCOL, the protocol one of "
                + ", ".join(SECURITY_PROTOCOLS)
            )
        if name.strip().upper() in found:
            raise ValueError(f"listener {name.strip().upper()} is mapped more than once")
        found[name.strip().upper()] = protocol
    return found


def listener_setting(property_name: str) -> tuple[str, str] | None:
    """``listener.name.<name>.<setting>`` as (NAME upper-cased, setting); None for another
    property."""
    match = LISTENER_SETTING.match(property_name)
    return None if match is None else (match.group(1).upper(), match.group(2))


# ------------------------------------------------------------------------- resolved listeners

# The SASL mechanisms served (Kafka's default for sasl.enabled.mechanisms, GSSAPI, is not):
# PLAIN's users from the listener's JAAS text, SCRAM's from the controller KV.
SERVED_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SSL_CLIENT_AUTH: Final = ("none", "requested", "required")
# The TLS settings, global (ssl.*) and per listener (listener.name.<name>.ssl.*).
SSL_SETTINGS: Final = (
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.key.password",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.certificates",
    "ssl.client.auth",
)
SASL_ENABLED_MECHANISMS: Final = "sasl.enabled.mechanisms"
# A listener's own settings besides its TLS ones: its mechanisms and, per mechanism (lower
# case), its JAAS text (PLAIN: the users it accepts and, for a broker's own links, its login).
_LISTENER_SASL_SETTING: Final = re.compile(
    r"^(sasl\.enabled\.mechanisms|[a-z0-9-]+\.sasl\.jaas\.config)$"
)


def is_listener_setting(setting: str) -> bool:
    """Whether ``listener.name.<name>.<setting>`` is a setting a listener has of its own."""
    return setting in SSL_SETTINGS or _LISTENER_SASL_SETTING.match(setting) is not None


@dataclass(frozen=True, slots=True)
class SslSettings:
    """A TLS listener's settings, each named by its property (``ssl.keystore.location``...),
    the listener's own ``listener.name.<name>.ssl.*`` over the global ``ssl.*``."""

    values: tuple[tuple[str, str], ...]
    prefix: str  # "" for the global properties, else "listener.name.<name>." (in messages)

    def get(self, name: str) -> str:
        return dict(self.values).get(name, "")

    def named(self, name: str) -> str:
        """The property as the operator wrote it (with the listener prefix when it was)."""
        return f"{self.prefix}{name}" if self.prefix else name

    def check(self) -> None:
        """ValueError naming the property, for settings an SSL listener cannot serve with."""
        get = self.get
        for name in ("ssl.keystore.type", "ssl.truststore.type"):
            kind = get(name) or "JKS"
            truststore = get("ssl.truststore.location") or get("ssl.truststore.certificates")
            if kind.upper() != "PEM" and (name == "ssl.keystore.type" or truststore):
                raise ValueError(
                    f"{self.named(name)}={kind}: only PEM is read here (set {self.named(name)}=PEM)"
                )
        has_file = bool(get("ssl.keystore.location"))
        has_text = bool(get("ssl.keystore.certificate.chain") or get("ssl.keystore.key"))
        if has_file == has_text:
            raise ValueError(
                "an SSL listener needs its certificate and key: ssl.keystore.location (a PEM "
                "file with both) or ssl.keystore.certificate.chain and ssl.keystore.key"
            )
        if has_text and not (get("ssl.keystore.certificate.chain") and get("ssl.keystore.key")):
            raise ValueError("ssl.keystore.certificate.chain and ssl.keystore.key go together")
        client_auth = get("ssl.client.auth") or "none"
        if client_auth not in SSL_CLIENT_AUTH:
            raise ValueError(
                f"{self.named('ssl.client.auth')}={client_auth}: one of "
                + ", ".join(SSL_CLIENT_AUTH)
            )
        if client_auth != "none" and not (
            get("ssl.truststore.location") or get("ssl.truststore.certificates")
        ):
            raise ValueError(
                f"ssl.client.auth={client_auth} needs a truststore to check client "
                "certificates with (ssl.truststore.location or ssl.truststore.certificates)"
            )


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """A SASL listener's mechanisms and JAAS texts (by mechanism, upper case)."""

    mechanisms: tuple[str, ...]
    jaas: tuple[tuple[str, str], ...]
    prefix: str  # "listener.name.<name>."

    def jaas_property(self, mechanism: str) -> str:
        return f"{self.prefix}{mechanism.lower()}.sasl.jaas.config"

    def jaas_text(self, mechanism: str) -> str:
        return dict(self.jaas).get(mechanism.upper(), "")

    @property
    def plain_users(self) -> dict[str, str]:
        """PLAIN's users (name -> password), from the listener's PLAIN JAAS text; ValueError
        naming the property when PLAIN is enabled and the text names none."""
        if "PLAIN" not in self.mechanisms:
            return {}
        text, name = self.jaas_text("PLAIN"), self.jaas_property("PLAIN")
        if not text.strip():
            raise ValueError(
                f"a SASL listener with PLAIN needs its users: {name}="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                'user_<name>="<password>";'
            )
        try:
            return plain_users(text)
        except JaasError as error:
            raise ValueError(f"{name}: {error}") from error

    def login(self, mechanism: str) -> tuple[str, str] | None:
        """The broker's own login for ``mechanism`` (``username``/``password`` of the
        ``PlainLoginModule`` entry of PLAIN's JAAS text, of the ``ScramLoginModule`` entry of a
        SCRAM mechanism's), used on its links to other brokers; None when the text gives none."""
        text = self.jaas_text(mechanism)
        module = PLAIN_LOGIN_MODULE if mechanism.upper() == "PLAIN" else SCRAM_LOGIN_MODULE
        try:
            return own_login(text, module) if text else None
        except JaasError as error:
            raise ValueError(f"{self.jaas_property(mechanism)}: {error}") from error


@dataclass(frozen=True, slots=True)
class Listener:
    """One listener as served: where it binds, its protocol, what it advertises (None: it is
    not advertised), and its TLS and SASL settings when its protocol has them."""

    name: str
    host: str
    port: int
    protocol: str
    advertised: ListenerAddress | None
    ssl: SslSettings | None
    sasl: SaslSettings | None

    @property
    def address(self) -> ListenerAddress:
        return ListenerAddress(self.name, self.host, self.port)


def resolve_listeners(
    listeners: str,
    advertised_listeners: str,
    protocol_map: str,
    global_settings: dict[str, str],
    own_settings: dict[str, dict[str, str]],
) -> tuple[Listener, ...]:
    """The listeners of ``listeners``, each with its protocol (``protocol_map``), its advertised
    address (all of ``listeners`` when ``advertised_listeners`` is empty), and its settings:
    ``own_settings`` (listener name -> setting -> value, from ``listener.name.<name>.*``) over
    ``global_settings`` (``ssl.*``, ``sasl.enabled.mechanisms``). ValueError naming the
    property for anything a listener cannot be served with."""
    bound = parse_listeners(listeners)
    protocols = parse_protocol_map(protocol_map)
    names = {listener.name for listener in bound}
    advertised: dict[str, ListenerAddress] = {}
    if advertised_listeners.strip():
        for address in parse_listeners(advertised_listeners, distinct_ports=False):
            if address.name not in names:
                raise ValueError(
                    f"advertised.listeners={advertised_listeners}: listener {address.name} is "
                    f"not in listeners ({listeners})"
                )
            if address.host in ("", "0.0.0.0", "::"):
                raise ValueError(
                    f"advertised.listeners={advertised_listeners}: {address} is not an address "
                    "a client can connect to (name the host)"
                )
            advertised[address.name] = address
    else:
        advertised = {listener.name: listener for listener in bound}
    unknown = sorted(set(own_settings) - names)
    if unknown:
        name = unknown[0]
        setting = sorted(own_settings[name])[0]
        raise ValueError(
            f"listener.name.{name.lower()}.{setting}: {name} is not a listener of listeners "
            f"({listeners})"
        )
    resolved = []
    for address in bound:
        if address.name not in protocols:
            raise ValueError(
                f"listeners={listeners}: listener {address.name} is not in "
                f"listener.security.protocol.map ({protocol_map})"
            )
        protocol = protocols[address.name]
        own = own_settings.get(address.name, {})
        prefix = f"listener.name.{address.name.lower()}."
        ssl = sasl = None
        if protocol.startswith("SASL_"):
            sasl = _sasl_settings(address.name, prefix, own, global_settings)
        if protocol.endswith("SSL"):
            prefixed = any(name in own for name in SSL_SETTINGS)
            merged = {
                name: own.get(name, global_settings.get(name, ""))
                for name in SSL_SETTINGS
                if own.get(name, global_settings.get(name, ""))
            }
            ssl = SslSettings(tuple(sorted(merged.items())), prefix if prefixed else "")
            ssl.check()
        resolved.append(
            Listener(
                address.name,
                address.host,
                address.port,
                protocol,
                advertised.get(address.name),
                ssl,
                sasl,
            )
        )
    return tuple(resolved)


def _sasl_settings(
    name: str, prefix: str, own: dict[str, str], global_settings: dict[str, str]
) -> SaslSettings:
    if SASL_ENABLED_MECHANISMS in own:
        property_name, text = prefix + SASL_ENABLED_MECHANISMS, own[SASL_ENABLED_MECHANISMS]
    else:
        property_name = SASL_ENABLED_MECHANISMS
        text = global_settings.get(SASL_ENABLED_MECHANISMS, "GSSAPI")
    mechanisms = tuple(m.strip().upper() for m in text.split(",") if m.strip())
    others = [m for m in mechanisms if m not in SERVED_SASL_MECHANISMS]
    if others or not mechanisms:
        raise ValueError(
            f"{property_name}={text}: only {', '.join(SERVED_SASL_MECHANISMS)} are served here"
            + (f" ({', '.join(others)} is not)" if others else "")
            + f"; a SASL listener ({name}) needs some of them (e.g. {property_name}=PLAIN)"
        )
    jaas = {
        setting.removesuffix(".sasl.jaas.config").upper(): value
        for setting, value in own.items()
        if setting.endswith(".sasl.jaas.config")
    }
    settings = SaslSettings(mechanisms, tuple(sorted(jaas.items())), prefix)
    settings.plain_users  # noqa: B018 (raises naming the property)
    return settings
