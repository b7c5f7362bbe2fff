"""Who may speak on the peer port: PeerNetworks on real sockets, certificates made here.

With mutual TLS a peer is who its certificate says (common name ``node-<id>``): a certificate
of another CA cannot even connect, a cluster certificate cannot claim another node's id, and a
node that is sent to a wrong address (a forged gossip update) refuses whoever answers there.
With or without TLS, a second connection claiming a connected node's id is refused instead of
cutting the real node off. (Forged Raft replies need a connection speaking for the voter: the
node steps a Raft message only if its ``frm`` is the connection's peer, ``Node._raft_received``.)
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable

import pytest

from laminar.devcerts import Authority, write_node_cert
from laminar.framing import encode_frame
from laminar.node.peers import PeerNetwork
from laminar.node.raft_codec import encode_hello
from laminar.protocol import KIND_PEER
from laminar.tls import TlsConfig
from tests.test_swim_driver import wait_for

CLUSTER = "laminar"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    """TLS configs: cluster nodes 1-3, and node 1 and 3 of another CA."""
    root = tmp_path_factory.mktemp("pki")
    ours, theirs = Authority.create("cluster CA"), Authority.create("stranger CA")
    configs = {}
    for name, authority, node_id in (
        ("1", ours, 1),
        ("2", ours, 2),
        ("3", ours, 3),
        ("other-1", theirs, 1),
        ("other-3", theirs, 3),
    ):
        files = write_node_cert(authority, root / name, node_id)
        configs[name] = TlsConfig(cert=files.cert, key=files.key, ca=files.ca)
    return configs


Start = Callable[[int, TlsConfig | None], "asyncio.Future[PeerNetwork]"]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    networks: list[PeerNetwork] = []

    async def start_network(node_id: int, tls: TlsConfig | None) -> PeerNetwork:
        address = f"127.0.0.1:{_free_port()}"
        network = PeerNetwork(
            node_id,
            CLUSTER,
            address,
            f"127.0.0.1:{_free_port()}",
            on_raft=lambda peer, messages: None,
            on_other=lambda peer, which, body: None,
            on_up=lambda peer, address, client: None,
            on_down=lambda peer: None,
            dead_after=2.0,
            server_ssl=tls.server_context("peer") if tls else None,
            client_ssl=tls.peer_client_context() if tls else None,
        )
        await network.start()
        networks.append(network)
        return network

    yield start_network  # type: ignore[misc]
    for network in networks:
        await network.stop()


async def _pair(start: Start, pki: dict[str, TlsConfig] | None) -> tuple[PeerNetwork, PeerNetwork]:
    one = await start(1, pki["1"] if pki else None)
    two = await start(2, pki["2"] if pki else None)
    one.add_peer(2, two.peer_address)
    await wait_for(lambda: one.connected(2) and two.connected(1), 5, "nodes 1 and 2 to connect")
    return one, two


def _hello(node_id: int) -> bytes:
    message = encode_hello(node_id, CLUSTER, "127.0.0.1:1", "127.0.0.1:2")
    return b"".join(bytes(part) for part in encode_frame(KIND_PEER, message))


async def _impostor(address: str, claims: int, context: ssl.SSLContext | None) -> str:
    """Connect, say hello as node ``claims``: "refused" (handshake failed, or hung up without a
    word), "answered" (a frame came back) or "open" (still connected after 2 s)."""
    host, port = address.split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    except (ssl.SSLError, OSError):
        return "refused"
    try:
        writer.write(_hello(claims))
        await writer.drain()
        data = await asyncio.wait_for(reader.read(4096), 2.0)
    except TimeoutError:
        return "open"
    except (ssl.SSLError, OSError):
        return "refused"
    finally:
        writer.close()
    return "answered" if data else "refused"


def _dialer_context(config: TlsConfig) -> ssl.SSLContext:
    context = config.peer_client_context()
    assert context is not None
    return context


async def test_mtls_peers_connect(start: Start, pki: dict[str, TlsConfig]) -> None:
    one, two = await _pair(start, pki)
    assert one.connected_peers() == [2] and two.connected_peers() == [1]


async def test_certificate_of_another_ca_cannot_connect(
    start: Start, pki: dict[str, TlsConfig]
) -> None:
    one, two = await _pair(start, pki)
    assert await _impostor(two.peer_address, 3, _dialer_context(pki["other-3"])) == "refused"
    assert await _impostor(two.peer_address, 1, _dialer_context(pki["other-1"])) == "refused"
    # and a node does not join a stranger listening where it dials
    stranger = await start(3, pki["other-3"])
    one.add_peer(3, stranger.peer_address)
    await asyncio.sleep(1.0)
    assert not one.connected(3) and not stranger.connected(1)
    assert two.connected_peers() == [1]


async def test_plain_peer_cannot_talk_to_a_tls_port(
    start: Start, pki: dict[str, TlsConfig]
) -> None:
    _, two = await _pair(start, pki)
    assert await _impostor(two.peer_address, 3, None) == "refused"
    assert two.connected_peers() == [1]


async def test_certificate_binds_the_node_id(start: Start, pki: dict[str, TlsConfig]) -> None:
    """Node 3 holds a good certificate, yet cannot speak for node 1 (whose Raft acks would
    then be believed) nor cut node 1 off."""
    one, two = await _pair(start, pki)
    assert await _impostor(two.peer_address, 1, _dialer_context(pki["3"])) == "refused"
    assert two.refused >= 1
    await asyncio.sleep(0.3)
    assert one.connected(2) and two.connected(1)
    # speaking as itself, node 3 is welcome (it holds a certificate of the cluster); node 2,
    # the lower id, says nothing back but keeps the connection
    assert await _impostor(two.peer_address, 3, _dialer_context(pki["3"])) == "open"


async def test_a_forged_address_leads_nowhere(start: Start, pki: dict[str, TlsConfig]) -> None:
    """Gossip told node 1 that node 2 is at an address where node 3 (a cluster certificate)
    listens pretending to be node 2: node 1 checks the certificate and hangs up."""
    server_context = pki["3"].server_context("peer")
    hellos: list[bytes] = []

    async def pretend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.read(4096))
        writer.write(_hello(2))
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(pretend, "127.0.0.1", 0, ssl=server_context)
    try:
        port = server.sockets[0].getsockname()[1]
        one = await start(1, pki["1"])
        one.add_peer(2, f"127.0.0.1:{port}")
        await wait_for(lambda: one.refused >= 1, 5, "node 1 to refuse the impostor")
        assert hellos and not one.connected(2)
    finally:
        server.close()


async def test_plain_second_connection_cannot_cut_a_node_off(start: Start) -> None:
    """Without TLS a hello's id is believed, but not over a live connection of that node."""
    one, two = await _pair(start, None)
    # refused: no hello back (node 2 answers node 1's hello otherwise)
    assert await _impostor(two.peer_address, 1, None) == "refused"
    assert two.refused == 1
    await asyncio.sleep(0.3)
    assert one.connected(2) and two.connected(1)


async def test_a_restarted_node_reconnects(start: Start, pki: dict[str, TlsConfig]) -> None:
    one, two = await _pair(start, pki)
    await one.stop()
    again = await start(1, pki["1"])
    again.add_peer(2, two.peer_address)
    await wait_for(lambda: again.connected(2) and two.connected(1), 5, "node 1 to reconnect")
