"""Idempotent produce: remember recent (producer id, sequence) -> offsets per partition.

A producer stamps every batch with its producer id and a per-partition base sequence, and a
retry resends the very same bytes. Every replica records the sequences of the batches it
appends (leader and followers alike), so after a failover the new leader recognises a retried
batch that already reached its log and answers with the original offsets instead of writing it
twice. Truncation forgets what it removes; a restart rebuilds the table from the log's tail.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from laminar.segment.batch import BatchHeader
from laminar.segment.log import PartitionLog, Tail

KEEP_PER_PRODUCER = 8
REBUILD_WINDOW_OFFSETS = 500_000


@dataclass(slots=True, frozen=True)
class Written:
    base_sequence: int
    base_offset: int
    last_offset: int
    producer_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.last_offset - self.base_offset


class ProducerTable:
    __slots__ = ("_producers",)

    def __init__(self) -> None:
        self._producers: dict[int, collections.deque[Written]] = {}

    def record(self, header: BatchHeader, base_offset: int, last_offset: int) -> None:
        if header.producer_id < 0 or header.base_sequence < 0:
            return
        written = self._producers.get(header.producer_id)
        if written is None:
            written = self._producers[header.producer_id] = collections.deque(
                maxlen=KEEP_PER_PRODUCER
            )
        epoch = header.producer_epoch
        for entry in written:
            if entry.base_sequence == header.base_sequence and entry.producer_epoch == epoch:
                return
        written.append(Written(header.base_sequence, base_offset, last_offset, epoch))

    def find(self, header: BatchHeader) -> Written | None:
        """The earlier write of this batch, if it is a retry of one this log holds."""
        if header.producer_id < 0 or header.base_sequence < 0:
            return None
        epoch = header.producer_epoch
        for entry in self._producers.get(header.producer_id, ()):
            if entry.base_sequence == header.base_sequence and entry.producer_epoch == epoch:
                return entry
        return None

    def last(self, producer_id: int) -> Written | None:
        """The producer's most recent batch in this log (Kafka's sequence checks)."""
        written = self._producers.get(producer_id)
        return written[-1] if written else None

    def truncate(self, offset: int) -> None:
        for producer_id, written in list(self._producers.items()):
            kept = [w for w in written if w.last_offset < offset]
            if len(kept) != len(written):
                written.clear()
                written.extend(kept)
            if not written:
                del self._producers[producer_id]

    def clear(self) -> None:
        self._producers.clear()

    def snapshot(self, end: int) -> list[list[int]]:
        """Every remembered batch below offset ``end`` (the log's end: a leader records a
        batch when it proposes it, before its log holds it) as [producer id, epoch, base
        sequence, base offset, last offset], oldest first per producer (``restore`` takes it
        back; see TailState)."""
        return [
            [producer_id, w.producer_epoch, w.base_sequence, w.base_offset, w.last_offset]
            for producer_id, written in self._producers.items()
            for w in written
            if w.last_offset < end
        ]

    def restore(self, rows: list[list[int]]) -> None:
        """The table as ``snapshot`` saw it."""
        self.clear()
        producers = self._producers
        for producer_id, epoch, base_sequence, base_offset, last_offset in rows:
            written = producers.get(producer_id)
            if written is None:
                written = producers[producer_id] = collections.deque(maxlen=KEEP_PER_PRODUCER)
            written.append(Written(base_sequence, base_offset, last_offset, epoch))

    @staticmethod
    def window_start(log: PartitionLog) -> int:
        """Where ``rebuild`` starts reading: the last REBUILD_WINDOW_OFFSETS offsets."""
        return max(log.start_offset, log.end_offset - REBUILD_WINDOW_OFFSETS)

    def rebuild(self, log: PartitionLog, tail: Tail | None = None) -> None:
        """Re-learn recent sequences from batch headers at the log's tail (after a restart).

        ``tail``: the log's tail as walked on open (``PartitionLog.read_tail``), used where it
        reaches; what lies before it is walked in the log."""
        self.clear()
        offset = self.window_start(log)
        end = log.end_offset
        if tail is not None and tail.end != end:
            tail = None  # (read before the log changed)
        stop = end if tail is None else max(offset, tail.start)
        if offset < stop:
            for header in log.headers(offset, stop):
                self.record(header, header.base_offset, header.last_offset)
                offset = header.next_offset
        if tail is not None and offset < end:
            for header in tail.headers[tail.find(offset) :]:
                self.record(header, header.base_offset, header.last_offset)
