"""A simulated disk for the Raft simulator: what was *written* versus what is *durable*.

The node reads and writes ``written`` (the page cache). ``fsync`` makes everything written so
far durable. ``crash`` throws the page cache away and keeps what a real disk could hold after
power loss:

* the log: everything covered by the last completed fsync, plus some prefix of the writes made
  after it (truncations, resets, compactions and entries, in the order they were made), and
  possibly a torn copy of the next entry (cut at a random byte). Entries are laid out as
  length-prefixed, crc32-checked records, and recovery reads the un-synced tail record by
  record and cuts at the first short or corrupt one, as the segment log's recovery does;
* the Raft state file (term, vote, commit and committed configuration, one atomically replaced
  file, as ``laminar/node/raft_state.py`` writes it): either the last synced version or the last
  written one, independently of how much of the log survived.
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass

from laminar.raft import ConfState, Entry, EntryKind, HardState, MemoryStorage

# term, index, last, kind, payload length; then the payload; then crc32 of header and payload.
_HEAD = struct.Struct(">QqqBI")
_CRC = struct.Struct(">I")

_APPEND, _TRUNCATE, _RESET, _COMPACT = range(4)


def encode_record(e: Entry) -> bytes:
    body = _HEAD.pack(e.term, e.index, e.last, int(e.kind), len(e.data)) + bytes(e.data)
    return body + _CRC.pack(zlib.crc32(body))


def recover_records(buf: bytes) -> tuple[list[Entry], bool]:
    """Entries of every complete, intact record from the start of ``buf``; the flag says a
    torn or corrupt tail was cut off."""
    out: list[Entry] = []
    pos, n = 0, len(buf)
    while pos < n:
        if n - pos < _HEAD.size:
            return out, True
        term, index, last, kind, size = _HEAD.unpack_from(buf, pos)
        end = pos + _HEAD.size + size
        if end + _CRC.size > n:
            return out, True
        (crc,) = _CRC.unpack_from(buf, end)
        if crc != zlib.crc32(buf[pos:end]):
            return out, True
        out.append(Entry(term, index, last, EntryKind(kind), buf[pos + _HEAD.size : end]))
        pos = end + _CRC.size
    return out, False


@dataclass(slots=True)
class CrashReport:
    """What one crash kept of the writes made since the last fsync (for stats and tests)."""

    kept_ops: int
    lost_ops: int
    torn: bool
    state_survived: bool  # an un-synced state file write survived
    state_lost: bool  # an un-synced state file write was lost


class SimDisk:
    """One host's disk: a Raft log plus the Raft state file."""

    __slots__ = ("conf", "durable", "durable_conf", "durable_hs", "hs", "latest", "ops", "written")

    def __init__(self, conf: ConfState) -> None:
        self.written = MemoryStorage()
        self.durable = MemoryStorage()
        self.hs = HardState()
        self.conf = conf
        self.durable_hs = self.hs
        self.durable_conf = conf
        self.latest = self.hs  # the newest hard state the node handed out
        # Log writes since the last fsync, oldest first: (kind, payload).
        self.ops: list[tuple[int, object]] = []

    # -- writes (page cache) -------------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        first = entries[0].index
        if first <= self.written.last_index():
            self.ops.append((_TRUNCATE, first))
        self.written.append(entries)
        self.ops.extend((_APPEND, e) for e in entries)

    def reset(self, start: int, prev_term: int) -> None:
        self.written.reset(start, prev_term)
        self.ops.append((_RESET, (start, prev_term)))

    def compact(self, index: int) -> None:
        self.written.compact(index)
        self.ops.append((_COMPACT, index))

    def save_state(self, hs: HardState | None, conf: ConfState | None) -> None:
        """Rewrite the state file when term, vote or configuration changed; a change of the
        commit offset alone is not written (it rides along with the next rewrite), exactly as
        the node runtime does: the commit is advisory, a restarted replica relearns it."""
        cur = self.hs
        if hs is not None:
            self.latest = hs
        new = self.latest
        new_conf = conf if conf is not None else self.conf
        if new.term == cur.term and new.vote == cur.vote and new_conf == self.conf:
            return
        self.hs = HardState(new.term, new.vote, new.commit)
        self.conf = new_conf

    # -- durability ----------------------------------------------------------------------

    def dirty(self) -> bool:
        """Something was written since the last fsync."""
        return bool(self.ops) or self.hs is not self.durable_hs

    def sync_state(self) -> None:
        """Make the state file durable on its own (before a reset)."""
        self.durable_hs = self.hs
        self.durable_conf = self.conf

    def fsync(self) -> None:
        _apply(self.durable, self.ops)
        self.ops = []
        self.durable_hs = self.hs
        self.durable_conf = self.conf

    def crash(self, rng: random.Random) -> CrashReport:
        """Lose the page cache; the surviving state becomes what the node restarts from."""
        ops = self.ops
        r = rng.random()
        if not ops or r < 0.3:
            kept = 0
        elif r < 0.6:
            kept = len(ops)
        else:
            kept = rng.randint(0, len(ops))
        torn_bytes = b""
        if kept < len(ops) and ops[kept][0] == _APPEND and rng.random() < 0.5:
            rec = encode_record(ops[kept][1])  # type: ignore[arg-type]
            torn_bytes = rec[: rng.randrange(1, len(rec))]
        log = self.durable.copy()
        torn = _recover(log, ops[:kept], torn_bytes)
        changed = self.hs is not self.durable_hs
        state_survived = changed and rng.random() < 0.5
        if state_survived:
            self.durable_hs = self.hs
            self.durable_conf = self.conf
        else:
            self.hs = self.durable_hs
            self.conf = self.durable_conf
        self.latest = self.hs
        self.durable = log
        self.written = log.copy()
        self.ops = []
        return CrashReport(
            kept, len(ops) - kept, torn, state_survived, changed and not state_survived
        )

    def durable_term(self, index: int) -> int | None:
        """Term of the durable entry holding ``index``; -1 when compacted past; None: absent."""
        d = self.durable
        if index < d.first_index():
            return -1
        if index > d.last_index():
            return None
        return d.term(index)


def _apply(log: MemoryStorage, ops: list[tuple[int, object]]) -> None:
    """Replay completed writes onto ``log``."""
    for kind, arg in ops:
        if kind == _APPEND:
            log.append([arg])  # type: ignore[list-item]
        elif kind == _TRUNCATE:
            log.truncate(arg)  # type: ignore[arg-type]
        elif kind == _RESET:
            log.reset(*arg)  # type: ignore[misc]
        else:
            log.compact(arg)  # type: ignore[arg-type]


def _recover(log: MemoryStorage, ops: list[tuple[int, object]], torn: bytes) -> bool:
    """Replay what survived a crash onto ``log`` the way recovery finds it on disk: runs of
    entries are read back from their records, and ``torn`` (a cut record) follows the last
    run. Returns whether recovery cut a torn tail."""
    pending = bytearray()
    cut = False

    def land() -> None:
        nonlocal cut
        ents, cut = recover_records(bytes(pending))
        if ents:
            log.append(ents)
        pending.clear()

    for kind, arg in ops:
        if kind == _APPEND:
            pending += encode_record(arg)  # type: ignore[arg-type]
            continue
        land()
        if cut:
            raise AssertionError("recovery cut a record that was written whole")
        _apply(log, [(kind, arg)])
    pending += torn
    land()
    if cut != bool(torn):
        raise AssertionError("recovery did not cut exactly the torn record")
    return cut
