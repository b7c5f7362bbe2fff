"""SaslHandshake (key 17): the client names its SASL mechanism; SCRAM-SHA-256 is the one.

Only v1 (Kafka 4 dropped v0, whose raw unframed tokens no current client sends): the
exchange itself follows in SaslAuthenticate requests.
"""

from __future__ import annotations

from typing import Any

from laminar.auth.scram import MECHANISM
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, STRING, Array, F, Struct

REQUEST = Struct([F("mechanism", STRING)])
RESPONSE = Struct([F("error_code", INT16), F("mechanisms", Array(STRING))])


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    session = ctx.session
    if session.principal is not None or session.exchange is not None:
        session.closing = True
        return {"error_code": errors.ILLEGAL_SASL_STATE, "mechanisms": [MECHANISM]}
    if request["mechanism"] != MECHANISM:
        return {"error_code": errors.UNSUPPORTED_SASL_MECHANISM, "mechanisms": [MECHANISM]}
    session.mechanism = MECHANISM
    return {"error_code": errors.NONE, "mechanisms": [MECHANISM]}


API = Api(17, "SaslHandshake", 1, 1, REQUEST, RESPONSE, handle)
