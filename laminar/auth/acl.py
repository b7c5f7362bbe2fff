"""Who may do what: the authorizer both client protocols ask before they act.

A connection's principal is the user it authenticated as (None: not authenticated). While the
cluster has no user everything is allowed (the open-until-first-user rule). Superusers (and the
nodes' internal user) may do anything; anyone else needs an ACL rule allowing the operation on
the topic. Decisions read the live metadata state, so a deleted user or a removed rule takes
effect on the next request, also on connections already open.
"""

from __future__ import annotations

from collections.abc import Callable

from laminar.auth.state import ADMIN, CONSUME, OPERATIONS, PRODUCE, AuthState
from laminar.errors import AuthenticationError, AuthorizationError

__all__ = ["ADMIN", "CONSUME", "PRODUCE", "Authorizer"]


class Authorizer:
    def __init__(self, state: Callable[[], AuthState]) -> None:
        self._state = state

    @property
    def state(self) -> AuthState:
        return self._state()

    @property
    def required(self) -> bool:
        return self._state().required

    def check_authenticated(self, principal: str | None) -> None:
        """AuthenticationError unless the cluster is open or ``principal`` is a current user."""
        state = self._state()
        if not state.required:
            return
        if principal is None:
            raise AuthenticationError(
                "authentication required: this cluster has users; connect with a user name "
                "and password (username=/password=, --user/--password)"
            )
        if not state.exists(principal):
            raise AuthenticationError(f"user {principal!r} no longer exists")

    def allowed(self, principal: str | None, operation: str, topic: str) -> bool:
        state = self._state()
        if not state.required:
            return True
        if principal is None or not state.exists(principal):
            return False
        if state.is_superuser(principal):
            return True
        return any(rule.matches(principal, operation, topic) for rule in state.acls)

    def check(self, principal: str | None, operation: str, topic: str) -> None:
        """AuthenticationError / AuthorizationError unless ``principal`` may ``operation`` on
        ``topic``."""
        self.check_authenticated(principal)
        if not self.allowed(principal, operation, topic):
            raise AuthorizationError(f"user {principal!r} may not {operation} on topic {topic!r}")

    def check_describe(self, principal: str | None, topic: str) -> None:
        """Any operation on a topic lets a user see it (offsets, queue state)."""
        self.check_authenticated(principal)
        if not any(self.allowed(principal, op, topic) for op in OPERATIONS):
            raise AuthorizationError(f"user {principal!r} has no access to topic {topic!r}")

    def allowed_superuser(self, principal: str | None) -> bool:
        state = self._state()
        return not state.required or state.is_superuser(principal or "")

    def check_superuser(self, principal: str | None, what: str) -> None:
        self.check_authenticated(principal)
        state = self._state()
        if state.required and not state.is_superuser(principal or ""):
            raise AuthorizationError(f"only a superuser may {what}")
