"""Seeded simulation of the users/ACL state machine (laminar/auth/state.py) inside the metadata
state machine: random create/alter/delete user and add/remove ACL commands (some retried with
the same request id, as a proposer does after a leader change) are applied in log order to two
replicas; after every command the invariants are checked and the authorizer's answers are
compared with a reference written independently here.

    PYTHONPATH=$PWD python -m tests.auth_sim SEED   # replay one seed
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from functools import cache
from typing import Any

from laminar.auth.acl import Authorizer
from laminar.auth.scram import ScramCredential, make_credential
from laminar.auth.state import ADMIN, ANY, CONSUME, PREFIX, PRODUCE, TOPIC, AuthState
from laminar.errors import LaminarError
from laminar.node.metadata import MetadataState

REPLAY = "PYTHONPATH=$PWD python -m tests.auth_sim {seed}"
NAMES = ["alice", "bob", "carol", "dave"]
TOPICS = ["orders", "orders.eu", "logs.app", "logs", "x"]
STEPS = 120


class SimFailure(AssertionError):
    pass


@cache
def credential(index: int) -> ScramCredential:
    """A few credentials made once per process (PBKDF2 is slow on purpose)."""
    return make_credential(f"password-{index}", salt=bytes([index]) * 16)


def reference_allowed(state: AuthState, user: str | None, operation: str, topic: str) -> bool:
    if not state.users:
        return True
    if user is None or user not in state.users:
        return False
    if state.users[user].superuser:
        return True
    for rule in state.acls:
        if rule.operation != operation or rule.principal not in (user, "*"):
            continue
        if (
            rule.kind == ANY
            or (rule.kind == TOPIC and rule.name == topic)
            or (rule.kind == PREFIX and topic[: len(rule.name)] == rule.name)
        ):
            return True
    return False


def snapshot(state: AuthState) -> tuple[Any, ...]:
    users = sorted((u.name, u.superuser, u.credential) for u in state.users.values())
    return (users, list(state.acls), state.internal_secret)


class AuthSim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.replicas = [MetadataState(), MetadataState()]
        self.stats: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.ever_had_users = False

    def fail(self, what: str) -> None:
        raise SimFailure(f"seed {self.seed}: {what}\nreplay: {REPLAY.format(seed=self.seed)}")

    def command(self) -> dict[str, Any]:
        rng = self.rng
        if self.log and rng.random() < 0.1:
            self.stats["retried"] += 1
            return dict(rng.choice(self.log))  # the same request id again
        op = rng.choice(
            ["create_user"] * 4 + ["alter_user", "delete_user", "delete_user"] + ["add_acl"] * 3
            + ["remove_acl"]
        )  # fmt: skip
        command: dict[str, Any] = {"op": op, "request_id": f"r{len(self.log)}"}
        if op in ("create_user", "alter_user", "delete_user"):
            command["name"] = rng.choice([*NAMES, "__laminar_node", "bad,name"])
        if op in ("create_user", "alter_user"):
            command["credential"] = credential(rng.randrange(4)).to_json()
        if op == "create_user":
            command["superuser"] = rng.random() < 0.4
        if op in ("add_acl", "remove_acl"):
            kind = rng.choice([TOPIC, PREFIX, ANY])
            command["rule"] = {
                "principal": rng.choice([*NAMES, "*"]),
                "kind": kind,
                "name": "" if kind == ANY else rng.choice(TOPICS),
                "operation": rng.choice([PRODUCE, CONSUME, ADMIN]),
            }
        leader = self.replicas[0].auth
        if op == "create_user" and not leader.internal_secret:  # the metadata leader's prepare
            command["internal_secret"] = f"{self.rng.getrandbits(256):064x}"
        return command

    def step(self) -> None:
        command = self.command()
        self.log.append(command)
        before = snapshot(self.replicas[0].auth)
        outcomes = []
        for replica in self.replicas:
            try:
                replica.apply_once(command)
                outcomes.append("ok")
            except LaminarError as exc:
                outcomes.append(type(exc).__name__)
        if outcomes[0] != outcomes[1]:
            self.fail(f"replicas disagree on {command}: {outcomes}")
        self.stats[f"{command['op']}_{outcomes[0]}"] += 1
        after = [snapshot(r.auth) for r in self.replicas]
        if after[0] != after[1]:
            self.fail(f"replicas diverged after {command}")
        if outcomes[0] != "ok" and after[0] != before:
            self.fail(f"refused {command} changed the state")
        self.check_invariants()

    def check_invariants(self) -> None:
        state = self.replicas[0].auth
        if state.users:
            self.ever_had_users = True
            if not any(u.superuser for u in state.users.values()):
                self.fail("users but no superuser: the operator is locked out")
        if self.ever_had_users and not state.internal_secret:
            self.fail("the internal secret is gone")
        if bool(state.users) != state.required:
            self.fail("required disagrees with the user table")
        for rule in state.acls:
            if rule.principal != "*" and rule.principal not in state.users:
                self.fail(f"rule of a user that does not exist: {rule}")
        if state.acls != sorted(set(state.acls)):
            self.fail("rules not unique and sorted")
        authorizer = Authorizer(lambda: state)
        for _ in range(20):
            user = self.rng.choice([*NAMES, None])
            operation = self.rng.choice([PRODUCE, CONSUME, ADMIN])
            topic = self.rng.choice(TOPICS)
            want = reference_allowed(state, user, operation, topic)
            if authorizer.allowed(user, operation, topic) != want:
                self.fail(f"authorizer says {not want} for {user} {operation} {topic}")
            self.stats["decisions_allowed" if want else "decisions_refused"] += 1

    def run(self) -> None:
        for _ in range(STEPS):
            self.step()
        self.stats["users_at_end"] += len(self.replicas[0].auth.users)
        self.stats["rules_at_end"] += len(self.replicas[0].auth.acls)


if __name__ == "__main__":
    sim = AuthSim(int(sys.argv[1]))
    sim.run()
    print(dict(sim.stats))
