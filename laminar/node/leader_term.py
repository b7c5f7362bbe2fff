"""One leader term of one replica: what a state machine hosted on a Raft leader needs.

The consumer-group coordinator (``groups/shard.py``) and the queue state of a partition
(``queues/driver.py``) both live for exactly one term of one leader: they load what the log
holds once it is committed, write by proposing entries, answer only once those commit, and stop
the moment leadership (or the replica) goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from laminar.errors import NotLeaderError
from laminar.node.replica import Replica, Waiter


class LeaderTerm:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.term = replica.raft.term

    @property
    def current(self) -> bool:
        """The replica is open and still leads, in the same term."""
        replica = self.replica
        return not replica.closed and replica.is_leader and replica.raft.term == self.term

    async def log_committed(self) -> None:
        """Wait until everything the log held at takeover is committed (the term's first entry
        commits every earlier one); NotLeaderError if leadership ends first."""
        raft = self.replica.raft
        target = raft.last_index
        if raft.commit < target:
            waiter = Waiter(target, asyncio.get_running_loop().create_future())
            self.replica.commit_waiters.append(waiter)
            await waiter.future
        if not self.current:
            raise NotLeaderError("leadership lost while loading")

    def propose(
        self, data: bytes, count: int, committed: Callable[[asyncio.Future[Any]], None]
    ) -> int:
        """Propose one entry of ``count`` offsets; ``committed`` gets a future that is done once
        it commits, or failed if it never will (leadership lost). Returns its first offset;
        raises the core's refusal (not the leader, a transfer under way)."""
        base, last = self.replica.raft.propose(data, count)
        future = asyncio.get_running_loop().create_future()
        self.replica.commit_waiters.append(Waiter(last, future))
        future.add_done_callback(committed)
        return base
