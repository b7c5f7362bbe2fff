"""The node's HTTP port (``--metrics-listen``): ``/metrics``, ``/healthz`` and ``/readyz``.

A deliberately tiny HTTP/1.1 server on the node's own event loop (one request per connection,
GET and HEAD only), so a scrape reads node state on the thread that owns it and no web
framework or extra thread comes along. ``/metrics`` renders the registry with
``prometheus_client.generate_latest``; ``/healthz`` answers 200 while the process runs;
``/readyz`` answers 200 only when ``ready()`` reports no reason not to be, else 503 listing
them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from laminar.transport import split_address

log = structlog.get_logger(__name__)

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT = 5.0
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HealthServer:
    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        not_ready: Callable[[], list[str]],
    ) -> None:
        """``not_ready()`` returns why the node is not ready (empty: ready)."""
        self.listen = listen
        self._registry = registry
        self._not_ready = not_ready
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        host, port = split_address(self.listen)
        self._server = await asyncio.start_server(
            self._handle, host, port, reuse_address=True, limit=MAX_REQUEST_BYTES
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        head = b""
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            status, content_type, body = self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, content_type, body = 400, "text/plain", b"bad request\n"
        except ConnectionError:
            writer.close()
            return
        except Exception as exc:  # a failing collector must not take the port down
            log.exception("metrics request failed")
            status, content_type, body = 500, "text/plain", f"error: {exc}\n".encode()
        finally:
            self._handlers.discard(task)
        writer.write(
            f"HTTP/1.1 {status} {REASONS[status]}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        if not head.startswith(b"HEAD "):
            writer.write(body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    def _respond(self, head: bytes) -> tuple[int, str, bytes]:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3:
            return 400, "text/plain", b"bad request\n"
        method, target, _version = parts
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"only GET and HEAD\n"
        path = target.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            reasons = self._not_ready()
            if reasons:
                text = "not ready\n" + "".join(f"{reason}\n" for reason in reasons)
                return 503, "text/plain", text.encode()
            return 200, "text/plain", b"ready\n"
        return 404, "text/plain", b"try /metrics, /healthz or /readyz\n"
