"""Kafka's idempotent-producer sequence rules, on top of laminar's producer table.

laminar's own producer has one batch in flight per partition and only needs duplicates
recognised; Kafka producers pipeline up to five batches and expect the broker to refuse a
gap (OUT_OF_ORDER_SEQUENCE_NUMBER), an older epoch (INVALID_PRODUCER_EPOCH) and to answer a
retried batch with its first write's offsets.
"""

from __future__ import annotations

from laminar.kafka import errors
from laminar.kafka.errors import KafkaError
from laminar.node.producers import ProducerTable, Written
from laminar.segment.batch import BatchHeader

INT32_MAX = (1 << 31) - 1


def check(table: ProducerTable, header: BatchHeader) -> Written | None:
    """The earlier write if ``header`` is a retry; None if it may be appended; raises
    KafkaError if the sequence or epoch is not acceptable."""
    producer_id = header.producer_id
    if producer_id < 0 or header.base_sequence < 0:
        return None
    earlier = table.find(header)
    if earlier is not None:
        return earlier
    last = table.last(producer_id)
    if last is None:
        return None  # a producer this log does not know (new, or its batches expired)
    epoch, sequence = header.producer_epoch, header.base_sequence
    if epoch < last.producer_epoch:
        raise KafkaError(errors.INVALID_PRODUCER_EPOCH, f"producer epoch {epoch} is fenced")
    if epoch > last.producer_epoch:
        if sequence != 0:
            raise KafkaError(
                errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"a new epoch starts at sequence 0, not {sequence}",
            )
        return None
    expected = last.last_sequence + 1
    if expected > INT32_MAX:
        expected = 0
    if sequence == expected:
        return None
    if sequence < expected and expected - sequence < INT32_MAX // 2:
        raise KafkaError(errors.DUPLICATE_SEQUENCE_NUMBER, f"sequence {sequence} was written")
    raise KafkaError(
        errors.OUT_OF_ORDER_SEQUENCE_NUMBER, f"expected sequence {expected}, got {sequence}"
    )
