"""The partition's start marker: first retained offset and the term of the batch before it.

Written atomically before segments are deleted by retention (and around a reset), so after a
crash the log either still has those segments (and deletes them on open) or does not need them;
``term_at(start - 1)`` survives expiry, reset and restart through this file.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from laminar.errors import CorruptLogError
from laminar.segment.fileio import write_atomic

META_NAME = "start.meta"
_MAGIC = b"LMST"
_BODY = struct.Struct("<4sIqq")  # magic, version, start_offset, prev_term
_CRC = struct.Struct("<I")


def read_start(directory: Path) -> tuple[int, int] | None:
    """(start_offset, prev_term) or None when the log has never been expired or reset."""
    path = directory / META_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _BODY.size + _CRC.size:
        raise CorruptLogError(f"{path}: {len(data)} bytes, expected {_BODY.size + _CRC.size}")
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    if crc32c.crc32c(data[: _BODY.size]) != crc:
        raise CorruptLogError(f"{path}: crc32c mismatch")
    magic, version, start, prev_term = _BODY.unpack_from(data)
    if magic != _MAGIC or version != 1 or start < 0:
        raise CorruptLogError(f"{path}: not a start marker (magic {magic!r}, version {version})")
    return start, prev_term


def write_start(directory: Path, start: int, prev_term: int) -> None:
    body = _BODY.pack(_MAGIC, 1, start, prev_term)
    write_atomic(directory / META_NAME, body + _CRC.pack(crc32c.crc32c(body)))
