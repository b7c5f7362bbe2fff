"""Talking to the laminar cluster: driver-side snapshots and executor-side range reads.

Driver methods of a Spark source are synchronous and the reader object is pickled, so every
driver call opens its own client inside ``asyncio.run`` and closes it before returning: no
sockets, loops or locks outlive a call. Executors read one offset range each with their own
event loop and connection, failing over between the partition's replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import uvloop

from laminar.client import Admin, Cluster, TopicPartition
from laminar.client.consumer import fetch_partition
from laminar.client.log import get_logger
from laminar.errors import (
    CorruptBatchError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.transport import recycle
from spark_source.decode import decode_chunk, offset_after
from spark_source.options import EARLIEST, LATEST, SourceOptions
from spark_source.planning import (
    DataLossError,
    LaminarInputPartition,
    Lineage,
    Offsets,
    Replica,
    TopicPartitionKey,
    data_loss_message,
)

log = get_logger(__name__)

MAX_FETCH_BYTES = 64 * 1024 * 1024
"""A single batch larger than the fetch size makes the reader double it, up to this."""

FAILOVER_ERRORS = (
    ConnectionError,
    OSError,
    RequestTimeoutError,
    NotLeaderError,
    NotEnoughReplicasError,
    UnknownTopicError,
    UnknownPartitionError,
)
"""Errors that another replica, or the same one a moment later, can cure."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """Whole batches from one fetch (a view into the reply frame) and the replica's bounds."""

    data: memoryview
    high_watermark: int
    log_start: int
    node: int | None  # the replica that served it (None: any node, before metadata)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the driver needs to plan: replicas (leader first) and offset bounds per partition."""

    replicas: dict[TopicPartitionKey, tuple[Replica, ...]]
    earliest: Offsets
    latest: Offsets
    lineage: dict[TopicPartitionKey, Lineage] = field(default_factory=dict)
    """Partitions of key-range topics: (state, parents, seal end); see ``hold_children``."""


def _ordered_replicas(
    brokers: dict[int, str], leader: int, replicas: tuple[int, ...]
) -> tuple[Replica, ...]:
    order = [leader] if leader else []
    order += [node for node in replicas if node != leader]
    return tuple(Replica(node, brokers.get(node, "")) for node in order)


async def _snapshot(options: SourceOptions, timestamp: int | None) -> tuple[Snapshot, Offsets]:
    async with Admin(
        list(options.bootstrap),
        request_timeout_ms=options.request_timeout_ms,
        ssl=options.ssl_context(),
        **options.login(),
    ) as admin:
        metadata = await admin.cluster.refresh_metadata()
        wanted: list[TopicPartitionKey] = []
        replicas: dict[TopicPartitionKey, tuple[Replica, ...]] = {}
        lineage: dict[TopicPartitionKey, Lineage] = {}
        for topic in options.topic_names:
            description = metadata.topics.get(topic)
            if description is None:
                raise UnknownTopicError(f"laminar source: topic {topic!r} does not exist")
            for info in description.partitions:
                if info.state == "retired":
                    continue  # retention removed all of it: nothing to plan or read
                tp = (topic, info.partition)
                replicas[tp] = _ordered_replicas(metadata.brokers, info.leader, info.replicas)
                if description.partitioning == "range":
                    lineage[tp] = Lineage(info.state, info.parents, info.seal_end)
        if options.assign:
            for tp in options.assign:
                if tp not in replicas:
                    raise UnknownPartitionError(
                        f"laminar source: assign names {tp[0]}/{tp[1]}, which does not exist"
                    )
            replicas = {tp: replicas[tp] for tp in options.assign}
        wanted = sorted(replicas)
        tps = [TopicPartition(*tp) for tp in wanted]
        if not tps:
            return Snapshot({}, {}, {}), {}
        earliest = await admin.list_offsets(tps, EARLIEST)
        latest = await admin.list_offsets(tps, LATEST)
        at_time: Offsets = {}
        if timestamp is not None:
            found = await admin.list_offsets(tps, timestamp)
            at_time = {(tp.topic, tp.partition): offset for tp, offset in found.items()}
    snapshot = Snapshot(
        replicas=replicas,
        earliest={(tp.topic, tp.partition): offset for tp, offset in earliest.items()},
        latest={(tp.topic, tp.partition): offset for tp, offset in latest.items()},
        lineage={tp: facts for tp, facts in lineage.items() if tp in replicas},
    )
    return snapshot, at_time


