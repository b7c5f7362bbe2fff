"""Client-protocol handlers of a share group's settings: alterQueueConfig, describeQueueConfig.

Settings are cluster metadata, so any node answers: an alter is checked here (a bad name or
value is refused with ``InvalidConfigError`` before anything reaches the metadata log), then
proposed as one ``alter_queue_config`` command (forwarded to the metadata leader) and answered
once this node has applied it; a describe reads this node's copy of the metadata once it has
caught up (knows a leader and has applied what it knows committed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from laminar.errors import InvalidConfigError
from laminar.queues.config import NAMES, altered, parse, validate_group
from laminar.queues.service import QueueService

Handler = Callable[[Any, Any, memoryview], Awaitable[None]]
CAUGHT_UP_WAIT = 5.0
Propose = Callable[[dict[str, Any]], Awaitable[Any]]


def handlers(
    service: QueueService, propose: Propose, caught_up: Callable[[float], Awaitable[None]]
) -> dict[str, Handler]:
    async def alter_queue_config(body: Any, response: Any, _payload: memoryview) -> None:
        group = validate_group(body.group)
        entries = [(entry.name, entry.value) for entry in body.entries]
        changes = {name: parse(name, value) for name, value in entries}
        if len(changes) != len(entries):
            raise InvalidConfigError("a setting is named twice")
        reset = list(body.reset)
        altered(service.stored(group), changes, reset)  # refuses what the command would
        await propose({"op": "alter_queue_config", "group": group, "set": changes, "reset": reset})
        _fill(response, service, group)

    async def describe_queue_config(group: str, response: Any, _payload: memoryview) -> None:
        validate_group(group)
        await caught_up(CAUGHT_UP_WAIT)  # not the defaults of a node still replaying
        _fill(response, service, group)

    return {"alterQueueConfig": alter_queue_config, "describeQueueConfig": describe_queue_config}


def _fill(response: Any, service: QueueService, group: str) -> None:
    settings = service.settings(group)
    out = response.body.init("queueConfig")
    out.group = group
    values = settings.values()
    for slot, name in zip(out.init("entries", len(NAMES)), NAMES, strict=True):
        slot.name, slot.value = name, str(values[name])
        slot.isDefault = name not in settings.overridden
