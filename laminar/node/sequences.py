"""Idempotent-producer sequence rule, shared by both client protocols (native and Kafka).

A producer numbers its records per partition (base sequence of each batch, contiguous) and
may have several batches of one partition in flight. The log must hold them in sequence order,
each once, so a batch is appended only if its base sequence follows the producer's last one in
this partition; a retry of a remembered batch gets the first write's offsets; anything else is
refused with nothing stored (OutOfOrderSequenceError: the producer resends it after the batches
before it). A producer this log does not know (new, or forgotten: the table keeps a few batches
per producer and, after a restart, what the log's tail shows) is accepted at any sequence, as
Kafka's brokers do for an unknown producer id, so a producer never gets stuck on a partition
that lost its state.
"""

from __future__ import annotations

from laminar.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from laminar.node.producers import ProducerTable, Written
from laminar.segment.batch import BatchHeader

SEQUENCE_SPACE = 1 << 31
"""Sequences are int32 and wrap to 0 after 2**31 - 1 (Kafka's rule)."""


def check(table: ProducerTable, header: BatchHeader) -> Written | None:
    """The earlier write if ``header`` is a retry of a remembered batch; None if it may be
    appended; raises OutOfOrderSequenceError, DuplicateSequenceError or
    InvalidProducerEpochError if it may not (nothing is stored then)."""
    producer_id = header.producer_id
    if producer_id < 0 or header.base_sequence < 0:
        return None  # not idempotent: always appended
    earlier = table.find(header)
    if earlier is not None:
        return earlier
    last = table.last(producer_id)
    if last is None:
        return None  # unknown producer: accepted (see the module docstring)
    epoch, sequence = header.producer_epoch, header.base_sequence
    if epoch < last.producer_epoch:
        raise InvalidProducerEpochError(
            f"producer epoch {epoch} is older than {last.producer_epoch}, already stored"
        )
    if epoch > last.producer_epoch:
        if sequence != 0:
            raise OutOfOrderSequenceError(f"a new epoch starts at sequence 0, not {sequence}")
        return None
    expected = (last.last_sequence + 1) % SEQUENCE_SPACE
    if sequence == expected:
        return None
    behind = (expected - sequence) % SEQUENCE_SPACE
    if behind < SEQUENCE_SPACE // 2:
        raise DuplicateSequenceError(
            f"sequence {sequence} was written before the batches this partition remembers"
        )
    raise OutOfOrderSequenceError(f"expected sequence {expected}, got {sequence}")