def commit_group_offsets(options: SourceOptions, offsets: Offsets) -> None:
    """Store ``offsets`` as the committed offsets of ``options.group_id`` (driver side)."""

    async def commit() -> None:
        async with Admin(
            list(options.bootstrap),
            request_timeout_ms=options.request_timeout_ms,
            ssl=options.ssl_context(),
            **options.login(),
        ) as admin:
            await admin.commit_offsets(
                options.group_id or "", {TopicPartition(*tp): o for tp, o in offsets.items()}
            )

    asyncio.run(commit())


def snapshot(options: SourceOptions, timestamp: int | None = None) -> tuple[Snapshot, Offsets]:
    """Partitions, replicas, earliest/latest offsets (and offsets at ``timestamp``) right now."""
    return asyncio.run(_snapshot(options, timestamp))


class _RangeFetcher:
    """Fetches one partition's batches from its replicas, leader first, failing over."""

    def __init__(self, part: LaminarInputPartition, options: SourceOptions) -> None:
        self.part = part
        self.tp = TopicPartition(part.topic, part.partition)
        self.options = options
        self.max_bytes = options.fetch_max_bytes
        self.order = [replica.node_id for replica in part.replicas]
        self.benched: dict[int, float] = {}  # node id -> loop time until which to avoid it
        addresses = [r.address for r in part.replicas if r.address]
        self.cluster = Cluster(
            list(dict.fromkeys([*addresses, *options.bootstrap])),
            request_timeout=options.request_timeout_ms / 1000,
            ssl=options.ssl_context(),
            credentials=options.credentials(),
        )

    async def start(self) -> None:
        deadline = time.monotonic() + self.options.read_retry_timeout_ms / 1000
        while True:
            try:
                await self.cluster.refresh_metadata()
                return
            except FAILOVER_ERRORS as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"laminar source: cannot reach the cluster to read {self.part}: {exc}"
                    ) from exc
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.cluster.close()

    async def _refresh(self) -> None:
        """After every replica failed once: ask the cluster where the partition lives now."""
        try:
            cluster = self.cluster
            await cluster.refresh_metadata()
            leader = cluster.leader_for(self.tp)
            replicas = cluster.replicas_for(self.tp)
        except (*FAILOVER_ERRORS, RuntimeError) as exc:
            log.info("metadata refresh failed", partition=str(self.tp), error=str(exc))
            return
        order = [leader] if leader else []
        order += [node for node in replicas if node != leader]
        if order:
            self.order = order

    async def _fetch_from(
        self, node: int | None, offset: int, wait_ms: int, max_bytes: int
    ) -> Fetched:
        """One fetch request to one replica; the batches stay a view into the reply frame."""
        cluster = self.cluster
        connection = await (cluster.connection(node) if node else cluster.any_connection())
        timeout = cluster.request_timeout + wait_ms / 1000
        try:
            got = await fetch_partition(connection, self.tp, offset, max_bytes, wait_ms, timeout)
        except ConnectionError:
            cluster.drop_connection(connection.address)
            raise
        if got is None:
            raise ConnectionError(
                f"node {node} sent no fetch result for {self.tp.topic}/{self.tp.partition}"
            )
        return Fetched(*got, node)

    def _pick(self, now: float) -> int | None:
        """The first replica (leader first) not benched by a recent failure; if all are, the
        one whose bench ends first."""
        if not self.order:
            return None
        for node in self.order:
            if self.benched.get(node, 0.0) <= now:
                return node
        return min(self.order, key=lambda node: self.benched.get(node, 0.0))

    async def fetch(self, offset: int, max_bytes: int | None = None) -> Fetched:
        """Whole batches from ``offset`` (about ``max_bytes``, default the fetch size);
        OffsetOutOfRangeError only when below log start.

        A replica that fails is benched for a moment, so the fetches a task has in flight
        all move on to the next replica instead of each retrying the dead one.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.read_retry_timeout_ms / 1000
        delay = 0.05
        wait_ms = 0
        failures = 0
        while True:
            node = self._pick(loop.time())
            try:
                got = await self._fetch_from(
                    node, offset, wait_ms, max(max_bytes or 0, self.max_bytes)
                )
                if got.data or got.high_watermark > offset:
                    if node is not None:
                        self.benched.pop(node, None)
                    return got
                reason = f"node {node} has committed only up to {got.high_watermark}"
            except OffsetOutOfRangeError as exc:
                if offset < exc.start:
                    raise
                reason = f"node {node} has committed only up to {exc.end}"
            except FAILOVER_ERRORS as exc:
                reason = f"node {node}: {exc}"
            log.info(
                "fetch failed, trying another replica",
                partition=str(self.tp),
                offset=offset,
                reason=reason,
            )
            if loop.time() > deadline:
                raise ConnectionError(
                    f"laminar source: no replica of {self.tp.topic}/{self.tp.partition} served "
                    f"offset {offset} within {self.options.read_retry_timeout_ms} ms "
                    f"(last: {reason})"
                )
            if node is not None:
                self.benched[node] = loop.time() + BENCH_SECONDS
            wait_ms = 200
            failures += 1
            if failures % max(1, len(self.order)) == 0:  # every replica failed once more
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                await self._refresh()


BENCH_SECONDS = 2.0
"""How long a replica that failed a fetch is passed over (while others are tried)."""


GUESSED_BYTES_PER_OFFSET = 128
"""Sizes the first windows; later ones follow the bytes per offset actually seen."""


def read_range(
    part: LaminarInputPartition, options: SourceOptions, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` ([start, end) of one partition) as Arrow batches, in
    offset order.

    The range is cut into windows of about one fetch each (sized from the bytes per offset
    seen so far); a few windows are requested ahead (pipelined on one connection), and a
    window that needs more than one fetch sends its next fetch as soon as a response arrives
    (the offset comes from batch headers alone).
    """
    if part.start >= part.end:
        return
    loop = uvloop.new_event_loop()
    fetcher = _RangeFetcher(part, options)
    ahead: deque[tuple[int, int, asyncio.Task[Fetched]]] = deque()
    task: asyncio.Task[Fetched] | None = None
    per_offset = float(GUESSED_BYTES_PER_OFFSET)  # bytes per offset, as seen so far
    slack = 0  # the largest batch seen: a window's fetch asks for that much more
    launched = part.start

    def top_up() -> None:
        """Keep ``prefetchWindows`` windows requested: one fetch's worth of offsets each, and
        a fetch size with room for the batch that straddles the window's end."""
        nonlocal launched
        while len(ahead) < options.prefetch_windows and launched < part.end:
            high = min(part.end, launched + max(1, int(fetcher.max_bytes / per_offset)))
            request = loop.create_task(fetcher.fetch(launched, fetcher.max_bytes + slack))
            ahead.append((launched, high, request))
            launched = high

    def replace(old: asyncio.Task[Fetched] | None, offset: int) -> asyncio.Task:
        if old is not None:
            old.cancel()
            loop.run_until_complete(asyncio.gather(old, return_exceptions=True))
        return loop.create_task(fetcher.fetch(offset))

    corrupt_at: dict[int, set[int | None]] = {}  # offset -> replicas that sent a bad batch

    try:
        loop.run_until_complete(fetcher.start())
        top_up()
        while ahead:
            low, high, task = ahead.popleft()
            offset = low
            while offset < high:
                try:
                    got = loop.run_until_complete(task)
                except OffsetOutOfRangeError as exc:
                    offset = _skip_deleted(part, offset, exc.start, options)
                    task = loop.create_task(fetcher.fetch(offset)) if offset < high else None
                    continue
                following, largest = offset_after(got.data, offset)
                if following > offset:
                    per_offset = max(1.0, len(got.data) / (following - offset))
                    slack = max(slack, largest)
                task = loop.create_task(fetcher.fetch(following)) if following < high else None
                top_up()
                loop.run_until_complete(asyncio.sleep(0))  # let the requests go out now
                try:
                    chunk = decode_chunk(got.data, part.topic, part.partition, offset, high, schema)
                except CorruptBatchError as exc:  # damaged on the wire or on that replica's disk
                    _note_corrupt(fetcher, part, offset, got.node, exc, corrupt_at, loop.time())
                    task = replace(task, offset)
                    continue
                recycle(got.data)  # the chunk's arrays are its own: the frame can be reused
                if chunk.next_offset <= offset:  # one batch is larger than the fetch size
                    _grow_fetch(fetcher, part, offset)
                    task = replace(task, offset)
                    continue
                offset = chunk.next_offset
                if offset < high and (task is None or following != offset):
                    task = replace(task, offset)  # not expected: headers and decoder disagree
                if chunk.batch is not None:
                    yield chunk.batch
            task = None
    finally:
        for pending in [task, *(t for _, _, t in ahead)]:
            if pending is not None:
                pending.cancel()
                loop.run_until_complete(asyncio.gather(pending, return_exceptions=True))
        loop.run_until_complete(fetcher.close())
        loop.close()


