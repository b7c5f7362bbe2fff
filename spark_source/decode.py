"""Record batch bytes -> Arrow record batches with the source's exact schema.

This is the executor's hot path, so it avoids Python work per record where the data allows.
A producer's batch is mostly long runs of records that share one layout: the same size, the
same varint widths, the same key and value lengths, no headers. The layout changes only where
a varint grows (offset delta 64, a timestamp delta past 63 ms, ...). Each field of a run is a
strided numpy view of the fetched buffer, one element per record, so the run's offsets,
timestamps and values come from a few vectorised operations whatever its length. A batch that
does not split into long runs
(values of many sizes, headers) is decoded by the log's own record parser,
``laminar.segment.batch.decode_into``, which the client library uses too.

The batch layout is in docs/FORMAT.md: a 68-byte header, then Kafka-v2-style records. A
compressed batch is first inflated into an uncompressed copy (``batch.decompressed``), which
then takes the same paths.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from laminar.errors import CorruptBatchError
from laminar.segment import varint
from laminar.segment.batch import (
    HEADER_SIZE,
    MIN_RECORD_SIZE,
    BatchHeader,
    decode_into,
    decompressed,
    is_control,
    iter_batches,
    verify_batch,
)
from spark_source.schema import TIMESTAMP_TYPE_CREATE_TIME

MIN_RUN = 16
"""Fewer records than this in a run (other than a batch's last) send the batch to the record
parser: the vectorised path costs about as much per run as the parser does per record."""

_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_U7 = np.uint64(0x7F)
_U1 = np.uint64(1)


def iter_whole_batches(buf: bytes | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch in a fetched buffer, each one verified (crc32c,
    header fields); a partial trailing batch (a fetch may end mid-batch) ends the walk."""
    view = memoryview(buf)
    for position, header in iter_batches(view):
        try:
            verify_batch(view[position : position + header.batch_length])
        except CorruptBatchError as exc:
            raise CorruptBatchError(f"{exc}, in the batch at offset {header.base_offset}") from None
        yield position, header


class Walked(NamedTuple):
    following: int  # offset after the last whole batch (the start offset if none)
    largest_batch: int  # bytes of the largest whole batch seen (0 if none)


_PREFIX = struct.Struct("<qqi")
_LAST_DELTA = struct.Struct("<i")


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


class _Layout(NamedTuple):
    """Where the fields of one record sit, relative to its first byte."""

    size: int  # whole record, length varint included
    timestamp_at: int
    timestamp_width: int
    offset_at: int
    offset_width: int
    key_at: int
    key_length: int  # -1: null
    value_at: int
    value_length: int  # -1: null
    offset_delta: int  # the first record's (where the offset varint's width may change)
    words: tuple[tuple[int, int, int], ...]
    """(position, mask, bits): a record shares this layout if the 8 bytes at each position,
    read as a little-endian word and masked, equal the first record's bits there."""
    numpy_words: tuple[tuple[int, np.uint64, np.uint64], ...]

    def matches(self, buf: memoryview, p: int, limit: int) -> bool:
        """Whether the record at p has this layout (checked one record at a time in Python)."""
        if p + self.size > limit:
            return False
        for at, mask, bits in self.words:
            if int.from_bytes(buf[p + at : p + at + 8], "little") & mask != bits:
                return False
        return True


def _layout(buf: memoryview, p: int, limit: int) -> _Layout | None:
    """The layout of the record at p, if it can head a run: no headers, sane lengths. None
    otherwise (the record parser then decodes the batch, and names any defect)."""
    try:
        length, q = varint.decode(buf, p, limit)
        size = q - p + length
        if length < MIN_RECORD_SIZE - 1 or p + size > limit:
            return None
        length_end = q - p
        timestamp_at = length_end + 1  # after the attributes byte (not interpreted)
        _, q = varint.decode(buf, p + timestamp_at, limit)
        offset_at = q - p
        offset_delta, q = varint.decode(buf, q, limit)
        offset_end = q - p
        key_length, q = varint.decode(buf, q, limit)
        key_at = q - p
        key_end = key_at + max(key_length, 0)
        value_length, q = varint.decode(buf, p + key_end, limit)
        value_at = q - p
    except CorruptBatchError:  # a varint runs past the batch or is too long
        return None
    if key_length < -1 or value_length < -1 or value_at + max(value_length, 0) != size - 1:
        return None
    if buf[p + size - 1] != 0 or size < 8:  # a run's records have no headers
        return None
    # Records share the layout if these bits match: the record, key and value length varints
    # and the header count whole, the two delta varints in their continuation bits.
    mask = bytearray(size)
    mask[timestamp_at:offset_end] = b"\x80" * (offset_end - timestamp_at)
    for begin, stop in ((0, length_end), (offset_end, key_at), (key_end, value_at)):
        mask[begin:stop] = b"\xff" * (stop - begin)
    mask[size - 1] = 0xFF
    words = []
    at = 0
    while tail := mask[at:].lstrip(b"\x00"):
        at = min(size - len(tail), size - 8)  # a word never reaches past its record
        word_mask = int.from_bytes(mask[at : at + 8], "little")
        bits = int.from_bytes(buf[p + at : p + at + 8], "little") & word_mask
        words.append((at, word_mask, bits))
        at += 8
    return _Layout(
        size,
        timestamp_at,
        offset_at - timestamp_at,
        offset_at,
        offset_end - offset_at,
        key_at,
        key_length,
        value_at,
        value_length,
        offset_delta,
        tuple(words),
        tuple((at, np.uint64(mask), np.uint64(bits)) for at, mask, bits in words),
    )


def _table(width: int) -> np.ndarray:
    """Decoded values of every ``width``-byte zigzag varint, indexed by its bytes read as a
    little-endian integer (the last byte is below 0x80, so that index is below 2**(8w-1))."""
    raw = np.arange(1 << (8 * width - 1), dtype=np.int64)
    value = np.zeros_like(raw)
    for j in range(width):
        value |= ((raw >> (8 * j)) & 0x7F) << (7 * j)
    return (value >> 1) ^ -(value & 1)


_TABLES = {1: _table(1), 2: _table(2)}
"""One- and two-byte varints (nearly all deltas) decode with one table lookup per record."""


class _Run(NamedTuple):
    """``count`` records of one layout, from byte ``position`` on."""

    position: int
    count: int
    layout: _Layout

    def column(self, buf: memoryview, at: int, dtype: str = "u1") -> np.ndarray:
        """The field at ``at`` of every record, as a strided view of the buffer (no copy)."""
        return np.ndarray((self.count,), dtype, buf, self.position + at, (self.layout.size,))

    def varints(self, buf: memoryview, at: int, width: int) -> np.ndarray:
        """The zigzag varint of ``width`` bytes at ``at`` of every record -> int64."""
        table = _TABLES.get(width)
        if table is not None:
            return table.take(self.column(buf, at, "<u2" if width == 2 else "u1"))
        value = np.zeros(self.count, np.uint64)
        for j in range(width):
            value |= (self.column(buf, at + j).astype(np.uint64) & _U7) << np.uint64(7 * j)
        return (value >> _U1).view(np.int64) ^ -(value & _U1).view(np.int64)

    def matching(self, buf: memoryview, begin: int, stop: int) -> int:
        """How many records from ``begin`` on (and before ``stop``) share the layout."""
        size = self.layout.size
        differs = np.zeros(stop - begin, np.bool_)
        for at, mask, bits in self.layout.numpy_words:
            word = np.ndarray(
                (stop - begin,), "<u8", buf, self.position + begin * size + at, (size,)
            )
            differs |= (word & mask) != bits
        first = int(differs.argmax())
        return first if differs[first] else stop - begin


KNOWN_LAYOUTS = 8
"""Layouts remembered while decoding a fetch: a producer's batches repeat two or three."""

_WIDTH_LIMITS = (64, 8192, 1 << 20, 1 << 27)
"""Offset deltas at which a zigzag varint grows a byte: where a run most likely ends."""


def _run_at(buf: memoryview, p: int, limit: int, most: int, known: list[_Layout]) -> _Run | None:
    """The longest run of at most ``most`` records from p on; None if the record at p cannot
    head one. ``known`` holds the layouts seen lately (consecutive batches repeat them)."""
    layout = next((seen for seen in known if seen.matches(buf, p, limit)), None)
    if layout is None:
        layout = _layout(buf, p, limit)
        if layout is None:
            return None
        known.insert(0, layout)
        del known[KNOWN_LAYOUTS:]
    fits = min(most, (limit - p) // layout.size)
    run = _Run(p, fits, layout)
    # Check up to one record past where the offset varint would grow (deltas usually count
    # up by one), then the rest only if the run really goes on.
    grows = next((n for n in _WIDTH_LIMITS if n > layout.offset_delta), fits)
    probe = min(fits, grows - layout.offset_delta + 1)
    count = run.matching(buf, 0, probe)
    if count == probe < fits:
        count += run.matching(buf, probe, fits)
    return run._replace(count=count)


def _split_runs(buf: memoryview, position: int, h: BatchHeader, known: list[_Layout]) -> list[_Run]:
    """The runs of one batch's records, or [] if the batch is better left to the parser."""
    p = position + HEADER_SIZE
    limit = position + h.batch_length
    left = h.record_count
    if left < MIN_RUN:
        return []
    runs: list[_Run] = []
    while left:
        run = _run_at(buf, p, limit, left, known)
        if run is None or (run.count < MIN_RUN and run.count < left):
            return []
        runs.append(run)
        p += run.count * run.layout.size
        left -= run.count
    return runs if p == limit else []


class _Binary:
    """A binary column assembled from pieces in row order, each value copied once."""

    def __init__(self) -> None:
        # (rows, width, values): ``rows`` values of ``width`` bytes (-1: nulls) in a strided
        # "S<width>" view (None if width < 1), or width None and a list of values
        self._pieces: list[tuple[int, int | None, np.ndarray | list[bytes | None] | None]] = []

    def add_run(self, rows: int, width: int, values: np.ndarray | None) -> None:
        self._pieces.append((rows, width, values))

    def add_list(self, values: list[bytes | None]) -> None:
        self._pieces.append((len(values), None, values))

    def array(self) -> pa.Array:
        """The column, built in buffers from Arrow's pool (fresh memory faults per page)."""
        pieces = self._pieces
        n = sum(rows for rows, _, _ in pieces)
        if all(width == -1 for _, width, _ in pieces):
            return pa.nulls(n, pa.binary())
        sizes = [
            [0 if v is None else len(v) for v in values] if width is None else None
            for _, width, values in pieces
        ]
        total = sum(
            sum(listed) if listed is not None else rows * max(width or 0, 0)
            for (rows, width, _), listed in zip(pieces, sizes, strict=True)
        )
        if total >= 2**31:
            raise ValueError(f"{total} bytes of keys or values do not fit one Arrow batch")
        offsets_buffer = pa.allocate_buffer(4 * (n + 1))
        offsets = np.frombuffer(offsets_buffer, np.int32)
        offsets[0] = 0
        buffer = pa.allocate_buffer(total)
        data = np.frombuffer(buffer, np.uint8)
        valid = np.ones(n, np.bool_) if any(_has_nulls(p) for p in pieces) else None
        r = 0
        for (rows, width, values), listed in zip(pieces, sizes, strict=True):
            start = int(offsets[r])
            ends = offsets[r + 1 : r + rows + 1]
            if listed is not None:  # a parsed batch's values, one by one
                assert isinstance(values, list)
                np.cumsum(listed, out=ends)
                ends += start
                data[start : ends[-1]] = np.frombuffer(b"".join(v for v in values if v), np.uint8)
                if valid is not None:
                    valid[r : r + rows] = [v is not None for v in values]
            else:  # a run's: ``rows`` values of ``width`` bytes, copied in one go
                assert width is not None
                np.multiply(_ramp(rows), max(width, 0), out=ends)
                ends += start
                if isinstance(values, np.ndarray):
                    data[start : ends[-1]].view(values.dtype)[...] = values
                if valid is not None and width == -1:
                    valid[r : r + rows] = False
            r += rows
        bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(pa.binary(), n, [bitmap, offsets_buffer, buffer])


def _has_nulls(piece: tuple[int, int | None, np.ndarray | list[bytes | None] | None]) -> bool:
    _, width, values = piece
    return width == -1 or (width is None and None in values)  # type: ignore[operator]


_ramps = np.arange(1, 1 << 16, dtype=np.int32)


def _ramp(count: int) -> np.ndarray:
    """1, 2, ..., count (a view of one cached array, grown when needed)."""
    global _ramps
    if count > len(_ramps):
        _ramps = np.arange(1, 2 * count + 1, dtype=np.int32)
    return _ramps[:count]


class _Columns:
    """The rows of one fetched chunk, as pieces in offset order."""

    def __init__(self, with_headers: bool) -> None:
        self.offsets: list[np.ndarray] = []
        self.millis: list[np.ndarray] = []
        self.keys = _Binary()
        self.values = _Binary()
        self.headers: list[list[tuple[str, bytes | None]]] | None = [] if with_headers else None

    def add_run(self, buf: memoryview, run: _Run, h: BatchHeader) -> None:
        layout = run.layout
        offsets = run.varints(buf, layout.offset_at, layout.offset_width)
        offsets += h.base_offset
        self.offsets.append(offsets)
        millis = run.varints(buf, layout.timestamp_at, layout.timestamp_width)
        millis += h.first_timestamp
        self.millis.append(millis)
        for column, at, length in (
            (self.keys, layout.key_at, layout.key_length),
            (self.values, layout.value_at, layout.value_length),
        ):
            values = run.column(buf, at, f"S{length}") if length > 0 else None
            column.add_run(run.count, length, values)
        if self.headers is not None:
            self.headers.extend([] for _ in range(run.count))

    def add_parsed(self, batch: bytes, h: BatchHeader) -> None:
        """A batch the vectorised path does not take: the record parser decodes it."""
        records: list[tuple[int, int, bytes | None, bytes | None, tuple]] = []
        decode_into(batch, h, _as_tuple, records)
        offsets, millis, keys, values, headers = zip(*records, strict=True)
        self.offsets.append(np.array(offsets, np.int64))
        self.millis.append(np.array(millis, np.int64))
        self.keys.add_list(list(keys))
        self.values.add_list(list(values))
        if self.headers is not None:
            self.headers.extend(list(pairs) for pairs in headers)


def _as_tuple(
    offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: tuple
) -> tuple[int, int, bytes | None, bytes | None, tuple]:
    return offset, timestamp, key, value, headers


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
    view = memoryview(buf).cast("B")
    columns = _Columns("headers" in schema.names)
    known: list[_Layout] = []
    next_offset = start
    for position, h in iter_whole_batches(view):
        if h.last_offset < start:
            next_offset = h.next_offset
            continue
        if h.base_offset >= end:
            break
        next_offset = h.next_offset
        if is_control(h):
            continue
        if h.compression:
            # Inflated (bounded) into a batch of its own, then decoded like any other.
            plain, plain_header = decompressed(bytes(view[position : position + h.batch_length]), h)
            _add_batch(columns, memoryview(plain), 0, plain_header, known)
        else:
            _add_batch(columns, view, position, h, known)
    if not columns.offsets:
        return DecodedChunk(None, next_offset)
    offsets_buffer = pa.allocate_buffer(8 * sum(len(piece) for piece in columns.offsets))
    offsets = np.concatenate(columns.offsets, out=np.frombuffer(offsets_buffer, np.int64))
    batch = _record_batch(columns, offsets_buffer, topic, partition, schema)
    if offsets[0] < start or offsets[-1] >= end:
        if (offsets[1:] > offsets[:-1]).all():  # as they should be: the rows are one slice
            low, high = np.searchsorted(offsets, (start, end))
            batch = batch.slice(low, high - low)
        else:
            batch = batch.filter(pa.array((offsets >= start) & (offsets < end)))
    return DecodedChunk(batch if batch.num_rows else None, next_offset)


def _add_batch(
    columns: _Columns, view: memoryview, position: int, h: BatchHeader, known: list[_Layout]
) -> None:
    """One uncompressed batch's records: as runs if it splits into long ones, else parsed."""
    runs = _split_runs(view, position, h, known)
    if runs:
        for run in runs:
            columns.add_run(view, run, h)
    else:
        columns.add_parsed(bytes(view[position : position + h.batch_length]), h)


def _record_batch(
    columns: _Columns, offsets: pa.Buffer, topic: str, partition: int, schema: pa.Schema
) -> pa.RecordBatch:
    n = offsets.size // 8
    micros = pa.allocate_buffer(8 * n)
    timestamps = np.frombuffer(micros, np.int64)
    np.concatenate(columns.millis, out=timestamps)
    timestamps *= 1000
    arrays = [
        columns.keys.array(),
        columns.values.array(),
        _CONSTANTS.column(pa.string(), topic, n),
        _CONSTANTS.column(pa.int32(), partition, n),
        pa.Array.from_buffers(pa.int64(), n, [None, offsets]),
        pa.Array.from_buffers(_TIMESTAMP_TYPE, n, [None, micros]),
        _CONSTANTS.column(pa.int32(), TIMESTAMP_TYPE_CREATE_TIME, n),
    ]
    if columns.headers is not None:
        arrays.append(pa.array(columns.headers, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _ConstantColumns:
    """Columns holding one value in every row (topic, partition, timestampType): built once
    per value at the largest length asked for, then sliced (Arrow slices share the buffers)."""

    def __init__(self) -> None:
        self._built: dict[tuple[pa.DataType, object], pa.Array] = {}

    def column(self, kind: pa.DataType, value: object, n: int) -> pa.Array:
        built = self._built.get((kind, value))
        if built is None or len(built) < n:
            if len(self._built) > 64:  # a long-lived worker reading many topics
                self._built.clear()
            built = pa.repeat(pa.scalar(value, kind), max(n, 2 * len(built or ())))
            self._built[(kind, value)] = built
        return built.slice(0, n)


_CONSTANTS = _ConstantColumns()
