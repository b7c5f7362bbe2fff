"""The seal: a control batch in a partition's own Raft log after which it takes no record.

Sealing goes through the partition's Raft group like any write, so every replica agrees on the
offset: records proposed before the seal lie below it, and the leader refuses produce from the
moment it proposes the seal (``LogStorage.seal_offset`` is set at proposal on the leader and at
append on followers; a truncation that cuts the seal clears it). A new leader holds every
committed entry, so it knows a committed seal without asking anyone. The batch is a control
batch, so stream readers, the Spark source and Kafka clients skip it.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

from laminar.raft import EntryKind
from laminar.segment import batch as record_batch
from laminar.segment.batch import BatchHeader

if TYPE_CHECKING:
    from laminar.segment.log import Tail

SEAL_KIND = 0x534C  # "SL"
_SEAL_KEY = struct.pack(">H", SEAL_KIND)
SCAN_BATCHES = 1000
"""On open, the seal is looked for walking back from the log's end over control batches: after
a seal only control batches (Raft no-ops, configuration, queue state) are appended, so the walk
stops at the first record batch (no seal after it: one read for most logs). A seal buried
under more control batches than this is not found here; by then the split has long finished
and the metadata (the partition is ``sealed``) refuses writes anyway."""


_RAFT_NOOP = record_batch.control_batch(int(EntryKind.NOOP), b"", 0)[record_batch.STAMP.size :]
"""A Raft no-op batch after its stamp: the same bytes in every one (``control_entry_batch``),
and most control batches are no-ops; comparing costs a tenth of decoding one."""


def is_raft_noop(batch: bytes | memoryview) -> bool:
    """Whether a stored batch is a Raft no-op (``LogStorage`` writes them; see _RAFT_NOOP)."""
    return batch[record_batch.STAMP.size :] == _RAFT_NOOP


def seal_batch(op_id: str, now_ms: int) -> bytes:
    """The seal control batch of operation ``op_id``."""
    payload = json.dumps({"op": op_id}).encode()
    return record_batch.control_batch(SEAL_KIND, payload, now_ms)


def is_seal(batch: bytes | memoryview, header: BatchHeader) -> bool:
    """Whether a stored batch is a seal (cheap unless it is a control batch)."""
    if not record_batch.is_control(header) or header.record_count != 1:
        return False  # a seal is one record (queue state batches usually hold many)
    if is_raft_noop(batch):
        return False
    records = record_batch.decode_records(batch)
    return bool(records) and records[0].key == _SEAL_KEY


_READ = object()


def find_seal(log: Any, tail: Tail | None = None, *, before_tail: Any = _READ) -> int | None:
    """The offset of the seal batch in ``log`` (a PartitionLog), or None. ``tail``: the log's
    tail as walked on open (``PartitionLog.read_tail``), used as far as it reaches; a caller
    that knows the seal before it (a ``TailState``) passes it as ``before_tail``."""
    if tail is not None and tail.end != log.end_offset:
        tail = None  # (read before the log changed)
    offset = log.end_offset - 1
    for _ in range(SCAN_BATCHES):
        if offset < log.start_offset:
            return None
        batch: bytes | memoryview | None
        if tail is not None and offset >= tail.start:
            header = tail.headers[tail.find(offset)]
            batch = tail.controls.get(header.base_offset)  # (control batches only)
        elif before_tail is not _READ:
            return before_tail
        else:
            (batch,) = log.batches(offset, offset + 1, 1)[:1]
            header = record_batch.read_header(batch)
        if batch is None or not record_batch.is_control(header):
            return None
        if is_seal(batch, header):
            return header.base_offset
        offset = header.base_offset - 1
    return None
