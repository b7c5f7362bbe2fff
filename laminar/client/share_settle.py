"""Settlements (ack, release, reject, extend) batched on the wire without the user seeing it.

Each call queues one item and returns its future. Queued items ride on the next share fetch to
their partition's leader (``take``), or after ``linger`` (default 0: the next turn of the event
loop, which already gathers every call made in one go) go in an ack-only share fetch
(``maxRecords = 0``), at most one of those in flight per node: items queued while it is in
flight go together in the next one, so one request settles many receipts under load while a
lone ack waits for nothing (Nagle's rule; a fixed 5 ms linger halved awaited-ack throughput).

Two items for the same offset are never in flight at once (an ``extend`` then an ``ack`` must
reach the node in that order). Items whose partition moved (NotLeader) or whose request failed
in transport are queued again and retried until ``retry_for`` runs out; any other error is the
item's result. A retried item may find its first attempt applied (the reply was lost): it then
fails with ReceiptExpiredError although the settlement took effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import time_ns
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.connection import is_retriable
from laminar.client.log import get_logger
from laminar.client.offsets import target_node
from laminar.client.share_message import ACK, EXTEND, ShareMessage
from laminar.client.share_wire import AckRun, ack_errors, share_fetch
from laminar.client.types import TopicPartition
from laminar.errors import LaminarError, NotLeaderError

log = get_logger(__name__)

RETRY_BACKOFF = 0.1
MAX_PER_REQUEST = 10_000

OffsetKey = tuple[str, int, int]


@dataclass(slots=True, eq=False)
class Settlement:
    message: ShareMessage
    action: int
    ms: int
    future: asyncio.Future[None]
    deadline: float  # loop time after which a retriable failure becomes the result
    key: OffsetKey
    not_before: float = 0.0
    sent_ms: int = field(default=0)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.message.topic, self.message.partition)


def _fail(future: asyncio.Future[None], error: BaseException) -> None:
    future.add_done_callback(_retrieve)  # only failures need it: no callback per good ack
    future.set_exception(error)


def _retrieve(future: asyncio.Future[None]) -> None:
    """A fire-and-forget settlement's error is not an unhandled one: the user chose not to
    await it (a failed ack means the message may come again, which at-least-once allows)."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("settlement failed", error=str(future.exception()))


