"""TLS for every TCP listener and dialer, built in one place from the node's options.

A node holds one certificate and key (``--tls-cert``/``--tls-key``) signed by the cluster's CA
(``--tls-ca``). ``--tls-ports`` says which listeners speak TLS (``client``, ``peer``, and later
``kafka``). The peer port is always mutual TLS: a node accepts only peers presenting a
certificate of the cluster CA, dials peers verifying theirs, and the certificate names the node
id (common name ``node-<id>``, or a URI SAN ``urn:laminar:node:<id>``), so a peer cannot claim
another node's id. Client listeners verify client certificates only with
``--tls-client-auth required``.

Any listener gets its server context with one call: ``security.tls.server_context("kafka")``
(``None`` when that port is plain).
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laminar.membership.keyring import Keyring

PORTS = ("client", "peer", "kafka")
CLIENT_AUTH = ("none", "required")
_NODE_CN = re.compile(r"node-(\d+)")
_NODE_URI = re.compile(r"urn:laminar:node:(\d+)")


class TlsConfigError(ValueError):
    """Options that cannot work together (a missing file, an unknown port name)."""


@dataclass(slots=True)
class TlsConfig:
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    ports: tuple[str, ...] = ("client", "peer", "kafka")
    """Listeners that speak TLS once a certificate is configured."""
    client_auth: str = "none"
    """``required``: client (and Kafka) listeners accept only certificates of the CA."""

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, Path(value))
        unknown = set(self.ports) - set(PORTS)
        if unknown:
            raise TlsConfigError(f"unknown TLS port {sorted(unknown)}; choose from {PORTS}")
        if self.client_auth not in CLIENT_AUTH:
            raise TlsConfigError(f"--tls-client-auth must be one of {CLIENT_AUTH}")
        given = [n for n in ("cert", "key", "ca") if getattr(self, n) is not None]
        if given and len(given) != 3:
            raise TlsConfigError("TLS needs --tls-cert, --tls-key and --tls-ca together")
        for name in given:
            path = getattr(self, name)
            if not path.is_file():
                raise TlsConfigError(f"--tls-{name} {path} is not a readable file")

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def on(self, port: str) -> bool:
        """Whether the listener ``port`` speaks TLS."""
        return self.enabled and port in self.ports

    def server_context(self, port: str) -> ssl.SSLContext | None:
        """The context a listener of kind ``port`` serves with, or None for plain TCP."""
        if not self.on(port):
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        context.load_verify_locations(cafile=str(self.ca))
        mutual = port == "peer" or self.client_auth == "required"
        context.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE
        return context

    def peer_client_context(self) -> ssl.SSLContext | None:
        """The context a node dials its peers with: presents its own certificate and checks
        the peer's against the CA. Host names are not checked: the dialer checks instead that
        the certificate names the node id it meant to reach (``node_id_of``)."""
        if not self.on("peer"):
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def own_client_context(self) -> ssl.SSLContext | None:
        """The context a node uses as a client of its own client port (dead-letter copies):
        the CA, its own certificate as client certificate, no host name check (it may listen
        on a wildcard address)."""
        if not self.on("client"):
            return None
        context = client_context(self.ca, self.cert, self.key)
        context.check_hostname = False
        return context


@dataclass(slots=True)
class SecurityConfig:
    """Everything a node needs to refuse strangers: TLS, the gossip keyring, and whether it may
    listen unprotected on a non-loopback address."""

    tls: TlsConfig = field(default_factory=TlsConfig)
    gossip_keys: list[bytes] = field(default_factory=list)
    """Gossip keys, the first one used to send (``--gossip-key``)."""
    gossip_key_file: Path | None = None
    """A keyring file, one base64 key per line, re-read when it changes (``--gossip-key-file``)."""
    gossip_encrypt: bool = False
    insecure: bool = False

    @property
    def gossip_authenticated(self) -> bool:
        return bool(self.gossip_keys) or self.gossip_key_file is not None

    def gossip_keyring(self) -> Keyring | None:
        """The keyring sealing this node's gossip, or None when gossip is plain."""
        if not self.gossip_authenticated:
            return None
        from laminar.membership.keyring import Keyring

        return Keyring(self.gossip_keys, encrypt=self.gossip_encrypt, path=self.gossip_key_file)

    def check_exposure(self, listen: str, peer_listen: str, kafka_listen: str = "") -> None:
        """Refuse to serve plain ports on a non-loopback address unless ``--insecure``."""
        if self.insecure:
            return
        from laminar.transport import split_address

        problems = []
        if not is_loopback(split_address(listen)[0]) and not self.tls.on("client"):
            problems.append(f"client port {listen} without TLS")
        kafka_exposed = kafka_listen and not is_loopback(split_address(kafka_listen)[0])
        if kafka_exposed and not self.tls.on("kafka"):
            problems.append(f"Kafka port {kafka_listen} without TLS")
        if not is_loopback(split_address(peer_listen)[0]):
            if not self.tls.on("peer"):
                problems.append(f"peer port {peer_listen} without TLS")
            if not self.gossip_authenticated:
                problems.append(f"gossip on {peer_listen} without --gossip-key")
        if problems:
            raise TlsConfigError(
                "refusing to listen on a non-loopback address unprotected ("
                + "; ".join(problems)
                + "): configure --tls-cert/--tls-key/--tls-ca and --gossip-key, or pass "
                "--insecure"
            )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or wildcard: assume reachable from outside


def client_context(
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
) -> ssl.SSLContext:
    """A client's context: verify nodes against ``ca`` (the system store when None) and their
    host name; present ``cert``/``key`` when the node requires client certificates."""
    context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key is not None else None)
    return context


def node_id_of(peercert: dict[str, Any] | None) -> int | None:
    """The node id a verified peer certificate names, or None."""
    if not peercert:
        return None
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "URI" and (match := _NODE_URI.fullmatch(value)):
            return int(match.group(1))
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName" and (match := _NODE_CN.fullmatch(value)):
                return int(match.group(1))
    return None


def describe_tls_error(exc: BaseException) -> str | None:
    """A sentence an operator can act on for a failed TLS handshake, else None."""
    if not isinstance(exc, ssl.SSLError):
        return None
    reason = (getattr(exc, "reason", None) or str(exc)).upper()
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in reason:
        detail = getattr(exc, "verify_message", "") or reason.lower()
        return f"the node's certificate was not accepted ({detail}): check the CA (--tls-ca)"
    if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
        return "the node requires a client certificate signed by its CA (--tls-cert/--tls-key)"
    if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
        return "the node did not accept our client certificate (not signed by its CA)"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason:
        return "the node does not speak TLS on this port (drop ssl / --tls-ca)"
    return None
