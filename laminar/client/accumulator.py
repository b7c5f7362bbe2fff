"""The producer's buffer: records grouped into one open batch per partition.

No I/O and no clock of its own (callers pass ``now``), so linger, size and ordering rules are
tested without sockets. Ordering rule: up to ``max_in_flight`` batches of a partition are in
flight at once, sent in queue order (an idempotent producer's default is 5, Kafka's
``max.in.flight.requests.per.connection``; otherwise 1). A batch that must be retried goes back
into its partition's queue in its original place, ahead of every batch created after it, and a
retried batch is only sent once nothing of its partition is in flight, so retries go out in
order, one at a time. The node refuses an idempotent batch whose sequence does not follow the
last one it stored (OutOfOrderSequenceError, nothing written), so batches in flight behind a
failed one come back refused and are resent after it: the log keeps the send order, each batch
once. A batch that fails for good leaves a hole in its partition's sequences; the partition then
drains and starts a new producer epoch at sequence 0 (the node accepts an epoch bump only
there), rebuilding the batches the node refused for the old epoch.
"""

from __future__ import annotations

import asyncio
import itertools
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from typing import Any

from laminar.client.delivery import RecordFuture, resolve
from laminar.client.types import Headers, RecordMetadata, TopicPartition
from laminar.segment.batch import HEADER_SIZE, build_batch
from laminar.segment.compression import NONE

RECORD_OVERHEAD = 24
"""Upper estimate of a record's framing bytes (length, attributes, deltas, varint lengths)."""

SEQUENCE_WRAP = 1 << 31
"""Base sequences are int32 on the wire; they wrap (the node compares them for equality)."""

EPOCH_WRAP = 1 << 15
"""Producer epochs are int16 on the wire."""

RecordTuple = tuple[bytes | None, bytes | None, Headers, int]


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
    for name, header_value in headers:
        size += 10 + len(name) + (len(header_value) if header_value else 0)
    return size


