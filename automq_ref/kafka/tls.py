"""TLS for an SSL or SASL_SSL listener, from Kafka's properties (PEM keystores and truststores).

The listener's security protocol is ``listener.security.protocol.map``'s for its name
(``SSL://host:port``: SSL; SASL_SSL is this TLS with SASL inside it, :mod:`.sasl`), its
settings the listener's ``listener.name.<name>.ssl.*`` over the global ``ssl.*``
(:class:`~automq_ref.formats.listeners.SslSettings`). Its certificate chain and private key
come from ``ssl.keystore.location`` (one PEM file holding both, Kafka's PEM
keystore file) or from ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key`` (the PEM texts
themselves), the key decrypted with ``ssl.key.password`` when it is encrypted. Client certificates
are asked for as ``ssl.client.auth`` says (``none``, ``requested``: asked, not required,
``required``) and checked against ``ssl.truststore.location`` or ``ssl.truststore.certificates``
(PEM certificates). TLS 1.2 is the oldest version served (Kafka's ``ssl.enabled.protocols`` default
is TLSv1.2 and TLSv1.3); the ciphers are Python's defaults.

A connection's principal (what ACLs will be checked against) is its client certificate's subject
(:func:`certificate_principal`), until a SASL login replaces it.

A PEM text given inline may have its line breaks replaced by spaces (a properties file holds one
line); they are put back before it is read, as Kafka's ``PemStore`` does.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import Final

from cryptography import x509

from automq_ref.formats.listeners import Listener, SslSettings

_PEM_BLOCK = re.compile(r"(-----BEGIN [A-Z0-9 ]+-----)(.*?)(-----END [A-Z0-9 ]+-----)", re.DOTALL)
_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


ANONYMOUS: Final = "User:ANONYMOUS"


def certificate_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str:
    """The principal of a TLS connection, as Kafka's ``DefaultKafkaPrincipalBuilder`` builds it
    with ``ssl.principal.mapping.rules=DEFAULT``: ``User:`` and the client certificate's
    subject as an RFC 2253 distinguished name (``CN=client,O=example``: the most specific part
    first); ``User:ANONYMOUS`` when the client sent no certificate (or the connection is not
    TLS)."""
    certificate = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
    if not certificate:
        return ANONYMOUS
    subject = x509.load_der_x509_certificate(certificate).subject
    return "User:" + subject.rfc4514_string()


class TlsConfigError(ValueError):
    """The listener's TLS properties cannot be used; the message names the property."""


def server_ssl_context(listener: Listener) -> ssl.SSLContext | None:
    """The SSL or SASL_SSL listener's context (None for a PLAINTEXT or SASL_PLAINTEXT one)."""
    if listener.ssl is None:
        return None
    settings = listener.ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_keystore(context, settings)
    context.verify_mode = _CLIENT_AUTH[settings.get("ssl.client.auth") or "none"]
    _load_truststore(context, settings)
    return context


def client_ssl_context(listener: Listener) -> ssl.SSLContext | None:
    """A context for this broker's links to another broker's TLS listener of the same name:
    the server's certificate checked against the truststore (the system's when none is set)
    and its host name against the certificate, as Kafka's default
    ``ssl.endpoint.identification.algorithm=https`` does; this broker's own certificate offered
    (the listener's keystore) for a listener that asks for one. None for a listener without
    TLS."""
    if listener.ssl is None:
        return None
    settings = listener.ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.get("ssl.truststore.location") or settings.get("ssl.truststore.certificates"):
        _load_truststore(context, settings)
    else:
        context.load_default_certs()
    _load_keystore(context, settings)
    return context


def _load_keystore(context: ssl.SSLContext, settings: SslSettings) -> None:
    password = settings.get("ssl.key.password") or None
    location = settings.get("ssl.keystore.location")
    try:
        if location:
            context.load_cert_chain(location, password=password)
        else:
            _load_inline_chain(
                context,
                settings.get("ssl.keystore.certificate.chain"),
                settings.get("ssl.keystore.key"),
                password,
            )
    except (OSError, ssl.SSLError) as error:
        what = (
            f"{settings.named('ssl.keystore.location')}={location}"
            if location
            else f"{settings.named('ssl.keystore.certificate.chain')} / "
            f"{settings.named('ssl.keystore.key')}"
        )
        raise TlsConfigError(
            f"{what}: not a usable PEM certificate chain and key: {error}"
        ) from error


def _load_truststore(context: ssl.SSLContext, settings: SslSettings) -> None:
    try:
        if settings.get("ssl.truststore.location"):
            context.load_verify_locations(cafile=settings.get("ssl.truststore.location"))
        elif settings.get("ssl.truststore.certificates"):
            context.load_verify_locations(
                cadata=pem_text(settings.get("ssl.truststore.certificates"))
            )
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"the truststore: not usable PEM certificates: {error}") from error


def pem_text(value: str) -> str:
    """A PEM text as a properties file may hold it (on one line): each block's body with its
    line breaks back."""

    def block(match: re.Match[str]) -> str:
        body = "\n".join(match.group(2).split())
        return f"{match.group(1)}\n{body}\n{match.group(3)}\n"

    return _PEM_BLOCK.sub(block, value.strip())


def _load_inline_chain(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """``ssl`` reads a chain and key from files only: through a file of this process's own,
    readable by its user only, removed at once."""
    handle, name = tempfile.mkstemp(prefix="automq-ref-keystore-", suffix=".pem")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(pem_text(chain) + pem_text(key))
        context.load_cert_chain(name, password=password)
    finally:
        Path(name).unlink(missing_ok=True)
