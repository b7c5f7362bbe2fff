"""Graceful leadership hand-off: a node that is asked to stop first gives away what it leads.

Without it, every partition a stopping node leads is leaderless until its followers' election
timeout fires, and producers see errors or stalls at every step of a rolling restart. With
it, each group's leader transfers leadership (Raft's TIMEOUT_NOW) to its most caught-up live
voter, and the node waits until the new leaders are recorded in the metadata too, so clients
that refresh metadata go straight to them. Bounded by a timeout: a group with no live peer to
hand over to is simply left, as a crash would leave it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import structlog

from laminar.errors import LaminarError
from laminar.node.replica import Replica

log = structlog.get_logger(__name__)

RETRY_S = 0.6
"""A transfer that has not happened by then (the target lagged, a message was lost) is
asked for again; the Raft core drops a pending transfer after an election timeout."""


async def hand_off_leadership(
    node_id: int,
    replicas: Callable[[], Iterable[Replica]],
    live: Callable[[], set[int]],
    leader_on_record: Callable[[Replica], int],
    wake: Callable[[Replica], None],
    timeout: float,
) -> int:
    """Transfer every leadership this node holds; returns how many groups it still leads.

    ``leader_on_record`` is the leader the metadata names for a replica's partition while a
    live metadata leader can still change that record (0 otherwise, and for groups the
    metadata does not track). Groups with no live voter to take over (the whole cluster is
    stopping) are left at once.
    """
    deadline = time.monotonic() + timeout
    asked: dict[int, float] = {}
    while time.monotonic() < deadline:
        now, peers = time.monotonic(), live()
        handing = [
            (replica, target)
            for replica in replicas()
            if not replica.closed and replica.is_leader
            for target in [_successor(replica, node_id, peers)]
            if target
        ]
        recording = [
            r
            for r in replicas()
            if not r.closed and not r.is_leader and leader_on_record(r) == node_id
        ]
        if not handing and not recording:
            break
        for replica, target in handing:
            if now - asked.get(replica.group, -RETRY_S) >= RETRY_S:
                asked[replica.group] = now
                try:
                    replica.raft.transfer_leader(target)
                except LaminarError:
                    continue
                wake(replica)
        await asyncio.sleep(0.02)
    still = sum(1 for r in replicas() if not r.closed and r.is_leader)
    log.info("leadership handed off", still_leading=still)
    return still


def _successor(replica: Replica, node_id: int, live: set[int]) -> int:
    """The live voter with the most of the log (0: nobody to hand over to)."""
    status = replica.raft.status()
    candidates = [
        (progress.match, peer)
        for peer, progress in status.progress.items()
        if peer != node_id
        and peer in live
        and peer in replica.raft.conf.voters
        and progress.recent_active
    ]
    return max(candidates)[1] if candidates else 0
