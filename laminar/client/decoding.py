"""Records of fetched batches straight into ConsumerRecord objects: one object per record."""

from __future__ import annotations

from collections import OrderedDict

from laminar.client.types import ConsumerRecord, Header
from laminar.segment.batch import BatchHeader, decode_into, decompressed

_new = tuple.__new__


def decode_consumer_records(
    batch: bytes,
    header: BatchHeader,
    topic: str,
    partition: int,
    from_offset: int,
    out: list[ConsumerRecord],
    until_offset: int | None = None,
) -> None:
    """Append the batch's records at or after ``from_offset`` (and before ``until_offset``,
    see ``decode_into``) to ``out``.

    ``batch`` is exactly one batch (``header.batch_length`` bytes); CorruptBatchError if a
    record does not parse or the records do not fill the batch exactly.
    """

    def make(
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[Header, ...],
    ) -> ConsumerRecord:
        return _new(ConsumerRecord, (topic, partition, offset, timestamp, key, value, headers))

    decode_into(batch, header, make, out, from_offset, until_offset)


class InflatedBatches:
    """The last few compressed batches, inflated: a share consumer gets the whole batch with
    every few records it acquires, and would otherwise inflate a large batch again for each.
    Keyed by position, offset and crc, so a batch rewritten at the same offset is not mixed
    up; bounded in entries and bytes."""

    def __init__(self, entries: int = 4, max_bytes: int = 16 << 20) -> None:
        self._kept: OrderedDict[tuple[object, int, int], tuple[bytes, BatchHeader]] = OrderedDict()
        self._entries = entries
        self._max_bytes = max_bytes
        self._bytes = 0

    def get(self, where: object, batch: bytes, header: BatchHeader) -> tuple[bytes, BatchHeader]:
        """``batch`` with its records inflated (CorruptBatchError if they do not inflate)."""
        if not header.compression:
            return batch, header
        key = (where, header.base_offset, header.crc)
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        found = decompressed(batch, header)
        self._kept[key] = found
        self._bytes += len(found[0])
        while self._kept and (len(self._kept) > self._entries or self._bytes > self._max_bytes):
            _, (dropped, _) = self._kept.popitem(last=False)
            self._bytes -= len(dropped)
        return found
