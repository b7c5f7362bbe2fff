"""The partition log as the Raft log: the adapter between PartitionLog and the Raft core.

A NORMAL entry is a client's record batch, stored exactly as the leader stamped it (base offset
= entry index, term = entry term). NOOP and CONFIG entries, which the core creates itself, are
stored as one-record control batches with timestamp 0, so every replica writes identical bytes
for them, and read back as (kind, payload).
"""

from __future__ import annotations

import struct

from laminar.errors import OffsetOutOfRangeError
from laminar.node.producers import ProducerTable
from laminar.raft import CompactedError, Entry, EntryKind, UnavailableError
from laminar.segment import batch as record_batch
from laminar.segment.batch import ATTR_CONTROL
from laminar.segment.log import PartitionLog, Tail
from laminar.splits.seal import find_seal, is_raft_noop, is_seal

_KIND = struct.Struct(">H")
_NORMAL, _NOOP, _CONFIG = EntryKind.NORMAL, EntryKind.NOOP, EntryKind.CONFIG  # (read once)


def control_entry_batch(entry: Entry) -> bytearray:
    """The bytes every replica writes for a NOOP or CONFIG entry (identical everywhere)."""
    data = bytearray(record_batch.control_batch(int(entry.kind), bytes(entry.data), timestamp_ms=0))
    record_batch.stamp(data, entry.index, entry.term)
    return data


_CORE_KINDS = frozenset((EntryKind.NOOP, EntryKind.CONFIG))


def batch_to_entry(view: memoryview) -> Entry:
    """A stored batch as a Raft entry: the core's own NOOP and CONFIG control batches come back
    as (kind, payload); every other batch, including control batches the node writes itself
    (queue state, ``laminar.queues``), is a NORMAL entry of its bytes."""
    header = record_batch.read_header(view)
    last = header.base_offset + header.last_offset_delta
    if record_batch.is_control(header):
        if is_raft_noop(view):  # (no decoding for the commonest control batch)
            return Entry(header.term, header.base_offset, last, _NOOP, b"")
        record = record_batch.decode_records(view)[0]
        kind = _KIND.unpack(record.key or b"\0\0")[0]
        if kind in _CORE_KINDS:
            payload = record.value or b""
            return Entry(header.term, header.base_offset, last, EntryKind(kind), payload)
    return Entry(header.term, header.base_offset, last, _NORMAL, view)


class LogStorage:
    """Implements the Raft core's Storage protocol over a PartitionLog.

    With ``roll_at_control`` (the metadata group) a NORMAL control batch, a metadata
    checkpoint, starts a new segment, so deleting the segments below a checkpoint leaves a
    log that starts exactly at it (``metadata_checkpoint``)."""

    __slots__ = ("_tail", "log", "producers", "roll_at_control", "seal_offset")

    def __init__(
        self, log: PartitionLog, roll_at_control: bool = False, *, keep_tail: bool = False
    ) -> None:
        """``keep_tail``: keep the tail read here (see ``Tail``) for ``config_entries``
        until ``release_tail``: the Raft core's configuration scan on construction then reads
        the control batches already read."""
        self.log = log
        self.roll_at_control = roll_at_control
        # One walk of the tail for the producer table, the seal and (kept) the Raft core.
        tail = log.read_tail(ProducerTable.window_start(log))
        self.producers = ProducerTable()
        self.producers.rebuild(log, tail)
        self.seal_offset: int | None = None if roll_at_control else find_seal(log, tail)
        """Offset of this log's seal batch (``laminar.splits.seal``): no record after it."""
        self._tail: Tail | None = tail if keep_tail else None

    def release_tail(self) -> None:
        """Drop the tail kept since opening."""
        self._tail = None

    def first_index(self) -> int:
        return self.log.start_offset

    def last_index(self) -> int:
        return self.log.end_offset - 1

    def term(self, index: int) -> int:
        try:
            return self.log.term_at(index)
        except OffsetOutOfRangeError:
            if index < self.log.start_offset:
                raise CompactedError(index) from None
            raise UnavailableError(index) from None

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.log.start_offset:
            raise CompactedError(lo)
        return [batch_to_entry(view) for view in self.log.batches(lo, hi, max_bytes)]

    def config_entries(self, lo: int, hi: int) -> list[Entry]:
        """CONFIG entries are control batches: found by header, only they are read (those of
        the kept tail were read with it)."""
        if lo < self.log.start_offset:
            raise CompactedError(lo)
        log, tail = self.log, self._tail
        split = hi
        if tail is not None and tail.end == log.end_offset:
            split = max(lo, min(hi, tail.start))
        views = [log.batches(at, at + 1, 1)[0] for at in log.control_offsets(lo, split)]
        if split < hi:
            views += [view for at, view in tail.controls.items() if split <= at < hi]
        return [entry for entry in map(batch_to_entry, views) if entry.kind == _CONFIG]

    def append(self, entries: list[Entry]) -> None:
        self._tail = None
        log = self.log
        for entry in entries:
            if entry.index < log.end_offset:
                self.truncate(entry.index)
            if entry.kind != _NORMAL:
                log.append_stamped(control_entry_batch(entry))
                continue
            if self.roll_at_control and record_batch.is_control(
                record_batch.read_header(entry.data)
            ):
                log.roll()
            # The log stamps base offset (its end, which Raft made equal to entry.index) and
            # term while writing, so the batch bytes are never copied here.
            base, _ = log.append(entry.data, term=entry.term)
            assert base == entry.index, f"log end {base} is not entry index {entry.index}"
            header = record_batch.read_header(entry.data)
            self.producers.record(header, entry.index, entry.last)
            if header.attributes & ATTR_CONTROL and is_seal(entry.data, header):  # not metadata
                self.seal_offset = entry.index
                # The seal closes its segment, so retention may delete it like any other and
                # empty the sealed log (then the partition retires: ``laminar.splits.retire``).
                log.roll()

    def truncate(self, index: int) -> None:
        self._tail = None
        self.log.truncate(index)
        self.producers.truncate(index)
        if self.seal_offset is not None and self.seal_offset >= index:
            self.seal_offset = None  # the seal was never committed: a new one is proposed

    def reset(self, start: int, prev_term: int) -> None:
        self._tail = None
        self.log.reset(start, prev_term)
        self.producers.clear()
        if self.seal_offset is not None and self.seal_offset >= start:
            self.seal_offset = None
        # A seal below ``start`` stays: this log restarts after it, still sealed.
