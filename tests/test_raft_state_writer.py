"""A group's state file is saved from the loop (a log reset) and from flush threads (a pass):
concurrent saves must neither collide on the temp file nor let an older state win."""

from __future__ import annotations

import threading
from pathlib import Path

from laminar.node.raft_state import StateToSave, StateWriter, load_state, save_state
from laminar.raft import ConfState, HardState


def state(stamp: int) -> StateToSave:
    return StateToSave(stamp, HardState(stamp, 1, 0), ConfState((1, 2, 3), (), stamp))


def test_an_older_state_never_replaces_a_newer_one(tmp_path: Path) -> None:
    writer = StateWriter()

    def write(hard: HardState, conf: ConfState) -> None:
        save_state(tmp_path, hard, conf)

    writer.save(state(2), write)
    writer.save(state(1), write)  # a pass captured it earlier but reached the disk later
    hard, conf = load_state(tmp_path)
    assert hard is not None and hard.term == 2
    assert conf is not None and conf.index == 2


def test_concurrent_saves_end_with_the_newest(tmp_path: Path) -> None:
    writer = StateWriter()

    def write(hard: HardState, conf: ConfState) -> None:
        save_state(tmp_path, hard, conf)

    errors: list[BaseException] = []

    def save_all(stamps: range) -> None:
        try:
            for stamp in stamps:
                writer.save(state(stamp), write)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=save_all, args=(range(i, 400, 4),)) for i in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    hard, _ = load_state(tmp_path)
    assert hard is not None and hard.term == 399
