"""ApiVersions (key 18): which APIs and versions this node serves (the registry, exactly)."""

from __future__ import annotations

from typing import Any

from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, STRING, Array, F, Struct

REQUEST = Struct(
    [
        F("client_software_name", STRING, "3+"),
        F("client_software_version", STRING, "3+"),
    ]
)
RESPONSE = Struct(
    [
        F("error_code", INT16),
        F(
            "api_keys",
            Array(Struct([F("api_key", INT16), F("min_version", INT16), F("max_version", INT16)])),
        ),
        F("throttle_time_ms", INT32, "1+"),
    ]
)


async def handle(_ctx: RequestContext, _request: dict[str, Any]) -> dict[str, Any]:
    from laminar.kafka.apis import SERVED  # the registry imports this module

    keys = [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in sorted(SERVED.values(), key=lambda a: a.key)
    ]
    return {"error_code": 0, "api_keys": keys, "throttle_time_ms": 0}


API = Api(18, "ApiVersions", 0, 3, REQUEST, RESPONSE, handle, flexible_from=3)
