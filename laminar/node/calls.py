"""Node-internal request/reply over the peer connections (JSON bodies).

Used for what is not Raft traffic: forwarding metadata commands to the metadata leader and
gathering per-node status. Small and rare, so JSON is fine here. A body is a peer's input
like any other: one that is not JSON, or a command lacking or mistyping a field, gets a typed
error, never an exception out of the frame handler (nor a traceback in the log).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from laminar.errors import (
    ERRORS_BY_CODE,
    InvalidRequestError,
    LaminarError,
    ProtocolError,
    RequestTimeoutError,
)
from laminar.node.peers import PeerNetwork, new_peer_message
from laminar.node.raft_codec import Call, Reply

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
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise RequestTimeoutError(f"node {peer} did not answer {method}") from None
        finally:
            self._waiting.pop(call_id, None)

    def received(self, peer: int, which: str, body: Call | Reply) -> None:
        if isinstance(body, Reply):
            future = self._waiting.get(body.id)
            if future is None or future.done():
                return
            if body.errorCode:
                future.set_exception(_error(body.errorCode, body.errorMessage))
                return
            try:
                future.set_result(json.loads(body.body or b"null"))
            except (ValueError, RecursionError) as exc:
                future.set_exception(ProtocolError(f"node {peer} sent a malformed reply: {exc}"))
        elif isinstance(body, Call):
            task = asyncio.create_task(self._serve(peer, body.id, body.method, body.body))
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
            reply.body = json.dumps(await handler(peer, _json_body(body))).encode()
        except LaminarError as exc:
            reply.errorCode = exc.code
            reply.errorMessage = str(exc)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # A well-formed call whose command lacks or mistypes a field: the caller's defect.
            log.warning("malformed internal call", method=method, peer=peer, error=repr(exc))
            reply.errorCode = InvalidRequestError.code
            reply.errorMessage = f"malformed {method} call: {type(exc).__name__}: {exc}"
        except Exception as exc:
            log.exception("internal call failed", method=method)
            reply.errorCode = LaminarError.code
            reply.errorMessage = f"{type(exc).__name__}: {exc}"
        self._peers.send_other(peer, message)


def _json_body(body: bytes) -> Any:
    """A call's body decoded, or InvalidRequestError."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # incl. UnicodeDecodeError, nesting bombs
        raise InvalidRequestError(f"call body is not JSON: {exc}") from None


def _error(code: int, message: str) -> LaminarError:
    """The typed error a reply names (LaminarError for codes whose class needs more)."""
    cls = ERRORS_BY_CODE.get(code, LaminarError)
    try:
        return cls(message)
    except TypeError:  # e.g. OffsetOutOfRangeError(offset, start, end)
        return LaminarError(message)
