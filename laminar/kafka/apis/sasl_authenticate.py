"""SaslAuthenticate (key 36): one step of the SCRAM-SHA-256 exchange (laminar/auth/scram.py)
after SaslHandshake. A failed exchange is answered with SASL_AUTHENTICATION_FAILED and the
connection closed, as Kafka does; so is one out of order (ILLEGAL_SASL_STATE)."""

from __future__ import annotations

from typing import Any

from laminar.auth.scram import ScramServer
from laminar.errors import AuthenticationError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BYTES, INT16, INT64, STRING, F, Struct

REQUEST = Struct([F("auth_bytes", BYTES)])
RESPONSE = Struct(
    [
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
        F("auth_bytes", BYTES),
        F("session_lifetime_ms", INT64, "1+"),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    session = ctx.session
    if not session.mechanism or session.principal is not None:
        session.closing = True
        return _failed(errors.ILLEGAL_SASL_STATE, "SaslAuthenticate needs a SaslHandshake first")
    if session.exchange is None:
        session.exchange = ScramServer(ctx.broker.authorizer.state.credential)
    try:
        token = session.exchange.step(bytes(request["auth_bytes"] or b""))
    except AuthenticationError as exc:
        session.closing = True
        return _failed(errors.SASL_AUTHENTICATION_FAILED, str(exc))
    if session.exchange.done:
        session.principal = session.exchange.username
        session.exchange = None
    return {
        "error_code": errors.NONE,
        "error_message": None,
        "auth_bytes": token,
        "session_lifetime_ms": 0,
    }


def _failed(code: int, message: str) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": b"",
        "session_lifetime_ms": 0,
    }


API = Api(36, "SaslAuthenticate", 0, 2, REQUEST, RESPONSE, handle, flexible_from=2)
