"""CreateAcls (30), DescribeAcls (29), DeleteAcls (31): laminar's allow-rules through Kafka's
admin API (superusers only; Kafka asks for cluster rights). The mapping is in
``laminar/kafka/acl_bindings.py``."""

from __future__ import annotations

from typing import Any

from laminar.errors import LaminarError
from laminar.kafka import errors
from laminar.kafka.acl_bindings import binding_of, matches, rule_of
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT8, INT16, INT32, STRING, Array, F, Struct

_FILTER = [
    F("resource_type_filter", INT8),
    F("resource_name_filter", STRING, nullable="0+"),
    F("pattern_type_filter", INT8, "1+", default=3),
    F("principal_filter", STRING, nullable="0+"),
    F("host_filter", STRING, nullable="0+"),
    F("operation", INT8),
    F("permission_type", INT8),
]
_ACL = [
    F("principal", STRING),
    F("host", STRING),
    F("operation", INT8),
    F("permission_type", INT8),
]
CREATE_REQUEST = Struct(
    [
        F(
            "creations",
            Array(
                Struct(
                    [
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                        F("resource_pattern_type", INT8, "1+", default=3),
                        *_ACL,
                    ]
                )
            ),
        )
    ]
)
CREATE_RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F(
            "results",
            Array(Struct([F("error_code", INT16), F("error_message", STRING, nullable="0+")])),
        ),
    ]
)
DESCRIBE_REQUEST = Struct(_FILTER)
DESCRIBE_RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
        F(
            "resources",
            Array(
                Struct(
                    [
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                        F("pattern_type", INT8, "1+", default=3),
                        F("acls", Array(Struct(_ACL))),
                    ]
                )
            ),
        ),
    ]
)
DELETE_REQUEST = Struct([F("filters", Array(Struct(_FILTER)))])
DELETE_RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F(
            "filter_results",
            Array(
                Struct(
                    [
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                        F(
                            "matching_acls",
                            Array(
                                Struct(
                                    [
                                        F("error_code", INT16),
                                        F("error_message", STRING, nullable="0+"),
                                        F("resource_type", INT8),
                                        F("resource_name", STRING),
                                        F("pattern_type", INT8, "1+", default=3),
                                        *_ACL,
                                    ]
                                )
                            ),
                        ),
                    ]
                )
            ),
        ),
    ]
)
REFUSED = "only a superuser may manage ACLs"


def _superuser(ctx: RequestContext) -> bool:
    return ctx.broker.authorizer.allowed_superuser(ctx.session.principal)


async def create(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    results = []
    for creation in request["creations"]:
        result: dict[str, Any] = {"error_code": errors.NONE, "error_message": None}
        results.append(result)
        if not _superuser(ctx):
            result.update(error_code=errors.CLUSTER_AUTHORIZATION_FAILED, error_message=REFUSED)
            continue
        try:
            await ctx.broker.auth_admin.add_acl(rule_of(creation))
        except LaminarError as exc:
            result.update(error_code=errors.code_of(exc), error_message=str(exc))
    return {"throttle_time_ms": 0, "results": results}


async def describe(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if not _superuser(ctx):
        return {
            "throttle_time_ms": 0,
            "error_code": errors.CLUSTER_AUTHORIZATION_FAILED,
            "error_message": REFUSED,
            "resources": [],
        }
    resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for rule in ctx.broker.authorizer.state.acls:
        binding = binding_of(rule)
        if matches(request, binding):
            key = (binding["resource_type"], binding["resource_name"], binding["pattern_type"])
            resources.setdefault(key, []).append(binding)
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "error_message": None,
        "resources": [
            {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
            for (t, n, p), acls in resources.items()
        ],
    }


async def delete(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    results = []
    for filter_ in request["filters"]:
        if not _superuser(ctx):
            results.append(
                {
                    "error_code": errors.CLUSTER_AUTHORIZATION_FAILED,
                    "error_message": REFUSED,
                    "matching_acls": [],
                }
            )
            continue
        matching = []
        for rule in list(ctx.broker.authorizer.state.acls):
            binding = binding_of(rule)
            if not matches(filter_, binding):
                continue
            outcome: dict[str, Any] = {"error_code": errors.NONE, "error_message": None}
            try:
                await ctx.broker.auth_admin.remove_acl(rule)
            except LaminarError as exc:
                outcome.update(error_code=errors.code_of(exc), error_message=str(exc))
            matching.append({**outcome, **binding})
        results.append(
            {"error_code": errors.NONE, "error_message": None, "matching_acls": matching}
        )
    return {"throttle_time_ms": 0, "filter_results": results}


DESCRIBE_API = Api(29, "DescribeAcls", 1, 3, DESCRIBE_REQUEST, DESCRIBE_RESPONSE, describe, 2)
CREATE_API = Api(30, "CreateAcls", 1, 3, CREATE_REQUEST, CREATE_RESPONSE, create, 2)
DELETE_API = Api(31, "DeleteAcls", 1, 3, DELETE_REQUEST, DELETE_RESPONSE, delete, 2)