def _note_corrupt(
    fetcher: _RangeFetcher,
    part: LaminarInputPartition,
    offset: int,
    node: int | None,
    error: CorruptBatchError,
    corrupt_at: dict[int, set[int | None]],
    now: float,
) -> None:
    """A fetch held a corrupt batch: fetch it again from another replica, unless every
    replica has now sent it corrupt (then the data is bad everywhere: fail, naming it)."""
    tried = corrupt_at.setdefault(offset, set())
    tried.add(node)
    if node is None or tried >= set(fetcher.order):
        raise CorruptBatchError(
            f"laminar source: {part.topic}/{part.partition} near offset {offset}: every replica "
            f"tried ({sorted(n for n in tried if n is not None)}) sent a corrupt batch: {error}"
        )
    log.warning(
        "corrupt batch, trying another replica",
        partition=f"{part.topic}/{part.partition}",
        offset=offset,
        node=node,
        error=str(error),
    )
    fetcher.benched[node] = now + BENCH_SECONDS


def _skip_deleted(
    part: LaminarInputPartition, offset: int, log_start: int, options: SourceOptions
) -> int:
    """Retention removed [offset, log_start) while the query ran: fail or skip, per option."""
    missing_to = min(log_start, part.end)
    message = data_loss_message(part.topic, part.partition, offset, missing_to)
    if options.fail_on_data_loss:
        raise DataLossError(message)
    log.warning(
        "skipping deleted offsets",
        topic=part.topic,
        partition=part.partition,
        start=offset,
        log_start=log_start,
    )
    return missing_to


