"""Record batch bytes -> Arrow record batches with the source's exact schema.

This is the executor's hot path, so it avoids Python work per record where the data allows.
A producer's batch is mostly long runs of records that share one layout: the same size, the
same varint widths, the same key and value lengths, no headers. The layout changes only where
a varint grows (offset delta 64, a timestamp delta past 63 ms, ...). Each field of a run is a
strided numpy view of the fetched buffer, one element per record, so the run's offsets,
timestamps and values come from a few vectorised operations whatever its length.

A batch that does not split into long runs (keys and values of many sizes, headers) is
"scattered": it waits with the following scattered batches of the fetch, whose records are then
found by their length varints alone, one record of every batch per numpy step (or a Python loop
per batch, for a batch much longer than the others). numpy then reads
every field of all their records at once (a varint column at a time), checks that each record's
fields fill exactly its length, and one Arrow ``take`` per field copies the keys, values and
headers into the columns. Anything that does not add up sends those batches to the log's
own record parser, ``laminar.segment.batch.decode_into`` (which the client library uses too),
so a defective batch is named by the same error as before; a handful of records goes there
directly.

The batch layout is in docs/FORMAT.md: a 68-byte header, then Kafka-v2-style records. A
compressed batch is first inflated into an uncompressed copy (``batch.decompressed``), which
then takes the same paths.
"""

from __future__ import annotations

import itertools
import struct
from array import array
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

MIN_SCATTERED = 100
"""Fewer scattered records than this (in one group of consecutive batches) go to the record
parser: the vectorised decode costs some 0.35 ms (about 100 numpy and Arrow calls) whatever
the number of records, the parser some 4 us per record with headers (measured here)."""

MAX_SCATTERED_HEADERS = 64
"""A group with a record of more headers goes to the parser (headers are read one index at a
time over all records, which pays only for a few per record)."""

_SAFE = 1 << 62
"""Base offsets, first timestamps and deltas within this magnitude add up without overflowing
int64; anything larger is left to the parser (whose Python ints then decide)."""

MIN_RUN = 16
"""Fewer records than this in a run (other than a batch's last) make the batch a scattered
one: the run path costs about as much per run as the parser does per record."""

RUNS_RETRIED_EVERY = 16
"""While scattered batches wait, only every this many-th is tried for runs: a producer of
scattered records makes every batch scattered, and looking for runs in each cost a third of
the decode of a realistic mix (keys, headers, values of many sizes). Either path decodes any
batch; this only chooses the likely faster one."""

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


_Piece = tuple[int, int | None, np.ndarray | list[bytes | None] | pa.Array | None]


