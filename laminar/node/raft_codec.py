"""Raft messages of many groups <-> one peer frame (Cap'n Proto header + raw entry payload).

Entry data (record batches) never enter the Cap'n Proto message: their lengths are listed in
the entry headers and their bytes follow in the frame payload, in order, so a batch crosses the
wire with no copy on the sending side and one slice on the receiving side.

Decoding is where a peer's input is checked, since the peer port authenticates nothing: every
value must fit what the node can store and send back (terms and offsets up to 2**62, so that
``+ 1`` still fits the signed 64-bit fields of batch headers and messages), and every NORMAL
entry must be one intact record batch spanning exactly its offsets (a control batch only if it
is not the core's NOOP/CONFIG kind). Anything else is a
ProtocolError, which closes that one connection before a Raft group sees any of the frame.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from laminar.errors import LaminarError, ProtocolError
from laminar.protocol import cluster_schema, decode
from laminar.raft import Entry, EntryKind, Message, MessageType
from laminar.segment.batch import ATTR_CONTROL, check_batch, decode_records

GroupMessage = tuple[int, Message]

_TYPE_OF = {int(t): t for t in MessageType}
_ENTRY_KINDS = {int(k) for k in EntryKind}
_NORMAL = EntryKind.NORMAL
MAX_TERM = 2**62
"""No honest cluster counts this high (one election per millisecond: 10^11 years)."""
MAX_OFFSET = 2**62
_TYPES = {int(t): t for t in MessageType}
_MESSAGE = struct.Struct("<QBIIQQqqBqBII")
"""Packed message header: group, type, to, from, term, logTerm, index, commit, reject,
rejectHint, quiesce, context length, entry count."""
_ENTRY = struct.Struct("<QqqBI")
"""Packed entry header: term, index, last, kind, data length."""
FRAME_ENTRY_BYTES = 8 * 1024 * 1024
"""Entry bytes one peer frame carries at most (more than one message's worth: a message holds
at most ``RaftConfig.max_msg_bytes`` of entries, or one larger entry). A drain that catches a
returning node up on thousands of groups at once owes it gigabytes: sent as one frame they
passed the receiver's limit (``framing.MAX_PAYLOAD_BYTES``), which closed the connection,
and the catch-up started over, forever."""


class Hello(NamedTuple):
    """A peer's introduction (field names as in cluster.capnp)."""

    nodeId: int
    clusterId: str
    address: str
    clientAddress: str


class Call(NamedTuple):
    id: int
    method: str
    body: bytes


class Reply(NamedTuple):
    id: int
    errorCode: int
    errorMessage: str
    body: bytes


def encode_hello(node_id: int, cluster_id: str, address: str, client_address: str) -> bytes:
    message = cluster_schema.PeerMessage.new_message()
    hello = message.init("hello")
    hello.nodeId = node_id
    hello.clusterId = cluster_id
    hello.address = address
    hello.clientAddress = client_address
    return message.to_bytes()


def encode_frames(
    messages: list[GroupMessage], max_entry_bytes: int = FRAME_ENTRY_BYTES
) -> list[tuple[bytes, list[Any]]]:
    """``messages`` in order as frames (``encode_messages`` each) whose entries hold at most
    ``max_entry_bytes`` (a single message holding more goes alone)."""
    frames = []
    start = size = 0
    for i, (_, msg) in enumerate(messages):
        if entries := msg.entries:
            length = sum(len(entry.data) for entry in entries)
            if size + length > max_entry_bytes and i > start:
                frames.append(encode_messages(messages[start:i]))
                start, size = i, 0
            size += length
    frames.append(encode_messages(messages[start:] if start else messages))
    return frames


