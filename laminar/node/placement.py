"""Membership-driven placement: gossip events in, replica moves and leader transfers out.

Every node runs one loop. On the metadata leader it starts moves (evacuating nodes that are
gone for longer than ``node_dead_after`` or draining, then evening out replica counts) and adds
newly registered nodes to the metadata group as learners. On every node it advances the moves
of partitions this node leads, and hands leadership to a partition's preferred replica (the
first of its replica list) when that replica is alive and caught up, so leaders spread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from laminar.errors import LaminarError
from laminar.membership.state import LIVE_STATES, EventKind, MemberEvent, MemberState
from laminar.node.metadata import METADATA_GROUP, PartitionAssignment, Recovery, group_id
from laminar.node.metadata_voters import Follower, HandOver, Promote, Remove, next_step
from laminar.node.rebalance import (
    Move,
    advance_move,
    advance_recovery,
    move_done,
    plan_moves,
    undo_move,
)
from laminar.raft import ConfChange, ConfChangeType

if TYPE_CHECKING:
    from laminar.node.node import Node
    from laminar.node.replica import Replica

log = structlog.get_logger(__name__)

TRANSFER_RETRY_S = 15.0
"""A leader hands a partition to its preferred replica at most this often: a replica that
declines (it was just repaired after a fault) must not keep the leader in transfer, which
refuses every write meanwhile."""
SETTLE_S = 10.0
"""A node back from the dead is handed no leadership for this long (Redpanda mutes a
restarted node for its leader balancer likewise): it is catching up on every group it hosts,
and at 10,000 partitions the elections of a few thousand transfers during that catch-up
doubled the CPU it took on every node."""
QUIET_PASS_S = 5.0
"""With no change seen (live and gone nodes, applied metadata, leaderships) and no move under
way, the passes over every partition run only this often: they then only find a preferred
replica that caught up meanwhile, and at 10,000 partitions they cost a node ~30 ms of CPU
every half second, idle or, worse, in the middle of a failover's elections."""


