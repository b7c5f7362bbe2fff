"""One coordinator shard on the node that leads its internal partition: the asyncio driver of a
sans-I/O ``Coordinator``.

A shard is partition ``p`` of the internal topic ``__consumer_offsets``; its Raft log holds the
coordinator's records (``records.py``, one JSON record per fact). A driver lives for one term of
one leader:

* **Load.** It waits until the leader has committed everything in its log (its own term's first
  entry commits everything before it), then replays the log from its start into a new
  ``Coordinator``. Requests wait for that.
* **Serve.** A request runs synchronously against the coordinator, which writes records; the
  records of every request of one loop iteration become one Raft entry (one record batch), so
  a request's records are never split across entries, and a replay never sees half a request.
  A reply waits until every record written before it is committed, like an ``acks=all`` write.
* **Checkpoint.** When the records since the last checkpoint outnumber twice the live ones
  (and at least ``checkpoint_min_records``), the driver has the coordinator restate its live
  state; once that is committed, a replay may start where it starts (records fold per key, so
  replaying the older prefix too changes nothing), and every replica deletes the sealed
  segments before it. The partition stays about the size of the live state.
* **End.** Leadership lost, the replica closed or an append refused: the driver is dropped,
  waiting requests fail with ``NotLeaderError`` and clients go to the next coordinator, which
  loads what was committed. Unsent replies are never sent, so a client is only ever told what is
  durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from laminar.durable import Reply
from laminar.errors import CorruptLogError, LaminarError, NotLeaderError
from laminar.groups.classic import Waiting
from laminar.groups.coordinator import Coordinator, CoordinatorConfig
from laminar.groups.lineage import Lineage
from laminar.groups.records import Record, decode, encode
from laminar.node.leader_term import LeaderTerm
from laminar.node.replica import Replica
from laminar.segment import batch as record_batch

log = structlog.get_logger(__name__)

T = TypeVar("T")

CHUNK_BYTES = 1 << 20
"""A Raft entry of the internal partition holds at most about this much (a checkpoint of a big
shard, a group deletion with many offsets spans several; see ``_append``)."""
READ_BYTES = 4 << 20
"""Replay reads the log this much at a time."""


@dataclass(slots=True)
class Checkpoint:
    """A restatement of the live state being written: records ``[first_written,
    last_written)`` of the coordinator, starting at partition offset ``offset``."""

    first_written: int
    last_written: int
    offset: int = -1


class ShardDriver:
    def __init__(
        self,
        shard: int,
        replica: Replica,
        config: CoordinatorConfig,
        topics: Callable[[], Mapping[str, int]],
        replica_racks: Callable[[], Mapping[tuple[str, int], frozenset[str]]],
        now_ms: Callable[[], int],
        wake: Callable[[Replica], None],
        trimmed: Callable[[Replica, int], None],
        storage_fault: Callable[[Replica, Exception], None],
        checkpoint_min_records: int = 10_000,
        lineage: Callable[[], Lineage] = dict,
    ) -> None:
        self.shard = shard
        self._lineage = lineage
        self.replica = replica
        self.leader = LeaderTerm(replica)
        self.config = config
        self._topics = topics
        self._replica_racks = replica_racks
        self._now_ms = now_ms
        self._wake = wake
        self._trimmed = trimmed
        self._storage_fault = storage_fault
        self.checkpoint_min_records = checkpoint_min_records
        self.coordinator: Coordinator | None = None
        self.ended = False
        self._loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._releases: list[tuple[int, asyncio.Future[Any], Any]] = []
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        """Held classic-group requests (JoinGroup, SyncGroup) by their coordinator token."""
        self._append_scheduled = False
        self._since_checkpoint = 0
        """Records in the partition since the last checkpoint began (replayed ones included)."""
        self._checkpoint: Checkpoint | None = None
        self._load_task = asyncio.get_running_loop().create_task(self._load())

    @property
    def current(self) -> bool:
        """Still the coordinator: same leader term, replica open, nothing refused."""
        return not self.ended and self.leader.current

    # ------------------------------------------------------------------ requests

    async def call(self, request: Callable[[Coordinator, int], Reply[T]], timeout: float) -> T:
        """Run ``request(coordinator, now_ms)``; its typed errors are raised at once, its value
        is returned once everything it may depend on is durable."""
        if not self._loaded.done():
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._loaded)
        coordinator = self._coordinator()
        try:
            reply = request(coordinator, self._now_ms())
        except BaseException:
            self._deliver(coordinator)
            self._schedule_append()
            raise
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(reply.value, Waiting):
            # Held (a classic join or sync): answered by this or a later request, or a tick.
            self._waiting[reply.value.token] = future
        elif coordinator.is_released(reply):
            future.set_result(reply.value)
        else:
            self._releases.append((reply.after, future, reply.value))
        self._deliver(coordinator)
        self._schedule_append()
        # No timeout of its own: the entry commits, or leadership ends and ``end`` fails it.
        return await future

    def tick(self) -> None:
        """Expire sessions and rebalance timeouts, delete expired groups, checkpoint if due."""
        if self.coordinator is None or not self._usable():
            return
        self.coordinator.tick(self._now_ms())
        self._deliver(self.coordinator)
        if self._checkpoint is None and self._since_checkpoint > max(
            self.checkpoint_min_records, 2 * self._live_records()
        ):
            self._start_checkpoint()
        self._schedule_append()

    def topics_changed(self) -> None:
        if self.coordinator is None or not self._usable():
            return
        self.coordinator.set_replica_racks(self._replica_racks())
        self.coordinator.set_lineage(self._lineage())
        self.coordinator.topics_changed(self._topics(), self._now_ms())
        self._schedule_append()

    def end(self, reason: str) -> None:
        """This driver is done (leadership lost, replica closed): fail whoever waits."""
        if self.ended:
            return
        self.ended = True
        if self.coordinator is not None:
            self.coordinator.records_lost()
        self._load_task.cancel()
        error = NotLeaderError(f"not the coordinator any more: {reason}")
        if not self._loaded.done():
            self._loaded.set_exception(error)
            self._loaded.exception()  # retrieved: nobody may be waiting
        releases, self._releases = self._releases, []
        waiting, self._waiting = self._waiting, {}
        for future in [f for _after, f, _value in releases] + list(waiting.values()):
            if not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------------ internals

    def _deliver(self, coordinator: Coordinator) -> None:
        """Answers to held requests: errors at once, values once their records are durable."""
        for token, outcome in coordinator.classic.take_completions():
            future = self._waiting.pop(token, None)
            if future is None or future.done():
                continue  # its client went away
            if isinstance(outcome, LaminarError):
                future.set_exception(outcome)
            elif coordinator.is_released(outcome):
                future.set_result(outcome.value)
            else:
                self._releases.append((outcome.after, future, outcome.value))

    def _usable(self) -> bool:
        if not self.current:
            self.end("leadership lost")
            return False
        return True

    def _coordinator(self) -> Coordinator:
        if not self._usable() or self.coordinator is None:
            raise NotLeaderError(f"not the coordinator of shard {self.shard} any more")
        return self.coordinator

    async def _load(self) -> None:
        replica = self.replica
        try:
            await self.leader.log_committed()
            records = self._replay(replica.log.start_offset, replica.raft.commit + 1)
            self._since_checkpoint = len(records)
            self.coordinator = Coordinator(
                self.config,
                self._topics(),
                self._now_ms(),
                records,
                self._replica_racks(),
                self._lineage(),
            )
        except (LaminarError, OSError) as exc:
            self.end(f"could not load: {exc}")
            if isinstance(exc, CorruptLogError):  # offline and repaired; another replica leads
                self._storage_fault(replica, exc)
            return
        log.info(
            "group coordinator loaded",
            shard=self.shard,
            term=self.leader.term,
            records=len(records),
            groups=len(self.coordinator.state.groups),
        )
        self._loaded.set_result(None)

    def _replay(self, start: int, end: int) -> list[Record]:
        records: list[Record] = []
        log_ = self.replica.log
        while start < end:
            batches = log_.batches(start, end, READ_BYTES)
            for batch in batches:
                header = record_batch.read_header(batch)
                start = header.base_offset + header.last_offset_delta + 1
                if record_batch.is_control(header):
                    continue
                for record in record_batch.decode_records(batch):
                    try:
                        records.append(decode(record.value or b""))
                    except ValueError as exc:  # no coordinator wrote it: skip, say so
                        log.error("skipping a foreign record", shard=self.shard, error=str(exc))
        return records

    def _live_records(self) -> int:
        assert self.coordinator is not None
        total = 0
        for group in self.coordinator.state.groups.values():
            total += 2 + len(group.members) + len(group.target_members)
            total += len(group.assignments) + len(group.offsets) + (group.classic is not None)
        return total

    def _start_checkpoint(self) -> None:
        assert self.coordinator is not None
        self._append()  # what is pending goes first: the checkpoint starts an entry of its own
        first = self.coordinator.written
        self.coordinator.checkpoint()
        self._checkpoint = Checkpoint(first, self.coordinator.written)
        self._append(first_of_checkpoint=True)

    def _schedule_append(self) -> None:
        if not self._append_scheduled:
            self._append_scheduled = True
            asyncio.get_running_loop().call_soon(self._append)

    def _append(self, first_of_checkpoint: bool = False) -> None:
        """Propose what the coordinator wrote as Raft entries of at most ``CHUNK_BYTES``.

        Requests of one loop iteration share an entry; an entry is split only when one call's
        records exceed a chunk, which only checkpoints (restatements: any prefix replays to the
        state before them) and group deletions (tombstones of a group with no members: any
        prefix is a smaller group) do.
        """
        self._append_scheduled = False
        if self.coordinator is None or not self._usable():
            return
        records = self.coordinator.take_batch()
        if not records:
            return
        written = self.coordinator.written - len(records)
        now = self._now_ms()
        chunk: list[tuple[None, bytes, tuple[()], int]] = []
        size = 0
        for record in records:
            data = encode(record)
            chunk.append((None, data, (), now))
            size += len(data) + 16
            written += 1
            if size >= CHUNK_BYTES:
                self._propose(chunk, written, first_of_checkpoint)
                first_of_checkpoint, chunk, size = False, [], 0
        if chunk:
            self._propose(chunk, written, first_of_checkpoint)
        self._since_checkpoint += len(records)
        self._wake(self.replica)

    def _propose(self, chunk: list[Any], written: int, first_of_checkpoint: bool) -> None:
        try:
            base = self.leader.propose(
                record_batch.build_batch(chunk),
                len(chunk),
                lambda f: self._committed(f, written),
            )
        except LaminarError as exc:  # a leader transfer under way, or no longer the leader
            self.end(f"append refused: {exc}")
            return
        if first_of_checkpoint and self._checkpoint is not None:
            self._checkpoint.offset = base

    def _committed(self, future: asyncio.Future[Any], written: int) -> None:
        if future.cancelled() or future.exception() is not None:
            self.end("an append did not commit")
            return
        if self.ended or self.coordinator is None:
            return
        self.coordinator.records_committed(written)
        done = self._checkpoint
        if done is not None and written >= done.last_written and done.offset >= 0:
            self._checkpoint = None
            self._since_checkpoint = self.coordinator.written - done.first_written
            self._trimmed(self.replica, done.offset)
        if self._releases:
            keep = []
            for after, waiting, value in self._releases:
                if after <= written:
                    if not waiting.done():
                        waiting.set_result(value)
                else:
                    keep.append((after, waiting, value))
            self._releases = keep
