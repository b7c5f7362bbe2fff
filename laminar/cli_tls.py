"""TLS and gossip-key options of the `laminar` command, for nodes and for client commands.

Client commands take ``--tls-ca`` (and ``--tls-cert``/``--tls-key`` when the nodes require
client certificates) before the command name, or from ``LAMINAR_TLS_CA``/``LAMINAR_TLS_CERT``/
``LAMINAR_TLS_KEY``: ``laminar --tls-ca ca.pem topic list``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from laminar.tls import SecurityConfig, TlsConfig, client_context

if TYPE_CHECKING:
    from laminar.client.localcluster import LocalCluster


@dataclass(slots=True)
class _ClientTls:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


_client = _ClientTls()

TlsCa = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca",
        envvar="LAMINAR_TLS_CA",
        help="Connect with TLS, trusting nodes signed by this CA (PEM).",
    ),
]
TlsCert = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        envvar="LAMINAR_TLS_CERT",
        help="Client certificate (PEM), for nodes run with --tls-client-auth required.",
    ),
]
TlsKey = Annotated[
    Path | None,
    typer.Option("--tls-key", envvar="LAMINAR_TLS_KEY", help="Key of --tls-cert (PEM)."),
]


def set_client_tls(ca: Path | None, cert: Path | None, key: Path | None) -> None:
    """Remember the global client options (the app callback calls this)."""
    if (cert is None) != (key is None):
        raise typer.BadParameter("--tls-cert and --tls-key go together")
    if cert is not None and ca is None:
        raise typer.BadParameter("--tls-cert needs --tls-ca")
    _client.ca, _client.cert, _client.key = ca, cert, key


def client_ssl() -> ssl.SSLContext | None:
    """The context client commands connect with, None for plain TCP."""
    if _client.ca is None:
        return None
    return client_context(_client.ca, _client.cert, _client.key)


def node_security(
    cert: Path | None,
    key: Path | None,
    ca: Path | None,
    ports: str,
    client_auth: str,
    gossip_keys: list[str],
    gossip_key_file: Path | None,
    gossip_encrypt: bool,
    insecure: bool,
) -> SecurityConfig:
    """A node's SecurityConfig from its options; ValueError names what is wrong."""
    from laminar.membership.keyring import parse_key, read_key_file

    names = tuple(p.strip() for p in ports.split(",") if p.strip())
    tls = TlsConfig(cert=cert, key=key, ca=ca, ports=names, client_auth=client_auth)
    if client_auth == "required" and not tls.on("client"):
        raise ValueError("--tls-client-auth required needs TLS on the client port")
    keys = [parse_key(text) for text in gossip_keys]
    if gossip_key_file is not None:
        try:
            if not read_key_file(gossip_key_file):
                raise ValueError(f"gossip key file {gossip_key_file} holds no key")
        except OSError as exc:
            raise ValueError(f"cannot read gossip key file: {exc}") from None
    if gossip_encrypt and not (keys or gossip_key_file):
        raise ValueError("--gossip-encrypt needs --gossip-key or --gossip-key-file")
    return SecurityConfig(
        tls=tls,
        gossip_keys=keys,
        gossip_key_file=gossip_key_file,
        gossip_encrypt=gossip_encrypt,
        insecure=insecure,
    )


def dev_tls_note(cluster: LocalCluster) -> str:
    """What `laminar dev --tls` adds to its banner: where the CA is and how to use it."""
    if cluster.tls_dir is None:
        return ""
    ca = cluster.tls_dir / "ca.pem"
    return f"""TLS is on (throw-away CA and certificates under {cluster.tls_dir}/; gossip is
signed with the key in gossip.keys). The commands above need the CA first:
  export LAMINAR_TLS_CA={ca}
and Python clients a context:
  from laminar.tls import client_context
  Producer("{cluster.bootstrap}", ssl=client_context("{ca}"))

"""
