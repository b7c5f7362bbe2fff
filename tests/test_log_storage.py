"""The partition log as the Raft log: how stored batches come back as Raft entries."""

from __future__ import annotations

from pathlib import Path

from laminar.node.log_storage import LogStorage
from laminar.raft import Entry, EntryKind
from laminar.segment.batch import build_batch, control_batch
from laminar.segment.log import PartitionLog


def test_core_control_batches_are_core_entries_and_other_control_batches_are_normal(
    tmp_path: Path,
) -> None:
    storage = LogStorage(PartitionLog.open(tmp_path / "log"))
    node_state = build_batch([(b"\x53\x51", b"queue state", (), 1)], control=True)
    client = build_batch([(None, b"v", (), 1)])
    storage.append(
        [
            Entry(1, 0, 0, EntryKind.NOOP, b""),
            Entry(1, 1, 1, EntryKind.CONFIG, b'{"voters":[1]}'),
            Entry(1, 2, 2, EntryKind.NORMAL, memoryview(node_state)),
            Entry(1, 3, 3, EntryKind.NORMAL, memoryview(client)),
        ]
    )
    kinds = [(e.index, e.kind) for e in storage.entries(0, 4, 1 << 20)]
    assert kinds == [
        (0, EntryKind.NOOP),
        (1, EntryKind.CONFIG),
        (2, EntryKind.NORMAL),
        (3, EntryKind.NORMAL),
    ]
    entries = storage.entries(0, 4, 1 << 20)
    assert entries[1].data == b'{"voters":[1]}'
    # a node-written control batch is replicated byte for byte, like a client's batch
    assert bytes(entries[2].data)[16:] == node_state[16:]
    assert control_batch(int(EntryKind.NOOP), b"", 0)[16:] != node_state[16:]
    storage.log.close()
