"""One TCP connection to one node, with requests pipelined and matched by correlation id.

Responses may come back in any order, so every request gets a future keyed by its correlation
id; the connection never blocks one request on another.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any

from laminar.auth.scram import MECHANISM, ScramClient
from laminar.client.log import get_logger
from laminar.errors import (
    DiskFullError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    NotLeaderError,
    OutOfOrderSequenceError,
    ProtocolError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.framing import Buffer
from laminar.protocol import (
    API_VERSION,
    CLIENT_CRC_COVERS_PAYLOAD,
    KIND_REQUEST,
    KIND_RESPONSE,
    client_schema,
    decode,
)
from laminar.protocol import read_error as read_wire_error
from laminar.tls import describe_tls_error
from laminar.transport import FramedProtocol, split_address

log = get_logger(__name__)

BodyFiller = Callable[[Any], None]
"""Fills the Request.body union builder, e.g. ``lambda body: body.init("metadata")``."""

Reply = tuple[Any, memoryview]
"""(Response reader, frame payload) — the payload holds any record batches."""

RETRIABLE = (
    NotLeaderError,
    DiskFullError,
    RequestTimeoutError,
    NotEnoughReplicasError,
    NotCoordinatorError,
    UnknownTopicError,
    UnknownPartitionError,
    OutOfOrderSequenceError,
    ConnectionError,
    OSError,
)
"""Errors a metadata refresh and another attempt can cure (metadata may lag a topic change)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and password for SCRAM-SHA-256 (``repr`` hides the password)."""

    username: str
    password: str = field(repr=False)


def credentials_of(username: str | None, password: str | None) -> Credentials | None:
    """The clients' ``username=``/``password=`` options as Credentials (None: neither)."""
    if not username and not password:
        return None
    if not username or not password:
        raise ValueError("username and password go together")
    return Credentials(username, password)


class Connection:
    """A pipelined request/response channel to one node's client listener."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._protocol: FramedProtocol | None = None
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._tls = False
        self._answered = False
        self._lost = ""  # why the node closed the connection, for requests made after that

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        timeout: float = 5.0,
        ssl: SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> Connection:
        """Connect to ``address`` (host:port), over TLS with ``ssl`` (the host name is checked
        against the node's certificate), and authenticate with ``credentials`` (SCRAM-SHA-256)
        if given; ConnectionError with the address on failure, AuthenticationError if the
        node refuses the credentials."""
        connection = cls(address)
        connection._tls = ssl is not None
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, protocol = await loop.create_connection(
                    lambda: FramedProtocol(
                        connection._on_frame,
                        connection._on_close,
                        crc_covers_payload=CLIENT_CRC_COVERS_PAYLOAD,
                    ),
                    host,
                    port,
                    ssl=ssl,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"cannot connect to {address}: {_reason(exc)}") from None
        connection._protocol = protocol
        if credentials is not None:
            try:
                await connection.authenticate(credentials, timeout)
            except BaseException:
                connection.close()
                raise
        return connection

    async def authenticate(self, credentials: Credentials, timeout: float = 5.0) -> None:
        """The SCRAM-SHA-256 exchange; AuthenticationError if the node refuses it (or cannot
        prove it knows the user's credential)."""
        scram = ScramClient(credentials.username, credentials.password)

        def step(token: bytes) -> BodyFiller:
            def fill(body: Any) -> None:
                request = body.init("saslAuthenticate")
                request.mechanism = MECHANISM
                request.token = token

            return fill

        first, _ = await self.request(step(scram.first()), timeout=timeout)
        final = scram.final(bytes(first.body.sasl.token))
        last, _ = await self.request(step(final), timeout=timeout)
        scram.verify(bytes(last.body.sasl.token))

    @property
    def closed(self) -> bool:
        return self._protocol is None or self._protocol.closed

    async def request(
        self,
        fill: BodyFiller,
        payload_parts: Sequence[Buffer] = (),
        *,
        timeout: float | None = 30.0,
        expect_reply: bool = True,
        now: bool = False,
    ) -> Reply:
        """Send one request; return its reply or raise the typed error the node sent.

        With ``expect_reply=False`` (produce with acks=none) the request is written and an empty
        reply returned at once; a response that arrives anyway is dropped. ``now``: written at
        once rather than with the other requests of this loop turn (the producer's one request
        per node and turn).
        """
        protocol = self._protocol
        if protocol is None or protocol.closed:
            raise ConnectionError(self._lost or f"connection to {self.address} is closed")
        correlation_id = next(self._ids)
        message = client_schema.Request.new_message()
        message.correlationId = correlation_id
        message.apiVersion = API_VERSION
        fill(message.body)
        encoded = message.to_bytes()
        if not expect_reply:
            protocol.send_parts(KIND_REQUEST, encoded, list(payload_parts), now=now)
            await protocol.drain()
            return None, memoryview(b"")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        try:
            protocol.send_parts(KIND_REQUEST, encoded, list(payload_parts), now=now)
            await protocol.drain()
            async with asyncio.timeout(timeout):  # one loop turn after the reply (wait_for: two)
                reply = await future
        except TimeoutError:
            raise RequestTimeoutError(
                f"no reply from {self.address} within {timeout:.1f} s"
            ) from None
        finally:
            self._pending.pop(correlation_id, None)
        error = read_wire_error(reply[0].error)
        if error is not None:
            raise error
        return reply

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
        self._fail_pending(ConnectionError(f"connection to {self.address} closed"))

    async def wait_closed(self) -> None:
        if self._protocol is not None:
            await self._protocol.wait_closed()

    # protocol callbacks ----------------------------------------------------------------
    def _on_frame(self, kind: int, message: bytes, payload: memoryview) -> None:
        if kind != KIND_RESPONSE:
            log.warning("unexpected frame kind from node", address=self.address, kind=kind)
            return
        try:
            response = decode(client_schema.Response, message)
        except ProtocolError as exc:
            # A reply we cannot read leaves its request unanswerable: fail everything pending.
            self._fail_pending(exc)
            self.close()
            return
        self._answered = True
        future = self._pending.get(response.correlationId)
        if future is not None and not future.done():
            future.set_result((response, payload))

    def _on_close(self, exc: Exception | None) -> None:
        reason = f": {_reason(exc)}" if exc else ""
        refused = exc is None or isinstance(exc, (ConnectionResetError, BrokenPipeError))
        if refused and not self._answered:
            if self._tls:  # TLS 1.3: a refused client certificate shows as a close or reset
                reason = (
                    f" before any reply{reason}: if the node requires a client certificate,"
                    " present one signed by its CA (ssl context with load_cert_chain;"
                    " --tls-cert/--tls-key)"
                )
            elif self._pending:
                reason = (
                    f" before any reply{reason} (does the node require TLS? pass ssl= or --tls-ca)"
                )
        self._lost = f"connection to {self.address} lost{reason}"
        self._fail_pending(ConnectionError(self._lost))

    def _fail_pending(self, error: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    if isinstance(exc, TimeoutError):
        return "timed out"
    tls = describe_tls_error(exc)
    if tls is not None:
        return f"{tls} [{exc}]"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def is_retriable(error: BaseException) -> bool:
    """Errors that a metadata refresh and another attempt can cure."""
    return isinstance(error, RETRIABLE)