class Settler:
    """The queue of one member's settlements and its ack-only requests."""

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        member_id: str,
        *,
        linger_ms: float = 0.0,
        request_timeout: float = 30.0,
        retry_for: float = 30.0,
    ) -> None:
        self.cluster = cluster
        self.group = group
        self.member_id = member_id
        self.linger = linger_ms / 1000
        self.request_timeout = request_timeout
        self.retry_for = retry_for
        self.held: dict[OffsetKey, ShareMessage] = {}
        """Messages delivered to this member and not yet acked, released or rejected."""
        self._queue: list[Settlement] = []
        self._in_flight: set[OffsetKey] = set()
        """Offsets with an extend in flight: nothing else for them goes out until it is
        answered (an ack, release or reject settles the message, so nothing follows it)."""
        self._extends = 0  # extends queued
        self._requests: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Future[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._closed = False

    # queueing -----------------------------------------------------------------------------
    def submit(self, message: ShareMessage, action: int, ms: int) -> asyncio.Future[None]:
        loop = self._loop
        future: asyncio.Future[None] = loop.create_future()
        if self._closed:
            _fail(future, ConnectionError("share consumer closed"))
            return future
        # Leaves ``_pending`` where its result is set (``finish``, ``_failed_one``, ``close``):
        # a done callback per ack would cost an event-loop turn each.
        self._pending.add(future)
        key = (message.topic, message.partition, message.offset)
        if action == EXTEND:
            self._extends += 1
        else:
            self.held.pop(key, None)
        self._queue.append(
            Settlement(message, action, ms, future, loop.time() + self.retry_for, key)
        )
        if self._timer is None:
            self._timer = loop.call_later(self.linger, self._flush)
        return future

    def take(self, node_id: int) -> list[Settlement]:
        """Queued items for partitions ``node_id`` leads, to ride on a share fetch to it.
        The caller hands them back through ``finish`` or ``failed``."""
        if not self._queue:
            return []
        now = self._loop.time()
        taken: list[Settlement] = []
        kept: list[Settlement] = []
        in_flight = self._in_flight
        # Only extends order anything: with none queued or in flight, no key is looked at.
        careful = bool(self._extends or in_flight)
        keys: set[OffsetKey] = set()  # extends taken now
        here: dict[tuple[str, int], bool] = {}  # partition -> led by node_id (asked once)
        last_topic, last_partition, last_led = None, -1, False
        for item in self._queue:
            m = item.message
            if m.partition != last_partition or m.topic != last_topic:
                last_topic, last_partition = m.topic, m.partition
                last_led = self._led_by(here, m.topic, m.partition, node_id)
            if not last_led or item.not_before > now or len(taken) >= MAX_PER_REQUEST:
                kept.append(item)
                continue
            if careful:
                key = item.key
                if key in in_flight or key in keys:
                    kept.append(item)
                    continue
                if item.action == EXTEND:
                    keys.add(key)
                    self._extends -= 1
            taken.append(item)
        self._queue = kept
        if keys:
            in_flight |= keys
        return taken

    def _led_by(
        self, here: dict[tuple[str, int], bool], topic: str, partition: int, node: int
    ) -> bool:
        led = here.get((topic, partition))
        if led is None:
            try:
                led = target_node(self.cluster, TopicPartition(topic, partition)) == node
            except (ConnectionError, LaminarError):
                led = False
            here[(topic, partition)] = led
        return led

    def _flush(self) -> None:
        """Send what is queued, one ack-only request per node with none in flight."""
        self._timer = None
        if not self._queue or self._closed:
            return
        now = self._loop.time()
        nodes: set[int] = set()
        retry_at: float | None = None
        for item in self._queue:
            if item.not_before > now:
                retry_at = min(retry_at or item.not_before, item.not_before)
                continue
            try:
                nodes.add(target_node(self.cluster, item.tp))
            except (ConnectionError, LaminarError) as exc:
                self._retry_later(item, exc)
                retry_at = min(retry_at or item.not_before, item.not_before)
        for node in nodes - set(self._requests):
            items = self.take(node)
            if items:
                self._requests[node] = asyncio.create_task(self._send(node, items))
        if retry_at is not None:
            self._schedule(max(retry_at - now, 0.0))

    def _schedule(self, delay: float) -> None:
        if self._closed:
            return
        if self._timer is not None:
            if self._timer.when() <= self._loop.time() + delay:
                return
            self._timer.cancel()
        self._timer = self._loop.call_later(delay, self._flush)

    async def _send(self, node: int, items: list[Settlement]) -> None:
        try:
            connection = await self.cluster.connection(node)
            sent = self.wire(items)
            reply, _ = await share_fetch(
                connection,
                self.group,
                self.member_id,
                [],
                max_records=0,
                lock_ms=0,
                max_wait_ms=0,
                acks=sent,
                from_earliest=False,
                timeout=self.request_timeout,
            )
        except (ConnectionError, OSError, LaminarError) as exc:
            if isinstance(exc, ConnectionError | OSError):
                self.cluster.drop_node_connection(node)
            self.failed(items, exc)
            return
        except BaseException:
            self.failed(items, ConnectionError("settlement request cancelled"))
            raise
        finally:
            self._requests.pop(node, None)
            if self._queue:
                self._schedule(0.0)
        self.finish(items, reply.body.shareFetch, sent)

    def wire(self, items: Sequence[Settlement]) -> list[AckRun]:
        """The items as runs on the wire (neighbours in the list that settle consecutive
        offsets of one partition alike share one; the order is kept), stamped with the time
        they are sent."""
        now_ms = time_ns() // 1_000_000
        runs: list[AckRun] = []
        first: Settlement | None = None
        count = 0
        for item in items:
            item.sent_ms = now_ms
            if first is not None:
                a, b = first.message, item.message
                if (
                    b.offset == a.offset + count
                    and b.partition == a.partition
                    and b.delivery_count == a.delivery_count
                    and item.action == first.action
                    and item.ms == first.ms
                    and b.topic == a.topic
                ):
                    count += 1
                    continue
                runs.append(_run(first, count))
            first, count = item, 1
        if first is not None:
            runs.append(_run(first, count))
        return runs

    # results ------------------------------------------------------------------------------
    def finish(self, items: Sequence[Settlement], body: Any, sent: Sequence[AckRun]) -> None:
        """Resolve ``items`` (sent as the runs ``sent``) with the node's results from the
        ShareFetchResponse ``body``."""
        if items:
            try:
                outcomes = ack_errors(body, sent)
            except LaminarError as exc:
                self.failed(items, exc)
                return
            if sum(run.count for run in sent) != len(items):
                self.failed(items, LaminarError("share fetch reply does not match the request"))
                return
            pending, in_flight = self._pending, self._in_flight
            position = 0
            for run, errors in zip(sent, outcomes, strict=True):
                chunk = items[position : position + run.count]
                position += run.count
                if errors is None and run.action != EXTEND:  # the common case: all settled
                    for item in chunk:
                        future = item.future
                        pending.discard(future)
                        if not future.done():
                            future.set_result(None)
                    continue
                for item, error in zip(chunk, errors or [None] * run.count, strict=True):
                    if item.action == EXTEND:
                        in_flight.discard(item.key)
                    if error is None:
                        if item.action == EXTEND:
                            message = item.message
                            message.lock_until_ms = max(
                                message.lock_until_ms, item.sent_ms + item.ms
                            )
                        pending.discard(item.future)
                        if not item.future.done():
                            item.future.set_result(None)
                    else:
                        self._failed_one(item, error)
        if self._queue and self._timer is None:
            self._schedule(0.0)

    def failed(self, items: Sequence[Settlement], error: BaseException) -> None:
        """The request carrying ``items`` failed as a whole."""
        for item in items:
            if item.action == EXTEND:
                self._in_flight.discard(item.key)
            self._failed_one(item, error)
        if self._queue and self._timer is None:
            self._schedule(RETRY_BACKOFF)

    def _failed_one(self, item: Settlement, error: BaseException) -> None:
        if item.future.done():  # cancelled by its caller
            self._pending.discard(item.future)
            return
        if is_retriable(error) and self._loop.time() < item.deadline:
            self._retry_later(item, error)
            self._queue.append(item)
            if item.action == EXTEND:
                self._extends += 1
            return
        if item.action != ACK:
            log.debug("settlement failed", offset=item.key, error=str(error))
        self._pending.discard(item.future)
        _fail(item.future, error)

    def _retry_later(self, item: Settlement, error: BaseException) -> None:
        hinted = isinstance(error, NotLeaderError) and self.cluster.note_leader(
            item.tp, error.leader_id, error.leader_address
        )
        if not hinted:
            self.cluster.refresh_soon()
            item.not_before = self._loop.time() + RETRY_BACKOFF

    # closing ------------------------------------------------------------------------------
    async def drain(self, timeout: float) -> None:
        """Send everything queued now and wait (up to ``timeout``) for every result."""
        if self._queue:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush()
        pending = list(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._requests.values():
            task.cancel()
        self._queue.clear()
        self._extends = 0
        pending, self._pending = self._pending, set()
        for future in pending:
            if not future.done():
                _fail(future, ConnectionError("share consumer closed"))


def _run(first: Settlement, count: int) -> AckRun:
    m = first.message
    return AckRun(m.topic, m.partition, m.offset, count, m.delivery_count, first.action, first.ms)
