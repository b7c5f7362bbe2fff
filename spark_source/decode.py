"""Record batch bytes -> Arrow record batches with the source's exact schema.

This is the executor's hot path. One Python pass over the records finds each record's key and
value span, offset and timestamp (zigzag varints, with an inline fast path for one-byte
varints); Arrow then gathers the key and value bytes in C++ (a list-view over the fetched
buffer, flattened), so no per-record ``bytes`` objects are created. The batch layout is the one
in laminar/segment/batch.py (docs/FORMAT.md): a 68-byte header, then Kafka-v2-style records.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from typing import NamedTuple

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from laminar.errors import CorruptBatchError
from laminar.segment.batch import ATTR_COMPRESSION_MASK as _ATTR_COMPRESSION
from laminar.segment.batch import ATTR_CONTROL as _ATTR_CONTROL
from laminar.segment.batch import CRC_START as _CRC_START
from laminar.segment.batch import HEADER_SIZE
from laminar.segment.batch import MAGIC as _MAGIC
from spark_source.schema import TIMESTAMP_TYPE_CREATE_TIME

# base_offset, term, batch_length, crc, magic, reserved, attributes, last_offset_delta,
# first_timestamp, max_timestamp, producer_id, producer_epoch, reserved, base_sequence,
# record_count
_HEADER = struct.Struct("<qqiIBBHiqqqhHii")
assert _HEADER.size == HEADER_SIZE

_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_CREATE_TIME = pa.scalar(TIMESTAMP_TYPE_CREATE_TIME, pa.int32())


class BatchSpan(NamedTuple):
    """Where one whole batch sits in a fetched buffer, and the offsets it covers."""

    position: int
    length: int
    base_offset: int
    last_offset: int
    first_timestamp: int
    record_count: int
    control: bool


def iter_spans(buf: bytes | memoryview) -> Iterator[BatchSpan]:
    """Walk the whole batches of a fetched buffer, verifying each one's crc32c.

    A partial trailing batch (a fetch may end mid-batch) ends the walk; a batch that is
    malformed or fails its crc raises CorruptBatchError naming its offset.
    """
    size = len(buf)
    position = 0
    while size - position >= HEADER_SIZE:
        (
            base_offset,
            _term,
            length,
            crc,
            magic,
            _reserved,
            attributes,
            last_delta,
            first_ts,
            _max_ts,
            _pid,
            _epoch,
            _reserved2,
            _seq,
            count,
        ) = _HEADER.unpack_from(buf, position)
        if length < HEADER_SIZE or magic != _MAGIC:
            raise CorruptBatchError(
                f"malformed batch at offset {base_offset} (length {length}, magic {magic})"
            )
        if size - position < length:
            return
        if crc32c.crc32c(buf[position + _CRC_START : position + length]) != crc:
            raise CorruptBatchError(f"crc32c mismatch in the batch at offset {base_offset}")
        if attributes & _ATTR_COMPRESSION:
            raise CorruptBatchError(
                f"batch at offset {base_offset} uses compression codec "
                f"{attributes & _ATTR_COMPRESSION}, which this reader does not support"
            )
        yield BatchSpan(
            position,
            length,
            base_offset,
            base_offset + last_delta,
            first_ts,
            count,
            bool(attributes & _ATTR_CONTROL),
        )
        position += length


class Walked(NamedTuple):
    following: int  # offset after the last whole batch (the start offset if none)
    largest_batch: int  # bytes of the largest whole batch seen (0 if none)


def offset_after(buf: bytes | memoryview, offset: int) -> Walked:
    """Where the whole batches in ``buf`` end, from batch headers only (no crc, no records):
    enough to send the next fetch before decoding this one."""
    size = len(buf)
    position = 0
    following = offset
    largest = 0
    while size - position >= HEADER_SIZE:
        base_offset, _, length = _PREFIX.unpack_from(buf, position)
        if length < HEADER_SIZE or size - position < length:
            break
        (last_delta,) = _LAST_DELTA.unpack_from(buf, position + 28)
        following = max(following, base_offset + last_delta + 1)
        largest = max(largest, length)
        position += length
    return Walked(following, largest)


_PREFIX = struct.Struct("<qqi")
_LAST_DELTA = struct.Struct("<i")


def _varint(buf: bytes, p: int) -> tuple[int, int]:
    """Slow path: a zigzag varint of any length at p -> (value, next position)."""
    result = 0
    shift = 0
    while True:
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
        if shift > 63:
            raise CorruptBatchError(f"varint too long at byte {p}")


_MIN_RUN = 16
"""Shortest run of same-size records worth locating with Arrow kernels instead of a loop."""


def _hop(buf: bytes, p: int, count: int, bounds: _Bounds) -> int:
    """Walk ``count`` records from byte ``p`` (each becomes a segment of one); returns the
    position after the last one. The per-record loop of the decoder."""
    firsts = bounds.firsts.append
    sizes = bounds.sizes.append
    counts = bounds.counts.append
    lengths = bounds.lengths.append
    for _ in range(count):
        b = buf[p]
        if b < 0x80:  # one-byte zigzag length (a length is never negative)
            length = b >> 1
            p += 1
        else:
            c = buf[p + 1]
            if c < 0x80:
                length = ((b & 0x7F) | (c << 7)) >> 1
                p += 2
            else:
                length, p = _varint(buf, p)
                if length < 0:
                    raise CorruptBatchError(f"negative record length at byte {p}")
        firsts(p)
        sizes(0)
        counts(1)
        lengths(length)
        p += length
    return p


def _same_size_run(buf: bytes, p: int, limit: int, most: int) -> tuple[int, int, int, int]:
    """How many records from ``p`` on have the same size as the one at ``p``.

    Records of one producer batch mostly share a size, changing only where a varint grows
    (offset delta 64, 8192, ...). If the record at p + k*size starts with the same length
    varint for every k < run, those are exactly the boundaries a loop would find. The check
    runs in C: a strided slice picks the k-th byte of every candidate record, and ``lstrip``
    finds the first one that differs. Returns (run, size, varint width, length).
    """
    length, body = _varint(buf, p)
    width = body - p
    size = width + length
    if length < 0 or size <= 0:
        raise CorruptBatchError(f"bad record length {length} at byte {p}")
    fits = min(most, (limit - p) // size)
    if fits < _MIN_RUN:
        return 0, size, width, length
    run = fits
    stop = p + fits * size
    for i in range(width):
        column = bytes(buf[p + i : stop : size])
        same = len(column) - len(column.lstrip(bytes(buf[p + i : p + i + 1])))
        run = min(run, same)
    return (run if run >= _MIN_RUN else 0), size, width, length


class _Bounds:
    """Record body starts and ends for a whole fetch, as segments in record order.

    A segment is ``count`` records of one size: body k starts at first + k * size and ends
    ``length`` bytes later. A run of same-size records is one segment; a record walked in
    Python is a segment of one. Arrow expands all segments at once, so the common case
    creates no Python object per record.
    """

    def __init__(self) -> None:
        self.firsts = array("i")
        self.sizes = array("i")
        self.counts = array("i")
        self.lengths = array("i")

    def add_run(self, first_body: int, size: int, count: int, length: int) -> None:
        self.firsts.append(first_body)
        self.sizes.append(size)
        self.counts.append(count)
        self.lengths.append(length)

    def arrays(self, n: int) -> tuple[pa.Array, pa.Array]:
        """(body starts, record ends) of the ``n`` records, in order."""
        segments = len(self.counts)

        def column(values: array) -> pa.Array:
            return pa.Array.from_buffers(pa.int32(), segments, [None, pa.py_buffer(values)])

        counts = column(self.counts)
        starts = pc.cumulative_sum(counts)  # exclusive end of each segment, in records
        offsets = pa.concat_arrays([pa.array([0], pa.int32()), starts])
        owner = pc.list_parent_indices(pa.ListArray.from_arrays(offsets, pa.nulls(n, pa.int8())))
        segment_start = pc.subtract(starts, counts)
        within = pc.subtract(_RAMPS.ramp(n), pc.take(segment_start, owner))
        bodies = pc.add(
            pc.take(column(self.firsts), owner),
            pc.multiply(within, pc.take(column(self.sizes), owner)),
        )
        ends = pc.add(bodies, pc.take(column(self.lengths), owner))
        return bodies.cast(pa.int32()), ends.cast(pa.int32())


def _boundaries(buf: bytes, span: BatchSpan, bounds: _Bounds) -> None:
    """Note where each record of one batch has its body and where it ends.

    Runs of same-size records are found by C-level byte scans; the rest is walked in Python,
    in stretches that grow after each failed attempt, so batches of all-different sizes cost
    little more than a plain loop.
    """
    p = span.position + HEADER_SIZE
    limit = span.position + span.length
    left = span.record_count
    stretch = 32
    while left > 0:
        run, size, width, length = _same_size_run(buf, p, limit, left)
        if run:
            bounds.add_run(p + width, size, run, length)
            p += run * size
            left -= run
            stretch = 32
            continue
        count = min(left, stretch)
        p = _hop(buf, p, count, bounds)
        left -= count
        stretch = min(2 * stretch, 256)
        if p > limit:
            break
    if p != limit:
        raise CorruptBatchError(
            f"records of the batch at offset {span.base_offset} do not fill it "
            f"({p - span.position} of {span.length} bytes)"
        )


# Typed scalars everywhere: a bare Python int makes pyarrow.compute try (slow, failing)
# imports of optional modules on every call.
_ZERO64 = pa.scalar(0, pa.int64())
_ONE32 = pa.scalar(1, pa.int32())
_THOUSAND64 = pa.scalar(1000, pa.int64())
_U7 = pa.scalar(0x7F, pa.int64())
_HIGH = pa.scalar(0x80, pa.int64())


def _varints(data: pa.Array, pos: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Decode one zigzag varint at every position at once -> (int64 values, next positions)."""
    acc: pa.Array | None = None
    active: pa.Array | None = None
    for k in range(10):
        byte = pc.take(data, pos).cast(pa.int64())
        low = pc.bit_wise_and(byte, _U7)
        if k:
            low = pc.shift_left(low, pa.scalar(7 * k, pa.int64()))
        if active is not None:
            low = pc.multiply(low, active)
        acc = low if acc is None else pc.add(acc, low)
        more = pc.greater_equal(byte, _HIGH)
        if active is not None:
            more = pc.and_(more, pc.cast(active, pa.bool_()))
        step = more.cast(pa.int32())
        if not pc.any(more).as_py():
            pos = pc.add(pos, _ONE32) if active is None else pc.add(pos, active.cast(pa.int32()))
            break
        pos = pc.add(pos, _ONE32) if active is None else pc.add(pos, active.cast(pa.int32()))
        active = step.cast(pa.int64())
    else:
        raise CorruptBatchError("varint longer than 10 bytes")
    assert acc is not None
    value = pc.bit_wise_xor(
        pc.shift_right(acc, pa.scalar(1, pa.int64())),
        pc.negate(pc.bit_wise_and(acc, pa.scalar(1, pa.int64()))),
    )
    return value, pos