def encode_messages(messages: list[GroupMessage]) -> tuple[bytes, list[Any]]:
    """Return (Cap'n Proto bytes, payload buffers) for one frame carrying ``messages``, in the
    packed form (``raftPacked`` in cluster.capnp): a fixed header per message, its context
    and entry headers. OverflowError for a value outside its field's range."""
    parts: list[bytes] = []
    payload: list[Any] = []
    pack, pack_entry = _MESSAGE.pack, _ENTRY.pack
    try:
        for group, msg in messages:
            context, entries = msg.context, msg.entries
            parts.append(
                pack(
                    group,
                    msg.type,
                    msg.to,
                    msg.frm,
                    msg.term,
                    msg.log_term,
                    msg.index,
                    msg.commit,
                    msg.reject,
                    msg.reject_hint,
                    msg.quiesce,
                    len(context),
                    len(entries),
                )
            )
            if context:
                parts.append(bytes(context))
            for entry in entries:
                parts.append(
                    pack_entry(entry.term, entry.index, entry.last, entry.kind, len(entry.data))
                )
                payload.append(entry.data)
    except struct.error as exc:
        raise OverflowError(f"raft message field out of range: {exc}") from None
    peer_message = cluster_schema.PeerMessage.new_message()
    peer_message.raftPacked = b"".join(parts)
    return peer_message.to_bytes(), payload


def _decode_packed(data: bytes, payload: memoryview) -> list[GroupMessage]:
    """The packed form: every value checked as in ``_check_bounds`` and ``_entry``."""
    messages: list[GroupMessage] = []
    unpack, unpack_entry = _MESSAGE.unpack_from, _ENTRY.unpack_from
    header_size, entry_size = _MESSAGE.size, _ENTRY.size
    size = len(data)
    position = 0  # in data
    taken = 0  # in payload
    while position < size:
        if position + header_size > size:
            raise ProtocolError("raft message header runs past the frame")
        (
            group,
            mtype,
            to,
            frm,
            term,
            log_term,
            index,
            commit,
            reject,
            hint,
            quiesce,
            context_length,
            count,
        ) = unpack(data, position)
        position += header_size
        message_type = _TYPES.get(mtype)
        if message_type is None:
            raise ProtocolError(f"unknown raft message type {mtype}")
        if term > MAX_TERM or log_term > MAX_TERM:
            raise ProtocolError(f"implausible raft term {max(term, log_term)}")
        if not (
            -1 <= index <= MAX_OFFSET and -1 <= commit <= MAX_OFFSET and -1 <= hint <= MAX_OFFSET
        ):
            raise ProtocolError("raft offset out of range")
        context = data[position : position + context_length]
        if len(context) < context_length:
            raise ProtocolError("raft message context runs past the frame")
        position += context_length
        entries = []
        for _ in range(count):
            if position + entry_size > size:
                raise ProtocolError("raft entry header runs past the frame")
            e_term, e_index, e_last, kind, length = unpack_entry(data, position)
            position += entry_size
            end = taken + length
            if end > len(payload):
                raise ProtocolError("raft entry data runs past the frame payload")
            entries.append(_entry(kind, e_index, e_last, e_term, payload[taken:end]))
            taken = end
        messages.append(
            (
                group,
                Message(
                    type=message_type,
                    to=to,
                    frm=frm,
                    term=term,
                    log_term=log_term,
                    index=index,
                    entries=entries,
                    commit=commit,
                    reject=bool(reject),
                    reject_hint=hint,
                    context=context,
                    quiesce=bool(quiesce),
                ),
            )
        )
    return messages


