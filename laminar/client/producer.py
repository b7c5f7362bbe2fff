"""The asyncio producer: buffer records per partition, send batches to partition leaders.

``send`` only buffers; one sender task turns ready batches into one produce request per leader
node, with up to ``max_in_flight_per_partition`` (full) batches of a partition in flight. A batch
that hits a retriable error (not leader, timeout, lost connection) goes back into its
partition's queue in its place after a metadata refresh and a backoff, and the batches behind it
(refused by the node as out of order, or failed alike) follow it in order, so per-partition
order holds. Every batch carries this producer's random id and a per-partition sequence, and a
retry resends the same bytes, so a node that already wrote the batch (the reply was lost)
answers with the first write's offsets instead of writing it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from ssl import SSLContext
from time import time_ns
from typing import Any

from laminar.client.accumulator import ProducerBatch, RecordAccumulator
from laminar.client.bulk import BulkDelivery, plan
from laminar.client.cluster import Cluster
from laminar.client.connection import credentials_of, is_retriable
from laminar.client.delivery import RecordFuture
from laminar.client.descriptions import TopicDescription
from laminar.client.log import get_logger
from laminar.client.partitioner import DefaultPartitioner, Partitioner, Router
from laminar.client.types import (
    DEFAULT_BOOTSTRAP,
    DELIVER_AT_HEADER,
    Headers,
    RecordMetadata,
    TopicPartition,
)
from laminar.errors import (
    CorruptBatchError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    LaminarError,
    NotLeaderError,
    OutOfOrderSequenceError,
    PartitionSealedError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedCompressionError,
)
from laminar.protocol import ACKS_BY_NAME, ACKS_NONE, read_error
from laminar.segment.compression import check_level, codec_of

log = get_logger(__name__)

CachedTopic = tuple[TopicDescription, tuple[TopicPartition, ...], "Router | None"]


def _as_bytes(name: str, value: object) -> bytes | None:
    if value is None or type(value) is bytes:
        return value  # type: ignore[return-value]
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or None, not {type(value).__name__}")


_BYTES_OR_NONE = frozenset((bytes, type(None)))


def _bytes_list(name: str, items: Sequence[object]) -> list[bytes | None]:
    """``items`` as a list of bytes/None (bytearray and memoryview copied); TypeError naming
    the first bad item otherwise."""
    out = list(items)
    if set(map(type, out)) <= _BYTES_OR_NONE:  # the common case, checked in C
        return out  # type: ignore[return-value]
    for index, item in enumerate(out):
        if item is not None and type(item) is not bytes:
            if isinstance(item, bytearray | memoryview):
                out[index] = bytes(item)
            else:
                raise TypeError(f"{name} #{index} must be bytes or None, not {type(item).__name__}")
    return out  # type: ignore[return-value]


def _check_headers(headers: Headers) -> Headers:
    for item in headers:
        if (
            not isinstance(item, tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not (item[1] is None or isinstance(item[1], bytes))
        ):
            raise TypeError(f"header {item!r} is not a (str, bytes | None) pair")
    return headers


def _with_deliver_at(headers: Headers, deliver_at: int | None, delay_ms: int | None) -> Headers:
    """``headers`` plus the delivery time header (replacing one given by hand)."""
    if deliver_at is not None and delay_ms is not None:
        raise ValueError("give deliver_at or delay_ms, not both")
    if delay_ms is not None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        deliver_at = time_ns() // 1_000_000 + int(delay_ms)
    assert deliver_at is not None
    if deliver_at < 0:
        raise ValueError(f"deliver_at must be >= 0 ms since the epoch, not {deliver_at}")
    kept = [h for h in headers if h[0] != DELIVER_AT_HEADER]
    return (*kept, (DELIVER_AT_HEADER, str(int(deliver_at)).encode()))


QUIET_WATCH_SECONDS = 0.25
"""The longest wait between two metadata refreshes while batches wait for new leaders."""


class Producer:
    """Batches records per partition and delivers them to partition leaders with retries."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        acks: str = "all",
        linger_ms: float = 5,
        batch_bytes: int = 256 * 1024,
        buffer_bytes: int = 32 * 1024 * 1024,
        retries: int = 10,
        retry_backoff_ms: float = 100,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        metadata_timeout_ms: int = 5_000,
        partitioner: Partitioner | None = None,
        idempotent: bool = True,
        compression: str | None = None,
        compression_level: int | None = None,
        ssl: SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        max_in_flight_per_partition: int | None = None,
    ) -> None:
        """``max_in_flight_per_partition``: batches of one partition sent before the first
        is acknowledged (Kafka's ``max.in.flight.requests.per.connection``); default 5 for an
        idempotent producer, whose sequences let the node keep them in order across retries,
        and 1 otherwise (more than 1 without idempotence may reorder records on a retry).

        ``compression``: None, "gzip", "snappy", "lz4" or "zstd" (Kafka's codecs and
        formats): each batch's records are compressed once, when it is built, and stored and
        served compressed; readers decompress. ``compression_level`` overrides the codec's
        default (gzip 0-9, default 6; lz4 0-16, default 1; zstd -7-22, default 3).
        UnsupportedCompressionError (a ValueError) for anything else."""
        if acks not in ACKS_BY_NAME:
            raise ValueError(f"acks must be one of {', '.join(ACKS_BY_NAME)}, not {acks!r}")
        if batch_bytes <= 0 or buffer_bytes < batch_bytes:
            raise ValueError("batch_bytes must be positive and at most buffer_bytes")
        self.compression = codec_of(compression)
        self.compression_level = (
            check_level(self.compression, compression_level) if self.compression else None
        )
        if compression_level is not None and not self.compression:
            raise UnsupportedCompressionError("compression_level needs a compression codec")
        self.bootstrap = bootstrap
        self.ssl = ssl
        self.credentials = credentials_of(username, password)
        self.acks = ACKS_BY_NAME[acks]
        self.retries = retries
        self.retry_backoff = retry_backoff_ms / 1000
        self.request_timeout = request_timeout_ms / 1000
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.metadata_timeout = metadata_timeout_ms / 1000
        self.buffer_bytes = buffer_bytes
        if max_in_flight_per_partition is None:
            max_in_flight_per_partition = 5 if idempotent else 1
        if max_in_flight_per_partition < 1:
            raise ValueError("max_in_flight_per_partition must be >= 1")
        self.max_in_flight_per_partition = max_in_flight_per_partition
        self._batch_bytes = batch_bytes
        self._linger = linger_ms / 1000
        self._default_partitioner = DefaultPartitioner() if partitioner is None else None
        self._partitioner: Partitioner = partitioner or self._default_partitioner  # type: ignore[assignment]
        self._cluster: Cluster | None = None
        self._accumulator: RecordAccumulator | None = None
        self._sender: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._requests: set[asyncio.Task[None]] = set()
        self._closed = False
        self._partition_cache: dict[str, CachedTopic] = {}
        self._reroutes: set[asyncio.Task[None]] = set()
        self._leader_watch: asyncio.Task[None] | None = None
        self._held: dict[TopicPartition, list[ProducerBatch]] = {}
        """Batches a sealed partition refused (not written), kept until every other batch of
        it in flight or to be resent has its answer; then all go elsewhere together."""
        self._rerouting: dict[str, tuple[list[int], asyncio.Event]] = {}
        """Topic -> (re-routes running, set when none is): sends to it wait meanwhile."""
        # A random id is unique enough: 62 bits, one per Producer object.
        self.producer_id = random.getrandbits(62) if idempotent else -1

    # lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and load metadata; ConnectionError if no bootstrap node answers."""
        if self._cluster is not None:
            return
        self._cluster = await Cluster.connect(
            self.bootstrap,
            request_timeout=self.request_timeout + 5,
            ssl=self.ssl,
            credentials=self.credentials,
        )
        self._accumulator = RecordAccumulator(
            batch_bytes=self._batch_bytes,
            linger=self._linger,
            producer_id=self.producer_id,
            loop=asyncio.get_running_loop(),
            compression=self.compression,
            compression_level=self.compression_level,
            max_in_flight=self.max_in_flight_per_partition,
        )
        self._sender = asyncio.create_task(self._run_sender(), name="laminar-producer-sender")

    async def close(self) -> None:
        """Deliver everything buffered (as far as retries allow), then disconnect."""
        if self._closed or self._cluster is None:
            self._closed = True
            return
        self._closed = True
        accumulator = self._accumulator
        assert accumulator is not None and self._sender is not None
        accumulator.closing = True
        self._wakeup.set()
        try:
            await self._sender
        finally:
            if self._leader_watch is not None:
                self._leader_watch.cancel()
            self._cluster.close()
            await self._cluster.wait_closed()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # sending -----------------------------------------------------------------------------
    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        deliver_at: int | None = None,
        delay_ms: int | None = None,
    ) -> RecordFuture:
        """Buffer one record; the returned awaitable resolves when the record is acknowledged.

        It yields the record's RecordMetadata or raises its delivery error, and works with
        ``asyncio.gather``/``wait``/``wait_for`` like a future. Waits only while the buffer is
        full (back-pressure) or the topic's metadata is loading.

        ``deliver_at`` (ms since the epoch) or ``delay_ms`` (from now): share groups deliver
        the record no earlier (a ``laminar-deliver-at`` header); stream consumers see it at once.
        """
        accumulator = self._accumulator
        if accumulator is None or self._closed:
            raise RuntimeError("producer is not started or already closed")
        if deliver_at is not None or delay_ms is not None:
            headers = _with_deliver_at(headers, deliver_at, delay_ms)
        # This is the per-record hot path: plain checks inline, no awaits unless needed.
        if value is not None and type(value) is not bytes:
            value = _as_bytes("value", value)
        if key is not None and type(key) is not bytes:
            key = _as_bytes("key", key)
        if headers:
            _check_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = time_ns() // 1_000_000
        if self._rerouting and topic in self._rerouting:
            # A sealed partition's records are being sent elsewhere: later records of the
            # topic wait for them, so each key keeps its send order across the split.
            await self._rerouting[topic][1].wait()
        description = self._cluster.metadata.topics.get(topic)  # type: ignore[union-attr]
        cached = self._partition_cache.get(topic)
        if cached is None or cached[0] is not description:
            cached = await self._cache_partitions(topic)
        tps = cached[1]
        route = cached[2]
        if route is not None and partition is None:
            partition = route.pick(key, self._partitioner, topic)
        elif partition is None:
            partition = self._partitioner(topic, key, len(tps))
            if (
                key is None
                and self._default_partitioner is not None
                and accumulator.sending(tps[partition])
                and accumulator.in_flight < len(tps)
            ):
                # Its sticky partition waits for an acknowledgement while another may be
                # idle: go there rather than wait a round trip (sticky again from then on).
                partition = self._default_partitioner.avoid_busy(
                    topic, partition, len(tps), lambda p: accumulator.busy(tps[p])
                )
        elif not 0 <= partition < len(tps):
            raise UnknownPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {len(tps)})"
            )
        if accumulator.buffered_bytes >= self.buffer_bytes:
            await self._wait_for_space(accumulator)
        handle, look = accumulator.append(tps[partition], key, value, headers, timestamp_ms)
        if look:
            # A batch was opened or filled: let the sender run now (once per batch), so a
            # tight send loop overlaps with batches on the wire instead of starving them.
            self._wakeup.set()
            await asyncio.sleep(0)
        return handle

    async def send_many(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> BulkDelivery:
        """Buffer many records at once (the bulk path: several times the records/s of one
        ``send`` per record); the returned ``BulkDelivery`` is awaited for their
        acknowledgement.

        ``keys`` (one per value) place records by key as ``send`` does; without keys and
        ``partition``, whole batches go to the partitions in turn. ``headers`` and
        ``timestamp_ms`` (default now) apply to every record. Order, retries, idempotence
        and back-pressure are those of ``send``: records of one partition keep their input
        order, also against records given to ``send``."""
        accumulator = self._accumulator
        if accumulator is None or self._closed:
            raise RuntimeError("producer is not started or already closed")
        if not isinstance(values, Sequence) or isinstance(values, bytes | bytearray | str):
            raise TypeError("values must be a sequence of bytes (e.g. a list), one per record")
        values = _bytes_list("value", values)
        if keys is not None:
            if not isinstance(keys, Sequence) or isinstance(keys, bytes | bytearray | str):
                raise TypeError("keys must be a sequence of bytes or None, one per value")
            keys = _bytes_list("key", keys)
        if headers:
            headers = tuple(_check_headers(headers))
        if timestamp_ms is None:
            timestamp_ms = time_ns() // 1_000_000
        if self._rerouting and topic in self._rerouting:
            await self._rerouting[topic][1].wait()  # (as in send: keys keep their order)
        description = self._cluster.metadata.topics.get(topic)  # type: ignore[union-attr]
        cached = self._partition_cache.get(topic)
        if cached is None or cached[0] is not description:
            cached = await self._cache_partitions(topic)
        tps = cached[1]
        route = cached[2]
        count = len(tps)
        choose = None
        chunk_bytes = self._batch_bytes
        if partition is not None:
            if not 0 <= partition < count:
                raise UnknownPartitionError(
                    f"topic {topic!r} has no partition {partition} (it has {count})"
                )
            sticky, chunk_bytes = partition, 1 << 62  # one run: all to that partition
        elif route is not None:  # a key-range topic: every record where its range is open
            sticky = 0
            partitioner = self._partitioner

            def choose(key: bytes | None) -> int:
                return route.pick(key, partitioner, topic)

            if keys is None:
                keys = [None] * len(values)
        else:
            sticky = self._partitioner(topic, None, count)
            if keys is None and self._default_partitioner is not None:
                # Whole batches: start at the partition with the shortest queue (Kafka's
                # adaptive partitioning): a partition's batches in flight are limited.
                sticky = min(
                    ((sticky + i) % count for i in range(count)),
                    key=lambda p: accumulator.queued(tps[p]),
                )
            if keys is not None:
                partitioner = self._partitioner

                def choose(key: bytes | None) -> int:
                    return partitioner(topic, key, count)

        delivery = BulkDelivery(topic, len(values))
        groups = plan(values, keys, headers, timestamp_ms, count, choose, sticky, chunk_bytes)
        piece = max(self._batch_bytes, self.buffer_bytes // 8)
        for number, (positions, records, cumulative) in groups.items():
            tp = tps[number]
            segments: list[tuple[ProducerBatch, int, int]] = []
            start, end, total = 0, len(records), 0
            while start < end:
                if accumulator.buffered_bytes >= self.buffer_bytes:
                    self._wakeup.set()
                    await self._wait_for_space(accumulator)
                stop = max(start + 1, bisect_right(cumulative, total + piece, start, end))
                segments += accumulator.append_many(tp, records, cumulative, start, stop)
                total = cumulative[stop - 1]
                start = stop
            delivery.add(positions, segments)
        self._wakeup.set()
        await asyncio.sleep(0)  # let the sender take the full batches now
        return delivery

    async def _cache_partitions(self, topic: str) -> CachedTopic:
        """The topic's description, one TopicPartition per partition (reused per record) and,
        for a key-range topic, its range map."""
        description = await self._load_topic(topic)
        tps = tuple(TopicPartition(topic, i) for i in range(len(description.partitions)))
        route = Router(description) if description.partitioning == "range" else None
        cached = self._partition_cache[topic] = (description, tps, route)
        return cached

    async def _wait_for_space(self, accumulator: RecordAccumulator) -> None:
        while accumulator.buffered_bytes >= self.buffer_bytes:
            self._space.clear()
            await self._space.wait()
            if self._closed:
                raise RuntimeError("producer closed while waiting for buffer space")

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        deliver_at: int | None = None,
        delay_ms: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its acknowledgement (this ignores linger)."""
        future = await self.send(
            topic,
            value,
            key=key,
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
            deliver_at=deliver_at,
            delay_ms=delay_ms,
        )
        if not future.done():
            await self.flush()
        return await future

    async def flush(self) -> None:
        """Send everything buffered now and wait until each batch is acknowledged or failed."""
        accumulator = self._accumulator
        if accumulator is None:
            return
        waiting = accumulator.begin_flush()
        self._wakeup.set()
        if waiting:
            await asyncio.gather(*waiting)

    async def partitions_for(self, topic: str) -> list[int]:
        description = await self._load_topic(topic)
        return [p.partition for p in description.partitions]

    @property
    def _topics(self) -> dict[str, TopicDescription]:
        assert self._cluster is not None
        return self._cluster.metadata.topics

    async def _load_topic(self, topic: str) -> TopicDescription:
        """The topic's description: the known one, or fetched until it appears."""
        assert self._cluster is not None
        return await self._cluster.wait_for_topic(topic, self.metadata_timeout)

    # the sender task ---------------------------------------------------------------------
    async def _run_sender(self) -> None:
        try:
            await self._send_loop()
        except Exception as exc:  # a bug: fail loudly rather than leave futures hanging
            log.exception("producer sender failed")
            self._closed = True
            assert self._accumulator is not None
            self._accumulator.fail_all(exc)
            raise

    async def _send_loop(self) -> None:
        accumulator = self._accumulator
        assert accumulator is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            batches, wake_at = self._dispatch()
            if (
                accumulator.closing
                and accumulator.empty()
                and not self._reroutes
                and not self._held
            ):
                return
            if batches:
                continue  # retries put back just now may already be due
            if wake_at is None:
                await self._wakeup.wait()
                continue
            # A timer instead of wait_for: no task per wait, and the sender wakes in one hop.
            timer = loop.call_at(wake_at, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def _dispatch(self) -> tuple[list[ProducerBatch], float | None]:
        """Send every batch that is ready now, one request per leader node; returns them and
        when to look again. Run by the sender task, and straight from a produce reply, so a
        partition's next batch leaves in the loop turn its predecessor was acknowledged."""
        accumulator = self._accumulator
        cluster = self._cluster
        assert accumulator is not None and cluster is not None
        lingering: list[ProducerBatch] = []
        batches, wake_at = accumulator.ready(asyncio.get_running_loop().time(), lingering)
        by_node: dict[int, list[ProducerBatch]] = defaultdict(list)
        for batch in batches:
            self._batch_closed(batch)
            try:
                leader = cluster.leader_for(batch.tp)
            except LaminarError as exc:
                accumulator.start_sending([batch])
                self._retry_or_fail(batch, exc)
                continue
            batch.sent_to = leader
            if leader:
                by_node[leader].append(batch)
            else:
                accumulator.start_sending([batch])
                self._retry_or_fail(batch, NotLeaderError(f"{batch.tp} has no leader yet"))
        # A lingering batch whose leader gets a request now anyway goes with it: it needs no
        # request of its own later (a record to each of 3,000 partitions went in some 1,400
        # requests per node, one or two batches each, as their lingers ran out).
        for batch in lingering if by_node else ():
            with contextlib.suppress(LaminarError):
                leader = cluster.leader_for(batch.tp)
                if leader in by_node:
                    self._batch_closed(batch)
                    batch.sent_to = leader
                    by_node[leader].append(batch)
                    batches.append(batch)
        for node_id, group in by_node.items():
            accumulator.start_sending(group)
            task = asyncio.create_task(self._produce(node_id, group))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        return batches, wake_at

    def _batch_closed(self, batch: ProducerBatch) -> None:
        if self._default_partitioner is not None and not batch.attempts:
            description = self._topics.get(batch.tp.topic)  # None once the topic is deleted
            cached = self._partition_cache.get(batch.tp.topic)
            router = cached[2] if cached is not None and cached[0] is description else None
            if router is not None:
                self._sticky_moves_on(batch.tp, router.active)
            elif description is not None and description.partitioning != "range":
                count = len(description.partitions)
                topic = batch.tp.topic
                accumulator = self._accumulator
                assert accumulator is not None

                def busy(partition: int) -> bool:
                    return accumulator.busy(TopicPartition(topic, partition))

                self._default_partitioner.batch_closed(topic, batch.tp.partition, count, busy)

    def _sticky_moves_on(self, tp: TopicPartition, active: list[int]) -> None:
        """A batch of a key-range topic closed: its sticky partition (an index into the
        active partitions) moves on, as for hash topics."""
        assert self._default_partitioner is not None and self._accumulator is not None
        if tp.partition not in active:
            return
        accumulator, topic = self._accumulator, tp.topic

        def busy(index: int) -> bool:
            return accumulator.busy(TopicPartition(topic, active[index]))

        index = active.index(tp.partition)
        self._default_partitioner.batch_closed(topic, index, len(active), busy)

    async def _produce(self, node_id: int, batches: list[ProducerBatch]) -> None:
        cluster = self._cluster
        assert cluster is not None
        acks = self.acks
        timeout_ms = int(self.request_timeout * 1000)

        def fill(body: Any) -> None:
            request = body.init("produce")
            request.acks = acks
            request.timeoutMs = timeout_ms
            refs = request.init("batches", len(batches))
            offset = 0
            for ref, batch in zip(refs, batches, strict=True):
                assert batch.data is not None
                ref.topic = batch.tp.topic
                ref.partition = batch.tp.partition
                ref.payloadOffset = offset
                ref.payloadLength = len(batch.data)
                offset += len(batch.data)

        payload = [batch.data for batch in batches if batch.data is not None]
        try:
            connection = await cluster.connection(node_id)
            if acks == ACKS_NONE:
                await connection.request(fill, payload, expect_reply=False, now=True)
                for batch in batches:
                    self._done(batch, None, -1)
                return
            reply, _ = await connection.request(
                fill, payload, timeout=self.request_timeout + 5, now=True
            )
        except (ConnectionError, OSError, LaminarError) as exc:
            if isinstance(exc, ConnectionError | OSError):
                cluster.drop_node_connection(node_id)
            for batch in batches:
                self._retry_or_fail(batch, exc)
            return
        finally:
            self._wakeup.set()
        answers = {(r.topic, r.partition): r for r in reply.body.produce.results}
        for batch in batches:
            result = answers.get(batch.tp)
            if result is None:
                self._retry_or_fail(
                    batch, LaminarError(f"node {node_id} did not answer {batch.tp}")
                )
                continue
            self._done(batch, read_error(result.error), result.baseOffset)
        try:
            self._dispatch()  # the next batches of these partitions, now (not a turn later)
        except Exception:  # the sender task meets it too, and fails loudly
            self._wakeup.set()

    def _done(self, batch: ProducerBatch, error: LaminarError | None, base_offset: int) -> None:
        tp = batch.tp
        if isinstance(error, PartitionSealedError) or (
            tp in self._held and isinstance(error, OutOfOrderSequenceError)
        ):
            # Refused, so not written: held back until the partition's other batches in
            # flight have their answers (one sent before it may still be written there).
            assert self._accumulator is not None
            self._accumulator.hold(batch)
            self._held.setdefault(tp, []).append(batch)
            self._reroute_when_settled(tp)
            return
        if isinstance(error, DuplicateSequenceError):
            # Written before, by an attempt whose reply was lost, but older than what the node
            # remembers: delivered, at offsets no longer known (Kafka answers the same).
            log.warning("batch was already written; its offsets are unknown", tp=batch.tp)
            error, base_offset = None, -1
        if error is not None:
            self._retry_or_fail(batch, error)
            return
        batch.complete(base_offset)
        self._release(batch)
        if tp in self._held:
            self._reroute_when_settled(tp)

    def _retry_or_fail(self, batch: ProducerBatch, error: BaseException) -> None:
        accumulator = self._accumulator
        cluster = self._cluster
        assert accumulator is not None and cluster is not None
        now = asyncio.get_running_loop().time()
        in_time = now - batch.created < self.delivery_timeout
        refused = isinstance(error, OutOfOrderSequenceError) or (
            isinstance(error, InvalidProducerEpochError) and accumulator.stale(batch)
        )
        # (bounded, in case a node keeps refusing: then it is an ordinary retry with backoff)
        bound = self.max_in_flight_per_partition * (self.retries + 1)
        if refused and in_time and batch.refused < bound:
            # Not written: a batch before it is missing (it failed and is resent, or failed
            # for good and the partition moved to a new epoch). It goes again, in its
            # place, after that one; no metadata refresh, no backoff, no retry counted.
            log.debug("batch refused out of order", tp=batch.tp, error=str(error))
            accumulator.requeue(batch, now, rebuild=True, counted=False)
            self._wakeup.set()
            return
        # This producer built the batch whole, so a batch the node found corrupt was damaged on
        # the wire (client frames leave batches to their own crc): sending it again can succeed.
        retriable = is_retriable(error) or isinstance(error, CorruptBatchError)
        batch.failed_leader = None
        if retriable and batch.attempts < self.retries and in_time:
            delay = min(self.retry_backoff * (2**batch.attempts), 1.0)
            hinted = isinstance(error, NotLeaderError) and cluster.note_leader(
                batch.tp, error.leader_id, error.leader_address
            )
            if hinted and not batch.attempts:
                delay = 0.0  # the node named the new leader: go there at once, once
            elif isinstance(error, NotLeaderError | ConnectionError | OSError):
                batch.failed_leader = batch.sent_to
                self._watch_leaders()
            else:
                self._refresh_metadata()
            log.debug("retrying batch", tp=batch.tp, attempt=batch.attempts + 1, error=str(error))
            accumulator.requeue(batch, now + delay)
            self._wakeup.set()
            return
        log.warning(
            "batch failed", topic=batch.tp.topic, partition=batch.tp.partition, error=str(error)
        )
        batch.fail(error)
        self._release(batch)

    def _reroute_when_settled(self, tp: TopicPartition) -> None:
        """Once no batch of sealed ``tp`` is in flight or waits to be resent (its outcome
        unknown), send the held ones and every batch queued behind them elsewhere."""
        accumulator = self._accumulator
        assert accumulator is not None
        if accumulator.unsettled(tp):
            return
        held = self._held.pop(tp, [])
        for batch in held:
            accumulator.release_held(batch)
        self._reroute(tp, held)

    def _reroute(self, tp: TopicPartition, held: list[ProducerBatch]) -> None:
        """``tp`` was sealed by a split or merge: take ``held`` (refused by it) and every batch
        queued for it off that partition and send their records, in order, to the partitions
        that own their keys now (once the metadata shows the seal). Each record's handle then
        resolves with where it was finally written."""
        accumulator = self._accumulator
        assert accumulator is not None
        batches = sorted(held + accumulator.take_partition(tp), key=lambda b: b.sequence)
        self._space.set()
        self._wakeup.set()
        topic = tp.topic
        running, _event = self._rerouting.setdefault(topic, ([0], asyncio.Event()))
        running[0] += 1
        task = asyncio.create_task(self._send_elsewhere(tp, batches))
        self._reroutes.add(task)
        task.add_done_callback(lambda done: self._rerouted(topic, done))

    def _rerouted(self, topic: str, task: asyncio.Task[None]) -> None:
        self._reroutes.discard(task)
        self._wakeup.set()  # a closing producer's sender waits for re-routes to be queued
        running, event = self._rerouting[topic]
        running[0] -= 1
        if not running[0]:
            del self._rerouting[topic]
            event.set()

    async def _send_elsewhere(self, tp: TopicPartition, batches: list[ProducerBatch]) -> None:
        cluster, accumulator = self._cluster, self._accumulator
        assert cluster is not None and accumulator is not None
        loop = asyncio.get_running_loop()
        delay = self.retry_backoff
        try:
            while True:
                metadata = await cluster.refresh_metadata()
                description = metadata.topics.get(tp.topic)
                if description is None:
                    raise UnknownTopicError(f"topic {tp.topic!r} was deleted")
                # Settled: the partition shows sealed, or no operation is open (a pending child
                # refused a record sent to it by number, and is active by now).
                state = description.partitions[tp.partition].state
                if state in ("sealed", "retired") or (
                    description.operation is None and state == "active"
                ):
                    break
                if loop.time() - batches[0].created > self.delivery_timeout:
                    raise PartitionSealedError(f"{tp} is sealed but no metadata shows by whom")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        except (ConnectionError, LaminarError) as exc:
            for old in batches:
                old.fail(exc)
            self._wakeup.set()
            return
        router = Router(description)
        for old in batches:
            handles = []
            for key, value, headers, timestamp in old.records:
                partition = router.pick(key, self._partitioner, tp.topic)
                target = TopicPartition(tp.topic, partition)
                handles.append(accumulator.append(target, key, value, headers, timestamp)[0])
            log.debug("records rerouted after a seal", tp=tp, records=len(handles))
            old.forward(handles)
        self._wakeup.set()

    def _release(self, batch: ProducerBatch) -> None:
        assert self._accumulator is not None
        self._accumulator.finished(batch)
        if self._accumulator.buffered_bytes < self.buffer_bytes:
            self._space.set()

    def _leader_or_none(self, tp: TopicPartition) -> int:
        try:
            return self._cluster.leader_for(tp) if self._cluster is not None else 0
        except LaminarError:
            return 0

    def _watch_leaders(self) -> None:
        """Start the leader watch unless it runs (see ``_follow_leaders``)."""
        if self._leader_watch is None or self._leader_watch.done():
            self._leader_watch = asyncio.create_task(self._follow_leaders())

    async def _follow_leaders(self) -> None:
        """While batches wait for a partition's new leader, refresh the metadata and send each
        such batch the moment another leader shows, whatever its backoff (as Kafka's KIP-951
        skips the backoff once the leader changed). With a doubling backoff alone, a batch
        that failed while thousands of partitions elected their new leaders (a node died)
        slept up to a second after its leader was known. Refreshes come ``retry_backoff``
        apart while they show new leaders, and back off (doubling, up to a quarter second)
        while they show none: at 10,000 partitions one metadata answer costs a node ~70 ms
        of CPU."""
        cluster = self._cluster
        assert cluster is not None
        accumulator = self._accumulator
        assert accumulator is not None
        delay = self.retry_backoff
        while True:
            try:
                await cluster.refresh_metadata()
            except (ConnectionError, LaminarError) as exc:
                log.debug("metadata refresh failed while waiting for leaders", error=str(exc))
            waiting = accumulator.waiting_for_leader()
            moved = False
            for batch in waiting:
                leader = self._leader_or_none(batch.tp)
                if leader and leader != batch.failed_leader and leader not in batch.expedited:
                    batch.expedited += (leader,)
                    batch.failed_leader = None
                    batch.retry_at = 0.0
                    moved = True
            if moved:
                self._wakeup.set()
            if not any(b.failed_leader is not None for b in waiting):
                return
            delay = self.retry_backoff if moved else min(delay * 2, QUIET_WATCH_SECONDS)
            await asyncio.sleep(delay)

    def _refresh_metadata(self) -> None:
        """Refresh in the background and look at the queues again when it is done."""
        assert self._cluster is not None
        self._cluster.refresh_soon().add_done_callback(lambda _: self._wakeup.set())
