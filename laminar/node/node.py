"""The laminar node: hosts the metadata replica and partition replicas, wires them together.

Start-up order: open the metadata group (its replay re-creates every local partition replica),
listen for peers and clients, start the Multi-Raft tasks, then register this node's addresses
in the metadata (retried until it sticks).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from laminar.errors import (
    InvalidRequestError,
    LaminarError,
    NotLeaderError,
    RequestTimeoutError,
)
from laminar.membership.driver import SwimDriver
from laminar.node.calls import PeerCalls
from laminar.node.client_api import ClientServer
from laminar.node.config import NodeConfig
from laminar.node.metadata import (
    METADATA_GROUP,
    MetadataState,
    Topic,
    TopicSettings,
    decode_command,
    encode_command,
    group_id,
    place_replicas,
    validate_topic_name,
)
from laminar.node.peers import PeerNetwork
from laminar.node.placement import Placement
from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.raft import ConfState, Entry, RaftConfig
from laminar.segment import batch as record_batch
from laminar.segment.log import LogConfig
from laminar.transport import split_address

log = structlog.get_logger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.state = MetadataState()
        self.metadata_applied = -1
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._metadata_waiters: dict[int, asyncio.Future[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.runtime = MultiRaft(
            self.node_id, config.tick_ms / 1000, self._send_raft, self._leader_changed
        )
        self.peers = PeerNetwork(
            self.node_id,
            config.cluster_id,
            config.peer_listen,
            config.listen,
            on_raft=self._raft_received,
            on_other=self._other_received,
            on_up=self._peer_up,
            on_down=self.runtime.node_down,
            dead_after=config.tick_ms * config.election_ticks * 2 / 1000,
        )
        self.calls = PeerCalls(self.peers)
        self.calls.register("propose", self._serve_propose)
        self.calls.register("propose_here", self._serve_propose_here)
        self.calls.register("status", self._serve_status)
        self.client_addresses: dict[int, str] = {self.node_id: config.listen}
        self.metadata: Replica | None = None
        self.swim = SwimDriver(
            self.node_id,
            meta={"peer": config.peer_listen, "client": config.listen},
            seeds=[a for n, a in config.peers.items() if n != self.node_id] + config.join,
        )
        self.placement = Placement(self)
        self.client_server = ClientServer(self)
        self.swim.subscribe(self.placement.on_member_event)

    # lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config.peers:
            initial = sorted({*self.config.peers, self.node_id})
            voters = tuple(initial[: self.config.metadata_replicas])
            learners = tuple(n for n in initial if n not in voters)
        else:  # joining a running cluster: the metadata leader adds this node as a learner
            voters, learners = (), (self.node_id,)
        self.metadata = Replica.open(
            METADATA_GROUP,
            self.node_id,
            self.config.data_dir / "metadata",
            LogConfig(retention_ms=None, max_batch_bytes=self.config.max_batch_bytes),
            ConfState(voters=voters, learners=learners),
            self._raft_config(deliver_committed=True),
            apply=self._apply_metadata,
            topic="__metadata",
        )
        self.runtime.add(self.metadata)
        # Clients first: once gossip announces this node, its client port must answer.
        await self.client_server.start()
        await self.peers.start()
        for node_id, address in self.config.peers.items():
            self.peers.add_peer(node_id, address)
        host, port = split_address(self.config.peer_listen)
        await self.swim.start(host, port)
        self.runtime.start()
        self._tasks = [
            asyncio.create_task(self._liveness_loop(), name="peer-liveness"),
            asyncio.create_task(self._retention_loop(), name="retention"),
            asyncio.create_task(self._placement_loop(), name="placement"),
        ]
        self.spawn(self._register())
        log.info(
            "node started",
            node_id=self.node_id,
            listen=self.config.listen,
            peer_listen=self.config.peer_listen,
            metadata_voters=voters,
        )

    async def stop(self) -> None:
        for task in [*self._tasks, *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        await self.client_server.stop()
        await self.swim.stop()
        await self.peers.stop()
        await self.runtime.stop()
        log.info("node stopped", node_id=self.node_id)

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _raft_config(self, deliver_committed: bool) -> RaftConfig:
        return RaftConfig(
            election_tick=self.config.election_ticks,
            heartbeat_tick=1,
            deliver_committed=deliver_committed,
            applied=-1,
        )

    async def _register(self) -> None:
        command = {
            "op": "register_node",
            "node_id": self.node_id,
            "client_address": self.config.listen,
            "peer_address": self.config.peer_listen,
        }
        while True:
            try:
                await self.propose_metadata(command)
                return
            except (LaminarError, ConnectionError) as exc:
                log.debug("registration not yet accepted", error=str(exc))
                await asyncio.sleep(0.2)

    # peers ---------------------------------------------------------------------------------
    def _send_raft(self, peer: int, messages: list[tuple[int, Any]]) -> None:
        self.peers.send_raft(peer, messages)

    def _raft_received(self, peer: int, messages: list[tuple[int, Any]]) -> None:
        step = self.runtime.step
        for group, message in messages:
            if message.to == self.node_id and message.frm == peer:
                step(group, message)

    def _other_received(self, peer: int, which: str, body: Any) -> None:
        self.calls.received(peer, which, body)

    def _peer_up(self, peer: int, peer_address: str, client_address: str) -> None:
        self.client_addresses[peer] = client_address
        log.info("peer connected", peer=peer, address=peer_address)
        self.runtime.node_up(peer)

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_ms / 1000)
            self.peers.check_liveness()

    def live_nodes(self) -> list[int]:
        return sorted(self.placement.live())

    async def _placement_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            try:
                self.placement.step()
            except Exception:
                log.exception("placement step failed")

    def address_of(self, node_id: int) -> str:
        info = self.state.nodes.get(node_id)
        if info is not None:
            return info.client_address
        return self.client_addresses.get(node_id, "")

    # metadata ------------------------------------------------------------------------------
    @property
    def metadata_leader(self) -> int:
        assert self.metadata is not None
        return self.metadata.raft.leader_id

    async def propose_metadata(self, command: dict[str, Any], timeout: float = 10.0) -> Any:
        """Commit a metadata command (forwarded to the metadata leader) and wait until applied
        on this node; returns the command's JSON-able result."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.metadata is not None
            leader = self.metadata.raft.leader_id
            try:
                if self.metadata.is_leader:
                    result = await self._propose_local(command)
                else:
                    # A node that just joined knows no leader yet: any peer forwards for it.
                    target = leader if leader and self.peers.connected(leader) else 0
                    target = target or next(iter(self.peers.connected_peers()), 0)
                    if not target:
                        raise NotLeaderError("no metadata leader known yet")
                    result = await self.calls.call(
                        target, "propose", command, max(0.1, deadline - time.monotonic())
                    )
                await self.wait_applied(result["index"], deadline - time.monotonic())
                return result
            except (NotLeaderError, ConnectionError):
                if time.monotonic() > deadline:
                    raise RequestTimeoutError("no metadata leader answered in time") from None
                await asyncio.sleep(0.05)

    async def _serve_propose(self, peer: int, command: dict[str, Any]) -> Any:
        """Commit on behalf of a peer, forwarding once to the leader if this node is not it."""
        assert self.metadata is not None
        if self.metadata.is_leader:
            return await self._propose_local(command)
        leader = self.metadata.raft.leader_id
        if leader and leader != peer and self.peers.connected(leader):
            return await self.calls.call(leader, "propose_here", command)
        raise NotLeaderError("not the metadata leader")

    async def _serve_propose_here(self, _peer: int, command: dict[str, Any]) -> Any:
        assert self.metadata is not None
        if not self.metadata.is_leader:
            raise NotLeaderError("not the metadata leader")
        return await self._propose_local(command)

    async def _propose_local(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.metadata is not None
        command = self._prepare(command)
        data = record_batch.build_batch([(None, encode_command(command), (), now_ms())])
        index, _ = self.metadata.raft.propose(data, 1)
        future = asyncio.get_running_loop().create_future()
        self._metadata_waiters[index] = future
        self.runtime.wake(self.metadata)
        try:
            result = await asyncio.wait_for(future, 10.0)
        except TimeoutError:
            raise RequestTimeoutError("metadata command did not commit in time") from None
        finally:
            self._metadata_waiters.pop(index, None)
        return {"index": index, "result": result}

    def _prepare(self, command: dict[str, Any]) -> dict[str, Any]:
        """On the metadata leader: turn a request into a deterministic command."""
        if command.get("op") != "create_topic" or "replicas" in command:
            return command
        validate_topic_name(command["name"])
        settings = TopicSettings(**command["settings"])
        load: dict[int, int] = {}
        for topic in self.state.topics.values():
            for assignment in topic.partitions:
                for node in assignment.replicas:
                    load[node] = load.get(node, 0) + 1
        replicas = place_replicas(
            settings.partitions, settings.replication_factor, self.live_nodes(), load
        )
        return {**command, "replicas": replicas}

    async def wait_applied(self, index: int, timeout: float) -> None:
        if self.metadata_applied >= index:
            return
        future = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, future))
        try:
            await asyncio.wait_for(future, max(timeout, 0.1))
        except TimeoutError:
            raise RequestTimeoutError("metadata change not yet applied on this node") from None

    def _apply_metadata(self, entry: Entry) -> None:
        """Apply one committed metadata entry (called by the runtime, in log order)."""
        future = self._metadata_waiters.pop(entry.index, None)
        try:
            record = record_batch.decode_records(entry.data)[0]
            command = decode_command(record.value or b"{}")
            result = self.state.apply(command)
            self._reconcile(command, result, entry.index)
            outcome: Any = _jsonable(result)
        except LaminarError as exc:
            outcome = exc
        except Exception as exc:  # a bad command must never stop the metadata group
            log.exception("metadata command failed", index=entry.index)
            outcome = InvalidRequestError(f"metadata command failed: {exc}")
        self.metadata_applied = entry.last
        if future is not None and not future.done():
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if self._applied_waiters:
            still = []
            for index, waiter in self._applied_waiters:
                if index <= self.metadata_applied:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((index, waiter))
            self._applied_waiters = still

    def _reconcile(self, command: dict[str, Any], result: Any, index: int) -> None:
        op = command["op"]
        if op == "create_topic" and isinstance(result, Topic):
            for partition, assignment in enumerate(result.partitions):
                if self.node_id in assignment.replicas:
                    self._open_partition(result, partition, index)
        elif op == "delete_topic" and isinstance(result, Topic):
            for partition in range(len(result.partitions)):
                replica = self.runtime.remove(group_id(result.topic_id, partition))
                if replica is not None:
                    self.spawn(self._delete_files(replica))
        elif op == "register_node" and result.node_id != self.node_id:
            self.peers.add_peer(result.node_id, result.peer_address)
        elif op == "start_move" and result is not None and result.adding == self.node_id:
            topic = self.state.topic_by_id(command["topic_id"])
            if topic is not None:
                self._open_partition(topic, command["partition"], index)
        elif op == "finish_move" and result is not None and command["from"] == self.node_id:
            topic = self.state.topic_by_id(command["topic_id"])
            if topic is not None:
                replica = self.runtime.remove(group_id(topic.topic_id, command["partition"]))
                if replica is not None:
                    log.info("replica moved away", topic=topic.name, partition=replica.partition)
                    self.spawn(self._delete_files(replica))

    async def _delete_files(self, replica: Replica) -> None:
        while not replica.log_closed:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(shutil.rmtree, replica.directory, True)

    def partition_dir(self, topic: Topic, partition: int, origin: int) -> Path:
        """One directory per assignment: a replica assigned again later (a move back) starts
        fresh instead of reusing the Raft vote and log of a membership it has left."""
        name = f"{topic.name}-{partition}.{topic.topic_id}.{origin}"
        return self.config.data_dir / "partitions" / name

    def _open_partition(self, topic: Topic, partition: int, origin: int) -> None:
        """Open (or create) this node's replica; ``origin`` is the metadata offset of the
        command that assigned it (see ``partition_dir``)."""
        group = group_id(topic.topic_id, partition)
        if group in self.runtime.replicas:
            return
        settings = topic.settings
        assignment = topic.partitions[partition]
        replicas = assignment.replicas
        directory = self.partition_dir(topic, partition, origin)
        if self.node_id in replicas:
            conf = ConfState(voters=tuple(replicas))
        else:  # the target of a move joins as a learner
            conf = ConfState(voters=tuple(replicas), learners=(self.node_id,))
        replica = Replica.open(
            group,
            self.node_id,
            directory,
            LogConfig(
                segment_bytes=settings.segment_bytes,
                segment_ms=settings.segment_ms,
                retention_ms=settings.retention_ms,
                retention_bytes=settings.retention_bytes,
                max_batch_bytes=self.config.max_batch_bytes,
            ),
            conf,
            self._raft_config(deliver_committed=False),
            topic=topic.name,
            partition=partition,
        )
        self.runtime.add(replica)
        if replicas[0] == self.node_id and replica.raft.term == 0 and not assignment.moving:
            replica.raft.campaign()  # the preferred leader starts the first election at once
            self.runtime.wake(replica)

    def _leader_changed(self, replica: Replica) -> None:
        if replica.group == METADATA_GROUP or not replica.is_leader:
            return
        topic = self.state.topics.get(replica.topic)
        if topic is None:
            return
        command = {
            "op": "set_leader",
            "topic_id": topic.topic_id,
            "partition": replica.partition,
            "leader": self.node_id,
            "term": replica.raft.term,
        }
        self.spawn(self._report_leader(replica, command))

    async def _report_leader(self, replica: Replica, command: dict[str, Any]) -> None:
        for _ in range(50):
            if not replica.is_leader or replica.raft.term != command["term"]:
                return
            try:
                await self.propose_metadata(command)
                return
            except (LaminarError, ConnectionError):
                await asyncio.sleep(0.1)

    # topics --------------------------------------------------------------------------------
    def settings_for(self, spec: dict[str, Any]) -> TopicSettings:
        config = self.config
        retention_ms = spec.get("retention_ms") or config.default_retention_ms
        return TopicSettings(
            partitions=spec["partitions"],
            replication_factor=spec["replication_factor"],
            segment_bytes=spec.get("segment_bytes") or config.default_segment_bytes,
            segment_ms=spec.get("segment_ms") or config.default_segment_ms,
            retention_ms=None if retention_ms < 0 else retention_ms,
            retention_bytes=spec.get("retention_bytes") or None,
        )

    def replica_for(self, topic_name: str, partition: int) -> Replica | None:
        topic = self.state.topics.get(topic_name)
        if topic is None:
            return None
        return self.runtime.replicas.get(group_id(topic.topic_id, partition))

    # retention -----------------------------------------------------------------------------
    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_ms / 1000)
            self.expire_segments()

    def expire_segments(self) -> int:
        deleted = 0
        now = now_ms()
        for replica in list(self.runtime.replicas.values()):
            if replica.group == METADATA_GROUP or replica.closed:
                continue
            deleted += replica.log.expire(now, upto=replica.high_watermark)
        return deleted

    # status --------------------------------------------------------------------------------
    def local_status(self) -> list[dict[str, Any]]:
        """Status of every partition this node leads (leaders know their followers' lag)."""
        out = []
        for replica in self.runtime.replicas.values():
            if replica.group == METADATA_GROUP or not replica.is_leader:
                continue
            status = replica.raft.status()
            end = replica.log.end_offset
            replicas = []
            for node_id in (*replica.raft.conf.voters, *replica.raft.conf.learners):
                if node_id == self.node_id:
                    match = end - 1
                else:
                    progress = status.progress.get(node_id)
                    match = progress.match if progress is not None else -1
                replicas.append({"node_id": node_id, "match": match, "lag": end - 1 - match})
            out.append(
                {
                    "topic": replica.topic,
                    "partition": replica.partition,
                    "leader": self.node_id,
                    "term": replica.raft.term,
                    "start_offset": replica.log.start_offset,
                    "high_watermark": replica.high_watermark,
                    "end_offset": end,
                    "replicas": replicas,
                }
            )
        return out

    def move_stage(self, topic: Topic, partition: int) -> str:
        """Where a move stands, as far as this node can tell."""
        replica = self.runtime.replicas.get(group_id(topic.topic_id, partition))
        assignment = topic.partitions[partition]
        if replica is None or not replica.is_leader:
            return "in progress"
        conf = replica.raft.conf
        if assignment.adding in conf.learners:
            return "target catching up"
        if assignment.adding in conf.voters and assignment.removing in conf.voters:
            return "removing source"
        if assignment.adding in conf.voters:
            return "finishing"
        return "adding target"

    async def _serve_status(self, _peer: int, _body: Any) -> Any:
        return self.local_status()

    async def cluster_partitions(self) -> list[dict[str, Any]]:
        """Gather every leader's view of its partitions from all connected nodes."""
        peers = [n for n in self.live_nodes() if n != self.node_id]
        results = await asyncio.gather(
            *(self.calls.call(n, "status", None, timeout=2.0) for n in peers),
            return_exceptions=True,
        )
        partitions = self.local_status()
        for result in results:
            if isinstance(result, list):
                partitions.extend(result)
        partitions.sort(key=lambda p: (p["topic"], p["partition"]))
        return partitions


def _jsonable(result: Any) -> Any:
    if result is None or isinstance(result, int | str):
        return result
    try:
        return asdict(result)
    except TypeError:
        return None
