"""`laminar cluster health`: is the cluster whole, in counts rather than rows.

A rolling restart asks this after each node, every second or so, until it holds; at 10,000
partitions `cluster status` (a row per partition, its replicas and their lag) costs the
nodes more than the catch-up being watched. Here each node passes once over its replicas and
answers what it leads and what is wrong, with at most ``SAMPLE`` rows per problem.

One definition of a replica *in sync* serves this and the node's metrics: its node is
connected to the leader, the leader streams to it (Raft progress ``REPLICATE``: it knows where
the replica's log matches), the leader has sent it every committed entry, and it is a voter
(a learner is a move's target, still catching up). A follower a little behind under load is
in sync; one that is probing, resetting, disconnected, or being caught up from far behind
(its window of appends has not reached the commit point yet) is not, as Kafka leaves a
replica out of the ISR until it reaches the leader's end.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from laminar.errors import NodeStartingError
from laminar.node.metadata import METADATA_GROUP
from laminar.node.status import fill_fault, replica_faults
from laminar.raft.types import ProgressState

if TYPE_CHECKING:
    from laminar.node.metadata import MetadataState
    from laminar.node.node import Node
    from laminar.node.replica import Replica

SAMPLE = 20
"""Partitions named per problem; the counts are exact."""

PEER_TIMEOUT = 2.0
"""Seconds a node waits for each peer's part; one that does not answer is named."""


def out_of_sync(replica: Replica, node_id: int, connected: set[int]) -> list[int]:
    """Replicas of a partition this node leads that are not in sync (see the module)."""
    raft = replica.raft
    conf = raft.conf
    lagging = [n for n in conf.learners if n != node_id]
    commit = raft.commit
    for voter in conf.voters:
        if voter == node_id:
            continue
        progress = raft.prs.get(voter)
        if (
            voter not in connected
            or progress is None
            or progress.state is not ProgressState.REPLICATE
            or progress.next <= commit
        ):
            lagging.append(voter)
    return lagging


def local_health(
    node_id: int,
    replicas: Iterable[Replica],
    connected: set[int],
    faults: list[dict[str, Any]],
    factors: dict[str, int],
) -> dict[str, Any]:
    """This node's part: what it leads, its led partitions under-replicated (a replica out of
    sync, counted per node, or fewer voters than the topic's replication factor in
    ``factors``; ``SAMPLE`` named), and its replicas not serving (the peer "health" call)."""
    led: dict[str, list[int]] = {}
    under: list[list[Any]] = []
    under_count = 0
    lagging_nodes: Counter[int] = Counter()
    for replica in replicas:
        if replica.group == METADATA_GROUP or replica.closed or not replica.is_leader:
            continue
        led.setdefault(replica.topic, []).append(replica.partition)
        lagging = out_of_sync(replica, node_id, connected)
        lagging_nodes.update(lagging)
        if lagging or len(replica.raft.conf.voters) < factors.get(replica.topic, 0):
            under_count += 1
            if len(under) < SAMPLE:
                under.append([replica.topic, replica.partition])
    return {
        "led": led,
        "under_count": under_count,
        "under": under,
        "out_of_sync": {str(n): c for n, c in lagging_nodes.items()},
        "fault_count": len(faults),
        "faults": faults[:SAMPLE],
    }


@dataclass(slots=True)
class Health:
    """The cluster's health as one node gathered it (``client_api`` turns it into a reply)."""

    metadata_leader: int
    nodes: list[int]
    nodes_down: list[int]
    not_answering: list[int] = field(default_factory=list)
    partitions: int = 0
    leaderless_count: int = 0
    leaderless: list[tuple[str, int]] = field(default_factory=list)
    under_count: int = 0
    under: list[tuple[str, int]] = field(default_factory=list)
    out_of_sync: Counter[int] = field(default_factory=Counter)
    fault_count: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """Why the cluster is not healthy (none: it is), in the order an operator acts."""
        checks = (
            (self.metadata_leader == 0, "no metadata leader"),
            (bool(self.nodes_down), "nodes down"),
            (bool(self.not_answering), "nodes not answering"),
            (self.leaderless_count > 0, "leaderless partitions"),
            (self.under_count > 0, "under-replicated partitions"),
            (self.fault_count > 0, "replicas not serving"),
        )
        return [reason for failed, reason in checks if failed]

    def add(self, node_id: int, part: Any, led: set[tuple[str, int]]) -> None:
        """Merge one node's ``local_health``; a malformed part counts as no answer (a peer's
        reply is checked, not trusted)."""
        try:
            rows = [(str(t), _u32(p)) for t, parts in part["led"].items() for p in parts]
            under = [(str(t), _u32(p)) for t, p in part["under"]]
            lagging = Counter({_u32(n): _u32(c) for n, c in part["out_of_sync"].items()})
            under_count, fault_count = _u32(part["under_count"]), _u32(part["fault_count"])
            faults = [f for f in part["faults"] if _fault_row(f)]
        except (AttributeError, KeyError, TypeError, ValueError):
            self.not_answering.append(node_id)
            return
        led.update(rows)
        self.under_count += under_count
        self.under.extend(under)
        self.out_of_sync.update(lagging)
        self.fault_count += fault_count
        self.faults.extend(faults)

    def finish(self, state: MetadataState, led: set[tuple[str, int]]) -> None:
        """Leaderless partitions: those no answering node leads."""
        for topic in sorted(state.topics.values(), key=lambda t: t.name):
            for index, assignment in enumerate(topic.partitions):
                if assignment.state == "retired":
                    continue  # a key-range partition retention emptied: it has no group
                self.partitions += 1
                if (topic.name, index) not in led:
                    self.leaderless_count += 1
                    if len(self.leaderless) < SAMPLE:
                        self.leaderless.append((topic.name, index))
        self.under = sorted(self.under)[:SAMPLE]
        self.faults = sorted(self.faults, key=lambda f: (f["topic"], f["partition"]))[:SAMPLE]
        self.not_answering.sort()