def _grow_fetch(fetcher: _RangeFetcher, part: LaminarInputPartition, offset: int) -> None:
    """No whole batch fit in the fetch size: the next batch is larger, so ask for more."""
    if fetcher.max_bytes >= MAX_FETCH_BYTES:
        raise ConnectionError(
            f"laminar source: no progress reading {part.topic}/{part.partition} at offset "
            f"{offset} even with {MAX_FETCH_BYTES} byte fetches"
        )
    fetcher.max_bytes = min(MAX_FETCH_BYTES, fetcher.max_bytes * 2)


def resolve_spec(
    name: str,
    spec: str | dict[str, dict[int, int]],
    snap: Snapshot,
    default: str,
) -> Offsets:
    """'earliest' | 'latest' | JSON (-2/-1) -> concrete offsets for every planned partition."""
    bounds = {"earliest": snap.earliest, "latest": snap.latest}
    if isinstance(spec, str):
        return dict(bounds[spec])
    for topic, partitions in spec.items():
        for partition in partitions:
            if (topic, partition) not in snap.replicas:
                raise ValueError(
                    f"laminar source: {name} names {topic}/{partition}, which the query does "
                    "not read (unknown topic or partition)"
                )
    resolved: Offsets = {}
    for tp in snap.replicas:
        given = spec.get(tp[0], {}).get(tp[1])
        if given is None:
            resolved[tp] = bounds[default][tp]
        elif given == EARLIEST:
            resolved[tp] = snap.earliest[tp]
        elif given == LATEST:
            resolved[tp] = snap.latest[tp]
        else:
            resolved[tp] = given
    return resolved
