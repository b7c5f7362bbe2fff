"""A fault-injecting proxy on the node-to-node links: Raft over TCP and SWIM gossip over UDP.

Every node advertises a proxy address (``--advertise-peer``) instead of its real peer port, so
all peer traffic passes through here, and the harness can cut any direction between two nodes:
symmetric and one-way partitions without root, iptables or namespaces, and portable to any CI.

* TCP: the lower node id dials; the proxy reads the dialer's hello frame to learn who it is,
  then pipes both directions. A direction cut while a connection is open drops its bytes from
  then on (a black hole, as on a real network: the receiver notices the silence); since dropped
  bytes break the framing, such a connection is closed when the cut heals and the nodes redial.
* UDP: node i sends from its real peer port, so the source port names the sender. A datagram
  for node j leaves through node i's proxy socket, so j sees it come from i's advertised address.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

from laminar.framing import HEADER_SIZE, parse_header
from laminar.node.raft_codec import decode_peer_message

Direction = tuple[int, int]  # (from node, to node)


@dataclass(eq=False)
class _Link:
    """One proxied TCP connection between a dialer and the node it dials."""

    dialer: int
    target: int
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    cut: bool = False  # bytes were dropped in some direction: never resume this connection

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class _Gossip(asyncio.DatagramProtocol):
    def __init__(self, proxy: FaultProxy, node_id: int) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.proxy._datagram(self.node_id, data, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # a node that is down: the datagram is lost, as it would be


class FaultProxy:
    """Proxies for ``real`` (node id -> real peer (host, port)); see the module docstring."""

    def __init__(self, real: dict[int, tuple[str, int]], host: str = "127.0.0.1") -> None:
        self.real = dict(real)
        self.host = host
        self.blocked: set[Direction] = set()
        self.advertised: dict[int, str] = {}
        self._by_real_port = {port: node for node, (_, port) in self.real.items()}
        self._servers: list[asyncio.Server] = []
        self._gossip: dict[int, _Gossip] = {}
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped_datagrams = 0
        self.forwarded_datagrams = 0
        self.links_opened = 0

    async def start(self) -> dict[int, str]:
        """Bind one TCP+UDP port pair per node; returns node id -> advertised address."""
        loop = asyncio.get_running_loop()
        for node_id in self.real:
            while True:
                tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tcp.bind((self.host, 0))
                port = tcp.getsockname()[1]
                udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    udp.bind((self.host, port))
                except OSError:
                    tcp.close()
                    udp.close()
                    continue
                break
            server = await asyncio.start_server(
                lambda r, w, target=node_id: self._accept(target, r, w), sock=tcp
            )
            self._servers.append(server)
            _, protocol = await loop.create_datagram_endpoint(
                lambda target=node_id: _Gossip(self, target), sock=udp
            )
            self._gossip[node_id] = protocol
            self.advertised[node_id] = f"{self.host}:{port}"
        return dict(self.advertised)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for link in list(self._links):
            link.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for protocol in self._gossip.values():
            if protocol.transport is not None:
                protocol.transport.close()

    # faults ----------------------------------------------------------------------------------
    def cut(self, directions: set[Direction]) -> None:
        """Drop traffic in these directions (added to what is already cut)."""
        self.blocked |= directions
        for link in self._links:
            if (link.dialer, link.target) in directions or (link.target, link.dialer) in directions:
                link.cut = True

    def heal(self) -> None:
        """Let everything through again; connections that lost bytes are closed."""
        self.blocked.clear()
        for link in list(self._links):
            if link.cut:
                link.close()

    # TCP ---------------------------------------------------------------------------------------
    async def _accept(
        self, target: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        link: _Link | None = None
        try:
            header = await reader.readexactly(HEADER_SIZE)
            parsed = parse_header(header)
            body = await reader.readexactly(parsed.message_len + parsed.payload_len)
            which, hello = decode_peer_message(
                body[: parsed.message_len], memoryview(body)[parsed.message_len :]
            )
            if which != "hello":
                return
            link = _Link(dialer=hello.nodeId, target=target, writers=[writer])
            self._links.add(link)
            self.links_opened += 1
            if (link.dialer, target) in self.blocked:
                link.cut = True
                await self._drain_forever(reader)  # a black hole until a side gives up
                return
            host, port = self.real[target]
            up_reader, up_writer = await asyncio.open_connection(host, port)
            link.writers.append(up_writer)
            up_writer.write(header + body)
            await asyncio.gather(
                self._pipe(link, reader, up_writer, (link.dialer, target)),
                self._pipe(link, up_reader, writer, (target, link.dialer)),
            )
        except Exception:  # any failure ends this link, as a reset would
            pass
        finally:
            if link is not None:
                link.close()
                self._links.discard(link)
            writer.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: Direction,
    ) -> None:
        try:
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    break
                if direction in self.blocked:
                    link.cut = True
                    continue
                if link.cut and not self.blocked:
                    break  # healed, but bytes were lost on this connection: start over
                writer.write(data)
                await writer.drain()
        finally:
            link.close()

    @staticmethod
    async def _drain_forever(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while await reader.read(256 * 1024):
                pass

    # UDP ---------------------------------------------------------------------------------------
    def _datagram(self, target: int, data: bytes, addr: tuple[str, int]) -> None:
        sender = self._by_real_port.get(addr[1])
        if sender is None or sender == target or (sender, target) in self.blocked:
            self.dropped_datagrams += 1
            return
        out = self._gossip[sender].transport
        if out is not None:
            out.sendto(data, self.real[target])
            self.forwarded_datagrams += 1
