"""Users and ACLs as part of the metadata state machine (deterministic: every node applies the
same commands to the same result).

A user is a name, a SCRAM-SHA-256 credential (never the password) and a superuser flag. An
ACL rule allows one principal (a user or ``*``) one operation (produce, consume, admin) on a
topic, a topic-name prefix, or every topic. The cluster is open while it has no user; the
first user must be a superuser and the last superuser cannot be removed while other users
remain, so an operator cannot lock themselves out.

``internal_secret`` is created by the metadata leader with the first user: nodes
authenticate to each other's client ports (a queue leader copying dead letters) as
``INTERNAL_USER`` with it. It travels only in the metadata log (peer port, mutual TLS when
configured) and is never sent to clients.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from laminar.auth.scram import ScramCredential, make_credential
from laminar.errors import AuthenticationError, InvalidRequestError, LaminarError

USER_OPS = ("create_user", "alter_user", "delete_user")
ACL_OPS = ("add_acl", "remove_acl")
AUTH_OPS = USER_OPS + ACL_OPS

PRODUCE, CONSUME, ADMIN = "produce", "consume", "admin"
OPERATIONS = (PRODUCE, CONSUME, ADMIN)
TOPIC, PREFIX, ANY = "topic", "prefix", "any"
RESOURCE_KINDS = (TOPIC, PREFIX, ANY)
WILDCARD = "*"

INTERNAL_USER = "__laminar_node"
"""The principal nodes use on each other's client ports (a superuser, never listed)."""
_USER_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")


def validate_user_name(name: Any) -> str:
    if not isinstance(name, str) or not _USER_NAME.match(name) or name.startswith("__"):
        raise InvalidRequestError(
            f"invalid user name {name!r}: 1-128 of A-Z a-z 0-9 . _ @ -, not starting with '__'"
        )
    return name


@dataclass(frozen=True, slots=True)
class User:
    name: str
    credential: ScramCredential
    superuser: bool


@dataclass(frozen=True, slots=True, order=True)
class AclRule:
    """Allow ``principal`` (a user name or ``*``) to ``operation`` on the resource: one topic
    (``kind`` topic), topics whose names start with ``name`` (prefix), or all (any)."""

    principal: str
    kind: str
    name: str
    operation: str

    def matches(self, user: str, operation: str, topic: str) -> bool:
        if self.operation != operation or self.principal not in (user, WILDCARD):
            return False
        if self.kind == ANY:
            return True
        if self.kind == PREFIX:
            return topic.startswith(self.name)
        return topic == self.name

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "kind": self.kind,
            "name": self.name,
            "operation": self.operation,
        }

    @classmethod
    def from_json(cls, value: Any) -> AclRule:
        """A validated rule; InvalidRequestError names what is wrong."""
        if not isinstance(value, dict):
            raise InvalidRequestError("an ACL rule is an object")
        principal, kind = value.get("principal"), value.get("kind")
        name, operation = value.get("name", ""), value.get("operation")
        if principal != WILDCARD:
            validate_user_name(principal)
        if kind not in RESOURCE_KINDS:
            raise InvalidRequestError(f"ACL resource kind must be one of {RESOURCE_KINDS}")
        if operation not in OPERATIONS:
            raise InvalidRequestError(f"ACL operation must be one of {', '.join(OPERATIONS)}")
        if not isinstance(name, str) or (kind == ANY) != (name == ""):
            raise InvalidRequestError("an ACL names a topic or prefix, or (any) none")
        return cls(principal, kind, name, operation)


