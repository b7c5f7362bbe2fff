"""Hostile network inputs for a node: valid frames from the real encoders, then mutated.

Three kinds, one per port a peer can reach: client frames (client TCP port), peer frames
(peer TCP port: hello, Raft messages of many groups, internal calls and replies) and gossip
datagrams (peer UDP port). Each generator draws a *valid* input from the same encoders the
node and the client library use, and ``mutate_*`` then breaks it the ways a buggy or hostile
peer would: bit flips and extreme integers inside the Cap'n Proto message with the frame crc
recomputed (so the decoder, not the crc, has to cope), lying length fields, wrong crc, unknown
frame kinds, truncation, concatenation, malformed record batches, or plain noise.

Everything is drawn from one ``random.Random``, so a run is replayed by its seed. Generated
requests never name a node id, topic or method that would be a legitimate destructive admin
action (deleting the topic a run checks, draining a real node, registering a fake node): those
are not malformed input but authority the ports do not yet check (no auth on the board yet).
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c

from laminar.errors import ProtocolError
from laminar.framing import MAGIC, VERSION, encode_frame
from laminar.membership import codec as swim_codec
from laminar.membership.messages import Ack, Gossip, Message, Nack, Ping, PingReq, Sync, Update
from laminar.membership.state import MAX_INCARNATION, MemberState
from laminar.node.raft_codec import decode_peer_message, encode_hello, encode_messages
from laminar.protocol import (
    KIND_PEER,
    KIND_REQUEST,
    KIND_RESPONSE,
    KIND_SWIM,
    client_schema,
    cluster_schema,
)
from laminar.raft import ConfState, Entry, EntryKind, MessageType
from laminar.raft import Message as RaftMessage
from laminar.raft.confchange import encode_conf
from laminar.schemas import READ_ERRORS
from laminar.segment import batch as record_batch

FAKE_PEER_ID = 99
"""The node id fuzzing peer connections introduce themselves with (no real member has it)."""

U64 = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
I64 = (0, 1, -1, -2, -(2**31), 2**31 - 1, 2**32, 2**62, 2**63 - 1, -(2**63))
U32 = (0, 1, 7, 2**16, 2**20, 2**24, 2**31 - 1, 2**31, 2**32 - 1)
EXTREME_WORDS = (
    b"\x00" * 8,
    b"\xff" * 8,
    b"\xff\xff\xff\x7f\x00\x00\x00\x00",
    b"\x00\x00\x00\x80\x00\x00\x00\x00",
    b"\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x00\x00\x00\x00\x00\x00\x00\x80",
    b"\x01\x00\x00\x00\xff\xff\xff\xff",
    b"\xfc\xff\xff\xff\x00\x00\x01\x00",
    b"\x01\x00\x00\x00\x07\x00\x00\x00",
)


def u64(rng: random.Random) -> int:
    return rng.choice(U64) if rng.random() < 0.3 else rng.randrange(0, 1000)


def i64(rng: random.Random) -> int:
    return rng.choice(I64) if rng.random() < 0.3 else rng.randrange(-2, 1000)


def u32(rng: random.Random) -> int:
    return rng.choice(U32) if rng.random() < 0.3 else rng.randrange(0, 1000)


def text(rng: random.Random, choices: tuple[str, ...]) -> str:
    roll = rng.random()
    if roll < 0.8:
        return rng.choice(choices)
    if roll < 0.9:
        return rng.choice(("", "\u00e9\u4e2d", "a" * rng.randrange(200, 2000), "x\x00y"))
    return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 40)))


# -- frames ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Frame:
    """One frame before sealing: header kind, Cap'n Proto message and raw payload."""

    kind: int
    message: bytes
    payload: bytes = b""


def seal(frame: Frame, covers_payload: bool) -> bytes:
    """The frame's bytes with a correct header and crc."""
    return b"".join(
        bytes(part)
        for part in encode_frame(
            frame.kind, frame.message, frame.payload, crc_covers_payload=covers_payload
        )
    )


