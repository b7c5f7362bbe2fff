"""Frame splitting in FramedProtocol: any chunking of the stream yields the same frames."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from laminar.framing import encode_frame
from laminar.transport import STAGING_BYTES, FramedProtocol, recycle


def feed(protocol: FramedProtocol, stream: bytes, rng: random.Random) -> None:
    """Play the event loop: copy the stream into whatever buffers the protocol offers."""
    position = 0
    while position < len(stream) and not protocol.closed:
        buffer = protocol.get_buffer(-1)
        assert len(buffer) > 0
        size = min(len(buffer), rng.choice([1, 7, 100, 4096, 65536, 1 << 20]))
        size = min(size, len(stream) - position)
        buffer[:size] = stream[position : position + size]
        protocol.buffer_updated(size)
        position += size


@pytest.mark.parametrize("seed", range(5))
def test_frames_survive_any_chunking(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [0, 1, 100, STAGING_BYTES // 2 - 100, STAGING_BYTES // 2 + 1, 3 * STAGING_BYTES]
    frames = []
    for _ in range(40):
        message = rng.randbytes(8 * rng.randrange(0, 20))
        payload = rng.randbytes(rng.choice(sizes))
        frames.append((rng.randrange(1, 5), message, payload))
    stream = b"".join(b"".join(encode_frame(k, m, p)) for k, m, p in frames)
    got: list[tuple[int, bytes, bytes]] = []
    protocol = FramedProtocol(lambda k, m, p: got.append((k, m, bytes(p))))
    feed(protocol, stream, rng)
    assert got == frames
    assert not protocol.closed


def test_a_corrupt_frame_closes_the_connection_after_the_good_ones() -> None:
    good = b"".join(encode_frame(1, b"\0" * 8, b"payload"))
    bad = bytearray(b"".join(encode_frame(1, b"\0" * 8, b"x" * (STAGING_BYTES))))
    bad[-1] ^= 1
    got: list[int] = []
    protocol = FramedProtocol(lambda k, m, p: got.append(k))
    feed(protocol, good + bytes(bad) + good, random.Random(1))
    assert got == [1]
    assert protocol.closed


def test_recycled_frame_buffers_receive_later_frames_intact() -> None:
    rng = random.Random(3)
    payloads = [
        rng.randbytes(n) for n in (3 * STAGING_BYTES, 2 * STAGING_BYTES, 40 * STAGING_BYTES)
    ]
    got: list[memoryview] = []
    protocol = FramedProtocol(lambda k, m, p: got.append(p))
    held: list[bytes] = []
    for payload in payloads:  # each payload is recycled once read, as the Spark source does
        feed(protocol, b"".join(encode_frame(1, b"\0" * 8, payload)), rng)
        held.append(bytes(got[-1]))
        recycle(got[-1])
    assert held == payloads
    # the second frame went into the first one's (recycled, larger) buffer; the third, over
    # twice as large, into a new one
    assert got[1].obj is got[0].obj
    assert got[2].obj is not got[0].obj


@pytest.mark.parametrize("covers", [True, False])
def test_client_frames_leave_the_payload_to_the_batch_crc(covers: bool) -> None:
    frame = bytearray(b"".join(encode_frame(1, b"\0" * 8, b"batch", crc_covers_payload=covers)))
    frame[-1] ^= 1  # damage the payload
    got: list[bytes] = []
    protocol = FramedProtocol(lambda k, m, p: got.append(bytes(p)), crc_covers_payload=covers)
    feed(protocol, bytes(frame), random.Random(2))
    # covered: the frame is dropped; not covered: it arrives, for the batch check to catch
    assert got == ([] if covers else [b"batci"])
    assert protocol.closed is covers


def test_a_damaged_message_closes_a_client_connection_too() -> None:
    frame = bytearray(b"".join(encode_frame(1, b"\1" * 8, b"batch", crc_covers_payload=False)))
    frame[17] ^= 1  # inside the message
    got: list[int] = []
    protocol = FramedProtocol(lambda k, m, p: got.append(k), crc_covers_payload=False)
    feed(protocol, bytes(frame), random.Random(2))
    assert got == [] and protocol.closed


async def test_a_frame_sent_now_is_written_before_the_loop_turns() -> None:
    # The producer's and the consumer's one request per node and turn is written at once;
    # other frames wait for the end of the loop turn so that many small ones leave in one write.
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as server:
        _, protocol = await loop.create_connection(
            lambda: FramedProtocol(lambda k, m, p: None), *server.getsockname()
        )
        peer, _ = server.accept()
        with peer:
            peer.settimeout(5)
            later = b"".join(encode_frame(1, b"\0" * 8, b"later"))
            now = b"".join(encode_frame(2, b"\0" * 8, b"now"))
            protocol.send_parts(1, b"\0" * 8, [b"later"])
            protocol.send_parts(2, b"\0" * 8, [b"now"], now=True)
            # No await since: the loop has not run, yet both frames are on the socket, in order.
            received = b""
            while len(received) < len(later) + len(now):
                received += peer.recv(1 << 16)
            assert received == later + now
            protocol.send_parts(1, b"\0" * 8, [b"later"])
            peer.setblocking(False)
            with pytest.raises(BlockingIOError):
                peer.recv(1 << 16)  # not written until the loop turns
            await asyncio.sleep(0)
            peer.settimeout(5)
            assert peer.recv(1 << 16) == later
        protocol.close()
