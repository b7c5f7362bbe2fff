"""Consumer groups on a node: which shard coordinates a group, and the shards this node leads.

Group state lives in the internal topic ``__consumer_offsets`` (Kafka's idea): ``partitions``
Raft groups, created by the first node asked about any group. Group ``g`` belongs to shard
``crc32c(g) % partitions``, and its coordinator is whichever node leads that partition: offset
commits are spread over shards and never touch the metadata group. A node that does not lead
the shard answers ``NotLeaderError`` naming the leader, which clients follow as for produce.

This module only routes and hosts; the protocol is ``coordinator.py`` and the driving of one
shard (load, append, release replies, checkpoint) is ``shard.py``. A node hands it narrow
pieces: the metadata state (topics), the runtime (replicas, wake, fail), a way to propose
metadata commands and the peer calls used to tell followers a checkpoint made old segments
redundant.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import crc32c
import structlog

from laminar.durable import Reply
from laminar.errors import LaminarError, NotLeaderError, TopicExistsError
from laminar.groups.coordinator import Coordinator
from laminar.groups.lineage import lineage_of
from laminar.groups.settings import GroupSettings
from laminar.groups.shard import ShardDriver
from laminar.groups.views import GroupView
from laminar.node.calls import PeerCalls
from laminar.node.metadata import MetadataState, TopicSettings, group_id
from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.topic_names import is_internal as is_internal

log = structlog.get_logger(__name__)

T = TypeVar("T")

INTERNAL_TOPIC = "__consumer_offsets"
TRIM_METHOD = "group_trim"
TICK_SECONDS = 0.1


def shard_of(group: str, partitions: int) -> int:
    """The internal partition holding ``group`` (clients compute the same)."""
    return crc32c.crc32c(group.encode()) % partitions


class GroupService:
    def __init__(
        self,
        settings: GroupSettings,
        state: MetadataState,
        runtime: MultiRaft,
        calls: PeerCalls,
        propose_metadata: Callable[[dict[str, Any]], Awaitable[Any]],
        address_of: Callable[[int], str],
        live_nodes: Callable[[], list[int]],
    ) -> None:
        self.settings = settings
        self.config = settings.coordinator_config()
        self._state = state
        self._runtime = runtime
        self._calls = calls
        self._propose_metadata = propose_metadata
        self._address_of = address_of
        self._live_nodes = live_nodes
        self._drivers: dict[int, ShardDriver] = {}
        self._creating: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        calls.register(TRIM_METHOD, self._serve_trim)

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick_loop(), name="group-coordinators")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._creating, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for driver in self._drivers.values():
            driver.end("node stopping")

    # ------------------------------------------------------------------ requests

    async def call(self, group: str, request: Callable[[Coordinator, int], Reply[T]]) -> T:
        """Run ``request`` on ``group``'s coordinator if this node is it (else NotLeaderError
        naming the node that is)."""
        driver = await self._driver_for(group)
        return await driver.call(request, self.settings.request_timeout_ms / 1000)

    async def coordinator_node(self, group: str) -> int | None:
        """The node coordinating ``group`` (the leader of its shard), or None while unknown;
        creates the internal topic if it does not exist yet (Kafka's FindCoordinator)."""
        topic = self._state.topics.get(INTERNAL_TOPIC)
        if topic is None:
            await self._create_internal_topic()
            topic = self._state.topics.get(INTERNAL_TOPIC)
            if topic is None:
                return None
        shard = shard_of(group, len(topic.partitions))
        replica = self._runtime.replicas.get(group_id(topic.topic_id, shard))
        if replica is not None and not replica.closed:
            leader = replica.raft.leader_id
        else:
            leader = topic.partitions[shard].leader
        return leader or None

    async def list_groups(self) -> list[tuple[int, GroupView]]:
        """(shard, group) for every group of the shards this node coordinates."""
        out: list[tuple[int, GroupView]] = []
        timeout = self.settings.request_timeout_ms / 1000
        for shard, driver in sorted(self._drivers.items()):
            if not driver.current:
                continue
            try:
                views = await driver.call(lambda c, _now: c.list_groups(), timeout)
            except (LaminarError, TimeoutError):
                continue  # lost it meanwhile: the new coordinator lists them
            out += [(shard, view) for view in views]
        return out

    def coordinators(self) -> list[Coordinator]:
        """The coordinators of the shards this node leads now (read by the metrics)."""
        return [
            driver.coordinator
            for driver in self._drivers.values()
            if driver.coordinator is not None and driver.current
        ]

    # ------------------------------------------------------------------ node events

    def leader_changed(self, replica: Replica) -> None:
        """An internal partition's replica here gained or lost leadership."""
        shard = replica.partition
        old = self._drivers.pop(shard, None)
        if old is not None:
            old.end("leadership changed")
        if replica.is_leader:
            self._drivers[shard] = self._new_driver(shard, replica)

    def topics_changed(self) -> None:
        """Topics were created or deleted: coordinators drop offsets and rebalance."""
        for driver in self._drivers.values():
            driver.topics_changed()

    def replica_racks(self) -> dict[tuple[str, int], frozenset[str]]:
        """The racks holding each partition's replicas (nodes started with ``--rack``)."""
        racks = {n: info.rack for n, info in self._state.nodes.items() if info.rack}
        if not racks:
            return {}
        return {
            (name, index): frozenset(racks[n] for n in assignment.replicas if n in racks)
            for name, topic in self._state.topics.items()
            if not is_internal(name)
            for index, assignment in enumerate(topic.partitions)
        }

    def topic_partitions(self) -> dict[str, int]:
        return {
            name: len(topic.partitions)
            for name, topic in self._state.topics.items()
            if not is_internal(name)
        }

    # ------------------------------------------------------------------ internals

    def _new_driver(self, shard: int, replica: Replica) -> ShardDriver:
        return ShardDriver(
            shard,
            replica,
            self.config,
            self.topic_partitions,
            self.replica_racks,
            lambda: int(time.time() * 1000),
            self._runtime.wake,
            self._trimmed,
            self._runtime.fail,
            checkpoint_min_records=self.settings.checkpoint_min_records,
            lineage=lambda: lineage_of(self._state.topics),
        )

    async def _driver_for(self, group: str) -> ShardDriver:
        topic = self._state.topics.get(INTERNAL_TOPIC)
        if topic is None:
            await self._create_internal_topic()
            topic = self._state.topics.get(INTERNAL_TOPIC)
            if topic is None:
                raise NotLeaderError(f"{INTERNAL_TOPIC} is being created")
        shard = shard_of(group, len(topic.partitions))
        replica = self._runtime.replicas.get(group_id(topic.topic_id, shard))
        if replica is None or replica.closed:
            leader = topic.partitions[shard].leader
            raise NotLeaderError(
                f"the coordinator of group {group!r} is the leader of {INTERNAL_TOPIC}/{shard}",
                leader,
                self._address_of(leader) if leader else "",
            )
        if not replica.is_leader:
            raise replica.not_leader(self._address_of)
        driver = self._drivers.get(shard)
        if driver is None or not driver.current:
            driver = self._drivers[shard] = self._new_driver(shard, replica)
        return driver

    async def _create_internal_topic(self) -> None:
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create())
        await asyncio.shield(self._creating)

    async def _create(self) -> None:
        settings = self.settings
        replication = max(1, min(settings.replication_factor, len(self._live_nodes())))
        topic = TopicSettings(
            partitions=settings.partitions,
            replication_factor=replication,
            segment_bytes=settings.segment_bytes,
            segment_ms=7 * 24 * 3600 * 1000,
            retention_ms=None,  # never by age: checkpoints bound it (shard.py)
            retention_bytes=None,
        )
        command = {"op": "create_topic", "name": INTERNAL_TOPIC, "settings": asdict(topic)}
        try:
            await self._propose_metadata(command)
            log.info("created the consumer-group topic", partitions=settings.partitions)
        except TopicExistsError:
            pass  # another node was first

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            for shard, driver in list(self._drivers.items()):
                try:
                    driver.tick()
                except Exception:  # a defect in one shard must not stop the others
                    log.exception("group coordinator tick failed", shard=shard)
                    driver.end("tick failed")
                if driver.ended and self._drivers.get(shard) is driver:
                    del self._drivers[shard]

    def _trimmed(self, replica: Replica, offset: int) -> None:
        """A checkpoint from ``offset`` on is committed: older segments are redundant here and
        on every other replica of the shard."""
        self._discard(replica, offset)
        body = {"topic": replica.topic, "partition": replica.partition, "offset": offset}
        conf = replica.raft.conf
        for peer in sorted({*conf.voters, *conf.learners} - {replica.raft.id}):
            task = asyncio.create_task(self._tell(peer, body))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _tell(self, peer: int, body: dict[str, Any]) -> None:
        try:
            await self._calls.call(peer, TRIM_METHOD, body, timeout=5.0)
        except (LaminarError, ConnectionError) as exc:  # the next checkpoint tells it again
            log.debug("could not tell a replica to trim", peer=peer, error=str(exc))

    async def _serve_trim(self, peer: int, body: dict[str, Any]) -> None:
        topic = self._state.topics.get(body["topic"])
        if topic is None or body["topic"] != INTERNAL_TOPIC:
            return None
        replica = self._runtime.replicas.get(group_id(topic.topic_id, int(body["partition"])))
        # Only the shard's leader knows where its checkpoint starts; only what this replica
        # holds as committed can go.
        if replica is not None and not replica.closed and replica.raft.leader_id == peer:
            self._discard(replica, min(int(body["offset"]), replica.high_watermark))
        return None

    def _discard(self, replica: Replica, offset: int) -> None:
        try:
            replica.log.discard_before(offset)
        except Exception as exc:  # a storage fault stays in its partition
            self._runtime.fail(replica, exc)