# -- record batches ----------------------------------------------------------------------------


def valid_batch(rng: random.Random, records: int | None = None) -> bytes:
    count = records if records is not None else rng.choice((1, 1, 2, 5, 30))
    return record_batch.build_batch(
        [
            (
                None if rng.random() < 0.5 else b"k%d" % i,
                rng.randbytes(rng.randrange(0, 120)),
                (("h", b"v"),) if rng.random() < 0.1 else (),
                rng.choice((0, 1_700_000_000_000, 2**62, -1)),
            )
            for i in range(count)
        ]
    )


def broken_batch(rng: random.Random) -> bytes:
    """A record batch with one defect a client library would never produce."""
    data = bytearray(valid_batch(rng))
    roll = rng.randrange(9)
    if roll == 0:  # a flipped bit anywhere (the batch crc notices)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif roll == 1:  # truncated
        del data[rng.randrange(len(data)) :]
    elif roll == 2:  # batch_length lies
        struct.pack_into("<i", data, 16, rng.choice((0, -1, len(data) + 1, 2**31 - 1)))
    elif roll == 3:  # record count lies, crc recomputed so only the count check can notice
        struct.pack_into("<i", data, 64, rng.choice((0, -1, 2**31 - 1, 1000)))
        _recrc(data)
    elif roll == 4:  # control bit, a codec over plain records, or no codec, crc recomputed
        data[26] |= rng.choice((0x20, 0x01, 0x04, 0x05, 0x07))
        _recrc(data)
    elif roll == 5:  # garbage records, valid header and crc
        data[68:] = rng.randbytes(len(data) - 68)
        _recrc(data)
    elif roll == 6:  # extra bytes after the batch
        data += rng.randbytes(rng.randrange(1, 64))
    elif roll == 7:  # unknown magic
        data[24] = rng.choice((0, 2, 255))
        _recrc(data)
    else:  # only a header
        del data[68:]
        _recrc(data)
    return bytes(data)


def _recrc(data: bytearray) -> None:
    """Recompute a batch's crc (bytes 20..23, over everything from byte 24)."""
    if len(data) >= record_batch.HEADER_SIZE:
        struct.pack_into("<I", data, 20, crc32c.crc32c(memoryview(data)[24:]))


# -- client requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """What a generated client request may name: the cluster's real topics and sizes."""

    topics: tuple[str, ...]
    partitions: int
    protected: frozenset[str]  # never deleted (the run reads them back afterwards)


