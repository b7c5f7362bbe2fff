"""The node as the Kafka handlers see it: a narrow view, not the whole ``Node``.

Handlers reach partitions through ``io`` (``laminar.node.partition_io``, shared with the
native protocol), cluster metadata through the read-only accessors here, and change topics
through the node's ``TopicAdmin``. The group APIs reach the group service through ``groups``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laminar.node.metadata import Topic, TopicSettings
from laminar.node.partition_io import PartitionIO
from laminar.raft.progress import REPLICATE
from laminar.topic_names import is_internal
from laminar.transport import split_address

if TYPE_CHECKING:
    from laminar.auth.acl import Authorizer
    from laminar.auth.admin import AuthAdmin
    from laminar.groups.service import GroupService
    from laminar.node.node import Node


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class PartitionView:
    leader: int
    """Node id of the Raft leader, -1 if unknown."""
    replicas: list[int]
    isr: list[int]
    leader_epoch: int


class NodeBroker:
    """What the Kafka handlers may use of a node."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.io = PartitionIO(node)
        self._rng = random.Random()

    @property
    def node_id(self) -> int:
        return self._node.node_id

    @property
    def cluster_id(self) -> str:
        return self._node.config.cluster_id

    @property
    def controller_id(self) -> int:
        """Kafka's controller: the metadata leader (-1 while none is known)."""
        return self._node.metadata_leader or -1

    @property
    def authorizer(self) -> Authorizer:
        return self._node.authorizer

    @property
    def auth_admin(self) -> AuthAdmin:
        return self._node.auth_admin

    @property
    def groups(self) -> GroupService:
        return self._node.groups

    def brokers(self) -> list[BrokerAddress]:
        """Every live registered node with a Kafka listener, at its advertised address (as a
        Kafka broker lists only live brokers: clients stop dialling a dead one)."""
        out = []
        live = set(self._node.live_nodes())
        for info in sorted(self._node.state.nodes.values(), key=lambda n: n.node_id):
            if info.node_id not in live:
                continue
            address = info.kafka_address
            if info.node_id == self._node.node_id:
                address = self._node.config.kafka_advertise
            if not address:
                continue
            host, port = split_address(address)
            out.append(BrokerAddress(info.node_id, host, port, info.rack or None))
        if not any(b.node_id == self._node.node_id for b in out):  # not registered yet
            host, port = split_address(self._node.config.kafka_advertise)
            out.append(
                BrokerAddress(self._node.node_id, host, port, self._node.config.rack or None)
            )
        return out

    @property
    def node_count(self) -> int:
        """Registered nodes (live or not)."""
        return len(self._node.state.nodes)

    @property
    def topics(self) -> dict[str, Topic]:
        return self._node.state.topics

    @staticmethod
    def is_internal(name: str) -> bool:
        return is_internal(name)

    def partition(self, topic: Topic, index: int) -> PartitionView:
        """Leader, replicas (the voters) and in-sync replicas: the live voters (gossip or a
        peer connection) and, on the leader, only those whose log reached the commit or that
        it streams to (Raft's replicate state)."""
        assignment = topic.partitions[index]
        live = set(self._node.live_nodes())
        replica = self._node.replica_for(topic.name, index)
        if replica is None or replica.closed:
            replicas = list(assignment.replicas)
            leader = assignment.leader or -1
            isr = [v for v in replicas if v in live]
            return PartitionView(leader, replicas, isr, assignment.leader_term or 0)
        raft = replica.raft
        voters = sorted(raft.conf.voters) or list(assignment.replicas)
        leader = raft.leader_id or assignment.leader or -1
        isr = [v for v in voters if v in live]
        if replica.is_leader:
            progress = raft.status().progress
            commit = raft.commit
            isr = [
                v
                for v in isr
                if v == self.node_id
                or (
                    v in progress
                    and (progress[v].match >= commit or progress[v].state == REPLICATE)
                )
            ]
        return PartitionView(leader, voters, isr, raft.term)

    def settings_for(self, spec: dict[str, Any]) -> TopicSettings:
        return self._node.settings_for(spec)

    async def create_topic(self, name: str, spec: dict[str, Any]) -> Topic:
        """``spec`` as ``TopicAdmin.create_topic`` takes it, without the name."""
        return await self._node.topic_admin.create_topic({**spec, "name": name})

    def check_create(self, name: str, spec: dict[str, Any]) -> None:
        """What ``create_topic`` would refuse before proposing (CreateTopics' validate_only)."""
        self._node.topic_admin.check_create({**spec, "name": name})

    async def delete_topic(self, name: str) -> None:
        await self._node.topic_admin.delete_topic(name)

    async def add_partitions(self, name: str, total: int) -> Topic:
        return await self._node.topic_admin.add_partitions(name, total)

    async def alter_topic(self, name: str, changes: dict[str, int]) -> Topic:
        return await self._node.topic_admin.alter_topic(name, changes)

    def refuse_when_full(self, size: int) -> None:
        """DiskFullError while the data directory is below its free-space reserve."""
        self._node.disk.refuse_when_full(size)

    def new_producer_id(self) -> int:
        """A fresh idempotent producer id. Random in 2^62, like the native producer's: no
        coordination needed, and a collision between two live producers is negligible."""
        return self._rng.getrandbits(62) | 1 << 40
