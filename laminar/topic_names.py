"""What a topic may be called: one rule for topic creation and for settings that name a topic
(a share group's dead-letter topic), kept apart from the node so both can import it."""

from __future__ import annotations

from laminar.errors import InvalidRequestError

INTERNAL_PREFIX = "__"
"""Topic names starting with this are the cluster's own: clients may read them, not write,
create or delete them."""


def is_internal(topic: str) -> bool:
    return topic.startswith(INTERNAL_PREFIX)


def validate_topic_name(name: str) -> None:
    if not name or len(name) > 200:
        raise InvalidRequestError("a topic name has 1 to 200 characters")
    if not all(c.isalnum() or c in "._-" for c in name):
        raise InvalidRequestError(
            f"topic name {name!r} may contain only letters, digits, '.', '_' and '-'"
        )