def client_request(rng: random.Random, target: ClientTarget) -> Frame:
    request = client_schema.Request.new_message()
    request.correlationId = u64(rng)
    request.apiVersion = 1 if rng.random() < 0.9 else rng.choice((0, 2, 65535))
    body = request.body
    topics = (*target.topics, "no-such-topic")
    payload = b""
    roll = rng.randrange(8)
    if roll == 0:
        body.init("metadata").topics = [text(rng, topics) for _ in range(rng.choice((0, 0, 1, 3)))]
    elif roll == 1:
        spec = body.init("createTopic")
        spec.name = text(rng, ("fuzz-a", "fuzz-b", "", "bad/name", "..", "fuzz" * 80))
        # A valid small topic sometimes; otherwise a size the node must refuse, never a
        # legitimate huge one (a topic of 10^6 partitions is an admin decision, not a fuzz).
        spec.partitions = rng.choice((0, 1, 2, 2**20, 2**32 - 1))
        spec.replicationFactor = rng.choice((0, 1, 3, 4, 65535))
        spec.segmentBytes = i64(rng)
        spec.segmentMs = i64(rng)
        spec.retentionMs = i64(rng)
        spec.retentionBytes = i64(rng)
    elif roll == 2:
        name = text(rng, ("no-such-topic", "fuzz-a", ""))
        body.deleteTopic = "no-such-topic" if name in target.protected else name
    elif roll in (3, 4):
        produce = body.init("produce")
        produce.acks = rng.choice((-1, -1, 1, 0, 2, -128, 127))
        produce.timeoutMs = rng.choice((0, 1, 50, 2**32 - 1))
        count = rng.choice((0, 1, 1, 2, 4))
        refs = produce.init("batches", count)
        parts: list[bytes] = []
        position = 0
        for ref in refs:
            batch = valid_batch(rng) if rng.random() < 0.6 else broken_batch(rng)
            ref.topic = text(rng, topics)
            ref.partition = rng.randrange(target.partitions + 1) if rng.random() < 0.9 else u32(rng)
            ref.payloadOffset = position if rng.random() < 0.85 else u32(rng)
            ref.payloadLength = len(batch) if rng.random() < 0.85 else u32(rng)
            parts.append(batch)
            position += len(batch)
        payload = b"".join(parts)
    elif roll == 5:
        fetch = body.init("fetch")
        fetch.maxWaitMs = rng.choice((0, 0, 0, 1, 20)) if rng.random() < 0.98 else u32(rng)
        fetch.minBytes = u32(rng)
        fetch.maxBytes = u32(rng)
        for ask in fetch.init("partitions", rng.choice((0, 1, 1, 2, 3))):
            ask.topic = text(rng, topics)
            ask.partition = rng.randrange(target.partitions + 1) if rng.random() < 0.9 else u32(rng)
            ask.offset = i64(rng)
            ask.maxBytes = u32(rng)
    elif roll == 6:
        for query in body.init("listOffsets").init("queries", rng.choice((0, 1, 2))):
            query.topic = text(rng, topics)
            query.partition = rng.randrange(target.partitions + 1)
            query.timestamp = rng.choice((-2, -1, 0, 1_700_000_000_000, 2**63 - 1, -(2**63)))
    elif rng.random() < 0.5:
        body.clusterStatus = None
    elif rng.random() < 0.5:
        body.clusterHealth = None
    else:
        body.drainNode = rng.choice((0, 1000, 2**31, 2**32 - 1))  # never a real member
    return Frame(KIND_REQUEST, request.to_bytes(), payload)


# -- peer frames -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerTarget:
    """What a generated peer frame may name: the receiver and the cluster's group ids.

    Messages only a leader or candidate sends (APPEND, HEARTBEAT, RESET, TIMEOUT_NOW, VOTE,
    PRE_VOTE) name a real group only if it is in ``leader_groups``, else a group that does not
    exist. The peer port authenticates nothing and Raft trusts a leader: a stranger's APPEND
    that matches a follower's log is appended and committed; a higher term in any message
    makes the metadata leader step down. That is authority, not malformed input (the fix is
    peer authentication, not validation): the harness leaves the metadata group out of ``groups``,
    lets the in-process fuzz lead partition groups (and checks the damage), and a real
    cluster's groups not at all.
    """

    node_id: int
    cluster_id: str
    groups: tuple[int, ...]
    leader_groups: tuple[int, ...] = ()


LEADER_TYPES = frozenset(
    {
        MessageType.APPEND,
        MessageType.HEARTBEAT,
        MessageType.RESET,
        MessageType.TIMEOUT_NOW,
        MessageType.VOTE,
        MessageType.PRE_VOTE,
    }
)
UNKNOWN_GROUP = (7 << 20) | 5


def hello(target: PeerTarget, node_id: int = FAKE_PEER_ID) -> Frame:
    return Frame(KIND_PEER, encode_hello(node_id, target.cluster_id, "127.0.0.1:1", "127.0.0.1:2"))


