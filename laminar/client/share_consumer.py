"""The share-group member: read topics as a queue, settle each message on its own.

Every member of a share group reads every partition of its topics; the partition's leader hands
each record to one member at a time under a lock (laminar/queues). This member keeps one share
fetch in flight per leader node while its buffer is at most half full, so the next records are
on their way while the application works, without acquiring far more than it consumes (locks
run while records sit in the buffer; records whose lock ran out there are dropped, not handed
out). A fetch that carries settlements does not long-poll, so their results come back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from ssl import SSLContext
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.connection import credentials_of, is_retriable
from laminar.client.decoding import InflatedBatches
from laminar.client.log import get_logger
from laminar.client.offsets import target_node
from laminar.client.share_message import RELEASE, ShareMessage
from laminar.client.share_settle import Settlement, Settler
from laminar.client.share_wire import share_fetch
from laminar.client.types import DEFAULT_BOOTSTRAP, Header, TopicPartition
from laminar.errors import LaminarError, NotLeaderError
from laminar.protocol import read_error
from laminar.segment.batch import decode_into, is_control, iter_batches, verify_batch

log = get_logger(__name__)

RETRY_BACKOFF = 0.1
CLOSE_TIMEOUT = 5.0
JOIN_TIMEOUT = 10.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ShareConsumer:
    """A member of share group ``group`` reading every partition of ``topics`` as a queue.

    ``async for message in consumer`` or ``await consumer.fetch()``; settle each message with
    ``await message.ack()`` / ``release(delay_ms)`` / ``reject()`` / ``extend(ms)``. Settlements
    are batched on the wire (one ack-only request in flight per node carries everything
    queued meanwhile; ``ack_linger_ms`` adds a wait before each). ``lock_ms`` is the lock
    (visibility timeout) of every record acquired (None: the group's ``lock_ms`` setting, see
    ``Admin.alter_queue_config``, 30 s unless set); ``max_records`` the most one share fetch
    acquires per node; ``from_earliest`` makes a group that is new on a partition start at its
    start instead of its end. ``prefetch=False``: fetch only when the buffer is empty.
    ``close()`` releases every message this member still holds.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        group: str = "",
        topics: str | Iterable[str] = (),
        *,
        lock_ms: int | None = None,
        max_records: int = 500,
        from_earliest: bool = False,
        max_wait_ms: int = 500,
        ack_linger_ms: float = 0.0,
        request_timeout_ms: int = 30_000,
        check_crcs: bool = True,
        prefetch: bool = True,
        member_id: str | None = None,
        ssl: SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        if not group:
            raise ValueError("a share consumer needs a group")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise ValueError("a share consumer needs at least one topic")
        if (lock_ms is not None and lock_ms <= 0) or max_records <= 0:
            raise ValueError("lock_ms and max_records must be positive")
        self.bootstrap = bootstrap
        self.ssl = ssl
        self.credentials = credentials_of(username, password)
        self.group = group
        self.topics = names
        self.lock_ms = lock_ms
        self.max_records = max_records
        self.from_earliest = from_earliest
        self.max_wait_ms = max_wait_ms
        self.ack_linger_ms = ack_linger_ms
        self.request_timeout = request_timeout_ms / 1000
        self.check_crcs = check_crcs
        self.prefetch = prefetch
        self.member_id = member_id or uuid.uuid4().hex
        self._cluster: Cluster | None = None
        self._settler: Settler | None = None
        self._buffer: deque[ShareMessage] = deque()
        self._fetches: dict[int, asyncio.Task[None]] = {}
        self._backoff_until: dict[TopicPartition, float] = {}
        self._arrived = asyncio.Event()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = False
        self._held_mark = 1024
        self._inflated = InflatedBatches()
        self._joined: set[TopicPartition] = set()  # partitions with a successful share fetch

    # lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and make a first share fetch to every partition's leader, so the group
        exists on every partition (and a new group's start is fixed) once this returns
        (retried while leaders are being elected, for up to ``JOIN_TIMEOUT``)."""
        if self._cluster is not None:
            return
        self._cluster = await Cluster.connect(
            self.bootstrap,
            request_timeout=self.request_timeout + self.max_wait_ms / 1000,
            ssl=self.ssl,
            credentials=self.credentials,
        )
        self._settler = Settler(
            self._cluster,
            self.group,
            self.member_id,
            linger_ms=self.ack_linger_ms,
            request_timeout=self.request_timeout,
        )
        try:
            for topic in self.topics:
                await self._cluster.wait_for_topic(topic, 5.0)
            await self._join()
        except BaseException:
            await self._shutdown(release=False)
            raise

    async def _join(self) -> None:
        """One successful share fetch from every partition (a leader election may be under
        way: retried for up to ``JOIN_TIMEOUT``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + JOIN_TIMEOUT
        while True:
            missing = set(self._partitions()) - self._joined
            if not missing:
                return
            if loop.time() > deadline:
                log.warning("share group not joined on every partition yet", missing=len(missing))
                return
            self._start_fetches(wait_ms=0, only=missing)
            tasks = list(self._fetches.values())
            if tasks:
                await asyncio.wait(tasks, timeout=self.request_timeout)
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if set(self._partitions()) - self._joined:
                await asyncio.sleep(RETRY_BACKOFF)

    async def close(self) -> None:
        """Release every message still held (buffered or handed out and not settled, so
        other members get them at once), wait for queued settlements, disconnect."""
        await self._shutdown(release=True)

    async def _shutdown(self, *, release: bool) -> None:
        if self._closed:
            return
        self._closing = True
        fetches = list(self._fetches.values())
        if fetches:  # their records are acquired for us: take them to release them
            await asyncio.wait(fetches, timeout=self.max_wait_ms / 1000 + CLOSE_TIMEOUT)
            for task in fetches:
                task.cancel()
            await asyncio.gather(*fetches, return_exceptions=True)
        settler = self._settler
        if settler is not None:
            if release:
                now = _now_ms()
                for message in list(settler.held.values()):
                    if not message.settled and message.lock_until_ms > now:
                        message.release()
            self._buffer.clear()
            with contextlib.suppress(Exception):
                await settler.drain(CLOSE_TIMEOUT)
            settler.close()
        self._closed = True
        if self._cluster is not None:
            self._cluster.close()

    async def __aenter__(self) -> ShareConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None or self._closed:
            raise RuntimeError("share consumer is not started or already closed")
        return self._cluster

    # reading -----------------------------------------------------------------------------
    async def fetch(
        self, timeout_ms: float | None = None, max_records: int | None = None
    ) -> list[ShareMessage]:
        """Messages acquired for this member, waiting up to ``timeout_ms`` (default
        ``max_wait_ms``) for some; an empty list when none came in time."""
        self.cluster  # noqa: B018 - raises if not started
        loop = asyncio.get_running_loop()
        wait = self.max_wait_ms if timeout_ms is None else timeout_ms
        deadline = loop.time() + wait / 1000
        limit = self.max_records if max_records is None else max_records
        while True:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            messages = self._drain(limit)
            if messages:
                if self.prefetch:  # the next records travel while the caller works
                    self._start_fetches(wait_ms=self.max_wait_ms)
                return messages
            self._start_fetches(wait_ms=self.max_wait_ms)
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                return []
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()

    def __aiter__(self) -> AsyncIterator[ShareMessage]:
        return self

    async def __anext__(self) -> ShareMessage:
        while not self._closing:
            messages = await self.fetch(max_records=1)
            if messages:
                return messages[0]
        raise StopAsyncIteration

    def _drain(self, limit: int) -> list[ShareMessage]:
        """Up to ``limit`` buffered messages whose lock has not run out."""
        out: list[ShareMessage] = []
        buffer = self._buffer
        now = _now_ms()
        while buffer and len(out) < limit:
            message = buffer.popleft()
            if message.lock_until_ms <= now:
                log.debug("lock ran out in the buffer", topic=message.topic, offset=message.offset)
                self._held().pop((message.topic, message.partition, message.offset), None)
                continue
            out.append(message)
        return out

    def _held(self) -> dict[tuple[str, int, int], ShareMessage]:
        assert self._settler is not None
        return self._settler.held

    # fetching ----------------------------------------------------------------------------
    def _partitions(self) -> list[TopicPartition]:
        topics = self.cluster.metadata.topics
        return [
            TopicPartition(name, p.partition)
            for name in self.topics
            if name in topics
            for p in topics[name].partitions
        ]

    def _start_fetches(self, wait_ms: int, only: set[TopicPartition] | None = None) -> None:
        """A share fetch to every leader node with none in flight, while the buffer is at
        most half full (``only``: just these partitions, whatever the buffer holds)."""
        if self._closing or (only is None and len(self._buffer) > self.max_records // 2):
            return
        cluster = self.cluster
        now = time.monotonic()
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in self._partitions():
            if (only is not None and tp not in only) or self._backoff_until.get(tp, 0.0) > now:
                continue
            try:
                by_node[target_node(cluster, tp)].append(tp)
            except (ConnectionError, LaminarError):
                self._refresh_later(tp)
        for node, tps in by_node.items():
            if node not in self._fetches:
                self._fetches[node] = asyncio.create_task(self._fetch(node, tps, wait_ms))

    def _refresh_later(self, tp: TopicPartition) -> None:
        self._backoff_until[tp] = time.monotonic() + RETRY_BACKOFF
        asyncio.get_running_loop().call_later(RETRY_BACKOFF, self._arrived.set)
        self.cluster.refresh_soon()

    async def _fetch(self, node: int, tps: list[TopicPartition], wait_ms: int) -> None:
        settler = self._settler
        assert settler is not None
        acks: list[Settlement] = settler.take(node)
        wait = 0 if acks else wait_ms  # settlement results must not wait for a long poll
        sent_ms = _now_ms()
        sent = settler.wire(acks)
        try:
            connection = await self.cluster.connection(node)
            reply, payload = await share_fetch(
                connection,
                self.group,
                self.member_id,
                tps,
                max_records=self.max_records,
                lock_ms=self.lock_ms or 0,
                max_wait_ms=wait,
                acks=sent,
                from_earliest=self.from_earliest,
                timeout=self.request_timeout + wait / 1000,
            )
        except (ConnectionError, OSError, LaminarError) as exc:
            settler.failed(acks, exc)
            log.debug("share fetch failed", node=node, error=str(exc))
            if not is_retriable(exc):
                self._error = exc
                return
            if isinstance(exc, ConnectionError | OSError):
                self.cluster.drop_node_connection(node)
            for tp in tps:
                self._refresh_later(tp)
            return
        except BaseException:
            settler.failed(acks, ConnectionError("share fetch cancelled"))
            raise
        finally:
            self._fetches.pop(node, None)
            self._arrived.set()
        try:
            body = reply.body.shareFetch
            settler.finish(acks, body, sent)
            for result in body.results:
                self._take_result(result, payload, sent_ms)
        except Exception as exc:  # a reply we cannot read: the application hears of it
            log.warning("share fetch reply unreadable", node=node, error=str(exc))
            settler.failed([a for a in acks if not a.future.done()], exc)
            self._error = exc

    def _take_result(self, result: Any, payload: memoryview, sent_ms: int) -> None:
        tp = TopicPartition(result.topic, result.partition)
        error = read_error(result.error)
        if error is not None:
            if isinstance(error, NotLeaderError):
                if not self.cluster.note_leader(tp, error.leader_id, error.leader_address):
                    self._refresh_later(tp)
            elif is_retriable(error):
                self._refresh_later(tp)
            else:
                self._error = error
            return
        self._joined.add(tp)
        # Each pointer followed counts against the reader's traversal limit (about the reply's
        # size): read the list once.
        listed = result.acquiredRuns
        if not len(listed):
            return
        # Never trust a lock longer than it was granted for, counted from when the request
        # left (clock skew). A node that does not say which lock it gave is trusted.
        lock_ms = self.lock_ms or result.lockMs
        ceiling = sent_ms + lock_ms if lock_ms else 1 << 62
        acquired: dict[int, tuple[int, int]] = {}
        first, last = 1 << 63, -1
        for run in listed:
            got = (run.deliveryCount, min(run.lockUntilMs, ceiling))
            start, count = run.offset, run.count
            acquired.update(dict.fromkeys(range(start, start + count), got))
            first, last = min(first, start), max(last, start + count - 1)
        settler = self._settler
        assert settler is not None
        topic, partition = tp.topic, tp.partition
        take = acquired.pop

        def make(
            offset: int,
            timestamp: int,
            key: bytes | None,
            value: bytes | None,
            headers: tuple[Header, ...],
        ) -> ShareMessage | None:
            got = take(offset, None)
            if got is None:  # a record of the batch acquired by someone else
                return None
            count, until = got
            return ShareMessage(
                settler, topic, partition, offset, timestamp, key, value, headers, count, until
            )

        data = payload[result.payloadOffset : result.payloadOffset + result.payloadLength]
        messages: list[ShareMessage | None] = []
        try:
            self._decode(tp, data, first, last, make, messages)
        except LaminarError as exc:  # damaged: let another delivery (maybe ours) try again
            log.warning("share fetch data corrupt", topic=tp.topic, error=str(exc))
            for message in messages:
                if message is not None:
                    acquired[message.offset] = (message.delivery_count, message.lock_until_ms)
            messages = []
        held = settler.held
        buffer = self._buffer
        for message in messages:
            if message is not None:
                held[(topic, partition, message.offset)] = message
                buffer.append(message)
        for offset, (count, until) in acquired.items():
            # Acquired but not in the reply (should not happen): give it back at once.
            settler.submit(
                ShareMessage(
                    settler, tp.topic, tp.partition, offset, 0, None, None, (), count, until
                ),
                RELEASE,
                0,
            )
        if len(held) > 2 * self._held_mark:
            now = _now_ms()
            for key, message in list(held.items()):
                if message.lock_until_ms <= now:
                    del held[key]
            self._held_mark = max(1024, len(held))

    def _decode(
        self,
        tp: TopicPartition,
        data: memoryview,
        first: int,
        last: int,
        make: Callable[[int, int, bytes | None, bytes | None, tuple[Header, ...]], Any],
        out: list[Any],
    ) -> None:
        """``make(offset, timestamp, key, value, headers)`` of records ``[first, last]`` of the
        whole batches in ``data`` into ``out``: the batches hold others too (possibly
        thousands), which are stepped over, not parsed."""
        for position, header in iter_batches(data):
            if header.base_offset + header.last_offset_delta < first or is_control(header):
                continue
            if header.base_offset > last:
                break
            batch = bytes(data[position : position + header.batch_length])
            if self.check_crcs:
                verify_batch(batch)
            batch, header = self._inflated.get(tp, batch, header)
            decode_into(batch, header, make, out, first, last + 1)
