"""Durable Raft hard state (term, vote) and membership of one group, in a tiny JSON file.

Written only when term, vote or membership change (rare), atomically: temp file, fsync,
rename, fsync of the directory. The commit offset is saved along but never waited for: a
restarted replica learns the commit again from its leader.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from laminar.raft import ConfState, HardState
from laminar.segment.fileio import write_atomic

STATE_FILE = "raft-state.json"


def load_state(directory: Path) -> tuple[HardState | None, ConfState | None]:
    path = directory / STATE_FILE
    if not path.exists():
        return None, None
    data = json.loads(path.read_text())
    hard = HardState(term=data["term"], vote=data["vote"], commit=data.get("commit", -1))
    conf = ConfState(
        voters=tuple(data["voters"]), learners=tuple(data["learners"]), index=data["conf_index"]
    )
    return hard, conf


@dataclass(slots=True, frozen=True)
class StateToSave:
    """A hard state captured on the loop, numbered in capture order (``stamp``)."""

    stamp: int
    hard: HardState
    conf: ConfState


@dataclass(eq=False)
class StateWriter:
    """Orders one group's state saves, made from the loop (a log reset) and the flush threads
    (a pass) alike: they never interleave, and a state captured earlier never replaces one
    captured later that was written first."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _written: int = 0

    def save(self, state: StateToSave, write: Callable[[HardState, ConfState], None]) -> None:
        with self._lock:
            if state.stamp <= self._written:
                return
            write(state.hard, state.conf)
            self._written = state.stamp


def save_state(directory: Path, hard: HardState, conf: ConfState) -> None:
    document = {
        "term": hard.term,
        "vote": hard.vote,
        "commit": hard.commit,
        "voters": list(conf.voters),
        "learners": list(conf.learners),
        "conf_index": conf.index,
    }
    write_atomic(directory / STATE_FILE, json.dumps(document).encode())
