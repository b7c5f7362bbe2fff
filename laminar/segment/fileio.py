"""Small file helpers: ref-counted descriptors, exact preads, directory fsync, atomic files.

Descriptors are wrapped so that a descriptor captured by a flush thread or held by a LogSlice
stays open (and is never reused for another file) until its last user drops it.
"""

from __future__ import annotations

import os
from pathlib import Path

from laminar.errors import CorruptLogError


class FileHandle:
    """An OS file descriptor closed when explicitly closed or when the last reference goes."""

    __slots__ = ("fd", "path")

    def __init__(self, path: Path, flags: int, mode: int = 0o644) -> None:
        self.path = path
        self.fd = -1
        self.fd = os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def __del__(self) -> None:
        self.close()


def open_append(path: Path, create: bool = True) -> FileHandle:
    """Read/write, every write at the end (so a write after ftruncate never leaves a hole)."""
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    return FileHandle(path, flags)


def pread_exact(fd: int, length: int, position: int, path: Path | None = None) -> bytes:
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


def fsync_dir(path: Path) -> None:
    """Make creations, renames and deletions inside a directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def rewrite_file(handle: FileHandle, data: bytes) -> None:
    """Replace the contents of a file opened with open_append (not atomic: callers can rebuild)."""
    os.ftruncate(handle.fd, 0)
    if data:
        os.write(handle.fd, data)
