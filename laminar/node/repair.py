"""Repairs a replica the runtime took offline after a storage fault (see MultiRaft.fail).

The node's reaction to ``replica_failed``: record the fault (what `cluster status` shows),
then reopen the replica from its directory after a backoff, as long as this node is still
assigned the partition. Opening runs segment recovery, which cuts a torn or corrupt tail of the
active segment. After a crc failure (CorruptLogError) every batch is checked, sealed segments
too, and the log is cut before the first damaged one. A replica whose log came back shorter
than it had made durable may have acknowledged entries it no longer holds: it is hosted as a
replica that lost its state (amnesia.py), so it votes again only once its group has
re-admitted it. A fault in the metadata group stops the node: its state machine cannot be
replayed into a running node.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from laminar.errors import CorruptLogError
from laminar.node.amnesia import Amnesia
from laminar.node.metadata import METADATA_GROUP, MetadataState, group_id
from laminar.node.replica import Replica
from laminar.node.runtime import EXIT_STORAGE_FAILURE, MultiRaft
from laminar.segment.log import PartitionLog

log = structlog.get_logger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 10.0
STRIKE_MEMORY_S = 60.0
"""Faults of one group closer together than this back its repairs off further; a repaired
replica declines leadership handed to it for this long (placement prefers first replicas)."""

Host = Callable[[Replica, bool], bool]
"""Hosts a reopened replica (Readmission.opened): (replica, lost) -> whether it lost state."""
Spawn = Callable[[Coroutine[Any, Any, None]], object]


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
    def __init__(
        self,
        node_id: int,
        state: MetadataState,
        runtime: MultiRaft,
        amnesia: Amnesia,
        host: Host,
        spawn: Spawn,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self.runtime = runtime
        self.amnesia = amnesia
        self.host = host
        self.spawn = spawn
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
        check_damage = isinstance(error, CorruptLogError)
        self.spawn(self._repair(replica, fault, delay, check_damage))

    async def _repair(
        self, failed: Replica, fault: ReplicaFault, delay: float, check_damage: bool
    ) -> None:
        await failed.log_closed.wait()
        while True:
            await asyncio.sleep(delay)
            if not self._still_wanted(failed):
                await self._forget(failed)
                return
            fault.state = "reopening"
            fault.attempts += 1
            try:
                fresh = await self._reopen(failed, check_damage)
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
            lost = self.host(fresh, False)  # the log is checked against its durable watermark
            log.info(
                "replica reopened",
                group=failed.group,
                topic=failed.topic,
                partition=failed.partition,
                end_offset=fresh.log.end_offset,
                lost_state=lost,
            )
            return

    async def _reopen(self, failed: Replica, check_damage: bool) -> Replica:
        """Open the replica again; with ``check_damage`` crc-check every batch first and, if
        one is damaged, mark the replica as lost durably before its log is cut there (a crash
        between the cut and the mark would let it vote with the shortened log)."""
        assert failed.reopen is not None
        damaged = check_damage and await asyncio.to_thread(_is_damaged, failed)
        if damaged:
            self.amnesia.lose(failed.group)
        return await asyncio.to_thread(failed.reopen, cut_damage=damaged)

    def _still_wanted(self, failed: Replica) -> bool:
        """This node is still assigned the partition and hosts no other replica of it."""
        if failed.group in self.runtime.replicas:
            return False
        topic = self.state.topics.get(failed.topic)
        if topic is None or group_id(topic.topic_id, failed.partition) != failed.group:
            return False
        assignment = topic.partitions[failed.partition]
        return self.node_id in assignment.replicas or assignment.adding == self.node_id

    async def _forget(self, failed: Replica) -> None:
        """The partition left this node while its replica was offline: drop the files too."""
        self.faults.pop(failed.group, None)
        hosted = self.runtime.replicas.get(failed.group)
        if hosted is None or hosted.directory != failed.directory:
            log.info("offline replica no longer assigned here; deleting", group=failed.group)
            if hosted is None:
                self.amnesia.closed(failed.group)
            await asyncio.to_thread(shutil.rmtree, failed.directory, True)
            self.amnesia.forget(failed.directory.name)


def _is_damaged(failed: Replica) -> bool:
    """Whether any batch (or index entry) of the closed replica's log fails its check."""
    with PartitionLog.open(failed.directory / "log", failed.log.config) as plog:
        try:
            plog.verify()
        except CorruptLogError as exc:
            log.warning("replica log is damaged", group=failed.group, error=str(exc))
            return True
    return False
