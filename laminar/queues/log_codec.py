"""Share-group state records inside a partition's own log, as control batches.

The leader of a partition writes its share groups' records (``records.py``) into the
partition's Raft log, so they are replicated, made durable and recovered with the partition
itself. They travel as *control* batches (attribute bit 5, as Kafka's transaction markers):
stream consumers, the Spark source and Kafka clients skip control batches, so a topic read as a
stream looks the same with or without queues on it. Each record of such a batch is one share
record of one group: key = the batch kind (2 bytes), value = group name length (2 bytes), group
name (UTF-8), then the record (``records.encode``).

``CHECKPOINT_KIND`` marks a batch that restates the state of *every* share group of the
partition (one ``Snapshot`` each): a new leader replays from the newest such batch on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from laminar.queues.records import Record, decode, encode
from laminar.segment import batch as record_batch

SHARE_KIND = 0x5351  # "SQ": changes of share groups' state
CHECKPOINT_KIND = 0x5343  # "SC": every group's state restated
_KIND = struct.Struct(">H")
_SHARE_KEY = _KIND.pack(SHARE_KIND)
_CHECKPOINT_KEY = _KIND.pack(CHECKPOINT_KIND)


def encode_batch(items: Sequence[tuple[str, Record]], now_ms: int, checkpoint: bool) -> bytes:
    """One control batch holding ``items`` ((group, record) in order)."""
    key = _CHECKPOINT_KEY if checkpoint else _SHARE_KEY
    records = []
    for group, record in items:
        name = group.encode()
        records.append((key, _KIND.pack(len(name)) + name + encode(record), (), now_ms))
    return record_batch.build_batch(records, control=True)


def decode_batch(batch: bytes | memoryview) -> tuple[bool, list[tuple[str, Record]]] | None:
    """(is a checkpoint, its (group, record) items), or None for any other control batch.
    Raises ValueError for a share batch that does not decode (no leader wrote it)."""
    records = record_batch.decode_records(batch)
    if not records or records[0].key not in (_SHARE_KEY, _CHECKPOINT_KEY):
        return None
    items: list[tuple[str, Record]] = []
    for record in records:
        value = record.value or b""
        if len(value) < 2:
            raise ValueError("share record without a group")
        (size,) = _KIND.unpack_from(value)
        group = value[2 : 2 + size].decode()
        items.append((group, decode(value[2 + size :])))
    return records[0].key == _CHECKPOINT_KEY, items
