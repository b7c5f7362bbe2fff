"""A mutual-TLS cluster of three node processes (throw-away CA made by LocalCluster), with
client certificates required: clients with the right certificate produce and consume; a client
without a certificate, without the CA or with another CA is refused with an error that says
why; a node holding a certificate of another CA cannot join; a plain non-loopback listener is
refused at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.devcerts import Authority, write_node_cert
from laminar.errors import AuthenticationError
from laminar.tls import client_context
from tests.cluster_fixture import run_sync

pytestmark = pytest.mark.slow
TOPIC = "secure"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("tls")) / "cluster"
    local = LocalCluster(root, free_port_pairs(3), tls=True, tls_client_auth=True)
    local.start()
    try:
        run_sync(local.wait_ready(60))
        yield local
    finally:
        local.stop()


async def test_mtls_cluster_produces_and_consumes(cluster: LocalCluster) -> None:
    async with Admin(cluster.bootstrap, ssl=cluster.client_ssl) as admin:
        await admin.create_topic(TOPIC, partitions=2, replication_factor=3)
    async with Producer(cluster.bootstrap, ssl=cluster.client_ssl, linger_ms=1) as producer:
        for i in range(200):
            await producer.send(TOPIC, f"record {i}".encode(), partition=i % 2)
        await producer.flush()
    received = []
    async with Consumer(cluster.bootstrap, ssl=cluster.client_ssl) as consumer:
        await consumer.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        await consumer.seek_to_beginning()
        for _ in range(30):
            if len(received) >= 200:
                break
            received += await consumer.getmany(timeout_ms=2000)
    assert sorted(r.value for r in received) == sorted(f"record {i}".encode() for i in range(200))


async def _refusal(bootstrap: str, context: object) -> str:
    with pytest.raises(ConnectionError) as caught:
        async with Admin(bootstrap, ssl=context, request_timeout_ms=3000) as admin:  # type: ignore[arg-type]
            await admin.list_topics()
    return str(caught.value)


async def test_clients_without_the_right_credentials_are_refused_clearly(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.tls_dir is not None
    address = cluster.nodes[1].client_address
    ca = cluster.tls_dir / "ca.pem"
    no_cert = await _refusal(address, client_context(ca))
    assert "client certificate" in no_cert
    plain = await _refusal(address, None)
    assert "TLS" in plain
    stranger = Authority.create("another CA")
    other = write_node_cert(stranger, tmp_path / "other", 9)
    wrong_ca = await _refusal(address, client_context(other.ca, other.cert, other.key))
    assert "certificate was not accepted" in wrong_ca and "--tls-ca" in wrong_ca
    # right CA, client certificate of another CA: the node refuses it
    foreign_cert = await _refusal(address, client_context(ca, other.cert, other.key))
    assert "client certificate" in foreign_cert


async def test_node_with_a_certificate_of_another_ca_cannot_join(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """It even holds the gossip key, so only the peer port's mutual TLS keeps it out."""
    assert cluster.tls_dir is not None
    files = write_node_cert(Authority.create("rogue CA"), tmp_path / "rogue", 4)
    client_port, peer_port = free_port_pairs(1)[0]
    log_path = tmp_path / "rogue.log"
    command = [
        sys.executable, "-m", "laminar", "node", "start", "--node-id", "4",
        "--data-dir", str(tmp_path / "rogue-data"),
        "--listen", f"127.0.0.1:{client_port}", "--peer-listen", f"127.0.0.1:{peer_port}",
        "--join", cluster.nodes[1].peer_address,
        "--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca),
        "--gossip-key-file", str(cluster.tls_dir / "gossip.keys"),
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        await asyncio.sleep(6)
        async with Admin(cluster.bootstrap, ssl=cluster.client_ssl) as admin:
            status = await admin.cluster_status()
        rogue = [m for m in status.members if m.node_id == 4]
        assert not rogue or "registering" in rogue[0].state, rogue  # never a member
        assert all(m.replicas == 0 for m in rogue)
        logs = "".join(cluster.log_tail(n, 400) for n in cluster.nodes)
        assert "peer TLS handshake failed" in logs
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def test_plain_listener_on_a_public_address_is_refused(tmp_path: Path) -> None:
    client_port, peer_port = free_port_pairs(1)[0]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "laminar",
            "node",
            "start",
            "--node-id",
            "1",
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            f"0.0.0.0:{client_port}",
            "--peer-listen",
            f"127.0.0.1:{peer_port}",
            "--peers",
            f"1=127.0.0.1:{peer_port}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "refusing to listen on a non-loopback address" in result.stderr
    assert "--insecure" in result.stderr


def test_cli_connects_with_tls_options(cluster: LocalCluster) -> None:
    assert cluster.tls_dir is not None
    tls = cluster.tls_dir
    base = [sys.executable, "-m", "laminar"]
    env = {**os.environ, "LAMINAR_BOOTSTRAP": cluster.bootstrap}
    env.pop("LAMINAR_TLS_CA", None)
    options = ["--tls-ca", str(tls / "ca.pem")]
    options += ["--tls-cert", str(tls / "client.pem"), "--tls-key", str(tls / "client.key")]
    ok = subprocess.run(
        [*base, *options, "topic", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [*base, "--tls-ca", str(tls / "ca.pem"), "topic", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "client certificate" in refused.stderr


async def test_users_on_a_tls_cluster(cluster: LocalCluster) -> None:
    """SCRAM over TLS (SASL_SSL's native twin): a client certificate alone is not enough once
    the cluster has users. Last in this module: from here on the cluster requires them."""
    async with Admin(cluster.bootstrap, ssl=cluster.client_ssl) as admin:
        await admin.create_user("tls-root", "tls-secret", superuser=True)
    cluster.login = ("tls-root", "tls-secret")
    with pytest.raises(AuthenticationError, match="authentication required"):
        async with Admin(cluster.bootstrap, ssl=cluster.client_ssl) as admin:
            await admin.list_topics()
    async with Admin(
        cluster.bootstrap, ssl=cluster.client_ssl, username="tls-root", password="tls-secret"
    ) as admin:
        assert TOPIC in await admin.list_topics()