@dataclass(slots=True)
class AuthState:
    users: dict[str, User] = field(default_factory=dict)
    acls: list[AclRule] = field(default_factory=list)
    internal_secret: str = field(default="", repr=False)
    _internal: ScramCredential | None = field(default=None, repr=False, compare=False)

    @property
    def required(self) -> bool:
        """Clients must authenticate: the cluster has at least one user."""
        return bool(self.users)

    def credential(self, name: str) -> ScramCredential | None:
        """A user's stored credential (the SCRAM server's lookup)."""
        if name == INTERNAL_USER:
            return self.internal_credential()
        user = self.users.get(name)
        return None if user is None else user.credential

    def internal_credential(self) -> ScramCredential | None:
        if not self.internal_secret:
            return None
        if self._internal is None:  # derived once: PBKDF2 is slow on purpose
            salt = hashlib.sha256(b"laminar internal user " + self.internal_secret.encode())
            self._internal = make_credential(self.internal_secret, salt=salt.digest()[:16])
        return self._internal

    def internal_login(self) -> tuple[str, str] | None:
        """(user, password) a node connects to other nodes' client ports with, None while
        the cluster is open."""
        return (INTERNAL_USER, self.internal_secret) if self.internal_secret else None

    def is_superuser(self, name: str) -> bool:
        if name == INTERNAL_USER:
            return bool(self.internal_secret)
        user = self.users.get(name)
        return user is not None and user.superuser

    def exists(self, name: str) -> bool:
        return name in self.users or (name == INTERNAL_USER and bool(self.internal_secret))

    # checkpoints (laminar/node/metadata_checkpoint.py) ----------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The state as canonical JSON: users in table order (every node inserts in log order),
        rules sorted, the internal secret."""
        return {
            "users": [[u.name, u.credential.to_json(), u.superuser] for u in self.users.values()],
            "acls": [[r.principal, r.kind, r.name, r.operation] for r in self.acls],
            "secret": self.internal_secret,
        }

    @classmethod
    def from_json(cls, value: Any) -> AuthState:
        """A state restated by ``to_json`` (None: a checkpoint from before users existed);
        ValueError if malformed."""
        if value is None:
            return cls()
        try:
            users = {
                str(name): User(str(name), ScramCredential.from_json(credential), bool(superuser))
                for name, credential, superuser in value["users"]
            }
            acls = [
                AclRule.from_json(
                    {"principal": p, "kind": kind, "name": name, "operation": operation}
                )
                for p, kind, name, operation in value["acls"]
            ]
        except LaminarError as exc:
            raise ValueError(str(exc)) from None
        return cls(users, acls, str(value["secret"]))

    # commands ---------------------------------------------------------------------------------
    def apply(self, command: dict[str, Any]) -> Any:
        op = command["op"]
        if op == "create_user":
            return self._create_user(command)
        if op == "alter_user":
            name = validate_user_name(command.get("name"))
            user = self.users.get(name)
            if user is None:
                raise InvalidRequestError(f"unknown user {name!r}")
            credential = _credential(command)
            superuser = command.get("superuser")
            if superuser is None:
                superuser = user.superuser
            elif not superuser and user.superuser:
                self._refuse_losing_last_superuser(name)
            self.users[name] = User(name, credential, bool(superuser))
            return name
        if op == "delete_user":
            name = validate_user_name(command.get("name"))
            if name not in self.users:
                raise InvalidRequestError(f"unknown user {name!r}")
            if self.users[name].superuser:
                self._refuse_losing_last_superuser(name)
            del self.users[name]
            self.acls = [rule for rule in self.acls if rule.principal != name]
            return name
        rule = AclRule.from_json(command.get("rule"))
        if op == "add_acl":
            if rule.principal != WILDCARD and rule.principal not in self.users:
                raise InvalidRequestError(f"unknown user {rule.principal!r}: create the user first")
            if rule not in self.acls:
                self.acls.append(rule)
                self.acls.sort()
            return rule.to_json()
        if rule not in self.acls:
            raise InvalidRequestError(f"no such ACL: {describe_rule(rule)}")
        self.acls.remove(rule)
        return rule.to_json()

    def _create_user(self, command: dict[str, Any]) -> str:
        name = validate_user_name(command.get("name"))
        if name in self.users:
            raise InvalidRequestError(f"user {name!r} already exists")
        superuser = bool(command.get("superuser", False))
        if not self.users and not superuser:
            raise InvalidRequestError(
                "the first user must be a superuser (--superuser): once a user exists every "
                "client must authenticate, and only a superuser can manage users and ACLs"
            )
        credential = _credential(command)
        if not self.internal_secret:
            secret = command.get("internal_secret")
            if not isinstance(secret, str) or len(secret) < 32:
                raise InvalidRequestError("the first user needs the cluster's internal secret")
            self.internal_secret = secret
            self._internal = None
        self.users[name] = User(name, credential, superuser)
        return name

    def _refuse_losing_last_superuser(self, name: str) -> None:
        others = [u for u in self.users.values() if u.name != name]
        if others and not any(u.superuser for u in others):
            raise InvalidRequestError(
                f"{name!r} is the last superuser: make another user a superuser first "
                "(or delete the other users, which opens the cluster again)"
            )

    def prepare(self, command: dict[str, Any]) -> dict[str, Any]:
        """On the metadata leader: a create_user gets the internal secret if the cluster has
        none yet (random, so it must be chosen once, before the command enters the log)."""
        if command.get("op") == "create_user" and not self.internal_secret:
            return {**command, "internal_secret": secrets.token_hex(32)}
        return command


def _credential(command: dict[str, Any]) -> ScramCredential:
    try:
        return ScramCredential.from_json(command.get("credential"))
    except AuthenticationError as exc:
        raise InvalidRequestError(str(exc)) from None


def describe_rule(rule: AclRule) -> str:
    """``alice may consume on prefix logs.*``."""
    resource = {"topic": f"topic {rule.name}", "prefix": f"prefix {rule.name}*"}.get(
        rule.kind, "every topic"
    )
    return f"{rule.principal} may {rule.operation} on {resource}"
