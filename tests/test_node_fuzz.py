"""Random and corrupted frames thrown at a live node: it keeps serving, stored data intact.

Each garbage connection may be closed by the node (a malformed frame closes only that
connection); meanwhile a well-behaved client keeps producing and consuming on its own
connection, and what was stored before the barrage reads back byte for byte afterwards.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from pathlib import Path

import crc32c
import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.framing import MAGIC, VERSION, encode_frame
from laminar.protocol import CLIENT_CRC_COVERS_PAYLOAD, KIND_PEER, KIND_REQUEST, client_schema
from laminar.segment.batch import build_batch
from laminar.transport import split_address
from tests.cluster_fixture import start_cluster

pytestmark = pytest.mark.slow
TOPIC = "fuzzed"


def valid_request_bytes(rng: random.Random) -> bytes:
    request = client_schema.Request.new_message(correlationId=rng.getrandbits(32))
    produce = request.body.init("produce")
    produce.acks = -1
    (ref,) = produce.init("batches", 1)
    ref.topic = TOPIC
    ref.payloadLength = 80
    return request.to_bytes()


def client_frame(message: bytes, payload: bytes = b"") -> bytes:
    return b"".join(
        encode_frame(KIND_REQUEST, message, payload, crc_covers_payload=CLIENT_CRC_COVERS_PAYLOAD)
    )


def garbage_frames(rng: random.Random) -> list[bytes]:
    """A mix of hostile inputs: noise, bad crc, garbage Cap'n Proto, lies about lengths."""
    frames: list[bytes] = []
    for _ in range(40):
        choice = rng.randrange(7)
        if choice == 0:
            frames.append(rng.randbytes(rng.randrange(1, 200)))
        elif choice == 1:  # right crc, random Cap'n Proto words
            frames.append(client_frame(rng.randbytes(8 * rng.randrange(1, 20))))
        elif choice == 2:  # a valid frame with one bit flipped
            # (in the payload, only the batch's own crc can notice: client frames leave it out)
            frame = bytearray(
                client_frame(valid_request_bytes(rng), build_batch([(None, b"x", (), 0)]))
            )
            frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
            frames.append(bytes(frame))
        elif choice == 3:  # valid request whose batch reference runs past the payload
            frames.append(client_frame(valid_request_bytes(rng), b"short"))
        elif choice == 4:  # header claiming a huge body
            prefix = struct.pack("<HBBII", MAGIC, VERSION, KIND_REQUEST, 8, 1 << 30)
            frames.append(prefix + struct.pack("<I", crc32c.crc32c(prefix)))
        elif choice == 5:  # a peer frame on the client port
            frames.append(b"".join(encode_frame(KIND_PEER, rng.randbytes(16))))
        else:  # valid Cap'n Proto of a request with a corrupted batch inside
            batch = bytearray(build_batch([(b"k", b"v" * 50, (), 0)]))
            batch[rng.randrange(24, len(batch))] ^= 0xFF
            frames.append(client_frame(valid_request_bytes(rng), bytes(batch)))
    return frames


async def throw(address: str, frames: list[bytes]) -> None:
    host, port = split_address(address)
    for frame in frames:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(frame)
            await writer.drain()
            await asyncio.wait_for(reader.read(65536), 0.2)
            writer.close()
        except (OSError, TimeoutError):
            pass


def throw_udp(address: str, rng: random.Random) -> None:
    host, port = split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(200):
            sock.sendto(rng.randbytes(rng.randrange(1, 600)), (host, port))


@pytest.mark.timeout(180)
async def test_node_survives_garbage(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, nodes=1)
    rng = random.Random(20261121)
    try:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
        async with Producer(cluster.bootstrap) as producer:
            before = [await producer.send_and_wait(TOPIC, b"before-%d" % i) for i in range(100)]
        node = cluster.nodes[1]
        for _ in range(5):
            await throw(node.client_address, garbage_frames(rng))
            await throw(node.peer_address, garbage_frames(rng))
            throw_udp(node.peer_address, rng)
        assert node.running, "the node must survive every malformed input"
        async with Producer(cluster.bootstrap) as producer:
            after = await producer.send_and_wait(TOPIC, b"after")
        assert after.offset > before[-1].offset
        async with Consumer(cluster.bootstrap) as consumer:
            await consumer.assign([TopicPartition(TOPIC, 0)])
            await consumer.seek_to_beginning()
            records = []
            while len(records) < 101:
                records += await consumer.getmany(timeout_ms=1000)
        values = [r.value for r in records]
        assert values == [b"before-%d" % i for i in range(100)] + [b"after"]
        assert [r.offset for r in records[:100]] == [m.offset for m in before]
    finally:
        cluster.stop()
