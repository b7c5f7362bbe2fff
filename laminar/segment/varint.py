"""Zigzag varints (Kafka/protobuf style) used inside record batches.

Encoding keeps a table of the encodings of small values, because record lengths, deltas and
key/value lengths are nearly always small and a table lookup is far cheaper than a Python loop.
"""

from __future__ import annotations

from laminar.errors import CorruptBatchError

_SMALL_MIN = -1
_SMALL_MAX = 1 << 14  # covers key/value lengths up to 16 KiB and every small delta


def _encode_slow(value: int) -> bytes:
    zz = (value << 1) ^ (value >> 63)
    zz &= (1 << 64) - 1
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


_TABLE: tuple[bytes, ...] = tuple(_encode_slow(v) for v in range(_SMALL_MIN, _SMALL_MAX))


def encode(value: int) -> bytes:
    """Zigzag varint of a signed 64-bit value."""
    if _SMALL_MIN <= value < _SMALL_MAX:
        return _TABLE[value - _SMALL_MIN]
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{value} does not fit a varlong")
    return _encode_slow(value)


def decode(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read one zigzag varint at ``pos`` (not past ``end``); returns (value, next position)."""
    if pos >= end:
        raise CorruptBatchError("record truncated inside a varint")
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise CorruptBatchError("record truncated inside a varint")
        if shift > 63:
            raise CorruptBatchError("varint longer than 10 bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    result &= (1 << 64) - 1
    return (result >> 1) ^ -(result & 1), pos
