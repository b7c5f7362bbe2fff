"""Value types the client hands to and gets from users: small, immutable, cheap to create."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from laminar.transport import split_address

DEFAULT_BOOTSTRAP = "127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292"
"""The three client addresses of the cluster `laminar dev` starts."""

DELIVER_AT_HEADER = "laminar-deliver-at"
"""Record header (ASCII ms since the epoch) that share groups do not deliver before (the same
name as laminar.queues.driver's; stream consumers ignore it)."""

Header = tuple[str, bytes | None]
Headers = Sequence[Header]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a produced record landed; offset is -1 when produced with acks="none"."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """One fetched record. A named tuple because the consumer creates one per record, and a
    tuple is the cheapest immutable object Python can build (a frozen dataclass costs ~8x)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(slots=True, frozen=True)
class FetchedBatches:
    """Whole record batches as the node served them (control batches included)."""

    data: bytes
    high_watermark: int
    log_start: int


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """'h:p,h:p' or ['h:p', ...] -> validated list; ValueError naming the bad entry."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [item.strip() for item in items if item and item.strip()]
    if not addresses:
        raise ValueError("bootstrap names no address (expected host:port[,host:port...])")
    for address in addresses:
        split_address(address)
    return addresses
