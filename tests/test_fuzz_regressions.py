"""Defects the fuzzer found, one test each (every one failed before its fix).

They run against the real code paths: framing and decoding functions directly, or a real
in-process node fed through its own protocol objects over an in-memory transport.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from laminar.client.connection import Connection
from laminar.errors import InvalidRequestError, LaminarError, OffsetOutOfRangeError, ProtocolError
from laminar.framing import MAGIC, MAX_PAYLOAD_BYTES, VERSION
from laminar.membership import codec as swim_codec
from laminar.membership.driver import SwimDriver
from laminar.membership.messages import Gossip, Sync, Update
from laminar.membership.swim import MemberState, SwimConfig
from laminar.node.metadata_service import _checked_reply
from laminar.node.raft_codec import decode_peer_message, encode_hello, encode_messages
from laminar.protocol import (
    CLIENT_CRC_COVERS_PAYLOAD,
    KIND_PEER,
    KIND_REQUEST,
    KIND_RESPONSE,
    client_schema,
    cluster_schema,
    decode,
)
from laminar.raft import Entry, EntryKind, MessageType
from laminar.raft import Message as RaftMessage
from laminar.segment import batch as record_batch
from laminar.transport import FramedProtocol, split_address
from tests.fuzz_cases import FAKE_PEER_ID, Frame, hello, seal
from tests.fuzz_harness import (
    PARTITIONS,
    TOPIC,
    InProcessNode,
    MemoryTransport,
    feed,
    produce_and_read_back,
    rss_kib,
)


def _header(kind: int, message_len: int, payload_len: int) -> bytes:
    prefix = struct.pack("<HBBII", MAGIC, VERSION, kind, message_len, payload_len)
    return prefix + b"\0\0\0\0"


def _open(on_frame: object, covers_payload: bool = True) -> tuple[FramedProtocol, MemoryTransport]:
    protocol = FramedProtocol(on_frame, crc_covers_payload=covers_payload)  # type: ignore[arg-type]
    transport = MemoryTransport(protocol)
    protocol.connection_made(transport)
    return protocol, transport


async def test_a_length_field_alone_allocates_little() -> None:
    """16 bytes announcing an 80 MiB frame used to make the receiver allocate ~100 MiB at once
    (so a few hundred idle connections could exhaust a node's memory)."""
    protocol, transport = _open(lambda *args: None)
    feed(protocol, transport, _header(KIND_PEER, 16 << 20, 64 << 20), random.Random(1))
    assert not transport.closed
    assert len(protocol.get_buffer(-1)) <= 1 << 20
    protocol.connection_lost(None)


async def test_a_large_frame_still_arrives_whole_through_growing_buffers() -> None:
    got: list[tuple[int, bytes, bytes]] = []
    protocol, transport = _open(
        lambda kind, message, payload: got.append((kind, message, bytes(payload)))
    )
    payload = random.Random(2).randbytes(9 << 20)
    frame = seal(Frame(KIND_PEER, b"\1" * 64, payload), True)
    position = 0
    while position < len(frame):  # the socket delivers as much as each buffer takes
        buffer = protocol.get_buffer(-1)
        size = min(len(buffer), len(frame) - position, 1 << 20)
        buffer[:size] = frame[position : position + size]
        position += size
        protocol.buffer_updated(size)
    assert not transport.closed
    assert got == [(KIND_PEER, b"\1" * 64, payload)]


# -- peer frames -------------------------------------------------------------------------------


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[InProcessNode]:
    target = InProcessNode(tmp_path, records=20)
    await target.start()
    try:
        yield target
    finally:
        await target.stop()


def _peer_connection(target: InProcessNode) -> tuple[FramedProtocol, MemoryTransport]:
    protocol = target.node.peers._protocol(None)
    transport = MemoryTransport(protocol, keep=True)
    protocol.connection_made(transport)
    feed(protocol, transport, seal(hello(target.peer_target()), True), random.Random(0))
    return protocol, transport


def _raft_frame(group: int, message: RaftMessage) -> bytes:
    encoded, payload = encode_messages([(group, message)])
    return seal(Frame(KIND_PEER, encoded, b"".join(bytes(p) for p in payload)), True)


def test_raft_values_beyond_their_bounds_are_malformed() -> None:
    """A term of 2**64 - 1 used to reach the Raft core; the node then failed to stamp and
    persist it (struct.error in the group commit), which stopped every group on the node."""
    for fields in (
        {"term": 2**64 - 1},
        {"term": 1, "log_term": 2**63},
        {"term": 1, "index": -(2**63)},
        {"term": 1, "commit": 2**63 - 1},
    ):
        message = RaftMessage(type=MessageType.HEARTBEAT, to=1, frm=FAKE_PEER_ID, **fields)
        encoded, _ = encode_messages([(1, message)])
        with pytest.raises(ProtocolError):
            decode_peer_message(encoded, memoryview(b""))


def test_an_entry_with_a_corrupt_batch_is_malformed() -> None:
    """A NORMAL entry must carry one intact record batch spanning exactly [index, last]."""
    good = record_batch.build_batch([(None, b"v", (), 0)] * 3)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    for data, last in ((bytes(bad_crc), 2), (good, 5), (good[:-1], 2), (b"", 0)):
        entry = Entry(1, 0, last, EntryKind.NORMAL, data)
        message = RaftMessage(
            type=MessageType.APPEND, to=1, frm=FAKE_PEER_ID, term=1, entries=[entry]
        )
        encoded, payload = encode_messages([(1, message)])
        with pytest.raises(ProtocolError):
            decode_peer_message(encoded, memoryview(b"".join(bytes(p) for p in payload)))


async def test_a_huge_term_from_a_peer_leaves_the_node_committing(node: InProcessNode) -> None:
    protocol, transport = _peer_connection(node)
    group = node.peer_target().groups[1]
    for message in (
        RaftMessage(type=MessageType.HEARTBEAT, to=1, frm=FAKE_PEER_ID, term=2**64 - 1),
        RaftMessage(type=MessageType.VOTE, to=1, frm=FAKE_PEER_ID, term=2**63, index=10**6),
    ):
        feed(protocol, transport, _raft_frame(group, message), random.Random(0))
    await asyncio.sleep(1.5)  # several ticks: elections, group commits
    assert node.healthy() == []
    assert await produce_and_read_back(node.config.listen) == []


async def test_a_peer_hello_that_cannot_be_read_closes_only_its_connection(
    node: InProcessNode,
) -> None:
    """Invalid UTF-8 in a Text field raised UnicodeDecodeError out of the frame handler."""
    message = bytearray(encode_hello(FAKE_PEER_ID, "laminar", "127.0.0.1:1", "127.0.0.1:2"))
    at = bytes(message).index(b"laminar")
    message[at : at + 2] = b"\xff\xfe"
    protocol = node.node.peers._protocol(None)
    transport = MemoryTransport(protocol)
    protocol.connection_made(transport)
    feed(protocol, transport, seal(Frame(KIND_PEER, bytes(message)), True), random.Random(0))
    assert transport.closed  # by the frame's ProtocolError, not by an escaping exception


async def test_a_garbled_reply_to_a_call_fails_the_call_with_a_typed_error(
    node: InProcessNode,
) -> None:
    """A reply with a body that is not JSON, or an error code whose class takes other
    arguments (OffsetOutOfRange), raised out of the frame handler and left the call hanging."""
    protocol, transport = _peer_connection(node)
    for code, body in ((0, b"{"), (OffsetOutOfRangeError.code, b"")):
        call = asyncio.ensure_future(node.node.calls.call(FAKE_PEER_ID, "status", {}, timeout=5))
        await asyncio.sleep(0)
        message = cluster_schema.PeerMessage.new_message()
        reply = message.init("reply")
        reply.id = max(node.node.calls._waiting)
        reply.errorCode = code
        reply.body = body
        feed(
            protocol, transport, seal(Frame(KIND_PEER, message.to_bytes()), True), random.Random(0)
        )
        assert not transport.closed
        with pytest.raises(LaminarError):
            await asyncio.wait_for(call, 1)


async def test_a_call_with_a_malformed_body_gets_a_typed_reply(node: InProcessNode) -> None:
    """Bodies that are not JSON, or commands lacking fields, were answered as internal errors
    (code 1) with a traceback in the log; they are the caller's defect: InvalidRequest."""
    protocol, transport = _peer_connection(node)
    bodies = (b"{", b"[1]", b"[" * 100_000, b"\xff", b'{"op": "create_topic"}')
    for call_id, body in enumerate(bodies, start=1):
        message = cluster_schema.PeerMessage.new_message()
        call = message.init("call")
        call.id = call_id
        call.method = "propose"
        call.body = body
        feed(
            protocol, transport, seal(Frame(KIND_PEER, message.to_bytes()), True), random.Random(0)
        )
    await asyncio.sleep(0.3)
    assert not transport.closed
    replies = {
        body.id: body.errorCode
        for which, body in (decode_peer_message(m, p) for m, p in transport.frames(KIND_PEER))
        if which == "reply"
    }
    assert replies == {i: InvalidRequestError.code for i in range(1, len(bodies) + 1)}


# -- client frames -----------------------------------------------------------------------------


def _client_connection(target: InProcessNode) -> tuple[FramedProtocol, MemoryTransport]:
    protocol = target.node.client_server._protocol()
    transport = MemoryTransport(protocol, keep=True)
    protocol.connection_made(transport)
    return protocol, transport


def _responses(transport: MemoryTransport) -> list[Any]:
    return [decode(client_schema.Response, m) for m, _ in transport.frames(KIND_RESPONSE)]


# Found by the fuzzer: a metadata request whose topic list pointer is not a list pointer, and
# a request whose union discriminant is out of range (pycapnp: "which on a non-union type").
_BAD_POINTER = bytes.fromhex(
    "00000000070000000000000002000100050000000000000000000000000000000000000000000100"
    "010000000e000000000000001a0000006162000000000000"
)

_BAD_UNION = bytes.fromhex(
    "000000000700000000000000020001000500000000000000ffffff7f000000000100000000000100"
    "010000000e000000010000001a0000006162000000000000"
)


async def test_a_request_with_an_unreadable_field_gets_a_typed_reply(node: InProcessNode) -> None:
    """pycapnp raises KjException or UnicodeDecodeError only when a handler reads the field:
    that used to be logged as an internal failure with a traceback, per request."""
    protocol, transport = _client_connection(node)
    request = client_schema.Request.new_message(correlationId=5)
    request.body.init("metadata").topics = ["\u00e9t\u00e9"]
    bad_text = bytearray(request.to_bytes())
    at = bytes(bad_text).index("\u00e9t\u00e9".encode())
    bad_text[at] = 0xFF
    for message in (bytes(bad_text), _BAD_POINTER):
        frame = seal(Frame(KIND_REQUEST, message), CLIENT_CRC_COVERS_PAYLOAD)
        feed(protocol, transport, frame, random.Random(0))
    await asyncio.sleep(0.2)
    assert [r.error.code for r in _responses(transport)] == [ProtocolError.code] * 2


async def test_a_request_whose_body_cannot_be_read_closes_its_connection(
    node: InProcessNode,
) -> None:
    """Its task used to die (body.which() raised outside the error handling): no reply, and
    an unretrieved exception in the node's log."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
    protocol, transport = _client_connection(node)
    message = _BAD_UNION
    feed(protocol, transport, seal(Frame(KIND_REQUEST, message), False), random.Random(0))
    await asyncio.sleep(0.2)
    assert transport.closed and errors == []


async def test_a_topic_with_settings_no_log_accepts_is_refused(node: InProcessNode) -> None:
    """A create-topic with segmentBytes 2**63-1 (or a negative retentionBytes) used to commit
    the topic, then fail to open its log on every node: a topic that exists with no replica."""
    from laminar.client import Admin

    async with Admin(node.config.listen) as admin:
        with pytest.raises(InvalidRequestError):
            await admin.create_topic("huge-segments", 1, 1, segment_bytes=2**63 - 1)
        with pytest.raises(InvalidRequestError):
            await admin.create_topic("negative", 1, 1, retention_bytes=-5)
    assert "huge-segments" not in node.node.state.topics
    assert "negative" not in node.node.state.topics


async def test_a_fetch_never_answers_more_than_a_frame_may_carry(node: InProcessNode) -> None:
    """maxBytes 2**32-1 over two partitions of 36 MiB each used to produce a 72 MiB reply,
    which no client can receive (a frame carries at most MAX_PAYLOAD_BYTES): the consumer's
    connection was closed on every retry."""
    from laminar.client import Producer

    async with Producer(node.config.listen, acks="leader", linger_ms=0) as producer:
        value = b"v" * (1 << 20)
        for i in range(72):
            await producer.send_and_wait(TOPIC, value, partition=i % PARTITIONS)

    def fill(body: Any) -> None:
        request = body.init("fetch")
        request.maxBytes = 2**32 - 1
        for ask, partition in zip(request.init("partitions", 2), (0, 1), strict=True):
            ask.topic = TOPIC
            ask.partition = partition

    connection = await Connection.open(node.config.listen)
    try:
        reply, payload = await connection.request(fill, timeout=30)
    finally:
        connection.close()
    assert [r.error.code for r in reply.body.fetch.results] == [0, 0]
    assert 0 < len(payload) <= MAX_PAYLOAD_BYTES


# -- gossip datagrams --------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["nohost:7946", "localhost:7946", "[::1]:7946"])
def test_gossip_naming_an_unsendable_address_keeps_membership_running(address: str) -> None:
    """uvloop's sendto raises ValueError (not OSError) for a host that needs a DNS lookup or
    is of the other address family; the first probe to such a gossiped member killed the
    SWIM tick task, so the node stopped answering probes and was declared dead. (On uvloop,
    as the node runs: asyncio's own loop resolves names, or raises OSError.)"""
    uvloop.run(_gossip_unsendable(address))


async def _gossip_unsendable(address: str) -> None:
    driver = SwimDriver(1, {}, SwimConfig(seed=1), tick_seconds=0.01)
    own = await driver.start("127.0.0.1", 0)
    try:
        update = Update(5, address, 1, MemberState.ALIVE, {})
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(swim_codec.encode(Sync(7, (update,), False)), split_address(own))
        deadline = asyncio.get_running_loop().time() + 5
        while driver.stats.send_errors == 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert driver.stats.send_errors > 0
        assert driver._ticker is not None and not driver._ticker.done()
    finally:
        await driver.stop()


async def test_gossip_from_an_id_beyond_uint32_leaves_cluster_status_working(
    node: InProcessNode,
) -> None:
    """Gossip from node id 2**64-1 (SWIM ids are UInt64) made every cluster-status request
    fail: its member entry did not fit the reply's UInt32 nodeId (admin CLI, wait_ready)."""
    from laminar.client import Admin

    for source in (2**64 - 1, 2**32):
        alive = Update(source, "127.0.0.1:9", 1, MemberState.ALIVE, {})
        node.node.swim._on_datagram(swim_codec.encode(Gossip(source, (alive,))), ("127.0.0.1", 9))
    assert {2**64 - 1, 2**32} <= {m.node_id for m in node.node.swim.members}
    async with Admin(node.config.listen) as admin:
        status = await admin.cluster_status()
    assert [m.node_id for m in status.members] == [1]


def test_gossiped_strangers_cost_little_memory(tmp_path: Path) -> None:
    """Every gossiped member with a peer address gets a dialer; uvloop creates the protocol
    before connecting, and each protocol allocated its 256 KiB staging buffer at once: 50
    datagrams naming 10,000 strangers took a node from 46 MB to 2 GB. (On uvloop, as the
    daemon runs; asyncio creates the protocol only once connected.)"""
    growth = uvloop.run(_gossip_strangers(tmp_path, 2000))
    assert growth < 64 * 1024, f"{growth} KiB for 2,000 gossiped strangers"


async def _gossip_strangers(root: Path, count: int) -> int:
    target = InProcessNode(root, records=1)
    await target.start()
    try:
        pid = os.getpid()
        before = rss_kib(pid)["RssAnon"]
        for start in range(10_000, 10_000 + count, 200):
            strangers = tuple(
                Update(i, "127.0.0.1:9", 1, MemberState.ALIVE, {"peer": "127.0.0.1:9"})
                for i in range(start, start + 200)
            )
            datagram = swim_codec.encode(Gossip(start, strangers))
            target.node.swim._on_datagram(datagram, ("127.0.0.1", 9))
        await asyncio.sleep(2)  # every dialer has tried (and failed) at least once
        assert len(target.node.peers._dialers) == count
        return rss_kib(pid)["RssAnon"] - before
    finally:
        await target.stop()


@pytest.mark.parametrize("reply", [None, [], {}, {"index": "7"}, {"index": -1}, {"index": 1.5}])
def test_a_forged_answer_to_a_forwarded_proposal_is_a_protocol_error(reply: Any) -> None:
    """A node without a metadata leader forwards proposals through a peer and read the
    answer's "index" unchecked: a stranger's forged reply raised KeyError/TypeError out of
    ``propose`` (ending, e.g., the node's registration task). Now a typed, retried error."""
    with pytest.raises(ProtocolError):
        _checked_reply(reply)
    assert _checked_reply({"index": 3, "result": None}) == {"index": 3, "result": None}


def test_a_normal_entry_may_carry_share_state_but_not_a_core_control_batch() -> None:
    """Share groups write their state as control batches in NORMAL entries (laminar.queues);
    followers used to refuse every control batch there, so no share fetch on a replicated
    partition ever committed. A NOOP/CONFIG control batch stays malformed in a NORMAL entry
    (stored, it would read back as a core entry)."""
    from laminar.queues.log_codec import encode_batch
    from laminar.queues.records import StartMoved

    share = encode_batch([("g", StartMoved(5))], 0, checkpoint=False)
    noop = record_batch.control_batch(int(EntryKind.NOOP), b"", 0)

    def decode_entry(data: bytes) -> Any:
        entry = Entry(1, 0, 0, EntryKind.NORMAL, data)
        message = RaftMessage(
            type=MessageType.APPEND, to=1, frm=FAKE_PEER_ID, term=1, entries=[entry]
        )
        encoded, payload = encode_messages([(1, message)])
        return decode_peer_message(encoded, memoryview(b"".join(bytes(p) for p in payload)))

    decode_entry(share)
    with pytest.raises(ProtocolError):
        decode_entry(noop)
