"""One segment of a partition log: a data file of whole batches plus its two indexes.

A segment is either active (the last one, appended to) or sealed (immutable, fsynced when it was
rolled). Sealed segments are trusted through their indexes on open; the active segment is
recovered by verifying every batch after its last usable index entry.

Descriptors: the index files are open only while written (their entries are buffered and
written a few KiB at a time), and the data file is opened on demand. A log sharing a node's
``DescriptorCache`` may have any segment's data descriptor taken away between two calls, so
code here holds the ``FileHandle`` in a local while it uses its ``fd``: the handle, not the
segment, keeps the descriptor open.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Container, Iterator
from pathlib import Path

import structlog

from laminar.errors import CorruptBatchError, CorruptLogError
from laminar.segment.batch import HEADER_SIZE, MAGIC, BatchHeader, check_batch, read_header
from laminar.segment.descriptors import DescriptorCache
from laminar.segment.fileio import (
    FileHandle,
    open_append,
    pread_exact,
    read_or_empty,
    write_whole,
)
from laminar.segment.index import NO_TIMESTAMP, OFFSET_ENTRY, OffsetIndex, TimeIndex

log = structlog.get_logger(__name__)

CHUNK = 1 << 20  # read size when scanning data files
LEAN_HEADER = struct.Struct("<q8xi4xB3xi")  # base_offset, batch_length, magic, last_offset_delta
PENDING_FLUSH = 4096  # buffered index bytes written to the index files past this size


def segment_name(base: int) -> str:
    return f"{base:020d}"


class Segment:
    """Files and in-memory state of one segment; the PartitionLog coordinates segments."""

    def __init__(self, directory: str | Path, base: int, interval: int) -> None:
        self.base = base
        # Plain strings: a restart builds three paths per replica, and pathlib's parsing of
        # them (and again for every system call) was a tenth of opening 10,000 replicas.
        prefix = f"{directory}/{segment_name(base)}"
        self.log_path = prefix + ".log"
        self.index_path = prefix + ".index"
        self.time_path = prefix + ".timeindex"
        self.interval = interval
        self._data: FileHandle | None = None
        self.on_open: Callable[[Segment], None] | None = None  # the log's sealed-file LRU
        self._budget: DescriptorCache | None = None  # the node's, if the log shares one
        self._busy: Callable[[FileHandle], bool] | None = None  # awaiting an fdatasync?
        self.closed = False
        self.idx = OffsetIndex(base)
        self.tidx = TimeIndex(base)
        self.size = 0  # bytes of whole batches in the data file
        self.end = base  # next offset after the last batch
        self.last_term = 0
        self.max_ts = NO_TIMESTAMP
        self.max_off = base
        self.max_pos = 0
        self.sealed = False
        # Batches in bytes [unchecked_from, unchecked_to) were never crc-checked by this
        # process: a sealed segment opened through a good index is trusted unread, and the
        # active one is checked only after its last index entry. Reads check them on first use
        # (check_read); what this process appended was checked when it arrived.
        self.unchecked_from = 0
        self.unchecked_offset = base  # the offset of the batch at unchecked_from
        self.unchecked_to = 0
        # wall-clock ms of the first append (time-based rolling); after a restart the first
        # batch's timestamp stands in for it (see PartitionLog._aged)
        self.roll_clock_ms: int | None = None
        self._pending_idx = bytearray()
        self._pending_time = bytearray()

    # ----------------------------------------------------------------- creation and opening

    @classmethod
    def create(cls, directory: str | Path, base: int, interval: int) -> Segment:
        """A new, empty segment: its data file only. The index files appear with their first
        entries (``write_pending``), and one that is absent reads as empty: creating all
        three files up front was a fifth of a node's CPU while it created 10,000 replicas."""
        seg = cls(directory, base, interval)
        for path in (seg.index_path, seg.time_path):  # (a leftover of an earlier life)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        seg.data = open_append(seg.log_path, truncate=True)
        return seg

    def attach(
        self,
        on_open: Callable[[Segment], None] | None,
        budget: DescriptorCache | None,
        busy: Callable[[FileHandle], bool] | None,
    ) -> None:
        """Hook the segment to its log: the log's LRU of sealed files, the node's descriptor
        budget (which now counts the descriptor if it is open) and the log's dirty set."""
        self.on_open, self._budget, self._busy = on_open, budget, busy
        if budget is not None and self._data is not None:
            budget.opened(self, self._data)

    @property
    def data(self) -> FileHandle:
        """The data file, opened on demand: sealed segments hold no descriptor until read, and
        any segment may lose its descriptor to the node's budget (``release_descriptor``).
        Keep the returned handle while using its ``fd``."""
        handle = self._data
        budget = self._budget
        if handle is None:
            if self.closed:
                raise ValueError(f"{self.log_path}: the log is closed")
            try:
                handle = open_append(self.log_path, create=False)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or budget is None:
                    raise
                budget.relieve()  # out of descriptors: close every idle file and try again
                handle = open_append(self.log_path, create=False)
            self._data = handle
            if self.sealed and self.on_open is not None:
                self.on_open(self)
            if budget is not None:
                budget.opened(self, handle)
        elif budget is not None:
            budget.touch(self)
        return handle

    @data.setter
    def data(self, handle: FileHandle) -> None:
        self._data = handle

    @property
    def open_handle(self) -> FileHandle | None:
        """The data file's handle if it is open (never opens it)."""
        return self._data

    def release(self) -> None:
        """Drop a sealed segment's descriptor (it closes once slices and flushes let go)."""
        if self.sealed:
            self._data = None
            if self._budget is not None:
                self._budget.forget(self)

    def release_descriptor(self) -> None:
        """The node's budget takes the descriptor back: drop our reference (a flush, a slice
        or a caller holding the handle keeps it open until done); the next use reopens."""
        self._data = None

    def descriptor_busy(self) -> bool:
        """Whether our handle still awaits its fdatasync (dropping it would free nothing)."""
        handle, busy = self._data, self._busy
        return handle is not None and busy is not None and busy(handle)

    @classmethod
    def open_sealed(
        cls, directory: str | Path, base: int, next_base: int, interval: int
    ) -> Segment:
        """Open a sealed segment through its index; rebuild the index if it is unusable."""
        seg = cls(directory, base, interval)
        seg.sealed = True
        seg.data = open_append(seg.log_path, create=False)
        size = seg.data.size()
        if size == 0:
            raise CorruptLogError(f"{seg.log_path}: sealed segment is empty")
        idx, whole = OffsetIndex.parse(base, read_or_empty(seg.index_path), size)
        if whole and idx.offsets[-1] < next_base and seg._check_tail(idx, next_base, size):
            seg.idx = idx
            seg.size, seg.end, seg.last_term = size, next_base, idx.terms[-1]
            seg.unchecked_to = size  # trusted through its index: checked when first read
            seg._check_time_index()
            seg.release()
            return seg
        log.warning("rebuilding offset index", file=str(seg.index_path))
        seg._rebuild_sealed(next_base, size)
        seg.release()
        return seg

    def _check_tail(self, idx: OffsetIndex, next_base: int, size: int) -> bool:
        """Walk the headers after the last index entry: contiguous, same term, exact end."""
        expected = idx.offsets[-1]
        term = idx.terms[-1]
        running = idx.max_ts[-1]
        max_off, max_pos = self.base, 0
        last_end = -1
        try:
            for pos, h in self.walk(idx.positions[-1], size):
                if h.base_offset != expected or h.term != term:
                    return False
                if h.max_timestamp > running:
                    running, max_off, max_pos = h.max_timestamp, h.base_offset, pos
                expected = h.next_offset
                last_end = pos + h.batch_length
        except CorruptLogError:
            return False
        if expected != next_base or last_end != size:
            return False
        self.max_ts, self.max_off, self.max_pos = running, max_off, max_pos
        return True

    def _check_time_index(self) -> None:
        """A sealed time index must end with the segment's max timestamp; rewrite it if not."""
        data = read_or_empty(self.time_path)
        entry = TimeIndex.parse(self.base, data[-16:], self.size) if data else None
        if (
            entry is not None
            and len(data) % 16 == 0
            and entry.timestamps[0] == self.max_ts
            and entry.offsets[0] < self.end
        ):
            return
        log.warning("rebuilding time index", file=str(self.time_path))
        self._derive_time_index(seal=True)
        write_whole(self.time_path, self.tidx.to_bytes(), sync=True)
        self.tidx = TimeIndex(self.base)

    def _rebuild_sealed(self, next_base: int, size: int) -> None:
        self.idx = OffsetIndex(self.base)
        self.tidx = TimeIndex(self.base)
        stop, reason = self.scan(0, self.base, size, self._track_quiet)
        if reason is not None:
            raise CorruptLogError(f"{self.log_path}: corrupt batch at position {stop}: {reason}")
        if self.end != next_base:
            raise CorruptLogError(
                f"{self.log_path}: segment ends at offset {self.end}, next segment starts at "
                f"{next_base}"
            )
        self._derive_time_index(seal=True)
        write_whole(self.index_path, self.idx.to_bytes(), sync=True)
        write_whole(self.time_path, self.tidx.to_bytes(), sync=True)
        self.tidx = TimeIndex(self.base)

    @classmethod
    def recover_active(
        cls,
        directory: str | Path,
        base: int,
        interval: int,
        listed: Container[str] | None = None,
        *,
        same_boot: bool = False,
    ) -> Segment:
        """Open the last segment: verify every batch after the last good index entry and cut
        a torn or corrupt tail. ``listed``: the directory's files, if the caller just listed
        it (an index file not among them is not opened: most replicas of a restart have
        none, their few entries still buffered when the node died). ``same_boot``: the file
        is as its writer left it (``laminar.node.boot``), so only the batch headers there
        are walked, finding a last batch cut short; reads check the rest on first use."""
        seg = cls(directory, base, interval)
        seg.data = handle = open_append(seg.log_path)
        size = handle.size()
        raw_idx = _read_listed(seg.index_path, listed)
        raw_time = _read_listed(seg.time_path, listed)
        idx, _ = OffsetIndex.parse(base, raw_idx, size)
        indexed = None
        while len(idx) and (indexed := seg._indexed_header(idx, size)) is None:
            idx.keep(len(idx) - 1)
        seg.idx = idx
        if indexed is not None:
            start = idx.positions[-1]
            seg.last_term = idx.terms[-1]
            seg.max_ts = idx.max_ts[-1]
            seg.size, seg.end = start, idx.offsets[-1]
            first_pos: int | None = start  # batch already indexed: do not index it again
        else:
            start, first_pos = 0, None
        seg.unchecked_to = start  # the scan below checks the rest
        if same_boot and indexed is not None:  # (its header was just read: walk on after it)
            seg.size, seg.end = start + indexed.batch_length, indexed.next_offset
            start = seg.size

        def on_batch(pos: int, h: BatchHeader) -> None:
            if pos == first_pos:
                seg.size, seg.end = pos + h.batch_length, h.next_offset
            else:
                seg._track_quiet(pos, h)

        stop, reason = seg.scan(start, seg.end, size, on_batch, check_crc=not same_boot)
        if same_boot:
            seg.unchecked_to = stop
        if reason is not None:
            log.warning(
                "truncating torn or corrupt tail of the active segment",
                file=str(seg.log_path),
                position=stop,
                dropped_bytes=size - stop,
                reason=reason,
            )
            if stop == first_pos:  # the indexed batch itself is bad
                idx.keep(len(idx) - 1)
                seg._restore_tail_state(stop)
            os.ftruncate(handle.fd, stop)
        seg._derive_time_index(seal=False)
        for path, raw, fresh, pending in (
            (seg.index_path, raw_idx, seg.idx.to_bytes(), seg._pending_idx),
            (seg.time_path, raw_time, seg.tidx.to_bytes(), seg._pending_time),
        ):
            if fresh.startswith(raw):
                # The usual case after a kill: the file lacks the entries still buffered
                # then. They join the buffer again (written at the threshold, seal or close)
                # instead of a rewrite per replica, whose close (after a truncating write)
                # starts writeback: a 10,000-replica restart opened in 7.1 s, now 5.0 s.
                pending += fresh[len(raw) :]
            else:  # entries dropped or changed (not synced: rebuilt again if a crash loses it)
                write_whole(path, fresh)
        return seg

    def _indexed_header(self, idx: OffsetIndex, size: int) -> BatchHeader | None:
        """The header of the batch the last index entry names, if it is that batch, whole."""
        pos = idx.positions[-1]
        handle = self.data
        try:
            h = read_header(os.pread(handle.fd, HEADER_SIZE, pos))
        except CorruptBatchError:
            return None
        if (
            h.base_offset == idx.offsets[-1]
            and h.term == idx.terms[-1]
            and pos + h.batch_length <= size
            and h.max_timestamp <= idx.max_ts[-1]
        ):
            return h
        return None

    def _derive_time_index(self, *, seal: bool) -> None:
        tidx = TimeIndex(self.base)
        last = NO_TIMESTAMP
        idx = self.idx
        for off, pos, mx in zip(idx.offsets, idx.positions, idx.max_ts, strict=True):
            if mx > last:
                tidx.add(mx, off, pos)
                last = mx
        if seal and self.max_ts > last:
            tidx.add(self.max_ts, self.max_off, self.max_pos)
        self.tidx = tidx

    # ----------------------------------------------------------------------------- appends

    @property
    def first_timestamp(self) -> int | None:
        """Max timestamp of the first batch (the age used for time-based rolling)."""
        return self.tidx.timestamps[0] if len(self.tidx) else None

    def append(
        self,
        prefix: bytes,
        body: memoryview,
        length: int,
        mx: int,
        base: int,
        last: int,
        term: int,
    ) -> FileHandle:
        """Write prefix+body (one batch of ``length`` bytes, max timestamp ``mx``) at the end;
        on a failed write the file is cut back. Returns the data file's handle."""
        pos = self.size
        handle = self.data
        try:
            written = os.writev(handle.fd, (prefix, body))
            if written != length:
                raise OSError(f"short write of {written} of {length} bytes to {self.log_path}")
        except BaseException:
            os.ftruncate(handle.fd, pos)
            raise
        # the index rules of _track_quiet, inlined for the hot path
        if mx > self.max_ts:
            self.max_ts, self.max_off, self.max_pos = mx, base, pos
        idx = self.idx
        if not idx.offsets or term != self.last_term or pos - idx.positions[-1] >= self.interval:
            self._pending_idx += idx.add(base, pos, term, self.max_ts)
            if self.max_ts > self.tidx.last_timestamp:
                self._pending_time += self.tidx.add(self.max_ts, base, pos)
            if len(self._pending_idx) >= PENDING_FLUSH:
                self.write_pending()
        self.size = pos + length
        self.end = last + 1
        self.last_term = term
        return handle

    def _track_quiet(self, pos: int, h: BatchHeader) -> None:
        """Apply the index rules to an existing batch (rebuild/recovery); no file writes."""
        mx = h.max_timestamp
        if mx > self.max_ts:
            self.max_ts, self.max_off, self.max_pos = mx, h.base_offset, pos
        idx = self.idx
        if not idx.offsets or h.term != self.last_term or pos - idx.positions[-1] >= self.interval:
            idx.add(h.base_offset, pos, h.term, self.max_ts)
        self.size = pos + h.batch_length
        self.end = h.next_offset
        self.last_term = h.term

    def unindexed_bytes(self) -> int:
        """Bytes of data from the first index entry not yet in the index file on."""
        if not self._pending_idx:
            return 0
        return self.size - OFFSET_ENTRY.unpack_from(self._pending_idx)[1]

    def write_pending(self) -> None:
        """Write buffered index entries (index files are rebuilt on recovery, never fsynced
        while active). The files are opened for the write only: entries come a few KiB at a
        time, and a node hosting thousands of replicas cannot keep two descriptors each."""
        if self._pending_idx:
            write_whole(self.index_path, self._pending_idx, append=True)
            self._pending_idx.clear()
        if self._pending_time:
            write_whole(self.time_path, self._pending_time, append=True)
            self._pending_time.clear()

    def seal(self) -> None:
        """Make the segment immutable and its data durable.

        The index files are written but not fsynced: after a power cut a sealed index that
        lost its tail fails the open-time checks and is rebuilt from the (durable) data file.
        """
        if self.max_ts > self.tidx.last_timestamp:
            self._pending_time += self.tidx.add(self.max_ts, self.max_off, self.max_pos)
        self.write_pending()
        handle = self.data
        os.fdatasync(handle.fd)
        self.tidx = TimeIndex(self.base)  # only the active segment needs it in memory
        self.sealed = True

    # ------------------------------------------------------------------------------ reading

    def walk(self, pos: int, limit: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers of the batches starting in [pos, limit), read in chunks (no crc check)."""
        handle = self.data  # (held: keeps fd open while the generator is suspended)
        fd = handle.fd
        chunk = 2 * self.interval + HEADER_SIZE  # about the distance between index entries
        buf = b""
        buf_pos = pos
        while pos < limit:
            rel = pos - buf_pos
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(fd, max(HEADER_SIZE, min(chunk, limit - pos)), pos)
                buf_pos, rel = pos, 0
            try:
                h = read_header(buf, rel)
            except CorruptBatchError as exc:
                raise CorruptLogError(f"{self.log_path}: position {pos}: {exc}") from exc
            yield pos, h
            pos += h.batch_length

    def walk_lean(self, pos: int, limit: int) -> Iterator[tuple[int, int, int, int]]:
        """(position, base offset, last offset, length) of the batches starting in
        [pos, limit): the hot-path walker behind locate and extent."""
        handle = self.data
        fd = handle.fd
        chunk = 2 * self.interval + HEADER_SIZE
        unpack = LEAN_HEADER.unpack_from
        buf = b""
        buf_pos = pos
        while pos < limit:
            rel = pos - buf_pos
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(fd, max(HEADER_SIZE, min(chunk, limit - pos)), pos)
                buf_pos, rel = pos, 0
                if len(buf) < HEADER_SIZE:
                    raise CorruptLogError(f"{self.log_path}: file ends inside a batch header")
            base, length, magic, lod = unpack(buf, rel)
            if length < HEADER_SIZE or magic != MAGIC:
                raise CorruptLogError(
                    f"{self.log_path}: unreadable batch header at position {pos} "
                    f"(length {length}, magic {magic})"
                )
            yield pos, base, base + lod, length
            pos += length

    def locate(self, offset: int) -> tuple[int, int, int, int]:
        """(position, base, last, length) of the batch containing ``offset`` (< end)."""
        idx = self.idx
        i = bisect_right(idx.offsets, offset) - 1
        if i < 0:
            raise CorruptLogError(f"{self.log_path}: offset {offset} is before the segment")
        pos = idx.positions[i]
        if idx.offsets[i] == offset:  # sequential reads land here
            handle = self.data
            head = os.pread(handle.fd, LEAN_HEADER.size, pos)
            if len(head) == LEAN_HEADER.size:
                base, length, magic, lod = LEAN_HEADER.unpack_from(head)
                if base == offset and magic == MAGIC and length >= HEADER_SIZE:
                    return pos, base, base + lod, length
        for found in self.walk_lean(pos, self.size):
            if found[1] > offset:
                break
            if offset <= found[2]:
                return found
        raise CorruptLogError(f"{self.log_path}: no batch holds offset {offset}")

    def extent(
        self, first: tuple[int, int, int, int], max_bytes: int, last_limit: int, base_limit: int
    ) -> tuple[int, int]:
        """Byte length and next offset of the run of whole batches starting with ``first``
        (from locate): that batch always, then more while the total stays <= max_bytes, each
        batch's last offset < last_limit and base offset < base_limit."""
        pos, _, last, length = first
        nxt = last + 1
        cur = pos + length
        bound = min(last_limit, base_limit)
        if nxt >= self.end or length >= max_bytes or nxt >= bound:
            return length, nxt
        if self.size - pos <= max_bytes and self.end <= bound:
            return self.size - pos, self.end
        idx = self.idx
        k = min(bisect_right(idx.positions, pos + max_bytes), bisect_right(idx.offsets, bound)) - 1
        if k >= 0 and idx.positions[k] > cur:
            cur, nxt = idx.positions[k], idx.offsets[k]
        limit = pos + max_bytes
        for p, b_base, b_last, b_len in self.walk_lean(cur, self.size):
            if p + b_len > limit or b_last >= last_limit or b_base >= base_limit:
                break
            cur, nxt = p + b_len, b_last + 1
        return cur - pos, nxt

    def term_mismatch(self, pos: int, term: int) -> str | None:
        """Why the batch at ``pos`` stamped ``term`` contradicts the offset index, if it does.

        The index holds an entry at every term change, so it names each batch's term. The
        stamp lies outside the batch's crc32c (the leader writes it after the producer sealed
        the batch): a flipped bit there is caught only this way, and a replica must not serve
        or replicate a wrong term. Only for a complete index (not while one is rebuilt)."""
        idx = self.idx
        k = bisect_right(idx.positions, pos) - 1
        if k >= 0 and idx.terms[k] != term:
            return f"batch at position {pos} is stamped term {term}, its index says {idx.terms[k]}"
        return None

    def check_read(self, pos: int, offset: int, length: int) -> None:
        """Check the batches among ``length`` bytes from batch ``pos`` (holding ``offset``)
        that this process never checked (crc, contiguous offsets) before they are served;
        raises CorruptLogError. A sequential reader checks each byte once per process."""
        lo, hi = self.unchecked_from, self.unchecked_to
        end = pos + length
        if end <= lo or pos >= hi:
            return
        start, expected = (lo, self.unchecked_offset) if pos <= lo else (pos, offset)
        stop = min(end, hi)
        reached = [expected]

        def on_batch(_pos: int, h: BatchHeader) -> None:
            reached[0] = h.next_offset

        bad, reason = self.scan(start, expected, stop, on_batch, check_terms=True)
        if reason is not None:
            raise CorruptLogError(f"{self.log_path}: corrupt batch at position {bad}: {reason}")
        if start == lo:
            self.unchecked_from, self.unchecked_offset = stop, reached[0]

    def scan(
        self,
        pos: int,
        expected: int,
        limit: int,
        on_batch: Callable[[int, BatchHeader], None],
        *,
        check_terms: bool = False,
        check_crc: bool = True,
    ) -> tuple[int, str | None]:
        """Verify whole batches (crc, contiguous offsets, with ``check_terms`` also their
        terms against the index, which must then be complete) from pos to limit; without
        ``check_crc`` only their headers are read (as ``walk`` reads them).

        Returns (position reached, None) or (position of the first bad batch, reason).
        """
        handle = self.data
        fd = handle.fd
        chunk = CHUNK if check_crc else 2 * self.interval + HEADER_SIZE
        buf = b""
        buf_pos = pos
        while pos < limit:
            rel = pos - buf_pos
            if rel + HEADER_SIZE > len(buf):
                if limit - pos < HEADER_SIZE:
                    return pos, f"torn batch header ({limit - pos} bytes at the end)"
                buf = pread_exact(fd, min(chunk, limit - pos), pos, self.log_path)
                buf_pos, rel = pos, 0
            try:
                h = read_header(buf, rel)
            except CorruptBatchError as exc:
                return pos, str(exc)
            n = h.batch_length
            if pos + n > limit:
                return pos, f"torn batch: {n} bytes announced, {limit - pos} left in the file"
            if check_crc:
                if rel + n > len(buf):
                    buf = pread_exact(fd, max(n, min(CHUNK, limit - pos)), pos, self.log_path)
                    buf_pos, rel = pos, 0
                try:
                    check_batch(memoryview(buf)[rel : rel + n])  # (the header is read above)
                except CorruptBatchError as exc:
                    return pos, str(exc)
            if h.base_offset != expected:
                return pos, f"batch base offset {h.base_offset}, expected {expected}"
            if check_terms and (why := self.term_mismatch(pos, h.term)):
                return pos, why
            on_batch(pos, h)
            expected = h.next_offset
            pos += n
        return pos, None

    # --------------------------------------------------------------------------- truncation

    def truncate_to(self, pos: int) -> None:
        """Cut the segment at batch boundary ``pos`` and make the cut durable; unseals it."""
        self.write_pending()
        handle = self.data
        os.ftruncate(handle.fd, pos)
        if self.unchecked_to > pos:  # what is appended after the cut is checked on arrival
            self.unchecked_to = pos
            if self.unchecked_from >= pos:
                self.unchecked_from = self.unchecked_to = 0
        if pos == 0:
            self.roll_clock_ms = None
        idx = self.idx
        idx.keep(bisect_left(idx.positions, pos))
        self._restore_tail_state(pos)
        self._derive_time_index(seal=False)
        write_whole(self.index_path, idx.to_bytes(), sync=True)
        write_whole(self.time_path, self.tidx.to_bytes(), sync=True)
        os.fdatasync(handle.fd)
        self.sealed = False

    def _restore_tail_state(self, limit: int) -> None:
        """Recompute size/end/term/max timestamp from the last index entry up to ``limit``."""
        idx = self.idx
        self.max_off, self.max_pos = self.base, 0
        if not len(idx):
            self.size, self.end, self.last_term, self.max_ts = 0, self.base, 0, NO_TIMESTAMP
            return
        self.max_ts = idx.max_ts[-1]
        self.max_off, self.max_pos = idx.offsets[-1], idx.positions[-1]
        self.last_term = idx.terms[-1]
        for p, h in self.walk(idx.positions[-1], limit):
            if h.max_timestamp > self.max_ts:
                self.max_ts, self.max_off, self.max_pos = h.max_timestamp, h.base_offset, p
            self.size, self.end = p + h.batch_length, h.next_offset

    def delete(self) -> None:
        """Unlink the files; descriptors close when their last user (slice, flush) lets go."""
        self._pending_idx.clear()
        self._pending_time.clear()
        self._data = None
        self.closed = True
        if self._budget is not None:
            self._budget.forget(self)
        for path in (self.log_path, self.index_path, self.time_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        self.write_pending()
        if self._data is not None:
            self._data.close()
        self._data = None
        self.closed = True
        if self._budget is not None:
            self._budget.forget(self)


def _read_listed(path: str, listed: Container[str] | None) -> bytes:
    """``read_or_empty``, or b"" without a system call if ``listed`` lacks the file."""
    return read_or_empty(path) if listed is None or path in listed else b""
