"""Drive hostile inputs into a node: in-process (millions) and over real sockets (a sample).

In-process, a real ``Node`` runs on the current event loop with its real listeners; inputs
enter through the very protocol objects its listeners create (``ClientServer._protocol``,
``PeerNetwork._protocol``, ``SwimDriver._on_datagram``), over an in-memory transport, so every
byte takes the node's own parsing, decoding, Raft and request-handling path without a
syscall per input. Anything that escapes those entry points, any task dying with an unhandled
exception, and any error the node logs count as findings.

Over sockets, the same generators feed real node processes (``LocalCluster``) on their client
TCP, peer TCP and gossip UDP ports, while their RSS is watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from laminar.client.connection import Connection
from laminar.client.consumer import fetch_partition
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.client.types import TopicPartition
from laminar.errors import ProtocolError
from laminar.framing import HEADER_SIZE, parse_header
from laminar.node.config import NodeConfig
from laminar.node.metadata import group_id
from laminar.node.node import Node
from laminar.protocol import CLIENT_CRC_COVERS_PAYLOAD, KIND_RESPONSE, client_schema, decode
from laminar.transport import FramedProtocol, split_address
from tests.fuzz_cases import (
    ClientTarget,
    GossipTarget,
    PeerTarget,
    client_request,
    gossip_message,
    hello,
    mutate_datagram,
    mutate_frame,
    peer_frame,
    seal,
    valid_peer_frame,
)

KINDS = ("client", "peer", "gossip")
TOPIC = "fuzzed-data"
PARTITIONS = 2


# -- findings ----------------------------------------------------------------------------------


@dataclass
class Findings:
    """What went wrong, by kind; a clean run has all of these empty."""

    escaped: Counter[str] = field(default_factory=Counter)  # exceptions out of an entry point
    loop_errors: list[str] = field(default_factory=list)  # unhandled errors in callbacks/tasks
    logged_errors: Counter[str] = field(default_factory=Counter)  # node log events >= error
    examples: list[str] = field(default_factory=list)
    inputs: list[tuple[str, bytes]] = field(default_factory=list)  # the first few, whole
    benign: Counter[str] = field(default_factory=Counter)  # noise, not failures (see below)

    def record(self, kind: str, error: BaseException, data: bytes) -> None:
        self.escaped[f"{kind}: {type(error).__name__}: {str(error)[:80]}"] += 1
        if len(self.inputs) < 20:
            self.inputs.append((kind, data))
        if len(self.examples) < 20:
            self.examples.append(
                f"{kind} {type(error).__name__}: {error!r} input={data[:200].hex()}"
            )

    @property
    def total(self) -> int:
        return sum(self.escaped.values()) + len(self.loop_errors) + sum(self.logged_errors.values())


def capture_logs(findings: Findings) -> None:
    """Silence structlog, counting events at level error and above as findings."""

    def count(_logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if method in ("error", "exception", "critical"):
            error = sys.exc_info()[1]
            cause = f" ({type(error).__name__}: {str(error)[:60]})" if error is not None else ""
            findings.logged_errors[f"{event.get('event')}{cause}"[:160]] += 1
            if len(findings.examples) < 20:
                findings.examples.append(f"log {method}: {event}")
        raise structlog.DropEvent

    structlog.configure(
        processors=[count],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        cache_logger_on_first_use=False,
    )


# -- an in-memory transport --------------------------------------------------------------------


class MemoryTransport(asyncio.Transport):
    """Counts what the node writes (keeps it if asked); closing it tells the protocol the
    connection is lost."""

    def __init__(self, protocol: asyncio.BaseProtocol, keep: bool = False) -> None:
        super().__init__()
        self._protocol = protocol
        self.closed = False
        self.written = 0
        self._kept: bytearray | None = bytearray() if keep else None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self._kept is not None:
            self._kept += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def frames(self, kind: int) -> list[tuple[bytes, memoryview]]:
        """The kept frames of ``kind`` written so far, as (message, payload)."""
        assert self._kept is not None, "MemoryTransport(keep=True) keeps what is written"
        out = []
        data = bytes(self._kept)
        while len(data) >= HEADER_SIZE:
            header = parse_header(data)
            size = HEADER_SIZE + header.body_len
            if header.kind == kind:
                body = memoryview(data)[HEADER_SIZE:size]
                out.append((bytes(body[: header.message_len]), body[header.message_len :]))
            data = data[size:]
        return out

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)


def feed(
    protocol: FramedProtocol, transport: MemoryTransport, data: bytes, rng: random.Random
) -> None:
    """Deliver ``data`` as a socket would: in chunks of arbitrary size, until closed."""
    position = 0
    while position < len(data) and not transport.closed:
        buffer = protocol.get_buffer(-1)
        size = min(len(buffer), len(data) - position)
        if rng.random() < 0.3:
            size = min(size, rng.randrange(1, 64))
        buffer[:size] = data[position : position + size]
        position += size
        protocol.buffer_updated(size)


# -- the in-process node -----------------------------------------------------------------------


class InProcessNode:
    """A one-node cluster on this event loop, with a topic of known contents."""

    def __init__(self, root: Path, records: int = 200) -> None:
        self.records = records
        ((client, peer),) = free_port_pairs(1)
        self.config = NodeConfig(
            node_id=1,
            data_dir=root / "node-1",
            listen=f"127.0.0.1:{client}",
            peer_listen=f"127.0.0.1:{peer}",
            peers={1: f"127.0.0.1:{peer}"},
            metadata_replicas=1,
        )
        self.node = Node(self.config)
        self.before: dict[int, bytes] = {}

    async def start(self) -> None:
        await self.node.start()
        from laminar.client import Admin, Producer

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                async with Admin(self.config.listen, request_timeout_ms=2000) as admin:
                    await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
                break
            except Exception:  # not ready yet: no metadata leader
                await asyncio.sleep(0.1)
        async with Producer(self.config.listen) as producer:
            for i in range(self.records):
                await producer.send_and_wait(TOPIC, b"before-%d" % i, partition=i % PARTITIONS)
        self.before = await read_partitions(self.config.listen)

    async def stop(self) -> None:
        await self.node.stop()

    def client_target(self) -> ClientTarget:
        return ClientTarget((TOPIC, "fuzz-a"), PARTITIONS, frozenset({TOPIC}))

    def peer_target(self) -> PeerTarget:
        topic = self.node.state.topics[TOPIC]
        partitions = tuple(group_id(topic.topic_id, p) for p in range(PARTITIONS))
        return PeerTarget(self.node.node_id, self.config.cluster_id, partitions, partitions)

    def gossip_target(self) -> GossipTarget:
        return GossipTarget(self.node.node_id, self.config.peer_listen)

    def healthy(self) -> list[str]:
        """Problems with the node's own machinery (dead background tasks), if any."""
        problems = []
        for task in [*self.node.runtime._tasks, *self.node._tasks, self.node.swim._ticker]:
            if task is None or task.done():
                problems.append(f"background task {task} is not running")
        return problems