class _Binary:
    """A binary column assembled from pieces in row order, each value copied once."""

    def __init__(self) -> None:
        # (rows, width, values): ``rows`` values of ``width`` bytes (-1: nulls) in a strided
        # "S<width>" view (None if width < 1), or width None and a list of values, or width
        # None and a binary Arrow array (a scattered group's, already a copy)
        self._pieces: list[_Piece] = []

    def add_run(self, rows: int, width: int, values: np.ndarray | None) -> None:
        self._pieces.append((rows, width, values))

    def add_list(self, values: list[bytes | None]) -> None:
        self._pieces.append((len(values), None, values))

    def add_array(self, values: pa.Array) -> None:
        self._pieces.append((len(values), None, values))

    def array(self) -> pa.Array:
        """The column, built in buffers from Arrow's pool (fresh memory faults per page)."""
        pieces = self._pieces
        if len(pieces) == 1 and isinstance(pieces[0][2], pa.Array):
            return pieces[0][2]  # one scattered group: its gathered column as it is
        n = sum(rows for rows, _, _ in pieces)
        if all(width == -1 for _, width, _ in pieces):
            return pa.nulls(n, pa.binary())
        sizes = [
            [0 if v is None else len(v) for v in values] if isinstance(values, list) else None
            for _, _, values in pieces
        ]
        total = sum(
            sum(listed)
            if listed is not None
            else _byte_count(values)
            if isinstance(values, pa.Array)
            else rows * max(width or 0, 0)
            for (rows, width, values), listed in zip(pieces, sizes, strict=True)
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
            if isinstance(values, pa.Array):  # a scattered group's column: its bytes at once
                offsets_in, data_in = _offsets_and_data(values)
                np.subtract(offsets_in[1:], offsets_in[0] - start, out=ends)
                data[start : ends[-1]] = data_in[offsets_in[0] : offsets_in[-1]]
                if valid is not None and values.null_count:
                    valid[r : r + rows] = values.is_valid().to_numpy(zero_copy_only=False)
            elif listed is not None:  # a parsed batch's values, one by one
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


def _has_nulls(piece: _Piece) -> bool:
    _, width, values = piece
    if isinstance(values, pa.Array):
        return values.null_count > 0
    return width == -1 or (width is None and None in values)  # type: ignore[operator]


def _offsets_and_data(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The int32 offsets (one more than rows) and the data bytes of a binary array."""
    _, offsets, data = values.buffers()
    starts = np.frombuffer(offsets, np.int32, len(values) + 1, 4 * values.offset)
    return starts, np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)


def _byte_count(values: pa.Array) -> int:
    starts, _ = _offsets_and_data(values)
    return int(starts[-1] - starts[0])


_ramps = np.arange(1, 1 << 16, dtype=np.int32)


def _ramp(count: int) -> np.ndarray:
    """1, 2, ..., count (a view of one cached array, grown when needed)."""
    global _ramps
    if count > len(_ramps):
        _ramps = np.arange(1, 2 * count + 1, dtype=np.int32)
    return _ramps[:count]


class _Decoded(NamedTuple):
    """The columns of a group of scattered batches."""

    offsets: np.ndarray
    millis: np.ndarray
    keys: pa.Array
    values: pa.Array
    headers: pa.Array | None


class _Scattered:
    """Consecutive scattered batches of one buffer, waiting to be decoded together: numpy's
    cost per call is then paid once per fetch rather than once per batch."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.batches: list[tuple[int, BatchHeader]] = []

    def add(self, columns: _Columns, position: int, h: BatchHeader) -> None:
        """Queue the batch; one whose numbers are huge goes to the parser, after those
        waiting."""
        if abs(h.base_offset) >= _SAFE or abs(h.first_timestamp) >= _SAFE:
            self.flush(columns)
            columns.add_parsed(bytes(self.view[position : position + h.batch_length]), h)
        else:
            self.batches.append((position, h))

    def flush(self, columns: _Columns) -> None:
        """Decode the waiting batches into ``columns``, in order: each run of batches whose
        walk by record lengths ends exactly at their ends together (vectorised, or by the
        parser if too few records or anything amiss, which names the first defect); a batch
        whose walk does not end there by the parser alone."""
        if not self.batches:
            return
        batches, self.batches = self.batches, []
        group: list[tuple[int, BatchHeader]] = []
        starts: list[np.ndarray] = []
        for batch, walked in zip(batches, _walk_batches(self.view, batches), strict=True):
            if walked is None:
                self._decode(columns, group, starts)
                group, starts = [], []
                self._parse(columns, [batch])
            else:
                group.append(batch)
                starts.append(walked)
        self._decode(columns, group, starts)

    def _decode(
        self, columns: _Columns, batches: list[tuple[int, BatchHeader]], starts: list[np.ndarray]
    ) -> None:
        if not batches:
            return
        at = np.concatenate(starts)
        if len(at) >= MIN_SCATTERED:
            kind = columns.headers.kind if columns.headers is not None else None
            decoded = _decode_scattered(self.view, batches, at, kind)
            if decoded is not None:
                columns.add_scattered(decoded)
                return
        self._parse(columns, batches)

    def _parse(self, columns: _Columns, batches: list[tuple[int, BatchHeader]]) -> None:
        for position, h in batches:
            columns.add_parsed(bytes(self.view[position : position + h.batch_length]), h)


LOCKSTEP_STEP = 10
"""A step of the walk together (a few numpy calls over one record of every batch walked) costs
about what this many records of the Python walk do: some 3-6 against 0.35-0.55 us here, the
machine busy or not."""


def _walk_batches(
    view: memoryview, batches: list[tuple[int, BatchHeader]]
) -> list[np.ndarray | None]:
    """Where each record of each batch starts (int64), found by stepping over the records by
    their length varints; None for a batch whose walk does not end exactly at its end.
    Nothing else is checked here: the numpy decode checks every record against its length
    and its successor."""
    counts = [h.record_count for _, h in batches]
    firsts = [position + HEADER_SIZE for position, _ in batches]
    ends = [position + h.batch_length for position, h in batches]
    walked: list[np.ndarray | None] = [None] * len(batches)
    steps = _lockstep_steps(counts)
    together = [i for i, count in enumerate(counts) if count <= steps]
    if together:
        starts, reached = _walk_together(
            view, [firsts[i] for i in together], [counts[i] for i in together]
        )
        first = 0
        for i, end in zip(together, reached.tolist(), strict=True):
            if end == ends[i]:
                walked[i] = starts[first : first + counts[i]]
            first += counts[i]
    for i, (first, count, end) in enumerate(zip(firsts, counts, ends, strict=True)):
        if walked[i] is not None:
            continue
        for walk in (_walk, _walk_long):  # a record of 8 KiB or more: the long walk
            starts = array("q")
            try:
                if walk(view, first, count, starts) == end:
                    walked[i] = np.frombuffer(starts, np.int64)
                    break
            except (IndexError, OverflowError, CorruptBatchError):  # lengths gone wild
                pass
    return walked


def _lockstep_steps(counts: list[int]) -> int:
    """How many steps to walk together: the batches of at most that many records are walked
    together, the others alone, the cheapest way by LOCKSTEP_STEP (0: all alone)."""
    ordered = sorted(counts, reverse=True)
    best, cheapest = 0, sum(ordered)
    alone = 0  # records of the batches longer than the one looked at
    for i, count in enumerate(ordered):
        if (i == 0 or count < ordered[i - 1]) and LOCKSTEP_STEP * count + alone < cheapest:
            best, cheapest = count, LOCKSTEP_STEP * count + alone
        alone += count
    return best


def _walk_together(
    view: memoryview, firsts: list[int], counts: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """``_walk`` of many batches at once, one record of every batch per step, each for as many
    steps as the longest needs (a batch's walk past its end reads what follows, harmlessly):
    every record's start, in batch order, and where each batch's walk ended (not at its end
    for a batch holding a length varint of 3 bytes or more, or lengths gone wild)."""
    count = np.array(counts, np.int64)
    # trail[k]: where the k-th record of every batch starts
    trail = np.empty((int(count.max()) + 1, len(counts)), np.int64)
    trail[0] = firsts
    # the two bytes at every position as a little-endian word (a view, one byte apart)
    words = np.ndarray((len(view) - 1,), "<u2", view, 0, (1,))
    last = len(words) - 1
    read = np.empty(len(counts), np.int64)
    step = np.empty(len(counts), np.int64)
    steps = _STEP_ARRAY
    for here, following in itertools.pairwise(trail):
        np.minimum(here, last, out=read)  # (a wild walk reads the last word)
        steps.take(words[read], out=step, mode="clip")
        np.add(here, step, out=following)
    walks = trail.T
    starts = walks[np.arange(len(trail)) < count[:, None]]
    return starts, walks[np.arange(len(counts)), count]


def _step_table() -> list[int]:
    """For the two bytes at a record's start, read as a little-endian int: how far its next
    record starts (its length varint's width plus its length), 0 for a longer varint."""
    word = np.arange(1 << 16)
    low, high = word & 0xFF, word >> 8
    two = (low & 0x7F) | (high << 7)
    step = np.where(low < 0x80, 1 + ((low >> 1) ^ -(low & 1)), 2 + ((two >> 1) ^ -(two & 1)))
    step[(low >= 0x80) & (high >= 0x80)] = 0
    return step.tolist()


_STEPS = _step_table()
_STEP_ARRAY = np.where(np.array(_STEPS) < MIN_RECORD_SIZE, 1 << 32, _STEPS).astype(np.int64)
"""``_STEPS`` for numpy, where a longer varint or a length too short for a record (negative
ones included) steps past any fetch: such a walk never ends at its batch's end, every walk
only moves forward (so no position needs clamping below), and a walk of as many steps as a
verified batch can hold records (``verify_batch``) stays far inside int64."""


def _walk(buf: memoryview, p: int, count: int, starts: array[int]) -> int:
    """Append where each of ``count`` records starts, from ``p`` on, stepping over each by its
    length varint; return where the last one ends (wrong if a record is 8 KiB or more: then
    ``_walk_long`` walks it). Nothing else is checked here: the numpy decode checks every
    record against its length and its successor."""
    add = starts.append
    steps = _STEPS
    for _ in range(count):
        add(p)
        p += steps[buf[p] | (buf[p + 1] << 8)]
    return p


def _walk_long(buf: memoryview, p: int, count: int, starts: array[int]) -> int:
    """``_walk`` for length varints of any width."""
    add = starts.append
    for _ in range(count):
        add(p)
        b = buf[p]
        if b < 0x80:
            p += 1 + ((b >> 1) ^ -(b & 1))
        elif (c := buf[p + 1]) < 0x80:  # 64 to 8191 bytes: most records
            b = (b & 0x7F) | (c << 7)
            p += 2 + ((b >> 1) ^ -(b & 1))
        else:
            length, p = varint.decode(buf, p, len(buf))
            p += length
    return p


def _pair_table() -> np.ndarray:
    """The value of the zigzag varint starting with each two bytes (read as a little-endian
    int): one byte if the first is below 0x80, else two (garbage if both are 0x80 or more)."""
    word = np.arange(1 << 16, dtype=np.int64)
    low = word & 0xFF
    raw = np.where(low < 0x80, low, (low & 0x7F) | ((word >> 8) & 0x7F) << 7)
    return (raw >> 1) ^ -(raw & 1)


_PAIRS = _pair_table()


def _varints(data: np.ndarray, at: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each position of ``at`` (int64) and the position after it; raises
    _Amiss if one does not end before its ``stop`` or is longer than 10 bytes."""
    if not (at < stop).all():
        raise _Amiss
    first = data[at]
    wide = first >= 0x80
    if not wide.any():  # one byte each (lengths below 64, small deltas)
        return _TABLES[1].take(first & 0x7F), at + 1
    second = data.take(at + 1, mode="clip")  # garbage where unused, or past the buffer
    value = _PAIRS.take(first | (second.astype(np.uint16) << 8))
    after = at + 1 + wide
    if not (after <= stop).all():
        raise _Amiss
    longer = np.flatnonzero(wide & (second >= 0x80))
    if longer.size:  # three bytes or more (records of 8 KiB and up): byte by byte
        value[longer], after[longer] = _long_varints(data, at[longer], stop[longer])
    return value, after


def _long_varints(
    data: np.ndarray, at: np.ndarray, stop: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``_varints`` for varints of any width, one byte position at a time."""
    first = data[at]
    raw = (first & 0x7F).astype(np.uint64)
    after = at + 1
    more = np.flatnonzero(first >= 0x80)
    shift = 7
    while more.size:
        if shift > 63:
            raise _Amiss
        here = after[more]
        if not (here < stop[more]).all():
            raise _Amiss
        byte = data[here]
        raw[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] = here + 1
        more = more[byte >= 0x80]
        shift += 7
    return (raw >> _U1).view(np.int64) ^ -(raw & _U1).view(np.int64), after


class _Amiss(Exception):
    """Something in a scattered group does not add up: the parser decodes it instead."""


def _field(
    data: np.ndarray, at: np.ndarray, stop: np.ndarray, nullable: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A length-prefixed field at each of ``at``: (its start, its length, the position after
    it); length -1 is null (if ``nullable``), and the field must end by ``stop``."""
    length, begin = _varints(data, at, stop)
    if not ((length >= (-1 if nullable else 0)) & (length <= stop - begin)).all():
        raise _Amiss
    return begin, length, begin + np.maximum(length, 0)


def _decode_scattered(
    view: memoryview,
    batches: list[tuple[int, BatchHeader]],
    starts: np.ndarray,
    kind: pa.ListType | None,
) -> _Decoded | None:
    """Every record of ``batches`` decoded at once (headers as ``kind``; None: not wanted),
    or None if anything does not add up."""
    try:
        return _decode_group(view, batches, starts, kind)
    except _Amiss:
        return None


def _decode_group(
    view: memoryview,
    batches: list[tuple[int, BatchHeader]],
    at: np.ndarray,
    kind: pa.ListType | None,
) -> _Decoded:
    data = np.frombuffer(view, np.uint8)
    counts = [h.record_count for _, h in batches]
    ends = np.array([position + h.batch_length for position, h in batches], np.int64)
    batch_end = np.repeat(ends, counts)
    # The walk's positions must lie in their batches (so reading them is safe) ...
    firsts = np.array([position + HEADER_SIZE for position, _ in batches], np.int64)
    if not ((at >= np.repeat(firsts, counts)) & (at < batch_end)).all():
        raise _Amiss
    length, body = _varints(data, at, batch_end)
    stop = body + length
    # ... and each record must end where the next one starts (the last: at its batch's end).
    following = np.empty_like(at)
    following[:-1] = at[1:]
    following[np.cumsum(counts) - 1] = ends
    if not ((length >= MIN_RECORD_SIZE - 1) & (stop == following)).all():
        raise _Amiss
    millis, p = _varints(data, body + 1, stop)  # after the attributes byte
    offsets, p = _varints(data, p, stop)
    if not ((np.abs(millis) < _SAFE) & (np.abs(offsets) < _SAFE)).all():
        raise _Amiss
    millis += np.repeat(np.array([h.first_timestamp for _, h in batches], np.int64), counts)
    offsets += np.repeat(np.array([h.base_offset for _, h in batches], np.int64), counts)
    if offsets.min() < -1:
        raise _Amiss  # the parser leaves such records out (below its from_offset, -1)
    key_at, key_length, p = _field(data, p, stop, True)
    value_at, value_length, p = _field(data, p, stop, True)
    header_count, p = _varints(data, p, stop)
    if not ((header_count >= 0) & (header_count <= (stop - p) // 2)).all():
        raise _Amiss  # a header takes 2 bytes at least
    if int(header_count.max()) > MAX_SCATTERED_HEADERS:
        raise _Amiss
    name_at, name_length, header_at, header_length = _header_fields(data, p, stop, header_count)
    fields = [(key_at, key_length), (value_at, value_length), (name_at, name_length)]
    if kind is not None:
        fields.append((header_at, header_length))
    keys, values, names, *header_values = _gather(data, fields)
    try:
        names = names.cast(pa.string())  # checks UTF-8, as the parser's decode() does
    except pa.ArrowInvalid:
        raise _Amiss from None
    headers = None
    if kind is not None:
        header_offsets = np.zeros(len(at) + 1, np.int32)
        np.cumsum(header_count, out=header_offsets[1:])
        pairs = pa.StructArray.from_arrays([names, header_values[0]], fields=list(kind.value_type))
        headers = pa.ListArray.from_arrays(pa.array(header_offsets), pairs, type=kind)
    return _Decoded(offsets, millis, keys, values, headers)


def _header_fields(
    data: np.ndarray, at: np.ndarray, stop: np.ndarray, header_count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every header's name and value (start, length; -1 null), in buffer order, of records
    whose headers begin at ``at`` and must end at ``stop``.

    Headers are read one index at a time over all records that have that many; with the
    records taken most headers first (a stable sort), those are a prefix, so each step
    slices where it would gather."""
    most = int(header_count.max())
    total = int(header_count.sum())
    name_at, name_length, value_at, value_length = (np.empty(total, np.int64) for _ in range(4))
    order = np.argsort((most - header_count).astype(np.uint8), kind="stable")
    having = np.bincount(header_count, minlength=most + 1)[::-1].cumsum()[::-1].tolist()
    first = (np.cumsum(header_count) - header_count)[order]
    p = at[order]
    end = stop[order]
    for index in range(most):  # the index-th header of every record that has that many
        rows = having[index + 1]
        slot = first[:rows] + index
        name_at[slot], name_length[slot], q = _field(data, p[:rows], end[:rows], False)
        value_at[slot], value_length[slot], p[:rows] = _field(data, q, end[:rows], True)
    if not (p == end).all():
        raise _Amiss
    return name_at, name_length, value_at, value_length


def _gather(data: np.ndarray, fields: list[tuple[np.ndarray, np.ndarray]]) -> list[pa.Array]:
    """Binary columns of byte ranges of ``data``, each field given as (start, length; -1
    null) of ranges in buffer order that never overlap."""
    if len(data) >= 2**31:
        raise _Amiss  # beyond int32 offsets
    return [_cut(data, at, length) for at, length in fields]


def _cut(data: np.ndarray, at: np.ndarray, length: np.ndarray) -> pa.Array:
    """One field's ranges, copied out of ``data`` into a buffer of their own.

    The ranges and the gaps between them cut ``data`` into the elements of one binary array
    (a view: element 2k+1 is range k), from which one ``take`` copies the ranges (its bounds
    are two strided writes, where one view of all fields needed every range's rank)."""
    rows = len(at)
    bounds = np.empty(2 * rows + 2, np.int32)
    bounds[0], bounds[-1] = 0, len(data)
    bounds[1:-1:2] = at
    np.add(at, np.maximum(length, 0), out=bounds[2:-1:2], casting="unsafe")
    pieces = pa.Array.from_buffers(
        pa.binary(), 2 * rows + 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )
    _, offsets, copied = pieces.take(_odd(rows)).buffers()
    source = pieces.buffers()[2].address
    if copied is not None and source <= copied.address < source + len(data):
        copied = pa.py_buffer(np.frombuffer(copied, np.uint8).copy())  # never the fetch buffer
    nulls = length < 0
    valid = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    return pa.Array.from_buffers(pa.binary(), rows, [valid, offsets, copied])


_odds = pa.array(np.arange(1, 1 << 17, 2, dtype=np.int32))


def _odd(count: int) -> pa.Array:
    """1, 3, ..., 2 count - 1: a slice of one cached array, grown when needed."""
    global _odds
    if count > len(_odds):
        _odds = pa.array(np.arange(1, 4 * count + 1, 2, dtype=np.int32))
    return _odds.slice(0, count)


class _Headers:
    """The headers column assembled from pieces in row order: a run's rows have none, a
    parsed batch's are Python lists, a scattered group's an Arrow array already."""

    def __init__(self, kind: pa.ListType) -> None:
        self.kind = kind
        self._pieces: list[int | list[list[tuple[str, bytes | None]]] | pa.Array] = []

    def add_empty(self, rows: int) -> None:
        if self._pieces and isinstance(self._pieces[-1], int):
            self._pieces[-1] += rows
        else:
            self._pieces.append(rows)

    def add_lists(self, lists: list[list[tuple[str, bytes | None]]]) -> None:
        self._pieces.append(lists)

    def add_array(self, headers: pa.Array) -> None:
        self._pieces.append(headers)

    def array(self) -> pa.Array:
        arrays = [
            piece
            if isinstance(piece, pa.Array)
            else _no_headers(self.kind, piece)
            if isinstance(piece, int)
            else pa.array(piece, self.kind)
            for piece in self._pieces
        ]
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _no_headers(kind: pa.ListType, rows: int) -> pa.Array:
    """``rows`` empty header lists."""
    empty = pa.StructArray.from_arrays(
        [pa.array([], field.type) for field in kind.value_type], fields=list(kind.value_type)
    )
    return pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, np.int32)), empty, type=kind)


class _Columns:
    """The rows of one fetched chunk, as pieces in offset order."""

    def __init__(self, headers: pa.ListType | None) -> None:
        self.offsets: list[np.ndarray] = []
        self.millis: list[np.ndarray] = []
        self.keys = _Binary()
        self.values = _Binary()
        self.headers = _Headers(headers) if headers is not None else None

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
            self.headers.add_empty(run.count)

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
            self.headers.add_lists([list(pairs) for pairs in headers])

    def add_scattered(self, group: _Decoded) -> None:
        self.offsets.append(group.offsets)
        self.millis.append(group.millis)
        self.keys.add_array(group.keys)
        self.values.add_array(group.values)
        if self.headers is not None:
            assert group.headers is not None
            self.headers.add_array(group.headers)


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
    columns = _Columns(schema.field("headers").type if "headers" in schema.names else None)
    known: list[_Layout] = []
    next_offset = start
    waiting = _Scattered(view)
    try:
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
                waiting.flush(columns)
                batch = bytes(view[position : position + h.batch_length])
                plain, plain_header = decompressed(batch, h)
                alone = _Scattered(memoryview(plain))
                _add_batch(columns, alone.view, 0, plain_header, known, alone)
                alone.flush(columns)
            else:
                _add_batch(columns, view, position, h, known, waiting)
    except CorruptBatchError:
        waiting.flush(columns)  # a defect of a batch before this one is named first, as ever
        raise
    waiting.flush(columns)
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
    columns: _Columns,
    view: memoryview,
    position: int,
    h: BatchHeader,
    known: list[_Layout],
    waiting: _Scattered,
) -> None:
    """One uncompressed batch's records: as runs if it splits into long ones, else scattered
    (decoded with the batches after it, ``waiting``)."""
    if len(waiting.batches) % RUNS_RETRIED_EVERY:  # after scattered batches, most likely one too
        waiting.add(columns, position, h)
        return
    runs = _split_runs(view, position, h, known)
    if runs:
        waiting.flush(columns)
        for run in runs:
            columns.add_run(view, run, h)
    else:
        waiting.add(columns, position, h)


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
        arrays.append(columns.headers.array())
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