class ProducerBatch:
    """Records bound for one partition, sent (and retried) as one record batch.

    Its records are settled together: ``finished`` with a ``base_offset`` or an ``error``;
    per-record handles (RecordFuture) read their result from here.
    """

    __slots__ = (
        "attempts",
        "base_offset",
        "callbacks",
        "created",
        "data",
        "done",
        "epoch",
        "error",
        "expedited",
        "failed_leader",
        "finished",
        "forwards",
        "loop",
        "records",
        "refused",
        "retry_at",
        "sent_to",
        "sequence",
        "size",
        "tp",
        "waiters",
    )

    def __init__(
        self, tp: TopicPartition, created: float, sequence: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.tp = tp
        self.created = created
        self.sequence = sequence
        self.loop = loop
        self.records: list[RecordTuple] = []
        self.size = HEADER_SIZE
        self.attempts = 0
        self.epoch = 0
        """The producer epoch its bytes were built with (idempotent producers)."""
        self.refused = 0
        """Times the node refused it as out of order (a batch before it was missing)."""
        self.retry_at = 0.0
        self.sent_to = 0
        """The node its last attempt went to (0: none, no leader was known)."""
        self.failed_leader: int | None = None
        """The node it last failed to reach or was refused by as not the leader (0: none was
        known): it waits for the metadata to name another one, not for its backoff."""
        self.expedited: tuple[int, ...] = ()
        """Leaders it was sent to at once, skipping its backoff: each at most once, so a
        leadership that flips (a transfer under way) cannot spend its retries back to back."""
        self.data: bytes | None = None
        self.finished = False
        self.base_offset = -1
        self.error: BaseException | None = None
        self.waiters: list[tuple[asyncio.Future[RecordMetadata], int]] = []
        # done callbacks of per-record handles that have no future of their own (gather)
        self.callbacks: list[tuple[Any, Any, Any]] = []
        self.done: asyncio.Future[None] = loop.create_future()
        self.forwards: list[RecordFuture] | None = None
        """Set when the batch's partition was sealed and its records were sent elsewhere:
        record ``i``'s outcome is ``forwards[i]``'s."""

    def build(
        self,
        producer_id: int = -1,
        base_sequence: int = -1,
        compression: int = NONE,
        compression_level: int | None = None,
        producer_epoch: int = 0,
    ) -> bytes:
        """The batch's bytes, built once so every retry sends exactly the same batch.

        With a producer id and sequence the node recognises a retry of a batch it already
        wrote and answers with the first write's offsets instead of writing it again. With a
        codec the records section is compressed here, once, as Kafka's clients do.
        """
        if self.data is None:
            self.data = build_batch(
                self.records,
                producer_id=producer_id,
                producer_epoch=producer_epoch if producer_id >= 0 else -1,
                base_sequence=base_sequence,
                compression=compression,
                compression_level=compression_level,
            )
        return self.data

    def complete(self, base_offset: int) -> None:
        if not self.finished:
            self.base_offset = base_offset
            self._finish()

    def fail(self, error: BaseException) -> None:
        if not self.finished:
            self.error = error
            self._finish()

    def forward(self, handles: list[RecordFuture]) -> None:
        """Its records went to other partitions (``handles``, one per record, in order): the
        batch is finished once all of them are, each record with its forwarded outcome."""
        self.forwards = handles
        pending = [h for h in handles if not h.done()]
        if not pending:
            self._finish()
            return
        left = [len(pending)]

        def one_done(_future: object) -> None:
            left[0] -= 1
            if left[0] == 0:
                self._finish()

        for handle in pending:
            handle.add_done_callback(one_done)

    def _finish(self) -> None:
        self.finished = True
        for future, index in self.waiters:
            resolve(future, self, index)
        self.waiters.clear()
        if self.callbacks:
            call_soon = self.loop.call_soon
            for fn, handle, context in self.callbacks:
                call_soon(fn, handle, context=context)
            self.callbacks.clear()
        if not self.done.done():
            self.done.set_result(None)


class RecordAccumulator:
    """Per-partition queues of batches; decides which batches are ready to send."""

    def __init__(
        self,
        *,
        batch_bytes: int,
        linger: float,
        producer_id: int = -1,
        loop: asyncio.AbstractEventLoop | None = None,
        compression: int = NONE,
        compression_level: int | None = None,
        max_in_flight: int = 1,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight}")
        self._loop = loop or asyncio.get_running_loop()
        self.compression = compression
        self.compression_level = compression_level
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.producer_id = producer_id
        self.max_in_flight = max_in_flight
        self._sequences: dict[TopicPartition, int] = {}
        self._epochs: dict[TopicPartition, int] = {}
        # Partitions with a batch acknowledged: an idempotent producer pipelines only once the
        # node knows it there (a node accepts an unknown producer at any sequence, so a first
        # batch refused while a later one lands would leave the later one first).
        self._acked: set[TopicPartition] = set()
        self.buffered_bytes = 0
        self.closing = False
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Each partition's batches in flight, in the order they were sent.
        self._in_flight: dict[TopicPartition, deque[ProducerBatch]] = {}
        # The batch that takes the partition's next record: its queue's tail, not yet built.
        self._open: dict[TopicPartition, ProducerBatch] = {}
        self._sequence = itertools.count()
        self._flush_upto = -1
        self._last_sequence = -1

    def append(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        timestamp_ms: int,
        now: float | None = None,
    ) -> tuple[RecordFuture, bool]:
        """Buffer one record; returns its handle and whether the sender should look now.

        The sender must look when a batch is created (a new linger deadline) or becomes full.
        ``now`` defaults to the loop's clock. This is the per-record hot path: no future and
        no allocation beyond the record tuple and its handle.
        """
        if headers:
            size = record_size(key, value, headers)
        else:
            size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        batch = self._open.get(tp)
        if batch is None or (batch.size + size > self.batch_bytes and batch.records):
            batch = self._new_batch(tp, now)
            look = True
        else:
            look = False
        records = batch.records
        handle = RecordFuture(batch, len(records))
        records.append((key, value, headers, timestamp_ms))
        batch.size += size
        self.buffered_bytes += size
        if batch.size >= self.batch_bytes:
            del self._open[tp]  # full: the next record starts a new batch
            look = True
        return handle, look

    def append_many(
        self,
        tp: TopicPartition,
        records: list[RecordTuple],
        cumulative: list[int],
        lo: int = 0,
        hi: int | None = None,
        now: float | None = None,
    ) -> list[tuple[ProducerBatch, int, int]]:
        """Buffer a partition's ``records[lo:hi]`` in order (``cumulative[i]``: the size of
        ``records[:i + 1]``), filling the open batch and then new ones, each up to
        ``batch_bytes`` (a record larger than that gets a batch of its own); returns the
        slices: (batch, index of the first record in it, count). The sender must look."""
        segments: list[tuple[ProducerBatch, int, int]] = []
        count = len(records) if hi is None else hi
        start = lo
        done_bytes = cumulative[lo - 1] if lo else 0  # the size of records[:start]
        while start < count:
            batch = self._open.get(tp)
            if batch is None:
                batch = self._new_batch(tp, now)
            room = self.batch_bytes - batch.size
            end = bisect_right(cumulative, done_bytes + room, start, count)
            if end == start:
                if batch.records:  # the next record does not fit: close this batch
                    del self._open[tp]
                    continue
                end = start + 1  # larger than a batch: alone in a new one
            size = cumulative[end - 1] - done_bytes
            first = len(batch.records)
            batch.records.extend(records[start:end])
            batch.size += size
            self.buffered_bytes += size
            segments.append((batch, first, end - start))
            if end < count or batch.size >= self.batch_bytes:
                del self._open[tp]  # full (the next record did not fit)
            done_bytes = cumulative[end - 1]
            start = end
        return segments

    def _new_batch(self, tp: TopicPartition, now: float | None) -> ProducerBatch:
        created_at = self._loop.time() if now is None else now
        batch = ProducerBatch(tp, created_at, next(self._sequence), self._loop)
        self._last_sequence = batch.sequence
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        queue.append(batch)
        self._open[tp] = batch
        return batch

    def ready(
        self, now: float, lingering: list[ProducerBatch] | None = None
    ) -> tuple[list[ProducerBatch], float | None]:
        """Head batches to send now (at most one per partition: one request carries one batch
        of a partition) and when to look again. ``lingering`` receives the head batches that
        could go but wait for their linger, of partitions with nothing in flight: a request
        going to their leader anyway may take them along (Kafka's sender does the same)."""
        ready: list[ProducerBatch] = []
        wake_at: float | None = None
        in_flight = self._in_flight
        for tp, queue in self._queues.items():
            if not queue:
                continue
            head = queue[0]
            flying = in_flight.get(tp)
            if flying and not self._may_pipeline(tp, head, flying):
                continue  # sent (and looked at again) when a batch in flight comes back
            due = self._due_at(head, full=len(queue) > 1)
            if due <= now:
                ready.append(head)
                continue
            if wake_at is None or due < wake_at:
                wake_at = due
            if lingering is not None and not flying and not (head.attempts or head.refused):
                lingering.append(head)
        return ready, wake_at

    def _may_pipeline(
        self, tp: TopicPartition, head: ProducerBatch, flying: deque[ProducerBatch]
    ) -> bool:
        """Whether ``head`` may go while ``flying`` (of its partition) is in flight."""
        if head.attempts or head.refused:
            return False  # a retry goes alone, after every batch sent before it came back
        if self._open.get(tp) is head and not self.closing and head.sequence > self._flush_upto:
            # A batch still taking records is pipelined only once full: while its partition
            # has batches in flight it fills until one is acknowledged (then it goes, lingered
            # or not). Sending partial batches behind others costs the nodes more CPU per
            # record than the round trip it saves (latency_bench at 5,000 records/s with
            # linger 0, produce_bench's public Producer): pipelining is for full batches.
            return False
        if self.producer_id < 0:
            return len(flying) < self.max_in_flight
        if len(flying) >= (self.max_in_flight if tp in self._acked else 1):
            return False
        # After a batch failed for good the partition drains before the new epoch begins.
        return flying[-1].epoch == self._epochs.get(tp, 0)

    def _due_at(self, batch: ProducerBatch, *, full: bool) -> float:
        if batch.attempts or batch.refused:
            return batch.retry_at
        if full or self.closing or batch.size >= self.batch_bytes:
            return 0.0
        if batch.sequence <= self._flush_upto:
            return 0.0
        return batch.created + self.linger

    def start_sending(self, batches: Iterable[ProducerBatch]) -> None:
        """Take batches off their queues' heads and mark their partitions busy."""
        for batch in batches:
            queue = self._queues[batch.tp]
            assert queue[0] is batch, "only a partition's head batch can be sent"
            queue.popleft()
            if not queue:  # (ready() visits queues: at 10,000 partitions most would be empty)
                del self._queues[batch.tp]
            if self._open.get(batch.tp) is batch:
                del self._open[batch.tp]
            if batch.data is None:
                sequence = self._sequences.get(batch.tp, 0) if self.producer_id >= 0 else -1
                batch.epoch = self._epochs.get(batch.tp, 0)
                batch.build(
                    self.producer_id,
                    sequence,
                    self.compression,
                    self.compression_level,
                    batch.epoch,
                )
                if sequence >= 0:
                    self._sequences[batch.tp] = (sequence + len(batch.records)) % SEQUENCE_WRAP
            flying = self._in_flight.get(batch.tp)
            if flying is None:
                self._in_flight[batch.tp] = deque((batch,))
            else:
                flying.append(batch)

    def requeue(
        self, batch: ProducerBatch, retry_at: float, *, rebuild: bool = False, counted: bool = True
    ) -> None:
        """Put a batch that must be retried back into its partition's queue, ahead of every
        batch created after it (its place in the send order). ``rebuild``: the node refused
        it for an epoch this partition has left (after a batch failed for good), so it was not
        written and is built again, with the current epoch and the next sequence.
        ``counted=False``: refused only because a batch before it was missing (out of order),
        which does not count against the batch's own retries."""
        if counted:
            batch.attempts += 1
        else:
            batch.refused += 1
        batch.retry_at = retry_at
        if rebuild and self.stale(batch):
            batch.data = None
        self._leave_flight(batch)
        queue = self._queues.setdefault(batch.tp, deque())
        position = len(queue)
        for index, queued in enumerate(queue):
            if queued.sequence > batch.sequence:
                position = index
                break
        queue.insert(position, batch)

    def waiting_for_leader(self) -> list[ProducerBatch]:
        """Head batches held back until their partition gets another leader."""
        return [
            queue[0]
            for queue in self._queues.values()
            if queue and queue[0].failed_leader is not None and queue[0].retry_at > 0.0
        ]

    def stale(self, batch: ProducerBatch) -> bool:
        """Whether ``batch`` was built for an epoch its partition has left."""
        return self.producer_id >= 0 and batch.epoch != self._epochs.get(batch.tp, 0)

    def finished(self, batch: ProducerBatch) -> None:
        """A batch was acknowledged or failed for good: free its bytes. A built batch that
        failed leaves a hole in its partition's sequences: a new epoch starts there."""
        tp = batch.tp
        self._leave_flight(batch)
        self.buffered_bytes -= batch.size - HEADER_SIZE
        if batch.error is None:
            self._acked.add(tp)
        elif batch.data is not None and self.producer_id >= 0 and not self.stale(batch):
            self._epochs[tp] = (self._epochs.get(tp, 0) + 1) % EPOCH_WRAP
            self._sequences[tp] = 0
        queue = self._queues.get(tp)
        if queue is not None and not queue and tp not in self._in_flight:
            del self._queues[tp]

    def _leave_flight(self, batch: ProducerBatch) -> None:
        flying = self._in_flight.get(batch.tp)
        if flying is None:
            return
        try:
            flying.remove(batch)
        except ValueError:
            return
        if not flying:
            del self._in_flight[batch.tp]

    def hold(self, batch: ProducerBatch) -> None:
        """A batch in flight was refused by its sealed partition: it leaves the flight (its
        bytes stay counted until ``release_held``); it will go elsewhere."""
        self._leave_flight(batch)

    def release_held(self, batch: ProducerBatch) -> None:
        """A held batch is handed over to be sent elsewhere: its bytes leave the buffer."""
        self.buffered_bytes -= batch.size - HEADER_SIZE

    def unsettled(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` is in flight or was sent and waits to be sent again
        (whether it was written there is not known yet)."""
        if tp in self._in_flight:
            return True
        return any(batch.data is not None for batch in self._queues.get(tp, ()))

    def take_partition(self, tp: TopicPartition) -> list[ProducerBatch]:
        """Every batch of ``tp`` (the one in flight first, then the queue, in order), taken
        off it with its bytes: the partition was sealed and they go elsewhere."""
        taken = list(self._in_flight.pop(tp, ()))
        taken.extend(self._queues.pop(tp, ()))
        self._open.pop(tp, None)
        for batch in taken:
            self.buffered_bytes -= batch.size - HEADER_SIZE
        return taken

    def begin_flush(self) -> list[asyncio.Future[None]]:
        """Make every batch created so far ready now; their ``done`` futures to wait on."""
        self._flush_upto = self._last_sequence
        waiting = [batch.done for queue in self._queues.values() for batch in queue]
        return waiting + [b.done for flying in self._in_flight.values() for b in flying]

    def fail_all(self, error: BaseException) -> None:
        """Fail every buffered (not in flight) batch, e.g. when the producer is closed."""
        for queue in self._queues.values():
            while queue:
                batch = queue.popleft()
                batch.fail(error)
                self.buffered_bytes -= batch.size - HEADER_SIZE
        self._queues.clear()
        self._open.clear()

    def sending(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` has a batch in flight."""
        return tp in self._in_flight

    def queued(self, tp: TopicPartition) -> int:
        """Batches of ``tp`` waiting or in flight: how long a new batch would wait there."""
        return len(self._queues.get(tp, ())) + len(self._in_flight.get(tp, ()))

    def busy(self, tp: TopicPartition) -> bool:
        """Whether a record for ``tp`` would wait behind a batch in flight or queued."""
        return tp in self._in_flight or bool(self._queues.get(tp))

    @property
    def in_flight(self) -> int:
        """Partitions with a batch in flight."""
        return len(self._in_flight)

    def empty(self) -> bool:
        return not self._in_flight and not any(self._queues.values())
