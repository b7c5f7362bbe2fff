"""Records of fetched batches straight into ConsumerRecord objects: one object per record."""

from __future__ import annotations

from laminar.client.types import ConsumerRecord, Header
from laminar.segment.batch import BatchHeader, decode_into

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
