"""Certificates for TLS tests and benchmarks: a CA of their own, a broker's certificate for
127.0.0.1 and localhost, and a client's, as PEM texts (ECDSA P-256 keys, valid for a day), made
with ``cryptography``. Never for a real deployment: the keys are not protected."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pem:
    certificate: str
    key: str

    @property
    def keystore(self) -> str:
        """Certificate and key in one PEM text (Kafka's PEM keystore file)."""
        return self.certificate + self.key


@dataclass(frozen=True)
class Certificates:
    ca: Pem
    broker: Pem
    client: Pem

    def write(self, directory: Path) -> dict[str, Path]:
        """``ca.pem``, ``broker.pem`` and ``client.pem`` (keystores) in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        files = {
            "ca": (directory / "ca.pem", self.ca.certificate),
            "broker": (directory / "broker.pem", self.broker.keystore),
            "client": (directory / "client.pem", self.client.keystore),
        }
        for path, text in files.values():
            path.write_text(text)
        return {name: path for name, (path, _) in files.items()}


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def issue(common: str, issuer: Pem | None, *, ca: bool = False, hosts: bool = False) -> Pem:
    """A certificate for ``common`` signed by ``issuer`` (None: self-signed); ``hosts``: valid
    for 127.0.0.1 and localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    if issuer is None:
        signer: ec.EllipticCurvePrivateKey = key
        issuer_name = _name(common)
    else:
        loaded = serialization.load_pem_private_key(issuer.key.encode(), None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        signer = loaded
        issuer_name = x509.load_pem_x509_certificate(issuer.certificate.encode()).subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(signer, hashes.SHA256())
    return Pem(
        certificate.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )


def make_certificates() -> Certificates:
    ca = issue("automq-ref test CA", None, ca=True)
    return Certificates(ca, issue("broker", ca, hosts=True), issue("client", ca))
