"""The laminar node: hosts the metadata replica and partition replicas, wires them together.

Start-up order: open the metadata group (its replay re-creates every local partition replica),
listen for peers and clients, start the Multi-Raft tasks, then register this node's addresses
in the metadata (retried until it sticks).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import shutil
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

import structlog

from laminar.auth.acl import Authorizer
from laminar.auth.admin import AuthAdmin
from laminar.errors import (
    LaminarError,
)
from laminar.groups.service import INTERNAL_TOPIC, GroupService
from laminar.kafka.broker import NodeBroker
from laminar.kafka.server import KafkaServer
from laminar.membership.driver import TICK_SECONDS, SwimDriver
from laminar.membership.swim import SwimConfig
from laminar.node import boot
from laminar.node.admission import ProduceAdmission
from laminar.node.amnesia import Amnesia
from laminar.node.calls import PeerCalls
from laminar.node.client_api import ClientServer
from laminar.node.config import NodeConfig
from laminar.node.disk import DiskSpace
from laminar.node.handoff import hand_off_leadership
from laminar.node.health import node_part
from laminar.node.leader_reports import LeaderReports
from laminar.node.metadata import (
    METADATA_GROUP,
    MetadataState,
    Topic,
    TopicSettings,
    group_id,
)
from laminar.node.metadata_checkpoint import METADATA_MAX_BATCH
from laminar.node.metadata_service import MetadataService, now_ms
from laminar.node.metrics import RequestStats
from laminar.node.observability import Observability
from laminar.node.peers import PeerNetwork
from laminar.node.placement import Placement
from laminar.node.readmission import IdentityCheck, Readmission
from laminar.node.repair import Broken, ReplicaRepair
from laminar.node.replica import LOG_DIR, Replica
from laminar.node.runtime import MultiRaft
from laminar.node.send_gate import PeerBacklog
from laminar.node.state_journal import JOURNAL_FILE, StateJournal
from laminar.node.status import local_status
from laminar.node.tail_checkpoint import TailCheckpoint, TailSource
from laminar.node.topic_admin import TopicAdmin, log_config
from laminar.queues.partition import ShareConfig
from laminar.queues.service import QueueService
from laminar.raft import ConfState, MessageType, RaftConfig
from laminar.segment.descriptors import DescriptorCache
from laminar.segment.fileio import filesystem_syncer, lock_directory
from laminar.segment.log import LogConfig
from laminar.segment.prefetch import warm
from laminar.splits.retire import retention_upto
from laminar.splits.service import SplitService
from laminar.transport import split_address

log = structlog.get_logger(__name__)

GROUP_TOPIC_CHANGES = frozenset(
    (
        "create_topic",
        "delete_topic",
        "add_partitions",
        "register_node",
        "finish_move",
        "begin_split",
        "begin_merge",
        "finish_op",
        "retire_partition",
    )
)
BEGIN_OPS = ("begin_split", "begin_merge")
OPEN_AT_ONCE = 64
"""Replicas opened in one event-loop iteration when a topic is created or grown ..."""
FIRST_ELECTION_GRACE = 2
"""Election timeouts a new group's non-preferred replicas wait, beyond their own, before
they campaign (the preferred replica campaigns as soon as it opens)."""
UNCALLED_TIMEOUTS = 2
"""Election timeouts in which no leader called a restarted node's resting replicas before
it wakes them (leaders call a slice of their groups at a time, ``MultiRaft.node_up``)."""
CHECK_QUORUM_TIMEOUTS = 3
"""Election timeouts a leader goes without hearing from a majority before it steps down."""
OPEN_SLICE_SECONDS = 0.02
"""... or fewer, once opening took this long: peers must not see this node stall."""


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.state = MetadataState()
        self._background: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.amnesia = Amnesia(config.data_dir)
        self.states = StateJournal(config.data_dir / JOURNAL_FILE)
        self.tail_checkpoint = TailCheckpoint(config.data_dir)
        self.descriptors = DescriptorCache(config.max_open_log_files or None)
        self._partitions_dir = config.data_dir / "partitions"  # (see partition_dir)
        self._seeds = random.Random()
        """Seeds each Raft core's generator of election timeouts: one seeded from os.urandom
        per replica cost 15 us, a tenth of a second for 10,000 replicas opening."""
        self._dir_lock = -1  # flock on data_dir: the replicas' logs take none of their own
        self.runtime = MultiRaft(
            self.node_id,
            config.tick_ms / 1000,
            self._send_raft,
            self._leader_changed,
            on_replica_failed=lambda replica, error: self.repair.replica_failed(replica, error),
            may_campaign=self.amnesia.may_campaign,
            before_cut=self.amnesia.cutting,
            before_release=self.amnesia.sync_markers,
            flush_threads=config.flush_threads,
            backlog=PeerBacklog(lambda peer: self.peers.unsent_bytes(peer)),
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
            server_ssl=config.security.tls.server_context("peer"),
            client_ssl=config.security.tls.peer_client_context(),
        )
        self.calls = PeerCalls(self.peers)
        self.metadata_service = MetadataService(self)
        self.calls.register("propose", self.metadata_service.serve_propose)
        self.calls.register("propose_here", self.metadata_service.serve_propose_here)
        self.calls.register("status", self._serve_status)
        self.calls.register("health", self._serve_health)
        amnesia, service, spawn = self.amnesia, self.metadata_service, self.spawn
        self.readmission = Readmission(self.node_id, amnesia, self.runtime, service.propose, spawn)
        host = self.readmission.opened
        self.repair = ReplicaRepair(self.node_id, self.state, self.runtime, amnesia, host, spawn)
        self.identity = IdentityCheck(config, self.calls, self.peers, self.state, service)
        self.calls.register("knows", self.identity.serve_knows)
        self.client_addresses: dict[int, str] = {self.node_id: config.listen}
        self.joined = False
        """This node has heard of a metadata leader since it started, with its gossip running:
        before, a restarting node knows no peer's state (``health.cluster_health``)."""
        self.metadata: Replica | None = None
        self._opening: set[asyncio.Task[None]] = set()
        """Running ``_open_partitions`` tasks (a restart waits for them, see start)."""
        self._synced_at_start = False
        """A restart made the data directory's filesystem durable (one syncfs) and has
        not yet talked to a peer: the replicas it opens need no fdatasync of their own."""
        self._same_boot = False
        """A restart in the boot the node last started in (``boot``): the replicas it found
        walk their logs' tails by batch headers instead of crc-checking them."""
        self._found_dirs: set[str] | None = None
        """While a restart opens the replicas it found: the replica directories there are
        (one listing instead of a stat per replica, a tenth of opening one)."""
        self.swim = SwimDriver(
            self.node_id,
            meta={"peer": config.advertise_peer, "client": config.listen},
            config=SwimConfig(reap_after_ticks=round(config.reap_after_ms / 1000 / TICK_SECONDS)),
            seeds=[a for n, a in config.peers.items() if n != self.node_id] + config.join,
            advertise=config.advertise_peer,
            keyring=config.security.gossip_keyring(),
            incarnation=time.time_ns() // 1_000_000,  # (above any a previous life reached)
        )
        self.placement = Placement(self)
        self.groups = GroupService(
            config.groups,
            self.state,
            self.runtime,
            self.calls,
            service.propose,
            self.address_of,
            self.live_nodes,
        )
        self.queues = QueueService(
            ShareConfig(),
            lambda: self.state.queue_configs,
            self.metadata_service.wait_caught_up,
            self.runtime,
            lambda: config.listen,
            lambda: max(1, min(3, len(self.live_nodes()))),
            client_ssl=config.security.tls.own_client_context(),
            login=lambda: self.state.auth.internal_login(),
        )
        self.authorizer = Authorizer(lambda: self.state.auth)
        self.auth_admin = AuthAdmin(service.propose, lambda: self.state.auth)
        self.topic_admin = TopicAdmin(
            service.propose, self.state, self.settings_for, config.max_batch_bytes
        )
        self.disk = DiskSpace(config.data_dir, config.min_free_bytes)
        self.leader_reports = LeaderReports(
            self.node_id, service.propose, self._topic_id_of, config.tick_ms / 1000
        )
        self.request_stats = RequestStats()
        self.produce_admission = ProduceAdmission(config.max_produce_batches_in_flight)
        self.client_server = ClientServer(self)
        self.splits = SplitService(
            self.node_id, self.state, self.client_server.io, self.replica_for,
            self.runtime.process_now, self.calls.call, service.propose,
            lambda: self.metadata is not None and self.metadata.is_leader,
        )  # fmt: skip
        self.calls.register("seal_partition", self.splits.serve_seal)
        self.calls.register("split_load", self.splits.serve_load)
        self.calls.register("split_starts", self.splits.serve_starts)
        self.kafka_server = KafkaServer(NodeBroker(self)) if config.kafka_listen else None
        self.swim.subscribe(self.placement.on_member_event)
        self.observability = Observability(self) if config.metrics_listen else None

    # lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = lock_directory(self.config.data_dir)  # one node per data directory
        # (held open for the node's life, so a syncfs through it sees every writeback error)
        self.runtime.sync_filesystem = filesystem_syncer(self._dir_lock)
        try:
            await self._start()
        except BaseException:
            self._unlock_data_dir()
            raise

    def _unlock_data_dir(self) -> None:
        fd, self._dir_lock = self._dir_lock, -1
        if fd >= 0:
            os.close(fd)

    async def _start(self) -> None:
        if self.observability is not None:  # first: /healthz and /readyz answer during start-up
            await self.observability.start()
        self.disk.check()
        known_dir = self.amnesia.load_identity(self.config.cluster_id, self.node_id)
        if not known_dir:  # new, or lost everything: its peers know which
            await self._start_network()
            self.amnesia.node_lost = await self.identity.ask_peers_if_known()
            self.amnesia.save_identity()
        if self.config.peers:
            initial = sorted({*self.config.peers, self.node_id})
            voters = tuple(initial[: self.config.metadata_replicas])
            learners = tuple(n for n in initial if n not in voters)
        else:  # joining a running cluster: the metadata leader adds this node as a learner
            voters, learners = (), (self.node_id,)
        self.states.open()  # (after the identity check: it asks whether the directory is empty)
        # One syncfs instead of an fdatasync per log opened while restarting (see
        # PartitionLog.open): 3,000 of those took about a second.
        syncfs = self.runtime.sync_filesystem  # (through the data-directory lock)
        if known_dir and syncfs is not None:
            syncfs()
            self._synced_at_start = True
        self._same_boot = known_dir and boot.same_boot(self.config.data_dir)
        self.tail_checkpoint.load(self._same_boot)
        metadata_dir = self.config.data_dir / "metadata"
        lost = self.amnesia.opening(METADATA_GROUP, "metadata", metadata_dir)
        self.metadata = Replica.open(
            METADATA_GROUP,
            self.node_id,
            metadata_dir,
            LogConfig(retention_ms=None, max_batch_bytes=METADATA_MAX_BATCH),
            ConfState(voters=voters, learners=learners),
            self._raft_config(deliver_committed=True),
            apply=self.metadata_service.apply,
            apply_gap=self.metadata_service.apply_gap,
            roll_at_control=True,
            topic="__metadata",
            states=self.states,
            descriptors=self.descriptors,
            synced=self._synced_at_start,
            same_boot=self._same_boot,
            resume=self.tail_checkpoint.take(metadata_dir.name),
        )
        self.metadata.saves_commit = True
        self.identity.metadata_start = self.metadata.raft.last_index
        self.readmission.opened(self.metadata, lost)
        # Clients first: once gossip announces this node, its client port must answer.
        await self.client_server.start()
        if self.kafka_server is not None:
            tls = self.config.security.tls.server_context("kafka")
            await self.kafka_server.start(self.config.kafka_listen, tls)
        if known_dir:
            await self._open_known_partitions()
            self._synced_at_start = False  # replicas opened from now on sync their own tails
            self._same_boot = False  # ... and check them
            self.runtime.rest(r for r in self.runtime.replicas.values() if r is not self.metadata)
            await self._start_network()
            election_timeout = self.config.tick_ms * self.config.election_ticks / 1000
            self.spawn(self.runtime.wake_uncalled(UNCALLED_TIMEOUTS * election_timeout))
        boot.note_boot(self.config.data_dir)  # (once every replica found was checked)
        self.groups.start()
        self.queues.start()
        self.splits.start()
        self._tasks = [
            asyncio.create_task(self._liveness_loop(), name="peer-liveness"),
            asyncio.create_task(self._retention_loop(), name="retention"),
            asyncio.create_task(self._placement_loop(), name="placement"),
            asyncio.create_task(self.readmission.watermark_loop(), name="watermarks"),
            asyncio.create_task(self.disk.watch(), name="disk-space"),
            asyncio.create_task(self.leader_reports.run(), name="leader-reports"),
            asyncio.create_task(self.metadata_service.checkpoint_loop(), name="md-checkpoint"),
            asyncio.create_task(
                self.tail_checkpoint.run(self._tail_sources, self._moved_tail_sources),
                name="tails",
            ),
        ]
        self.spawn(self._register())
        log.info(
            "node started",
            node_id=self.node_id,
            listen=self.config.listen,
            peer_listen=self.config.peer_listen,
            kafka_listen=self.config.kafka_listen or None,
            metadata_voters=voters,
        )

    async def _open_known_partitions(self) -> None:
        """A restart: apply what the metadata log holds as committed and open the replicas
        it assigns here before any peer is heard. Opened while peers were connected, each
        replica not yet open made its leader probe it every tick in vain, and the thousands
        of such probes took the CPU the opening needed (3,000 partitions: 12 s to open)."""
        assert self.metadata is not None
        try:
            self._found_dirs = set(os.listdir(self._partitions_dir))
        except FileNotFoundError:
            self._found_dirs = set()
        warming = warm([f"{self._partitions_dir}/{name}/{LOG_DIR}" for name in self._found_dirs])
        try:
            self.runtime.process_now(self.metadata)
            while self._opening:
                await asyncio.gather(*self._opening)
        finally:
            self._found_dirs = None
            warming.stop()
        opened = list(self.runtime.replicas.values())
        log.info(
            "replicas opened",
            replicas=len(opened),
            from_tail_checkpoint=sum(replica.storage.resumed for replica in opened),
        )

    async def _start_network(self) -> None:
        # The Raft runtime runs before any peer is heard: without its flush passes nothing a
        # peer sends becomes durable or acknowledged, and a restarted node with thousands of
        # replicas spent its first seconds on the network taking in appends it could not
        # acknowledge (its leaders wake their groups a slice at a time, waiting on those).
        # (Every start runs this once, a new node's early to ask its peers about itself.)
        self.runtime.start()
        await self.peers.start()
        for node_id, address in self.config.peers.items():
            self.peers.add_peer(node_id, address)
        host, port = split_address(self.config.peer_listen)
        await self.swim.start(host, port)

    async def shutdown(self) -> None:
        """Stop gracefully: leave the gossip (so no peer hands leadership back), give away
        every leadership (``handoff.py``), then stop."""
        timeout = self.config.shutdown_handoff_ms / 1000
        if timeout > 0 and self.metadata is not None:
            await self.swim.leave(linger_seconds=0)
            await hand_off_leadership(
                self.node_id,
                lambda: list(self.runtime.replicas.values()),
                self.placement.live,
                self._leader_on_record,
                self.runtime.wake,
                timeout,
            )
        await self.stop()

    def _leader_on_record(self, replica: Replica) -> int:
        """The leader the metadata names for ``replica``'s partition, while a live metadata
        leader can still change that record (else 0)."""
        topic = self.state.topics.get(replica.topic)
        if replica.group == METADATA_GROUP or topic is None or self.metadata is None:
            return 0
        recorder = self.metadata.raft.leader_id
        if recorder not in self.placement.live():  # includes this node, never 0
            return 0
        if replica.partition >= len(topic.partitions):
            return 0
        return topic.partitions[replica.partition].leader

    async def stop(self) -> None:
        await _bounded("tasks", _cancel_all([*self._tasks, *self._background]))
        await _bounded("client server", self.client_server.stop())
        if self.kafka_server is not None:
            await _bounded("kafka server", self.kafka_server.stop())
        if self.observability is not None:
            await _bounded("observability", self.observability.stop())
        await _bounded("groups", self.groups.stop())
        await _bounded("queues", self.queues.stop())
        await _bounded("splits", self.splits.stop())
        await _bounded("gossip", self.swim.stop())
        await _bounded("peers", self.peers.stop())
        if self.metadata is not None:  # (started: its replicas are open)
            await _bounded("tail checkpoint", self._save_tails())
        await self.runtime.stop()  # (unbounded: it makes every log durable)
        self.states.close()
        self._unlock_data_dir()
        log.info("node stopped", node_id=self.node_id)

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def spawn_opening(self, coroutine: Any) -> None:
        """Open replicas in the background; a restart waits for them before it talks to
        peers (``_open_known_partitions``)."""
        opening = self.spawn(coroutine)
        self._opening.add(opening)
        opening.add_done_callback(self._opening.discard)

    def _raft_config(self, deliver_committed: bool) -> RaftConfig:
        return RaftConfig(
            election_tick=self.config.election_ticks,
            # A leader keeps leading through a follower slow to answer (a starved CPU): a dead
            # one is noticed by the peer liveness checks (PeerNetwork) instead.
            check_quorum_tick=CHECK_QUORUM_TIMEOUTS * self.config.election_ticks,
            heartbeat_tick=1,
            deliver_committed=deliver_committed,
            # (the metadata group: any node answers reads of it, just after a change too)
            prompt_commit=deliver_committed,
            applied=-1,
            seed=self._seeds.getrandbits(64),
        )

    async def _register(self) -> None:
        command = {
            "op": "register_node",
            "node_id": self.node_id,
            "client_address": self.config.listen,
            "peer_address": self.config.advertise_peer,
            "incarnation": self.amnesia.incarnation,
            "rack": self.config.rack,
            "kafka_address": self.config.kafka_advertise,
        }
        while True:
            try:
                await self.metadata_service.propose(command)
                return
            except (LaminarError, ConnectionError) as exc:
                log.debug("registration not yet accepted", error=str(exc))
                await asyncio.sleep(0.2)

    # peers ---------------------------------------------------------------------------------
    def _send_raft(self, peer: int, messages: list[tuple[int, Any]]) -> None:
        if self.amnesia.gated:
            messages = self.amnesia.outgoing(messages)
        self.peers.send_raft(peer, messages)

    def _raft_received(self, peer: int, messages: list[tuple[int, Any]]) -> None:
        step = self.runtime.step
        amnesia = self.amnesia if self.amnesia.filtering else None
        disk = self.disk
        for group, message in messages:
            if (
                message.to == self.node_id
                and message.frm == peer
                and (amnesia is None or amnesia.admits(group, message))
                and (
                    group == METADATA_GROUP
                    or not (size := _log_bytes(message))
                    or disk.accepting(size)
                )
            ):
                step(group, message)

    def _other_received(self, peer: int, which: str, body: Any) -> None:
        self.calls.received(peer, which, body)

    def _peer_up(self, peer: int, peer_address: str, client_address: str) -> None:
        self.client_addresses[peer] = client_address
        log.info("peer connected", peer=peer, address=peer_address)
        self.runtime.node_up(peer)
        # Reaped by the gossip, yet reachable again: rejoin. (A hello can arrive while the
        # gossip is still starting, which joins its seeds by itself: asking it then failed,
        # and closed the connection, on every restart of a node with many partitions.)
        if self.swim.started and self.swim.member(peer) is None:
            self.swim.rejoin(peer_address)

    async def _liveness_loop(self) -> None:
        tick = self.config.tick_ms / 1000
        while True:  # (every tick until joined: the join waits for this check)
            await asyncio.sleep(max(tick, self.peers.check_every) if self.joined else tick)
            self.peers.check_liveness()
            if not self.joined and self.swim.started and self.metadata_leader:
                self.joined = True

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

    def reconcile(self, command: dict[str, Any], result: Any, index: int) -> None:
        op = command["op"]
        if op in GROUP_TOPIC_CHANGES:
            self.groups.topics_changed()  # partition counts, or where replicas (racks) are
        if op in ("create_topic", "add_partitions", *BEGIN_OPS) and isinstance(result, Topic):
            hosted = [
                partition
                for partition in range(command.get("from", 0), len(result.partitions))
                if self.node_id in result.partitions[partition].replicas
            ]
            if len(hosted) <= OPEN_AT_ONCE:
                for partition in hosted:
                    self._open_partition(result, partition, index)
            else:
                self.spawn_opening(self._open_partitions(result, hosted, index))
        elif op == "alter_topic" and isinstance(result, Topic):
            for partition in range(len(result.partitions)):
                replica = self.runtime.replicas.get(group_id(result.topic_id, partition))
                if replica is not None:
                    replica.log.config = self._log_config(result.settings)
        elif op == "delete_topic" and isinstance(result, Topic):
            for partition in range(len(result.partitions)):
                replica = self.runtime.remove(group_id(result.topic_id, partition))
                if replica is not None:
                    self.spawn(self._delete_files(replica))
        elif op == "retire_partition" and result is not None:  # laminar.splits.retire
            replica = self.runtime.remove(group_id(command["topic_id"], command["partition"]))
            if replica is not None:
                self.spawn(self._delete_files(replica))
        elif op == "register_node" and result.node_id != self.node_id:
            self.peers.add_peer(result.node_id, result.peer_address)
        elif op == "forget_node" and result != self.node_id:
            self.peers.remove_peer(result)
        elif op in ("register_node", "replica_recovered"):
            self.readmission.applied(command)
        elif op == "start_move" and result is not None and result.adding == self.node_id:
            topic = self.state.topic_by_id(command["topic_id"])
            if topic is not None:
                self._open_partition(topic, command["partition"], index)
                self.spawn(self._report_move_target_ready(command, index))
        elif result is not None and (
            (op == "finish_move" and command["from"] == self.node_id)
            or (op == "abort_move" and command["to"] == self.node_id)
        ):
            topic = self.state.topic_by_id(command["topic_id"])
            if topic is not None:
                replica = self.runtime.remove(group_id(topic.topic_id, command["partition"]))
                if replica is not None:
                    log.info("replica moved away", topic=topic.name, partition=replica.partition)
                    self.spawn(self._delete_files(replica))

    async def _open_partitions(self, topic: Topic, partitions: list[int], origin: int) -> None:
        """Open many new replicas a few at a time, so the event loop keeps serving peers and
        clients meanwhile (a big topic's replicas would otherwise block it for seconds)."""
        clock = time.perf_counter
        position = 0
        while position < len(partitions):
            if self.state.topics.get(topic.name) is not topic:
                return  # deleted (or re-created) meanwhile
            started = clock()
            for partition in partitions[position : position + OPEN_AT_ONCE]:
                self._open_partition(topic, partition, origin)
                position += 1
                if clock() - started > OPEN_SLICE_SECONDS:
                    break
            await asyncio.sleep(0)

    async def _report_move_target_ready(self, command: dict[str, Any], index: int) -> None:
        """Tell the partition's leader, through the metadata, that this node applied the
        move's ``start_move`` (at ``index``): only then may it add this node to the Raft group
        (see ``PartitionAssignment.target_ready``). Retried until recorded or the move is over.

        Said only once this node's metadata log holds the command durably, so that a restart
        never replays to a point where an older replica of the group was still hosted here."""
        topic_id, partition, move_id = (
            command["topic_id"],
            command["partition"],
            command["request_id"],
        )
        ready = {
            "op": "move_target_ready",
            "topic_id": topic_id,
            "partition": partition,
            "to": self.node_id,
            "move_id": move_id,
            "request_id": f"ready-{move_id}",
        }
        while True:
            topic = self.state.topic_by_id(topic_id)
            if topic is None or partition >= len(topic.partitions):
                return
            assignment = topic.partitions[partition]
            if assignment.move_id != move_id or assignment.target_ready:
                return  # recorded, or the move is over (also: a replay of an old move)
            metadata = self.metadata
            if metadata is None or metadata.closed or metadata.log.durable_offset <= index:
                await asyncio.sleep(0.05)  # the group commit makes it durable within a pass
                continue
            try:
                await self.metadata_service.propose(ready)
                return
            except (LaminarError, ConnectionError) as exc:
                log.debug("move target readiness not yet recorded", error=str(exc))
                await asyncio.sleep(0.2)

    async def _delete_files(self, replica: Replica) -> None:
        self.amnesia.closed(replica.group)
        await replica.log_closed.wait()
        await asyncio.to_thread(shutil.rmtree, replica.directory, True)
        self.states.forget(replica.directory.name)
        self.tail_checkpoint.forget(replica.directory.name)
        self.amnesia.forget(replica.directory.name)

    def partition_dir(self, topic: Topic, partition: int, origin: int) -> Path:
        """One directory per assignment: a replica assigned again later (a move back) starts
        fresh instead of reusing the Raft vote and log of a membership it has left."""
        name = f"{topic.name}-{partition}.{topic.topic_id}.{origin}"
        return self._partitions_dir / name

    def _open_partition(self, topic: Topic, partition: int, origin: int) -> None:
        """Open (or create) this node's replica; ``origin`` is the metadata offset of the
        command that assigned it (see ``partition_dir``). A new replica's marker is made
        durable by the next flush pass, before anything the replica says leaves
        (``MultiRaft.before_release``)."""
        group = group_id(topic.topic_id, partition)
        if group in self.runtime.replicas:
            return
        settings = topic.settings
        assignment = topic.partitions[partition]
        replicas = assignment.replicas
        directory = self.partition_dir(topic, partition, origin)
        # (one look serves the marker and the saved state)
        found = self._found_dirs
        exists = directory.exists() if found is None else directory.name in found
        lost = self.amnesia.opening(group, directory.name, directory, durable=False, exists=exists)
        if self.node_id in replicas:
            conf = ConfState(voters=tuple(replicas))
        else:  # the target of a move joins as a learner
            conf = ConfState(voters=tuple(replicas), learners=(self.node_id,))
        log_config = self._log_config(settings)
        opener = functools.partial(
            Replica.open,
            group,
            self.node_id,
            directory,
            log_config,
            conf,
            self._raft_config(deliver_committed=False),
            topic=topic.name,
            partition=partition,
            states=self.states,
            descriptors=self.descriptors,
        )
        resume = self.tail_checkpoint.take(directory.name)
        try:
            replica = opener(
                synced=self._synced_at_start,
                same_boot=self._same_boot,
                exists=exists,
                resume=resume,
            )
        except (LaminarError, OSError) as exc:  # damaged files: this partition alone is offline
            closed = asyncio.Event()
            closed.set()
            broken = Broken(group, topic.name, partition, directory, log_config, opener, closed)
            self.repair.open_failed(broken, exc)
            return
        lost = self.readmission.opened(replica, lost)
        if (
            replicas[0] == self.node_id
            and replica.raft.term == 0
            and not assignment.moving
            and not lost
        ):
            replica.raft.campaign()  # the preferred leader starts the first election at once
            self.runtime.wake(replica)
        elif replica.raft.term == 0 and not assignment.moving:
            # The other replicas of a new group give the preferred one a head start: thousands
            # of groups created at once otherwise split their first votes between candidates.
            replica.raft.election_elapsed = -FIRST_ELECTION_GRACE * self.config.election_ticks

    def _tail_sources(
        self, replicas: Iterable[Replica] | None = None
    ) -> list[tuple[str, TailSource]]:
        """The open replicas' logs (or those of ``replicas``), by directory name
        (``tail_checkpoint``)."""
        if replicas is None:
            replicas = self.runtime.replicas.values()
        return [(r.directory.name, r.storage) for r in replicas if not r.closed]

    async def _save_tails(self) -> None:
        """Every log's tail as the node stops (``tail_checkpoint``)."""
        await self.tail_checkpoint.capture_all(self._tail_sources())
        await self.tail_checkpoint.save()

    def _moved_tail_sources(self) -> list[tuple[str, TailSource]]:
        """The logs a flush pass synced since the last call: only their tails moved."""
        moved, self.runtime.tails_moved = self.runtime.tails_moved, set()
        return self._tail_sources(moved)

    def _log_config(self, settings: TopicSettings) -> LogConfig:
        return log_config(settings, self.config.max_batch_bytes)

    def _leader_changed(self, replica: Replica) -> None:
        self.request_stats.leader_changed(replica.topic)
        self.placement.leadership_changed(replica)
        if replica.topic == INTERNAL_TOPIC:
            self.groups.leader_changed(replica)
        elif replica.group != METADATA_GROUP:
            self.queues.leader_changed(replica)
        if replica.group == METADATA_GROUP and not replica.is_leader:
            self.metadata_service.leadership_lost()
        if replica.group == METADATA_GROUP or not replica.is_leader:
            return
        self.leader_reports.became_leader(replica)

    def _topic_id_of(self, name: str) -> int | None:
        topic = self.state.topics.get(name)
        return None if topic is None else topic.topic_id

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
            partitioning=spec.get("partitioning") or "hash",
            auto_split_above=spec.get("auto_split_above") or 0,
            auto_merge_below=spec.get("auto_merge_below") or 0,
            auto_window_ms=spec.get("auto_window_ms") or 60_000,
            max_partitions=spec.get("max_partitions") or 0,
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
            try:
                deleted += replica.log.expire(now, upto=retention_upto(replica, self.state.topics))
            except Exception as exc:  # a storage fault stays in its partition
                self.runtime.fail(replica, exc)
        return deleted

    async def _serve_status(self, _peer: int, _body: Any) -> Any:
        return local_status(self)

    async def _serve_health(self, _peer: int, _body: Any) -> Any:
        return node_part(self)


_APPEND, _RESET = MessageType.APPEND, MessageType.RESET  # (read once: called per message)


def _log_bytes(message: Any) -> int:
    """Bytes a Raft message would make this follower write (entries, or a reset); while the
    disk is full such messages are ignored, unacknowledged, so the leader retries them later
    as it does lost ones."""
    if message.type == _APPEND:
        return sum(len(entry.data) for entry in message.entries)
    return 1 if message.type == _RESET else 0


STOP_PHASE_S = 10.0
"""How long one service may take to stop before the node goes on without it."""


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _bounded(phase: str, stopping: Coroutine[Any, Any, None]) -> None:
    """Stop one service, giving up on it after ``STOP_PHASE_S``: whatever it still waits for
    (a client's request that never ends, say) must not keep the node from stopping and
    making its logs durable; the log names the phase that overran. Twice a test's node
    (share groups, dead-letter copies) took minutes to stop in a whole-suite run."""
    task = asyncio.ensure_future(stopping)
    done, _ = await asyncio.wait({task}, timeout=STOP_PHASE_S)
    if not done:
        log.error("a service did not stop in time; going on without it", phase=phase)
        task.cancel()
        return
    task.result()  # (its failure is the caller's, as before)
