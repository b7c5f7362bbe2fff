"""Our own frame format, shared by node-to-node TCP, client TCP and SWIM UDP.

A frame is a fixed 16-byte header followed by a Cap'n Proto message (unpacked, padded to a
multiple of 8 bytes) and an optional raw payload (record batches travel here, never inside the
Cap'n Proto message, so they are never copied by pycapnp):

    offset size field
    0      2    magic 0x4C4D ("LM")
    2      1    version (1)
    3      1    kind    (which schema/root type the message is; see laminar.protocol)
    4      4    message_len  (bytes of the Cap'n Proto message, multiple of 8)
    8      4    payload_len  (bytes of raw payload)
    12     4    crc32c over bytes 0..11 of this header, the message and (see below) the payload

All integers are little-endian. The crc exists because 68% of bit-flipped Cap'n Proto messages
still decode (see the brief): a frame that fails it is dropped and its connection closed.

On client connections the payload is only ever record batches, each with a crc32c of its own
that its receiver checks (the node before appending a produced batch, the client library and
the Spark source before decoding a fetched one), so there the frame crc leaves the payload out
and a fetch is not checksummed twice on each side. Peer and gossip frames carry other payloads
(Raft control entries), so their frame crc covers the payload too.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from laminar.errors import ProtocolError

MAGIC = 0x4C4D
VERSION = 1
HEADER = struct.Struct("<HBBIII")
HEADER_SIZE = HEADER.size  # 16
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


class FrameHeader(NamedTuple):
    kind: int
    message_len: int
    payload_len: int
    crc: int

    @property
    def body_len(self) -> int:
        return self.message_len + self.payload_len


Buffer = bytes | bytearray | memoryview


def encode_frame(
    kind: int, message: bytes, payload: Buffer = b"", *, crc_covers_payload: bool = True
) -> list[Buffer]:
    """Return the frame as buffers to write in order (header, message, payload)."""
    return encode_frame_parts(kind, message, [payload] if payload else [], crc_covers_payload)


def encode_frame_parts(
    kind: int, message: bytes, payload_parts: list[Buffer], crc_covers_payload: bool = True
) -> list[Buffer]:
    """Like encode_frame with the payload given as several buffers (written without a join)."""
    if len(message) % 8:
        raise ValueError("a Cap'n Proto message is always a multiple of 8 bytes")
    total = sum(len(part) for part in payload_parts)
    prefix = struct.pack("<HBBII", MAGIC, VERSION, kind, len(message), total)
    crc = crc32c.crc32c(message, crc32c.crc32c(prefix))
    for part in payload_parts if crc_covers_payload else ():
        crc = crc32c.crc32c(part, crc)
    return [prefix + struct.pack("<I", crc), message, *payload_parts]


def parse_header(buf: bytes | bytearray | memoryview) -> FrameHeader:
    """Validate the fixed header; raises ProtocolError on anything unexpected."""
    magic, version, kind, message_len, payload_len, crc = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic:#06x}")
    if version != VERSION:
        raise ProtocolError(f"unsupported frame version {version}")
    if message_len % 8 or message_len > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"bad message length {message_len}")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {payload_len} bytes is over the limit")
    return FrameHeader(kind, message_len, payload_len, crc)


def verify_body(
    header_bytes: bytes | bytearray | memoryview,
    header: FrameHeader,
    body: bytes | bytearray | memoryview,
    crc_covers_payload: bool = True,
) -> None:
    """Check the crc over header prefix + body (message, and payload if it is covered)."""
    covered = body if crc_covers_payload else memoryview(body)[: header.message_len]
    crc = crc32c.crc32c(covered, crc32c.crc32c(bytes(header_bytes[:12])))
    if crc != header.crc:
        raise ProtocolError("frame crc mismatch")


def decode_datagram(data: bytes) -> tuple[int, memoryview, memoryview]:
    """Split one whole frame (a UDP datagram) into (kind, message, payload) after checking it."""
    if len(data) < HEADER_SIZE:
        raise ProtocolError("datagram shorter than a frame header")
    header = parse_header(data)
    if len(data) != HEADER_SIZE + header.body_len:
        raise ProtocolError("datagram length does not match its frame header")
    view = memoryview(data)
    body = view[HEADER_SIZE:]
    verify_body(view[:HEADER_SIZE], header, body)
    return header.kind, body[: header.message_len], body[header.message_len :]
