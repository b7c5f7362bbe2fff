"""Checkpoints of the metadata state machine: what keeps the metadata log bounded.

A checkpoint is itself a metadata command: the metadata leader proposes, every so many
commands or bytes, a ``checkpoint`` entry restating the whole state as it stands right before
that entry (the leader proposes one only while it has applied its whole log, so no command
can sit between the state it serialized and the entry). Once a node has applied a checkpoint
and holds it durably, it deletes the metadata log's segments below it; the log rolls a new
segment at every checkpoint (``LogStorage(roll_at_control=True)``), so the log then starts
exactly at a checkpoint entry, or at offset 0. A node replaying its log after a restart, or
reset by the leader to the leader's first offset (a node that lagged too far, or a new one),
starts from a checkpoint and rebuilds everything from it.

The checkpoint is a control batch (the storage recognises it by its control bit alone, without
decoding it) whose one record holds zstd-compressed canonical JSON (a control batch itself is
never compressed): the same state gives
the same bytes on every node. Dictionaries are restated in their iteration order (which is
part of the state: every node inserts in log order), sets sorted.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from typing import Any

from laminar.auth.state import AuthState
from laminar.errors import InvalidRequestError
from laminar.node.metadata import (
    MetadataState,
    NodeInfo,
    PartitionAssignment,
    Recovery,
    Topic,
    TopicSettings,
)
from laminar.segment import batch as record_batch
from laminar.segment import compression

FORMAT = 1
CHECKPOINT_KEY = struct.pack(">H", 0x4D43)
"""Key of a checkpoint batch's record (a control batch: its kind; not a Raft core kind)."""
METADATA_MAX_BATCH = 16 * 1024 * 1024
"""Batch limit of the metadata log: room for a checkpoint (compressed; ~0.2 MB at 10,000
partitions), within the peer frame's 64 MiB payload and the 64 MiB a reader inflates."""


def snapshot(state: MetadataState) -> dict[str, Any]:
    """The whole state as a JSON value (compact lists, canonical order)."""
    return {
        "format": FORMAT,
        "next_topic_id": state.next_topic_id,
        "topics": [_topic(topic) for topic in state.topics.values()],
        "nodes": [
            [n.node_id, n.client_address, n.peer_address, n.rack, n.kafka_address, n.incarnation]
            for n in state.nodes.values()
        ],
        "draining": sorted(state.draining),
        "recovering": [
            [group, node, r.incident, r.voter] for (group, node), r in state.recovering.items()
        ],
        "queue_configs": [[group, values] for group, values in state.queue_configs.items()],
        "outcomes": [[request_id, outcome] for request_id, outcome in state.outcomes.items()],
        "auth": state.auth.to_json(),
    }


def _topic(topic: Topic) -> list[Any]:
    s = topic.settings
    settings = [
        s.partitions,
        s.replication_factor,
        s.segment_bytes,
        s.segment_ms,
        s.retention_ms,
        s.retention_bytes,
        s.partitioning,
        s.auto_split_above,
        s.auto_merge_below,
        s.auto_window_ms,
        s.max_partitions,
    ]
    partitions = [
        [
            a.replicas,
            a.leader,
            a.leader_term,
            a.adding,
            a.removing,
            a.move_id,
            a.target_ready,
            [[node, origin] for node, origin in a.origins.items()],
            a.range_start,
            a.range_end,
            a.state,
            a.parents,
            a.seal_end,
        ]
        for a in topic.partitions
    ]
    return [topic.name, topic.topic_id, settings, partitions, topic.operation]


def encode(state: MetadataState) -> bytes:
    """Canonical bytes of the state (what a checkpoint carries and equality compares)."""
    return json.dumps(snapshot(state), separators=(",", ":"), sort_keys=True).encode()


def restore(state: MetadataState, data: bytes) -> None:
    """Replace ``state``'s contents (in place: node components hold the object) with a
    checkpoint's. The checkpoint is parsed whole first: a malformed one changes nothing."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise InvalidRequestError(f"unknown metadata checkpoint format {doc.get('format')}")
        topics = {}
        for name, topic_id, settings, partitions, *rest in doc["topics"]:
            operation = rest[0] if rest else None  # key-range topics (laminar.splits)
            if operation is not None and not isinstance(operation, dict):
                raise TypeError("a topic's operation is an object")
            topics[name] = Topic(
                name,
                topic_id,
                TopicSettings(*settings),
                [_assignment(*fields) for fields in partitions],
                operation,
            )
        nodes = {int(n[0]): NodeInfo(*n) for n in doc["nodes"]}
        draining = {int(n) for n in doc["draining"]}
        recovering = {
            (int(group), int(node)): Recovery(incident, bool(voter))
            for group, node, incident, voter in doc["recovering"]
        }
        queue_configs = {str(group): dict(values) for group, values in doc["queue_configs"]}
        outcomes = OrderedDict((str(rid), outcome) for rid, outcome in doc["outcomes"])
        next_topic_id = int(doc["next_topic_id"])
        auth = AuthState.from_json(doc.get("auth"))  # absent: written before users existed
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed metadata checkpoint: {exc}") from None
    state.topics = topics
    state.nodes = nodes
    state.draining = draining
    state.recovering = recovering
    state.queue_configs = queue_configs
    state.outcomes = outcomes
    state.next_topic_id = next_topic_id
    state.auth = auth
    state.placement_changes += 1


def _assignment(
    replicas: list[int],
    leader: int,
    leader_term: int,
    adding: int,
    removing: int,
    move_id: str,
    target_ready: bool,
    origins: list[list[int]],
    range_start: int = -1,
    range_end: int = -1,
    state: str = "active",
    parents: list[int] | None = None,
    seal_end: int = -1,
) -> PartitionAssignment:
    """A partition's restated assignment (the range fields are absent before key-range
    partitioning: a hash topic's defaults)."""
    return PartitionAssignment(
        list(replicas),
        leader,
        leader_term,
        adding,
        removing,
        move_id,
        target_ready,
        {int(node): origin for node, origin in origins},
        range_start,
        range_end,
        state,
        list(parents or []),
        seal_end,
    )


def checkpoint_batch(state: MetadataState, timestamp_ms: int) -> bytes:
    """The record batch of a checkpoint of ``state`` (compressed; a control batch)."""
    value = compression.compress(compression.ZSTD, encode(state))
    return record_batch.build_batch([(CHECKPOINT_KEY, value, (), timestamp_ms)], control=True)


def checkpoint_data(batch: bytes | memoryview) -> bytes | None:
    """The state a metadata batch restates if it is a checkpoint, else None (a command)."""
    header = record_batch.read_header(batch)
    if not record_batch.is_control(header):
        return None
    records = record_batch.decode_records(batch)
    if len(records) != 1 or records[0].key != CHECKPOINT_KEY or records[0].value is None:
        raise InvalidRequestError("a metadata control batch that is no checkpoint")
    return compression.decompress(compression.ZSTD, records[0].value)


def is_checkpoint(batch: bytes | memoryview) -> bool:
    """Cheap: the control bit of a metadata batch (commands are never control batches)."""
    return record_batch.is_control(record_batch.read_header(batch))
