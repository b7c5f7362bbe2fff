"""Node-internal request/reply over the peer connections (JSON bodies).

Used for what is not Raft traffic: forwarding metadata commands to the metadata leader and
gathering per-node status. Small and rare, so JSON is fine here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from laminar.errors import ERRORS_BY_CODE, LaminarError, RequestTimeoutError
from laminar.node.peers import PeerNetwork, new_peer_message

log = structlog.get_logger(__name__)

Handler = Callable[[int, Any], Awaitable[Any]]


class PeerCalls:
    def __init__(self, peers: PeerNetwork) -> None:
        self._peers = peers
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._handlers: dict[str, Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, method: str, handler: Handler) -> None:
        self._handlers[method] = handler

    async def call(self, peer: int, method: str, body: Any, timeout: float = 10.0) -> Any:
        call_id = next(self._ids)
        message = new_peer_message()
        call = message.init("call")
        call.id = call_id
        call.method = method
        call.body = json.dumps(body).encode()
        future = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            if not self._peers.send_other(peer, message):
                raise ConnectionError(f"no connection to node {peer}")
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RequestTimeoutError(f"node {peer} did not answer {method}") from None
        finally:
            self._waiting.pop(call_id, None)

    def received(self, peer: int, which: str, body: Any) -> None:
        if which == "reply":
            future = self._waiting.get(body.id)
            if future is None or future.done():
                return
            if body.errorCode:
                cls = ERRORS_BY_CODE.get(body.errorCode, LaminarError)
                future.set_exception(cls(body.errorMessage))
            else:
                future.set_result(json.loads(bytes(body.body) or b"null"))
        elif which == "call":
            task = asyncio.create_task(self._serve(peer, body.id, body.method, bytes(body.body)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, peer: int, call_id: int, method: str, body: bytes) -> None:
        message = new_peer_message()
        reply = message.init("reply")
        reply.id = call_id
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise LaminarError(f"unknown internal method {method!r}")
            reply.body = json.dumps(await handler(peer, json.loads(body))).encode()
        except LaminarError as exc:
            reply.errorCode = exc.code
            reply.errorMessage = str(exc)
        except Exception as exc:
            log.exception("internal call failed", method=method)
            reply.errorCode = LaminarError.code
            reply.errorMessage = f"{type(exc).__name__}: {exc}"
        self._peers.send_other(peer, message)
