"""DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51): laminar's
users through Kafka's admin API (superusers only, as Kafka requires cluster rights).

Only SCRAM-SHA-256 (mechanism 1). An upsertion of an existing user changes its password; of a
new one creates a non-superuser (the first user, a superuser, is made with `laminar user
create --superuser`). A deletion removes the user and its ACLs. Errors are per user, as in Kafka.
"""

from __future__ import annotations

from typing import Any

from laminar.auth.scram import credential_from_salted
from laminar.errors import AuthenticationError, InvalidRequestError, LaminarError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BYTES, INT8, INT16, INT32, STRING, Array, F, Struct

SCRAM_SHA_256 = 1

DESCRIBE_REQUEST = Struct([F("users", Array(Struct([F("name", STRING)])), nullable="0+")])
DESCRIBE_RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
        F(
            "results",
            Array(
                Struct(
                    [
                        F("user", STRING),
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                        F(
                            "credential_infos",
                            Array(Struct([F("mechanism", INT8), F("iterations", INT32)])),
                        ),
                    ]
                )
            ),
        ),
    ]
)
ALTER_REQUEST = Struct(
    [
        F("deletions", Array(Struct([F("name", STRING), F("mechanism", INT8)]))),
        F(
            "upsertions",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F("mechanism", INT8),
                        F("iterations", INT32),
                        F("salt", BYTES),
                        F("salted_password", BYTES),
                    ]
                )
            ),
        ),
    ]
)
ALTER_RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F(
            "results",
            Array(
                Struct(
                    [
                        F("user", STRING),
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                    ]
                )
            ),
        ),
    ]
)


def _superuser(ctx: RequestContext) -> str | None:
    """None if the connection's user may manage users, else why not."""
    if ctx.broker.authorizer.allowed_superuser(ctx.session.principal):
        return None
    return "only a superuser may manage users"


async def describe(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    refused = _superuser(ctx)
    if refused is not None:
        return {
            "throttle_time_ms": 0,
            "error_code": errors.CLUSTER_AUTHORIZATION_FAILED,
            "error_message": refused,
            "results": [],
        }
    users = ctx.broker.authorizer.state.users
    wanted = [u["name"] for u in request["users"] or []] or sorted(users)
    results = []
    for name in dict.fromkeys(wanted):
        user = users.get(name)
        result: dict[str, Any] = {"user": name, "error_code": 0, "credential_infos": []}
        if wanted.count(name) > 1:
            result["error_code"] = errors.DUPLICATE_RESOURCE
            result["error_message"] = f"user {name!r} asked for more than once"
        elif user is None:
            result["error_code"] = errors.RESOURCE_NOT_FOUND
            result["error_message"] = (
                f"attempt to describe a user credential that does not exist: {name}"
            )
        else:
            result["credential_infos"] = [
                {"mechanism": SCRAM_SHA_256, "iterations": user.credential.iterations}
            ]
        results.append(result)
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}


async def alter(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    refused = _superuser(ctx)
    names = [d["name"] for d in request["deletions"]] + [u["name"] for u in request["upsertions"]]
    if refused is not None:
        return {
            "throttle_time_ms": 0,
            "results": [
                _result(n, errors.CLUSTER_AUTHORIZATION_FAILED, refused)
                for n in dict.fromkeys(names)
            ],
        }
    admin = ctx.broker.auth_admin
    results = []
    duplicated = {n for n in names if names.count(n) > 1}
    for name in sorted(duplicated):
        results.append(_result(name, errors.DUPLICATE_RESOURCE, "a user altered more than once"))
    for deletion in request["deletions"]:
        name = deletion["name"]
        if name in duplicated:
            continue
        if deletion["mechanism"] != SCRAM_SHA_256:
            results.append(_result(name, errors.UNSUPPORTED_SASL_MECHANISM, "SCRAM-SHA-256 only"))
            continue
        results.append(await _apply(name, admin.delete_user(name)))
    for upsertion in request["upsertions"]:
        name = upsertion["name"]
        if name in duplicated:
            continue
        if upsertion["mechanism"] != SCRAM_SHA_256:
            results.append(_result(name, errors.UNSUPPORTED_SASL_MECHANISM, "SCRAM-SHA-256 only"))
            continue
        try:
            credential = credential_from_salted(
                bytes(upsertion["salt"]),
                upsertion["iterations"],
                bytes(upsertion["salted_password"]),
            )
        except AuthenticationError as exc:
            results.append(_result(name, errors.UNACCEPTABLE_CREDENTIAL, str(exc)))
            continue
        if name in ctx.broker.authorizer.state.users:
            change = admin.alter_user(name, credential)
        else:
            change = admin.create_user(name, credential, False)
        results.append(await _apply(name, change))
    return {"throttle_time_ms": 0, "results": results}


async def _apply(name: str, change: Any) -> dict[str, Any]:
    try:
        await change
    except InvalidRequestError as exc:
        code = errors.RESOURCE_NOT_FOUND if "unknown user" in str(exc) else errors.INVALID_REQUEST
        return _result(name, code, str(exc))
    except LaminarError as exc:
        return _result(name, errors.code_of(exc), str(exc))
    return _result(name, errors.NONE, None)


def _result(name: str, code: int, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message}


DESCRIBE_API = Api(
    50,
    "DescribeUserScramCredentials",
    0,
    0,
    DESCRIBE_REQUEST,
    DESCRIBE_RESPONSE,
    describe,
    flexible_from=0,
)
ALTER_API = Api(
    51, "AlterUserScramCredentials", 0, 0, ALTER_REQUEST, ALTER_RESPONSE, alter, flexible_from=0
)
