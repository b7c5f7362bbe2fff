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

    def admit(self, batches: int, timeout_s: float | None) -> Admitted:
        """``async with admission.admit(n, timeout_s) as proposed:`` waits for room for ``n``
        batches; the caller appends the commit future of every batch it proposed to
        ``proposed``, and the room comes back once they all settle (see ``Admitted``)."""
        return Admitted(self, batches, timeout_s)

    def release_when_settled(
        self, batches: int, futures: list[asyncio.Future[Any]], timeout_s: float | None
    ) -> None:
        """Give ``batches`` back once every future is done (committed, failed or cancelled),
        or after ``timeout_s`` whatever happened: a write nobody waits for (acks 0 or 1)
        must not hold its room forever. None: the caller awaits them all with a deadline."""
        pending = [future for future in futures if not future.done()]
        if not pending:
            self.release(batches)
            return
        _Hold(self, batches, pending, timeout_s)

    def _fits(self, batches: int) -> bool:
        return self.in_flight + batches <= self.limit or self.in_flight == 0


class Admitted:
    """The async context of one produce request's admission (a class, not a generator: it
    is on the path of every produce request)."""

    __slots__ = ("_admission", "_batches", "_timeout_s", "proposed")

    def __init__(self, admission: ProduceAdmission, batches: int, timeout_s: float | None):
        self._admission = admission
        self._batches = batches
        self._timeout_s = timeout_s
        self.proposed: list[asyncio.Future[Any]] = []

    async def __aenter__(self) -> list[asyncio.Future[Any]]:
        await self._admission.acquire(self._batches)
        return self.proposed

    async def __aexit__(self, *_exc: object) -> None:
        self._admission.release_when_settled(self._batches, self.proposed, self._timeout_s)


class _Hold:
    """Room held by one request until its commit futures settle."""

    __slots__ = ("_admission", "_batches", "_pending", "_released", "_timer")

    def __init__(
        self,
        admission: ProduceAdmission,
        batches: int,
        pending: list[asyncio.Future[Any]],
        timeout_s: float | None,
    ) -> None:
        self._admission = admission
        self._batches = batches
        self._pending = len(pending)
        self._released = False
        self._timer: asyncio.TimerHandle | None = None
        if timeout_s is not None:
            self._timer = asyncio.get_running_loop().call_later(timeout_s, self._release)
        for future in pending:
            future.add_done_callback(self._settled)

    def _settled(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: nobody may await a write acknowledged early
        self._pending -= 1
        if self._pending == 0:
            self._release()

    def _release(self) -> None:
        if self._released:
            return  # (already released by the timeout)
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
        self._admission.release(self._batches)
