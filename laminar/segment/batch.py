"""The record batch: the unit that is produced, stamped, stored, replicated and fetched.

The layout is documented byte by byte in docs/FORMAT.md. The producer builds the batch and its
crc32c; the node only checks the crc and stamps ``base_offset`` and ``term`` (bytes 0..15, outside
the crc), so the same bytes travel from producer to disk to followers to consumers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple, TypeVar

import crc32c

from laminar.errors import BatchTooLargeError, CorruptBatchError
from laminar.segment import compression as codecs
from laminar.segment import varint

HEADER_SIZE = 68
MAGIC = 1
ATTR_COMPRESSION_MASK = 0x07
ATTR_CONTROL = 1 << 5
KNOWN_ATTRIBUTES = ATTR_COMPRESSION_MASK | ATTR_CONTROL
MAX_CODEC = codecs.ZSTD
CRC_START = 24
# The smallest possible record: length, attributes, ts delta, offset delta, key len, value len,
# header count, one byte each.
MIN_RECORD_SIZE = 7

HEADER_STRUCT = struct.Struct("<qqiIBBHiqqqhHii")
STAMP = struct.Struct("<qq")  # base_offset, term: the 16 bytes a leader stamps
_LENGTH = struct.Struct("<qqi")  # base_offset, term, batch_length
_CRC = struct.Struct("<I")
_TAIL = struct.Struct("<BBHiqqqhHii")  # bytes 24..67, written after the records
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
T = TypeVar("T")

assert HEADER_STRUCT.size == HEADER_SIZE


class BatchHeader(NamedTuple):
    """The fixed 68-byte header of a batch (reserved fields are checked, not kept)."""

    base_offset: int
    term: int
    batch_length: int
    crc: int
    magic: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK


@dataclass(slots=True, frozen=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


RecordInput = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]


def build_batch(
    records: Sequence[RecordInput],
    *,
    control: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: int = codecs.NONE,
    compression_level: int | None = None,
) -> bytes:
    """Encode ``(key, value, headers, timestamp_ms)`` records as one batch with its crc.

    base_offset and term are written as 0: the node stamps them. With a ``compression`` codec
    (``compression.GZIP`` ...) the records section is compressed and the crc covers the
    compressed bytes, as in Kafka; a section that would not shrink is stored uncompressed (as
    Kafka's clients do), so readers pay nothing for it.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    first_ts = records[0][3]
    parts: list[bytes | bytearray] = []
    if _plain(records):
        max_ts = _add_plain(records, first_ts, parts)
    else:
        max_ts = _add_records(records, first_ts, parts)
    body = b"".join(parts)
    attributes = ATTR_CONTROL if control else 0
    if compression:
        packed = codecs.compress(compression, body, compression_level)
        if len(packed) < len(body):
            body = packed
            attributes |= compression
    count = len(records)
    return sealed(
        body,
        attributes,
        count - 1,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )


_KEY = itemgetter(0)
_HEADERS = itemgetter(2)
_TIMESTAMP = itemgetter(3)
_PLAIN_PREFIXES: tuple[bytes, ...] = ()
"""``_PLAIN_PREFIXES[delta]``: the offset delta's varint and a null key; replaced by a longer
tuple when a larger batch needs one (never changed in place, so threads building batches at
once cannot see it half made)."""


def _plain(records: Sequence[RecordInput]) -> bool:
    """Whether every record is unkeyed and without headers: the common shape (``send_many``
    without keys), which ``_add_plain`` encodes in about half the time. The scans run in C."""
    count = len(records)
    return (
        count < varint._SMALL_MAX
        and not any(map(_HEADERS, records))
        and list(map(_KEY, records)).count(None) == count
    )


def _add_plain(
    records: Sequence[RecordInput], first_ts: int, parts: list[bytes | bytearray]
) -> int:
    """Append the encoding of records ``_plain`` accepted; returns their largest timestamp.
    Records come in runs of one timestamp (a bulk call's, or one millisecond's), so a record
    costs its value's length and two table lookups."""
    global _PLAIN_PREFIXES
    table = varint._TABLE
    enc = varint.encode
    prefixes = _PLAIN_PREFIXES
    if len(prefixes) < len(records):
        size = min(varint._SMALL_MAX, max(len(records), 2 * len(prefixes)))
        prefixes = _PLAIN_PREFIXES = tuple(table[delta + 1] + b"\x01" for delta in range(size))
    extend = parts.extend
    max_ts = first_ts
    deltas = iter(prefixes)
    for ts, run in groupby(records, _TIMESTAMP):
        max_ts = max(max_ts, ts)
        tsd = ts - first_ts
        head = b"\x00" + (table[tsd + 1] if -1 <= tsd < 16384 else enc(tsd))  # attributes, ts
        fixed = len(head) + 1  # and the header count
        # run first: zip stops on its end without taking a delta from the shared iterator
        for (_key, value, _headers, _ts), delta in zip(run, deltas, strict=False):
            if value is None:
                extend((table[fixed + len(delta) + 2], head, delta, b"\x01\x00"))
                continue
            length = len(value)
            length_varint = table[length + 1] if length < 16384 else enc(length)
            size = fixed + len(delta) + len(length_varint) + length
            extend(
                (
                    table[size + 1] if size < 16384 else enc(size),
                    head,
                    delta,
                    length_varint,
                    value,
                    b"\x00",
                )
            )
    return max_ts


def _add_records(
    records: Sequence[RecordInput], first_ts: int, parts: list[bytes | bytearray]
) -> int:
    """Append the encoding of any records; returns their largest timestamp."""
    # One pass: each record's body is joined once (its length prefix needs its size), and all
    # pieces are joined once at the end; small varints come from the precomputed table.
    enc = varint.encode
    table = varint._TABLE
    max_ts = first_ts
    add = parts.append
    join = b"".join
    for delta, (key, value, headers, ts) in enumerate(records):
        if ts > max_ts:
            max_ts = ts
        tsd = ts - first_ts
        if headers:
            hbuf: bytes | bytearray = bytearray(enc(len(headers)))
            for hkey, hval in headers:
                hk = hkey.encode()
                hbuf += enc(len(hk))
                hbuf += hk
                if hval is None:
                    hbuf += b"\x01"
                else:
                    hbuf += enc(len(hval))
                    hbuf += hval
        else:
            hbuf = b"\x00"
        if key is None:
            kpart = b"\x01"
        else:
            klen = len(key)
            kpart = (table[klen + 1] if klen < 16384 else enc(klen)) + key
        if value is None:
            vpart = b"\x01"
        else:
            vlen = len(value)
            vpart = (table[vlen + 1] if vlen < 16384 else enc(vlen)) + value
        body = join(
            (
                b"\x00",
                table[tsd + 1] if -1 <= tsd < 16384 else enc(tsd),
                table[delta + 1] if delta < 16384 else enc(delta),
                kpart,
                vpart,
                hbuf,
            )
        )
        size = len(body)
        add(table[size + 1] if size < 16384 else enc(size))
        add(body)
    return max_ts


def sealed(
    body: bytes | memoryview,
    attributes: int,
    last_offset_delta: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    """The batch of records section ``body`` behind its header, crc32c included (computed on
    from the header's tail, so the body is copied once, into the batch); base offset and
    term stay 0 for the leader to stamp."""
    header = bytearray(HEADER_SIZE)
    _LENGTH.pack_into(header, 0, 0, 0, HEADER_SIZE + len(body))
    _TAIL.pack_into(
        header,
        CRC_START,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        0,
        base_sequence,
        record_count,
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(header)[CRC_START:]))
    _CRC.pack_into(header, 20, crc)
    return b"".join((header, body))


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos`` (no crc check); raises CorruptBatchError if it is unusable."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatchError(f"{len(buf) - pos} bytes is shorter than a batch header")
    f = HEADER_STRUCT.unpack_from(buf, pos)
    if f[2] < HEADER_SIZE:
        raise CorruptBatchError(f"batch_length {f[2]} is shorter than the header")
    if f[4] != MAGIC:
        raise CorruptBatchError(f"unsupported batch magic {f[4]}")
    return BatchHeader(
        f[0], f[1], f[2], f[3], f[4], f[6], f[7], f[8], f[9], f[10], f[11], f[13], f[14]
    )


def verify_batch(
    buf: bytes | bytearray | memoryview, max_batch_bytes: int | None = None
) -> BatchHeader:
    """Check a whole batch (length, magic, attributes, counts, crc); returns its header."""
    f = check_batch(buf, max_batch_bytes)
    return BatchHeader(
        f[0], f[1], f[2], f[3], f[4], f[6], f[7], f[8], f[9], f[10], f[11], f[13], f[14]
    )


def check_batch(
    buf: bytes | bytearray | memoryview, max_batch_bytes: int | None = None
) -> tuple[int, ...]:
    """verify_batch without building a BatchHeader: the raw unpacked header fields (the
    node's append path; index as in the 68-byte layout, reserved fields included)."""
    n = len(buf)
    if max_batch_bytes is not None and n > max_batch_bytes:
        raise BatchTooLargeError(f"batch of {n} bytes exceeds the limit of {max_batch_bytes}")
    if n < HEADER_SIZE:
        raise CorruptBatchError(f"{n} bytes is shorter than a batch header")
    f = HEADER_STRUCT.unpack_from(buf, 0)
    length, magic, res1, attributes, lod, count = f[2], f[4], f[5], f[6], f[7], f[14]
    codec = attributes & ATTR_COMPRESSION_MASK
    if (
        length != n
        or magic != MAGIC
        or res1
        or f[12]
        or attributes & ~KNOWN_ATTRIBUTES
        or (codec and (codec > MAX_CODEC or attributes & ATTR_CONTROL))
        or count < 1
        or lod != count - 1
        or count * MIN_RECORD_SIZE > (codecs.MAX_DECOMPRESSED_BYTES if codec else n - HEADER_SIZE)
        or n == HEADER_SIZE
        or f[9] < f[8]
    ):
        _explain(f, n)
    actual = crc32c.crc32c(memoryview(buf)[CRC_START:n])
    if actual != f[3]:
        raise CorruptBatchError(f"batch crc32c mismatch (stored {f[3]:#010x}, got {actual:#010x})")
    return f


def _explain(f: tuple[int, ...], n: int) -> None:
    """Raise the CorruptBatchError naming the first defect of a header (the slow path)."""
    length, magic, res1, attributes, lod, count = f[2], f[4], f[5], f[6], f[7], f[14]
    if length != n:
        raise CorruptBatchError(f"batch_length field {length} does not match {n} bytes received")
    if magic != MAGIC:
        raise CorruptBatchError(f"unsupported batch magic {magic}")
    if res1 or f[12]:
        raise CorruptBatchError("reserved header bytes are not zero")
    codec = attributes & ATTR_COMPRESSION_MASK
    if codec > MAX_CODEC:
        raise CorruptBatchError(f"compression codec {codec} is not supported")
    if attributes & ~KNOWN_ATTRIBUTES:
        raise CorruptBatchError(f"unknown attribute bits {attributes:#06x}")
    if codec and attributes & ATTR_CONTROL:
        raise CorruptBatchError("a control batch is never compressed")
    if count < 1:
        raise CorruptBatchError(f"record_count {count} is not positive")
    if lod != count - 1:
        raise CorruptBatchError(f"last_offset_delta {lod} does not match record_count {count}")
    if n == HEADER_SIZE:
        raise CorruptBatchError("the batch holds no records section")
    if count * MIN_RECORD_SIZE > n - HEADER_SIZE and not codec:
        raise CorruptBatchError(f"{count} records cannot fit in {n - HEADER_SIZE} bytes")
    if count * MIN_RECORD_SIZE > codecs.MAX_DECOMPRESSED_BYTES:
        raise CorruptBatchError(f"{count} records cannot fit in any decompressed batch")
    raise CorruptBatchError("max_timestamp is before first_timestamp")


def stamp(buf: bytearray | memoryview, base_offset: int, term: int) -> None:
    """Write base_offset and term in place; they sit outside the crc so it stays valid."""
    STAMP.pack_into(buf, 0, base_offset, term)


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """Walk concatenated batches; stops at a partial trailing batch (no crc check)."""
    n = len(buf)
    pos = 0
    while n - pos >= HEADER_SIZE:
        header = read_header(buf, pos)
        if pos + header.batch_length > n:
            return
        yield pos, header
        pos += header.batch_length


def decode_records(batch: bytes | bytearray | memoryview) -> list[Record]:
    """Decode every record with absolute offsets and timestamps (client side; not the node)."""
    h = read_header(batch)
    end = h.batch_length
    if end > len(batch):
        raise CorruptBatchError("batch is truncated")
    buf = bytes(batch[:end]) if not isinstance(batch, bytes) else batch
    records: list[Record] = []
    decode_into(buf, h, _new_record, records)
    return records


# Record is a frozen dataclass whose __init__ goes through object.__setattr__ per field;
# setting the slots directly builds the same object at about a third of the cost.
_SET_SLOTS = tuple(
    Record.__dict__[name].__set__ for name in ("offset", "timestamp", "key", "value", "headers")
)


def _new_record(
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
) -> Record:
    record = object.__new__(Record)
    set_offset, set_timestamp, set_key, set_value, set_headers = _SET_SLOTS
    set_offset(record, offset)
    set_timestamp(record, timestamp)
    set_key(record, key)
    set_value(record, value)
    set_headers(record, headers)
    return record


def decode_into(
    buf: bytes,
    h: BatchHeader,
    make: Callable[..., T],
    out: list[T],
    from_offset: int = -1,
    until_offset: int | None = None,
    limit: int = codecs.MAX_DECOMPRESSED_BYTES,
) -> None:
    """Append ``make(offset, timestamp, key, value, headers)`` for every record at or after
    ``from_offset`` (and before ``until_offset``) to ``out``; ``buf`` is exactly the batch
    ``h`` heads.

    One parser for every kind of record object (``Record`` here, the consumer's own records),
    so they all accept and reject exactly the same bytes. With ``until_offset`` (a share
    consumer wants a few records out of a large batch) only ``[from_offset, until_offset)`` is
    parsed whole: records before are stepped over by their length once their offset is known,
    and parsing stops at ``until_offset``; the caller relies on the batch's crc for the rest.
    A compressed batch is inflated first, whole (at most ``limit`` bytes, else
    DecompressionLimitError; CorruptBatchError if it does not decompress).
    """
    end = h.batch_length
    if len(buf) != end:
        raise CorruptBatchError("batch is truncated")
    pos = HEADER_SIZE
    codec = h.attributes & ATTR_COMPRESSION_MASK
    if codec:
        buf = codecs.decompress(codec, memoryview(buf)[HEADER_SIZE:end], limit)
        pos, end = 0, len(buf)
    dec = varint.decode
    base = h.base_offset
    first_ts = h.first_timestamp
    append = out.append
    try:
        for _ in range(h.record_count):
            b = buf[pos]
            if b < 0x80:  # one- and two-byte varints (nearly all of them) are read inline
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = dec(buf, pos, end)
            rec_end = pos + length
            if length < MIN_RECORD_SIZE - 1 or rec_end > end:
                raise CorruptBatchError(f"record length {length} is out of bounds")
            pos += 1  # attributes
            b = buf[pos]
            if b < 0x80:
                tsd = (b >> 1) ^ -(b & 1)
                pos += 1
            elif pos + 1 < rec_end and buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                tsd = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                tsd, pos = dec(buf, pos, rec_end)
            b = buf[pos]
            if b < 0x80:
                od = (b >> 1) ^ -(b & 1)
                pos += 1
            elif pos + 1 < rec_end and buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                od = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                od, pos = dec(buf, pos, rec_end)
            if until_offset is not None:
                if base + od < from_offset:
                    pos = rec_end
                    continue
                if base + od >= until_offset:
                    return
            b = buf[pos]
            if b == 1:
                key = None
                pos += 1
            elif b < 0x80 and not b & 1:
                pos += 1
                key = buf[pos : pos + (b >> 1)]
                pos += b >> 1
            else:
                key, pos = _read_bytes(buf, pos, rec_end)
            b = buf[pos]
            if b == 1:
                value = None
                pos += 1
            elif b < 0x80 and not b & 1:
                pos += 1
                value = buf[pos : pos + (b >> 1)]
                pos += b >> 1
            elif b >= 0x80 and not b & 1 and buf[pos + 1] < 0x80:  # 64 to 8191 bytes
                n = ((b & 0x7F) | (buf[pos + 1] << 7)) >> 1
                pos += 2
                value = buf[pos : pos + n]
                pos += n
            else:
                value, pos = _read_bytes(buf, pos, rec_end)
            if buf[pos] == 0:
                headers: tuple[tuple[str, bytes | None], ...] = ()
                pos += 1
            else:
                hcount, pos = dec(buf, pos, rec_end)
                if hcount < 0:
                    raise CorruptBatchError(f"negative header count {hcount}")
                pairs: list[tuple[str, bytes | None]] = []
                for _h in range(hcount):
                    hk, pos = _read_bytes(buf, pos, rec_end)
                    if hk is None:
                        raise CorruptBatchError("record header key is null")
                    hv, pos = _read_bytes(buf, pos, rec_end)
                    try:
                        pairs.append((hk.decode(), hv))
                    except UnicodeDecodeError as exc:
                        raise CorruptBatchError("record header key is not utf-8") from exc
                headers = tuple(pairs)
            # Inline reads may run past rec_end; this check (or IndexError) catches that.
            if pos != rec_end:
                raise CorruptBatchError("record length does not match its fields")
            offset = base + od
            if offset >= from_offset:
                append(make(offset, first_ts + tsd, key, value, headers))
    except IndexError:
        raise CorruptBatchError("record runs past the end of its batch") from None
    if pos != end:
        raise CorruptBatchError("bytes left after the last record")


def decompressed(
    batch: bytes, h: BatchHeader, limit: int = codecs.MAX_DECOMPRESSED_BYTES
) -> tuple[bytes, BatchHeader]:
    """The batch with its records inflated, and its header to match: a reader's scratch copy
    for code that walks records itself (the Spark decoder, a byte search). Its header says
    uncompressed and gives the new length, but its crc is the compressed batch's: such a copy
    is never stored or sent. An uncompressed batch is returned as it is."""
    codec = h.attributes & ATTR_COMPRESSION_MASK
    if not codec:
        return batch, h
    records = codecs.decompress(codec, memoryview(batch)[HEADER_SIZE : h.batch_length], limit)
    head = bytearray(batch[:HEADER_SIZE])
    length = HEADER_SIZE + len(records)
    struct.pack_into("<i", head, 16, length)
    struct.pack_into("<H", head, 26, h.attributes & ~codec)
    return bytes(head) + records, h._replace(batch_length=length, attributes=h.attributes & ~codec)


def _read_bytes(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = varint.decode(buf, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise CorruptBatchError(f"field length {n} is out of bounds")
    return buf[pos : pos + n], pos + n


def control_batch(kind: int, payload: bytes, timestamp_ms: int) -> bytes:
    """A one-record control batch: key is ``kind`` (2 bytes big-endian), value the payload."""
    return build_batch([(struct.pack(">H", kind), payload, (), timestamp_ms)], control=True)


def is_control(header: BatchHeader) -> bool:
    return bool(header.attributes & ATTR_CONTROL)
