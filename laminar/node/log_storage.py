"""The partition log as the Raft log: the adapter between PartitionLog and the Raft core.

A NORMAL entry is a client's record batch, stored exactly as the leader stamped it (base offset
= entry index, term = entry term). NOOP and CONFIG entries, which the core creates itself, are
stored as one-record control batches with timestamp 0, so every replica writes identical bytes
for them, and read back as (kind, payload).
"""

from __future__ import annotations

import struct
from bisect import bisect_left

from laminar.errors import OffsetOutOfRangeError
from laminar.node.producers import ProducerTable
from laminar.node.tail_checkpoint import TailState
from laminar.raft import CompactedError, Entry, EntryKind, UnavailableError
from laminar.segment import batch as record_batch
from laminar.segment.batch import ATTR_CONTROL
from laminar.segment.log import PartitionLog
from laminar.splits.seal import find_seal, is_raft_noop, is_seal

_KIND = struct.Struct(">H")
UNINDEXED_WALK_BYTES = 32 * 1024
"""A restart walks the batch headers after a log's last index entry on disk: a saved tail
writes the log's buffered entries only once they cover this much (``tail_state``)."""
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


def _is_config(view: memoryview) -> bool:
    """Whether a stored control batch is a CONFIG entry (one record: a queue's state batches
    usually hold many, and are not decoded here)."""
    return record_batch.read_header(view).record_count == 1 and batch_to_entry(view).kind == _CONFIG


class LogStorage:
    """Implements the Raft core's Storage protocol over a PartitionLog.

    With ``roll_at_control`` (the metadata group) a NORMAL control batch, a metadata
    checkpoint, starts a new segment, so deleting the segments below a checkpoint leaves a
    log that starts exactly at it (``metadata_checkpoint``)."""

    __slots__ = (
        "_configs",
        "_configs_from",
        "log",
        "producers",
        "resumed",
        "roll_at_control",
        "seal_offset",
    )

    def __init__(
        self, log: PartitionLog, roll_at_control: bool = False, *, resume: TailState | None = None
    ) -> None:
        """``resume``: the log's tail as saved in this boot (``tail_checkpoint``): if the log
        still matches it, only the batches after it are walked."""
        self.log = log
        self.roll_at_control = roll_at_control
        self.producers = ProducerTable()
        # One walk of the tail for the producer table, the seal and the CONFIG entries.
        self.resumed = resume is not None and resume.matches(log)
        if resume is not None and self.resumed:
            tail = log.read_tail(resume.end)
            self.producers.restore(resume.producers)
            for header in tail.headers:
                self.producers.record(header, header.base_offset, header.last_offset)
            seal = find_seal(log, tail, before_tail=resume.seal)
            self._configs = [at for at in resume.configs if at >= log.start_offset]
            self._configs_from = max(resume.configs_from, log.start_offset)
        else:
            tail = log.read_tail(ProducerTable.window_start(log))
            self.producers.rebuild(log, tail)
            seal = find_seal(log, tail)
            self._configs = []
            self._configs_from = tail.start
        # Offsets of every CONFIG entry from ``_configs_from`` on (the Raft core's scan).
        self._configs += [at for at, view in tail.controls.items() if _is_config(view)]
        self.seal_offset: int | None = None if roll_at_control else seal
        """Offset of this log's seal batch (``laminar.splits.seal``): no record after it."""

    def tail_mark(self) -> tuple[int, int]:
        """(end offset, the term there): moves whenever ``tail_state`` could
        (``tail_checkpoint``)."""
        end = self.log.end_offset
        return (end, self.log.term_at(end - 1))

    def tail_state(self) -> TailState | None:
        """What a restart in this boot may skip reading (``tail_checkpoint``), with the log's
        buffered index entries written first; None for an empty, closed or failed log."""
        log = self.log
        (end, term), start = self.tail_mark(), log.start_offset
        if end <= start or log.closed or log.sync_failed:
            return None
        try:
            log.write_index(unless_within=UNINDEXED_WALK_BYTES)
        except OSError:  # (a full disk: saved once it writes again)
            return None
        configs = self._configs
        if configs and configs[0] < start:  # (retention removed them)
            del configs[: bisect_left(configs, start)]
        return TailState(
            end,
            term,
            max(self._configs_from, start),
            tuple(configs),
            self.seal_offset,
            self.producers.snapshot(end),
        )

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
        """CONFIG entries: those this storage knows of, and before what it knows, the control
        batches found by header; only they are read."""
        log = self.log
        if lo < log.start_offset:
            raise CompactedError(lo)
        split = max(lo, min(hi, self._configs_from))
        offsets = log.control_offsets(lo, split) + [at for at in self._configs if split <= at < hi]
        views = [log.batches(at, at + 1, 1)[0] for at in offsets]
        return [entry for entry in map(batch_to_entry, views) if entry.kind == _CONFIG]

    def append(self, entries: list[Entry]) -> None:
        log = self.log
        for entry in entries:
            if entry.index < log.end_offset:
                self.truncate(entry.index)
            if entry.kind != _NORMAL:
                log.append_stamped(control_entry_batch(entry))
                if entry.kind == _CONFIG:
                    self._configs.append(entry.index)
                continue
            header = record_batch.read_header(entry.data)
            control = header.attributes & ATTR_CONTROL
            if self.roll_at_control and control:
                log.roll()
            # The log stamps base offset (its end, which Raft made equal to entry.index) and
            # term while writing, so the batch bytes are never copied here.
            base, _ = log.append(entry.data, term=entry.term)
            assert base == entry.index, f"log end {base} is not entry index {entry.index}"
            self.producers.record(header, entry.index, entry.last)
            if control and is_seal(entry.data, header):  # (not in the metadata log)
                self.seal_offset = entry.index
                # The seal closes its segment, so retention may delete it like any other and
                # empty the sealed log (then the partition retires: ``laminar.splits.retire``).
                log.roll()

    def truncate(self, index: int) -> None:
        self.log.truncate(index)
        self.producers.truncate(index)
        del self._configs[bisect_left(self._configs, index) :]
        self._configs_from = min(self._configs_from, index)
        if self.seal_offset is not None and self.seal_offset >= index:
            self.seal_offset = None  # the seal was never committed: a new one is proposed

    def reset(self, start: int, prev_term: int) -> None:
        self.log.reset(start, prev_term)
        self.producers.clear()
        self._configs.clear()
        self._configs_from = start
        if self.seal_offset is not None and self.seal_offset >= start:
            self.seal_offset = None
        # A seal below ``start`` stays: this log restarts after it, still sealed.
