"""Node-wide admission of produce work: how many batches may be proposed and not yet committed.

Without a bound, a burst of produce requests (up to ``max_requests_per_connection`` per
connection, each with a batch for every partition the node leads) was proposed in one loop
turn, and its appends reached the followers as one burst too. Under an open-loop flood over
300 partitions (``partitions_bench`` paced, 2-record batches) turns ran for seconds, no
heartbeat left meanwhile, followers elected new leaders and clients got NotLeader by the
hundred thousand: 725 elections in 5 s. A produce request now waits for room before it
proposes anything, and its room comes back as its batches commit (or fail, or time out), so
what a node has in flight stays what it can commit in well under an election timeout. Kafka
bounds the same with ``queued.max.requests``; here the unit is a batch, what costs the work.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any


class ProduceAdmission:
    """Batches proposed and not yet settled, and the requests waiting for room, in order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.waited = 0
        """Requests that had to wait for room (a metric: the node was saturated)."""
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, batches: int) -> None:
        """Wait until ``batches`` fit (first come, first served). A request larger than the
        whole limit goes alone, once nothing else is in flight."""
        if not self._waiting and self._fits(batches):
            self.in_flight += batches
            return
        self.waited += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((batches, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(batches)  # granted, then the request was cancelled
            raise

    def release(self, batches: int) -> None:
        """Give room back and hand it to the requests waiting, in their order."""
        self.in_flight -= batches
        waiting = self._waiting
        while waiting:
            wanted, future = waiting[0]
            if future.done():  # (cancelled while waiting)
                waiting.popleft()
                continue
            if not self._fits(wanted):
                break
            waiting.popleft()
            self.in_flight += wanted
            future.set_result(None)

    def release_when_settled(
        self, batches: int, futures: Iterable[asyncio.Future[Any]], timeout_s: float
    ) -> None:
        """Give ``batches`` back once every future is done (committed, failed or cancelled),
        or after ``timeout_s`` whatever happened (a write nobody waits for, acks 0 or 1,
        must not hold its room forever)."""
        pending = [future for future in futures if not future.done()]
        if not pending:
            self.release(batches)
            return
        _Hold(self, batches, pending, timeout_s)

    def _fits(self, batches: int) -> bool:
        return self.in_flight + batches <= self.limit or self.in_flight == 0


class _Hold:
    """Room held by one request until its commit waiters settle."""

    __slots__ = ("_admission", "_batches", "_pending", "_timer")

    def __init__(
        self,
        admission: ProduceAdmission,
        batches: int,
        pending: list[asyncio.Future[Any]],
        timeout_s: float,
    ) -> None:
        self._admission = admission
        self._batches = batches
        self._pending = len(pending)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            timeout_s, self._release
        )
        for future in pending:
            future.add_done_callback(self._settled)

    def _settled(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: nobody may await a write acknowledged early
        self._pending -= 1
        if self._pending == 0:
            self._release()

    def _release(self) -> None:
        if self._timer is None:
            return  # (already released by the timeout)
        self._timer.cancel()
        self._timer = None
        self._admission.release(self._batches)
