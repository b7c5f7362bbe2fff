"""The node-wide budget of open log files (laminar/segment/descriptors.py) on real files:
eviction order, reopening on write and read, durability of writes whose descriptor was taken
away (power loss simulated from the fdatasync journal), thousands of logs within the budget."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.errors import InvalidRequestError
from laminar.segment import LogConfig, PartitionLog, build_batch
from laminar.segment.descriptors import SKIP_DIRTY, DescriptorCache
from laminar.segment.fileio import (
    POWERLOSS_JOURNAL_ENV,
    FileHandle,
    lock_directory,
    open_append,
)
from tests.faults.powerloss import lose_power

NOW = 1_800_000_000_000
ROOT = Path(__file__).resolve().parent.parent


class Owner:
    """The smallest descriptor owner: a real file it gives up when the cache asks."""

    def __init__(self, directory: Path, name: str, busy: bool = False) -> None:
        self.name = name
        self.busy = busy
        self.released = 0
        self.handle: FileHandle | None = open_append(directory / name)

    def open(self, cache: DescriptorCache) -> Owner:
        assert self.handle is not None
        cache.opened(self, self.handle)
        return self

    def release_descriptor(self) -> None:
        self.released += 1
        self.handle = None

    def descriptor_busy(self) -> bool:
        return self.busy

    def __repr__(self) -> str:
        return self.name


def batch(tag: int, size: int = 100) -> bytes:
    return build_batch([(None, bytes([tag % 256]) * size, (), NOW)])


def open_files_under(directory: Path, suffix: str = "") -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)) and target.endswith(suffix):
            count += 1
    return count


def test_least_recently_used_owner_gives_up_its_descriptor_first(tmp_path: Path) -> None:
    cache = DescriptorCache(2)
    a, b, c, d = (Owner(tmp_path, name) for name in "abcd")
    a.open(cache)
    b.open(cache)
    c.open(cache)  # a is the least recently used
    assert (a.released, b.released, c.released, len(cache)) == (1, 0, 0, 2)
    assert cache.open_files == 2  # a's descriptor closed with its last reference
    cache.touch(b)  # now c is
    d.open(cache)
    assert (b.released, c.released, d.released, cache.open_files) == (0, 1, 0, 2)
    cache.forget(b)  # closed on its own: no longer in the LRU, never asked
    assert b.handle is not None
    b.handle.close()
    assert cache.open_files == 1
    kept = d.handle  # a reader still holds d's handle: evicting d frees nothing yet
    Owner(tmp_path, "e").open(cache)
    Owner(tmp_path, "f").open(cache)
    assert d.released == 1 and cache.open_files == 3
    del kept
    assert cache.open_files == 2
    assert cache.evictions == 3


def test_owners_awaiting_an_fdatasync_are_passed_over_for_clean_ones(tmp_path: Path) -> None:
    cache = DescriptorCache(2)
    dirty, clean = Owner(tmp_path, "dirty", busy=True), Owner(tmp_path, "clean")
    dirty.open(cache)
    clean.open(cache)
    Owner(tmp_path, "new").open(cache)  # dropping the dirty one would free nothing now
    assert (dirty.released, clean.released) == (0, 1)
    # with nothing clean near, the oldest goes anyway (the flush closes it afterwards)
    cache = DescriptorCache(SKIP_DIRTY)
    owners = [Owner(tmp_path, f"d{i}", busy=True).open(cache) for i in range(SKIP_DIRTY)]
    last = Owner(tmp_path, "last", busy=True).open(cache)
    assert len(cache) == SKIP_DIRTY and sum(o.released for o in owners) == 1
    assert last.released == 0


def test_descriptors_held_past_eviction_leave_fewer_cached(tmp_path: Path) -> None:
    cache = DescriptorCache(4)
    owners = [Owner(tmp_path, f"o{i}").open(cache) for i in range(4)]
    held = [owner.handle for owner in owners[:2]]  # e.g. a flush in flight holds these
    Owner(tmp_path, "n0").open(cache)  # o0 goes, but stays open while held
    assert (len(cache), cache.open_files) == (4, 5)
    Owner(tmp_path, "n1").open(cache)  # so two go: o1 (held too) and o2
    assert (len(cache), cache.open_files) == (3, 5)
    Owner(tmp_path, "n2").open(cache)  # and two more: o3 and n0
    assert (len(cache), cache.open_files) == (2, 4)
    held.clear()  # the flush ends
    assert cache.open_files == 2


def test_relieve_frees_every_idle_descriptor_but_the_one_being_opened(tmp_path: Path) -> None:
    cache = DescriptorCache(10)
    idle = Owner(tmp_path, "idle").open(cache)
    busy = Owner(tmp_path, "busy", busy=True).open(cache)
    keep = Owner(tmp_path, "keep").open(cache)
    assert cache.relieve(keep=keep) == 1
    assert (idle.released, busy.released, keep.released, len(cache)) == (1, 0, 0, 2)
    assert cache.open_files == 2


def test_logs_beyond_the_budget_reopen_their_files_on_write_and_read(tmp_path: Path) -> None:
    cache = DescriptorCache(3)
    config = LogConfig(segment_bytes=600, index_interval_bytes=128)
    logs = [
        PartitionLog.open(tmp_path / f"p{i}", config, descriptors=cache, lock=False)
        for i in range(10)
    ]
    try:
        written: list[list[bytes]] = [[] for _ in logs]
        for round_ in range(12):  # several segments per log: sealed ones are read back too
            for i, plog in enumerate(logs):
                data = batch(i * 16 + round_)
                plog.append(data, term=1 + round_ // 6)
                written[i].append(data)
            for plog in logs:
                assert plog.flush() == plog.end_offset
        assert len(cache) <= 3 and cache.evictions > 0
        assert open_files_under(tmp_path, ".log") <= 3
        assert open_files_under(tmp_path, "index") == 0  # open only while written
        for i, plog in enumerate(logs):
            assert plog.segment_count > 2
            for offset, data in enumerate(written[i]):
                got = plog.read(offset, 1 << 20).tobytes()
                assert got[16 : len(data)] == data[16:]  # (bytes 0-15: offset and term)
            assert plog.verify() == len(written[i])
            assert plog.term_at(11) == 2
        assert open_files_under(tmp_path, ".log") <= 3
    finally:
        for plog in logs:
            plog.close()
    assert open_files_under(tmp_path) == 0
    for i in range(10):  # and everything is there after reopening
        with PartitionLog.open(tmp_path / f"p{i}", config) as plog:
            assert plog.end_offset == 12 and plog.verify() == 12


def test_a_flush_syncs_the_very_handle_the_budget_took_away(tmp_path: Path) -> None:
    cache = DescriptorCache(1)
    first = PartitionLog.open(tmp_path / "a", descriptors=cache, lock=False)
    second = PartitionLog.open(tmp_path / "b", descriptors=cache, lock=False)
    try:
        first.append(batch(1), term=1)
        for i in range(SKIP_DIRTY + 2):  # the cache passes over dirty owners a while
            second.append(batch(i), term=1)
            second.flush()
        assert open_files_under(tmp_path / "a", ".log") == 1  # taken away, still open...
        assert len(cache) == 1
        assert first.durable_offset == 0
        assert first.flush() == 1 == first.durable_offset  # ...until its fdatasync
        assert open_files_under(tmp_path / "a", ".log") == 0
        first.append(batch(2), term=1)  # reopened in append mode: nothing lost
        assert first.flush() == 2
        assert first.read(0, 1 << 20).next_offset == 2
    finally:
        first.close()
        second.close()
    with PartitionLog.open(tmp_path / "a") as plog:
        assert plog.end_offset == 2 and plog.verify() == 2


def test_one_log_per_directory_in_this_process_without_a_lock_file(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path / "p", lock=False):
        assert not (tmp_path / "p" / ".lock").exists()
        with pytest.raises(InvalidRequestError, match="already open"):
            PartitionLog.open(tmp_path / "p")
        with pytest.raises(InvalidRequestError, match="already open"):
            PartitionLog.open(tmp_path / "p", lock=False)
    with PartitionLog.open(tmp_path / "p"):  # released on close
        pass
    fd = lock_directory(tmp_path)  # the node's lock of its data directory
    try:
        with pytest.raises(InvalidRequestError, match="in use"):
            lock_directory(tmp_path)
    finally:
        os.close(fd)


_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    from pathlib import Path
    from laminar.segment import LogConfig, PartitionLog, build_batch
    from laminar.segment.descriptors import DescriptorCache

    root = Path(sys.argv[1])
    cache = DescriptorCache(4)
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256)
    logs = [PartitionLog.open(root / f"p{i}", config, descriptors=cache, lock=False)
            for i in range(24)]
    reported = [0] * len(logs)
    stop = threading.Event()

    def flusher():  # the group commit: flushes while the loop thread appends and evicts
        while not stop.is_set():
            for i, plog in enumerate(logs):
                reported[i] = max(reported[i], plog.flush())

    thread = threading.Thread(target=flusher)
    thread.start()
    for n in range(int(sys.argv[2])):
        i = (n * 7) % len(logs)
        logs[i].append(build_batch([(None, bytes([n % 256]) * 150, (), n)]), term=1)
    stop.set()
    thread.join()
    (root / "durable.json").write_text(json.dumps(
        {"durable": reported, "evictions": cache.evictions}))
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no last flush
    """
)