def _entries(rng: random.Random, index: int, term: int) -> list[Entry]:
    entries = []
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        kind = rng.choice((EntryKind.NORMAL, EntryKind.NORMAL, EntryKind.NOOP, EntryKind.CONFIG))
        if kind == EntryKind.NORMAL:
            data = valid_batch(rng) if rng.random() < 0.7 else broken_batch(rng)
            count = struct.unpack_from("<i", data, 64)[0] if len(data) >= 68 else 1
            last = index + (max(count, 1) - 1 if rng.random() < 0.9 else rng.choice((0, 5, -3)))
        elif kind == EntryKind.CONFIG:
            voters = tuple(sorted(rng.sample(range(1, 6), rng.randrange(1, 4))))
            data = (
                encode_conf(ConfState(voters))
                if rng.random() < 0.7
                else rng.choice((b"", b"v=;l=", b"v=1,1;l=1", b"garbage", rng.randbytes(9)))
            )
            last = index
        else:
            data, last = b"" if rng.random() < 0.9 else rng.randbytes(5), index
        entries.append(Entry(max(term - rng.randrange(2), 0), index, last, kind, data))
        index = last + 1
    return entries


def raft_messages(rng: random.Random, target: PeerTarget) -> Frame:
    messages = []
    for _ in range(rng.choice((0, 1, 1, 2, 5))):
        group = rng.choice(target.groups) if rng.random() < 0.85 else u64(rng)
        mtype = rng.choice(list(MessageType))
        if mtype in LEADER_TYPES and group not in target.leader_groups:
            group = UNKNOWN_GROUP
        term = rng.randrange(0, 40) if rng.random() < 0.85 else u64(rng)
        index = rng.randrange(-1, 200) if rng.random() < 0.85 else i64(rng)
        message = RaftMessage(
            type=mtype,
            to=target.node_id if rng.random() < 0.9 else u32(rng),
            frm=FAKE_PEER_ID if rng.random() < 0.9 else u32(rng),
            term=term,
            log_term=rng.randrange(0, 40) if rng.random() < 0.85 else u64(rng),
            index=index,
            commit=rng.randrange(-1, 200) if rng.random() < 0.85 else i64(rng),
            reject=rng.random() < 0.3,
            reject_hint=i64(rng),
            context=rng.choice((b"", b"", b"transfer", rng.randbytes(rng.randrange(0, 40)))),
            quiesce=rng.random() < 0.2,
        )
        if mtype == MessageType.APPEND:
            message.entries = _entries(rng, min(index + 1, 2**62), term)
        messages.append((group, message))
    try:
        encoded, payload = encode_messages(messages)
    except (OverflowError, ValueError, READ_ERRORS[0]):  # an entry offset past Int64
        for _, message in messages:
            message.entries = []
        encoded, payload = encode_messages(messages)
    return Frame(KIND_PEER, encoded, b"".join(bytes(p) for p in payload))


SAFE_CALL_BODIES: tuple[Callable[[random.Random], bytes], ...] = (
    lambda rng: b"",
    lambda rng: b"{",
    lambda rng: b"null",
    lambda rng: b"[1, 2, 3]",
    lambda rng: json.dumps({"op": "no-such-op"}).encode(),
    lambda rng: json.dumps({"op": "create_topic"}).encode(),
    lambda rng: json.dumps({"op": "create_topic", "name": "", "settings": {}}).encode(),
    lambda rng: json.dumps({"op": rng.random()}).encode(),
    lambda rng: b"\xff\xfe" + rng.randbytes(10),
    lambda rng: b"[" * 100_000,  # a JSON nesting bomb
    lambda rng: b"1" * 5000,  # a huge integer literal
)


def call_or_reply(rng: random.Random, target: PeerTarget) -> Frame:
    message = cluster_schema.PeerMessage.new_message()
    if rng.random() < 0.5:
        call = message.init("call")
        call.id = u64(rng)
        call.method = rng.choice(("status", "health", "propose", "propose_here", "nope", ""))
        body = rng.choice(SAFE_CALL_BODIES)(rng)
        call.body = b"{}" if call.method in ("status", "health") and rng.random() < 0.3 else body
    else:
        reply = message.init("reply")
        reply.id = rng.randrange(0, 200) if rng.random() < 0.8 else u64(rng)
        reply.errorCode = rng.choice((0, 0, 1, 2, 3, 5, 6, 7, 9, 12, 100, 65535))
        reply.errorMessage = text(rng, ("", "boom"))
        reply.body = rng.choice(SAFE_CALL_BODIES)(rng)
    return Frame(KIND_PEER, message.to_bytes())


