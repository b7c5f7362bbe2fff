"""One message a share-group member holds: the record, its receipt and its settlement calls.

``ack``/``release``/``reject``/``extend`` queue the settlement at once (so fire-and-forget calls
are not lost) and return an awaitable future; the consumer batches queued settlements on the
wire (share_settle.py). Awaiting it raises the item's error, e.g. ReceiptExpiredError when the
lock ran out before the settlement reached the partition's leader.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from laminar.client.types import Header
from laminar.errors import ReceiptExpiredError

if TYPE_CHECKING:
    from laminar.client.share_settle import Settler

ACK, RELEASE, REJECT, EXTEND = range(4)
"""Wire codes of ShareAck.action."""


class ShareMessage:
    """A delivered record with its delivery count and lock deadline (ms since the epoch).

    ``lock_until_ms`` is a conservative local estimate (the node's deadline never comes
    earlier); ``extend`` moves it once the node has confirmed the new lock.
    """

    __slots__ = (
        "_settled",
        "_settler",
        "delivery_count",
        "headers",
        "key",
        "lock_until_ms",
        "offset",
        "partition",
        "timestamp",
        "topic",
        "value",
    )

    def __init__(
        self,
        settler: Settler,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[Header, ...],
        delivery_count: int,
        lock_until_ms: int,
    ) -> None:
        self._settler = settler
        self._settled = False
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers
        self.delivery_count = delivery_count
        self.lock_until_ms = lock_until_ms

    def __repr__(self) -> str:
        return (
            f"ShareMessage({self.topic}/{self.partition}@{self.offset}, "
            f"delivery {self.delivery_count}, key={self.key!r}, value={self.value!r})"
        )

    @property
    def settled(self) -> bool:
        """True once ack, release or reject was called (whatever its outcome)."""
        return self._settled

    @property
    def lock_remaining_ms(self) -> int:
        """Milliseconds left on the lock as this client sees it (may be negative)."""
        return self.lock_until_ms - time.time_ns() // 1_000_000

    def ack(self) -> asyncio.Future[None]:
        """Done: the message is never delivered again."""
        return self._settle(ACK, 0)

    def release(self, delay_ms: int = 0) -> asyncio.Future[None]:
        """Not now: deliver it again (to any member) after ``delay_ms``; at the group's
        max deliveries it goes to the dead-letter topic instead."""
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        return self._settle(RELEASE, int(delay_ms))

    def reject(self) -> asyncio.Future[None]:
        """Poison: never deliver it again; it is copied to the group's dead-letter topic."""
        return self._settle(REJECT, 0)

    def extend(self, ms: int) -> asyncio.Future[None]:
        """Keep the lock for ``ms`` more milliseconds from now (visibility timeout)."""
        if ms <= 0:
            raise ValueError(f"ms must be > 0, not {ms}")
        if self._settled:
            return self._refused()
        return self._settler.submit(self, EXTEND, int(ms))

    def _settle(self, action: int, ms: int) -> asyncio.Future[None]:
        if self._settled:
            return self._refused()
        self._settled = True
        return self._settler.submit(self, action, ms)

    def _refused(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_exception(
            ReceiptExpiredError(
                f"{self.topic}/{self.partition}@{self.offset} was already settled by this member"
            )
        )
        return future
