"""Sans-I/O Raft core: one ``RaftNode`` per group, driven through ``Ready``/``advance``."""

from laminar.raft.confchange import decode_conf, encode_conf
from laminar.raft.core import RaftNode
from laminar.raft.storage import CompactedError, MemoryStorage, Storage, UnavailableError
from laminar.raft.types import (
    ConfChange,
    ConfChangeRejected,
    ConfChangeType,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    NotLeader,
    PeerStatus,
    ProgressState,
    ProposalDropped,
    RaftConfig,
    Ready,
    Role,
    Status,
)

__all__ = [
    "CompactedError",
    "ConfChange",
    "ConfChangeRejected",
    "ConfChangeType",
    "ConfState",
    "Entry",
    "EntryKind",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "NotLeader",
    "PeerStatus",
    "ProgressState",
    "ProposalDropped",
    "RaftConfig",
    "RaftNode",
    "Ready",
    "Role",
    "Status",
    "Storage",
    "UnavailableError",
    "decode_conf",
    "encode_conf",
]
