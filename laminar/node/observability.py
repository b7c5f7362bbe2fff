"""Wires metrics and health checks to a node: the only module that knows both sides.

``Node`` owns a ``RequestStats`` (bumped by the client server whether or not metrics are
served: a few integer additions per request) and, with ``--metrics-listen``, an
``Observability`` that serves them with everything else it collects at scrape time.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from laminar.node.health_http import HealthServer
from laminar.node.metadata import group_id
from laminar.node.metrics import LoopLag, Sources, registry_for
from laminar.node.status import metadata_log

if TYPE_CHECKING:
    from laminar.node.node import Node


class Observability:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.loop_lag = LoopLag()
        sources = Sources(
            node_id=node.node_id,
            runtime=node.runtime,
            state=node.state,
            requests=node.request_stats,
            swim=node.swim,
            groups=node.groups,
            live_nodes=node.live_nodes,
            connected_peers=node.peers.connected_peers,
            client_connections=node.client_server.connection_count,
            offline_replicas=lambda: len(node.repair.faults),
            lost_state_replicas=lambda: len(node.amnesia.gated),
            loop_lag=self.loop_lag,
            per_partition=node.config.metrics_per_partition,
            metadata_log=lambda: metadata_log(node),
            descriptors=node.descriptors,
            admission=node.produce_admission,
        )
        self.registry = registry_for(sources)
        self.server = HealthServer(node.config.metrics_listen, self.registry, self.not_ready)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        self._task = asyncio.create_task(self.loop_lag.run(), name="event-loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.server.stop()

    def not_ready(self) -> list[str]:
        """Why this node should not get traffic yet: metadata out of reach, a replica it is
        assigned not open, or a replica under repair or re-admission."""
        node = self.node
        reasons: list[str] = []
        metadata = node.metadata
        if metadata is None:
            return ["metadata replica not open"]
        leader = metadata.raft.leader_id
        if leader == 0:
            reasons.append("metadata group has no leader")
        elif leader != node.node_id and leader not in node.peers.connected_peers():
            reasons.append(f"metadata leader {leader} not connected")
        if node.node_id not in node.state.nodes:
            reasons.append("node not registered in the metadata yet")
        hosted = node.runtime.replicas
        for topic in node.state.topics.values():
            for index, assignment in enumerate(topic.partitions):
                if node.node_id not in assignment.replicas:
                    continue
                if group_id(topic.topic_id, index) not in hosted:
                    reasons.append(f"replica {topic.name}/{index} not open")
        for fault in node.repair.faults.values():
            reasons.append(f"replica {fault.topic}/{fault.partition} under repair: {fault.error}")
        for group in sorted(node.amnesia.gated):
            replica = hosted.get(group)
            name = f"{replica.topic}/{replica.partition}" if replica is not None else str(group)
            reasons.append(f"replica {name} lost state, awaiting re-admission")
        return reasons
