"""Framed TCP streams for asyncio: parse frames as bytes arrive, write frames without copies.

Used by the node (client and peer listeners, peer connections) and by the client library. A
frame that fails its checks closes only the connection that sent it.

Memory per connection is bounded by what the peer actually sent, never by what a header
claims: a large frame's buffer starts at ``GROW_FROM`` bytes and grows fourfold as bytes
arrive, up to the announced size, so 16 bytes announcing an 80 MiB frame cost 1 MiB. The
staging buffer is allocated at the first read, not with the protocol (uvloop creates the
protocol before connecting, so every failed dial attempt used to cost 256 KiB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog

from laminar.errors import ProtocolError
from laminar.framing import (
    HEADER_SIZE,
    Buffer,
    encode_frame,
    encode_frame_parts,
    parse_header,
    verify_body,
)

log = structlog.get_logger(__name__)

FrameHandler = Callable[[int, bytes, memoryview], None]
"""Called with (kind, message bytes, payload) for every whole, verified frame."""


STAGING_BYTES = 256 * 1024
"""Small frames are received into one reused staging buffer; a frame larger than half of it
is received straight into a buffer of its own (no copy of the record batches inside)."""

_spare_buffers: list[bytearray] = []
MAX_SPARE_BUFFERS = 8
_NO_STAGING = bytearray()
GROW_FROM = 1 << 20
"""The first buffer of a large frame not yet received: at most this, or four times what has
arrived, whichever is more (a length field alone never makes the node allocate much)."""
MAX_QUEUED_PARTS = 1024
"""Buffers queued for the next write before they are written at once."""
MAX_QUEUED_REPLY_BYTES = 1 << 20
"""On a server, reply bytes queued for the next write before they are written at once (so a
burst of requests read together meets the transport's back-pressure early)."""


def recycle(payload: memoryview) -> None:
    """Give a large frame's buffer back, for a later large frame to be received into.

    Fresh memory costs a page fault per 4 KiB on first touch, a large share of receiving a
    fetch. Only a caller holding no other reference into the frame may do this (the Spark
    source, once it has decoded a fetch into Arrow arrays of its own). The largest few
    buffers are kept.
    """
    buffer = payload.obj
    if isinstance(buffer, bytearray) and len(buffer) > STAGING_BYTES // 2:
        _spare_buffers.append(buffer)
        _spare_buffers.sort(key=len)
        del _spare_buffers[:-MAX_SPARE_BUFFERS]


def _large_buffer(size: int, received: int) -> bytearray:
    """A buffer for a frame of ``size`` bytes of which ``received`` are here: the smallest
    recycled one of ``size`` to twice that, else a new one of ``_capacity`` bytes."""
    for i, spare in enumerate(_spare_buffers):
        if size <= len(spare) <= 2 * size:
            return _spare_buffers.pop(i)
    return bytearray(_capacity(size, received))


def _capacity(size: int, received: int) -> int:
    """Room for the whole frame plus some (a recycled buffer then fits a somewhat larger
    frame next time), but never more than four times what has arrived (or GROW_FROM)."""
    whole = -(-(size + size // 4) // (1 << 20)) << 20
    return min(whole, max(GROW_FROM, 4 * received))


class FramedProtocol(asyncio.BufferedProtocol):
    """An asyncio protocol that splits a byte stream into verified frames."""

    def __init__(
        self,
        on_frame: FrameHandler,
        on_close: Callable[[Exception | None], None] | None = None,
        *,
        crc_covers_payload: bool = True,
        max_in_flight: int = 0,
    ) -> None:
        """``max_in_flight`` > 0 makes this a server side that reads no more requests while
        that many are being served (``request_started``/``request_done``) or while its
        replies are not being read (the write buffer is above its high-water mark), so one
        client cannot make the node queue unbounded work or unbounded replies."""
        self._on_frame = on_frame
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._reading_paused = False
        self._outgoing_bytes = 0
        self._on_close = on_close
        self._crc_covers_payload = crc_covers_payload  # False on client connections (framing)
        self._staging = _NO_STAGING  # until the first read: a protocol made for a connection
        # attempt that fails, or a connection that never sends, costs no staging buffer
        self._start = 0  # unparsed bytes are self._staging[self._start:self._end]
        self._end = 0
        self._large: bytearray | None = None  # a large frame being received, header included
        self._large_size = 0  # its size (the buffer may be longer)
        self._large_filled = 0
        self._transport: asyncio.Transport | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._outgoing: list[Buffer] = []
        self.closed = False
        self._lost = False
        self.peer: str = ""

    # asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""

    def extra_info(self, name: str) -> object:
        """The transport's ``get_extra_info(name)`` (e.g. ``peercert``), None once closed."""
        return None if self._transport is None else self._transport.get_extra_info(name)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled : self._large_size]
        if not self._staging:
            self._staging = bytearray(STAGING_BYTES)
        elif self._end == len(self._staging):  # full: move the unparsed tail to the front
            pending = self._end - self._start
            self._staging[:pending] = self._staging[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._staging)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._large is not None:
                self._large_filled += nbytes
                if self._large_filled == self._large_size:
                    frame, self._large = self._large, None
                    self._deliver(memoryview(frame)[: self._large_size])
                elif self._large_filled == len(self._large):
                    self._grow_large()
                return
            self._end += nbytes
            self._parse_staging()
        except ProtocolError as exc:
            log.warning("closing connection on bad frame", peer=self.peer, error=str(exc))
            self.close()

    def _parse_staging(self) -> None:
        staging = self._staging
        view = memoryview(staging)
        while self._end - self._start >= HEADER_SIZE and not (self.closed or self._reading_paused):
            start = self._start
            header = parse_header(view[start : start + HEADER_SIZE])
            size = HEADER_SIZE + header.body_len
            available = self._end - start
            if available < size:
                if size > len(staging) // 2:  # large: continue it in a buffer of its own
                    self._large = _large_buffer(size, available)
                    self._large_size = size
                    # (a memoryview copy: bytearray slice assignment is many times slower)
                    memoryview(self._large)[:available] = view[start : self._end]
                    self._large_filled = available
                    self._start = self._end = 0
                    return
                break
            self._start = start + size
            self._deliver(bytes(view[start : start + size]))
        if self._start == self._end:
            self._start = self._end = 0

    def _grow_large(self) -> None:
        """The large frame's buffer is full but the frame is not: move it to a larger one."""
        assert self._large is not None
        filled = self._large_filled
        larger = bytearray(_capacity(self._large_size, filled))
        memoryview(larger)[:filled] = memoryview(self._large)[:filled]
        self._large = larger

    def _deliver(self, frame: bytes | memoryview) -> None:
        view = memoryview(frame)
        header = parse_header(view[:HEADER_SIZE])
        body = view[HEADER_SIZE:]
        verify_body(view[:HEADER_SIZE], header, body, self._crc_covers_payload)
        message = bytes(body[: header.message_len])  # Cap'n Proto wants its own aligned bytes
        self._on_frame(header.kind, message, body[header.message_len :])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = True
        self._wake_writers()
        if self._on_close is not None:
            self._on_close(exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._gate_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers()
        self._gate_reading()

    def unsent_bytes(self) -> int:
        """Bytes written to this connection that the kernel has not taken yet."""
        transport = self._transport
        return 0 if transport is None else transport.get_write_buffer_size()

    # server-side back-pressure -------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight

    def request_started(self) -> None:
        self._in_flight += 1
        self._gate_reading()

    def request_done(self) -> None:
        self._in_flight -= 1
        self._gate_reading()

    def _gate_reading(self) -> None:
        if not self._max_in_flight or self._transport is None or self.closed:
            return
        pause = self._write_paused or self._in_flight >= self._max_in_flight
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self._transport.pause_reading()
                return
            self._transport.resume_reading()
            try:  # requests that arrived in the same read as the ones before the pause
                self._parse_staging()
            except ProtocolError as exc:
                log.warning("closing connection on bad frame", peer=self.peer, error=str(exc))
                self.close()

    # API ---------------------------------------------------------------------------------
    def send(self, kind: int, message: bytes, payload: Buffer = b"") -> None:
        """Queue one frame for writing; never blocks (use ``drain`` for back-pressure)."""
        self._queue(
            encode_frame(kind, message, payload, crc_covers_payload=self._crc_covers_payload)
        )

    def send_parts(
        self, kind: int, message: bytes, payload_parts: list[Buffer], *, now: bool = False
    ) -> None:
        """Like send, with the payload given as several buffers (no join copy).

        ``now``: write it (and whatever is queued before it) at once, for a caller that has
        already gathered everything it sends this turn into this one frame (a client's one
        request per node)."""
        parts = encode_frame_parts(kind, message, payload_parts, self._crc_covers_payload)
        self._queue(parts, now=now)

    def _queue(self, parts: Iterable[Buffer], *, now: bool = False) -> None:
        """Frames sent in one event-loop iteration leave in one write (one syscall for many
        small replies or pipelined requests, instead of one each)."""
        if self.closed or self._transport is None:
            raise ConnectionError("connection is closed")
        if not self._outgoing and not now:
            asyncio.get_running_loop().call_soon(self._write_out)
        self._outgoing.extend(parts)
        if now or len(self._outgoing) >= MAX_QUEUED_PARTS:  # (or a sender that never yields)
            self._write_out()
        elif self._max_in_flight:  # a server: replies queued count as unread ones
            self._outgoing_bytes += sum(memoryview(part).nbytes for part in parts)
            if self._outgoing_bytes >= MAX_QUEUED_REPLY_BYTES:
                self._write_out()

    def _write_out(self) -> None:
        parts, self._outgoing = self._outgoing, []
        self._outgoing_bytes = 0
        if parts and self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(parts)  # may call pause_writing: reading pauses too

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if not self._write_paused or self.closed:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def close(self) -> None:
        self.closed = True
        self._write_out()
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self, timeout: float = 2.0) -> None:
        """After close: wait until buffered writes reached the socket and it is closed (a
        process that exits right after close would otherwise drop them)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._lost and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)

    def _wake_writers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ValueError with a clear message otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
