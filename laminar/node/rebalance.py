"""Replica placement over time: which moves the metadata leader starts, and how a partition's
leader carries one out.

A move replaces one replica of one partition (source -> target) in four Raft steps, each a
single-server membership change: add the target as a learner, let it catch up, promote it,
remove the source (transferring leadership first if the source leads). Only then does the
metadata record the new replica set, and the source deletes its copy. A partition therefore
never has fewer in-sync replicas than before the move started.
"""

from __future__ import annotations

from dataclasses import dataclass

from laminar.node.metadata import MetadataState
from laminar.raft import ConfChange, ConfChangeType, RaftNode

CAUGHT_UP_LAG = 0
"""A learner is promoted once it holds everything the leader has (lag in offsets)."""


@dataclass(frozen=True, slots=True)
class Move:
    topic_id: int
    partition: int
    source: int
    target: int

    def command(self, op: str) -> dict[str, int | str]:
        return {
            "op": op,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "from": self.source,
            "to": self.target,
        }


def plan_moves(
    state: MetadataState, live: set[int], gone: set[int], max_concurrent: int
) -> list[Move]:
    """Moves to start now: first evacuate gone or draining nodes, then even out replica counts
    so that live nodes differ by at most one; never more than ``max_concurrent`` at once."""
    partitions = [
        (topic.topic_id, index, assignment)
        for topic in sorted(state.topics.values(), key=lambda t: t.topic_id)
        for index, assignment in enumerate(topic.partitions)
    ]
    budget = max_concurrent - sum(1 for *_, a in partitions if a.moving)
    # (gossip may call a gone node suspect again for a moment: gone wins)
    leaving = gone | state.draining
    eligible = sorted(n for n in live if n in state.nodes and n not in leaving)
    if budget <= 0 or not eligible:
        return []
    counts = {n: 0 for n in eligible}
    for *_, assignment in partitions:
        for node in (*assignment.replicas, assignment.adding):
            if node in counts:
                counts[node] += 1
    moves: list[Move] = []
    busy: set[tuple[int, int]] = set()

    def least_loaded(exclude: list[int]) -> int | None:
        candidates = [n for n in eligible if n not in exclude]
        return min(candidates, key=lambda n: (counts[n], n)) if candidates else None

    for topic_id, index, assignment in partitions:
        if len(moves) >= budget:
            return moves
        if assignment.moving:
            continue
        source = next((r for r in assignment.replicas if r in leaving), None)
        if source is None:
            continue
        target = least_loaded(assignment.replicas)
        if target is None:
            continue
        moves.append(Move(topic_id, index, source, target))
        busy.add((topic_id, index))
        counts[target] += 1

    while len(moves) < budget:
        most = max(eligible, key=lambda n: (counts[n], -n))
        least = min(eligible, key=lambda n: (counts[n], n))
        if counts[most] - counts[least] <= 1:
            break
        candidate = next(
            (
                (topic_id, index)
                for topic_id, index, a in partitions
                if not a.moving
                and (topic_id, index) not in busy
                and most in a.replicas
                and least not in a.replicas
            ),
            None,
        )
        if candidate is None:
            break
        moves.append(Move(candidate[0], candidate[1], most, least))
        busy.add(candidate)
        counts[most] -= 1
        counts[least] += 1
    return moves


def move_done(raft: RaftNode, source: int, target: int) -> bool:
    """The committed configuration has the target as a voter and no longer the source."""
    committed = raft.committed_conf
    return target in committed.voters and source not in (*committed.voters, *committed.learners)


def advance_move(raft: RaftNode, source: int, target: int, target_ready: bool) -> bool:
    """Take the next Raft step of a move on the partition's leader; True once it is done.

    ``target_ready``: the target node has applied the move's ``start_move`` (see
    ``PartitionAssignment.target_ready``). Raft knows a replica only by its node id, so until
    then an older replica of the group still hosted on the target node (one it held before
    and whose removal it has not applied yet) would answer for the learner: its
    acknowledgements would raise the leader's match and get the target promoted, and the fresh
    replica that replaces it moments later would face a leader sure it holds everything up to
    that match, a voter it can never catch up (and a copy counted towards commit that is gone).
    """
    if move_done(raft, source, target):
        return True
    conf = raft.conf
    if not conf.same_members(raft.committed_conf):
        return False  # one change at a time: wait for the pending one to commit
    if target not in conf.voters and target not in conf.learners:
        if not target_ready:
            return False
        raft.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, target))
    elif target in conf.learners:
        progress = raft.status().progress.get(target)
        if progress is not None and progress.match >= raft.last_index - CAUGHT_UP_LAG:
            raft.propose_conf_change(ConfChange(ConfChangeType.PROMOTE, target))
    elif source == raft.id:
        raft.transfer_leader(target)  # a leader cannot remove itself; the new one will
    else:
        raft.propose_conf_change(ConfChange(ConfChangeType.REMOVE, source))
    return False


def advance_recovery(raft: RaftNode, node: int, removed: bool) -> bool:
    """Take the next Raft step of re-admitting a voter that lost its state; True once done.

    The replica leaves the voters, comes back as a learner and is promoted once it holds the
    leader's whole log (the way a move adds a replica). ``removed``: the caller saw it out of
    the voters in this leader term, so a voter now is one promoted since. Removing it first
    is what makes its old votes harmless: the removal commits on a majority that intersects
    every majority it voted in, so it happens in a later term than any of its old votes.
    """
    conf = raft.conf
    if not conf.same_members(raft.committed_conf):
        return False  # one change at a time: wait for the pending one to commit
    if node in conf.voters:
        if removed:
            return True
        raft.propose_conf_change(ConfChange(ConfChangeType.REMOVE, node))
    elif node in conf.learners:
        progress = raft.status().progress.get(node)
        if progress is not None and progress.match >= raft.last_index - CAUGHT_UP_LAG:
            raft.propose_conf_change(ConfChange(ConfChangeType.PROMOTE, node))
    else:
        raft.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, node))
    return False


def undo_move(raft: RaftNode, target: int) -> bool:
    """Take the next Raft step of abandoning a move whose target is gone (called only while the
    move is not done, so the source is still a member); True once the target is out of the
    committed configuration and the partition has its replicas of before the move."""
    committed = raft.committed_conf
    if target not in (*committed.voters, *committed.learners):
        return True
    if raft.conf.same_members(committed):  # one change at a time
        raft.propose_conf_change(ConfChange(ConfChangeType.REMOVE, target))
    return False
