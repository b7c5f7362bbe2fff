"""What opening each replica would learn from its log's tail, saved every few seconds.

Opening a replica needs its producer table (the last batches of every producer), its seal
and its control batches, and it learnt them by walking the headers of up to 500,000 offsets
of its log; recovery walked the headers after the last index entry on disk as well. At 10,000
partitions and 10 GiB a restart then read most of its data (one header per batch, from a page
cache that no longer held it): a minute of disk reads. Like Kafka's producer-state snapshots
and recovery-point checkpoint, the node now saves, for every replica whose log moved, a
``TailState``: its end offset, the term there, where its configuration changes are, its seal
and its producer table. It first writes the log's buffered index entries, so recovery walks
only what came after them. A restart in the same boot (``boot.py``: the page cache holds every
log as it was written) walks only the batches after the saved end.

A state is used only if the log still holds the very batch it ended at: the same term at the
same offset means the same entry (Raft's log matching), so the same log up to there; a log cut
below it, reset by a snapshot or rewritten in another term falls back to the walk. All states
sit in one file, ``tail-checkpoint`` in the data directory, one JSON line per replica
directory, replaced atomically; a new boot ignores and removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from laminar.segment.fileio import write_atomic
from laminar.segment.log import PartitionLog

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "tail-checkpoint"
INTERVAL_S = 5.0
"""How often the states of moved logs are saved: a restart walks what came after."""
SLICE = 500
"""Replicas captured between two yields to the event loop."""


@dataclass(frozen=True, slots=True)
class TailState:
    """A replica's tail as of log end ``end`` (see the module docstring)."""

    end: int
    term: int
    """The term of the batch holding ``end - 1``."""
    configs_from: int
    configs: tuple[int, ...]
    """Offsets of every CONFIG entry in ``[configs_from, end)`` (the Raft core's scan)."""
    seal: int | None
    producers: list[list[int]]
    """``ProducerTable.snapshot(end)``."""

    def matches(self, log: PartitionLog) -> bool:
        """Whether ``log`` still holds the batch this state ended at, so the same log up to
        there."""
        last = self.end - 1
        return log.start_offset <= last < log.end_offset and log.term_at(last) == self.term

    def encode(self, name: str) -> bytes:
        document = {
            "name": name,
            "end": self.end,
            "term": self.term,
            "configs_from": self.configs_from,
            "configs": self.configs,
            "seal": self.seal,
            "producers": self.producers,
        }
        return json.dumps(document, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def decode(cls, document: dict[str, Any]) -> TailState:
        return cls(
            int(document["end"]),
            int(document["term"]),
            int(document["configs_from"]),
            tuple(map(int, document["configs"])),
            None if document["seal"] is None else int(document["seal"]),
            [list(map(int, row)) for row in document["producers"]],
        )


class TailSource(Protocol):
    """A replica's Raft log, as the checkpoint reads it (``LogStorage``)."""

    def tail_mark(self) -> tuple[int, int]:
        """(end offset, term of the last batch): cheap, and moves whenever the tail does."""
        ...

    def tail_state(self) -> TailState | None: ...


class TailCheckpoint:
    """The node's saved ``TailState`` per replica directory name."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / CHECKPOINT_FILE
        self._loaded: dict[str, TailState] = {}
        self._lines: dict[str, bytes] = {}
        self._marks: dict[str, tuple[int, int]] = {}
        """``tail_mark`` of each log when its state was saved: while unchanged, skipped."""
        self._writing = threading.Lock()

    def load(self, same_boot: bool) -> None:
        """Read the saved states, in the boot they were saved in only (another boot may have
        lost log tails the states describe)."""
        if not same_boot:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        try:
            lines = self.path.read_bytes().splitlines(keepends=True)
        except FileNotFoundError:
            return
        try:
            for line in lines:
                document = json.loads(line)
                name = document["name"]
                self._loaded[name] = state = TailState.decode(document)
                self._lines[name] = line
                self._marks[name] = (state.end, state.term)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring a damaged tail checkpoint", file=str(self.path), error=str(exc))
            self._loaded.clear()
            self._lines.clear()
            self._marks.clear()

    def take(self, name: str) -> TailState | None:
        """The state saved for the replica in directory ``name``, for its opening (once)."""
        return self._loaded.pop(name, None)

    def forget(self, name: str) -> None:
        """The replica's directory is gone."""
        self._loaded.pop(name, None)
        self._lines.pop(name, None)
        self._marks.pop(name, None)

    def capture(self, name: str, source: TailSource) -> None:
        """Save the state of ``source``'s log if it moved since the last capture."""
        mark = source.tail_mark()
        if self._marks.get(name) == mark:
            return
        state = source.tail_state()
        if state is None:  # (empty, closed or failed: tried again next time)
            self._lines.pop(name, None)
            self._marks.pop(name, None)
            return
        self._lines[name] = state.encode(name)
        self._marks[name] = mark

    async def capture_all(self, sources: Iterable[tuple[str, TailSource]]) -> None:
        """``capture`` every source, yielding to the event loop every SLICE of them."""
        for i, (name, source) in enumerate(sources):
            self.capture(name, source)
            if i % SLICE == SLICE - 1:
                await asyncio.sleep(0)

    async def save(self) -> None:
        """Replace the file with the states captured so far, written off the event loop (one
        writer at a time: a cancelled save's thread may still be writing). A failed write
        (a full disk) leaves the last file, whose states a restart checks like any other."""
        data = b"".join(self._lines.values())
        try:
            await asyncio.to_thread(self._write, data)
        except OSError as exc:
            log.warning("tail checkpoint not saved", file=str(self.path), error=str(exc))

    def _write(self, data: bytes) -> None:
        with self._writing:
            write_atomic(self.path, data)

    async def run(
        self,
        every: Callable[[], list[tuple[str, TailSource]]],
        moved: Callable[[], list[tuple[str, TailSource]]],
    ) -> None:
        """Every INTERVAL_S: capture the logs that may have moved since the last time (every
        log the first time: one walked on opening has no state yet), then save. Visiting all
        10,000 logs each time cost an idle node 0.6 % of a core."""
        sources = every
        while True:
            await asyncio.sleep(INTERVAL_S)
            await self.capture_all(sources())
            sources = moved
            await self.save()