def _headers(buf: bytes, p: int, end: int, offset: int) -> list[tuple[str, bytes | None]]:
    """Decode one record's headers (only when the query asked for them)."""
    count, p = _varint(buf, p)
    out: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        n, p = _varint(buf, p)
        key = bytes(buf[p : p + n]).decode("utf-8", "replace")
        p += n
        n, p = _varint(buf, p)
        value = None if n < 0 else bytes(buf[p : p + n])
        if n > 0:
            p += n
        out.append((key, value))
    if p > end:
        raise CorruptBatchError(f"headers of the record at offset {offset} overrun it")
    return out


class _Ramps:
    """Cached 0, 1, 2, ... and True, False, True, ... arrays, sliced to the length needed."""

    def __init__(self) -> None:
        self._size = 0
        self._ramp = pa.array([], pa.int32())
        self._even = pa.array([], pa.bool_())

    def _grow(self, n: int) -> None:
        size = max(n, 2 * self._size, 65536)
        ones = pa.repeat(pa.scalar(1, pa.int32()), size)
        self._ramp = pc.subtract(pc.cumulative_sum(ones), pa.scalar(1, pa.int32()))
        self._even = pc.equal(pc.bit_wise_and(self._ramp, pa.scalar(1, pa.int32())), 0)
        self._size = size

    def ramp(self, n: int) -> pa.Array:
        if n > self._size:
            self._grow(n)
        return self._ramp.slice(0, n)

    def even(self, n: int) -> pa.Array:
        if n > self._size:
            self._grow(n)
        return self._even.slice(0, n)


