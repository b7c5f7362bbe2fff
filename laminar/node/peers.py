"""Node-to-node connections: exactly one TCP connection per pair of nodes.

The node with the lower id dials, the other accepts; both then use that one connection in both
directions. Each flush of the Multi-Raft outbox becomes one frame per peer (all groups'
messages together). A peer that sends nothing for ``dead_after`` seconds, or whose connection
drops, is reported down so its Raft groups elect without it.

Who a peer is: with TLS on the peer port both sides present certificates of the cluster CA
and the certificate names the node id (``tls.node_id_of``); a hello claiming another id is
refused, and a dialer hangs up on a listener whose certificate names another node than the
one it meant to reach (so a forged gossip address leads nowhere). Without TLS the hello's id
is believed (loopback only, unless ``--insecure``). Either way a second connection claiming
the id of a peer whose connection is alive is refused rather than replacing it.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Callable
from typing import Any

import structlog

from laminar.errors import ProtocolError
from laminar.node.raft_codec import (
    GroupMessage,
    decode_peer_message,
    encode_frames,
    encode_hello,
    encode_messages,
)
from laminar.protocol import KIND_PEER, cluster_schema
from laminar.tls import node_id_of
from laminar.transport import FramedProtocol, split_address

log = structlog.get_logger(__name__)

CLOSE_AFTER_SILENT_TIMES = 10
"""A connection silent for this many ``dead_after`` is closed (the peer's host may be gone
without a FIN, and only a new connection would notice its return); silent for one
``dead_after`` the peer is only reported down."""

CHECKS_PER_DEAD_AFTER = 8
"""Liveness checks (and keep-alive frames to every peer) per ``dead_after``: a silent peer is
reported down within an eighth of it late, and a peer hears from this node 8 times before it
would think it dead. (One per 50 ms tick was 40 frames a second in and out of an idle node.)"""

STALL_FRACTION = 0.25
"""Two liveness checks further apart than this many ``dead_after`` mean this node stalled."""


class PeerNetwork:
    def __init__(
        self,
        node_id: int,
        cluster_id: str,
        peer_address: str,
        client_address: str,
        on_raft: Callable[[int, list[GroupMessage]], None],
        on_other: Callable[[int, str, Any], None],
        on_up: Callable[[int, str, str], None],
        on_down: Callable[[int], None],
        dead_after: float,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.peer_address = peer_address
        self.client_address = client_address
        self._on_raft = on_raft
        self._on_other = on_other
        self._on_up = on_up
        self._on_down = on_down
        self._dead_after = dead_after
        self.addresses: dict[int, str] = {}
        self._connections: dict[int, FramedProtocol] = {}
        self._last_heard: dict[int, float] = {}
        self._down: set[int] = set()
        self._hellos: dict[int, tuple[str, str]] = {}
        """Peer address and client address each peer said hello with."""
        self._dialers: dict[int, asyncio.Task[None]] = {}
        self._server: asyncio.Server | None = None
        self._hello = encode_hello(node_id, cluster_id, peer_address, client_address)
        self._started = False
        self._stopping = False
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self.refused = 0
        """Peer connections refused (wrong certificate id, duplicate of a live connection)."""
        self._last_check = time.monotonic()

    async def start(self) -> None:
        host, port = split_address(self.peer_address)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept, host, port, reuse_address=True, ssl=self._server_ssl
        )
        self._started = True
        for node_id in list(self.addresses):
            self._dial_if_ours(node_id)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._dialers.values():
            task.cancel()
        await asyncio.gather(*self._dialers.values(), return_exceptions=True)
        for connection in list(self._connections.values()):
            connection.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def add_peer(self, node_id: int, address: str) -> None:
        """Learn a peer's address; the lower id of the pair dials, once started. (A restart
        learns its peers while replaying the metadata log, before it has opened its
        replicas: dialed then, every peer's traffic competed with the opening.)"""
        if node_id == self.node_id or self.addresses.get(node_id) == address:
            return
        self.addresses[node_id] = address
        self._dial_if_ours(node_id)

    def _dial_if_ours(self, node_id: int) -> None:
        if self.node_id < node_id and self._started and not self._stopping:
            old = self._dialers.pop(node_id, None)
            if old is not None:
                old.cancel()
            self._dialers[node_id] = asyncio.create_task(self._dial(node_id))

    def remove_peer(self, node_id: int) -> None:
        """Forget a peer the cluster forgot (``forget_node``): stop dialing it, drop its link."""
        self.addresses.pop(node_id, None)
        dialer = self._dialers.pop(node_id, None)
        if dialer is not None:
            dialer.cancel()
        connection = self._connections.get(node_id)
        if connection is not None:
            connection.close()
        self._down.discard(node_id)
        self._last_heard.pop(node_id, None)
        self._hellos.pop(node_id, None)

    def connected(self, node_id: int) -> bool:
        connection = self._connections.get(node_id)
        return connection is not None and not connection.closed

    def unsent_bytes(self, node_id: int) -> int:
        """Bytes queued toward ``node_id`` that its connection has not handed to the kernel."""
        connection = self._connections.get(node_id)
        return 0 if connection is None or connection.closed else connection.unsent_bytes()

    def connected_peers(self) -> list[int]:
        return sorted(p for p, c in self._connections.items() if not c.closed)

    def send_raft(self, peer: int, messages: list[GroupMessage]) -> None:
        connection = self._connections.get(peer)
        if connection is None or connection.closed:
            return  # Raft retries; nothing is lost that was promised
        # Written at the end of the loop turn, with the other peers' frames of this drain:
        # writing each at once measured no better (a woken peer may take this core mid-drain).
        for message, payload in encode_frames(messages):
            connection.send_parts(KIND_PEER, message, payload)

    def send_other(self, peer: int, builder: Any) -> bool:
        connection = self._connections.get(peer)
        if connection is None or connection.closed:
            return False
        connection.send(KIND_PEER, builder.to_bytes())
        return True

    @property
    def check_every(self) -> float:
        """Seconds between two ``check_liveness`` calls."""
        return self._dead_after / CHECKS_PER_DEAD_AFTER

    def check_liveness(self) -> None:
        """Called every ``check_every``: keep connections alive, report silent peers down."""
        now = time.monotonic()
        gap = now - self._last_check
        self._last_check = now
        if gap > self._dead_after * STALL_FRACTION:
            # This node's own event loop stalled (a starved CPU): its peers' frames may sit
            # unread in the sockets. The stall is not their silence; without this every
            # long stall here reported every peer down and re-elected all their groups.
            for peer, heard in self._last_heard.items():
                self._last_heard[peer] = min(now, heard + gap)
        empty = None
        for peer, connection in list(self._connections.items()):
            if connection.closed:
                continue
            if empty is None:
                empty = encode_messages([])[0]
            connection.send(KIND_PEER, empty)
            silent = now - self._last_heard.get(peer, now)
            if silent > self._dead_after * CLOSE_AFTER_SILENT_TIMES:
                log.warning("peer silent, closing its connection", peer=peer)
                connection.close()
        for peer in self.addresses:
            if peer not in self._down:
                # (A peer never heard yet is timed from the first check: reported down at
                # once, every peer of a restarting node woke all its groups.)
                last = self._last_heard.setdefault(peer, now)
                if now - last > self._dead_after:
                    # Down for Raft (its groups elect without it) but the connection stays:
                    # a peer that is only slow (a starved CPU) loses nothing in flight.
                    self._down.add(peer)
                    self._on_down(peer)

    # connections ---------------------------------------------------------------------------
    async def _dial(self, peer: int) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.05
        while not self._stopping:
            address = self.addresses[peer]
            closed = loop.create_future()
            try:
                host, port = split_address(address)
                _, protocol = await loop.create_connection(
                    functools.partial(self._protocol, closed, peer),
                    host,
                    port,
                    ssl=self._client_ssl,
                )
                protocol.send(KIND_PEER, self._hello)
                delay = 0.05
                await closed
            except (OSError, ConnectionError) as exc:  # incl. ssl.SSLError
                if isinstance(exc, ssl.SSLError):
                    log.warning("peer TLS handshake failed", peer=peer, error=str(exc))
            except asyncio.CancelledError:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _accept(self) -> FramedProtocol:
        return self._protocol(None)

    def _protocol(self, closed: asyncio.Future[None] | None, dialed: int = 0) -> FramedProtocol:
        state: dict[str, int] = {"peer": 0, "dialed": dialed}
        protocol: FramedProtocol

        def on_frame(kind: int, message: bytes, payload: memoryview) -> None:
            if kind != KIND_PEER:
                raise ProtocolError(f"unexpected frame kind {kind} on a peer connection")
            which, body = decode_peer_message(message, payload)
            peer = state["peer"]
            if which == "hello":
                self._hello_received(protocol, state, body)
                return
            if peer == 0:
                raise ProtocolError("peer spoke before saying hello")
            self._last_heard[peer] = time.monotonic()
            if peer in self._down:  # silent for a while, heard again on the same connection
                self._down.discard(peer)
                self._on_up(peer, *self._hellos[peer])
            if which == "raft":
                if body:
                    self._on_raft(peer, body)
            else:
                self._on_other(peer, which, body)

        def on_close(_exc: Exception | None) -> None:
            peer = state["peer"]
            if peer and self._connections.get(peer) is protocol:
                del self._connections[peer]
                if not self._stopping and peer not in self._down:
                    # A process that died closes its sockets at once (a SIGKILL): its groups
                    # elect now rather than after dead_after of silence. A peer still alive
                    # dials back (or is dialed) and is reported up with its hello.
                    self._down.add(peer)
                    self._on_down(peer)
            if closed is not None and not closed.done():
                closed.set_result(None)

        protocol = FramedProtocol(on_frame, on_close)
        return protocol

    def _hello_received(self, protocol: FramedProtocol, state: dict[str, int], hello: Any) -> None:
        if hello.clusterId != self.cluster_id:
            raise ProtocolError(f"peer belongs to cluster {hello.clusterId!r}")
        peer = hello.nodeId
        if peer == 0 or peer == self.node_id:
            raise ProtocolError(f"bad peer node id {peer}")
        if state["peer"]:
            raise ProtocolError("peer said hello twice")
        if state["dialed"] and peer != state["dialed"]:
            self.refused += 1
            raise ProtocolError(f"dialed node {state['dialed']}, node {peer} answered")
        if self._server_ssl is not None or self._client_ssl is not None:
            certified = node_id_of(protocol.extra_info("peercert"))
            if certified != peer:
                self.refused += 1
                log.warning(
                    "peer refused: certificate names another node",
                    claims=peer,
                    certificate=certified,
                    address=protocol.peer,
                )
                raise ProtocolError(f"certificate names node {certified}, hello claims {peer}")
        old = self._connections.get(peer)
        if old is not None and old is not protocol and not old.closed:
            heard = self._last_heard.get(peer, 0.0)
            if time.monotonic() - heard < self._dead_after / 4:
                self.refused += 1
                log.warning(
                    "peer refused: node already connected", peer=peer, address=protocol.peer
                )
                raise ProtocolError(f"node {peer} is already connected")
            old.close()  # silent for a while: the newcomer is the node back after a cut
        state["peer"] = peer
        self._connections[peer] = protocol
        self._last_heard[peer] = time.monotonic()
        self._down.discard(peer)
        self._hellos[peer] = (hello.address, hello.clientAddress)
        if peer not in self.addresses:
            self.addresses[peer] = hello.address
        if protocol is not None and self.node_id > peer:
            protocol.send(KIND_PEER, self._hello)  # answer the dialer's hello
        self._on_up(peer, hello.address, hello.clientAddress)


def new_peer_message() -> Any:
    return cluster_schema.PeerMessage.new_message()
