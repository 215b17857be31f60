"""TLS for an SSL or SASL_SSL listener, from Kafka's properties (PEM keystores and truststores).

The listener's security protocol is ``listener.security.protocol.map``'s for its name
(``SSL://host:port``: SSL; SASL_SSL is this TLS with SASL inside it, :mod:`.sasl`). Its certificate
chain and private key come from ``ssl.keystore.location`` (one PEM file holding both, Kafka's PEM
keystore file) or from ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key`` (the PEM texts
themselves), the key decrypted with ``ssl.key.password`` when it is encrypted. Client certificates
are asked for as ``ssl.client.auth`` says (``none``, ``requested``: asked, not required,
``required``) and checked against ``ssl.truststore.location`` or ``ssl.truststore.certificates``
(PEM certificates). TLS 1.2 is the oldest version served (Kafka's ``ssl.enabled.protocols`` default
is TLSv1.2 and TLSv1.3); the ciphers are Python's defaults.

A PEM text given inline may have its line breaks replaced by spaces (a properties file holds one
line); they are put back before it is read, as Kafka's ``PemStore`` does.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from pathlib import Path

from automq_ref.config import BrokerConfig

_PEM_BLOCK = re.compile(r"(-----BEGIN [A-Z0-9 ]+-----)(.*?)(-----END [A-Z0-9 ]+-----)", re.DOTALL)
_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


class TlsConfigError(ValueError):
    """The listener's TLS properties cannot be used; the message names the property."""


def server_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The SSL or SASL_SSL listener's context (None for a PLAINTEXT or SASL_PLAINTEXT one)."""
    if config.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    password = config.ssl_key_password or None
    try:
        if config.ssl_keystore_location:
            context.load_cert_chain(config.ssl_keystore_location, password=password)
        else:
            _load_inline_chain(
                context,
                config.ssl_keystore_certificate_chain,
                config.ssl_keystore_key,
                password,
            )
    except (OSError, ssl.SSLError) as error:
        what = (
            f"ssl.keystore.location={config.ssl_keystore_location}"
            if config.ssl_keystore_location
            else "ssl.keystore.certificate.chain / ssl.keystore.key"
        )
        raise TlsConfigError(
            f"{what}: not a usable PEM certificate chain and key: {error}"
        ) from error
    context.verify_mode = _CLIENT_AUTH[config.ssl_client_auth]
    try:
        if config.ssl_truststore_location:
            context.load_verify_locations(cafile=config.ssl_truststore_location)
        elif config.ssl_truststore_certificates:
            context.load_verify_locations(cadata=pem_text(config.ssl_truststore_certificates))
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"the truststore: not usable PEM certificates: {error}") from error
    return context


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