_RAMPS = _Ramps()


def _binary(data: pa.Buffer, starts: pa.Array, lengths: pa.Array) -> pa.Array:
    """Binary column of the spans (start, length) of ``data``; length -1 means null.

    The spans are in order and do not overlap, so interleaving them with the gaps between
    them gives valid binary offsets over ``data`` itself; keeping every other element copies
    just the values, in C++.
    """
    n = len(starts)
    nulls = pc.less(lengths, _ZERO64)
    has_nulls = pc.any(nulls).as_py()
    sizes = (pc.max_element_wise(lengths, _ZERO64) if has_nulls else lengths).cast(pa.int32())
    validity = pc.invert(nulls).buffers()[1] if has_nulls else None
    if not pc.max(sizes).as_py():  # all null or empty (e.g. no keys): nothing to gather
        empty = [validity, pa.py_buffer(bytes(4 * (n + 1))), pa.py_buffer(b"")]
        return pa.Array.from_buffers(pa.binary(), n, empty)
    starts = starts.cast(pa.int32())
    ends = pc.add(starts, sizes)
    ramp = _RAMPS.ramp(2 * n)
    # element 2i is span i, element 2i+1 the gap after it: index i//2 + (i%2)*n of starts+ends
    pick = pc.add(
        pc.shift_right(ramp, pa.scalar(1, pa.int32())),
        pc.multiply(pc.bit_wise_and(ramp, pa.scalar(1, pa.int32())), pa.scalar(n, pa.int32())),
    )
    bounds = pc.take(pa.concat_arrays([starts, ends]), pick)
    bounds = pa.concat_arrays([bounds, ends.slice(n - 1)])
    both = pa.Array.from_buffers(pa.binary(), 2 * n, [None, bounds.buffers()[1], data])
    values = pc.filter(both, _RAMPS.even(2 * n))
    if validity is None:
        return values
    value_buffers = values.buffers()
    return pa.Array.from_buffers(pa.binary(), n, [validity, value_buffers[1], value_buffers[2]])


