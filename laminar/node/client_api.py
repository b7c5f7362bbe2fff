"""The client-facing server: decodes requests, runs them against the node, replies typed.

Each request runs as its own task so long polls and produce waits never block the
connection; replies carry the request's correlation id and may leave out of order. A frame
that cannot be decoded closes only its connection; any error inside a request becomes a typed
error reply.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

import structlog

from laminar.auth.native import NativeAuth
from laminar.auth.session import Session
from laminar.errors import (
    InvalidRequestError,
    LaminarError,
    ProtocolError,
)
from laminar.framing import MAX_PAYLOAD_BYTES
from laminar.groups import wire as group_wire
from laminar.groups.service import is_internal
from laminar.node import admin_wire
from laminar.node.health import cluster_health, fill_health
from laminar.node.metadata import Topic, group_id
from laminar.node.partition_io import PartitionIO
from laminar.node.replica import Replica, Waiter
from laminar.node.status import cluster_view, fill_fault, fill_metadata_log, move_stage
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
from laminar.splits.wire import fill_operation, fill_range
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
        self.io = PartitionIO(node)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[FramedProtocol] = set()
        self.auth = NativeAuth(node.authorizer, node.auth_admin)
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
        session = Session()

        def on_frame(kind: int, message: bytes, payload: memoryview) -> None:
            if kind != KIND_REQUEST:
                raise ProtocolError(f"unexpected frame kind {kind} from a client")
            request = decode(client_schema.Request, message)
            which, body = request_body(request)
            task = asyncio.create_task(
                self._serve(protocol, session, request, which, body, payload)
            )
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
        self,
        connection: FramedProtocol,
        session: Session,
        request: Any,
        which: str,
        body: Any,
        payload: memoryview,
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
            # Serve only while the replies are read: a client that stops reading gets no more
            # work done for it (and no more replies buffered) until it does.
            await connection.drain()
            if not await self.auth.handle(session, which, body, response):  # may refuse
                handler = self._handlers.get(which) or getattr(self, f"_on_{which}")
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
        spec.partitioning = settings.partitioning
        spec.autoSplitAbove = settings.auto_split_above
        spec.autoMergeBelow = settings.auto_merge_below
        spec.autoWindowMs = settings.auto_window_ms
        spec.maxPartitions = settings.max_partitions
        slot.topicId = topic.topic_id
        partitions = slot.init("partitions", len(topic.partitions))
        leaders = self._leaders(topic)
        for index, (out, assignment) in enumerate(zip(partitions, topic.partitions, strict=True)):
            out.partition = index
            out.leader = leaders[index]
            out.replicas = assignment.replicas
            if assignment.range_start >= 0:
                fill_range(out, assignment)
        if topic.operation is not None:
            fill_operation(slot.init("operations", 1)[0], topic.name, topic.operation)

    def _leaders(self, topic: Topic) -> list[int]:
        """Each partition's leader: as this node's replica knows it (fresher than the metadata
        record), else as recorded, unless that node is down (0: electing; a client dialing the
        dead node would only wait for nothing). Looked up per topic, not per partition: at
        10,000 partitions every metadata answer walks them all."""
        runtime = self.node.runtime
        replicas, is_down = runtime.replicas, runtime.is_down
        first = group_id(topic.topic_id, 0)
        leaders = []
        for index, assignment in enumerate(topic.partitions):
            replica = replicas.get(first | index)
            leader = 0 if replica is None else replica.raft.lead
            if not leader:
                leader = 0 if is_down(assignment.leader) else assignment.leader
            leaders.append(leader)
        return leaders

    # produce ---------------------------------------------------------------------------------
    async def _on_produce(self, body: Any, response: Any, payload: memoryview) -> None:
        acks = body.acks
        if acks not in (ACKS_ALL, ACKS_LEADER, ACKS_NONE):
            raise InvalidRequestError(f"acks must be -1, 0 or 1, not {acks}")
        io = self.io
        refs = list(body.batches)
        timeout_ms = body.timeoutMs or 30_000
        results = response.body.init("produce").init("results", len(refs))
        waits: list[tuple[int, Waiter]] = []
        touched: set[Replica] = set()
        async with io.admitted(len(refs), acks, timeout_ms) as proposed:
            for position, (slot, ref) in enumerate(zip(results, refs, strict=True)):
                slot.topic = ref.topic
                slot.partition = ref.partition
                try:
                    if is_internal(ref.topic):
                        raise InvalidRequestError(f"{ref.topic} is written by the cluster only")
                    replica = io.leader_replica(ref.topic, ref.partition)
                    self.node.disk.refuse_when_full(ref.payloadLength)
                    end = ref.payloadOffset + ref.payloadLength
                    if end > len(payload):
                        raise InvalidRequestError("batch reference runs past the frame payload")
                    data = payload[ref.payloadOffset : end]
                    base, last = io.append(replica, data, io.verify(data))
                    slot.baseOffset = base
                    slot.lastOffset = last
                    touched.add(replica)
                    waiter = io.commit_waiter(replica, last)
                    if waiter is not None:
                        proposed.append(waiter.future)
                        if acks == ACKS_ALL:
                            waits.append((position, waiter))
                except LaminarError as exc:
                    fill_error(slot.error, exc)
                    slot.baseOffset = slot.lastOffset = -1
            io.appended(touched, acks)
        if waits:
            outcomes = await io.await_commits([w for _, w in waits], timeout_ms)
            for (position, _), error in zip(waits, outcomes, strict=True):
                if error is not None:
                    fill_error(results[position].error, error)

    def _queue_replica(self, topic_name: str, partition: int) -> Replica:
        if is_internal(topic_name):
            raise InvalidRequestError(f"{topic_name} cannot be read as a queue")
        return self.io.leader_replica(topic_name, partition)

    # fetch -----------------------------------------------------------------------------------
    async def _on_fetch(self, body: Any, response: Any, _payload: memoryview) -> list[bytes]:
        io = self.io
        wanted = list(body.partitions)
        max_wait = min(body.maxWaitMs, MAX_FETCH_WAIT_MS) / 1000
        replicas: list[Replica | LaminarError] = []
        for ask in wanted:
            try:
                replica = io.any_replica(ask.topic, ask.partition)
                io.check_fetch_offset(replica, ask.offset)
                replicas.append(replica)
            except LaminarError as exc:
                replicas.append(exc)
        has_data = any(
            isinstance(r, Replica) and ask.offset < r.high_watermark
            for r, ask in zip(replicas, wanted, strict=True)
        )
        if not has_data:
            await io.wait_for_data([r for r in replicas if isinstance(r, Replica)], max_wait)
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
                view = io.read(replica, ask.offset, min(ask.maxBytes or budget, budget))
            except LaminarError as exc:
                fill_error(slot.error, exc)
                continue
            slot.payloadLength = len(view)
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
                replica = self.io.any_replica(query.topic, query.partition)
                if query.timestamp == EARLIEST:
                    slot.offset = replica.log.start_offset
                elif query.timestamp == LATEST:
                    slot.offset = replica.high_watermark
                else:
                    found = self.io.offset_for_time(replica, query.timestamp)
                    slot.offset = -1 if found is None else found
            except LaminarError as exc:
                fill_error(slot.error, exc)
                slot.offset = -1

    async def _on_clusterHealth(self, _body: Any, response: Any, _payload: memoryview) -> None:
        fill_health(response.body.init("clusterHealth"), await cluster_health(self.node))

    async def _on_clusterStatus(self, _body: Any, response: Any, _payload: memoryview) -> None:
        node = self.node
        view = await cluster_view(node)
        partitions = view["partitions"]
        status = response.body.init("clusterStatus")
        status.metadataLeader = node.metadata_leader
        gossip = {m.node_id: m for m in node.swim.members}
        voters = set(node.metadata.raft.conf.voters) if node.metadata is not None else set()
        replica_counts = node.state.replica_counts()
        leader_counts = collections.Counter(p["leader"] for p in partitions)
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
                slot.state = "alive"  # (incarnation 0 while the gossip is still starting)
                slot.incarnation = node.swim.core.incarnation if node.swim.started else 0
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
            slot.leaders = leader_counts[node_id]
        moves = [
            (topic, index, assignment)
            for topic in node.state.topics.values()
            for index, assignment in enumerate(topic.partitions)
            if assignment.moving
        ]
        operations = node.splits.in_progress()
        for slot, (name, operation) in zip(
            status.init("operations", len(operations)), operations, strict=True
        ):
            fill_operation(slot, name, operation)
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
            fill_fault(slot, fault)
        logs = status.init("metadataLog", len(view["metadata_log"]))
        for slot, row in zip(logs, view["metadata_log"], strict=True):
            fill_metadata_log(slot, row)
