"""A share group's own settings: its lock, its delivery limit and its dead-letter topic.

They are stored cluster-wide in the metadata state machine (``MetadataState.queue_configs``,
command ``alter_queue_config``), like a topic's settings and like Kafka's group configs
(``share.record.lock.duration.ms``, ``share.delivery.count.limit``): every node holds them, so
every partition leader of the group applies the same values without asking anyone, and they
survive restarts and leader changes with the metadata log. A group stores only what was set for
it; everything else is the node default (``ShareConfig``: 30 s, 5 deliveries, ``<group>.dlq``).

This module is pure: validation (``InvalidConfigError``, before anything is stored), the
incremental change a command applies (set some names, reset others to their default) and the
resolution of stored values against the defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from laminar.errors import InvalidConfigError, InvalidRequestError
from laminar.queues.partition import ShareConfig
from laminar.topic_names import is_internal, validate_topic_name

LOCK_MS = "lock_ms"
MAX_DELIVERIES = "max_deliveries"
DEAD_LETTER_TOPIC = "dead_letter_topic"
NAMES = (LOCK_MS, MAX_DELIVERIES, DEAD_LETTER_TOPIC)
MAX_DELIVERIES_LIMIT = 1000
MAX_LOCK_MS = ShareConfig().max_lock_ms
MAX_GROUP_CHARS = 255
DLQ_SUFFIX = ".dlq"

Value = int | str


def default_dead_letter_topic(group: str) -> str:
    return f"{group}{DLQ_SUFFIX}"


def validate_group(group: object) -> str:
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
        raise InvalidConfigError(f"a share group name has 1 to {MAX_GROUP_CHARS} characters")
    return group


def parse(name: str, value: object) -> Value:
    """One setting's value, checked and normalized (decimal text is accepted for numbers, as
    it arrives from the wire); ``InvalidConfigError`` names what is wrong."""
    if name in (LOCK_MS, MAX_DELIVERIES):
        number = _integer(name, value)
        low, high = (1, MAX_LOCK_MS) if name == LOCK_MS else (1, MAX_DELIVERIES_LIMIT)
        if not low <= number <= high:
            raise InvalidConfigError(f"{name} must be between {low} and {high}, not {number}")
        return number
    if name == DEAD_LETTER_TOPIC:
        if not isinstance(value, str):
            raise InvalidConfigError(f"{name} is a topic name, not {value!r}")
        try:
            validate_topic_name(value)
        except InvalidRequestError as exc:
            raise InvalidConfigError(f"{name}: {exc}") from None
        if is_internal(value):
            raise InvalidConfigError(f"{name}: {value} is the cluster's own topic")
        return value
    raise InvalidConfigError(f"unknown share group setting {name!r} (known: {', '.join(NAMES)})")


def altered(
    current: Mapping[str, Value], changes: Mapping[str, object], reset: Iterable[str]
) -> dict[str, Value]:
    """``current`` with ``changes`` set and ``reset`` back to their defaults. Every name and
    value is checked first: one bad entry changes nothing."""
    reset = list(reset)
    for name in reset:
        if name not in NAMES:
            raise InvalidConfigError(f"unknown share group setting {name!r}")
    both = set(reset) & set(changes)
    if both:
        raise InvalidConfigError(f"{', '.join(sorted(both))}: both set and reset")
    parsed = {name: parse(name, value) for name, value in changes.items()}
    out = {name: value for name, value in current.items() if name not in reset}
    out.update(parsed)
    return out


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What a group runs with: its stored values over the defaults; ``overridden`` names the
    stored ones."""

    lock_ms: int
    max_deliveries: int
    dead_letter_topic: str
    overridden: frozenset[str]

    def share_config(self, base: ShareConfig) -> ShareConfig:
        """``base`` (the node's limits) with this group's lock and delivery limit."""
        if (base.lock_ms, base.max_deliveries) == (self.lock_ms, self.max_deliveries):
            return base
        return replace(base, lock_ms=self.lock_ms, max_deliveries=self.max_deliveries)

    def values(self) -> dict[str, Value]:
        return {
            LOCK_MS: self.lock_ms,
            MAX_DELIVERIES: self.max_deliveries,
            DEAD_LETTER_TOPIC: self.dead_letter_topic,
        }


def resolve(group: str, stored: Mapping[str, Value], defaults: ShareConfig) -> QueueSettings:
    return QueueSettings(
        lock_ms=int(stored.get(LOCK_MS, defaults.lock_ms)),
        max_deliveries=int(stored.get(MAX_DELIVERIES, defaults.max_deliveries)),
        dead_letter_topic=str(stored.get(DEAD_LETTER_TOPIC, default_dead_letter_topic(group))),
        overridden=frozenset(stored),
    )


def _integer(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        return int(value)
    raise InvalidConfigError(f"{name} must be a whole number, not {value!r}")