async def read_partitions(address: str, end: int | None = None) -> dict[int, bytes]:
    """The raw record-batch bytes of every partition of TOPIC, from one node."""
    out: dict[int, bytes] = {}
    connection = await Connection.open(address)
    try:
        for partition in range(PARTITIONS):
            chunks: list[bytes] = []
            offset = 0
            while True:
                got = await fetch_partition(
                    connection, TopicPartition(TOPIC, partition), offset, 1 << 20, 0, 10.0
                )
                if got is None:
                    break
                data, high, _ = got
                if not data:
                    break
                chunks.append(bytes(data))
                offset = _end_of(bytes(data))
                if offset >= high:
                    break
            out[partition] = b"".join(chunks)
    finally:
        connection.close()
    return out


def _end_of(data: bytes) -> int:
    from laminar.segment.batch import iter_batches

    last = -1
    for _, header in iter_batches(data):
        last = header.base_offset + header.last_offset_delta
    return last + 1


def prefix_intact(before: dict[int, bytes], after: dict[int, bytes]) -> list[str]:
    """Partitions whose bytes written before the run are not byte-identical afterwards."""
    return [
        f"partition {p}: {len(before[p])} bytes before, first {len(before[p])} differ after"
        for p in before
        if after.get(p, b"")[: len(before[p])] != before[p]
    ]


