"""Reconcile a node's side effects with a metadata state rebuilt from a checkpoint.

Normally a node acts on each metadata command as it applies it (``Node.reconcile``: open the
replicas a new topic assigns it, delete those moved away, add peers...). A node whose state was
rebuilt from a checkpoint (it lagged so far that the leader reset its log, or its own log
starts at one) missed those commands, so it derives the same effects from the state itself:
host exactly the replicas assigned to it, each in the directory its assignment named, report
a move's target ready, know every registered peer, and lift the gate of a replica its group
re-admitted meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from laminar.node.metadata import METADATA_GROUP, NodeInfo, Topic, group_id

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)


def assigned_replicas(node: Node) -> dict[int, tuple[Topic, int, int]]:
    """Group -> (topic, partition, origin) of every replica the metadata assigns this node."""
    me = node.node_id
    wanted = {}
    for topic in node.state.topics.values():
        for partition, assignment in enumerate(topic.partitions):
            if me in assignment.replicas or assignment.adding == me:
                origin = assignment.origins.get(me, -1)
                wanted[group_id(topic.topic_id, partition)] = (topic, partition, origin)
    return wanted


def resync(node: Node, known_nodes: dict[int, NodeInfo], at: int) -> None:
    """Make this node's replicas, moves and peers follow ``node.state`` (just rebuilt from
    the checkpoint at offset ``at``)."""
    state, me = node.state, node.node_id
    for node_id, info in state.nodes.items():
        if node_id != me:
            node.peers.add_peer(node_id, info.peer_address)
    for node_id in known_nodes.keys() - state.nodes.keys():
        if node_id != me:
            node.peers.remove_peer(node_id)
    wanted = assigned_replicas(node)
    for group, replica in list(node.runtime.replicas.items()):
        if group == METADATA_GROUP:
            continue
        want = wanted.get(group)
        if want is None or replica.directory != node.partition_dir(*want):
            removed = node.runtime.remove(group)
            if removed is not None:
                log.info("replica no longer assigned", topic=removed.topic, partition=group)
                node.spawn(node._delete_files(removed))
    for group, (topic, partition, origin) in wanted.items():
        replica = node.runtime.replicas.get(group)
        if replica is None:
            node._open_partition(topic, partition, origin)
        else:
            replica.log.config = node._log_config(topic.settings)
        assignment = topic.partitions[partition]
        if assignment.adding == me and assignment.move_id and not assignment.target_ready:
            started = {"topic_id": topic.topic_id, "partition": partition}
            started["request_id"] = assignment.move_id
            # Said once the checkpoint, which holds the start_move, is durable here.
            node.spawn(node._report_move_target_ready(started, max(origin, at)))
    # Only now: while this node's data directory counts as lost, every replica opened above
    # was assigned before the loss as far as it can tell (amnesia.py), which is the safe side.
    registered = state.nodes.get(me)
    if registered is not None and registered.incarnation == node.amnesia.incarnation:
        node.amnesia.registered()
    for group in list(node.amnesia.gated):
        incident = node.amnesia.incident(group)
        replica = node.runtime.replicas.get(group)
        if (
            replica is not None
            and incident
            and (group, me) not in state.recovering
            and f"lost-{incident}" in state.outcomes
        ):  # its loss was recorded, and is no longer: the group re-admitted it
            node.amnesia.recovered(group, incident, replica.raft.term)
    node.groups.topics_changed()
