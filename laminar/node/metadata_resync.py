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

import asyncio
import shutil
from typing import TYPE_CHECKING

import structlog

from laminar.node.metadata import METADATA_GROUP, NodeInfo, Topic, group_id

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)

PARTITIONS_DIR = "partitions"
"""Where ``Node.partition_dir`` puts replica directories, under the data directory."""

OPEN_AT_ONCE = 64
"""Replicas opened in one event-loop iteration (as ``node.OPEN_AT_ONCE``)."""


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
    keep = {node.partition_dir(*want).name for want in wanted.values()}
    busy = set(keep)  # and those being deleted below
    for group, replica in list(node.runtime.replicas.items()):
        if group == METADATA_GROUP:
            continue
        if replica.directory.name not in keep:
            removed = node.runtime.remove(group)
            if removed is not None:
                busy.add(removed.directory.name)
                log.info("replica no longer assigned", topic=removed.topic, partition=group)
                node.spawn(node._delete_files(removed))
    _delete_orphans(node, busy, at)
    to_open = []
    for group, want in wanted.items():
        replica = node.runtime.replicas.get(group)
        if replica is None:
            to_open.append(want)
            continue
        replica.log.config = node._log_config(want[0].settings)
        _report_if_target(node, *want, at)
    if len(to_open) <= OPEN_AT_ONCE:
        _open(node, to_open, at)
        _after_opening(node)
    else:  # a few at a time, so the event loop keeps serving meanwhile (as Node does)
        node.spawn_opening(_open_in_chunks(node, to_open, at))


def _delete_orphans(node: Node, busy: set[str], at: int) -> None:
    """Delete replica directories nothing assigns any more that are not open either: this
    node may have missed the command removing one before it reopened it (a restart reset by
    the leader before replaying that far). Only those assigned at or before the checkpoint
    (their origin, the name's last part): one assigned after it is not in this state yet and
    the log replays its assignment next (a restart from this node's own checkpoint); one
    assigned before it and not in it was removed for good (a later assignment gets a later
    origin)."""
    root = node.config.data_dir / PARTITIONS_DIR
    if not root.is_dir():
        return
    hosted = {replica.directory.name for replica in node.runtime.replicas.values()}
    for entry in root.iterdir():
        if entry.name in busy or entry.name in hosted or not entry.is_dir():
            continue
        origin = entry.name.rsplit(".", 1)[-1]
        if not origin.isdigit() or int(origin) > at:
            continue
        log.info("deleting a replica directory no longer assigned", directory=entry.name)
        node.amnesia.forget(entry.name)
        node.spawn(asyncio.to_thread(shutil.rmtree, entry, True))


def _report_if_target(node: Node, topic: Topic, partition: int, origin: int, at: int) -> None:
    """This node is a move's target that has not said it is ready: say so (once the
    checkpoint, which holds the start_move, is durable here)."""
    assignment = topic.partitions[partition]
    if assignment.adding == node.node_id and assignment.move_id and not assignment.target_ready:
        started = {"topic_id": topic.topic_id, "partition": partition}
        started["request_id"] = assignment.move_id
        node.spawn(node._report_move_target_ready(started, max(origin, at)))


def _open(node: Node, replicas: list[tuple[Topic, int, int]], at: int) -> None:
    """Open ``replicas`` (their new markers are made durable together by the next flush pass:
    a resync can find thousands assigned meanwhile)."""
    me = node.node_id
    for topic, partition, origin in replicas:
        if node.state.topics.get(topic.name) is not topic:
            continue  # deleted, or the state was rebuilt again, meanwhile
        assignment = topic.partitions[partition]
        if assignment.origins.get(me, -1) != origin:
            continue  # moved away meanwhile (or moved back: reconciled by that command)
        node._open_partition(topic, partition, origin)
        _report_if_target(node, topic, partition, origin, at)


async def _open_in_chunks(node: Node, replicas: list[tuple[Topic, int, int]], at: int) -> None:
    for start in range(0, len(replicas), OPEN_AT_ONCE):
        _open(node, replicas[start : start + OPEN_AT_ONCE], at)
        await asyncio.sleep(0)
    _after_opening(node)


def _after_opening(node: Node) -> None:
    state, me = node.state, node.node_id
    # Only now: while this node's data directory counts as lost, every replica opened above
    # was assigned before the loss as far as it can tell (amnesia.py), which is the safe side.
    registered = state.nodes.get(me)
    if registered is not None and registered.incarnation == node.amnesia.incarnation:
        node.amnesia.registered()
    for group in list(node.amnesia.gated):
        incident = node.amnesia.incident(group)
        replica = node.runtime.replicas.get(group)
        if replica is None or not incident or (group, me) in state.recovering:
            continue  # its re-admission is pending: replica_recovered lifts the gate
        if f"lost-{incident}" in state.outcomes:
            # Its loss was recorded, and is no longer: the group re-admitted it.
            node.amnesia.recovered(group, incident, replica.raft.term)
        else:
            # Not recorded yet, or so long ago the request id is forgotten (then recording
            # it again has the group re-admit it again): report it (again; idempotent).
            node.spawn(node.readmission.report_lost(replica))
    node.groups.topics_changed()
