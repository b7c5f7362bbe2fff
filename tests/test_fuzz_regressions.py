"""Defects the fuzzer found, one test each (every one failed before its fix).

They run against the real code paths: framing and decoding functions directly, or a real
in-process node fed through its own protocol objects over an in-memory transport.
"""

from __future__ import annotations

import random
import struct

from laminar.framing import MAGIC, VERSION
from laminar.protocol import KIND_PEER
from laminar.transport import FramedProtocol
from tests.fuzz_cases import Frame, seal
from tests.fuzz_harness import MemoryTransport, feed


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
