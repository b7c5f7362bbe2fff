"""Authentication and authorization on the native client port (``Session``: per connection).

``NativeAuth.handle`` runs before every request: it serves the SCRAM exchange and user/ACL
management itself, and for every other request checks that the connection's user may make it
(raising AuthenticationError / AuthorizationError, so the request is refused before it touches
anything). Each request kind maps to what it needs; a kind missing from the table needs a
superuser, so a new request kind is never open by accident.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from laminar.auth.acl import ADMIN, CONSUME, PRODUCE, Authorizer
from laminar.auth.admin import AuthAdmin
from laminar.auth.scram import MECHANISM, ScramCredential, ScramServer
from laminar.auth.session import Session
from laminar.auth.state import AclRule
from laminar.errors import AuthenticationError


def _topics(items: Any) -> list[str]:
    return [item.topic for item in items]


# What each request needs: (operation, topics of the body) or a special rule.
_TOPIC_CHECKS: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "produce": (PRODUCE, lambda body: _topics(body.batches)),
    "fetch": (CONSUME, lambda body: _topics(body.partitions)),
    "createTopic": (ADMIN, lambda body: [body.name]),
    "deleteTopic": (ADMIN, lambda body: [str(body)]),
    "addPartitions": (ADMIN, lambda body: [body.name]),
    "alterTopic": (ADMIN, lambda body: [body.name]),
    "splitPartition": (ADMIN, lambda body: [body.name]),
    "mergePartitions": (ADMIN, lambda body: [body.name]),
    "commitOffsets": (CONSUME, lambda body: _topics(body.offsets)),
    "fetchOffsets": (CONSUME, lambda body: _topics(body.partitions)),
    "shareFetch": (
        CONSUME,
        lambda body: [*_topics(body.partitions), *_topics(body.acks), *_topics(body.ackRuns)],
    ),
}
_DESCRIBE_CHECKS: dict[str, Callable[[Any], list[str]]] = {
    "listOffsets": lambda body: _topics(body.queries),
    "describeQueue": lambda body: _topics(body.partitions),
}
_AUTHENTICATED_ONLY = frozenset(
    {
        "metadata",
        "clusterStatus",
        "clusterHealth",
        "groupHeartbeat",  # the offsets it leads to are checked on fetch and commit
        "leaveGroup",
        "listGroups",
        "describeGroup",
        "describeQueueConfig",
    }
)
"""Requests any user may make (read-only, or only about the user's own group membership)."""
_SUPERUSER_ONLY = {
    "drainNode": "drain a node",
    "undrainNode": "undrain a node",
    "deleteGroup": "delete a consumer group",
    "alterQueueConfig": "change a share group's settings",
    "createUser": "manage users",
    "alterUser": "manage users",
    "deleteUser": "manage users",
    "listUsers": "list users",
    "addAcl": "manage ACLs",
    "removeAcl": "manage ACLs",
    "listAcls": "list ACLs",
}

Handler = Callable[[Session, Any, Any], Awaitable[None]]


class NativeAuth:
    def __init__(self, authorizer: Authorizer, admin: AuthAdmin) -> None:
        self.authorizer = authorizer
        self.admin = admin
        self._handlers: dict[str, Handler] = {
            "saslAuthenticate": self._sasl,
            "createUser": self._create_user,
            "alterUser": self._alter_user,
            "deleteUser": self._delete_user,
            "listUsers": self._list_users,
            "addAcl": self._add_acl,
            "removeAcl": self._remove_acl,
            "listAcls": self._list_acls,
        }

    async def handle(self, session: Session, which: str, body: Any, response: Any) -> bool:
        """Check ``which`` may run for this session (raises if not); serve it if it is an
        auth request (True: answered, the caller has nothing more to do)."""
        if which == "saslAuthenticate":
            await self._sasl(session, body, response)
            return True
        self.check(session.principal, which, body)
        handler = self._handlers.get(which)
        if handler is None:
            return False
        await handler(session, body, response)
        return True

    def check(self, principal: str | None, which: str, body: Any) -> None:
        authorizer = self.authorizer
        if not authorizer.required:
            return
        authorizer.check_authenticated(principal)
        if which in _AUTHENTICATED_ONLY:
            return
        checked = _TOPIC_CHECKS.get(which)
        if checked is not None:
            operation, topics = checked
            for topic in dict.fromkeys(topics(body)):
                authorizer.check(principal, operation, topic)
            return
        describe = _DESCRIBE_CHECKS.get(which)
        if describe is not None:
            for topic in dict.fromkeys(describe(body)):
                authorizer.check_describe(principal, topic)
            return
        authorizer.check_superuser(principal, _SUPERUSER_ONLY.get(which, f"make {which} requests"))

    # SCRAM ------------------------------------------------------------------------------------
    async def _sasl(self, session: Session, body: Any, response: Any) -> None:
        if session.principal is not None:
            raise AuthenticationError("this connection is authenticated already")
        if session.exchange is None:
            if body.mechanism != MECHANISM:
                raise AuthenticationError(
                    f"unsupported SASL mechanism {body.mechanism!r}; this node offers {MECHANISM}"
                )
            session.exchange = ScramServer(self.authorizer.state.credential)
        exchange = session.exchange
        try:
            token = exchange.step(bytes(body.token))
        except AuthenticationError:
            session.exchange = None  # a failed exchange may be started over
            raise
        reply = response.body.init("sasl")
        reply.token = token
        if exchange.done:
            session.principal = exchange.username
            session.exchange = None
            reply.done = True

    # users and ACLs ---------------------------------------------------------------------------
    async def _create_user(self, _session: Session, body: Any, response: Any) -> None:
        await self.admin.create_user(body.name, _credential(body), body.superuser)
        response.body.none = None

    async def _alter_user(self, _session: Session, body: Any, response: Any) -> None:
        await self.admin.alter_user(body.name, _credential(body))
        response.body.none = None

    async def _delete_user(self, _session: Session, name: str, response: Any) -> None:
        await self.admin.delete_user(str(name))
        response.body.none = None

    async def _list_users(self, _session: Session, _body: Any, response: Any) -> None:
        users = sorted(self.authorizer.state.users.values(), key=lambda u: u.name)
        slots = response.body.init("users").init("users", len(users))
        for slot, user in zip(slots, users, strict=True):
            slot.name = user.name
            slot.superuser = user.superuser
            slot.iterations = user.credential.iterations

    async def _add_acl(self, _session: Session, body: Any, response: Any) -> None:
        await self.admin.add_acl(_rule(body))
        response.body.none = None

    async def _remove_acl(self, _session: Session, body: Any, response: Any) -> None:
        await self.admin.remove_acl(_rule(body))
        response.body.none = None

    async def _list_acls(self, _session: Session, _body: Any, response: Any) -> None:
        rules = list(self.authorizer.state.acls)
        slots = response.body.init("acls").init("rules", len(rules))
        for slot, rule in zip(slots, rules, strict=True):
            slot.principal = rule.principal
            slot.kind = rule.kind
            slot.name = rule.name
            slot.operation = rule.operation


def _credential(body: Any) -> ScramCredential:
    return ScramCredential(
        bytes(body.salt), body.iterations, bytes(body.storedKey), bytes(body.serverKey)
    )


def _rule(body: Any) -> AclRule:
    return AclRule.from_json(
        {
            "principal": body.principal,
            "kind": body.kind,
            "name": body.name,
            "operation": body.operation,
        }
    )
