"""SWIM wire codec: exact round trips, and every kind of malformed datagram is a ProtocolError."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar import schemas
from laminar.errors import ProtocolError
from laminar.framing import encode_frame
from laminar.membership import codec
from laminar.membership.messages import (
    MESSAGE_OVERHEAD_BYTES,
    Ack,
    Gossip,
    Message,
    Nack,
    Ping,
    PingReq,
    Sync,
    Update,
    text_size,
    update_size,
)
from laminar.membership.state import MemberState

ids = st.integers(min_value=1, max_value=2**64 - 1)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
text = st.text(max_size=40)
updates = st.lists(
    st.builds(
        Update,
        node_id=ids,
        address=text,
        incarnation=st.integers(min_value=0, max_value=codec.MAX_INCARNATION),
        state=st.sampled_from(list(MemberState)),
        meta=st.dictionaries(text, text, max_size=4),
        from_id=u64,
    ),
    max_size=12,
).map(tuple)
messages = st.one_of(
    st.builds(Ping, source_id=ids, seq=u64, target_id=u64, updates=updates),
    st.builds(Ack, source_id=ids, seq=u64, updates=updates),
    st.builds(Nack, source_id=ids, seq=u64, updates=updates),
    st.builds(
        PingReq,
        source_id=ids,
        seq=u64,
        target_id=u64,
        target_address=st.text(min_size=1, max_size=60),
        updates=updates,
    ),
    st.builds(Sync, source_id=ids, members=updates, want_reply=st.booleans(), updates=updates),
    st.builds(Gossip, source_id=ids, updates=updates),
)


def _sample() -> Message:
    update = Update(7, "127.0.0.1:7946", 3, MemberState.SUSPECT, {"raft": "127.0.0.1:9092"}, 2)
    return Sync(1, (update, update), True, (update,))


@settings(max_examples=150, deadline=None)
@given(messages)
def test_round_trip_is_exact(message: Message) -> None:
    data = codec.encode(message)
    assert codec.decode(data) == message


@settings(max_examples=100, deadline=None)
@given(messages)
def test_size_estimate_is_an_upper_bound(message: Message) -> None:
    """The core fills datagrams from estimates; they must never undercount."""
    estimate = MESSAGE_OVERHEAD_BYTES + sum(update_size(u) for u in message.updates)
    if isinstance(message, Sync):
        estimate += sum(update_size(u) for u in message.members)
    if isinstance(message, PingReq):
        estimate += text_size(message.target_address)
    assert len(codec.encode(message)) <= estimate


def test_every_truncation_is_rejected() -> None:
    data = codec.encode(_sample())
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            codec.decode(data[:cut])


def test_bit_flips_never_escape_as_other_errors() -> None:
    """The frame crc catches flips; nothing but ProtocolError ever comes out."""
    data = bytearray(codec.encode(_sample()))
    rng = random.Random(5)
    for _ in range(3000):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        if flipped == data:
            continue
        with pytest.raises(ProtocolError):
            codec.decode(bytes(flipped))


def test_garbage_inside_a_valid_frame_is_a_protocol_error() -> None:
    """A correct crc over a nonsense Cap'n Proto body must still be rejected cleanly."""
    rng = random.Random(11)
    rejected = 0
    for _ in range(3000):
        body = bytes(rng.getrandbits(8) for _ in range(8 * rng.randint(0, 24)))
        datagram = b"".join(encode_frame(codec.FRAME_KIND, body))
        try:
            codec.decode(datagram)
        except ProtocolError:
            rejected += 1
    assert rejected > 2500  # a few random bodies are valid messages; the rest must raise only this


def test_valid_capnp_with_bad_values_is_rejected() -> None:
    swim = schemas.load("swim")
    root = swim.SwimMessage.new_message()
    root.sourceId = 0  # no source
    root.body.init("ack").seq = 1
    with pytest.raises(ProtocolError, match="source"):
        codec.decode(b"".join(encode_frame(codec.FRAME_KIND, root.to_bytes())))

    root = swim.SwimMessage.new_message()
    root.sourceId = 3
    root.body.init("pingReq").seq = 1  # no target address
    with pytest.raises(ProtocolError, match="target address"):
        codec.decode(b"".join(encode_frame(codec.FRAME_KIND, root.to_bytes())))


def test_implausible_incarnation_is_rejected() -> None:
    update = Update(7, "a:1", codec.MAX_INCARNATION + 1, MemberState.ALIVE, {}, 0)
    with pytest.raises(ProtocolError, match="incarnation"):
        codec.decode(codec.encode(Gossip(1, (update,))))


def test_wrong_kind_and_payload_are_rejected() -> None:
    message = schemas.to_bytes(_encode_root())
    with pytest.raises(ProtocolError, match="kind"):
        codec.decode(b"".join(encode_frame(codec.FRAME_KIND + 1, message)))
    with pytest.raises(ProtocolError, match="payload"):
        codec.decode(b"".join(encode_frame(codec.FRAME_KIND, message, b"x")))
    with pytest.raises(ProtocolError):
        codec.decode(struct.pack("<HBBIII", 0x4C4D, 1, codec.FRAME_KIND, 8, 0, 0) + bytes(8))


def _encode_root() -> object:
    root = schemas.load("swim").SwimMessage.new_message()
    root.sourceId = 9
    root.body.gossip = None
    return root
