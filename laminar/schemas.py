"""The one place Cap'n Proto schemas are loaded.

pycapnp aborts the process when one schema ID is loaded twice, so every module gets its schema
through ``load(name)``, which loads ``laminar/schema/<name>.capnp`` exactly once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import capnp  # type: ignore[import-untyped]

SCHEMA_DIR = Path(__file__).parent / "schema"

capnp.remove_import_hook()

READ_ERRORS: tuple[type[Exception], ...] = (capnp.KjException, UnicodeDecodeError)
"""What reading a field of a malformed message raises. ``from_bytes`` only checks the root, so
a bad pointer or invalid UTF-8 in a Text field surfaces when (and only if) the field is read."""


@functools.cache
def load(name: str) -> Any:
    """Return the loaded schema module for laminar/schema/<name>.capnp."""
    return capnp.load(str(SCHEMA_DIR / f"{name}.capnp"))


def to_bytes(builder: Any) -> bytes:
    """Unpacked encoding (never packed: packed decoding of corrupt input aborts the process)."""
    return builder.to_bytes()


def aligned(buf: bytes | bytearray | memoryview) -> bytes:
    """pycapnp's from_bytes needs an 8-byte-aligned buffer; a fresh bytes object is one."""
    return bytes(buf)
