"""The client-facing server: decodes requests, runs them against the node, replies typed.

Each request runs as its own task so long polls and produce waits never block the
connection; replies carry the request's correlation id and may leave out of order. A frame
that cannot be decoded closes only its connection; any error inside a request becomes a typed
error reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import (
    CorruptBatchError,
    CorruptLogError,
    InvalidRequestError,
    LaminarError,
    NotLeaderError,
    OffsetOutOfRangeError,
    ProtocolError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.framing import MAX_PAYLOAD_BYTES
from laminar.groups import wire as group_wire
from laminar.groups.service import is_internal
from laminar.node import admin_wire
from laminar.node.metadata import Topic
from laminar.node.replica import Replica, Waiter
from laminar.node.status import cluster_view, move_stage
from laminar.protocol import (
    ACKS_ALL,
    ACKS_LEADER,
    ACKS_NONE,
    CLIENT_CRC_COVERS_PAYLOAD,
    EARLIEST,
    KIND_REQUEST,
    KIND_RESPONSE,
    LATEST,
    MAX_NODE_ID,
    client_schema,
    decode,
    fill_error,
    request_body,
)
from laminar.queues import config_wire as queue_config_wire
from laminar.queues import wire as queue_wire
from laminar.schemas import READ_ERRORS
from laminar.segment import batch as record_batch
from laminar.transport import FramedProtocol, split_address

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)

MAX_FETCH_WAIT_MS = 30_000
MAX_FETCH_BYTES = MAX_PAYLOAD_BYTES // 2
"""A fetch reply's payload stays under what any client accepts in one frame, whatever
maxBytes asks for (whole batches may overshoot a limit by one batch)."""


class ClientServer:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[FramedProtocol] = set()
        self._handlers = {
            **group_wire.handlers(node.groups, node.node_id),
            **queue_wire.handlers(node.queues, self._queue_replica),
            **admin_wire.handlers(node.topic_admin, self._fill_topic),
            **queue_config_wire.handlers(
                node.queues, node.metadata_service.propose, node.metadata_service.wait_caught_up
            ),
        }

    async def start(self) -> None:
        host, port = split_address(self.node.config.listen)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol,
            host,
            port,
            reuse_address=True,
            ssl=self.node.config.security.tls.server_context("client"),
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def connection_count(self) -> int:
        return len(self._connections)

    def _protocol(self) -> FramedProtocol:
        protocol: FramedProtocol

        def on_frame(kind: int, message: bytes, payload: memoryview) -> None:
            if kind != KIND_REQUEST:
                raise ProtocolError(f"unexpected frame kind {kind} from a client")
            request = decode(client_schema.Request, message)
            which, body = request_body(request)
            task = asyncio.create_task(self._serve(protocol, request, which, body, payload))
            self._tasks.add(task)
            protocol.request_started()
            task.add_done_callback(lambda done: self._request_done(protocol, done))

        protocol = FramedProtocol(
            on_frame,
            lambda _exc: self._connections.discard(protocol),
            crc_covers_payload=CLIENT_CRC_COVERS_PAYLOAD,
            max_in_flight=self.node.config.max_requests_per_connection,
        )
        self._connections.add(protocol)
        return protocol

    def _request_done(self, connection: FramedProtocol, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        connection.request_done()

    async def _serve(
        self, connection: FramedProtocol, request: Any, which: str, body: Any, payload: memoryview
    ) -> None:
        started = time.perf_counter()
        response = client_schema.Response.new_message()
        out_payload: list[Any] = []
        no_reply_wanted = False
        acks: int | None = None  # produce only, for its latency histogram
        try:
            response.correlationId = request.correlationId
            # acks=0: the client reads no reply, and one arriving after it closed would make
            # its kernel reset the connection, discarding requests not yet read (as in Kafka)
            if which == "produce":
                acks = body.acks
            no_reply_wanted = acks == ACKS_NONE
            handler = self._handlers.get(which) or getattr(self, f"_on_{which}")
            # Serve only while the replies are read: a client that stops reading gets no more
            # work done for it (and no more replies buffered) until it does.
            await connection.drain()
            out_payload = await handler(body, response, payload) or []
        except LaminarError as exc:
            fill_error(response.error, exc)
        except asyncio.CancelledError:
            raise
        except READ_ERRORS as exc:  # a field of a malformed request, read by the handler
            reason = str(exc).splitlines()[0]
            log.warning("malformed request", peer=connection.peer, error=reason)
            fill_error(response.error, ProtocolError(f"malformed request: {reason}"))
            out_payload = []
        except Exception as exc:  # never let a request take the node down
            log.exception("request failed")
            fill_error(response.error, ProtocolError(f"could not serve request: {exc}"))
            out_payload = []
        self.node.request_stats.served(which, started, acks)
        if no_reply_wanted:
            return
        if not connection.closed:
            connection.send_parts(KIND_RESPONSE, response.to_bytes(), out_payload)

    # metadata and topics ---------------------------------------------------------------------
    async def _on_metadata(self, body: Any, response: Any, _payload: memoryview) -> None:
        state = self.node.state
        wanted = list(body.topics)
        names = wanted or sorted(state.topics)
        found = [state.topics[n] for n in names if n in state.topics]
        metadata = response.body.init("metadata")
        nodes = sorted(state.nodes.values(), key=lambda n: n.node_id)
        brokers = metadata.init("brokers", len(nodes))
        for slot, info in zip(brokers, nodes, strict=True):
            slot.nodeId = info.node_id
            slot.address = info.client_address
        topics = metadata.init("topics", len(found))
        for slot, topic in zip(topics, found, strict=True):
            self._fill_topic(slot, topic)
        metadata.metadataLeader = self.node.metadata_leader
        metadata.missing = [n for n in wanted if n not in state.topics]

    def _fill_topic(self, slot: Any, topic: Topic) -> None:
        settings = topic.settings
        spec = slot.spec
        spec.name = topic.name
        spec.partitions = settings.partitions
        spec.replicationFactor = settings.replication_factor
        spec.segmentBytes = settings.segment_bytes
        spec.segmentMs = settings.segment_ms
        spec.retentionMs = -1 if settings.retention_ms is None else settings.retention_ms
        spec.retentionBytes = settings.retention_bytes or 0
        slot.topicId = topic.topic_id
        partitions = slot.init("partitions", len(topic.partitions))
        for index, (out, assignment) in enumerate(zip(partitions, topic.partitions, strict=True)):
            out.partition = index
            out.leader = self._leader_of(topic, index, assignment.leader)
            out.replicas = assignment.replicas

    def _leader_of(self, topic: Topic, partition: int, recorded: int) -> int:
        replica = self.node.replica_for(topic.name, partition)
        if replica is not None and replica.raft.leader_id:
            return replica.raft.leader_id  # fresher than the metadata record
        return recorded

    # produce ---------------------------------------------------------------------------------
    async def _on_produce(self, body: Any, response: Any, payload: memoryview) -> None:
        acks = body.acks
        if acks not in (ACKS_ALL, ACKS_LEADER, ACKS_NONE):
            raise InvalidRequestError(f"acks must be -1, 0 or 1, not {acks}")
        refs = list(body.batches)
        results = response.body.init("produce").init("results", len(refs))
        waits: list[tuple[int, Waiter]] = []
        touched: set[Replica] = set()
        for position, (slot, ref) in enumerate(zip(results, refs, strict=True)):
            slot.topic = ref.topic
            slot.partition = ref.partition
            try:
                if is_internal(ref.topic):
                    raise InvalidRequestError(f"{ref.topic} is written by the cluster only")
                replica = self._leader_replica(ref.topic, ref.partition)
                self.node.disk.refuse_when_full(ref.payloadLength)
                end = ref.payloadOffset + ref.payloadLength
                if end > len(payload):
                    raise InvalidRequestError("batch reference runs past the frame payload")
                data = payload[ref.payloadOffset : end]
                header = record_batch.verify_batch(data, self.node.config.max_batch_bytes)
                if record_batch.is_control(header):
                    raise InvalidRequestError("clients may not produce control batches")
                earlier = replica.storage.producers.find(header)
                if earlier is not None:  # a retry of a batch this log already holds
                    base, last = earlier.base_offset, earlier.last_offset
                else:
                    base, last = replica.raft.propose(data, header.record_count)
                    replica.storage.producers.record(header, base, last)
                    self.node.request_stats.produce(ref.topic, header.record_count, len(data))
                slot.baseOffset = base
                slot.lastOffset = last
                touched.add(replica)
                if acks == ACKS_ALL and last > replica.raft.commit:
                    waiter = Waiter(last, asyncio.get_running_loop().create_future())
                    replica.commit_waiters.append(waiter)
                    waits.append((position, waiter))
            except LaminarError as exc:
                fill_error(slot.error, exc)
                slot.baseOffset = slot.lastOffset = -1
        for replica in touched:
            if acks == ACKS_LEADER:
                self.node.runtime.process_now(replica)  # written to the leader's log on return
            else:
                self.node.runtime.wake(replica)
        if waits:
            await self._await_commits(results, waits, body.timeoutMs or 30_000)

    async def _await_commits(
        self, results: Any, waits: list[tuple[int, Waiter]], timeout_ms: int
    ) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_ms / 1000):
                await settled(waiter.future for _, waiter in waits)
        for position, waiter in waits:
            future = waiter.future
            error: BaseException | None
            if not future.done() or future.cancelled():
                future.cancel()
                error = RequestTimeoutError("the write did not commit in time; it may still")
            else:
                error = future.exception()
            if error is not None:
                fill_error(results[position].error, error)

    def _queue_replica(self, topic_name: str, partition: int) -> Replica:
        if is_internal(topic_name):
            raise InvalidRequestError(f"{topic_name} cannot be read as a queue")
        return self._leader_replica(topic_name, partition)

    def _leader_replica(self, topic_name: str, partition: int) -> Replica:
        replica = self._any_replica(topic_name, partition)
        if not replica.is_leader:
            raise replica.not_leader(self.node.address_of)
        return replica

    def _any_replica(self, topic_name: str, partition: int) -> Replica:
        topic = self.node.state.topics.get(topic_name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {topic_name!r}")
        if partition >= len(topic.partitions):
            raise UnknownPartitionError(
                f"topic {topic_name!r} has {len(topic.partitions)} partitions, "
                f"not partition {partition}"
            )
        replica = self.node.replica_for(topic_name, partition)
        if replica is None:
            leader = topic.partitions[partition].leader
            raise NotLeaderError(
                f"no replica of {topic_name}/{partition} on this node",
                leader,
                self.node.address_of(leader) if leader else "",
            )
        return replica

    # fetch -----------------------------------------------------------------------------------
    async def _on_fetch(self, body: Any, response: Any, _payload: memoryview) -> list[bytes]:
        wanted = list(body.partitions)
        max_wait = min(body.maxWaitMs, MAX_FETCH_WAIT_MS) / 1000
        replicas: list[Replica | LaminarError] = []
        for ask in wanted:
            try:
                replica = self._any_replica(ask.topic, ask.partition)
                if not (replica.log.start_offset <= ask.offset <= replica.high_watermark):
                    raise OffsetOutOfRangeError(
                        ask.offset, replica.log.start_offset, replica.high_watermark
                    )
                replicas.append(replica)
            except LaminarError as exc:
                replicas.append(exc)
        has_data = any(
            isinstance(r, Replica) and ask.offset < r.high_watermark
            for r, ask in zip(replicas, wanted, strict=True)
        )
        if not has_data and max_wait > 0 and any(isinstance(r, Replica) for r in replicas):
            waiter = asyncio.get_running_loop().create_future()
            for replica in replicas:
                if isinstance(replica, Replica):
                    replica.fetch_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max_wait):
                    await waiter  # one loop turn after the high watermark moved
        results = response.body.init("fetch").init("results", len(wanted))
        chunks: list[bytes] = []
        position = 0
        budget = min(body.maxBytes or (4 << 20), MAX_FETCH_BYTES)
        for slot, ask, replica in zip(results, wanted, replicas, strict=True):
            slot.topic = ask.topic
            slot.partition = ask.partition
            if isinstance(replica, LaminarError):
                fill_error(slot.error, replica)
                continue
            high = replica.high_watermark
            slot.highWatermark = high
            slot.logStart = replica.log.start_offset
            slot.payloadOffset = position
            if ask.offset >= high or budget <= 0 or replica.closed:
                continue
            try:
                limit = min(ask.maxBytes or budget, budget)
                with replica.log.read(ask.offset, limit, upto=high) as log_slice:
                    view = log_slice.tobytes()
                    offsets = log_slice.next_offset - ask.offset
            except CorruptLogError as exc:
                # Never serve damaged bytes: the replica goes offline and is repaired from its
                # peers; the client is sent to the (new) leader meanwhile.
                self.node.runtime.fail(replica, exc)
                fill_error(slot.error, NotLeaderError("replica offline after a storage fault"))
                continue
            except LaminarError as exc:
                fill_error(slot.error, exc)
                continue
            slot.payloadLength = len(view)
            self.node.request_stats.fetch(ask.topic, offsets, len(view))
            chunks.append(view)
            position += len(view)
            budget -= len(view)
        return chunks

    # offsets and status --------------------------------------------------------------------
    async def _on_listOffsets(self, body: Any, response: Any, _payload: memoryview) -> None:
        queries = list(body.queries)
        answers = response.body.init("listOffsets").init("answers", len(queries))
        for slot, query in zip(answers, queries, strict=True):
            slot.topic = query.topic
            slot.partition = query.partition
            try:
                replica = self._any_replica(query.topic, query.partition)
                high = replica.high_watermark
                if query.timestamp == EARLIEST:
                    slot.offset = replica.log.start_offset
                elif query.timestamp == LATEST:
                    slot.offset = high
                else:
                    found = first_offset_at(replica, query.timestamp)
                    slot.offset = found if found is not None and found < high else -1
            except LaminarError as exc:
                fill_error(slot.error, exc)
                slot.offset = -1

    async def _on_clusterStatus(self, _body: Any, response: Any, _payload: memoryview) -> None:
        node = self.node
        view = await cluster_view(node)
        partitions = view["partitions"]
        status = response.body.init("clusterStatus")
        status.metadataLeader = node.metadata_leader
        gossip = {m.node_id: m for m in node.swim.members}
        voters = set(node.metadata.raft.conf.voters) if node.metadata is not None else set()
        replica_counts = node.state.replica_counts()
        # Gossip is unauthenticated and SWIM ids are UInt64: an id beyond a node id's UInt32
        # can be no member of this cluster, and would not fit the reply.
        known = set(node.state.nodes) | set(gossip) | {node.node_id}
        members = sorted(n for n in known if n <= MAX_NODE_ID)
        slots = status.init("members", len(members))
        for slot, node_id in zip(slots, members, strict=True):
            member = gossip.get(node_id)
            slot.nodeId = node_id
            slot.address = node.address_of(node_id)
            if node_id == node.node_id:
                slot.state, slot.incarnation = "alive", node.swim.core.incarnation
            elif member is not None:
                slot.state, slot.incarnation = str(member.state), member.incarnation
            else:
                slot.state = "unknown"
            if node_id not in node.state.nodes:
                slot.state = f"{slot.state} (registering)"
            elif node_id in node.state.draining:
                slot.state = f"{slot.state} (draining)"
            slot.metadataVoter = node_id in voters
            slot.replicas = replica_counts.get(node_id, 0)
            slot.leaders = sum(1 for p in partitions if p["leader"] == node_id)
        moves = [
            (topic, index, assignment)
            for topic in node.state.topics.values()
            for index, assignment in enumerate(topic.partitions)
            if assignment.moving
        ]
        move_slots = status.init("moves", len(moves))
        for slot, (topic, index, assignment) in zip(move_slots, moves, strict=True):
            slot.topic = topic.name
            slot.partition = index
            slot.fromNode = assignment.removing
            slot.toNode = assignment.adding
            slot.stage = move_stage(node, topic, index)
        out = status.init("partitions", len(partitions))
        for slot, part in zip(out, partitions, strict=True):
            slot.topic = part["topic"]
            slot.partition = part["partition"]
            slot.leader = part["leader"]
            slot.term = part["term"]
            slot.startOffset = part["start_offset"]
            slot.highWatermark = part["high_watermark"]
            slot.endOffset = part["end_offset"]
            replicas = slot.init("replicas", len(part["replicas"]))
            for rslot, rep in zip(replicas, part["replicas"], strict=True):
                rslot.nodeId = rep["node_id"]
                rslot.matchOffset = rep["match"]
                rslot.lag = rep["lag"]
        faults = status.init("faults", len(view["faults"]))
        for slot, fault in zip(faults, view["faults"], strict=True):
            slot.topic = fault["topic"]
            slot.partition = fault["partition"]
            slot.nodeId = fault["node_id"]
            slot.state = fault["state"]
            slot.error = fault["error"]


async def settled(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until every future is done, successful or not. The task resumes one loop turn
    after the last one is done (``asyncio.wait`` takes two: its callback, then the task), which
    is on the path of every acks=all reply."""
    for future in futures:
        if not future.done():
            with contextlib.suppress(Exception):
                await future


def first_offset_at(replica: Replica, timestamp: int) -> int | None:
    """The first record offset with a timestamp >= ``timestamp`` (Kafka's ListOffsets).

    The time index finds the first batch whose newest record reaches the time; the records
    inside that one batch are then checked, since a batch spans a range of timestamps (a
    compressed batch is inflated for that, as Kafka's broker does, unless its first record
    already qualifies; one that does not inflate answers its base offset, and its readers
    get the CorruptBatchError).
    """
    found = replica.log.offset_for_timestamp(timestamp)
    if found is None:
        return None
    (batch,) = replica.log.batches(found, found + 1, 1)[:1]
    header = record_batch.read_header(batch)
    if header.first_timestamp >= timestamp:
        return header.base_offset
    try:
        records = record_batch.decode_records(batch)
    except CorruptBatchError as exc:
        log.warning("batch does not decode for a time lookup", offset=found, error=str(exc))
        return found
    for record in records:
        if record.timestamp >= timestamp:
            return record.offset
    return found
