"""Repairs a replica the runtime took offline after a storage fault (see MultiRaft.fail), or
one that could not be opened at all.

The node's reaction to ``replica_failed`` and ``open_failed``: record the fault (what `cluster
status` shows), then reopen the replica from its directory after a backoff, as long as this
node is still assigned the partition. Opening runs segment recovery, which cuts a torn or
corrupt tail of the active segment. After a crc failure (CorruptLogError) every batch is
checked, sealed segments too, and the log is cut before the first damaged one. A replica whose
log came back shorter than it had made durable may have acknowledged entries it no longer
holds: it is hosted as a replica that lost its state (amnesia.py), so it votes again only once
its group has re-admitted it. A log too damaged to open (a segment missing, an unreadable file)
is started over empty as such a replica, and its group sends it everything again. A fault in
the metadata group stops the node: its state machine cannot be replayed into a running node.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from laminar.errors import CorruptLogError
from laminar.node.amnesia import Amnesia
from laminar.node.metadata import METADATA_GROUP, MetadataState, group_id
from laminar.node.replica import LOG_DIR, Replica
from laminar.node.runtime import EXIT_STORAGE_FAILURE, MultiRaft
from laminar.segment.log import LogConfig, PartitionLog

log = structlog.get_logger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 10.0
STRIKE_MEMORY_S = 60.0
"""Faults of one group closer together than this back its repairs off further; a repaired
replica declines leadership handed to it for this long (placement prefers first replicas)."""

Host = Callable[[Replica, bool], bool]
"""Hosts a reopened replica (Readmission.opened): (replica, lost) -> whether it lost state."""
Spawn = Callable[[Coroutine[Any, Any, None]], object]


@dataclass(slots=True, frozen=True)
class Broken:
    """What a repair needs to know of a replica that failed or could not be opened."""

    group: int
    topic: str
    partition: int
    directory: Path
    log_config: LogConfig
    reopen: Callable[..., Replica]
    """Opens the replica from ``directory`` (``cut_damage=True``: cut before damage first)."""
    closed: asyncio.Event
    """Set once the failed replica's files are closed (a close may wait for a flush)."""

    @classmethod
    def of(cls, replica: Replica) -> Broken:
        assert replica.reopen is not None
        return cls(
            replica.group,
            replica.topic,
            replica.partition,
            replica.directory,
            replica.log.config,
            replica.reopen,
            replica.log_closed,
        )


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
        self._schedule(Broken.of(replica), error)

    def open_failed(self, broken: Broken, error: Exception) -> None:
        """Opening an assigned replica failed (its files are closed again)."""
        log.error(
            "opening a replica failed; taking it offline",
            group=broken.group,
            topic=broken.topic,
            partition=broken.partition,
            error=str(error),
            error_type=type(error).__name__,
        )
        self._schedule(broken, error)

    def _schedule(self, broken: Broken, error: Exception) -> None:
        now = time.monotonic()
        strikes, last = self._strikes.get(broken.group, (0, 0.0))
        strikes = strikes + 1 if now - last < STRIKE_MEMORY_S else 1
        self._strikes[broken.group] = (strikes, now)
        fault = ReplicaFault(
            broken.group,
            broken.topic,
            broken.partition,
            f"{type(error).__name__}: {error}",
            since=time.time(),
        )
        self.faults[broken.group] = fault
        delay = min(FIRST_RETRY_S * 2 ** (strikes - 1), MAX_RETRY_S)
        check_damage = isinstance(error, CorruptLogError)
        self.spawn(self._repair(broken, fault, delay, check_damage))

    async def _repair(
        self, broken: Broken, fault: ReplicaFault, delay: float, check_damage: bool
    ) -> None:
        await broken.closed.wait()
        while True:
            await asyncio.sleep(delay)
            if not self._still_wanted(broken):
                await self._forget(broken)
                return
            fault.state = "reopening"
            fault.attempts += 1
            try:
                fresh = await self._reopen(broken, check_damage)
            except Exception as exc:
                fault.state, fault.error = "offline", f"{type(exc).__name__}: {exc}"
                log.warning("replica repair failed; retrying", group=broken.group, error=str(exc))
                delay = min(delay * 2, MAX_RETRY_S)
                continue
            if not self._still_wanted(broken):
                fresh.close()
                await self._forget(broken)
                return
            self.faults.pop(broken.group, None)
            fresh.shun_leadership_until = time.monotonic() + STRIKE_MEMORY_S
            lost = self.host(fresh, False)  # the log is checked against its durable watermark
            log.info(
                "replica reopened",
                group=broken.group,
                topic=broken.topic,
                partition=broken.partition,
                end_offset=fresh.log.end_offset,
                lost_state=lost,
            )
            return

    async def _reopen(self, broken: Broken, check_damage: bool) -> Replica:
        """Open the replica again; with ``check_damage`` crc-check every batch first and, if
        one is damaged, mark the replica as lost durably before its log is cut there (a crash
        between the cut and the mark would let it vote with the shortened log). A log that
        cannot be opened even so is started over empty, marked lost the same way."""
        damaged = check_damage and await asyncio.to_thread(_is_damaged, broken)
        if damaged:
            self.amnesia.lose(broken.group)
        try:
            return await asyncio.to_thread(broken.reopen, cut_damage=damaged)
        except CorruptLogError as exc:
            log.error(
                "replica log cannot be opened; starting it over from its peers",
                group=broken.group,
                error=str(exc),
            )
        self.amnesia.lose(broken.group)
        await asyncio.to_thread(shutil.rmtree, broken.directory / LOG_DIR, True)
        return await asyncio.to_thread(broken.reopen)

    def _still_wanted(self, failed: Broken) -> bool:
        """This node is still assigned the partition and hosts no other replica of it."""
        if failed.group in self.runtime.replicas:
            return False
        topic = self.state.topics.get(failed.topic)
        if topic is None or group_id(topic.topic_id, failed.partition) != failed.group:
            return False
        assignment = topic.partitions[failed.partition]
        return self.node_id in assignment.replicas or assignment.adding == self.node_id

    async def _forget(self, failed: Broken) -> None:
        """The partition left this node while its replica was offline: drop the files too."""
        self.faults.pop(failed.group, None)
        hosted = self.runtime.replicas.get(failed.group)
        if hosted is None or hosted.directory != failed.directory:
            log.info("offline replica no longer assigned here; deleting", group=failed.group)
            if hosted is None:
                self.amnesia.closed(failed.group)
            await asyncio.to_thread(shutil.rmtree, failed.directory, True)
            self.amnesia.forget(failed.directory.name)


def _is_damaged(broken: Broken) -> bool:
    """Whether any batch (or index entry) of the closed replica's log fails its check, or
    the log cannot even be opened."""
    try:
        with PartitionLog.open(broken.directory / LOG_DIR, broken.log_config) as plog:
            plog.verify()
    except CorruptLogError as exc:
        log.warning("replica log is damaged", group=broken.group, error=str(exc))
        return True
    return False
