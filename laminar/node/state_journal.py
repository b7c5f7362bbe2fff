"""Term, vote and membership of every Raft group on a node, in one append-only journal.

A per-group state file costs two fsyncs (file and directory) per change; when thousands of
groups elect at once (a big topic created, a node lost) the flush thread spent seconds per
pass on them, elections timed out meanwhile and the groups churned. Here a pass appends one
small record per changed group and makes them all durable with one fdatasync.

Record: ``length (u32) | crc32 of the payload (u32) | payload`` (JSON: the replica's directory
name and its state, or a tombstone). Replay stops at the first short or damaged record (a torn
tail after a crash, whose pass never released anything) and cuts the file there. Once the file
holds many more records than live entries it is rewritten (temp file, fsync, rename, fsync of
the directory). A replica whose directory is missing when it opens starts with no saved state,
as it did when the state file lived in that directory (``amnesia.py`` handles that loss); a
replica with no record yet reads the state file of older data directories (``raft_state.py``).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

from laminar.node.raft_state import load_state
from laminar.raft import ConfState, HardState
from laminar.segment.fileio import fsync_dir

JOURNAL_FILE = "raft-states.journal"
HEADER = struct.Struct("<II")
COMPACT_MIN_RECORDS = 4096
"""Rewrite once the file holds this many records and more than twice the live entries."""


def _encode(document: dict[str, Any]) -> bytes:
    payload = json.dumps(document, separators=(",", ":")).encode()
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _state_document(name: str, hard: HardState, conf: ConfState) -> dict[str, Any]:
    return {
        "name": name,
        "term": hard.term,
        "vote": hard.vote,
        "commit": hard.commit,
        "voters": list(conf.voters),
        "learners": list(conf.learners),
        "conf_index": conf.index,
    }


class StateJournal:
    """The saved hard state of every replica on a node. ``write`` buffers, ``sync`` writes and
    makes everything written so far durable; both may be called from the loop and the flush
    thread. The buffer is written with one system call: a pass after thousands of groups voted
    wrote a record each, and every call gave up the GIL and waited to get it back from a busy
    event loop (up to its switch interval, 5 ms)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._syncing = threading.Lock()
        """Held by ``sync`` (outer to ``_lock``) across its fdatasync, which ``_lock`` is not: the
        loop's ``write`` and ``forget`` (a big topic's new replicas) waited out the flush
        thread's fdatasync of the journal, some 5 ms each time."""
        self._states: dict[str, dict[str, Any]] = {}
        self._encoded: dict[str, bytes] = {}
        """Each live state's record as written: a compaction joins them instead of encoding
        10,000 documents again (50 ms of the flush thread, several times that on a busy node
        whose loop holds the GIL, while every acknowledgement waited for the pass)."""
        self._records = 0
        self._buffer: list[bytes] = []
        self._fd = -1

    def open(self) -> None:
        """Replay the journal (cutting a torn tail) and open it for appending; done by the
        first use otherwise. Reopens after ``close``."""
        with self._lock:
            if self._fd < 0:
                self._open()

    def _open(self) -> None:
        self._states.clear()
        self._encoded.clear()
        self._records = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        position = 0
        while position + HEADER.size <= len(data):
            length, crc = HEADER.unpack_from(data, position)
            payload = data[position + HEADER.size : position + HEADER.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            document = json.loads(payload)
            name = document["name"]
            end = position + HEADER.size + length
            if document.get("forget"):
                self._states.pop(name, None)
                self._encoded.pop(name, None)
            else:
                self._states[name] = document
                self._encoded[name] = data[position:end]
            self._records += 1
            position = end
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if position < len(data):
            os.ftruncate(self._fd, position)
            os.fdatasync(self._fd)
        os.lseek(self._fd, position, os.SEEK_SET)
        if not data:
            fsync_dir(self.path.parent)

    def close(self) -> None:
        with self._syncing, self._lock:
            if self._fd >= 0:
                self._write_buffer()
                os.close(self._fd)
                self._fd = -1

    def load(
        self, directory: Path, exists: bool | None = None
    ) -> tuple[HardState | None, ConfState | None]:
        """The saved state of the replica in ``directory`` (call before creating it);
        ``exists``: whether the directory exists, if the caller just looked."""
        if not (directory.exists() if exists is None else exists):
            self.forget(directory.name)  # wiped, or new: nothing saved applies to it
            return None, None
        with self._lock:
            if self._fd < 0:
                self._open()
            document = self._states.get(directory.name)
        if document is None:
            return load_state(directory)  # written before the journal existed, or never
        hard = HardState(term=document["term"], vote=document["vote"], commit=document["commit"])
        conf = ConfState(
            voters=tuple(document["voters"]),
            learners=tuple(document["learners"]),
            index=document["conf_index"],
        )
        return hard, conf

    def write(self, directory: Path, hard: HardState, conf: ConfState) -> None:
        """Append a replica's new state; durable with the next ``sync``."""
        document = _state_document(directory.name, hard, conf)
        record = _encode(document)
        with self._lock:
            self._states[directory.name] = document
            self._encoded[directory.name] = record
            self._append(record)

    def forget(self, name: str) -> None:
        """The replica's directory is gone: drop its state (durable with the next sync)."""
        with self._lock:
            if self._fd < 0:
                self._open()
            if self._states.pop(name, None) is not None:
                del self._encoded[name]
                self._append(_encode({"name": name, "forget": True}))

    def sync(self) -> None:
        """Make everything written so far durable (one fdatasync), compacting when due."""
        with self._syncing:
            with self._lock:
                if not self._buffer or self._fd < 0:
                    return
                if self._records >= COMPACT_MIN_RECORDS and self._records > 2 * len(self._states):
                    self._compact()
                    return
                self._write_buffer()
                fd = self._fd  # (replaced by a compaction or closed only under ``_syncing``)
            os.fdatasync(fd)

    def _append(self, record: bytes) -> None:
        if self._fd < 0:
            self._open()
        self._buffer.append(record)
        self._records += 1

    def _write_buffer(self) -> None:
        data = b"".join(self._buffer)
        self._buffer.clear()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _compact(self) -> None:
        """Rewrite the journal with one record per live replica (under the lock)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(self._encoded.values())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._buffer.clear()  # (its records are in the states written)
        self._records = len(self._states)
