"""Raft messages of many groups <-> one peer frame (Cap'n Proto header + raw entry payload).

Entry data (record batches) never enter the Cap'n Proto message: their lengths are listed in
the entry headers and their bytes follow in the frame payload, in order, so a batch crosses the
wire with no copy on the sending side and one slice on the receiving side.
"""

from __future__ import annotations

from typing import Any

from laminar.errors import ProtocolError
from laminar.protocol import cluster_schema, decode
from laminar.raft import Entry, EntryKind, Message, MessageType

GroupMessage = tuple[int, Message]

_MESSAGE_TYPES = {int(t) for t in MessageType}
_ENTRY_KINDS = {int(k) for k in EntryKind}


def encode_hello(node_id: int, cluster_id: str, address: str, client_address: str) -> bytes:
    message = cluster_schema.PeerMessage.new_message()
    hello = message.init("hello")
    hello.nodeId = node_id
    hello.clusterId = cluster_id
    hello.address = address
    hello.clientAddress = client_address
    return message.to_bytes()


def encode_messages(messages: list[GroupMessage]) -> tuple[bytes, list[Any]]:
    """Return (Cap'n Proto bytes, payload buffers) for one frame carrying ``messages``."""
    peer_message = cluster_schema.PeerMessage.new_message()
    out = peer_message.init("raft", len(messages))
    payload: list[Any] = []
    for slot, (group, msg) in zip(out, messages, strict=True):
        slot.group = group
        slot.type = int(msg.type)
        slot.to = msg.to
        slot.__setattr__("from", msg.frm)
        slot.term = msg.term
        slot.logTerm = msg.log_term
        slot.index = msg.index
        slot.commit = msg.commit
        slot.reject = msg.reject
        slot.rejectHint = msg.reject_hint
        slot.quiesce = msg.quiesce
        if msg.context:
            slot.context = bytes(msg.context)
        if msg.entries:
            headers = slot.init("entries", len(msg.entries))
            for header, entry in zip(headers, msg.entries, strict=True):
                header.term = entry.term
                header.index = entry.index
                header.last = entry.last
                header.kind = int(entry.kind)
                header.dataLength = len(entry.data)
                payload.append(entry.data)
    return peer_message.to_bytes(), payload


def decode_peer_message(message: bytes, payload: memoryview) -> tuple[str, Any]:
    """Decode a peer frame: ("raft", list[GroupMessage]) or (union member name, its reader).

    Raises ProtocolError on anything malformed, so a bad peer frame closes its connection and
    never reaches a Raft group.
    """
    try:
        reader = decode(cluster_schema.PeerMessage, message)
        which = reader.which()
        if which != "raft":
            return which, getattr(reader, which)
        position = 0
        messages: list[GroupMessage] = []
        for slot in reader.raft:
            if slot.type not in _MESSAGE_TYPES:
                raise ProtocolError(f"unknown raft message type {slot.type}")
            entries = []
            for header in slot.entries:
                if header.kind not in _ENTRY_KINDS or header.last < header.index:
                    raise ProtocolError("malformed raft entry header")
                end = position + header.dataLength
                if end > len(payload):
                    raise ProtocolError("raft entry data runs past the frame payload")
                entries.append(
                    Entry(
                        header.term,
                        header.index,
                        header.last,
                        EntryKind(header.kind),
                        payload[position:end],
                    )
                )
                position = end
            messages.append(
                (
                    slot.group,
                    Message(
                        type=MessageType(slot.type),
                        to=slot.to,
                        frm=getattr(slot, "from"),
                        term=slot.term,
                        log_term=slot.logTerm,
                        index=slot.index,
                        entries=entries,
                        commit=slot.commit,
                        reject=slot.reject,
                        reject_hint=slot.rejectHint,
                        context=bytes(slot.context),
                        quiesce=slot.quiesce,
                    ),
                )
            )
        return "raft", messages
    except ProtocolError:
        raise
    except Exception as exc:  # pycapnp raises KjException on out-of-bounds pointers
        raise ProtocolError(f"malformed peer message: {str(exc).splitlines()[0]}") from None
