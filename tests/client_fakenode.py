"""A small in-memory laminar cluster speaking the real client protocol over real sockets.

It lets the client tests force the situations a real cluster produces only by chance: a
leader that moves, a connection that drops after the write, an error on the nth attempt.
Storage is a list of stamped batches per partition; the wire side (frames, Cap'n Proto,
batch crc checks, long polls) is the real thing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from laminar.errors import (
    InvalidRequestError,
    LaminarError,
    NotLeaderError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.protocol import (
    ACKS_NONE,
    CLIENT_CRC_COVERS_PAYLOAD,
    EARLIEST,
    KIND_RESPONSE,
    LATEST,
    client_schema,
    decode,
    fill_error,
)
from laminar.segment.batch import is_control, read_header, stamp, verify_batch
from laminar.transport import FramedProtocol
from tests.client_fakegroups import FakeGroups, GroupHandlers


@dataclass
class FakePartition:
    leader: int
    replicas: list[int]
    batches: list[bytes] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    start: int = 0
    end: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    sequences: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """(producer id, base sequence) -> offsets, like the node's idempotence table."""

    def append(self, data: bytes | memoryview, term: int = 1) -> tuple[int, int]:
        header = verify_batch(data)
        key = (header.producer_id, header.base_sequence)
        if header.producer_id >= 0 and key in self.sequences:
            return self.sequences[key]
        buf = bytearray(data)
        base = self.end
        stamp(buf, base, term)
        self.batches.append(bytes(buf))
        self.bases.append(base)
        self.end = base + header.last_offset_delta + 1
        if header.producer_id >= 0:
            self.sequences[key] = (base, self.end - 1)
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()
        return base, self.end - 1

    def read(self, offset: int, max_bytes: int) -> bytes:
        out: list[bytes] = []
        size = 0
        for base, data in zip(self.bases, self.batches, strict=True):
            last = base + read_header(data).last_offset_delta
            if last < offset:
                continue
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
        return b"".join(out)

    def offset_for_timestamp(self, ts: int) -> int:
        for base, data in zip(self.bases, self.batches, strict=True):
            header = read_header(data)
            if not is_control(header) and header.max_timestamp >= ts:
                return base
        return -1

    def truncate_front(self, start: int) -> None:
        """Retention: forget batches wholly before ``start``."""
        while self.bases and self.bases[0] + read_header(self.batches[0]).last_offset_delta < start:
            self.bases.pop(0)
            self.batches.pop(0)
        self.start = self.bases[0] if self.bases else self.end


@dataclass
class Faults:
    """Things the next requests will suffer; tests fill these in."""

    produce_errors: dict[tuple[str, int], deque[LaminarError]] = field(default_factory=dict)
    drop_after_produce: int = 0
    """Close the connection instead of answering this many produce requests (after writing)."""
    produce_delay: float = 0.0
    fetch_errors: dict[tuple[str, int], deque[LaminarError]] = field(default_factory=dict)
    fetch_delay: dict[int, float] = field(default_factory=dict)
    """Seconds a node waits before it handles a fetch, per node id."""
    damage_fetches: int = 0
    """Flip a byte in the payload of this many fetch responses (damage on the wire)."""


class FakeCluster:
    def __init__(self) -> None:
        self.nodes: dict[int, FakeNode] = {}
        self.topics: dict[str, list[FakePartition]] = {}
        self.faults = Faults()
        self.produce_requests: list[tuple[int, list[tuple[str, int]]]] = []
        self.fetch_requests: list[tuple[int, list[tuple[str, int, int]]]] = []
        self.groups = FakeGroups(self)

    async def start(self, nodes: int = 3) -> FakeCluster:
        for node_id in range(1, nodes + 1):
            node = FakeNode(self, node_id)
            await node.start()
            self.nodes[node_id] = node
        return self

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes.values())

    def create_topic(self, name: str, partitions: int, leaders: list[int] | None = None) -> None:
        if name in self.topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        ids = sorted(self.nodes)
        self.topics[name] = [
            FakePartition(
                leader=leaders[p] if leaders else ids[p % len(ids)],
                replicas=[ids[(p + i) % len(ids)] for i in range(min(3, len(ids)))],
            )
            for p in range(partitions)
        ]

    def partition(self, topic: str, partition: int) -> FakePartition:
        partitions = self.topics.get(topic)
        if partitions is None:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        if not 0 <= partition < len(partitions):
            raise UnknownPartitionError(f"{topic!r} has no partition {partition}")
        return partitions[partition]

    def move_leader(self, topic: str, partition: int, leader: int) -> None:
        self.partition(topic, partition).leader = leader

    def address_of(self, node_id: int) -> str:
        node = self.nodes.get(node_id)
        return node.address if node else ""


