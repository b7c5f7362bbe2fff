"""Throw-away certificate authorities and certificates for `laminar dev --tls` and tests.

Not a PKI: keys are written unencrypted next to the data, certificates live a year. A node's
certificate has the common name ``node-<id>`` (and the URI SAN ``urn:laminar:node:<id>``),
which is how its peers learn which node id it may speak for, plus DNS/IP SANs for the
addresses clients dial. Needs the ``cryptography`` library.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(slots=True)
class Authority:
    """A CA: its certificate and key, able to sign more certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, name: str = "laminar dev CA") -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue(
        self, common_name: str, hosts: list[str] = (), uris: list[str] = ()
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A certificate for ``common_name`` valid as TLS server and client."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        names += [x509.UniformResourceIdentifier(uri) for uri in uris]
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    @classmethod
    def load(cls, directory: Path) -> Authority:
        """The CA ``write`` left in ``directory``."""
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cls(cert, key)

    def write(self, directory: Path) -> Path:
        """Write ``ca.pem`` (and ``ca.key``) into ``directory``; returns the certificate path."""
        directory.mkdir(parents=True, exist_ok=True)
        _write_key(directory / "ca.key", self.key)
        path = directory / "ca.pem"
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path


@dataclass(slots=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path


def write_node_cert(
    authority: Authority, directory: Path, node_id: int, hosts: list[str] = ("127.0.0.1",)
) -> CertFiles:
    """``node-<id>.pem``/``.key`` naming node ``node_id``, valid for ``hosts`` (and localhost)."""
    return write_cert(
        authority,
        directory,
        f"node-{node_id}",
        hosts=[*hosts, "localhost"],
        uris=[f"urn:laminar:node:{node_id}"],
    )


def write_cert(
    authority: Authority,
    directory: Path,
    name: str,
    hosts: list[str] = (),
    uris: list[str] = (),
) -> CertFiles:
    """``<name>.pem``/``<name>.key`` signed by ``authority`` (a client certificate, say)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = authority.issue(name, list(hosts), list(uris))
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    ca_path = directory / "ca.pem"
    if not ca_path.exists():
        ca_path.write_bytes(authority.cert.public_bytes(serialization.Encoding.PEM))
    return CertFiles(cert_path, key_path, ca_path)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
