"""What one Kafka API is: key, served versions, schemas, handler; and the request context.

Each API lives in its own module under ``laminar/kafka/apis/`` and exports ``API``; the
registry (``apis/__init__.py``) lists the modules. Adding an API = one module + one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from laminar.auth.session import Session
from laminar.kafka.codec import VERSION_MAX, Struct

if TYPE_CHECKING:
    from laminar.kafka.broker import Broker

Handler = Callable[["RequestContext", dict[str, Any]], Awaitable[dict[str, Any] | None]]
"""Takes the decoded request body, returns the response body (None: send no response, as for
a Produce with acks=0)."""


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    request: Struct
    response: Struct
    handler: Handler
    flexible_from: int = VERSION_MAX + 1
    """The first version using compact types and tag buffers (Kafka's flexibleVersions)."""

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from

    def response_header_v1(self, version: int) -> bool:
        # ApiVersions answers with header v0 always: a client must read it before it knows
        # which versions (and so which header) the broker speaks.
        return self.flexible(version) and self.key != 18


@dataclass(slots=True)
class RequestContext:
    """One request as a handler sees it."""

    api_version: int
    correlation_id: int
    client_id: str | None
    broker: Broker
    peer: str = ""
    session: Session = field(default_factory=Session)
    """The connection's authentication state (SASL)."""

    def authorize(self, operation: str, topic: str) -> None:
        """Raise AuthorizationError (TOPIC_AUTHORIZATION_FAILED) unless the connection's
        user may ``operation`` (produce, consume, admin) on ``topic``."""
        self.broker.authorizer.check(self.session.principal, operation, topic)

    def authorize_describe(self, topic: str) -> None:
        self.broker.authorizer.check_describe(self.session.principal, topic)

    def authorize_superuser(self, what: str) -> None:
        self.broker.authorizer.check_superuser(self.session.principal, what)
