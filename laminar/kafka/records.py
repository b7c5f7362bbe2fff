"""Kafka RecordBatch v2 <-> laminar record batch: headers converted, records untouched.

Both formats carry the same records (Kafka's v2 record layout) after a fixed header; only the
header differs (Kafka: 61 bytes big-endian with partitionLeaderEpoch, crc32c from the
attributes on; laminar: 68 bytes little-endian with a 64-bit term, crc32c from byte 24 on,
docs/FORMAT.md). Converting is one header pack, one copy of the records and one crc32c pass
over the new batch; no record is parsed. Laminar's control batches (Raft no-ops, queue state)
go out as Kafka control batches holding one COMMIT marker over the same offsets, which every
Kafka client skips, so offsets keep the gaps they have.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c

from laminar.errors import CorruptBatchError
from laminar.segment import batch as lb

K_HEADER_SIZE = 61
K_MAGIC = 2
K_CRC_START = 21
K_LENGTH_OVERHEAD = 12  # baseOffset and batchLength are not counted in batchLength
K_ATTR_TRANSACTIONAL = 1 << 4
K_ATTR_CONTROL = 1 << 5

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_K_HEADER = struct.Struct(">qiibIhiqqqhii")
_K_TAIL = struct.Struct(">hiqqqhii")  # from the attributes on (what the crc covers first)
_K_PREFIX = struct.Struct(">qiibI")  # baseOffset .. crc
_INT32_MAX = (1 << 31) - 1
assert _K_HEADER.size == K_HEADER_SIZE

# A COMMIT control record: key = version 0, type 1; value = version 0, coordinator epoch 0.
# Record: attributes, timestamp delta, offset delta, key length (zigzag 4), key, value length
# (zigzag 6), value, header count; prefixed by its length (zigzag 16).
_CONTROL_BODY = b"\x00\x00\x00\x08" + b"\x00\x00\x00\x01" + b"\x0c" + bytes(6) + b"\x00"
_CONTROL_RECORD = bytes([len(_CONTROL_BODY) * 2]) + _CONTROL_BODY


def iter_kafka_batches(data: memoryview) -> Iterator[memoryview]:
    """The batches of a produce request's records field (whole ones; a partial tail is an
    error: a producer never sends one)."""
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < K_HEADER_SIZE:
            raise CorruptBatchError("record set ends inside a batch header")
        (length,) = struct.unpack_from(">i", data, pos + 8)
        size = length + K_LENGTH_OVERHEAD
        if length < K_HEADER_SIZE - K_LENGTH_OVERHEAD or pos + size > n:
            raise CorruptBatchError(f"batch length {length} is out of bounds")
        magic = data[pos + 16]
        if magic != K_MAGIC:
            raise CorruptBatchError(f"record batch magic {magic} is not supported (only 2)")
        yield data[pos : pos + size]
        pos += size


def to_laminar(kbatch: memoryview) -> bytes:
    """A Kafka v2 batch (crc checked) as a laminar batch (crc computed); records copied once."""
    (
        _base,
        _length,
        _epoch,
        _magic,
        crc,
        attributes,
        lod,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _K_HEADER.unpack_from(kbatch, 0)
    if crc32c.crc32c(kbatch[K_CRC_START:]) != crc:
        raise CorruptBatchError("record batch crc32c mismatch")
    if attributes & K_ATTR_TRANSACTIONAL:
        raise CorruptBatchError("transactional batches are not supported")
    return lb.sealed(
        kbatch[K_HEADER_SIZE:],
        attributes & 0xFFFF,
        lod,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )


def to_kafka(data: bytes | memoryview, out: list[bytes | memoryview]) -> int:
    """Append laminar batches (whole, as read from a log) to ``out`` as Kafka v2 batches;
    returns the bytes appended."""
    view = memoryview(data)
    n = len(view)
    pos = 0
    total = 0
    unpack = lb.HEADER_STRUCT.unpack_from
    while n - pos >= lb.HEADER_SIZE:
        f = unpack(view, pos)
        size = f[2]
        if size < lb.HEADER_SIZE or pos + size > n:
            break
        base, term, attributes, lod = f[0], f[1], f[6], f[7]
        epoch = term if term <= _INT32_MAX else _INT32_MAX
        if attributes & lb.ATTR_CONTROL:
            records: bytes | memoryview = _CONTROL_RECORD
            tail = _K_TAIL.pack(K_ATTR_CONTROL, lod, f[8], f[9], -1, -1, -1, 1)
        else:
            records = view[pos + lb.HEADER_SIZE : pos + size]
            tail = _K_TAIL.pack(attributes, lod, f[8], f[9], f[10], f[11], f[13], f[14])
        crc = crc32c.crc32c(records, crc32c.crc32c(tail))
        length = K_HEADER_SIZE - K_LENGTH_OVERHEAD + len(records)
        head = _K_PREFIX.pack(base, length, epoch, K_MAGIC, crc) + tail
        out.append(head)
        out.append(records)
        total += len(head) + len(records)
        pos += size
    return total
