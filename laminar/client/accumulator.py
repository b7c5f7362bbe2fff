"""The producer's buffer: records grouped into one open batch per partition.

No I/O and no clock of its own (callers pass ``now``), so linger, size and ordering rules are
tested without sockets. Ordering rule: at most one batch per partition is in flight, and a
batch that must be retried goes back to the head of its partition's queue, so retries never
reorder a partition's records.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterable

from laminar.client.delivery import RecordFuture, resolve
from laminar.client.types import Headers, RecordMetadata, TopicPartition
from laminar.segment.batch import HEADER_SIZE, build_batch
from laminar.segment.compression import NONE

RECORD_OVERHEAD = 24
"""Upper estimate of a record's framing bytes (length, attributes, deltas, varint lengths)."""

SEQUENCE_WRAP = 1 << 31
"""Base sequences are int32 on the wire; they wrap (the node compares them for equality)."""

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
        "created",
        "data",
        "done",
        "error",
        "finished",
        "forwards",
        "loop",
        "records",
        "retry_at",
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
        self.retry_at = 0.0
        self.data: bytes | None = None
        self.finished = False
        self.base_offset = -1
        self.error: BaseException | None = None
        self.waiters: list[tuple[asyncio.Future[RecordMetadata], int]] = []
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
                producer_epoch=0 if producer_id >= 0 else -1,
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
    ) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self.compression = compression
        self.compression_level = compression_level
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.producer_id = producer_id
        self._sequences: dict[TopicPartition, int] = {}
        self.buffered_bytes = 0
        self.closing = False
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._in_flight: dict[TopicPartition, ProducerBatch] = {}
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

    def ready(self, now: float) -> tuple[list[ProducerBatch], float | None]:
        """Head batches to send now (one per idle partition) and when to look again."""
        ready: list[ProducerBatch] = []
        wake_at: float | None = None
        for tp, queue in self._queues.items():
            if not queue or tp in self._in_flight:
                continue
            head = queue[0]
            due = self._due_at(head, full=len(queue) > 1)
            if due <= now:
                ready.append(head)
            elif wake_at is None or due < wake_at:
                wake_at = due
        return ready, wake_at

    def _due_at(self, batch: ProducerBatch, *, full: bool) -> float:
        if batch.attempts:
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
            if self._open.get(batch.tp) is batch:
                del self._open[batch.tp]
            if batch.data is None:
                sequence = self._sequences.get(batch.tp, 0) if self.producer_id >= 0 else -1
                batch.build(self.producer_id, sequence, self.compression, self.compression_level)
                if sequence >= 0:
                    self._sequences[batch.tp] = (sequence + len(batch.records)) % SEQUENCE_WRAP
            self._in_flight[batch.tp] = batch

    def requeue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a batch that must be retried back at the head of its partition's queue."""
        batch.attempts += 1
        batch.retry_at = retry_at
        self._queues.setdefault(batch.tp, deque()).appendleft(batch)
        self._in_flight.pop(batch.tp, None)

    def finished(self, batch: ProducerBatch) -> None:
        """A batch was acknowledged or failed for good: free its partition and its bytes."""
        self._in_flight.pop(batch.tp, None)
        self.buffered_bytes -= batch.size - HEADER_SIZE
        queue = self._queues.get(batch.tp)
        if queue is not None and not queue and batch.tp not in self._in_flight:
            del self._queues[batch.tp]

    def take_partition(self, tp: TopicPartition) -> list[ProducerBatch]:
        """Every batch of ``tp`` (the one in flight first, then the queue, in order), taken
        off it with its bytes: the partition was sealed and they go elsewhere."""
        taken = []
        flying = self._in_flight.pop(tp, None)
        if flying is not None:
            taken.append(flying)
        taken.extend(self._queues.pop(tp, ()))
        self._open.pop(tp, None)
        for batch in taken:
            self.buffered_bytes -= batch.size - HEADER_SIZE
        return taken

    def begin_flush(self) -> list[asyncio.Future[None]]:
        """Make every batch created so far ready now; their ``done`` futures to wait on."""
        self._flush_upto = self._last_sequence
        waiting = [batch.done for queue in self._queues.values() for batch in queue]
        return waiting + [batch.done for batch in self._in_flight.values()]

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
        """Whether ``tp`` has a batch in flight (its next one waits for the acknowledgement)."""
        return tp in self._in_flight

    def busy(self, tp: TopicPartition) -> bool:
        """Whether a record for ``tp`` would wait behind a batch in flight or queued."""
        return tp in self._in_flight or bool(self._queues.get(tp))

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def empty(self) -> bool:
        return not self._in_flight and not any(self._queues.values())
