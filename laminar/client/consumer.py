"""The asyncio consumer: assigned partitions, explicit positions, long-poll fetches.

With a ``group_id``, ``subscribe()`` joins a consumer group instead: the group's coordinator
decides which partitions this consumer reads (group_member.py drives the assignment), and
positions are committed to the cluster.

At most one fetch is in flight per node, covering every assigned partition that node leads and
that has no records buffered. Results of a fetch that was in flight during a ``seek`` are
dropped (each partition has an epoch that a seek bumps), so a seek is exact. After a leader
change a partition can be in two fetches at once (one parked on the old leader): only an
answer for the position it still has counts, so no record is delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from ssl import SSLContext
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.connection import Connection, credentials_of, is_retriable
from laminar.client.decoding import decode_consumer_records
from laminar.client.group_member import Callback, CallbackListener, GroupMember, RebalanceListener
from laminar.client.lineage import Lineage
from laminar.client.log import get_logger
from laminar.client.offsets import list_offsets, target_node
from laminar.client.retry import retrying
from laminar.client.types import DEFAULT_BOOTSTRAP, ConsumerRecord, FetchedBatches, TopicPartition
from laminar.errors import LaminarError, NotLeaderError, OffsetOutOfRangeError
from laminar.protocol import EARLIEST, LATEST, read_error
from laminar.segment.batch import decode_records, is_control, iter_batches, verify_batch

log = get_logger(__name__)

RESETS = {"earliest": EARLIEST, "latest": LATEST, "none": None}
RETRY_BACKOFF = 0.1


class Consumer:
    """Reads assigned partitions from explicit positions, or a group's share of its topics.

    Group mode (``group_id`` set): ``subscribe(topics)`` joins; ``assignment()`` is what the
    coordinator gave this member; new partitions start at the group's committed offset (else
    per ``auto_offset_reset``); ``commit()`` stores the positions of what ``getmany``/``async
    for`` returned; ``close()`` commits (auto-commit), runs the revoke listener and leaves.
    Listeners are async or sync callables taking a set of TopicPartition, or a
    RebalanceListener passed to ``subscribe``. ``on_partitions_lost`` (default: the revoke
    callback) is called when partitions were taken without a handshake; do not commit there.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        max_wait_ms: int = 500,
        fetch_max_bytes: int = 4 * 1024 * 1024,
        partition_max_bytes: int = 1024 * 1024,
        auto_offset_reset: str = "latest",
        request_timeout_ms: int = 30_000,
        check_crcs: bool = True,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        client_rack: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        rebalance_timeout_ms: int = 60_000,
        on_partitions_revoked: Callback | None = None,
        on_partitions_assigned: Callback | None = None,
        on_partitions_lost: Callback | None = None,
        ssl: SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        if auto_offset_reset not in RESETS:
            raise ValueError(
                f"auto_offset_reset must be one of {', '.join(RESETS)}, not {auto_offset_reset!r}"
            )
        self.bootstrap = bootstrap
        self.ssl = ssl
        self.credentials = credentials_of(username, password)
        self.max_wait_ms = max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.partition_max_bytes = partition_max_bytes
        self.auto_offset_reset = auto_offset_reset
        self.request_timeout = request_timeout_ms / 1000
        self.check_crcs = check_crcs
        self._cluster: Cluster | None = None
        self._assignment: list[TopicPartition] = []
        self._fetch_offsets: dict[TopicPartition, int] = {}
        self._buffers: dict[TopicPartition, deque[ConsumerRecord]] = {}
        self._epochs: dict[TopicPartition, int] = defaultdict(int)
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._log_starts: dict[TopicPartition, int] = {}
        self._seeked: set[TopicPartition] = set()
        self._corrupt_at: dict[TopicPartition, int] = {}  # offset of a corrupt fetch, if any
        self._fetches: dict[int, asyncio.Task[None]] = {}
        self._arrived = asyncio.Event()
        self._backoff_until: dict[TopicPartition, float] = {}
        self._error: BaseException | None = None
        self._rotation = 0
        self._emptied = False
        self._closed = False
        self.group_id = group_id or None
        self._group_options = {
            "instance_id": group_instance_id or None,
            "rack": client_rack or None,
            "rebalance_timeout_ms": rebalance_timeout_ms,
            "enable_auto_commit": enable_auto_commit,
            "auto_commit_interval_ms": auto_commit_interval_ms,
        }
        self._listener: RebalanceListener = CallbackListener(
            on_partitions_revoked, on_partitions_assigned, on_partitions_lost
        )
        self._member: GroupMember | None = None
        self._polling = asyncio.Event()
        """Set while the application is inside getmany (and before its first call): it holds
        no record it is still working on, so a revocation may run (group_member.py)."""
        self._polling.set()
        self._lineage = Lineage(lambda: self.cluster.metadata)
        """Key-range topics: which partitions may be read yet (children after parents)."""
        self._handed: dict[TopicPartition, int] = {}
        """Group mode: per partition, the first offset the latest getmany returned. The
        application may still be working on those records, so auto-commit stops there."""

    # lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._cluster is None:
            self._cluster = await Cluster.connect(
                self.bootstrap,
                request_timeout=self.request_timeout + self.max_wait_ms / 1000,
                ssl=self.ssl,
                credentials=self.credentials,
            )

    async def close(self) -> None:
        """Group mode: commits what was returned (auto-commit) and leaves the group."""
        await self._close(failed=False)

    async def _close(self, *, failed: bool) -> None:
        if self._member is not None and not self._closed:
            await self._member.close(failed=failed)
        self._closed = True
        tasks = list(self._fetches.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetches.clear()
        if self._cluster is not None:
            self._cluster.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Leaving on an error: the latest records returned may not have been processed.
        await self._close(failed=exc_info[0] is not None)

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None or self._closed:
            raise RuntimeError("consumer is not started or already closed")
        return self._cluster

    # assignment and positions ------------------------------------------------------------
    async def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read exactly these partitions; new ones start per ``auto_offset_reset``."""
        if self._member is not None and self._member.subscribed:
            raise RuntimeError("a subscribed group member's partitions come from the group")
        cluster = self.cluster
        wanted = [TopicPartition(*tp) for tp in partitions]
        for tp in wanted:
            await cluster.wait_for_topic(tp.topic, 5.0)
            cluster.leader_for(tp)  # UnknownPartitionError for a partition that is not there
        for tp in list(self._assignment):
            if tp not in wanted:
                self._forget(tp)
        # A retired partition (key-range topics) has nothing left to read or seek in.
        new = [tp for tp in wanted if tp not in self._fetch_offsets and not _retired(cluster, tp)]
        self._assignment = list(dict.fromkeys(wanted))
        for tp in wanted:
            if cluster.topic(tp.topic).partitioning == "range":
                self._lineage.gate(tp.topic)
        if new:
            reset = RESETS[self.auto_offset_reset]
            await self._seek_to(new, LATEST if reset is None else reset)

    async def subscribe(
        self, topics: str | Iterable[str], *, listener: RebalanceListener | None = None
    ) -> None:
        """Group mode: join the group for ``topics`` (replacing an earlier subscription).
        Otherwise assign every partition of ``topics`` on top of what is assigned already."""
        names = [topics] if isinstance(topics, str) else list(topics)
        if self.group_id is not None:
            if self._assignment and (self._member is None or not self._member.subscribed):
                raise RuntimeError("assign() and a group subscription do not mix")
            for name in names:
                await self.cluster.wait_for_topic(name, 5.0)
            if listener is not None:
                self._listener = listener
            if self._member is None:
                self._member = GroupMember(
                    self, self.group_id, listener=self._listener, **self._group_options
                )
            self._member.listener = self._listener
            self._member.subscribe(names)
            return
        if listener is not None:
            raise ValueError("rebalance listeners need a group_id")
        for name in names:
            description = await self.cluster.wait_for_topic(name, 5.0)
            tps = [
                TopicPartition(name, p.partition)
                for p in description.partitions
                if p.state != "retired"
            ]
            if description.partitioning == "range":
                self._lineage.follow(name)
            await self.assign(
                [*self._assignment, *(tp for tp in tps if tp not in self._assignment)]
            )

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    # groups ------------------------------------------------------------------------------
    async def commit(
        self, offsets: Mapping[TopicPartition, int | tuple[int, str]] | None = None
    ) -> None:
        """Commit ``offsets`` ({tp: next offset to read} or {tp: (offset, metadata)}), or by
        default the position after the last record returned of every owned partition."""
        await self._group().commit(offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (None if none)."""
        return await self._group().committed(tp)

    def _group(self) -> GroupMember:
        if self.group_id is None:
            raise RuntimeError("commit() and committed() need a group_id")
        if self._member is None:
            self.cluster  # noqa: B018 - raises if not started
            self._member = GroupMember(
                self, self.group_id, listener=self._listener, **self._group_options
            )
        return self._member

    def _report(self, error: BaseException) -> None:
        """An error for the application: the next getmany raises it."""
        self._error = error
        self._arrived.set()

    def _group_positions(
        self, tps: Iterable[TopicPartition], *, processed: bool = False
    ) -> dict[TopicPartition, int]:
        """Positions of ``tps``; ``processed``: stop before what the latest getmany returned."""
        positions = {tp: self.position(tp) for tp in tps if tp in self._fetch_offsets}
        if processed:
            for tp, offset in self._handed.items():
                if tp in positions:
                    positions[tp] = offset
        return positions

    def _group_drop(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Stop reading ``tps`` now (buffered records dropped); their processed positions."""
        gone = set(tps)
        positions = self._group_positions(gone, processed=True)
        for tp in gone:
            self._forget(tp)
        self._assignment = [tp for tp in self._assignment if tp not in gone]
        return positions

    async def _group_add(self, starts: Mapping[TopicPartition, int | None]) -> None:
        """Start reading these: at the given offset, or per ``auto_offset_reset`` if None."""
        reset = [tp for tp, offset in starts.items() if offset is None]
        for tp, offset in starts.items():
            if offset is not None:
                self._set_position(tp, offset)
                self._seeked.add(tp)  # out of range (retention) resets per the policy
        if reset:
            policy = RESETS[self.auto_offset_reset]
            await self._seek_to(reset, LATEST if policy is None else policy)
        self._assignment.extend(tp for tp in starts if tp not in self._assignment)
        self._arrived.set()

    def position(self, tp: TopicPartition) -> int:
        """Offset of the next record this consumer returns for ``tp``."""
        buffered = self._buffers.get(tp)
        if buffered:
            return buffered[0].offset
        try:
            return self._fetch_offsets[tp]
        except KeyError:
            raise ValueError(f"{tp} is not assigned to this consumer") from None

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The committed end of ``tp`` as of the last fetch (None before any fetch)."""
        return self._high_watermarks.get(tp)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Continue ``tp`` from ``offset`` (checked by the node at the next fetch)."""
        tp = TopicPartition(*tp)
        if tp not in self._fetch_offsets:
            raise ValueError(f"{tp} is not assigned to this consumer")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        self._set_position(tp, offset)
        self._seeked.add(tp)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self._assignment, EARLIEST)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self._assignment, LATEST)

    async def seek_to_timestamp(
        self, tps: TopicPartition | Sequence[TopicPartition] | None, timestamp_ms: int
    ) -> None:
        """Move to the first record with timestamp >= ``timestamp_ms`` (end if none)."""
        if tps is None:
            targets = list(self._assignment)
        elif isinstance(tps, TopicPartition):
            targets = [tps]
        else:
            targets = list(tps)
        if timestamp_ms < 0:
            raise ValueError(f"timestamp must be >= 0 ms, not {timestamp_ms}")
        await self._seek_to(targets, timestamp_ms)

    async def _seek_to(self, tps: list[TopicPartition], timestamp: int) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        offsets = await list_offsets(self.cluster, tps, timestamp)
        missing = [tp for tp, offset in offsets.items() if offset < 0]
        if timestamp >= 0:
            found = [tp for tp in offsets if tp not in missing]
            exact = await asyncio.gather(
                *(self._first_at_or_after(tp, offsets[tp], timestamp) for tp in found)
            )
            offsets.update(zip(found, exact, strict=True))
        if missing:
            # No record at or after the timestamp: start at the end, like Kafka.
            offsets.update(await list_offsets(self.cluster, missing, LATEST))
        for tp, offset in offsets.items():
            self._set_position(tp, offset)
            self._seeked.discard(tp)

    async def _first_at_or_after(self, tp: TopicPartition, offset: int, timestamp: int) -> int:
        """The node answers with the first *batch* reaching ``timestamp``; find the record.

        Records in a batch need not be in timestamp order, and control batches (Raft no-ops)
        carry timestamps too, so scan the fetched batches for the first data record at or
        after ``timestamp``.
        """
        fetched = await self.fetch_batches(tp, offset, self.partition_max_bytes)
        data = memoryview(fetched.data)
        next_offset = offset
        for position, header in iter_batches(data):
            next_offset = header.base_offset + header.last_offset_delta + 1
            if is_control(header) or header.max_timestamp < timestamp:
                continue
            for record in decode_records(data[position : position + header.batch_length]):
                if record.offset >= offset and record.timestamp >= timestamp:
                    return record.offset
        return next_offset

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        self._fetch_offsets[tp] = offset
        self._buffers.pop(tp, None)
        self._epochs[tp] += 1
        self._backoff_until.pop(tp, None)

    def _forget(self, tp: TopicPartition) -> None:
        self._fetch_offsets.pop(tp, None)
        self._buffers.pop(tp, None)
        self._epochs[tp] += 1
        self._high_watermarks.pop(tp, None)
        self._log_starts.pop(tp, None)
        self._seeked.discard(tp)

    # reading -----------------------------------------------------------------------------
    async def getmany(
        self, timeout_ms: float | None = None, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records from every assigned partition, waiting up to ``timeout_ms`` for some.

        Returns an empty list when nothing arrived in time. Raises the error of a partition
        that cannot go on (e.g. its position fell out of range with auto_offset_reset="none").
        """
        self.cluster  # noqa: B018 - raises if not started
        # Inside getmany the application holds no record it has not finished with: a
        # revocation runs now, never while it may still be working on a revoked partition.
        self._polling.set()
        try:
            if self._member is not None:
                await self._member.before_poll()
            return await self._poll(timeout_ms, max_records)
        finally:
            self._polling.clear()

    async def _poll(
        self, timeout_ms: float | None, max_records: int | None
    ) -> list[ConsumerRecord]:
        loop = asyncio.get_running_loop()
        wait = self.max_wait_ms if timeout_ms is None else timeout_ms
        deadline = loop.time() + wait / 1000
        while True:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._member is not None:
                self._member.check_session()  # also after waiting: never read a lost partition
            records = self._drain(max_records)
            if records:
                if self._emptied:
                    self._emptied = False
                    self._start_fetches()  # prefetch while the caller works on these
                return records
            self._start_fetches()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._arrived.clear()
            # asyncio.timeout, not wait_for (a task of its own): the caller resumes one loop
            # turn after a fetch answered, not three.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        while not self._closed:
            records = await self.getmany(max_records=1)
            if records:
                return records[0]
        raise StopAsyncIteration

    def _drain(self, max_records: int | None) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        limit = max_records if max_records is not None else 1 << 62
        count = len(self._assignment)
        for step in range(count):
            index = (self._rotation + step) % count
            tp = self._assignment[index]
            buffered = self._buffers.get(tp)
            if buffered and self._member is not None and len(out) < limit:
                self._handed.setdefault(tp, buffered[0].offset)
            while buffered and len(out) < limit:
                out.append(buffered.popleft())
            if buffered is not None and not buffered and out:
                self._emptied = True
            if len(out) >= limit:
                # Start after this partition next time so a busy one cannot starve the rest.
                self._rotation = (index + 1) % count
                break
        return out

    def _start_fetches(self) -> None:
        cluster = self.cluster
        now = time.monotonic()
        if self._lineage.topics:
            self._follow_lineage(now)
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in self._assignment:
            if self._buffers.get(tp) or self._backoff_until.get(tp, 0.0) > now:
                continue
            if self._lineage.topics and not self._lineage.readable(tp, self.position):
                continue
            try:
                node = target_node(cluster, tp)
            except (ConnectionError, LaminarError):
                self._refresh_later(tp)
                continue
            by_node[node].append(tp)
        for node, tps in by_node.items():
            if node in self._fetches:
                continue
            # Positions are taken now: by the time the task runs, a partition may be gone.
            offsets = {tp: (self._fetch_offsets[tp], self._epochs[tp]) for tp in tps}
            self._fetches[node] = asyncio.create_task(self._fetch(node, offsets))

    def _follow_lineage(self, now: float) -> None:
        """Key-range topics: refresh the metadata now and then (splits and merges show there)
        and, for topics read through ``subscribe``, start reading partitions that appeared
        (children start at their first offset; they are read only once their parents are)."""
        cluster = self.cluster
        if self._lineage.refresh_due(now):
            cluster.refresh_soon().add_done_callback(lambda _f: self._arrived.set())
        for tp in self._lineage.new_partitions(cluster.metadata, self._assignment):
            self._assignment.append(tp)
            self._set_position(tp, 0)
            self._seeked.add(tp)  # out of range (retention): reset per the policy

    def _refresh_later(self, tp: TopicPartition) -> None:
        self._backoff_until[tp] = time.monotonic() + RETRY_BACKOFF
        asyncio.get_running_loop().call_later(RETRY_BACKOFF, self._arrived.set)
        self.cluster.refresh_soon()

    async def _fetch(self, node_id: int, offsets: dict[TopicPartition, tuple[int, int]]) -> None:
        tps = list(offsets)
        try:
            reply, payload = await self._fetch_request(
                node_id,
                [(tp, offsets[tp][0]) for tp in tps],
                max_wait_ms=self.max_wait_ms,
                partition_max_bytes=self.partition_max_bytes,
                fetch_max_bytes=self.fetch_max_bytes,
            )
        except (ConnectionError, OSError, LaminarError) as exc:
            log.debug("fetch failed", node=node_id, error=str(exc))
            if not is_retriable(exc):
                self._error = exc  # e.g. the node rejected the request: report it
                return
            if isinstance(exc, ConnectionError | OSError):
                self.cluster.drop_node_connection(node_id)
            for tp in tps:
                self._refresh_later(tp)
            return
        finally:
            self._fetches.pop(node_id, None)
            self._arrived.set()
        for result in reply.body.fetch.results:
            tp = TopicPartition(result.topic, result.partition)
            if tp not in offsets or self._epochs[tp] != offsets[tp][1]:
                continue  # sought or unassigned while the fetch was in flight
            if self._fetch_offsets.get(tp) != offsets[tp][0]:
                # Another fetch of it (to another node, after a leader change) was taken
                # while this one was in flight: this answer is stale, its records delivered.
                continue
            self._take_result(tp, offsets[tp][0], result, payload)

    def _take_result(
        self, tp: TopicPartition, offset: int, result: Any, payload: memoryview
    ) -> None:
        error = read_error(result.error)
        if error is not None:
            self._handle_fetch_error(tp, offset, error)
            return
        self._high_watermarks[tp] = result.highWatermark
        self._log_starts[tp] = result.logStart
        start = result.payloadOffset
        data = payload[start : start + result.payloadLength]
        try:
            records, next_offset = self._decode(tp, offset, data)
        except LaminarError as exc:
            if self._corrupt_at.get(tp) != offset:  # maybe damaged on the wire: fetch it again
                self._corrupt_at[tp] = offset
                self._refresh_later(tp)
                return
            # corrupt twice: stored that way, so stop here and let the user decide
            self._error = type(exc)(f"{tp.topic}/{tp.partition} near offset {offset}: {exc}")
            return
        self._corrupt_at.pop(tp, None)
        if records:
            self._buffers[tp] = deque(records)
        self._fetch_offsets[tp] = next_offset
        self._seeked.discard(tp)

    def _decode(
        self, tp: TopicPartition, offset: int, data: memoryview
    ) -> tuple[list[ConsumerRecord], int]:
        records: list[ConsumerRecord] = []
        next_offset = offset
        topic, partition = tp
        check_crcs = self.check_crcs
        for position, header in iter_batches(data):
            last = header.base_offset + header.last_offset_delta
            if last < next_offset:
                if check_crcs:
                    verify_batch(data[position : position + header.batch_length])
                continue
            batch = bytes(data[position : position + header.batch_length])
            if check_crcs:
                verify_batch(batch)
            if not is_control(header):
                decode_consumer_records(batch, header, topic, partition, next_offset, records)
            next_offset = last + 1
        return records, next_offset

    def _handle_fetch_error(self, tp: TopicPartition, offset: int, error: LaminarError) -> None:
        if isinstance(error, NotLeaderError):
            if not self.cluster.note_leader(tp, error.leader_id, error.leader_address):
                self._refresh_later(tp)
            return
        if isinstance(error, OffsetOutOfRangeError):
            self._out_of_range(tp, offset, error)
            return
        if is_retriable(error):
            self._refresh_later(tp)
            return
        self._error = error

    def _out_of_range(self, tp: TopicPartition, offset: int, error: OffsetOutOfRangeError) -> None:
        reset = RESETS[self.auto_offset_reset]
        behind = offset < error.start
        if not behind and tp not in self._seeked:
            # Reached by reading, so the data exists: a new leader's commit point is catching
            # up. Resetting would re-deliver or skip records; wait instead.
            self._backoff_until[tp] = time.monotonic() + RETRY_BACKOFF
            asyncio.get_running_loop().call_later(RETRY_BACKOFF, self._arrived.set)
            return
        if reset is None:
            self._error = OffsetOutOfRangeError(offset, error.start, error.end)
            return
        target = error.start if reset == EARLIEST else error.end
        log.warning(
            "offset out of range, resetting",
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            reset_to=target,
            policy=self.auto_offset_reset,
        )
        self._set_position(tp, target)
        self._seeked.discard(tp)

    async def _fetch_request(
        self,
        node_id: int,
        positions: list[tuple[TopicPartition, int]],
        *,
        max_wait_ms: int,
        partition_max_bytes: int,
        fetch_max_bytes: int,
    ) -> tuple[Any, memoryview]:
        def fill(body: Any) -> None:
            request = body.init("fetch")
            request.maxWaitMs = max_wait_ms
            request.minBytes = 1
            request.maxBytes = fetch_max_bytes
            parts = request.init("partitions", len(positions))
            for part, (tp, offset) in zip(parts, positions, strict=True):
                part.topic = tp.topic
                part.partition = tp.partition
                part.offset = offset
                part.maxBytes = partition_max_bytes

        connection = await self.cluster.connection(node_id)
        timeout = self.request_timeout + max_wait_ms / 1000
        return await connection.request(fill, timeout=timeout, now=True)  # one per node

    # low level ---------------------------------------------------------------------------
    async def fetch_batches(
        self,
        tp: TopicPartition,
        offset: int,
        max_bytes: int,
        *,
        max_wait_ms: int = 0,
        node_id: int | None = None,
    ) -> FetchedBatches:
        """Whole batches from ``offset`` on, as stored (control batches included).

        Independent of the assignment. Goes to the leader (following leader changes) unless
        ``node_id`` names a replica to read from. Raises OffsetOutOfRangeError.
        """
        tp = TopicPartition(*tp)
        cluster = self.cluster

        async def attempt() -> FetchedBatches:
            node = node_id if node_id is not None else target_node(cluster, tp)
            connection = await cluster.connection(node)
            timeout = self.request_timeout + max_wait_ms / 1000
            got = await fetch_partition(connection, tp, offset, max_bytes, max_wait_ms, timeout)
            if got is None:
                raise LaminarError(f"node {node} sent no fetch result for {tp}")
            data, high_watermark, log_start = got
            return FetchedBatches(bytes(data), high_watermark, log_start)

        if node_id is not None:
            return await attempt()
        return await retrying(cluster, attempt)


async def fetch_partition(
    connection: Connection,
    tp: TopicPartition,
    offset: int,
    max_bytes: int,
    max_wait_ms: int,
    timeout: float,
) -> tuple[memoryview, int, int] | None:
    """One fetch of one partition from one node: (whole batches, as a view into the reply
    frame, high watermark, log start), or None if the node sent no result for it. Raises the
    node's typed error; an OffsetOutOfRangeError names the offset asked for."""

    def fill(body: Any) -> None:
        request = body.init("fetch")
        request.maxWaitMs = max_wait_ms
        request.minBytes = 1
        request.maxBytes = max_bytes
        wanted = request.init("partitions", 1)[0]
        wanted.topic = tp.topic
        wanted.partition = tp.partition
        wanted.offset = offset
        wanted.maxBytes = max_bytes

    reply, payload = await connection.request(fill, timeout=timeout)
    for result in reply.body.fetch.results:
        if (result.topic, result.partition) != tp:
            continue
        error = read_error(result.error)
        if isinstance(error, OffsetOutOfRangeError):
            raise OffsetOutOfRangeError(offset, error.start, error.end)
        if error is not None:
            raise error
        start = result.payloadOffset
        return payload[start : start + result.payloadLength], result.highWatermark, result.logStart
    return None


def _retired(cluster: Cluster, tp: TopicPartition) -> bool:
    """Whether ``tp`` is a retired partition of a key-range topic (``laminar.splits``)."""
    partitions = cluster.topic(tp.topic).partitions
    return 0 <= tp.partition < len(partitions) and partitions[tp.partition].state == "retired"
