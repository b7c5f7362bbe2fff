"""The SWIM message objects the core consumes and produces (the codec maps them to frames)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from laminar.membership.state import MemberState


@dataclass(frozen=True, slots=True)
class Update:
    """One member's belief about one node: gossiped on probes, and the unit of a full sync."""

    node_id: int
    address: str
    incarnation: int
    state: MemberState
    meta: Mapping[str, str]
    from_id: int = 0  # who reported it (the accuser for SUSPECT); 0 if not known


@dataclass(frozen=True, slots=True)
class Ping:
    source_id: int
    seq: int
    target_id: int  # the receiver acks only if this is its own id (guards against reused addresses)
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Ack:
    source_id: int
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Nack:
    """A ping-req helper got no ack from the target in time (the helper is reachable, though)."""

    source_id: int
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask the receiver to ping ``target`` on the sender's behalf and forward the ack."""

    source_id: int
    seq: int
    target_id: int
    target_address: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Sync:
    """(A chunk of) the sender's full member list; ``want_reply`` asks for the receiver's."""

    source_id: int
    members: tuple[Update, ...]
    want_reply: bool
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Gossip:
    """Updates only, sent unprompted (used to spread a leave before the node goes away)."""

    source_id: int
    updates: tuple[Update, ...] = ()


Message = Ping | Ack | Nack | PingReq | Sync | Gossip

# Upper bounds on the Cap'n Proto encoding, used to fill datagrams without encoding twice.
# Frame header, root, union body and two list headers; a ping-req adds text_size(target_address).
MESSAGE_OVERHEAD_BYTES = 16 + 176


def text_size(s: str) -> int:
    """Bytes of a Cap'n Proto Text: UTF-8, a NUL, padded to whole words."""
    return (len(s.encode()) + 1 + 7) // 8 * 8


def update_size(update: Update) -> int:
    """An upper bound of the bytes one Update adds to an encoded message."""
    size = 48 + 8 + text_size(update.address)
    for key, value in update.meta.items():
        size += 16 + text_size(key) + text_size(value)
    return size
