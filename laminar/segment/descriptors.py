"""A node-wide budget of open segment files, least recently used closed first.

A node hosting thousands of partition replicas cannot keep every log's files open: each would
hold at least its active segment's data file for its whole life, and the open-files limit
(here a hard 20,000) would cap the replicas a node can host. As RocksDB's ``max_open_files``
and table cache do, every ``PartitionLog`` of a node registers its segments' data files in one
``DescriptorCache``: past its capacity the least recently used owner drops its descriptor and
reopens the file on its next use.

Dropping never closes a descriptor someone still uses: an owner only lets go of its own
reference to the ref-counted ``FileHandle`` (``fileio.py``), so a handle held by a flush thread
(the log's dirty set, until the fdatasync covering it), a ``LogSlice`` or a local variable stays
open until that user drops it too. Owners whose handle is still waiting for its fdatasync are
passed over while a clean one is near (closing them would free nothing before the flush), so
the descriptors the process really holds stay close to the capacity.

Thread-safe: logs are opened in worker threads too (a repair reopens a replica off the loop).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

from laminar.segment.fileio import FileHandle

MIN_CAPACITY = 16
SKIP_DIRTY = 32
"""Owners still waiting for an fdatasync passed over per eviction before one goes anyway."""


class Closable(Protocol):
    """Something holding one descriptor it can give up and reopen on demand (a segment)."""

    def release_descriptor(self) -> None:
        """Drop the owner's reference to its descriptor (others keep theirs)."""

    def descriptor_busy(self) -> bool:
        """Whether dropping would free nothing yet (the handle awaits an fdatasync)."""


def default_capacity(share: float = 0.5) -> int:
    """``share`` of this process's soft open-files limit: the rest is for sockets, the state
    journal, flushes and reads in flight."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 4096
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(MIN_CAPACITY, int(soft * share))


class DescriptorCache:
    """LRU of descriptor owners, evicted until at most ``capacity`` descriptors are open.

    What counts is every data handle an owner opened that is still open (``open_files``),
    including handles the cache already took from their owner that a flush, a slice or a
    caller still holds: while the group commit holds many, fewer stay cached.
    """

    def __init__(self, capacity: int | None = None) -> None:
        capacity = default_capacity() if capacity is None else capacity
        if capacity < 1:
            raise ValueError(f"descriptor capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self.evictions = 0
        self._live = 0
        self._lru: OrderedDict[int, Closable] = OrderedDict()
        # Reentrant: a handle's last reference may go (and _closed run) anywhere, even in
        # this thread while it holds the lock (a garbage collection).
        self._lock = threading.RLock()
        self._last: Closable | None = None  # the most recently touched (no lock to check it)

    def __len__(self) -> int:
        """Owners holding their descriptor now."""
        return len(self._lru)

    @property
    def open_files(self) -> int:
        """Descriptors opened through the cache and not yet closed."""
        return self._live

    def _closed(self) -> None:
        with self._lock:
            self._live -= 1

    def opened(self, owner: Closable, handle: FileHandle) -> None:
        """``owner`` just opened ``handle``: it is the most recently used; while more than
        the capacity are open the least recently used others give theirs up."""
        evicted: list[Closable] = []
        with self._lock:
            if handle.on_close is None and handle.fd >= 0:
                handle.on_close = self._closed
                self._live += 1
            lru = self._lru
            lru[id(owner)] = owner
            lru.move_to_end(id(owner))
            self._last = owner
            excess = max(len(lru), self._live) - self.capacity
            skipped = 0
            while excess > 0 and len(lru) > 1:
                key, old = next(iter(lru.items()))
                if old is owner:  # gone round: the newcomer stays
                    lru.move_to_end(key)
                    continue
                if skipped < SKIP_DIRTY and old.descriptor_busy():
                    lru.move_to_end(key)  # a second chance: its flush will make it clean
                    skipped += 1
                    continue
                del lru[key]
                evicted.append(old)
                excess -= 1
            self.evictions += len(evicted)
        for old in evicted:  # outside the lock: a last reference may close the file here
            old.release_descriptor()

    def relieve(self, keep: Closable | None = None) -> int:
        """The process ran out of descriptors (EMFILE) anyway: the budget is the node's, but
        sockets, flushes and reads in flight hold more. Every owner (but ``keep``) that can
        free its descriptor at once gives it up; returns how many did."""
        with self._lock:
            evicted = [o for o in self._lru.values() if o is not keep and not o.descriptor_busy()]
            for old in evicted:
                del self._lru[id(old)]
            self.evictions += len(evicted)
        for old in evicted:
            old.release_descriptor()
        return len(evicted)

    def touch(self, owner: Closable) -> None:
        """``owner`` used its descriptor: it becomes the most recently used."""
        if owner is self._last:  # the hot path: one segment used several times in a row
            return
        with self._lock:
            if id(owner) in self._lru:
                self._lru.move_to_end(id(owner))
                self._last = owner

    def forget(self, owner: Closable) -> None:
        """``owner`` closed or dropped its descriptor on its own."""
        with self._lock:
            self._lru.pop(id(owner), None)
            if self._last is owner:
                self._last = None
