"""LogSlice: a byte range of whole batches inside one segment file, served without copying."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from laminar.segment.fileio import FileHandle, pread_exact


class LogSlice:
    """Whole batches at ``[position, position + length)`` of one segment's data file.

    ``file`` is a private read-only file object (its own file offset, so concurrent
    ``loop.sendfile`` fallbacks never disturb each other); close the slice when done with it.
    The slice keeps the segment's descriptor alive, so it stays readable even if retention or
    truncation deletes the segment meanwhile. An empty slice holds no descriptor.
    """

    __slots__ = ("_file", "_handle", "base_offset", "length", "next_offset", "path", "position")

    def __init__(
        self,
        handle: FileHandle | None,
        path: str | Path,
        position: int,
        length: int,
        base_offset: int,
        next_offset: int,
    ) -> None:
        self._handle = handle
        self._file: BinaryIO | None = None
        self.path = path
        self.position = position
        self.length = length
        self.base_offset = base_offset
        self.next_offset = next_offset

    def __repr__(self) -> str:
        return (
            f"LogSlice({os.path.basename(self.path)}, position={self.position}, "
            f"length={self.length}, "
            f"offsets=[{self.base_offset}, {self.next_offset}))"
        )

    @property
    def file(self) -> BinaryIO:
        if self._file is None:
            try:  # a new open file description of the same (possibly unlinked) file
                if self._handle is None:
                    raise OSError("an empty slice holds no descriptor")
                self._file = open(f"/proc/self/fd/{self._handle.fd}", "rb", buffering=0)  # noqa: SIM115
            except OSError:
                self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115
        return self._file

    def tobytes(self) -> bytes:
        if not self.length or self._handle is None:
            return b""
        return pread_exact(self._handle.fd, self.length, self.position, self.path)

    def view(self) -> memoryview:
        return memoryview(self.tobytes())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> LogSlice:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if self._file is not None:
            self._file.close()
