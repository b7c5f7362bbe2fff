"""``Admin``'s user and ACL management (a superuser's job once the cluster has users).

Passwords never leave the client: ``create_user`` and ``change_password`` send the
SCRAM-SHA-256 credential derived here (fresh salt, 4096 iterations), as Kafka's
AlterUserScramCredentials does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from laminar.auth.scram import DEFAULT_ITERATIONS, ScramCredential, make_credential


@dataclass(frozen=True, slots=True)
class UserDescription:
    name: str
    superuser: bool
    iterations: int


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    """Allow ``principal`` (a user or ``*``) to ``operation`` (produce, consume, admin) on
    ``topic`` (exactly), or on topics starting with ``prefix``, or (neither) on every topic."""

    principal: str
    operation: str
    topic: str | None = None
    prefix: str | None = None

    @property
    def kind(self) -> str:
        return "topic" if self.topic is not None else "prefix" if self.prefix is not None else "any"

    def fill(self, rule: Any) -> None:
        if self.topic is not None and self.prefix is not None:
            raise ValueError("an ACL names a topic or a prefix, not both")
        rule.principal = self.principal
        rule.kind = self.kind
        rule.name = self.topic or self.prefix or ""
        rule.operation = self.operation


class UserAdmin:
    """Mixed into ``Admin``: its ``_call`` sends one request to any node."""

    _call: Callable[[Callable[[Any], None]], Awaitable[Any]]

    async def create_user(
        self,
        name: str,
        password: str,
        *,
        superuser: bool = False,
        iterations: int = DEFAULT_ITERATIONS,
    ) -> None:
        """Add a user. The first user must be a superuser (InvalidRequestError otherwise):
        from then on every client must authenticate."""
        credential = make_credential(password, iterations=iterations)

        def fill(body: Any) -> None:
            _fill_credential(body.init("createUser"), name, credential)
            body.createUser.superuser = superuser

        await self._call(fill)

    async def change_password(
        self, name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS
    ) -> None:
        """Give ``name`` a new password; connections already open stay authenticated."""
        credential = make_credential(password, iterations=iterations)
        await self._call(lambda body: _fill_credential(body.init("alterUser"), name, credential))

    async def delete_user(self, name: str) -> None:
        """Remove a user and its ACLs; its open connections are refused from the next request."""

        def fill(body: Any) -> None:
            body.deleteUser = name

        await self._call(fill)

    async def list_users(self) -> list[UserDescription]:
        reply = await self._call(lambda body: setattr(body, "listUsers", None))
        return [
            UserDescription(user.name, user.superuser, user.iterations)
            for user in reply.body.users.users
        ]

    async def add_acl(self, acl: Acl) -> None:
        await self._call(lambda body: acl.fill(body.init("addAcl")))

    async def remove_acl(self, acl: Acl) -> None:
        """InvalidRequestError if no such rule exists."""
        await self._call(lambda body: acl.fill(body.init("removeAcl")))

    async def list_acls(self) -> list[Acl]:
        reply = await self._call(lambda body: setattr(body, "listAcls", None))
        out = []
        for rule in reply.body.acls.rules:
            topic = rule.name if rule.kind == "topic" else None
            prefix = rule.name if rule.kind == "prefix" else None
            out.append(Acl(rule.principal, rule.operation, topic, prefix))
        return out


def _fill_credential(slot: Any, name: str, credential: ScramCredential) -> None:
    slot.name = name
    slot.salt = credential.salt
    slot.iterations = credential.iterations
    slot.storedKey = credential.stored_key
    slot.serverKey = credential.server_key
