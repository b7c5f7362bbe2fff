"""Framed TCP streams for asyncio: parse frames as bytes arrive, write frames without copies.

Used by the node (client and peer listeners, peer connections) and by the client library. A
frame that fails its checks closes only the connection that sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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


class FramedProtocol(asyncio.Protocol):
    """An asyncio protocol that splits a byte stream into verified frames."""

    def __init__(
        self,
        on_frame: FrameHandler,
        on_close: Callable[[Exception | None], None] | None = None,
    ) -> None:
        self._on_frame = on_frame
        self._on_close = on_close
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.closed = False
        self._lost = False
        self.peer: str = ""

    # asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position = 0
        try:
            while len(buffer) - position >= HEADER_SIZE:
                header = parse_header(memoryview(buffer)[position : position + HEADER_SIZE])
                end = position + HEADER_SIZE + header.body_len
                if len(buffer) < end:
                    break
                frame = bytes(buffer[position:end])
                position = end
                view = memoryview(frame)
                body = view[HEADER_SIZE:]
                verify_body(view[:HEADER_SIZE], header, body)
                message = frame[HEADER_SIZE : HEADER_SIZE + header.message_len]
                self._on_frame(header.kind, message, body[header.message_len :])
                if self.closed:
                    return
        except ProtocolError as exc:
            log.warning("closing connection on bad frame", peer=self.peer, error=str(exc))
            self.close()
            return
        if position:
            del buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = True
        self._wake_writers()
        if self._on_close is not None:
            self._on_close(exc)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers()

    # API ---------------------------------------------------------------------------------
    def send(self, kind: int, message: bytes, payload: Buffer = b"") -> None:
        """Queue one frame for writing; never blocks (use ``drain`` for back-pressure)."""
        if self.closed or self._transport is None:
            raise ConnectionError("connection is closed")
        self._transport.writelines(encode_frame(kind, message, payload))

    def send_parts(self, kind: int, message: bytes, payload_parts: list[Buffer]) -> None:
        """Like send, with the payload given as several buffers (no join copy)."""
        if self.closed or self._transport is None:
            raise ConnectionError("connection is closed")
        self._transport.writelines(encode_frame_parts(kind, message, payload_parts))

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if not self._write_paused or self.closed:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def close(self) -> None:
        self.closed = True
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