def decode_peer_message(message: bytes, payload: memoryview) -> tuple[str, Any]:
    """Decode a peer frame: ("raft", list[GroupMessage]), ("hello", Hello), ("call", Call) or
    ("reply", Reply), every field read and checked here.

    Raises ProtocolError on anything malformed, so a bad peer frame closes its connection and
    never reaches a Raft group or a call handler.
    """
    try:
        reader = decode(cluster_schema.PeerMessage, message)
        which = reader.which()
        if which == "hello":
            h = reader.hello
            return which, Hello(h.nodeId, h.clusterId, h.address, h.clientAddress)
        if which == "call":
            return which, Call(reader.call.id, reader.call.method, bytes(reader.call.body))
        if which == "reply":
            r = reader.reply
            return which, Reply(r.id, r.errorCode, r.errorMessage, bytes(r.body))
        if which == "raftPacked":
            return "raft", _decode_packed(reader.raftPacked, payload)
        if which != "raft":  # (the list form: what nodes sent before the packed one)
            raise ProtocolError(f"unknown peer message {which!r}")
        position = 0
        messages: list[GroupMessage] = []
        for slot in reader.raft:
            # Each field read once: a pycapnp attribute read costs about a microsecond, and a
            # frame carries a message per group (hundreds when many partitions are busy).
            kind = _TYPE_OF.get(slot.type)
            if kind is None:
                raise ProtocolError(f"unknown raft message type {slot.type}")
            term, log_term = slot.term, slot.logTerm
            index, commit, reject_hint = slot.index, slot.commit, slot.rejectHint
            _check_bounds(term, log_term, index, commit, reject_hint)
            entries = []
            for header in slot.entries:
                end = position + header.dataLength
                if end > len(payload):
                    raise ProtocolError("raft entry data runs past the frame payload")
                entries.append(
                    _entry(
                        header.kind, header.index, header.last, header.term, payload[position:end]
                    )
                )
                position = end
            context = slot.context
            messages.append(
                (
                    slot.group,
                    Message(
                        type=kind,
                        to=slot.to,
                        frm=getattr(slot, "from"),
                        term=term,
                        log_term=log_term,
                        index=index,
                        entries=entries,
                        commit=commit,
                        reject=slot.reject,
                        reject_hint=reject_hint,
                        context=bytes(context) if context else b"",
                        quiesce=slot.quiesce,
                    ),
                )
            )
        return "raft", messages
    except ProtocolError:
        raise
    except Exception as exc:  # pycapnp: KjException (bad pointers), UnicodeDecodeError (Text)
        raise ProtocolError(f"malformed peer message: {str(exc).splitlines()[0]}") from None


def _check_bounds(term: int, log_term: int, index: int, commit: int, reject_hint: int) -> None:
    if term > MAX_TERM or log_term > MAX_TERM:
        raise ProtocolError(f"implausible raft term {max(term, log_term)}")
    for value in (index, commit, reject_hint):
        if not -1 <= value <= MAX_OFFSET:
            raise ProtocolError(f"raft offset {value} out of range")


def _entry(kind: int, index: int, last: int, term: int, data: memoryview) -> Entry:
    """One entry, checked: known kind, offsets in range, and for NORMAL one intact batch."""
    if kind not in _ENTRY_KINDS or not 0 <= index <= last <= MAX_OFFSET or term > MAX_TERM:
        raise ProtocolError("malformed raft entry header")
    if kind == _NORMAL:
        try:
            fields = check_batch(data)
        except LaminarError as exc:
            raise ProtocolError(f"raft entry {index} holds no intact batch: {exc}") from None
        if fields[14] != last - index + 1:
            raise ProtocolError(f"raft entry {index} batch does not span [{index}, {last}]")
        if fields[6] & ATTR_CONTROL and _core_control(data):
            # Stored, it would read back as a NOOP/CONFIG entry (log_storage.batch_to_entry).
            raise ProtocolError(f"raft entry {index} is NORMAL but holds a core control batch")
    return Entry(term, index, last, EntryKind(kind), data)


_CORE_KEYS = frozenset(struct.pack(">H", int(k)) for k in (EntryKind.NOOP, EntryKind.CONFIG))


def _core_control(data: memoryview) -> bool:
    """A control batch the Raft core reads as its own entry (a NORMAL entry may carry other
    control batches: the share-group state of laminar.queues)."""
    try:
        records = decode_records(data)
    except LaminarError:
        return True
    return not records or (records[0].key or b"\0\0") in _CORE_KEYS