def test_durable_offsets_survive_power_loss_while_the_budget_churns(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    journal = tmp_path / "fsync.journal"
    env = {**os.environ, POWERLOSS_JOURNAL_ENV: str(journal), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), "3000"], env=env, timeout=60, check=False
    )
    assert result.returncode == -9
    report = json.loads((root / "durable.json").read_text())
    assert report["evictions"] > 100
    durable = report["durable"]
    assert sum(durable) > 0
    lost = lose_power(root, journal, random.Random(7), garble=True)
    assert lost.files > 24
    for i, promised in enumerate(durable):
        with PartitionLog.open(root / f"p{i}", LogConfig(segment_bytes=4096)) as plog:
            assert plog.end_offset >= promised, f"log {i} lost acknowledged offsets"
            assert plog.verify() == plog.end_offset


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs where there is one (fdatasync costs nothing there: thousands of
    them must not make the test wait on a disk other processes keep busy), else tmp_path."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="laminar-descriptors-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_thousands_of_logs_stay_within_the_budget(fast_dir: Path) -> None:
    tmp_path = fast_dir
    budget, logs_count = 256, 3000
    cache = DescriptorCache(budget)
    baseline = len(os.listdir("/proc/self/fd"))
    peak = 0
    logs: list[PartitionLog] = []
    try:
        for i in range(logs_count):
            plog = PartitionLog.open(tmp_path / f"p{i}", descriptors=cache, lock=False)
            plog.append(batch(i), term=1)
            logs.append(plog)
            if i % 100 == 99:  # a group commit every hundred logs
                for pending in logs[-100:]:
                    assert pending.flush() == 1
                peak = max(peak, len(os.listdir("/proc/self/fd")))
        for i, plog in enumerate(logs):  # a second round: reads and writes reopen files
            assert plog.read(0, 1 << 20).tobytes()[16:] == batch(i)[16:]
            plog.append(batch(i + 1), term=2)
            if i % 100 == 99:  # (a written log holds its descriptor until its fdatasync)
                peak = max(peak, len(os.listdir("/proc/self/fd")))
                assert cache.open_files <= budget + 1
                for pending in logs[i - 99 : i + 1]:
                    assert pending.flush() == 2
    finally:
        for plog in logs:
            plog.close()
    # without the budget: one descriptor per log at least (four before this budget existed)
    assert peak - baseline <= budget + 8, f"{peak - baseline} descriptors for {logs_count} logs"
    assert cache.evictions >= 2 * logs_count - 2 * budget


def test_out_of_descriptors_idle_files_are_given_up_and_the_open_retried(
    tmp_path: Path,
) -> None:
    import resource

    cache = DescriptorCache(1000)  # more than the process may open: a wrong setting
    logs = [PartitionLog.open(tmp_path / f"p{i}", descriptors=cache, lock=False) for i in range(40)]
    try:
        for plog in logs:
            plog.append(batch(1), term=1)
            plog.flush()
        first = logs[0]
        first._segments[-1].release_descriptor()  # e.g. taken away earlier
        cache.forget(first._segments[-1])
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        gap = os.open(os.devnull, os.O_RDONLY)  # where the released descriptor was
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # none free
        try:
            with pytest.raises(OSError):
                os.open(tmp_path / "p0", os.O_RDONLY)
            assert first.append(batch(2), term=1) == (1, 1)  # reopened after relieving
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            os.close(gap)
        assert cache.evictions == 39 and len(cache) == 1
        assert first.flush() == 2
    finally:
        for plog in logs:
            plog.close()
