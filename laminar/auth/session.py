"""One client connection's authentication state, on either client port."""

from __future__ import annotations

from dataclasses import dataclass, field

from laminar.auth.scram import ScramServer


@dataclass(slots=True)
class Session:
    principal: str | None = None
    """The user this connection authenticated as (None: not authenticated)."""
    exchange: ScramServer | None = field(default=None, repr=False)
    """A SCRAM exchange under way."""
    mechanism: str = ""
    """Kafka: the mechanism SaslHandshake chose ("" before it)."""
    closing: bool = False
    """Kafka: close the connection once this reply is written (a failed exchange)."""