class DecodedChunk(NamedTuple):
    batch: pa.RecordBatch | None
    next_offset: int  # offset after the last whole batch walked (where to fetch next)


def decode_chunk(
    buf: bytes | memoryview,
    topic: str,
    partition: int,
    start: int,
    end: int,
    schema: pa.Schema,
) -> DecodedChunk:
    """Decode the records with offsets in [start, end) from a fetched buffer of whole batches.

    Control batches are skipped (they occupy offsets but carry no user records). ``schema`` is
    the Arrow schema Spark expects; headers are decoded only if it has a ``headers`` field.
    """
    raw = pa.py_buffer(buf)
    data = pa.Array.from_buffers(pa.uint8(), len(buf), [None, raw])
    bounds = _Bounds()
    bases = array("q")
    first_ts = array("q")
    next_offset = start
    for span in iter_spans(buf):
        if span.last_offset < start:
            next_offset = span.last_offset + 1
            continue
        if span.base_offset >= end:
            break
        if not span.control and span.record_count > 0:
            _boundaries(buf, span, bounds)
            bases.extend(array("q", [span.base_offset]) * span.record_count)
            first_ts.extend(array("q", [span.first_timestamp]) * span.record_count)
        next_offset = span.last_offset + 1
    n = len(bases)
    if n == 0:
        return DecodedChunk(None, next_offset)
    body_starts, record_ends = bounds.arrays(n)
    pos = pc.add(body_starts, _ONE32)
    try:
        ts_delta, pos = _varints(data, pos)
        offset_delta, pos = _varints(data, pos)
        key_len, pos = _varints(data, pos)
        key_start = pos
        pos = pc.add(pos, pc.max_element_wise(key_len, _ZERO64).cast(pa.int32()))
        value_len, pos = _varints(data, pos)
        value_start = pos
        pos = pc.add(pos, pc.max_element_wise(value_len, _ZERO64).cast(pa.int32()))
    except (IndexError, pa.ArrowIndexError) as exc:
        raise CorruptBatchError(f"a record overruns its batch: {exc}") from None
    if not pc.all(pc.less_equal(pos, record_ends)).as_py():
        raise CorruptBatchError(f"a record of {topic}/{partition} overruns its length")
    offsets = pc.add(
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(bases)]), offset_delta
    )
    millis = pc.add(pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(first_ts)]), ts_delta)
    arrays = [
        _binary(raw, key_start, key_len),
        _binary(raw, value_start, value_len),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        pc.multiply(millis, _THOUSAND64).view(_TIMESTAMP_TYPE),
        pa.repeat(_CREATE_TIME, n),
    ]
    if "headers" in schema.names:
        header_pos = pos.to_pylist()
        offset_list = offsets.to_pylist()
        end_list = record_ends.to_pylist()
        header_rows = [_headers(buf, header_pos[i], end_list[i], offset_list[i]) for i in range(n)]
        arrays.append(pa.array(header_rows, schema.field("headers").type))
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    first, last = offsets[0].as_py(), offsets[n - 1].as_py()
    if first < start or last >= end:  # offsets ascend: the wanted rows are one slice
        low = pc.sum(pc.less(offsets, pa.scalar(start, pa.int64()))).as_py() or 0
        high = pc.sum(pc.less(offsets, pa.scalar(end, pa.int64()))).as_py() or 0
        batch = batch.slice(low, high - low)
    return DecodedChunk(batch if batch.num_rows else None, next_offset)
