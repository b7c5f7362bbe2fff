"""Small file helpers: ref-counted descriptors, exact preads, directory fsync, atomic files.

Descriptors are wrapped so that a descriptor captured by a flush thread or held by a LogSlice
stays open (and is never reused for another file) until its last user drops it.

Test seam (power loss): with ``LAMINAR_TEST_POWERLOSS_JOURNAL=<path>`` in the environment,
every ``os.fsync``/``os.fdatasync`` of a regular file in this process first appends
"inode size path" to that journal, the size taken *before* the sync (so it is a length the sync
certainly covers). After a SIGKILL, tests/faults/powerloss.py cuts each file back to its last
journalled length (and garbles some of the rest), which is what a power cut may leave. Without
the variable nothing is wrapped: production pays nothing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path

from laminar.errors import CorruptLogError, InvalidRequestError

POWERLOSS_JOURNAL_ENV = "LAMINAR_TEST_POWERLOSS_JOURNAL"


def _journalled(sync: Callable[[int], None], journal_fd: int) -> Callable[[int], None]:
    def sync_and_record(fd: int) -> None:
        info = os.fstat(fd)
        sync(fd)
        if (info.st_mode & 0o170000) == 0o100000:  # regular files only, not directories
            path = os.readlink(f"/proc/self/fd/{fd}")
            os.write(journal_fd, f"{info.st_ino} {info.st_size} {path}\n".encode())

    return sync_and_record


def _install_powerloss_journal() -> None:
    """Wrap os.fsync/os.fdatasync process-wide when the power-loss test seam is asked for."""
    journal = os.environ.get(POWERLOSS_JOURNAL_ENV)
    if not journal or getattr(os.fsync, "__name__", "") == "sync_and_record":
        return
    journal_fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.fsync = _journalled(os.fsync, journal_fd)
    os.fdatasync = _journalled(os.fdatasync, journal_fd)


_install_powerloss_journal()


class FileHandle:
    """An OS file descriptor closed when explicitly closed or when the last reference goes."""

    __slots__ = ("fd", "on_close", "path")

    def __init__(self, path: str | Path, flags: int, mode: int = 0o644) -> None:
        self.path = path
        self.fd = -1
        self.on_close: Callable[[], None] | None = None  # told once the descriptor is closed
        self.fd = os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
            told, self.on_close = self.on_close, None
            if told is not None:
                told()

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def __del__(self) -> None:
        self.close()


def open_append(path: str | Path, create: bool = True, truncate: bool = False) -> FileHandle:
    """Read/write, every write at the end (so a write after ftruncate never leaves a hole);
    ``truncate`` empties a file that exists."""
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    return FileHandle(path, flags | (os.O_TRUNC if truncate else 0))


def write_whole(
    path: str | Path, data: bytes | bytearray, *, append: bool = False, sync: bool = False
) -> None:
    """Write a small file whole (or, with ``append``, append to it) through a descriptor of
    its own, closed at once (created if missing); a short write raises; with ``sync``
    fdatasynced before it is closed."""
    mode = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | mode | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write of {written} of {len(data)} bytes to {path}")
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def pread_exact(fd: int, length: int, position: int, path: str | Path | None = None) -> bytes:
    """pread that loops over short reads; a read past the end raises CorruptLogError."""
    data = os.pread(fd, length, position)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            raise CorruptLogError(
                f"{path}: expected {length} bytes at position {position}, file ends early"
            )
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def filesystem_syncer(fd: int) -> Callable[[], None] | None:
    """A call that makes every written page of the filesystem holding the open file ``fd``
    durable with one syncfs(2) (Linux) and raises OSError on failure: a group-commit pass over
    many logs, or a restart, need not fdatasync each of thousands of logs one by one. None
    where there is no syncfs, and under the power-loss test seam (which records what each
    fdatasync covers): callers then sync file by file.

    Writeback errors are reported through the filesystem's error sequence as sampled when
    ``fd`` was opened: a descriptor held open for the process's life (a node's data directory
    lock) sees every error since the start, whichever file it hit (Linux 5.8 and later)."""
    if os.environ.get(POWERLOSS_JOURNAL_ENV):
        return None
    try:
        import ctypes

        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None

    def sync() -> None:
        if syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs: {os.strerror(error)}")

    return sync


def fsync_dir(path: Path) -> None:
    """Make creations, renames and deletions inside a directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_directory(path: Path) -> int:
    """Take an exclusive flock on a directory itself (no lock file to create or leave) and
    return its descriptor: the lock lasts until it is closed or the process dies."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InvalidRequestError(f"{path} is in use by another process") from None
    return fd


def write_atomic(path: Path, data: bytes) -> None:
    """Replace a small file durably: write a temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_or_empty(path: str) -> bytes:
    """A small file's bytes (b"" if absent), read with plain system calls: io.open's buffered
    reader costs more than the read itself, twice per replica on a restart."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):  # (as io.open refuses one)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        size = info.st_size
        data = os.read(fd, size) if size else b""
        while len(data) < size:  # (a short read: unusual for a regular file)
            more = os.read(fd, size - len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    return data
