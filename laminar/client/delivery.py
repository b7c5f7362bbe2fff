"""Per-record delivery handles that cost no asyncio future unless one is really needed.

A batch resolves all its records at once, so the per-record handle only remembers its batch and
its index in it: the offset is the batch's base offset plus the index. Awaiting a record whose
batch is already done returns at once without touching the event loop. Only a record awaited
before its batch is done, or used as a future (``asyncio.gather``, ``wait``, ``wait_for``,
``add_done_callback``), gets a real future, created lazily and resolved with its batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from contextvars import Context
from typing import Any, Protocol

from laminar.client.types import RecordMetadata

_new = tuple.__new__  # builds a RecordMetadata without its Python-level __new__


class DeliveryBatch(Protocol):
    """What a handle needs of its batch (the accumulator's ProducerBatch)."""

    loop: asyncio.AbstractEventLoop
    finished: bool
    base_offset: int
    error: BaseException | None
    records: list[Any]
    waiters: list[tuple[asyncio.Future[RecordMetadata], int]]
    forwards: list[RecordFuture] | None

    @property
    def tp(self) -> tuple[str, int]: ...


class RecordFuture:
    """Awaitable, future-compatible result of one ``Producer.send``: its RecordMetadata.

    It follows asyncio's future duck-typing (``_asyncio_future_blocking``), so ``gather``,
    ``wait`` and ``wait_for`` accept it as they accept an ``asyncio.Future``.
    """

    __slots__ = ("_batch", "_future", "_index")

    _asyncio_future_blocking = False  # marks a future-like object for asyncio.isfuture

    def __init__(self, batch: DeliveryBatch, index: int) -> None:
        self._batch = batch
        self._index = index
        self._future: asyncio.Future[RecordMetadata] | None = None

    def _metadata(self) -> RecordMetadata:
        batch = self._batch
        if batch.forwards is not None:  # sent on to another partition after a seal
            return batch.forwards[self._index].result()
        error = batch.error
        if error is not None:
            raise error
        index = self._index
        base = batch.base_offset
        topic, partition = batch.tp
        return _new(
            RecordMetadata,
            (topic, partition, base + index if base >= 0 else -1, batch.records[index][3]),
        )

    def _real(self) -> asyncio.Future[RecordMetadata]:
        """The record's own future, created on first need and resolved with the batch."""
        future = self._future
        if future is None:
            batch = self._batch
            future = self._future = batch.loop.create_future()
            if batch.finished:
                resolve(future, batch, self._index)
            else:
                batch.waiters.append((future, self._index))
        return future

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if self._future is None and self._batch.finished:
            return self._metadata()
        return (yield from self._real().__await__())

    __iter__ = __await__

    # the asyncio.Future interface ------------------------------------------------------------
    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._batch.loop

    def done(self) -> bool:
        future = self._future
        return self._batch.finished if future is None else future.done()

    def cancelled(self) -> bool:
        return self._future is not None and self._future.cancelled()

    def result(self) -> RecordMetadata:
        if self._future is not None:
            return self._future.result()
        if not self._batch.finished:
            raise asyncio.InvalidStateError("Result is not ready.")
        return self._metadata()

    def exception(self) -> BaseException | None:
        if self._future is not None:
            return self._future.exception()
        if not self._batch.finished:
            raise asyncio.InvalidStateError("Exception is not set.")
        if self._batch.forwards is not None:
            return self._batch.forwards[self._index].exception()
        return self._batch.error

    def cancel(self, msg: Any = None) -> bool:
        """Cancels waiting for this record (the record itself may still be delivered)."""
        return self._real().cancel(msg)

    def add_done_callback(
        self, fn: Callable[[Any], object], *, context: Context | None = None
    ) -> None:
        self._real().add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        return 0 if self._future is None else self._future.remove_done_callback(fn)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<RecordFuture {self._batch.tp} #{self._index} {state}>"


def resolve(future: asyncio.Future[RecordMetadata], batch: DeliveryBatch, index: int) -> None:
    """Settle one record's real future from its finished batch (unless it was cancelled)."""
    if future.done():
        return
    if batch.forwards is not None:
        forwarded = batch.forwards[index]
        error = forwarded.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(forwarded.result())
        return
    if batch.error is not None:
        future.set_exception(batch.error)
        return
    topic, partition = batch.tp
    base = batch.base_offset
    offset = base + index if base >= 0 else -1
    future.set_result(RecordMetadata(topic, partition, offset, batch.records[index][3]))
