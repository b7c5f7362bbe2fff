"""Records of fetched batches straight into ConsumerRecord objects: one object per record.

Same checks as ``laminar.segment.batch.decode_records`` (which builds ``Record`` objects for
other users), but single-byte varints (nearly every length and delta) are read inline and
overreads are caught once per batch, so a 100-byte record costs about a microsecond.
"""

from __future__ import annotations

from laminar.client.types import ConsumerRecord, Header
from laminar.errors import CorruptBatchError
from laminar.segment import varint
from laminar.segment.batch import HEADER_SIZE, MIN_RECORD_SIZE, BatchHeader

_new = tuple.__new__


def decode_consumer_records(
    batch: bytes,
    header: BatchHeader,
    topic: str,
    partition: int,
    from_offset: int,
    out: list[ConsumerRecord],
) -> None:
    """Append the batch's records at or after ``from_offset`` to ``out``.

    ``batch`` is exactly one batch (``header.batch_length`` bytes); CorruptBatchError if a
    record does not parse or the records do not fill the batch exactly.
    """
    if header.compression:
        raise CorruptBatchError(f"compression codec {header.compression} is not supported")
    end = header.batch_length
    if len(batch) != end:
        raise CorruptBatchError("batch is truncated")
    base = header.base_offset
    first_ts = header.first_timestamp
    dec = varint.decode
    cls = ConsumerRecord
    append = out.append
    pos = HEADER_SIZE
    try:
        for _ in range(header.record_count):
            b = batch[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = dec(batch, pos, end)
            rec_end = pos + length
            if length < MIN_RECORD_SIZE - 1 or rec_end > end:
                raise CorruptBatchError(f"record length {length} is out of bounds")
            pos += 1  # attributes
            b = batch[pos]
            if b < 0x80:
                tsd = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                tsd, pos = dec(batch, pos, rec_end)
            b = batch[pos]
            if b < 0x80:
                od = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                od, pos = dec(batch, pos, rec_end)
            b = batch[pos]
            if b == 1:
                key = None
                pos += 1
            elif b < 0x80 and not b & 1:
                pos += 1
                key = batch[pos : pos + (b >> 1)]
                pos += b >> 1
            else:
                key, pos = _read_bytes(batch, pos, rec_end)
            b = batch[pos]
            if b == 1:
                value = None
                pos += 1
            elif b < 0x80 and not b & 1:
                pos += 1
                value = batch[pos : pos + (b >> 1)]
                pos += b >> 1
            else:
                value, pos = _read_bytes(batch, pos, rec_end)
            if batch[pos] == 0:
                headers: tuple[Header, ...] = ()
                pos += 1
            else:
                headers, pos = _read_headers(batch, pos, rec_end)
            if pos != rec_end:
                raise CorruptBatchError("record length does not match its fields")
            offset = base + od
            if offset >= from_offset:
                append(_new(cls, (topic, partition, offset, first_ts + tsd, key, value, headers)))
    except IndexError:
        raise CorruptBatchError("record runs past the end of its batch") from None
    if pos != end:
        raise CorruptBatchError("bytes left after the last record")


def _read_bytes(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = varint.decode(buf, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise CorruptBatchError(f"field length {n} is out of bounds")
    return buf[pos : pos + n], pos + n


def _read_headers(buf: bytes, pos: int, end: int) -> tuple[tuple[Header, ...], int]:
    count, pos = varint.decode(buf, pos, end)
    if count < 0:
        raise CorruptBatchError(f"negative header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        name, pos = _read_bytes(buf, pos, end)
        if name is None:
            raise CorruptBatchError("record header key is null")
        value, pos = _read_bytes(buf, pos, end)
        try:
            headers.append((name.decode(), value))
        except UnicodeDecodeError as exc:
            raise CorruptBatchError("record header key is not utf-8") from exc
    return tuple(headers), pos
