"""TLS options: validation, which ports speak TLS, the node id a certificate names, and the
refusal to serve plain ports on non-loopback addresses."""

from __future__ import annotations

import base64
import os
import ssl
from pathlib import Path

import pytest

from laminar.cli_tls import node_security
from laminar.devcerts import Authority, write_cert, write_node_cert
from laminar.node.config import NodeConfig
from laminar.tls import SecurityConfig, TlsConfig, TlsConfigError, is_loopback, node_id_of


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("certs")
    authority = Authority.create()
    node = write_node_cert(authority, root, 7)
    client = write_cert(authority, root, "alice")
    return {"cert": node.cert, "key": node.key, "ca": node.ca, "client": client.cert}


def _peercert(path: Path) -> dict:
    return ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]


def test_certificate_names_the_node(files: dict[str, Path]) -> None:
    assert node_id_of(_peercert(files["cert"])) == 7
    assert node_id_of(_peercert(files["client"])) is None
    assert node_id_of({"subject": ((("commonName", "node-12"),),)}) == 12
    assert node_id_of({"subject": ((("commonName", "node-12x"),),)}) is None
    assert node_id_of(None) is None


def test_options_are_checked(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="together"):
        TlsConfig(cert=files["cert"])
    with pytest.raises(TlsConfigError, match="unknown TLS port"):
        TlsConfig(**{k: files[k] for k in ("cert", "key", "ca")}, ports=("gossip",))
    with pytest.raises(TlsConfigError, match="readable"):
        TlsConfig(cert=tmp_path / "none.pem", key=files["key"], ca=files["ca"])
    tls = TlsConfig(cert=files["cert"], key=files["key"], ca=files["ca"], ports=("peer",))
    assert tls.server_context("client") is None and tls.own_client_context() is None
    peer = tls.server_context("peer")
    assert peer is not None and peer.verify_mode is ssl.CERT_REQUIRED  # always mutual
    with pytest.raises(ValueError, match="needs TLS on the client port"):
        node_security(files["cert"], files["key"], files["ca"], "peer", "required", [], None,
                      False, False)  # fmt: skip
    with pytest.raises(ValueError, match="needs --gossip-key"):
        node_security(None, None, None, "client,peer", "none", [], None, True, False)


def test_client_auth_required_makes_client_ports_mutual(files: dict[str, Path]) -> None:
    tls = TlsConfig(cert=files["cert"], key=files["key"], ca=files["ca"], client_auth="required")
    for port in ("client", "kafka"):
        context = tls.server_context(port)
        assert context is not None and context.verify_mode is ssl.CERT_REQUIRED
    plain_auth = TlsConfig(cert=files["cert"], key=files["key"], ca=files["ca"])
    assert plain_auth.server_context("client").verify_mode is ssl.CERT_NONE  # type: ignore[union-attr]


def test_plain_ports_only_on_loopback(files: dict[str, Path], tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("node1.example")
    NodeConfig(node_id=1, data_dir=tmp_path, listen="127.0.0.1:9092")  # today's default
    with pytest.raises(TlsConfigError, match=r"client port 0\.0\.0\.0:9092 without TLS"):
        NodeConfig(node_id=1, data_dir=tmp_path, listen="0.0.0.0:9092", peer_listen="127.0.0.1:1")
    with pytest.raises(TlsConfigError, match=r"gossip .* without --gossip-key"):
        NodeConfig(node_id=1, data_dir=tmp_path, listen="10.1.1.1:9092")
    NodeConfig(
        node_id=1,
        data_dir=tmp_path,
        listen="10.1.1.1:9092",
        security=SecurityConfig(insecure=True),
    )
    secured = SecurityConfig(
        tls=TlsConfig(cert=files["cert"], key=files["key"], ca=files["ca"]),
        gossip_keys=[os.urandom(32)],
    )
    NodeConfig(node_id=1, data_dir=tmp_path, listen="10.1.1.1:9092", security=secured)
    key = base64.b64encode(os.urandom(16)).decode()
    security = node_security(
        files["cert"], files["key"], files["ca"], "client,peer", "none", [key], None, True, False
    )
    assert security.gossip_keyring() is not None and security.gossip_keyring().encrypt  # type: ignore[union-attr]


def test_spark_source_tls_options(files: dict[str, Path]) -> None:
    from spark_source.options import OptionError, parse_options

    options = parse_options({"topic": "t", "tlsCa": str(files["ca"])})
    context = options.ssl_context()
    assert context is not None and context.check_hostname
    assert parse_options({"topic": "t"}).ssl_context() is None
    with pytest.raises(OptionError, match="go together"):
        parse_options({"topic": "t", "tlsCa": str(files["ca"]), "tlsCert": "x"})
