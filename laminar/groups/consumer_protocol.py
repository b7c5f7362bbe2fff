"""Kafka's consumer protocol payloads (ConsumerProtocolSubscription / ConsumerProtocolAssignment).

Classic groups treat a member's subscription and assignment as opaque bytes: the client-side
assignor writes them and the coordinator only stores and forwards them. These helpers read
(and, for tests, write) the ``consumer`` protocol type's layout so that describe can show the
topics a member subscribes to and the partitions it was given. Reading is best effort: bytes of
another protocol type or a malformed payload read as nothing.
"""

from __future__ import annotations

import struct

from laminar.groups.records import TopicPartition


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take(">h")
        if size < 0:
            return ""
        value = self.data[self.pos : self.pos + size]
        if len(value) != size:
            raise ValueError("truncated string")
        self.pos += size
        return value.decode()


def subscription_topics(data: bytes) -> tuple[str, ...]:
    """The topics of a ConsumerProtocolSubscription (any version), or () if unreadable."""
    try:
        reader = _Reader(data)
        reader.take(">h")  # version
        count = reader.take(">i")
        if not 0 <= count <= 100_000:
            return ()
        return tuple(sorted(reader.string() for _ in range(count)))
    except (struct.error, ValueError, UnicodeDecodeError):
        return ()


def assignment_partitions(data: bytes) -> tuple[TopicPartition, ...]:
    """The partitions of a ConsumerProtocolAssignment (any version), or () if unreadable."""
    try:
        reader = _Reader(data)
        reader.take(">h")  # version
        out: list[TopicPartition] = []
        for _ in range(max(0, reader.take(">i"))):
            topic = reader.string()
            out += [(topic, reader.take(">i")) for _ in range(max(0, reader.take(">i")))]
        return tuple(sorted(out))
    except (struct.error, ValueError, UnicodeDecodeError):
        return ()


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_subscription(topics: tuple[str, ...] | list[str]) -> bytes:
    """A version-0 subscription (used by tests and the simulation)."""
    body = struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics)
    return body + struct.pack(">i", -1)  # no user data


def encode_assignment(partitions: list[TopicPartition] | tuple[TopicPartition, ...]) -> bytes:
    """A version-0 assignment (used by tests and the simulation)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    body = struct.pack(">hi", 0, len(by_topic))
    for topic, indexes in by_topic.items():
        body += _string(topic) + struct.pack(f">i{len(indexes)}i", len(indexes), *indexes)
    return body + struct.pack(">i", -1)
