"""Kafka's record compression: the codecs of a batch's records section, and a bounded inflate.

A compressed batch keeps its 68-byte header as is and replaces the records that follow it by
their compressed bytes (attribute bits 0-2 name the codec, crc32c covers the compressed bytes).
Codes and stream formats are Kafka's exactly, so batches pass between laminar and Kafka clients
unchanged:

* 1 gzip: an RFC 1952 gzip stream (several members are read as one, as Java's reader does).
* 2 snappy: written with the xerial (snappy-java) framing the Java client writes: a 16-byte
  header (``\\x82SNAPPY\\x00``, version 1, compatible 1, big-endian), then blocks of at most
  32 KiB of input, each a big-endian int32 length and raw snappy. Read: that framing (any
  version fields) or one raw snappy block, which librdkafka writes. Every client reads both.
* 3 lz4: the LZ4 frame format with independent blocks (Kafka's readers decode each block on its
  own), 64 KiB blocks, block checksums, no content checksum, as aiokafka writes. Read: any
  frame (content size, checksums, 64 KiB - 4 MiB blocks).
* 4 zstd: a zstd frame. Read: any number of frames, content size known or not.

cramjam implements snappy, lz4 and zstd; gzip uses the standard library's zlib, which can stop
inflating at a given output size. Decompression is bounded (``MAX_DECOMPRESSED_BYTES`` by
default): snappy and gzip stop at the limit, lz4 and zstd frames are walked first (block by
block) for an upper bound of what they can produce, so a decompression bomb fails with
``DecompressionLimitError`` before any memory is spent on it. Any other failure is a
``CorruptBatchError``.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from laminar.errors import (
    CorruptBatchError,
    DecompressionLimitError,
    LaminarError,
    UnsupportedCompressionError,
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS: dict[str, int] = {"gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
NAMES: dict[int, str] = {code: name for name, code in CODECS.items()}

MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""Most bytes a reader inflates one batch's records to: 16x the node's default 4 MiB batch
limit. A producer's batch is far smaller; anything beyond is refused as a decompression bomb."""

DEFAULT_LEVELS: dict[int, int | None] = {GZIP: 6, SNAPPY: None, LZ4: 1, ZSTD: 3}
"""gzip and zstd at the zlib/zstd defaults (Kafka's too); lz4 at its fast level (cramjam's own
default, 4, is LZ4-HC at a twelfth of the speed for 6% smaller output)."""

LEVEL_RANGES: dict[int, tuple[int, int]] = {GZIP: (0, 9), LZ4: (0, 16), ZSTD: (-7, 22)}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024
_BE_INT = struct.Struct(">i")
_LE_U32 = struct.Struct("<I")

_LZ4_MAGIC = 0x184D2204
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK = 0xFFFFFFF0
_SKIPPABLE = 0x184D2A50  # skippable frames, shared by lz4 and zstd
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
_ZSTD_BLOCK_MAX = 128 << 10


def codec_of(name: str | None) -> int:
    """The codec code for a producer option (None or "none": no compression)."""
    if name is None or name == "none":
        return NONE
    code = CODECS.get(name) if isinstance(name, str) else None
    if code is None:
        raise UnsupportedCompressionError(
            f"compression must be one of none, {', '.join(CODECS)}; not {name!r}"
        )
    return code


def check_level(codec: int, level: int | None) -> int | None:
    """``level`` checked for ``codec`` (None: the codec's default)."""
    if level is None:
        return DEFAULT_LEVELS.get(codec)
    if codec not in LEVEL_RANGES:
        raise UnsupportedCompressionError(f"{NAMES.get(codec, 'none')} takes no level")
    low, high = LEVEL_RANGES[codec]
    if not isinstance(level, int) or not low <= level <= high:
        raise UnsupportedCompressionError(
            f"{NAMES[codec]} level must be an int in [{low}, {high}], not {level!r}"
        )
    return level


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """``data`` compressed with ``codec`` in Kafka's stream format for it."""
    if level is None:
        level = DEFAULT_LEVELS.get(codec)
    if codec == GZIP:
        return zlib.compress(data, 6 if level is None else level, wbits=31)
    if codec == SNAPPY:
        view = memoryview(data)
        parts: list[bytes | cramjam.Buffer] = [XERIAL_HEADER]
        for at in range(0, len(view), XERIAL_BLOCK):
            block = cramjam.snappy.compress_raw(view[at : at + XERIAL_BLOCK])
            parts.append(_BE_INT.pack(len(block)))
            parts.append(block)
        return b"".join(parts)
    if codec == LZ4:
        compressor = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise UnsupportedCompressionError(f"compression codec {codec} is not supported")


def decompress(
    codec: int, data: bytes | bytearray | memoryview, limit: int = MAX_DECOMPRESSED_BYTES
) -> bytes:
    """``data`` (one batch's compressed records) inflated: at most ``limit`` bytes, else
    DecompressionLimitError; CorruptBatchError if it does not decompress."""
    name = NAMES.get(codec)
    if name is None:
        raise CorruptBatchError(f"compression codec {codec} is not supported")
    try:
        if codec == GZIP:
            out = _gunzip(data, limit)
        elif codec == SNAPPY:
            out = _unsnappy(memoryview(data), limit)
        elif codec == LZ4:
            _bounded(_lz4_bound(memoryview(data), limit), limit, name)
            out = bytes(cramjam.lz4.decompress(data))
        else:
            _bounded(_zstd_bound(memoryview(data), limit), limit, name)
            out = bytes(cramjam.zstd.decompress(data))
    except LaminarError:
        raise
    except Exception as exc:  # cramjam.DecompressionError, zlib.error, struct.error, ...
        raise CorruptBatchError(f"{name} records do not decompress: {exc}") from None
    _bounded(len(out), limit, name)
    return out


