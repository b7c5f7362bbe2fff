"""The Kafka listener: size-prefixed requests in, responses out in request order.

Each request runs as its own task (a long-poll fetch must not hold up a produce behind it on
another connection, and handlers await commits), but Kafka clients match responses to
requests by order, so each connection keeps a queue of pending responses and writes them from
its head as they complete. A request that cannot be framed or decoded closes its connection
only; an API or version this node does not serve is answered with UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from ssl import SSLContext
from typing import Any

import structlog

from laminar.auth.session import Session
from laminar.errors import LaminarError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.apis import SERVED
from laminar.kafka.broker import NodeBroker
from laminar.kafka.codec import KafkaCodecError, decode, decode_request_header, encode_response
from laminar.transport import split_address

log = structlog.get_logger(__name__)

MAX_REQUEST_BYTES = 100 * 1024 * 1024
"""Kafka's socket.request.max.bytes default."""
MAX_PENDING = 64
"""Requests in flight per connection before the listener stops reading from it."""
_SIZE = struct.Struct(">i")
BEFORE_AUTHENTICATION = frozenset({18, 17, 36})
"""ApiVersions, SaslHandshake, SaslAuthenticate: what a client may send before it has
authenticated, once the cluster has users (anything else closes the connection, as in Kafka)."""


def flexible_of(key: int, version: int) -> bool | None:
    api = SERVED.get(key)
    if api is None or not api.serves(version):
        return None
    return api.flexible(version)


def unsupported_response(correlation_id: int, api_key: int) -> bytes:
    """Header v0 + an int16 UNSUPPORTED_VERSION: exactly ApiVersions' v0 error reply, and
    what Kafka sends for ApiVersions at a version too high; for other APIs a client that sent
    a version it was not offered gets the code where its body's first field would be."""
    body = struct.pack(">ih", correlation_id, errors.UNSUPPORTED_VERSION)
    if api_key == 18:  # ApiVersions v0 body: error, api_keys array (the versions we serve)
        keys = sorted(SERVED.values(), key=lambda a: a.key)
        body += struct.pack(">i", len(keys))
        body += b"".join(struct.pack(">hhh", a.key, a.min_version, a.max_version) for a in keys)
    return _SIZE.pack(len(body)) + body


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.transport: Any = None
        self.buffer = bytearray()
        self.pending: collections.deque[asyncio.Future[bytes | bytearray | None]] = (
            collections.deque()
        )
        self.peer = ""
        self.closed = False
        self.paused = False
        self.session = Session()

    # asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for future in self.pending:
            future.cancel()
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 4:
                (size,) = _SIZE.unpack_from(buf, pos)
                if size < 0 or size > MAX_REQUEST_BYTES:
                    raise KafkaCodecError(f"request size {size} is out of bounds")
                if n - pos - 4 < size:
                    break
                frame = bytes(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                self._request(frame)
                if self.closed:
                    return
        except KafkaCodecError as exc:
            log.warning("malformed kafka request; closing", peer=self.peer, error=str(exc))
            self.close()
            return
        except Exception:  # never let a request take the node down
            log.exception("kafka request not accepted; closing", peer=self.peer)
            self.close()
            return
        if pos:
            del buf[:pos]

    # requests ----------------------------------------------------------------------------------
    def _request(self, frame: bytes) -> None:
        view = memoryview(frame)
        header = decode_request_header(view, flexible_of)
        api = SERVED.get(header.api_key)
        loop = asyncio.get_running_loop()
        slot: asyncio.Future[bytes | bytearray | None] = loop.create_future()
        self.pending.append(slot)
        if api is None or not api.serves(header.api_version):
            slot.set_result(unsupported_response(header.correlation_id, header.api_key))
            self._flush()
            return
        if (
            self.session.principal is None
            and api.key not in BEFORE_AUTHENTICATION
            and self.server.broker.authorizer.required
        ):
            log.warning(
                "kafka request before SASL authentication; closing", api=api.name, peer=self.peer
            )
            slot.set_result(None)
            self.close()
            return
        try:
            body = decode(
                api.request,
                view,
                header.body_offset,
                header.api_version,
                api.flexible(header.api_version),
            )
        except KafkaCodecError as exc:
            raise KafkaCodecError(f"{api.name} v{header.api_version}: {exc}") from None
        context = RequestContext(
            header.api_version,
            header.correlation_id,
            header.client_id,
            self.server.broker,
            self.peer,
            self.session,
        )
        task = loop.create_task(self._serve(api, context, body, slot))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)
        if len(self.pending) >= MAX_PENDING and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    async def _serve(
        self,
        api: Api,
        context: RequestContext,
        body: dict[str, Any],
        slot: asyncio.Future[bytes | bytearray | None],
    ) -> None:
        try:
            response = await api.handler(context, body)
            out = None
            if response is not None:
                version = context.api_version
                out = encode_response(
                    context.correlation_id,
                    api.response,
                    response,
                    version,
                    api.flexible(version),
                    api.response_header_v1(version),
                )
        except asyncio.CancelledError:
            raise
        except (LaminarError, ValueError, TypeError, KeyError) as exc:
            log.warning(
                "kafka request failed; closing", api=api.name, peer=self.peer, error=str(exc)
            )
            out = None
            self.close()
        except Exception:  # never let a request take the node down
            log.exception("kafka request failed; closing", api=api.name, peer=self.peer)
            out = None
            self.close()
        if not slot.done():
            slot.set_result(out)
        self._flush()
        if context.session.closing:  # a failed SASL exchange: its reply is written first
            self.close()

    def _flush(self) -> None:
        """Write every completed response at the head of the queue, in request order."""
        pending = self.pending
        transport = self.transport
        while pending and pending[0].done():
            slot = pending.popleft()
            if slot.cancelled():
                continue
            out = slot.result()
            if out is not None and transport is not None and not self.closed:
                transport.write(out)
        if self.paused and len(pending) < MAX_PENDING // 2 and transport is not None:
            self.paused = False
            if not self.closed:
                transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class KafkaServer:
    """One Kafka listener of a node."""

    def __init__(self, broker: NodeBroker) -> None:
        self.broker = broker
        self.connections: set[KafkaConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self, listen: str, ssl: SSLContext | None = None) -> None:
        host, port = split_address(listen)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self), host, port, reuse_address=True, ssl=ssl
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
