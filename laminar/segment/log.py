"""PartitionLog: the segmented, crc-checked log of one partition (also its Raft log).

Threading: every method except ``flush`` runs on the owner's (event loop) thread. ``flush`` may
run in a worker thread at the same time; it shares only ``_end``, ``_durable``, ``_generation``
and the dirty set with the loop thread, always under ``_lock``, and never holds that lock across
an fdatasync. A second lock serialises flushes, so a flush that returns covers every append made
before it started.

Descriptors: a log opened with a node's ``DescriptorCache`` (``descriptors.py``) lets the node
close its data files while idle and reopens them on use, so a node's open files do not grow with
the replicas it hosts. The dirty set holds the very handles appends wrote through: a handle the
cache takes from a segment stays open until the flush that covers its writes fdatasyncs it.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby, pairwise
from operator import itemgetter
from pathlib import Path
from types import TracebackType

import crc32c
import structlog

from laminar.errors import (
    CorruptBatchError,
    CorruptLogError,
    InvalidRequestError,
    OffsetOutOfRangeError,
)
from laminar.segment.batch import (
    ATTR_CONTROL,
    CRC_START,
    HEADER_SIZE,
    STAMP,
    BatchHeader,
    check_batch,
    read_header,
)
from laminar.segment.descriptors import DescriptorCache
from laminar.segment.fileio import FileHandle, fsync_dir, pread_exact
from laminar.segment.meta import META_NAME, read_start, write_start
from laminar.segment.segment import Segment
from laminar.segment.slice import LogSlice

log = structlog.get_logger(__name__)

MiB = 1 << 20
_NAME = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
_NO_LIMIT = 1 << 63
LOCK_NAME = ".lock"
MAX_OPEN_SEALED = 8  # sealed segments per log that keep their data file open
_open_dirs: set[str] = set()  # directories of the PartitionLogs open in this process
_open_dirs_lock = threading.Lock()


@dataclass(slots=True)
class PendingFlush:
    """What one flush of a log covers (``PartitionLog.begin_flush``)."""

    end: int
    generation: int
    handles: list[FileHandle]
    """The very handles appends wrote through (an evicted one stays open until synced)."""
    dir_dirty: bool


@dataclass(slots=True)
class Tail:
    """The headers of a log's last batches and the bytes of its control batches among them
    (``PartitionLog.read_tail``). Opening a replica needs nothing else from its log: the
    producer table learns from headers, the seal and the Raft core's configuration are control
    batches. Reading every byte of the tail instead (as one pread, checked) made a restart at
    10,000 partitions and 10 GiB read all 10 GiB. Valid only while the log is unchanged (it
    serves the opening of a replica, ``LogStorage``)."""

    start: int
    """Offset of the first batch held (the log's end when none is)."""
    end: int
    """The log's end offset when read."""
    bases: list[int] = field(default_factory=list)
    headers: list[BatchHeader] = field(default_factory=list)
    controls: dict[int, memoryview] = field(default_factory=dict)
    """Base offset -> bytes of each control batch, checked as ``batches`` checks them."""

    def find(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (``start <= offset < end``)."""
        return bisect_right(self.bases, offset) - 1


@dataclass
class LogConfig:
    segment_bytes: int = 64 * MiB
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None
    max_batch_bytes: int = 4 * MiB
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        if not HEADER_SIZE <= self.segment_bytes <= (1 << 31):
            raise ValueError(f"segment_bytes {self.segment_bytes} outside [68, 2 GiB]")
        if not HEADER_SIZE <= self.max_batch_bytes <= (1 << 30):
            raise ValueError(f"max_batch_bytes {self.max_batch_bytes} outside [68, 1 GiB]")
        if self.segment_ms <= 0 or self.index_interval_bytes <= 0:
            raise ValueError("segment_ms and index_interval_bytes must be positive")
        if self.retention_ms is not None and self.retention_ms < 0:
            raise ValueError("retention_ms must be >= 0 or None")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0 or None")


class PartitionLog:
    """A partition's log: segments ``<base>.log/.index/.timeindex`` under one directory."""

    def __init__(
        self, directory: Path, config: LogConfig, descriptors: DescriptorCache | None = None
    ) -> None:
        self._dir = directory
        self._dir_str = str(directory)  # (segments build their paths from it)
        self.config = config
        self._descriptors = descriptors
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._start = 0
        self._prev_term = 0
        self._term_offsets: list[int] = []
        self._term_values: list[int] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._end = 0
        self._durable = 0
        self._generation = 0
        self._dirty: dict[int, FileHandle] = {}
        self._dir_dirty = False
        self._closed = False
        self._lock_fd = -1
        self._claimed: str | None = None
        self._failed: CorruptLogError | None = None
        self._open_sealed: OrderedDict[int, Segment] = OrderedDict()

    # ------------------------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        path: str | Path,
        config: LogConfig | None = None,
        *,
        descriptors: DescriptorCache | None = None,
        lock: bool = True,
        synced: bool = False,
        same_boot: bool = False,
    ) -> PartitionLog:
        """Open (or create) the log in ``path``.

        ``descriptors``: the node-wide budget of open data files this log shares (without one
        the log keeps its active segment's data file open for its whole life). ``lock``: take
        an flock on ``<path>/.lock`` so no other process opens the log meanwhile; a node that
        holds the lock of its whole data directory passes False and saves a descriptor per
        replica. Within this process one log per directory is enforced either way.
        ``synced``: the caller made the whole filesystem durable (``filesystem_syncer``) since
        the last process that wrote this log ended, so recovery need not fdatasync the tail
        that process may have left in the page cache. ``same_boot``: the machine has not
        rebooted since that process wrote (``laminar.node.boot``): the active segment's tail is
        walked by its headers instead of crc-checked (``Segment.recover_active``).
        """
        directory = path if isinstance(path, Path) else Path(path)
        if lock:  # (the lock file lives inside; without one, _recover creates a new directory)
            directory.mkdir(parents=True, exist_ok=True)
        plog = cls(directory, config or LogConfig(), descriptors)
        plog._lock_directory(lock)
        try:
            plog._recover(synced, same_boot)
        except BaseException:
            plog._close_segments()
            plog._unlock_directory()
            raise
        return plog

    def _lock_directory(self, flock: bool) -> None:
        """One PartitionLog per directory: in this process always, across processes with
        ``flock`` (released on close or death)."""
        key = os.path.abspath(self._dir)
        with _open_dirs_lock:
            if key in _open_dirs:
                raise InvalidRequestError(f"{self._dir} is already open by another log")
            _open_dirs.add(key)
        self._claimed = key
        if not flock:
            return
        try:
            fd = os.open(self._dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise InvalidRequestError(
                    f"{self._dir} is already open by another process"
                ) from None
        except BaseException:
            self._unlock_directory()
            raise
        self._lock_fd = fd

    def _unlock_directory(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)
        key, self._claimed = self._claimed, None
        if key is not None:
            with _open_dirs_lock:
                _open_dirs.discard(key)

    def _hook(self, seg: Segment) -> None:
        """Give a segment of this log the log's sealed-file LRU and the node's budget."""
        seg.attach(self._sealed_opened, self._descriptors, self._is_dirty)

    def _is_dirty(self, handle: FileHandle) -> bool:
        """Whether ``handle`` awaits the next flush's fdatasync (any thread; a dict lookup)."""
        return id(handle) in self._dirty

    def _close_segments(self) -> None:
        for seg in self._segments:
            seg.close()

    def _recover(self, synced: bool = False, same_boot: bool = False) -> None:
        directory = self._dir_str
        interval = self.config.index_interval_bytes
        bases: set[int] = set()
        other: dict[int, list[str]] = {}
        has_marker = False
        try:  # (names only: os.scandir's entries cost twice as much, per replica restarted)
            names = os.listdir(directory)
        except FileNotFoundError:  # a new log (a node's: it skipped the mkdir for existing ones)
            os.makedirs(directory, exist_ok=True)
            names = os.listdir(directory)
        for name in names:
            if name.endswith(".tmp"):
                os.unlink(f"{directory}/{name}")
                continue
            m = _NAME.match(name)
            if not m:
                has_marker = has_marker or name == META_NAME
                continue
            base = int(m.group(1))
            if m.group(2) == "log":
                bases.add(base)
            else:
                other.setdefault(base, []).append(f"{directory}/{name}")
        for base, paths in other.items():  # index files whose data file is gone
            if base not in bases:
                for p in paths:
                    os.unlink(p)
        # (the listing tells whether there is a marker: most logs have none, and a failed
        # open per replica was a measurable part of a restart)
        marker = read_start(self._dir) if has_marker else None
        if marker is not None:
            self._start, self._prev_term = marker
            stale = sorted(b for b in bases if b < self._start)
            for base in stale:  # finish an expiry or reset interrupted by a crash
                Segment(directory, base, interval).delete()
                bases.discard(base)
            if stale:
                fsync_dir(self._dir)
        ordered = sorted(bases)
        if not ordered:
            seg = Segment.create(directory, self._start, interval)
            # Durable with the first flush that covers an append: an empty log promises
            # nothing, and a node creating thousands of partitions at once must not wait for
            # one directory fsync each on its event loop.
            self._dir_dirty = True
            self._segments = [seg]
        else:
            if ordered[0] != self._start:
                raise CorruptLogError(
                    f"{self._dir}: first segment starts at {ordered[0]}, log starts at "
                    f"{self._start} ({META_NAME} {'present' if marker else 'absent'})"
                )
            segments = [
                Segment.open_sealed(directory, base, nxt, interval)
                for base, nxt in pairwise(ordered)
            ]
            last = ordered[-1]
            active = Segment.recover_active(
                directory, last, interval, other.get(last, ()), same_boot=same_boot
            )
            segments.append(active)
            if not synced:  # what a crashed process left unsynced must be durable now
                handle = active.data
                os.fdatasync(handle.fd)
            self._segments = segments
        self._bases = [s.base for s in self._segments]
        for seg in self._segments:
            self._hook(seg)
            idx = seg.idx
            for term, group in groupby(zip(idx.offsets, idx.terms, strict=True), itemgetter(1)):
                if not self._term_values or term != self._term_values[-1]:
                    self._term_offsets.append(next(group)[0])
                    self._term_values.append(term)
        self._end = self._segments[-1].end
        self._durable = self._end

    # ---------------------------------------------------------------------------- properties

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def durable_offset(self) -> int:
        return self._durable

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def sync_failed(self) -> bool:
        """An fdatasync failed: the kernel may have dropped written pages (see flush)."""
        return self._failed is not None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # ------------------------------------------------------------------------------- appends

    def append(
        self, batch: bytes | bytearray | memoryview, *, term: int, now_ms: int | None = None
    ) -> tuple[int, int]:
        """Leader path: verify, stamp base offset and term, append; returns (base, last)."""
        if self._closed or self._failed is not None:
            self._check_open()
        mv = memoryview(batch)
        if mv.format != "B":
            mv = mv.cast("B")
        f = check_batch(mv, self.config.max_batch_bytes)
        base = self._end
        return self._write(STAMP.pack(base, term), mv[16:], f, base, term, now_ms)

    def append_stamped(
        self, batch: bytes | bytearray | memoryview, *, now_ms: int | None = None
    ) -> tuple[int, int]:
        """Follower path: the batch already carries base offset (== end_offset) and term."""
        self._check_open()
        mv = _byte_view(batch)
        f = check_batch(mv, self.config.max_batch_bytes)
        if f[0] != self._end:
            raise InvalidRequestError(
                f"batch base offset {f[0]} does not match log end offset {self._end}"
            )
        return self._write(bytes(mv[:16]), mv[16:], f, f[0], f[1], now_ms)

    def _write(
        self,
        prefix: bytes,
        body: memoryview,
        f: tuple[int, ...],
        base: int,
        term: int,
        now_ms: int | None,
    ) -> tuple[int, int]:
        """Append one verified batch; ``f`` holds its raw header fields (see check_batch)."""
        seg = self._segments[-1]
        length = f[2]
        aged = self._aged(seg, now_ms)
        if seg.size and (seg.size + length > self.config.segment_bytes or aged):
            seg = self._roll()
            self._aged(seg, now_ms)
        last = base + f[7]
        handle = seg.append(prefix, body, length, f[9], base, last, term)
        values = self._term_values
        if not values or term != values[-1]:
            self._term_offsets.append(base)
            values.append(term)
        with self._lock:
            self._end = last + 1
            self._dirty[id(handle)] = handle
        return base, last

    def _aged(self, seg: Segment, now_ms: int | None) -> bool:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if seg.roll_clock_ms is None:
            seg.roll_clock_ms = now if seg.size == 0 else min(seg.first_timestamp or now, now)
            return False
        return now - seg.roll_clock_ms > self.config.segment_ms

    def _roll(self) -> Segment:
        old = self._segments[-1]
        old.seal()  # fdatasyncs through the segment's current handle
        self._sync_stale(old)
        if old.open_handle is not None:
            self._sealed_opened(old)
        seg = Segment.create(self._dir_str, self._end, self.config.index_interval_bytes)
        self._hook(seg)
        self._segments.append(seg)
        self._bases.append(seg.base)
        with self._lock:
            self._forget_dirty({old.log_path})
            self._dir_dirty = True
        return seg

    def _sync_stale(self, seg: Segment) -> None:
        """fdatasync the unsynced handles the budget took from ``seg``, each through the very
        descriptor its appends went through (``seg`` just synced its current one)."""
        current = seg.open_handle
        with self._lock:
            stale = [h for h in self._dirty.values() if h.path == seg.log_path and h is not current]
        for handle in stale:
            if handle.fd >= 0:
                os.fdatasync(handle.fd)

    def _forget_dirty(self, paths: set[str]) -> None:
        """Drop the dirty handles of these files (made durable or cut); under ``_lock``."""
        for key in [k for k, h in self._dirty.items() if h.path in paths]:
            del self._dirty[key]

    def write_index(self, unless_within: int = 0) -> None:
        """Write the active segment's buffered index entries to its index files (no fsync):
        a restart in the same boot then walks only the batches after them. Not while they
        cover less than ``unless_within`` bytes of data: walking those costs less than the
        write (a new replica's first write creates its index files, 0.6-0.8 ms of CPU each)."""
        self._check_open()
        seg = self._segments[-1]
        if seg.unindexed_bytes() >= max(1, unless_within):
            seg.write_pending()

    def roll(self) -> None:
        """Seal the active segment now if it holds anything (tests, admin)."""
        self._check_open()
        if self._segments[-1].size:
            self._roll()

    # ---------------------------------------------------------------------------- durability

    def flush(self) -> int:
        """fdatasync everything appended before this call; returns the end offset covered.

        Safe to call from a worker thread while the loop thread appends and reads.
        """
        pending = self.begin_flush()
        error: OSError | None = None
        try:
            for handle in pending.handles:
                if handle.fd >= 0:
                    os.fdatasync(handle.fd)
            if pending.dir_dirty:
                fsync_dir(self._dir)
        except OSError as exc:
            error = exc
        return self.finish_flush(pending, error)

    def begin_flush(self) -> PendingFlush:
        """The first half of a flush, for a caller that makes many logs durable at once (one
        syncfs(2) of their filesystem instead of an fdatasync per log): takes this log's
        flush lock and what the flush must cover. ``finish_flush`` must follow, after the
        sync, and releases the lock."""
        self._flush_lock.acquire()
        try:
            with self._lock:
                pending = PendingFlush(
                    self._end, self._generation, list(self._dirty.values()), self._dir_dirty
                )
                self._dirty.clear()
                self._dir_dirty = False
            if self._failed is not None:
                raise self._failed
        except BaseException:
            self._flush_lock.release()
            raise
        return pending

    def finish_flush(self, pending: PendingFlush, error: OSError | None = None) -> int:
        """The second half: what ``pending`` covers is durable unless the sync failed
        (``error``); returns the end offset covered."""
        try:
            if error is not None:
                # After a failed fdatasync the kernel may have dropped the dirty pages, and a
                # retry can "succeed" without them: never trust this log again until reopened
                # (recovery re-verifies the tail).
                self._failed = CorruptLogError(
                    f"{self._dir}: fdatasync failed ({error}); reopen the log to recover"
                )
                log.error("fdatasync failed; log refuses writes", directory=str(self._dir))
                raise self._failed from error
            with self._lock:
                if pending.generation != self._generation:
                    return self._durable
                if pending.end > self._durable:
                    self._durable = pending.end
                return pending.end
        finally:
            self._flush_lock.release()

    # ------------------------------------------------------------------------------- lookups

    def _segment_for(self, offset: int) -> Segment:
        seg = self._segments[bisect_right(self._bases, offset) - 1]
        if seg.sealed and seg.base in self._open_sealed:
            self._open_sealed.move_to_end(seg.base)
        return seg

    def _sealed_opened(self, seg: Segment) -> None:
        """Keep at most MAX_OPEN_SEALED sealed data files open, least recently used go."""
        lru = self._open_sealed
        lru[seg.base] = seg
        lru.move_to_end(seg.base)
        while len(lru) > MAX_OPEN_SEALED:
            _, old = lru.popitem(last=False)
            old.release()

    def _check_range(self, offset: int, *, inclusive_end: bool) -> None:
        end = self._end
        if offset < self._start or offset > end or (offset == end and not inclusive_end):
            raise OffsetOutOfRangeError(offset, self._start, end)

    def term_at(self, offset: int) -> int:
        """Term of the batch holding ``offset``; for start_offset - 1 the term before start."""
        if offset == self._start - 1:
            return self._prev_term
        self._check_range(offset, inclusive_end=False)
        return self._term_values[bisect_right(self._term_offsets, offset) - 1]

    def batch_bounds(self, offset: int) -> tuple[int, int]:
        self._check_range(offset, inclusive_end=False)
        _, base, last, _ = self._segment_for(offset).locate(offset)
        return base, last

    def read(self, offset: int, max_bytes: int, *, upto: int | None = None) -> LogSlice:
        """Whole batches from the one holding ``offset``, within one segment (Kafka fetch)."""
        self._check_range(offset, inclusive_end=True)
        limit = self._end if upto is None else min(upto, self._end)
        if offset == self._end or offset >= limit:
            return self._empty_slice(offset)
        seg = self._segment_for(offset)
        first = seg.locate(offset)
        if first[2] >= limit:
            return self._empty_slice(offset)
        length, nxt = seg.extent(first, max_bytes, limit, _NO_LIMIT)
        seg.check_read(first[0], first[1], length)
        return LogSlice(seg.data, seg.log_path, first[0], length, first[1], nxt)

    def _empty_slice(self, offset: int) -> LogSlice:
        """Nothing to serve: no descriptor either (long polls of idle partitions land here,
        and must not reopen their files)."""
        seg = self._segments[-1]
        return LogSlice(None, seg.log_path, seg.size, 0, offset, offset)

    def batches(self, start: int, end: int, max_bytes: int) -> list[memoryview]:
        """Whole batches covering [start, end), at least one, crc-verified (Raft replication)."""
        self._check_range(start, inclusive_end=True)
        end = min(end, self._end)
        out: list[memoryview] = []
        remaining = max_bytes
        cur = start
        while cur < end:
            seg = self._segment_for(cur)
            first = seg.locate(cur)
            pos = first[0]
            if out and first[3] > remaining:
                break
            length, nxt = seg.extent(first, remaining, _NO_LIMIT, end)
            handle = seg.data
            data = memoryview(pread_exact(handle.fd, length, pos, seg.log_path))
            out += _checked_batches(seg, data, pos, first[1])
            remaining -= length
            cur = nxt
            if remaining <= 0:
                break
        return out

    def read_tail(self, offset: int) -> Tail:
        """The tail from the batch holding ``offset`` to the end: every batch's header, walked
        without reading records, and every control batch's bytes (see ``Tail``)."""
        tail = Tail(self._end, self._end)
        bases, headers, controls = tail.bases, tail.headers, tail.controls
        for seg, pos, h in self._walk(offset, self._end):
            bases.append(h.base_offset)
            headers.append(h)
            if h.attributes & ATTR_CONTROL:
                data = memoryview(pread_exact(seg.data.fd, h.batch_length, pos, seg.log_path))
                controls[h.base_offset] = _checked_batches(seg, data, pos, h.base_offset)[0]
        if bases:
            tail.start = bases[0]
        return tail

    def headers(self, start: int, end: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one holding ``start`` up to ``end``, walked without
        reading their records (no crc check: read them with ``batches``, which checks)."""
        return (h for _seg, _pos, h in self._walk(start, end))

    def _walk(self, start: int, end: int) -> Iterator[tuple[Segment, int, BatchHeader]]:
        self._check_open()
        first = max(start, self._start)
        if first >= min(end, self._end):
            return
        for seg in self._segments[bisect_right(self._bases, first) - 1 :]:
            if seg.base >= end:
                break
            pos = seg.locate(first)[0] if seg.base <= first else 0
            for at, h in seg.walk(pos, seg.size):
                if h.base_offset >= end:
                    break
                yield seg, at, h

    def segment_bases(self) -> list[int]:
        """First offset of every segment, oldest first."""
        return list(self._bases)

    def control_offsets(self, start: int, end: int) -> list[int]:
        """Base offsets of the control batches starting in ``[start, end)``, from the batch
        headers alone (no crc check: read them with ``batches``, which checks)."""
        return [
            h.base_offset
            for h in self.headers(start, end)
            if h.attributes & ATTR_CONTROL and h.base_offset >= start
        ]

    def offset_for_timestamp(self, ts_ms: int) -> int | None:
        """First offset whose batch max_timestamp >= ts_ms, from the indexes' running max."""
        for seg in self._segments:
            if seg.max_ts < ts_ms:
                continue
            idx = seg.idx
            k = bisect_left(idx.max_ts, ts_ms)
            if k < len(idx):
                lo = idx.positions[k - 1] if k else 0
                hi = idx.positions[k] + 1
            else:
                lo, hi = idx.positions[-1], seg.size
            for _pos, h in seg.walk(lo, hi):
                if h.max_timestamp >= ts_ms:
                    return h.base_offset
            raise CorruptLogError(
                f"{seg.log_path}: index promises timestamp {ts_ms}, data has none"
            )
        return None

    # ----------------------------------------------------------------- truncation and resets

    def truncate(self, offset: int) -> None:
        """Remove every batch from ``offset`` on (a batch boundary); durable on return."""
        self._check_open()
        if offset < self._start or offset > self._end:
            raise InvalidRequestError(
                f"cannot truncate to {offset}: outside [{self._start}, {self._end}]"
            )
        if offset == self._end:
            return
        i = bisect_right(self._bases, offset) - 1
        pos, base, last, _ = self._segments[i].locate(offset)
        if base != offset:
            raise InvalidRequestError(f"cannot truncate to {offset}: inside batch [{base}, {last}]")
        self._cut(i, pos, offset)

    def cut_at_damage(self) -> int | None:
        """Check every batch of every segment (crc, offsets and terms; sealed ones too, which
        opening trusts) and cut the log before the first damaged one; durable on return.
        Returns the offset the log now ends at, or None if nothing was damaged."""
        self._check_open()
        for i, seg in enumerate(self._segments):
            reached = [seg.base]

            def on_batch(_pos: int, h: BatchHeader, reached: list[int] = reached) -> None:
                reached[0] = h.next_offset

            stop, reason = seg.scan(0, seg.base, seg.size, on_batch, check_terms=True)
            if reason is None:
                continue
            log.error(
                "cutting the log before a damaged batch",
                file=str(seg.log_path),
                position=stop,
                offset=reached[0],
                lost_until=self._end,
                reason=reason,
            )
            self._cut(i, stop, reached[0])
            return reached[0]
        return None

    def _cut(self, i: int, pos: int, offset: int) -> None:
        """Remove everything from batch boundary ``pos`` (offset ``offset``) of segment i."""
        seg = self._segments[i]
        removed = self._segments[i + 1 :]
        cut_paths = {s.log_path for s in self._segments[i:]}
        for s in reversed(removed):
            self._open_sealed.pop(s.base, None)
            s.delete()
        if removed:
            fsync_dir(self._dir)
        seg.truncate_to(pos)
        self._sync_stale(seg)
        del self._segments[i + 1 :], self._bases[i + 1 :]
        k = bisect_right(self._term_offsets, offset - 1)
        del self._term_offsets[k:], self._term_values[k:]
        with self._lock:
            self._end = offset
            self._durable = offset
            self._generation += 1
            self._forget_dirty(cut_paths)  # (truncate_to made what remains durable)
        log.info("truncated log", directory=str(self._dir), offset=offset)

    def reset(self, start_offset: int, prev_term: int) -> None:
        """Drop everything; the log restarts empty at ``start_offset``. Durable on return."""
        self._check_open()
        if start_offset < 0:
            raise InvalidRequestError(f"cannot reset to negative offset {start_offset}")
        marker_first = start_offset >= self._end
        if marker_first:  # a crash leaves only segments below the new start: deleted on open
            write_start(self._dir, start_offset, prev_term)
        for s in reversed(self._segments):
            s.delete()
        fsync_dir(self._dir)
        if not marker_first:
            write_start(self._dir, start_offset, prev_term)
        seg = Segment.create(self._dir_str, start_offset, self.config.index_interval_bytes)
        self._hook(seg)
        self._open_sealed.clear()
        fsync_dir(self._dir)
        self._segments = [seg]
        self._bases = [start_offset]
        self._start = start_offset
        self._prev_term = prev_term
        self._term_offsets.clear()
        self._term_values.clear()
        with self._lock:
            self._end = start_offset
            self._durable = start_offset
            self._generation += 1
            self._dirty.clear()
        log.info("reset log", directory=str(self._dir), start=start_offset, prev_term=prev_term)

    def expire(self, now_ms: int, upto: int | None = None) -> int:
        """Delete the oldest sealed segments past retention; returns how many were deleted."""
        self._check_open()
        cfg = self.config
        excess = self.size_bytes - cfg.retention_bytes if cfg.retention_bytes is not None else -1
        count = 0
        for seg in self._segments[:-1]:
            if upto is not None and seg.end > upto:
                break
            old = cfg.retention_ms is not None and seg.max_ts < now_ms - cfg.retention_ms
            big = cfg.retention_bytes is not None and excess >= seg.size
            if not (old or big):
                break
            excess -= seg.size
            count += 1
        return self._drop_oldest(count)

    def discard_before(self, offset: int) -> int:
        """Delete the oldest sealed segments holding only offsets below ``offset`` (the owner
        knows they are redundant: a consumer-group partition after a checkpoint); returns how
        many were deleted."""
        self._check_open()
        count = 0
        for seg in self._segments[:-1]:
            if seg.end > offset:
                break
            count += 1
        return self._drop_oldest(count)

    def _drop_oldest(self, count: int) -> int:
        """Delete the first ``count`` segments (never the active one), crash-safe: the new
        start is recorded before any file goes."""
        if not count:
            return 0
        new_start = self._segments[count].base
        prev_term = self.term_at(new_start - 1)
        first_term = self.term_at(new_start) if new_start < self._end else None
        write_start(self._dir, new_start, prev_term)
        for seg in self._segments[:count]:
            self._open_sealed.pop(seg.base, None)
            seg.delete()
        del self._segments[:count], self._bases[:count]
        k = bisect_right(self._term_offsets, new_start)
        del self._term_offsets[:k], self._term_values[:k]
        if first_term is not None:
            self._term_offsets.insert(0, new_start)
            self._term_values.insert(0, first_term)
        self._start = new_start
        self._prev_term = prev_term
        log.info("deleted old segments", directory=str(self._dir), count=count, start=new_start)
        return count

    # ---------------------------------------------------------------------------- validation

    def verify(self) -> int:
        """Read and crc-check every batch and index entry; returns the number of batches.

        Raises CorruptLogError naming the file and position of the first problem.
        """
        total = 0
        expected = self._start
        for seg in self._segments:
            if seg.base != expected:
                raise CorruptLogError(f"{seg.log_path}: starts at {seg.base}, expected {expected}")
            total += _verify_segment(seg)
            expected = seg.end
        return total

    # ------------------------------------------------------------------------------- closing

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the log is closed")
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        """Flush and release every file."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        with self._flush_lock:
            self._closed = True
            self._close_segments()
            self._open_sealed.clear()
            self._dirty.clear()
            self._unlock_directory()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _byte_view(batch: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(batch)
    return mv if mv.format == "B" else mv.cast("B")


def _verify_segment(seg: Segment) -> int:
    """Full crc scan of one segment, also checking that index entries sit on batch starts."""
    entries = dict(
        zip(seg.idx.positions, zip(seg.idx.offsets, seg.idx.terms, strict=True), strict=True)
    )
    seen = 0
    count = 0

    def on_batch(pos: int, h: BatchHeader) -> None:
        nonlocal seen, count
        count += 1
        entry = entries.get(pos)
        if entry is not None:
            if entry != (h.base_offset, h.term):
                raise CorruptLogError(
                    f"{seg.index_path}: entry for position {pos} says {entry}, batch is "
                    f"({h.base_offset}, {h.term})"
                )
            seen += 1

    stop, reason = seg.scan(0, seg.base, seg.size, on_batch, check_terms=True)
    if reason is not None:
        raise CorruptLogError(f"{seg.log_path}: corrupt batch at position {stop}: {reason}")
    if seen != len(entries):
        raise CorruptLogError(f"{seg.index_path}: entries point between batches")
    return count


def _checked_batches(
    seg: Segment,
    data: memoryview,
    pos: int,
    offset: int,
    headers: list[BatchHeader] | None = None,
) -> list[memoryview]:
    """Split whole batches read at ``pos`` (the first holding ``offset``), checking what a
    replica must never pass on damaged: length, crc32c, and the offsets and term stamped
    outside the crc. Their headers go to ``headers`` if given."""
    out: list[memoryview] = []
    at = 0
    while at < len(data):
        try:
            h = read_header(data, at)
        except CorruptBatchError as exc:
            raise CorruptLogError(
                f"{seg.log_path}: bad batch at position {pos + at}: {exc}"
            ) from None
        size = h.batch_length
        if at + size > len(data):
            why = f"bad batch length {size}"
        elif h.base_offset != offset:
            why = f"batch base offset {h.base_offset}, expected {offset}"
        elif crc32c.crc32c(data[at + CRC_START : at + size]) != h.crc:
            why = "crc32c mismatch"
        else:
            why = seg.term_mismatch(pos + at, h.term)
        if why:
            raise CorruptLogError(f"{seg.log_path}: corrupt batch at position {pos + at}: {why}")
        out.append(data[at : at + size])
        if headers is not None:
            headers.append(h)
        offset = h.next_offset
        at += size
    return out