def peer_frame(rng: random.Random, target: PeerTarget) -> Frame:
    roll = rng.random()
    if roll < 0.75:
        return raft_messages(rng, target)
    if roll < 0.9:
        return call_or_reply(rng, target)
    message = cluster_schema.PeerMessage.new_message()
    greeting = message.init("hello")
    greeting.nodeId = rng.choice((0, target.node_id, FAKE_PEER_ID, 2**32 - 1))
    greeting.clusterId = rng.choice((target.cluster_id, "other", ""))
    greeting.address = text(rng, ("127.0.0.1:1", "", "nohost"))
    greeting.clientAddress = text(rng, ("127.0.0.1:2", ""))
    return Frame(KIND_PEER, message.to_bytes())


def valid_peer_frame(rng: random.Random, target: PeerTarget) -> Frame:
    """A Raft or call frame the node's decoder accepts (for the baseline cost)."""
    while True:
        frame = raft_messages(rng, target) if rng.random() < 0.85 else call_or_reply(rng, target)
        try:
            decode_peer_message(frame.message, memoryview(frame.payload))
        except ProtocolError:
            continue
        return frame


# -- gossip datagrams --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GossipTarget:
    node_id: int
    address: str


def _updates(rng: random.Random, target: GossipTarget) -> tuple[Update, ...]:
    updates = []
    for _ in range(rng.choice((0, 0, 1, 2, 6))):
        # Rumours about unknown nodes (never about real members: declaring a real node dead
        # or left is authority, not malformed input; the receiver itself may be named).
        node_id = rng.choice((target.node_id, 1000 + rng.randrange(50), 2**64 - 1))
        updates.append(
            Update(
                node_id=node_id,
                address=text(rng, ("127.0.0.1:9", "", "nohost", "[::1]:1")),
                incarnation=rng.choice((0, 1, 7, MAX_INCARNATION)),
                state=rng.choice(list(MemberState)),
                meta={"peer": "127.0.0.1:9"} if rng.random() < 0.5 else {},
                from_id=rng.choice((0, 1000, target.node_id)),
            )
        )
    return tuple(updates)


def gossip_message(rng: random.Random, target: GossipTarget) -> bytes:
    source = rng.choice((1000 + rng.randrange(50), 2**64 - 1))
    updates = _updates(rng, target)
    seq = u64(rng)
    message: Message
    roll = rng.randrange(6)
    if roll == 0:
        message = Ping(source, seq, rng.choice((target.node_id, 5, 0)), updates)
    elif roll == 1:
        message = Ack(source, seq, updates)
    elif roll == 2:
        message = Nack(source, seq, updates)
    elif roll == 3:
        message = PingReq(source, seq, 1000, "127.0.0.1:9", updates)
    elif roll == 4:
        message = Sync(source, _updates(rng, target), rng.random() < 0.5, updates)
    else:
        message = Gossip(source, updates)
    return swim_codec.encode(message)


# -- mutation ----------------------------------------------------------------------------------


