"""Kafka ACL bindings <-> laminar's allow-rules (``laminar/auth/state.py``), for CreateAcls,
DescribeAcls and DeleteAcls.

laminar's rules are a subset of Kafka's ACLs, mapped one to one so a binding reads back as it
was written: resource TOPIC with pattern LITERAL (a topic, or ``*`` for every topic) or PREFIXED;
principal ``User:<name>`` or ``User:*``; host ``*``; permission ALLOW; operation WRITE
(produce), READ (consume) or ALTER (admin: create, delete, grow and alter topics). Anything else
(DENY, groups, the cluster, other operations) is refused with a message saying so.
"""

from __future__ import annotations

from typing import Any

from laminar.auth.state import ADMIN, ANY, CONSUME, PREFIX, PRODUCE, TOPIC, WILDCARD, AclRule
from laminar.errors import InvalidRequestError

RESOURCE_ANY, RESOURCE_TOPIC = 1, 2
PATTERN_ANY, PATTERN_MATCH, PATTERN_LITERAL, PATTERN_PREFIXED = 1, 2, 3, 4
OPERATION_ANY = 1
PERMISSION_ANY, PERMISSION_ALLOW = 1, 3
OPERATIONS = {PRODUCE: 4, CONSUME: 3, ADMIN: 7}
"""laminar operation -> Kafka AclOperation (WRITE, READ, ALTER)."""
_BY_KAFKA = {code: name for name, code in OPERATIONS.items()}
PRINCIPAL_PREFIX = "User:"


def binding_of(rule: AclRule) -> dict[str, Any]:
    """A rule as Kafka binding fields (resource_type, resource_name, pattern_type, principal,
    host, operation, permission_type)."""
    if rule.kind == ANY:
        name, pattern = WILDCARD, PATTERN_LITERAL
    else:
        name = rule.name
        pattern = PATTERN_PREFIXED if rule.kind == PREFIX else PATTERN_LITERAL
    return {
        "resource_type": RESOURCE_TOPIC,
        "resource_name": name,
        "pattern_type": pattern,
        "principal": PRINCIPAL_PREFIX + rule.principal,
        "host": "*",
        "operation": OPERATIONS[rule.operation],
        "permission_type": PERMISSION_ALLOW,
    }


def rule_of(creation: dict[str, Any]) -> AclRule:
    """The rule a CreateAcls entry asks for; InvalidRequestError for what laminar cannot do."""
    if creation["resource_type"] != RESOURCE_TOPIC:
        raise InvalidRequestError("laminar ACLs are on topics only (resource type TOPIC)")
    if creation["permission_type"] != PERMISSION_ALLOW:
        raise InvalidRequestError("laminar ACLs only allow (permission type ALLOW)")
    if creation["host"] != "*":
        raise InvalidRequestError("laminar ACLs apply to every host (host '*')")
    operation = _BY_KAFKA.get(creation["operation"])
    if operation is None:
        raise InvalidRequestError(
            "laminar ACL operations are WRITE (produce), READ (consume) and ALTER (admin)"
        )
    principal = creation["principal"] or ""
    if not principal.startswith(PRINCIPAL_PREFIX):
        raise InvalidRequestError("principals are User:<name> or User:*")
    name, pattern = creation["resource_name"] or "", creation["resource_pattern_type"]
    if pattern == PATTERN_PREFIXED:
        kind = PREFIX
    elif pattern == PATTERN_LITERAL:
        kind, name = (ANY, "") if name == WILDCARD else (TOPIC, name)
    else:
        raise InvalidRequestError("pattern type must be LITERAL or PREFIXED")
    return AclRule.from_json(
        {
            "principal": principal[len(PRINCIPAL_PREFIX) :],
            "kind": kind,
            "name": name,
            "operation": operation,
        }
    )


def matches(filter_: dict[str, Any], binding: dict[str, Any]) -> bool:
    """Kafka's AclBindingFilter semantics (ANY matches all; MATCH also matches ``*`` and the
    prefixes a name falls under)."""
    if filter_["resource_type_filter"] not in (RESOURCE_ANY, binding["resource_type"]):
        return False
    name, pattern = filter_["resource_name_filter"], filter_["pattern_type_filter"]
    if pattern == PATTERN_MATCH:
        if name is not None and not (
            (binding["resource_name"] == WILDCARD and binding["pattern_type"] == PATTERN_LITERAL)
            or (binding["resource_name"] == name and binding["pattern_type"] == PATTERN_LITERAL)
            or (
                binding["pattern_type"] == PATTERN_PREFIXED
                and name.startswith(binding["resource_name"])
            )
        ):
            return False
    else:
        if pattern not in (PATTERN_ANY, binding["pattern_type"]):
            return False
        if name is not None and name != binding["resource_name"]:
            return False
    for key, field in (("principal_filter", "principal"), ("host_filter", "host")):
        if filter_[key] is not None and filter_[key] != binding[field]:
            return False
    if filter_["operation"] not in (OPERATION_ANY, binding["operation"]):
        return False
    return filter_["permission_type"] in (PERMISSION_ANY, binding["permission_type"])