async def produce_and_read_back(address: str) -> list[str]:
    """A well-behaved client still produces and reads its record back (after elections the
    run may have caused: retries for up to ~30 s)."""
    from laminar.client import Consumer, Producer
    from laminar.errors import LaminarError

    value = b"after-%d" % random.getrandbits(32)
    try:
        async with Producer(address, retries=100, retry_backoff_ms=300) as producer:
            meta = await producer.send_and_wait(TOPIC, value, partition=0)
        async with Consumer(address) as consumer:
            await consumer.assign([TopicPartition(TOPIC, 0)])
            await consumer.seek(TopicPartition(TOPIC, 0), meta.offset)
            records = await consumer.getmany(timeout_ms=5000)
    except (LaminarError, ConnectionError) as exc:
        return [f"a well-behaved client failed after the run: {exc!r}"]
    if [r.value for r in records[:1]] != [value]:
        return [f"record produced at offset {meta.offset} read back as {records[:1]}"]
    return []


# -- in-process fuzzing ------------------------------------------------------------------------


@dataclass
class KindResult:
    inputs: int = 0
    connections: int = 0
    closed_by_node: int = 0
    seconds: float = 0.0
    valid_inputs: int = 0
    valid_seconds: float = 0.0


async def settle(node: Node, limit: int = 500) -> None:
    """Let request tasks run so they never pile up beyond ``limit``."""
    await asyncio.sleep(0)
    while len(node.client_server._tasks) > limit or len(node.calls._tasks) > limit:
        await asyncio.sleep(0.001)


async def fuzz_stream(
    kind: str,
    make_protocol: Callable[[], FramedProtocol],
    frames: Callable[[random.Random], list[bytes]],
    count: int,
    rng: random.Random,
    findings: Findings,
    node: Node,
) -> KindResult:
    """``count`` inputs over in-memory connections, several inputs per connection."""
    result = KindResult()
    started = time.perf_counter()
    while result.inputs < count:
        protocol = make_protocol()
        transport = MemoryTransport(protocol)
        protocol.connection_made(transport)
        result.connections += 1
        batch = frames(rng)
        result.inputs += len(batch)
        for data in batch:
            try:
                feed(protocol, transport, data, rng)
            except Exception as exc:  # what a real event loop would turn into a fatal error
                findings.record(kind, exc, data)
                transport.close()
            if transport.closed:
                result.closed_by_node += 1
                break
        transport.close()
        if result.connections % 8 == 0:
            await settle(node)
    await settle(node)  # (long polls and commit waits may outlive the run)
    result.seconds = time.perf_counter() - started
    return result