def _flip_bits(rng: random.Random, data: bytes, count: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(count):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _extreme_word(rng: random.Random, data: bytes) -> bytes:
    if len(data) < 8:
        return data
    out = bytearray(data)
    at = rng.randrange(len(out) // 8) * 8
    word = rng.choice(EXTREME_WORDS)
    width = rng.choice((8, 4, 4, 2, 1))
    shift = rng.choice((0, 4)) if width == 4 else 0
    out[at + shift : at + shift + width] = word[:width]
    return bytes(out)


def mutate_message(rng: random.Random, message: bytes) -> bytes:
    """A structure-aware mutation of a Cap'n Proto message (kept a multiple of 8 bytes)."""
    roll = rng.randrange(6)
    if roll == 0:
        return _flip_bits(rng, message, rng.choice((1, 1, 2, 4, 16)))
    if roll in (1, 2):
        out = message
        for _ in range(rng.choice((1, 1, 2, 3))):
            out = _extreme_word(rng, out)
        return out
    if roll == 3:  # truncated to a word boundary
        return message[: 8 * rng.randrange(len(message) // 8 + 1)]
    if roll == 4:  # random words appended or spliced in
        extra = rng.randbytes(8 * rng.randrange(1, 8))
        at = 8 * rng.randrange(len(message) // 8 + 1)
        return message[:at] + extra + message[at:]
    return rng.randbytes(len(message))  # right length, random words


def mutate_frame(rng: random.Random, frame: Frame, covers_payload: bool) -> bytes:
    """One hostile encoding of ``frame`` (bytes to send); a fifth stay valid, as a baseline."""
    roll = rng.random()
    if roll < 0.2:
        return seal(frame, covers_payload)
    if roll < 0.6:  # mutated message, crc recomputed: the decoder has to cope
        return seal(Frame(frame.kind, mutate_message(rng, frame.message), frame.payload), True)
    if roll < 0.67:  # mutated payload, crc recomputed
        payload = _flip_bits(rng, frame.payload, rng.choice((1, 4))) if frame.payload else b""
        if rng.random() < 0.5:
            payload = payload[: rng.randrange(len(payload) + 1)]
        return seal(Frame(frame.kind, frame.message, payload), covers_payload)
    if roll < 0.72:  # another frame kind with a correct crc
        kind = rng.choice((0, KIND_REQUEST, KIND_RESPONSE, KIND_PEER, KIND_SWIM, 255))
        return seal(Frame(kind, frame.message, frame.payload), covers_payload)
    if roll < 0.8:  # header length fields lie (crc of the header recomputed)
        message_len = rng.choice(
            (len(frame.message) + 8, 2**24, 2**24 + 8, 2**32 - 8, 3, len(frame.message))
        )
        payload_len = rng.choice((len(frame.payload) + 1, 2**26, 2**26 + 1, 2**32 - 1, 0))
        return _lying_header(frame, message_len, payload_len) + frame.message + frame.payload
    if roll < 0.86:  # a bit flipped anywhere, crc left as it was
        return _flip_bits(rng, seal(frame, covers_payload), 1)
    if roll < 0.91:  # cut short
        data = seal(frame, covers_payload)
        return data[: rng.randrange(len(data))]
    if roll < 0.95:  # the header's fixed fields broken
        data = bytearray(seal(frame, covers_payload))
        position = rng.choice((0, 1, 2))
        data[position] = rng.choice((0, 0xFF, data[position] ^ 1))
        return bytes(data)
    return rng.randbytes(rng.randrange(1, 300))  # noise


def _lying_header(frame: Frame, message_len: int, payload_len: int) -> bytes:
    prefix = struct.pack("<HBBII", MAGIC, VERSION, frame.kind, message_len, payload_len)
    crc = crc32c.crc32c(frame.message, crc32c.crc32c(prefix))
    return prefix + struct.pack("<I", crc)


def mutate_datagram(rng: random.Random, datagram: bytes) -> bytes:
    """A hostile variant of one gossip datagram (its frame re-sealed in most cases)."""
    frame = Frame(datagram[3], datagram[16:])
    roll = rng.random()
    if roll < 0.06:  # oversized
        return seal(Frame(KIND_SWIM, rng.randbytes(8 * rng.randrange(8000, 8300))), True)
    if roll < 0.1:  # a datagram holding two frames
        return datagram + datagram
    if roll < 0.14:  # a payload after the message
        return seal(Frame(KIND_SWIM, frame.message, rng.randbytes(rng.randrange(1, 40))), True)
    return mutate_frame(rng, frame, True)
