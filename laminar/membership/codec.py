"""SWIM messages to and from one framed datagram (laminar frame + Cap'n Proto ``SwimMessage``).

``decode`` raises ProtocolError for anything malformed: bad frame or crc, wrong kind, a message
pycapnp cannot read, or values outside what the protocol allows. It never raises anything else.
"""

from __future__ import annotations

from typing import Any

from laminar import schemas
from laminar.errors import ProtocolError
from laminar.framing import decode_datagram, encode_frame
from laminar.membership.messages import Ack, Gossip, Message, Nack, Ping, PingReq, Sync, Update
from laminar.membership.state import MAX_INCARNATION, MemberState
from laminar.protocol import KIND_SWIM

FRAME_KIND = KIND_SWIM  # the frame kind of every SWIM datagram
MAX_DATAGRAM_BYTES = 65507  # the largest UDP payload over IPv4
MAX_UPDATES = 4096
MAX_META_ENTRIES = 64
_TRAVERSAL_LIMIT_WORDS = MAX_DATAGRAM_BYTES // 8 + 64
_NESTING_LIMIT = 16


def _schema() -> Any:
    return schemas.load("swim")


def _fill_updates(builder: Any, name: str, updates: tuple[Update, ...]) -> None:
    if not updates:
        return
    out = builder.init(name, len(updates))
    for slot, update in zip(out, updates, strict=True):
        slot.nodeId = update.node_id
        slot.address = update.address
        slot.incarnation = update.incarnation
        slot.state = update.state.value  # the capnp enumerant names are the values
        slot.fromId = update.from_id
        if update.meta:
            entries = slot.init("meta", len(update.meta))
            for entry, (key, value) in zip(entries, update.meta.items(), strict=True):
                entry.key = key
                entry.value = value


def encode(message: Message) -> bytes:
    """The whole datagram for ``message``."""
    root = _schema().SwimMessage.new_message()
    root.sourceId = message.source_id
    _fill_updates(root, "updates", message.updates)
    body = root.body
    match message:
        case Ping():
            ping = body.init("ping")
            ping.seq = message.seq
            ping.targetId = message.target_id
        case Ack():
            body.init("ack").seq = message.seq
        case Nack():
            body.init("nack").seq = message.seq
        case PingReq():
            req = body.init("pingReq")
            req.seq = message.seq
            req.targetId = message.target_id
            req.targetAddress = message.target_address
        case Sync():
            sync = body.init("sync")
            sync.wantReply = message.want_reply
            _fill_updates(sync, "members", message.members)
        case Gossip():
            body.gossip = None
        case _:
            raise TypeError(f"not a SWIM message: {type(message).__name__}")
    return b"".join(encode_frame(FRAME_KIND, schemas.to_bytes(root)))


def _read_updates(reader: Any) -> tuple[Update, ...]:
    if len(reader) > MAX_UPDATES:
        raise ProtocolError(f"{len(reader)} updates in one message is over the limit")
    out = []
    for item in reader:
        meta = item.meta
        if len(meta) > MAX_META_ENTRIES:
            raise ProtocolError("too many metadata entries")
        if item.incarnation > MAX_INCARNATION:
            raise ProtocolError(f"implausible incarnation {item.incarnation}")
        out.append(
            Update(
                node_id=item.nodeId,
                address=item.address,
                incarnation=item.incarnation,
                state=MemberState(str(item.state)),
                meta={entry.key: entry.value for entry in meta},
                from_id=item.fromId,
            )
        )
    return tuple(out)


def _read(root: Any) -> Message:
    source = root.sourceId
    if source == 0:
        raise ProtocolError("SWIM message without a source node id")
    updates = _read_updates(root.updates)
    body = root.body
    which = str(body.which())
    if which == "ping":
        return Ping(source, body.ping.seq, body.ping.targetId, updates)
    if which == "ack":
        return Ack(source, body.ack.seq, updates)
    if which == "nack":
        return Nack(source, body.nack.seq, updates)
    if which == "pingReq":
        req = body.pingReq
        if not req.targetAddress:
            raise ProtocolError("ping-req without a target address")
        return PingReq(source, req.seq, req.targetId, req.targetAddress, updates)
    if which == "sync":
        sync = body.sync
        return Sync(source, _read_updates(sync.members), bool(sync.wantReply), updates)
    if which == "gossip":
        return Gossip(source, updates)
    raise ProtocolError(f"unknown SWIM message body {which!r}")


def decode(data: bytes) -> Message:
    """Parse one datagram; ProtocolError for any malformed input."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ProtocolError("datagram larger than any UDP payload")
    kind, message, payload = decode_datagram(data)
    if kind != FRAME_KIND:
        raise ProtocolError(f"frame kind {kind:#x} is not a SWIM message")
    if len(payload):
        raise ProtocolError("SWIM frames carry no payload")
    try:
        with _schema().SwimMessage.from_bytes(
            schemas.aligned(message),
            traversal_limit_in_words=_TRAVERSAL_LIMIT_WORDS,
            nesting_limit=_NESTING_LIMIT,
        ) as root:
            return _read(root)
    except ProtocolError:
        raise
    except Exception as exc:  # pycapnp raises KjException, ValueError, UnicodeDecodeError, ...
        raise ProtocolError(f"undecodable SWIM message: {exc}") from exc
