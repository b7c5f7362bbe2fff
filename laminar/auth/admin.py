"""User and ACL management as metadata commands, shared by every client protocol.

Checks what it can before proposing (a bad request stores nothing and gets a typed error at
once); the metadata state machine (``laminar/auth/state.py``) checks again what depends on
the order of commands (the first user, the last superuser).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from laminar.auth.scram import ScramCredential
from laminar.auth.state import WILDCARD, AclRule, AuthState, validate_user_name
from laminar.errors import AuthenticationError, InvalidRequestError

Propose = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class AuthAdmin:
    propose: Propose
    state: Callable[[], AuthState]

    async def create_user(self, name: str, credential: ScramCredential, superuser: bool) -> None:
        validate_user_name(name)
        _check(credential)
        auth = self.state()
        if name in auth.users:
            raise InvalidRequestError(f"user {name!r} already exists")
        if not auth.users and not superuser:
            raise InvalidRequestError(
                "the first user must be a superuser (--superuser): once a user exists every "
                "client must authenticate, and only a superuser can manage users and ACLs"
            )
        await self.propose(
            {
                "op": "create_user",
                "name": name,
                "credential": credential.to_json(),
                "superuser": superuser,
            }
        )

    async def alter_user(self, name: str, credential: ScramCredential) -> None:
        """A new password (as its credential); the user's other settings stay."""
        self._existing(name)
        _check(credential)
        await self.propose({"op": "alter_user", "name": name, "credential": credential.to_json()})

    async def delete_user(self, name: str) -> None:
        self._existing(name)
        await self.propose({"op": "delete_user", "name": name})

    async def add_acl(self, rule: AclRule) -> None:
        """A rule for a user (who must exist; a deleted user's rules go with it) or ``*``."""
        if rule.principal != WILDCARD and rule.principal not in self.state().users:
            raise InvalidRequestError(f"unknown user {rule.principal!r}: create the user first")
        await self.propose({"op": "add_acl", "rule": rule.to_json()})

    async def remove_acl(self, rule: AclRule) -> None:
        if rule not in self.state().acls:
            raise InvalidRequestError("no such ACL rule")
        await self.propose({"op": "remove_acl", "rule": rule.to_json()})

    def _existing(self, name: str) -> None:
        validate_user_name(name)
        if name not in self.state().users:
            raise InvalidRequestError(f"unknown user {name!r}")


def _check(credential: ScramCredential) -> None:
    try:
        credential.check()
    except AuthenticationError as exc:
        raise InvalidRequestError(str(exc)) from None
