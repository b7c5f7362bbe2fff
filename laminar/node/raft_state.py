"""Durable Raft hard state (term, vote) and membership of one group, in a tiny JSON file.

Written only when term, vote or membership change (rare), atomically: temp file, fsync,
rename, fsync of the directory. The commit offset is saved along but never waited for: a
restarted replica learns the commit again from its leader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from laminar.raft import ConfState, HardState

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


def save_state(directory: Path, hard: HardState, conf: ConfState) -> None:
    document = {
        "term": hard.term,
        "vote": hard.vote,
        "commit": hard.commit,
        "voters": list(conf.voters),
        "learners": list(conf.learners),
        "conf_index": conf.index,
    }
    write_durably(directory / STATE_FILE, json.dumps(document).encode())


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically and durably: temp file, fsync, rename, fsync directory."""
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