def _u32(value: Any) -> int:
    """A count or id from a peer's part, as the reply's UInt32 fields take it."""
    number = int(value)
    if not 0 <= number < 1 << 32:
        raise ValueError(f"{number} out of range")
    return number


_FAULT_FIELDS = {"topic": str, "partition": int, "node_id": int, "state": str, "error": str}


def _fault_row(row: Any) -> bool:
    return (
        isinstance(row, dict)
        and all(type(row.get(k)) is t for k, t in _FAULT_FIELDS.items())
        and 0 <= row["partition"] < 1 << 32
        and 0 <= row["node_id"] < 1 << 32
    )


def node_part(node: Node) -> dict[str, Any]:
    """``local_health`` of ``node`` (what it answers the peer "health" call with)."""
    connected = set(node.peers.connected_peers())
    factors = {t.name: t.settings.replication_factor for t in node.state.topics.values()}
    replicas = node.runtime.replicas.values()
    return local_health(node.node_id, replicas, connected, replica_faults(node), factors)


async def cluster_health(node: Node) -> Health:
    """Gather every live node's part (``local_health``) and judge the whole.

    A restarting node answers clients before it joins the cluster; knowing no peer then, it
    would call every other node down and every partition leaderless. Until it has heard of a
    metadata leader with its gossip running (``Node.joined``) it says it cannot tell instead
    (``NodeStartingError``): gossip running was not enough, a view from just after that still
    called a peer down."""
    if not node.joined:
        raise NodeStartingError(
            f"node {node.node_id} has not joined the cluster yet (it is opening its "
            "replicas or has not heard from the metadata leader): ask another node"
        )
    live = set(node.live_nodes())
    registered = sorted(node.state.nodes)
    health = Health(
        metadata_leader=node.metadata_leader,
        nodes=registered,
        nodes_down=[n for n in registered if n not in live],
    )
    peers = sorted(live - {node.node_id})
    answers = await asyncio.gather(
        *(node.calls.call(n, "health", None, timeout=PEER_TIMEOUT) for n in peers),
        return_exceptions=True,
    )
    led: set[tuple[str, int]] = set()
    health.add(node.node_id, node_part(node), led)
    for peer, answer in zip(peers, answers, strict=True):
        if isinstance(answer, BaseException):
            health.not_answering.append(peer)
        else:
            health.add(peer, answer, led)
    health.finish(node.state, led)
    return health


def fill_health(out: Any, health: Health) -> None:
    """A ClusterHealth reply from ``health``."""
    reasons = health.reasons
    out.healthy = not reasons
    out.reasons = reasons
    out.metadataLeader = health.metadata_leader
    out.nodes = health.nodes
    out.nodesDown = health.nodes_down
    out.nodesNotAnswering = health.not_answering
    out.partitions = health.partitions
    out.leaderlessCount = health.leaderless_count
    out.underReplicatedCount = health.under_count
    out.replicaFaultsCount = health.fault_count
    for name, parts in (("leaderless", health.leaderless), ("underReplicated", health.under)):
        for slot, (topic, partition) in zip(out.init(name, len(parts)), parts, strict=True):
            slot.topic = topic
            slot.partition = partition
    lagging = sorted(health.out_of_sync.items())
    for slot, (node_id, count) in zip(out.init("outOfSync", len(lagging)), lagging, strict=True):
        slot.nodeId = node_id
        slot.count = count
    for slot, fault in zip(
        out.init("replicaFaults", len(health.faults)), health.faults, strict=True
    ):
        fill_fault(slot, fault)
