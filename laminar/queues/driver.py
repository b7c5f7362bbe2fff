"""The share groups of one partition on its leader: the asyncio driver of ``SharePartition``s.

One ``PartitionQueues`` lives for one leader term of one partition replica (as a consumer
group shard's ``ShardDriver`` does):

* **Load.** It waits until the leader has committed its whole log, finds the newest checkpoint
  batch (``log_codec``) by walking control batches back from the log's end, and replays every
  share batch from there into one ``SharePartition`` per group.
* **Facts.** Before a group acquires, the records it may hand out are looked at once
  (``_scan``): offsets of control batches are skipped (they hold no record), records carrying
  a future ``laminar-deliver-at`` header are deferred, and the group learns the partition's
  high watermark as its end. Each record is read once per group (and once more after a
  failover); delayed records then sit in a heap, never in a scan.
* **Settings.** Each group's ``ShareConfig`` (its lock and delivery limit, stored cluster-wide,
  ``laminar.queues.config``) is handed to its ``SharePartition`` before every use; loading
  first waits (boundedly) for this node's copy of the settings to catch up after a restart.
* **Append.** The records every group wrote in one loop iteration become one control batch,
  proposed to the partition's own Raft group; a request's reply waits until the records it
  depends on are committed (acquisitions too: a delivery a member has seen survives a
  failover with its delivery count).
* **Checkpoint.** When the share records since the last checkpoint outnumber twice the live
  state (and ``checkpoint_min_records``), or the log rolled a segment since, every group's state
  is restated in one checkpoint batch, so a new leader never reads further back than that and
  retention (which keeps the active segment) never deletes the newest checkpoint.
* **End.** Leadership lost or the replica closed: waiting requests fail with NotLeader and the
  client goes to the new leader, which loads what was committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import structlog

from laminar.durable import Reply
from laminar.errors import (
    CorruptBatchError,
    CorruptLogError,
    LaminarError,
    NotLeaderError,
    ReceiptExpiredError,
)
from laminar.node.leader_term import LeaderTerm
from laminar.node.replica import Replica
from laminar.queues.log_codec import decode_batch, encode_batch
from laminar.queues.partition import (
    AcquiredRun,
    SettleRun,
    ShareConfig,
    SharePartition,
)
from laminar.queues.records import Record
from laminar.segment import batch as record_batch

log = structlog.get_logger(__name__)

DELIVER_AT_HEADER = "laminar-deliver-at"
"""A record header (ASCII ms since the epoch): share groups deliver it no earlier."""
DELIVER_AT_BYTES = DELIVER_AT_HEADER.encode()
READ_BYTES = 4 << 20
POLL_SLICE = 0.05


class PartitionQueues:
    def __init__(
        self,
        replica: Replica,
        config_for: Callable[[str], ShareConfig],
        settings_ready: Callable[[], Awaitable[None]],
        now_ms: Callable[[], int],
        wake: Callable[[Replica], None],
        storage_fault: Callable[[Replica, Exception], None],
        checkpoint_min_records: int = 10_000,
    ) -> None:
        self.replica = replica
        self.leader = LeaderTerm(replica)
        self._config_for = config_for
        """A group's settings (cluster-wide, laminar.queues.config): the same object until
        they change, so applying them before each use costs an identity check."""
        self._settings_ready = settings_ready
        self._now_ms = now_ms
        self._wake = wake
        self._storage_fault = storage_fault
        self.checkpoint_min_records = checkpoint_min_records
        self.groups: dict[str, SharePartition] = {}
        self.ended = False
        self._scanned: dict[str, int] = {}
        self._releases: list[tuple[str, int, asyncio.Future[None]]] = []
        self._append_scheduled = False
        self._append_forced = False
        self._appending = 0  # appends proposed and not committed yet
        self._append_waiting = False  # records made while one was: they go when it commits
        self._since_checkpoint = 0
        self._checkpoint_at = -1  # offset of the newest checkpoint batch (-1: none yet)
        loop = asyncio.get_running_loop()
        self._loaded: asyncio.Future[None] = loop.create_future()
        self._load_task = loop.create_task(self._load())

    @property
    def current(self) -> bool:
        return not self.ended and self.leader.current

    # ------------------------------------------------------------------ requests

    async def fetch(
        self,
        group: str,
        member_id: str,
        settles: Sequence[SettleRun],
        max_records: int,
        lock_ms: int | None,
        from_earliest: bool,
        max_wait_ms: int,
    ) -> tuple[list[list[tuple[int, LaminarError]]] | LaminarError, list[AcquiredRun]]:
        """Settle the runs ``settles`` (the result: per run, the offsets that failed with
        their error; or one error for all of them), then acquire up to ``max_records``
        (long-polling up to ``max_wait_ms`` while none is available) as runs; returns once
        all of it is durable."""
        await self.ready()
        waits: list[tuple[str, int]] = []
        results: list[list[tuple[int, LaminarError]]] | LaminarError = []
        if settles:
            partition = self.groups.get(group)
            if partition is None:
                results = ReceiptExpiredError(f"group {group} holds nothing here")
            else:
                self._configure(group, partition)
                reply = partition.settle_runs(member_id, settles, self._now_ms())
                results = reply.value
                waits.append((group, reply.after))
        acquired: list[AcquiredRun] = []
        if max_records > 0:
            partition = self._group(group, from_earliest)
            deadline = asyncio.get_running_loop().time() + max_wait_ms / 1000
            while True:
                self._scan(group, partition)
                got = partition.acquire_runs(member_id, max_records, self._now_ms(), lock_ms)
                acquired = got.value
                if acquired:  # an empty acquire hands out nothing that must be durable
                    waits.append((group, got.after))
                remaining = deadline - asyncio.get_running_loop().time()
                if acquired or remaining <= 0:
                    break
                await self._new_data(min(remaining, POLL_SLICE))
                self._check()
        if waits:  # a reply waits for these records: append even if they are only skips
            self._append_forced = True
        self._schedule_append()
        for name, after in waits:
            await self._released(name, after)
        return results, acquired

    def read(self, spans: Iterable[tuple[int, int]]) -> list[bytes]:
        """Whole batches holding the offsets of ``spans`` (``[first, end)`` ranges, e.g. the
        acquired runs), each batch once, crc-checked. All of them, whatever their size: an
        acquired record the member never sees would only come back once its lock ran out
        (``max_records`` bounds a fetch instead)."""
        out: list[bytes] = []
        covered = -1
        for lo, hi in sorted(spans):
            offset = max(lo, covered + 1)
            while offset < hi:
                batch = self.replica.log.batches(offset, offset + 1, READ_BYTES)[0]
                header = record_batch.read_header(batch)
                covered = header.base_offset + header.last_offset_delta
                out.append(bytes(batch))
                offset = covered + 1
        return out

    async def ready(self) -> None:
        """Wait until loaded (NotLeaderError if leadership ends first)."""
        if not self._loaded.done():
            async with asyncio.timeout(10.0):
                await asyncio.shield(self._loaded)
        self._check()

    def describe(self, group: str) -> Any:
        partition = self.groups.get(group)
        return None if partition is None else partition.describe(self._now_ms())

    def oldest_unacked_age(self, group: str) -> int:
        """Milliseconds since the oldest record the group has not done was written (0: none)."""
        partition = self.groups.get(group)
        log_ = self.replica.log
        if partition is None or not log_.start_offset <= partition.start < partition.end:
            return 0
        batch = log_.batches(partition.start, partition.start + 1, READ_BYTES)[0]
        try:
            records = record_batch.decode_records(batch)
        except CorruptBatchError:  # a compressed batch that does not inflate: its first time
            return max(0, self._now_ms() - record_batch.read_header(batch).first_timestamp)
        for record in records:
            if record.offset >= partition.start:
                return max(0, self._now_ms() - record.timestamp)
        return 0

    # ------------------------------------------------------------------ driver

    def tick(self) -> list[tuple[str, list[Any]]]:
        """Expire locks, make due delays available, checkpoint if due; returns the dead
        letters each group wants copied aside ((group, letters))."""
        if not self._loaded.done() or not self._usable():
            return []
        now = self._now_ms()
        letters = []
        for name, partition in self.groups.items():
            self._configure(name, partition)
            partition.tick(now)
            taken = partition.take_dead_letters(limit=500)
            if taken:
                letters.append((name, taken))
        if not self._appending and self._checkpoint_due():  # restates what is committed
            self._checkpoint()
        self._schedule_append()
        return letters

    def dead_letters_done(self, group: str, offsets: list[int], copied: bool) -> None:
        partition = self.groups.get(group)
        if partition is None or not self._usable():
            return
        if copied:
            partition.dead_letters_copied(offsets)
            self._schedule_append()
        else:
            partition.dead_letters_failed(offsets)

    def end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        for partition in self.groups.values():
            partition.records_lost()
        self._load_task.cancel()
        error = NotLeaderError(f"not the partition's leader any more: {reason}")
        if not self._loaded.done():
            self._loaded.set_exception(error)
            self._loaded.exception()
        releases, self._releases = self._releases, []
        for _group, _after, future in releases:
            if not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------------ internals

    def _check(self) -> None:
        if not self._usable():
            raise NotLeaderError("not the partition's leader any more")

    def _usable(self) -> bool:
        if not self.current:
            self.end("leadership lost")
            return False
        return True

    def _group(self, group: str, from_earliest: bool) -> SharePartition:
        partition = self.groups.get(group)
        if partition is None:
            log_ = self.replica.log
            start = log_.start_offset if from_earliest else self.replica.high_watermark
            partition = SharePartition(self._config_for(group), self._now_ms(), start=start)
            self.groups[group] = partition
        else:
            self._configure(group, partition)
        return partition

    def _configure(self, group: str, partition: SharePartition) -> None:
        """Apply the group's current settings (they may have changed since the last use)."""
        config = self._config_for(group)
        if partition.config is not config:
            partition.configure(config)

    def _scan(self, group: str, partition: SharePartition) -> None:
        """Tell ``partition`` what it may hand out next: skips, delays, the end."""
        replica = self.replica
        if partition.start < replica.log.start_offset:  # retention took records never done
            partition.advance_start(replica.log.start_offset)
        start = max(self._scanned.get(group, 0), partition.start)
        end = min(replica.high_watermark, partition.window_end)
        now = self._now_ms()
        while start < end:
            for batch in replica.log.batches(start, end, READ_BYTES):
                header = record_batch.read_header(batch)
                last = header.base_offset + header.last_offset_delta
                # A batch may reach past ``end`` (the group's window): only what lies before
                # is told now; the next scan starts at ``end`` and reads the rest.
                if record_batch.is_control(header):
                    partition.skip(header.base_offset, min(last + 1, end))
                elif DELIVER_AT_BYTES in (plain := self._records_of(batch, header)):
                    # A batch without the header's name holds no delayed record, and its
                    # records are not decoded at all (a compressed one is inflated to look).
                    for record in record_batch.decode_records(plain):
                        due = _deliver_at(record.headers)
                        if due > now and start <= record.offset < end:
                            partition.defer(record.offset, record.offset + 1, due)
                start = last + 1
                if start >= end:
                    break
        partition.end_offset(end)
        self._scanned[group] = max(self._scanned.get(group, 0), end)

    def _records_of(self, batch: memoryview, header: record_batch.BatchHeader) -> bytes:
        """The batch with its records uncompressed; b"" (no delayed record seen) for one that
        does not decompress: its readers get the CorruptBatchError, the queue goes on."""
        try:
            return record_batch.decompressed(bytes(batch), header)[0]
        except CorruptBatchError as exc:
            log.warning(
                "compressed batch does not decompress; no delivery time read from it",
                topic=self.replica.topic,
                partition=self.replica.partition,
                offset=header.base_offset,
                error=str(exc),
            )
            return b""

    async def _new_data(self, seconds: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.replica.fetch_waiters.append(waiter)
        await asyncio.wait([waiter], timeout=seconds)

    async def _released(self, group: str, after: int) -> None:
        partition = self.groups.get(group)
        if partition is None or partition.is_released(Reply(None, after)):
            return
        future = asyncio.get_running_loop().create_future()
        self._releases.append((group, after, future))
        await future

    def _live_records(self) -> int:
        return sum(1 + len(p.state.slots) for p in self.groups.values())

    def _checkpoint_due(self) -> bool:
        if not self.groups:
            return False
        if self._since_checkpoint > max(self.checkpoint_min_records, 2 * self._live_records()):
            return True
        bases = self.replica.log.segment_bases()
        return self._checkpoint_at < bases[-1] and self._since_checkpoint > 0

    def _checkpoint(self) -> None:
        self._append()  # pending records first: the checkpoint batch restates everything
        for partition in self.groups.values():
            partition.checkpoint()
        self._append(checkpoint=True)

    def _schedule_append(self) -> None:
        if not self._append_scheduled:
            self._append_scheduled = True
            asyncio.get_running_loop().call_soon(self._append)

    def _append(self, checkpoint: bool = False) -> None:
        self._append_scheduled = False
        if self._appending and not checkpoint:
            # One append in flight per partition (Nagle): what every member's fetch writes
            # meanwhile goes in one batch when it commits, instead of one Raft entry (and a
            # replication round, and a fsync on every replica) per fetch. A reply waits for
            # at most one commit more; the commits of pipelined entries would wait for the
            # replicas' flush passes anyway.
            self._append_waiting = True
            return
        forced, self._append_forced = self._append_forced, False
        if not self._usable():
            return
        if not (checkpoint or forced or any(p.urgent for p in self.groups.values())):
            return  # only skips pending: they ride on the next append (``urgent``)
        items: list[tuple[str, Record]] = []
        written: dict[str, int] = {}
        for name, partition in self.groups.items():
            batch = partition.take_batch()
            if batch:
                items += [(name, record) for record in batch]
                written[name] = partition.written
        if not items:
            return
        data = encode_batch(items, self._now_ms(), checkpoint)
        try:
            base = self.leader.propose(data, len(items), lambda f: self._committed(f, written))
        except LaminarError as exc:
            self.end(f"append refused: {exc}")
            return
        self._appending += 1
        self._since_checkpoint = len(items) if checkpoint else self._since_checkpoint + len(items)
        if checkpoint:
            self._checkpoint_at = base
        self._wake(self.replica)

    def _committed(self, future: asyncio.Future[Any], written: dict[str, int]) -> None:
        self._appending -= 1
        if self._append_waiting and not self._appending:
            self._append_waiting = False
            self._schedule_append()
        if future.cancelled() or future.exception() is not None:
            self.end("an append did not commit")
            return
        if self.ended:
            return
        for name, count in written.items():
            self.groups[name].records_committed(count)
        keep = []
        for name, after, waiting in self._releases:
            partition = self.groups.get(name)
            if partition is not None and partition.is_released(Reply(None, after)):
                if not waiting.done():
                    waiting.set_result(None)
            else:
                keep.append((name, after, waiting))
        self._releases = keep

    async def _load(self) -> None:
        replica = self.replica
        try:
            await self.leader.log_committed()
            await self._settings_ready()
            self._check()
            records = self._replay(replica.raft.commit + 1)
        except (LaminarError, OSError, ValueError) as exc:
            self.end(f"could not load: {exc}")
            if isinstance(exc, CorruptLogError):
                self._storage_fault(replica, exc)
            return
        now = self._now_ms()
        for name, recs in records.items():
            partition = SharePartition(self._config_for(name), now, recs)
            if partition.start < replica.log.start_offset:  # retention took the rest
                partition.advance_start(replica.log.start_offset)
            self.groups[name] = partition
        if records:
            log.info("share groups loaded", partition=replica.partition, groups=len(records))
        self._loaded.set_result(None)

    def _replay(self, end: int) -> dict[str, list[Record]]:
        """Every group's records from the newest checkpoint batch on (or the log's start)."""
        log_ = self.replica.log
        bases = log_.segment_bases()
        start = log_.start_offset
        found: list[tuple[int, list[tuple[str, Record]]]] = []
        for i in range(len(bases) - 1, -1, -1):
            seg_end = bases[i + 1] if i + 1 < len(bases) else end
            batches = []
            for offset in log_.control_offsets(max(bases[i], start), min(seg_end, end)):
                decoded = decode_batch(log_.batches(offset, offset + 1, READ_BYTES)[0])
                if decoded is not None:
                    batches.append((offset, decoded))
            checkpoints = [k for k, (_o, (is_cp, _items)) in enumerate(batches) if is_cp]
            if checkpoints:
                k = checkpoints[-1]
                self._checkpoint_at = batches[k][0]
                found = [(o, items) for o, (_cp, items) in batches[k:]] + found
                break
            found = [(o, items) for o, (_cp, items) in batches] + found
        out: dict[str, list[Record]] = {}
        for _offset, items in found:
            for group, record in items:
                out.setdefault(group, []).append(record)
        self._since_checkpoint = sum(len(items) for _o, items in found)
        return out


def _deliver_at(headers: Sequence[tuple[str, bytes | None]]) -> int:
    for name, value in headers:
        if name == DELIVER_AT_HEADER and value:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
