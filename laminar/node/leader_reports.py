"""Partition leaders record themselves in the metadata, many partitions per command.

Metadata answers name each partition's leader, even on nodes not hosting it, so a leader
records itself (``set_leaders``). One command per partition meant thousands of metadata
entries, each forwarded, replicated, applied and answered, when a big topic was created or a
node's leaderships moved at once: the metadata group fell behind and the reports with it. Here
a node gathers the leaderships it won during one tick and records them in one command (at most
``MAX_PER_COMMAND``); a report no longer true when its turn comes (leadership lost, or a newer
term) is dropped, and a failed proposal is retried with whatever is still true then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from laminar.errors import LaminarError
from laminar.node.replica import Replica

log = structlog.get_logger(__name__)

MAX_PER_COMMAND = 2000
"""Partitions per ``set_leaders`` command (keeps a command well below a batch's size limit)."""
RETRY_SECONDS = 0.1


class LeaderReports:
    def __init__(
        self,
        node_id: int,
        propose: Callable[[dict[str, Any]], Awaitable[Any]],
        topic_id_of: Callable[[str], int | None],
        interval: float,
    ) -> None:
        self.node_id = node_id
        self._propose = propose
        self._topic_id_of = topic_id_of
        self._interval = interval
        self._pending: dict[int, Replica] = {}
        """group -> its replica, which became leader since the last report."""
        self._wakeup = asyncio.Event()

    def became_leader(self, replica: Replica) -> None:
        self._pending[replica.group] = replica
        self._wakeup.set()

    async def run(self) -> None:
        """Report pending leaderships, one command per round (forever; cancelled at stop)."""
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(self._interval)  # gather what else the tick elects
            self._wakeup.clear()
            pending, self._pending = self._pending, {}
            reports = [r for r in pending.values() if r.is_leader and not r.closed]
            for start in range(0, len(reports), MAX_PER_COMMAND):
                chunk = reports[start : start + MAX_PER_COMMAND]
                if not await self._report(chunk):
                    for replica in chunk:  # retried with the next round (newer ones win)
                        self._pending.setdefault(replica.group, replica)
                    self._wakeup.set()
                    await asyncio.sleep(RETRY_SECONDS)

    async def _report(self, replicas: list[Replica]) -> bool:
        partitions = []
        for replica in replicas:
            topic_id = self._topic_id_of(replica.topic)
            if topic_id is not None and replica.is_leader:
                partitions.append([topic_id, replica.partition, replica.raft.term])
        if not partitions:
            return True
        command = {"op": "set_leaders", "leader": self.node_id, "partitions": partitions}
        try:
            await self._propose(command)
        except (LaminarError, ConnectionError) as exc:
            log.debug("leadership not yet recorded", partitions=len(partitions), error=str(exc))
            return False
        return True