def _bounded(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise DecompressionLimitError(
            f"{name} records would inflate to more than {limit} bytes (at most {size})"
        )


def _gunzip(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: bytes | bytearray | memoryview = data
    while True:
        inflater = zlib.decompressobj(wbits=47)  # gzip (or zlib) header, detected
        chunk = inflater.decompress(rest, limit + 1 - total)
        total += len(chunk)
        parts.append(chunk)
        _bounded(total, limit, "gzip")
        if not inflater.eof:
            raise CorruptBatchError("gzip records are truncated")
        rest = inflater.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _unsnappy(view: memoryview, limit: int) -> bytes:
    if len(view) > 16 and view[:8] == XERIAL_MAGIC:
        # Version and compatible fields are not checked: some writers get their byte order wrong.
        blocks: list[memoryview] = []
        total = 0
        at, end = 16, len(view)
        while at < end:
            if end - at < 4:
                raise CorruptBatchError("snappy block length is truncated")
            (size,) = _BE_INT.unpack_from(view, at)
            at += 4
            if size < 0 or at + size > end:
                raise CorruptBatchError(f"snappy block of {size} bytes runs past the records")
            block = view[at : at + size]
            at += size
            total += cramjam.snappy.decompress_raw_len(block)
            _bounded(total, limit, "snappy")
            blocks.append(block)
        return b"".join(cramjam.snappy.decompress_raw(block) for block in blocks)
    _bounded(cramjam.snappy.decompress_raw_len(view), limit, "snappy")
    return bytes(cramjam.snappy.decompress_raw(view))


def _skippable(view: memoryview, at: int) -> int | None:
    """The position after a skippable frame at ``at``, or None if there is none."""
    if _LE_U32.unpack_from(view, at)[0] & _SKIPPABLE_MASK != _SKIPPABLE:
        return None
    return at + 8 + _LE_U32.unpack_from(view, at + 4)[0]


def _lz4_bound(view: memoryview, limit: int) -> int:
    """The most bytes the LZ4 frames in ``view`` can inflate to, from their block sizes."""
    end = len(view)
    at = 0
    bound = 0
    while at < end:
        skipped = _skippable(view, at)
        if skipped is not None:
            at = skipped
            continue
        if _LE_U32.unpack_from(view, at)[0] != _LZ4_MAGIC:
            raise CorruptBatchError("lz4 records are not an LZ4 frame")
        flags, descriptor = view[at + 4], view[at + 5]
        block_max = _LZ4_BLOCK_MAX.get(descriptor >> 4 & 7)
        if flags >> 6 != 1 or block_max is None:
            raise CorruptBatchError("lz4 frame descriptor is invalid")
        if flags & 0x08:  # content size: a decoder may size its output by it
            _bounded(struct.unpack_from("<Q", view, at + 6)[0], limit, "lz4")
        at += 7 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
        block_checksum = 4 if flags & 0x10 else 0
        while True:
            (size,) = _LE_U32.unpack_from(view, at)
            at += 4
            if size == 0:
                break
            if size & 0x80000000:  # stored uncompressed
                size &= 0x7FFFFFFF
                bound += size
            else:  # an LZ4 sequence turns one input byte into at most 255 output bytes
                bound += min(block_max, 255 * size + 64)
            at += size + block_checksum
        at += 4 if flags & 0x04 else 0
    if at != end:
        raise CorruptBatchError("lz4 frame is truncated")
    return bound


def _zstd_bound(view: memoryview, limit: int) -> int:
    """The most bytes the zstd frames in ``view`` can inflate to, from their block headers."""
    end = len(view)
    at = 0
    bound = 0
    while at < end:
        skipped = _skippable(view, at)
        if skipped is not None:
            at = skipped
            continue
        if _LE_U32.unpack_from(view, at)[0] != _ZSTD_MAGIC:
            raise CorruptBatchError("zstd records are not a zstd frame")
        descriptor = view[at + 4]
        at += 5
        if descriptor & 0x08:
            raise CorruptBatchError("zstd frame header sets a reserved bit")
        single_segment = descriptor & 0x20
        if not single_segment:
            window_log = 10 + (view[at] >> 3)
            at += 1
            # The decoder allocates the window: one beyond the limit is refused up front.
            _bounded(1 << window_log, max(limit, 8 << 20), "zstd")
        at += (0, 1, 2, 4)[descriptor & 3]  # dictionary id
        size_bytes = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
        if size_bytes:  # content size: a decoder sizes its buffers by it
            content = int.from_bytes(view[at : at + size_bytes], "little")
            _bounded(content + 256 if size_bytes == 2 else content, limit, "zstd")
        at += size_bytes
        while True:
            if at + 3 > end:
                raise CorruptBatchError("zstd frame is truncated")
            header = view[at] | view[at + 1] << 8 | view[at + 2] << 16
            at += 3
            kind, size = header >> 1 & 3, header >> 3
            if kind == 0:  # raw
                bound += size
                at += size
            elif kind == 1:  # run of one byte
                bound += size
                at += 1
            elif kind == 2:  # compressed: at most one block's worth
                bound += _ZSTD_BLOCK_MAX
                at += size
            else:
                raise CorruptBatchError("zstd block type is reserved")
            if header & 1:
                break
        at += 4 if descriptor & 0x04 else 0
    if at != end:
        raise CorruptBatchError("zstd frame is truncated")
    return bound