class FakeNode(GroupHandlers):
    def __init__(self, cluster: FakeCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.address = ""
        self.server: asyncio.Server | None = None
        self.connections: set[FramedProtocol] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._protocol, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        self.drop_connections()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def drop_connections(self) -> None:
        for connection in list(self.connections):
            connection.close()

    def _protocol(self) -> FramedProtocol:
        protocol: FramedProtocol

        def on_frame(kind: int, message: bytes, payload: memoryview) -> None:
            request = decode(client_schema.Request, message)
            task = asyncio.create_task(self._serve(protocol, request, payload))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        protocol = FramedProtocol(
            on_frame,
            lambda _exc: self.connections.discard(protocol),
            crc_covers_payload=CLIENT_CRC_COVERS_PAYLOAD,
        )
        self.connections.add(protocol)
        return protocol

    async def _serve(self, connection: FramedProtocol, request: Any, payload: memoryview) -> None:
        response = client_schema.Response.new_message()
        response.correlationId = request.correlationId
        out: list[bytes] = []
        which = request.body.which()
        try:
            out = await getattr(self, f"_on_{which}")(
                getattr(request.body, which), response, payload
            )
        except LaminarError as exc:
            fill_error(response.error, exc)
        except _Drop:
            connection.close()
            return
        if not connection.closed:
            connection.send_parts(KIND_RESPONSE, response.to_bytes(), out or [])

    # handlers ----------------------------------------------------------------------------
    async def _on_metadata(self, body: Any, response: Any, _payload: memoryview) -> None:
        cluster = self.cluster
        metadata = response.body.init("metadata")
        brokers = metadata.init("brokers", len(cluster.nodes))
        for slot, node in zip(brokers, cluster.nodes.values(), strict=True):
            slot.nodeId = node.node_id
            slot.address = node.address
        wanted = list(body.topics) or sorted(cluster.topics)
        found = [name for name in wanted if name in cluster.topics]
        topics = metadata.init("topics", len(found))
        for slot, name in zip(topics, found, strict=True):
            self._fill_topic(slot, name)
        metadata.metadataLeader = 1
        metadata.missing = [name for name in wanted if name not in cluster.topics]

    def _fill_topic(self, slot: Any, name: str) -> None:
        partitions = self.cluster.topics[name]
        slot.spec.name = name
        slot.spec.partitions = len(partitions)
        slot.spec.replicationFactor = len(partitions[0].replicas)
        slot.spec.retentionMs = 7 * 86_400_000
        slot.topicId = sorted(self.cluster.topics).index(name) + 1
        out = slot.init("partitions", len(partitions))
        for index, (info, part) in enumerate(zip(out, partitions, strict=True)):
            info.partition = index
            info.leader = part.leader
            info.replicas = part.replicas

    async def _on_createTopic(self, spec: Any, response: Any, _payload: memoryview) -> None:
        if spec.partitions < 1:
            raise InvalidRequestError("a topic needs at least one partition")
        self.cluster.create_topic(spec.name, spec.partitions)
        self._fill_topic(response.body.init("topic"), spec.name)

    async def _on_deleteTopic(self, name: str, response: Any, _payload: memoryview) -> None:
        if self.cluster.topics.pop(name, None) is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        response.body.none = None

    async def _on_produce(self, body: Any, response: Any, payload: memoryview) -> None:
        cluster = self.cluster
        refs = list(body.batches)
        cluster.produce_requests.append((self.node_id, [(r.topic, r.partition) for r in refs]))
        if cluster.faults.produce_delay:
            await asyncio.sleep(cluster.faults.produce_delay)
        results = response.body.init("produce").init("results", len(refs))
        for slot, ref in zip(results, refs, strict=True):
            slot.topic = ref.topic
            slot.partition = ref.partition
            try:
                part = cluster.partition(ref.topic, ref.partition)
                queued = cluster.faults.produce_errors.get((ref.topic, ref.partition))
                if queued:
                    raise queued.popleft()
                if part.leader != self.node_id:
                    raise NotLeaderError(
                        "not the leader", part.leader, cluster.address_of(part.leader)
                    )
                data = payload[ref.payloadOffset : ref.payloadOffset + ref.payloadLength]
                slot.baseOffset, slot.lastOffset = part.append(data)
            except LaminarError as exc:
                fill_error(slot.error, exc)
                slot.baseOffset = slot.lastOffset = -1
        if cluster.faults.drop_after_produce > 0 and body.acks != ACKS_NONE:
            cluster.faults.drop_after_produce -= 1
            raise _Drop

    async def _on_fetch(self, body: Any, response: Any, _payload: memoryview) -> list[bytes]:
        cluster = self.cluster
        asks = list(body.partitions)
        cluster.fetch_requests.append(
            (self.node_id, [(a.topic, a.partition, a.offset) for a in asks])
        )
        if cluster.faults.fetch_delay.get(self.node_id):
            await asyncio.sleep(cluster.faults.fetch_delay[self.node_id])
        checked: list[FakePartition | LaminarError] = []
        for ask in asks:
            try:
                queued = cluster.faults.fetch_errors.get((ask.topic, ask.partition))
                if queued:
                    raise queued.popleft()
                part = cluster.partition(ask.topic, ask.partition)
                if part.leader != self.node_id:
                    raise NotLeaderError(
                        "not the leader", part.leader, cluster.address_of(part.leader)
                    )
                if not part.start <= ask.offset <= part.end:
                    raise OffsetOutOfRangeError(ask.offset, part.start, part.end)
                checked.append(part)
            except LaminarError as exc:
                checked.append(exc)
        ready = any(
            isinstance(p, FakePartition) and a.offset < p.end
            for p, a in zip(checked, asks, strict=True)
        )
        if not ready and body.maxWaitMs and any(isinstance(p, FakePartition) for p in checked):
            waiter = asyncio.get_running_loop().create_future()
            for part in checked:
                if isinstance(part, FakePartition):
                    part.waiters.append(waiter)
            await asyncio.wait([waiter], timeout=body.maxWaitMs / 1000)
        results = response.body.init("fetch").init("results", len(asks))
        chunks: list[bytes] = []
        position = 0
        for slot, ask, part in zip(results, asks, checked, strict=True):
            slot.topic = ask.topic
            slot.partition = ask.partition
            if isinstance(part, LaminarError):
                fill_error(slot.error, part)
                continue
            slot.highWatermark = part.end
            slot.logStart = part.start
            data = part.read(ask.offset, ask.maxBytes) if ask.offset < part.end else b""
            if data and cluster.faults.damage_fetches:
                cluster.faults.damage_fetches -= 1
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            slot.payloadOffset = position
            slot.payloadLength = len(data)
            chunks.append(data)
            position += len(data)
        return chunks

    async def _on_listOffsets(self, body: Any, response: Any, _payload: memoryview) -> None:
        queries = list(body.queries)
        answers = response.body.init("listOffsets").init("answers", len(queries))
        for slot, query in zip(answers, queries, strict=True):
            slot.topic = query.topic
            slot.partition = query.partition
            try:
                part = self.cluster.partition(query.topic, query.partition)
                if part.leader != self.node_id:
                    raise NotLeaderError(
                        "not the leader", part.leader, self.cluster.address_of(part.leader)
                    )
                if query.timestamp == EARLIEST:
                    slot.offset = part.start
                elif query.timestamp == LATEST:
                    slot.offset = part.end
                else:
                    slot.offset = part.offset_for_timestamp(query.timestamp)
            except LaminarError as exc:
                fill_error(slot.error, exc)

    async def _on_clusterStatus(self, _body: Any, response: Any, _payload: memoryview) -> None:
        cluster = self.cluster
        status = response.body.init("clusterStatus")
        status.metadataLeader = 1
        members = status.init("members", len(cluster.nodes))
        for slot, node in zip(members, cluster.nodes.values(), strict=True):
            slot.nodeId = node.node_id
            slot.address = node.address
            slot.state = "alive"
            slot.metadataVoter = True
        rows = [
            (t, i, p) for t, parts in sorted(cluster.topics.items()) for i, p in enumerate(parts)
        ]
        out = status.init("partitions", len(rows))
        for slot, (topic, index, part) in zip(out, rows, strict=True):
            slot.topic = topic
            slot.partition = index
            slot.leader = part.leader
            slot.term = 1
            slot.startOffset = part.start
            slot.highWatermark = part.end
            slot.endOffset = part.end
            replicas = slot.init("replicas", len(part.replicas))
            for rslot, node_id in zip(replicas, part.replicas, strict=True):
                rslot.nodeId = node_id
                rslot.matchOffset = part.end - 1
                rslot.lag = 0


class _Drop(Exception):
    """Raised by a handler to close the connection without a reply."""
