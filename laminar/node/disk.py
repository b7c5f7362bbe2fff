"""Free space of the data directory: the node stops taking new data before the disk is full.

Running out of space in the middle of a write leaves a torn batch and a replica that must be
repaired; stopping short of that (Redpanda's ``storage_min_free_bytes``) keeps every write
whole. While free space is below ``min_free_bytes`` the node answers produce requests with
``DiskFullError`` and, as a follower, ignores appends of partition groups (their leaders
retry, as for a lost message); the small metadata group keeps working. Everything resumes by
itself once space is freed: the check runs every second.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from laminar.errors import DiskFullError

log = structlog.get_logger(__name__)

CHECK_INTERVAL_S = 1.0
RECHECK_BYTES = 1 << 20
"""Measure again (a statvfs, microseconds) after this much was accepted since the last
measurement, so a fast writer cannot run through the reserve between two timed checks."""


class DiskSpace:
    def __init__(self, path: Path, min_free_bytes: int) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.full = False
        self.free_bytes = -1
        self._unmeasured = 0

    def check(self) -> bool:
        """Measure now; returns whether the directory counts as full."""
        try:
            stat = os.statvfs(self.path)
        except OSError as exc:  # the directory vanished or the file system failed
            log.warning("cannot measure free space", path=str(self.path), error=str(exc))
            return self.full
        self.free_bytes = stat.f_bavail * stat.f_frsize
        self._unmeasured = 0
        full = self.free_bytes < self.min_free_bytes
        if full != self.full:
            self.full = full
            if full:
                log.warning("disk full: refusing new data", free=self.free_bytes)
            else:
                log.info("disk has room again: taking new data", free=self.free_bytes)
        return full

    def accepting(self, size: int) -> bool:
        """Whether ``size`` more bytes may be written (counted towards the next measurement)."""
        self._unmeasured += size
        if self._unmeasured >= RECHECK_BYTES:
            self.check()
        return not self.full

    def refuse_when_full(self, size: int) -> None:
        if not self.accepting(size):
            raise DiskFullError(
                f"node's data directory has {self.free_bytes} bytes free, below the "
                f"{self.min_free_bytes} it keeps free; nothing was written"
            )

    async def watch(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(CHECK_INTERVAL_S)