async def fuzz_in_process(
    target: InProcessNode, kind: str, count: int, seed: int, findings: Findings
) -> KindResult:
    rng = random.Random(f"{seed}-{kind}")
    node = target.node
    if kind == "gossip":
        return await _fuzz_gossip(target, count, rng, findings)
    if kind == "client":
        client = target.client_target()

        def client_frames(rng: random.Random) -> list[bytes]:
            return [
                mutate_frame(rng, client_request(rng, client), CLIENT_CRC_COVERS_PAYLOAD)
                for _ in range(rng.randrange(1, 12))
            ]

        result = await fuzz_stream(
            kind, node.client_server._protocol, client_frames, count, rng, findings, node
        )
        result.valid_inputs, result.valid_seconds = await _valid_baseline(
            node.client_server._protocol,
            lambda r: seal(client_request(r, client), CLIENT_CRC_COVERS_PAYLOAD),
            rng,
            node,
            max(200, count // 50),
            findings,
        )
        return result
    peer = target.peer_target()
    greeting = seal(hello(peer), True)

    def peer_frames(rng: random.Random) -> list[bytes]:
        frames = [
            mutate_frame(rng, peer_frame(rng, peer), True) for _ in range(rng.randrange(1, 12))
        ]
        return [greeting, *frames] if rng.random() < 0.9 else frames

    def accept() -> FramedProtocol:
        return node.peers._protocol(None)

    result = await fuzz_stream(kind, accept, peer_frames, count, rng, findings, node)
    result.valid_inputs, result.valid_seconds = await _valid_baseline(
        accept,
        lambda r: seal(valid_peer_frame(r, peer), True),
        rng,
        node,
        max(200, count // 50),
        findings,
        prefix=greeting,
    )
    return result


async def _valid_baseline(
    make_protocol: Callable[[], FramedProtocol],
    valid: Callable[[random.Random], bytes],
    rng: random.Random,
    node: Node,
    count: int,
    findings: Findings,
    prefix: bytes = b"",
) -> tuple[int, float]:
    """Time ``count`` unmutated frames through the same path, on one connection; the node
    closing it is a finding."""
    frames = [valid(rng) for _ in range(count)]
    protocol = make_protocol()
    transport = MemoryTransport(protocol)
    protocol.connection_made(transport)
    chunking = random.Random(0)
    started = time.perf_counter()
    if prefix:
        feed(protocol, transport, prefix, chunking)
    for frame in frames:
        feed(protocol, transport, frame, chunking)
        if transport.closed:
            findings.record("valid", ConnectionError("the node closed a valid stream"), frame)
            break
    await settle(node)
    seconds = time.perf_counter() - started
    transport.close()
    return count, seconds


async def _fuzz_gossip(
    target: InProcessNode, count: int, rng: random.Random, findings: Findings
) -> KindResult:
    node = target.node
    gossip = target.gossip_target()
    result = KindResult()
    started = time.perf_counter()
    for i in range(count):
        data = mutate_datagram(rng, gossip_message(rng, gossip))
        try:
            node.swim._on_datagram(data, ("127.0.0.1", 9))
        except Exception as exc:
            findings.record("gossip", exc, data)
        if i % 256 == 0:
            await asyncio.sleep(0)
    result.inputs = count
    result.seconds = time.perf_counter() - started
    valid = [gossip_message(rng, gossip) for _ in range(max(200, count // 50))]
    started = time.perf_counter()
    for data in valid:
        node.swim._on_datagram(data, ("127.0.0.1", 9))
    result.valid_inputs, result.valid_seconds = len(valid), time.perf_counter() - started
    return result


def install_loop_handler(findings: Findings) -> None:
    loop = asyncio.get_running_loop()

    def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exception = context.get("exception")
        message = str(context.get("message"))
        if message.startswith("Future exception was never retrieved") and isinstance(
            exception, socket.gaierror
        ):
            # A dial of a gossiped host name, cancelled while uvloop's lookup was under way
            # (the address changed): the lookup's failure is then nobody's. Log noise only.
            findings.benign[f"unretrieved lookup failure: {exception}"] += 1
            return
        where = ""
        if exception is not None and exception.__traceback__ is not None:
            frames = traceback.extract_tb(exception.__traceback__)[-3:]
            where = " at " + " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)
        findings.loop_errors.append(f"{message}: {exception!r}{where}"[:400])

    loop.set_exception_handler(handler)


# -- over real sockets -------------------------------------------------------------------------


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and RssAnon (heap, not mapped log files) of a process, KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            out[key] = int(value.split()[0])
    return out


@dataclass
class SocketResult:
    inputs: int = 0
    connections: int = 0
    closed_by_node: int = 0
    typed_errors: Counter[int] = field(default_factory=Counter)
    replies: int = 0


async def _read_replies(reader: asyncio.StreamReader, result: SocketResult, wait: float) -> None:
    """Read response frames until the node closes or ``wait`` passes; count typed errors."""
    buffer = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(1 << 16), wait)
            if not chunk:
                result.closed_by_node += 1
                return
            buffer += chunk
            while len(buffer) >= HEADER_SIZE:
                header = parse_header(buffer[:HEADER_SIZE])
                size = HEADER_SIZE + header.body_len
                if len(buffer) < size:
                    break
                if header.kind == KIND_RESPONSE:
                    response = decode(
                        client_schema.Response,
                        buffer[HEADER_SIZE : HEADER_SIZE + header.message_len],
                    )
                    result.replies += 1
                    result.typed_errors[response.error.code] += 1
                buffer = buffer[size:]
    except (TimeoutError, ConnectionError, ProtocolError):
        return


async def send_stream(address: str, chunks: list[bytes], result: SocketResult, wait: float) -> None:
    host, port = split_address(address)
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return
    result.connections += 1
    try:
        for chunk in chunks:
            writer.write(chunk)
        await writer.drain()
        await _read_replies(reader, result, wait)
    except (ConnectionError, OSError):
        result.closed_by_node += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def send_datagrams(address: str, datagrams: list[bytes]) -> None:
    host, port = split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for data in datagrams:
            with contextlib.suppress(OSError):
                sock.sendto(data, (host, port))


async def hold_huge_frames(
    address: str, connections: int, header: bytes
) -> list[asyncio.StreamWriter]:
    """Open ``connections`` connections that each announce a huge frame and send no more."""
    host, port = split_address(address)
    writers = []
    for _ in range(connections):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(header)
        await writer.drain()
        writers.append(writer)
    return writers


# -- a real cluster over real sockets ----------------------------------------------------------


@dataclass
class ClusterRun:
    """The outcome of fuzzing real node processes."""

    inputs: Counter[str] = field(default_factory=Counter)
    results: dict[str, SocketResult] = field(default_factory=dict)
    rss_before: dict[int, dict[str, int]] = field(default_factory=dict)
    rss_after: dict[int, dict[str, int]] = field(default_factory=dict)
    hold_growth_kib: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max_rss_growth_kib(self) -> int:
        return max(
            (self.rss_after[n]["VmHWM"] - self.rss_before[n]["VmRSS"] for n in self.rss_after),
            default=0,
        )


Snapshot = dict[int, dict[int, bytes]]  # node id -> partition -> committed batch bytes


async def prepare_cluster(cluster: LocalCluster) -> tuple[Snapshot, tuple[int, ...]]:
    """Create TOPIC (replicated on every node) and write records; return each node's bytes
    and the Raft group ids of TOPIC's partitions."""
    from laminar.client import Admin, Producer

    await cluster.wait_ready(60)
    async with Admin(cluster.bootstrap) as admin:
        topic = await admin.create_topic(TOPIC, PARTITIONS, len(cluster.nodes))
    async with Producer(cluster.bootstrap) as producer:
        for i in range(200):
            await producer.send_and_wait(TOPIC, b"before-%d" % i, partition=i % PARTITIONS)
    groups = tuple(group_id(topic.topic_id, p) for p in range(PARTITIONS))
    return await replicas_bytes(cluster), groups


async def replicas_bytes(cluster: LocalCluster) -> Snapshot:
    """Every node's committed bytes of every partition (a follower serves fetches too)."""
    out = {}
    for node_id, node in cluster.nodes.items():
        deadline = time.monotonic() + 20
        while True:
            try:
                out[node_id] = await read_partitions(node.client_address)
                break
            except Exception:  # e.g. NotLeader while a replica catches up: ask again
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    return out


async def fuzz_cluster(
    cluster: LocalCluster, per_kind: int, seed: int, hold_connections: int = 32
) -> ClusterRun:
    """``per_kind`` hostile inputs of each kind spread over every node's ports, then checks."""
    run = ClusterRun()
    started = time.perf_counter()
    before, groups = await prepare_cluster(cluster)
    pids = {n: node.pid for n, node in cluster.nodes.items() if node.pid is not None}
    await asyncio.sleep(1.0)  # let start-up allocations settle
    run.rss_before = {n: rss_kib(pid) for n, pid in pids.items()}
    rng = random.Random(seed)
    addresses = [(n.client_address, n.peer_address) for n in cluster.nodes.values()]
    client_target = ClientTarget((TOPIC, "fuzz-a"), PARTITIONS, frozenset({TOPIC}))
    jobs: list[Any] = []
    for kind in KINDS:
        result = run.results[kind] = SocketResult()
        sent = 0
        while sent < per_kind:
            client_address, peer_address = rng.choice(addresses)
            node_id = 1 + addresses.index((client_address, peer_address))
            count = min(rng.randrange(1, 12), per_kind - sent)
            sent += count
            if kind == "client":
                frames = [
                    mutate_frame(rng, client_request(rng, client_target), CLIENT_CRC_COVERS_PAYLOAD)
                    for _ in range(count)
                ]
                jobs.append((send_stream, client_address, frames, result))
            elif kind == "peer":
                target = PeerTarget(node_id, "laminar", groups)
                frames = [mutate_frame(rng, peer_frame(rng, target), True) for _ in range(count)]
                if rng.random() < 0.9:
                    frames.insert(0, seal(hello(target), True))
                jobs.append((send_stream, peer_address, frames, result))
            else:
                gossip = GossipTarget(node_id, peer_address)
                datagrams = [
                    mutate_datagram(rng, gossip_message(rng, gossip)) for _ in range(count)
                ]
                jobs.append((send_datagrams, peer_address, datagrams, result))
            result.inputs += count
        run.inputs[kind] = sent
    rng.shuffle(jobs)
    await _run_jobs(jobs, concurrency=32)
    await asyncio.sleep(2.0)  # replies, elections and retries triggered by the barrage
    run.hold_growth_kib = await _hold_huge_frames(cluster, pids, hold_connections)
    run.rss_after = {n: rss_kib(pid) for n, pid in pids.items()}
    run.problems += [f"node {n.node_id} exited ({n.returncode})" for n in cluster.exited()]
    await cluster.wait_ready(60)
    run.problems += await produce_and_read_back(cluster.bootstrap)
    after = await replicas_bytes(cluster)
    for node_id in before:
        run.problems += [
            f"node {node_id}: {p}" for p in prefix_intact(before[node_id], after[node_id])
        ]
    run.seconds = time.perf_counter() - started
    return run


async def _run_jobs(jobs: list[Any], concurrency: int) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            send, address, items, result = queue.pop()
            if send is send_datagrams:
                send_datagrams(address, items)
                await asyncio.sleep(0)
            else:
                await send(address, items, result, 0.3)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _hold_huge_frames(
    cluster: LocalCluster, pids: dict[int, int], connections: int
) -> dict[int, int]:
    """RSS growth (KiB) of each node while ``connections`` client and as many peer
    connections each announce an 80 MiB frame and send nothing more."""
    header = _announce(16 << 20, 64 << 20)
    growth = {}
    for node_id, node in cluster.nodes.items():
        pid = pids[node_id]
        before = rss_kib(pid)["VmRSS"]
        writers = await hold_huge_frames(node.client_address, connections, header)
        writers += await hold_huge_frames(node.peer_address, connections, header)
        await asyncio.sleep(0.5)
        growth[node_id] = rss_kib(pid)["VmRSS"] - before
        for writer in writers:
            writer.close()
    return growth


def _announce(message_len: int, payload_len: int) -> bytes:
    import struct

    from laminar.framing import MAGIC, VERSION
    from laminar.protocol import KIND_PEER

    return struct.pack("<HBBIII", MAGIC, VERSION, KIND_PEER, message_len, payload_len, 0)