class Placement:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._dead_since: dict[int, float] = {}
        self._back_since: dict[int, float] = {}
        self._reaped: set[int] = set()
        """Nodes the gossip forgot (down for ``--reap-after``): the metadata leader forgets
        them too once they hold no replica."""
        self._last_transfer: dict[int, float] = {}
        self._proposing: set[tuple[tuple[str, int | str], ...]] = set()
        self._out_of_voters: set[tuple[int, int, str, int]] = set()
        """(group, node, incident, leader term): a recovering replica seen out of the voters."""
        self._new_leaderships: set[Replica] = set()
        """Replicas that gained or lost leadership since the last step."""
        self._placed: tuple[object, ...] = ()
        self._passed_at = float("-inf")
        self._moving = False
        """The last pass over every partition met a move under way (the next one runs too)."""

    def leadership_changed(self, replica: Replica) -> None:
        """A hosted replica gained or lost leadership: the next step looks at its partition."""
        self._new_leaderships.add(replica)

    # membership ------------------------------------------------------------------------------
    def on_member_event(self, event: MemberEvent) -> None:
        member = event.member
        node = self.node
        if member.node_id == node.node_id:
            return
        if event.kind in (EventKind.DEAD, EventKind.LEFT):
            self._dead_since.setdefault(member.node_id, time.monotonic())
            node.runtime.node_down(member.node_id)
        elif event.kind is EventKind.REAPED:
            self._reaped.add(member.node_id)
        elif event.kind in (EventKind.JOINED, EventKind.ALIVE, EventKind.UPDATED):
            if self._dead_since.pop(member.node_id, None) is not None:
                self._back_since[member.node_id] = time.monotonic()
            if event.kind is EventKind.ALIVE:
                node.runtime.node_up(member.node_id)
            peer, client = member.meta.get("peer"), member.meta.get("client")
            if peer:
                node.peers.add_peer(member.node_id, peer)
            if client:
                node.client_addresses[member.node_id] = client

    def live(self) -> set[int]:
        node = self.node
        alive, left = set(), set()
        for member in node.swim.members:  # (none yet on a node still starting)
            if member.state in LIVE_STATES:
                alive.add(member.node_id)
            elif member.state is MemberState.LEFT:
                left.add(member.node_id)  # stopping: still connected, handing leadership off
        connected = set(node.peers.connected_peers()) - left  # gossip may not have converged
        return (alive | connected | {node.node_id}) & set(node.state.nodes)

    def gone(self) -> set[int]:
        limit = self.node.config.node_dead_after_ms / 1000
        now = time.monotonic()
        return {n for n, since in self._dead_since.items() if now - since >= limit}

    # the loop --------------------------------------------------------------------------------
    def step(self) -> None:
        node = self.node
        assert node.metadata is not None
        live, gone = self.live(), self.gone()
        now = time.monotonic()
        # Moves are planned, and every partition this node leads looked at, again when nodes
        # or assignments changed (leadership reports change neither); otherwise only the
        # partitions whose leadership moved here since the last step are.
        placed = (live, gone, node.state.placement_changes, node.metadata.is_leader)
        full = placed != self._placed or self._moving or now - self._passed_at >= QUIET_PASS_S
        if full:
            self._placed, self._passed_at = placed, now
        new_leaderships, self._new_leaderships = self._new_leaderships, set()
        if node.metadata.is_leader:
            self._admit_metadata_learners()
            self._forget_reaped()
            self._follow_cluster_with_voters(live, gone)
            if full:
                for move in plan_moves(node.state, live, gone, node.config.max_concurrent_moves):
                    log.info("starting replica move", move=move)
                    self._propose(move.command("start_move"))
        recovering = node.state.recovering
        self._out_of_voters = {s for s in self._out_of_voters if s[:2] in recovering}
        for (group, node_id), recovery in list(recovering.items()):
            leader = node.metadata if group == METADATA_GROUP else node.runtime.replicas.get(group)
            if leader is None or not leader.is_leader or node_id == node.node_id:
                continue
            topic = node.state.topics.get(leader.topic)
            if topic is not None and topic.partitions[leader.partition].moving:
                continue  # one membership plan at a time: after the move
            self._readmit(leader, node_id, recovery)
        if full:
            self._moving = self._pass_partitions(live, gone)
        elif new_leaderships:
            self._moving = self._pass_new_leaderships(new_leaderships, live, gone)

    def _pass_partitions(self, live: set[int], gone: set[int]) -> bool:
        """Advance the moves of partitions this node leads and hand leaderships to preferred
        replicas; whether a move was under way."""
        replicas = self.node.runtime.replicas
        moving = False
        for topic in list(self.node.state.topics.values()):
            first = group_id(topic.topic_id, 0)
            for index, assignment in enumerate(topic.partitions):
                moving = moving or assignment.moving
                replica = replicas.get(first | index)
                if replica is not None and replica.is_leader:
                    self._lead(replica, topic.topic_id, assignment, live, gone)
        return moving

    def _pass_new_leaderships(self, replicas: set[Replica], live: set[int], gone: set[int]) -> bool:
        """``_pass_partitions`` over the partitions of ``replicas`` only: thousands of groups
        elect at once while a topic is created or after a node died, and a pass over 10,000
        partitions at every step took a tenth of each node's CPU meanwhile."""
        topics = self.node.state.topics
        moving = False
        for replica in replicas:
            topic = topics.get(replica.topic)
            if replica.closed or not replica.is_leader or topic is None:
                continue
            if group_id(topic.topic_id, replica.partition) != replica.group:
                continue  # (a deleted topic's replica, the name taken again)
            assignment = topic.partitions[replica.partition]
            moving = moving or assignment.moving
            self._lead(replica, topic.topic_id, assignment, live, gone)
        return moving

    def _lead(
        self,
        replica: Replica,
        topic_id: int,
        assignment: PartitionAssignment,
        live: set[int],
        gone: set[int],
    ) -> None:
        """As the partition's leader: advance its move, else hand leadership to its preferred
        replica when due."""
        if assignment.moving:
            move = Move(topic_id, replica.partition, assignment.removing, assignment.adding)
            self._advance(replica, move, gone, assignment.target_ready)
        elif (replica.group, assignment.replicas[0]) not in self.node.state.recovering:
            self._prefer_leader(replica, assignment.replicas[0], live)

    def _readmit(self, replica: Replica, node_id: int, recovery: Recovery) -> None:
        """On a group's leader: re-admit a replica that lost its state (see amnesia.py)."""
        raft = replica.raft
        seen = (replica.group, node_id, recovery.incident, raft.term)
        done = not recovery.voter
        if not done:
            try:
                done = advance_recovery(raft, node_id, seen in self._out_of_voters)
            except LaminarError as exc:
                log.debug("re-admission step deferred", node=node_id, reason=str(exc))
                return
            if node_id not in raft.conf.voters:
                self._out_of_voters.add(seen)
            self.node.runtime.wake(replica)
        if done:
            log.info("replica that lost its state re-admitted", group=replica.group, node=node_id)
            command = {"op": "replica_recovered", "group": replica.group, "node": node_id}
            self._propose({**command, "incident": recovery.incident})

    def _advance(self, replica: Replica, move: Move, gone: set[int], target_ready: bool) -> None:
        raft = replica.raft
        abandon = move.target in gone and not move_done(raft, move.source, move.target)
        try:
            if abandon:  # the target died mid-move: undo it, and plan_moves will pick another
                done = undo_move(raft, move.target)
            else:
                done = advance_move(raft, move.source, move.target, target_ready)
        except LaminarError as exc:
            log.debug("move step deferred", move=move, reason=str(exc))
            return
        self.node.runtime.wake(replica)
        if done and abandon:
            log.info("replica move abandoned, its target is gone", move=move)
            self._propose(move.command("abort_move"))
        elif done:
            log.info("replica move complete", move=move)
            self._propose(move.command("finish_move"))

    def _prefer_leader(self, replica: Replica, preferred: int, live: set[int]) -> None:
        raft = replica.raft
        if preferred == raft.id or preferred not in raft.conf.voters:
            return
        if preferred not in live or raft.transferee:
            return
        now = time.monotonic()
        if now - self._back_since.get(preferred, -SETTLE_S) < SETTLE_S:
            return
        if self.node.runtime.streaming_to(preferred):
            return  # still catching it up on other groups (at 10,000 partitions, 40 s)
        progress = raft.status().progress.get(preferred)
        if progress is not None and progress.match == raft.last_index and progress.recent_active:
            if now - self._last_transfer.get(replica.group, -TRANSFER_RETRY_S) < TRANSFER_RETRY_S:
                return
            self._last_transfer[replica.group] = now
            try:
                raft.transfer_leader(preferred)
            except LaminarError:
                return
            self.node.runtime.wake(replica)

    def _admit_metadata_learners(self) -> None:
        node = self.node
        assert node.metadata is not None
        raft = node.metadata.raft
        conf = raft.conf
        for node_id in node.state.nodes:
            if node_id not in conf.voters and node_id not in conf.learners:
                try:
                    raft.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, node_id))
                    node.runtime.wake(node.metadata)
                    log.info("metadata learner added", node=node_id)
                except LaminarError:
                    pass
                return  # one change at a time

    def _follow_cluster_with_voters(self, live: set[int], gone: set[int]) -> None:
        """Keep the metadata voters on nodes that are there (``metadata_voters.py``)."""
        node = self.node
        assert node.metadata is not None
        if any(group == METADATA_GROUP for group, _ in node.state.recovering):
            return  # a voter that lost its state is being re-admitted: one plan at a time
        raft = node.metadata.raft
        conf = raft.conf
        eligible = set(node.state.nodes) - gone - node.state.draining
        status = raft.status()
        followers = {
            peer: Follower(progress.match, progress.recent_active)
            for peer, progress in status.progress.items()
        }
        step = next_step(
            node.node_id, conf.voters, conf.learners, eligible, live, followers, raft.last_index
        )
        try:
            if isinstance(step, Promote):
                raft.propose_conf_change(ConfChange(ConfChangeType.PROMOTE, step.node_id))
            elif isinstance(step, Remove):
                raft.propose_conf_change(ConfChange(ConfChangeType.REMOVE, step.node_id))
            elif isinstance(step, HandOver):
                raft.transfer_leader(step.node_id)
            else:
                return
        except LaminarError as exc:  # another change pending, no entry of this term yet
            log.debug("metadata voter change deferred", step=step, reason=str(exc))
            return
        log.info("metadata voters follow the cluster", step=step)
        node.runtime.wake(node.metadata)

    def _forget_reaped(self) -> None:
        """Forget reaped nodes holding no replica, and drop forgotten nodes' metadata
        learners (one membership change at a time). A reaped metadata voter stays: voters
        change only by hand."""
        node = self.node
        assert node.metadata is not None
        raft = node.metadata.raft
        for node_id in sorted(self._reaped):
            if node_id not in node.state.nodes:
                self._reaped.discard(node_id)
                self._dead_since.pop(node_id, None)
            elif node_id not in raft.conf.voters and not node.state.replica_counts().get(node_id):
                self._propose({"op": "forget_node", "node_id": node_id})
        for learner in raft.conf.learners:
            if learner not in node.state.nodes:
                try:
                    raft.propose_conf_change(ConfChange(ConfChangeType.REMOVE, learner))
                    node.runtime.wake(node.metadata)
                    log.info("metadata learner of a forgotten node removed", node=learner)
                except LaminarError:
                    pass
                return

    def _propose(self, command: dict[str, int | str]) -> None:
        key = tuple(sorted(command.items()))
        if key in self._proposing:
            return
        self._proposing.add(key)

        async def propose() -> None:
            try:
                await self.node.metadata_service.propose(command)
            except (LaminarError, ConnectionError) as exc:
                log.debug("placement command not applied", command=command, error=str(exc))
            finally:
                self._proposing.discard(key)

        self.node.spawn(propose())
