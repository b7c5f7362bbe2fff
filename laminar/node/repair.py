"""Repairs a replica the runtime took offline after a storage fault (see MultiRaft.fail).

The node's reaction to ``replica_failed``: record the fault (what `cluster status` shows),
then reopen the replica from its directory after a backoff, as long as this node is still
assigned the partition. Opening runs segment recovery, which cuts a torn or corrupt tail of the
active segment. After a crc failure (CorruptLogError) every batch is checked first, sealed
segments too, and the log is cut before the first damaged one: such a replica may have
acknowledged entries it no longer holds, so it rejoins without voting or campaigning until it
has them again from the leader (Replica.rejoin_end). A fault in the metadata group stops the
node: its state machine cannot be replayed into a running node.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from laminar.errors import CorruptLogError
from laminar.node.metadata import METADATA_GROUP, group_id
from laminar.node.replica import Replica
from laminar.node.runtime import EXIT_STORAGE_FAILURE

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 10.0
STRIKE_MEMORY_S = 60.0
"""Faults of one group closer together than this back its repairs off further; a repaired
replica declines leadership handed to it for this long (placement prefers first replicas)."""


@dataclass(slots=True)
class ReplicaFault:
    """An offline replica of this node, as `cluster status` shows it."""

    group: int
    topic: str
    partition: int
    error: str
    state: str = "offline"
    """offline: waiting for the next repair attempt; reopening: being reopened."""
    attempts: int = 0
    since: float = 0.0


class ReplicaRepair:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.faults: dict[int, ReplicaFault] = {}
        self._strikes: dict[int, tuple[int, float]] = {}

    def replica_failed(self, replica: Replica, error: Exception) -> None:
        """MultiRaft's ``on_replica_failed``: the replica is closed and offline already."""
        if replica.group == METADATA_GROUP:
            log.critical("metadata replica failed; stopping the node", error=str(error))
            os._exit(EXIT_STORAGE_FAILURE)
        now = time.monotonic()
        strikes, last = self._strikes.get(replica.group, (0, 0.0))
        strikes = strikes + 1 if now - last < STRIKE_MEMORY_S else 1
        self._strikes[replica.group] = (strikes, now)
        fault = ReplicaFault(
            replica.group,
            replica.topic,
            replica.partition,
            f"{type(error).__name__}: {error}",
            since=time.time(),
        )
        self.faults[replica.group] = fault
        delay = min(FIRST_RETRY_S * 2 ** (strikes - 1), MAX_RETRY_S)
        cut_damage = isinstance(error, CorruptLogError)
        self.node.spawn(self._repair(replica, fault, delay, cut_damage))

    async def _repair(
        self, failed: Replica, fault: ReplicaFault, delay: float, cut_damage: bool
    ) -> None:
        await failed.log_closed.wait()
        assert failed.reopen is not None
        while True:
            await asyncio.sleep(delay)
            if not self._still_wanted(failed):
                await self._forget(failed)
                return
            fault.state = "reopening"
            fault.attempts += 1
            try:
                fresh = await asyncio.to_thread(failed.reopen, cut_damage=cut_damage)
            except Exception as exc:
                fault.state, fault.error = "offline", f"{type(exc).__name__}: {exc}"
                log.warning("replica repair failed; retrying", group=failed.group, error=str(exc))
                delay = min(delay * 2, MAX_RETRY_S)
                continue
            if not self._still_wanted(failed):
                fresh.close()
                await self._forget(failed)
                return
            self.faults.pop(failed.group, None)
            fresh.shun_leadership_until = time.monotonic() + STRIKE_MEMORY_S
            self.node.runtime.add(fresh)
            log.info(
                "replica reopened",
                group=failed.group,
                topic=failed.topic,
                partition=failed.partition,
                end_offset=fresh.log.end_offset,
                rejoin_end=fresh.rejoin_end,
            )
            return

    def _still_wanted(self, failed: Replica) -> bool:
        """This node is still assigned the partition and hosts no other replica of it."""
        node = self.node
        if failed.group in node.runtime.replicas:
            return False
        topic = node.state.topics.get(failed.topic)
        if topic is None or group_id(topic.topic_id, failed.partition) != failed.group:
            return False
        assignment = topic.partitions[failed.partition]
        return node.node_id in assignment.replicas or assignment.adding == node.node_id

    async def _forget(self, failed: Replica) -> None:
        """The partition left this node while its replica was offline: drop the files too."""
        self.faults.pop(failed.group, None)
        hosted = self.node.runtime.replicas.get(failed.group)
        if hosted is None or hosted.directory != failed.directory:
            log.info("offline replica no longer assigned here; deleting", group=failed.group)
            await asyncio.to_thread(shutil.rmtree, failed.directory, True)
