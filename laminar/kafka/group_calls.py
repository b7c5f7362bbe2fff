"""What the Kafka group APIs share: group error codes and calls into the group coordinator.

The coordinator of a group is the leader of its ``__consumer_offsets`` shard, as for the native
protocol; a request that reaches another node is answered NOT_COORDINATOR and the client asks
FindCoordinator again. Held requests (JoinGroup, SyncGroup) simply await the coordinator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from laminar.durable import Reply
from laminar.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidOffsetError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    LaminarError,
    MemberIdRequiredError,
    NotCoordinatorError,
    NotLeaderError,
    PartitionNotOwnedError,
    RebalanceInProgressError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.groups.coordinator import Coordinator
from laminar.kafka import errors
from laminar.kafka.api import RequestContext

T = TypeVar("T")

OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
INVALID_COMMIT_OFFSET_SIZE = 28
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110
STALE_MEMBER_EPOCH = 113

_BY_CLASS: list[tuple[type[LaminarError], int]] = [
    (NotLeaderError, NOT_COORDINATOR),
    (NotCoordinatorError, NOT_COORDINATOR),
    (MemberIdRequiredError, MEMBER_ID_REQUIRED),
    (IllegalGenerationError, ILLEGAL_GENERATION),
    (RebalanceInProgressError, REBALANCE_IN_PROGRESS),
    (FencedInstanceIdError, FENCED_INSTANCE_ID),
    (InconsistentGroupProtocolError, INCONSISTENT_GROUP_PROTOCOL),
    (GroupIdNotFoundError, GROUP_ID_NOT_FOUND),
    (InvalidSessionTimeoutError, INVALID_SESSION_TIMEOUT),
    (UnknownMemberIdError, UNKNOWN_MEMBER_ID),
    (FencedMemberEpochError, FENCED_MEMBER_EPOCH),
    (StaleMemberEpochError, STALE_MEMBER_EPOCH),
    (PartitionNotOwnedError, STALE_MEMBER_EPOCH),
    (GroupNotEmptyError, NON_EMPTY_GROUP),
    (InvalidOffsetError, INVALID_COMMIT_OFFSET_SIZE),
    (UnknownTopicError, errors.UNKNOWN_TOPIC_OR_PARTITION),
    (UnknownPartitionError, errors.UNKNOWN_TOPIC_OR_PARTITION),
    (InvalidRequestError, errors.INVALID_REQUEST),
]


def group_error(exc: BaseException) -> int:
    """The Kafka error code of a failed group call."""
    if isinstance(exc, TimeoutError):
        return COORDINATOR_LOAD_IN_PROGRESS
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code
    return errors.code_of(exc)


async def call(
    ctx: RequestContext, group: str, request: Callable[[Coordinator, int], Reply[T]]
) -> T:
    """Run ``request`` on ``group``'s coordinator if this node is it; raises LaminarError or
    TimeoutError (``group_error`` names the code)."""
    return await ctx.broker.groups.call(group, request)


async def try_call(
    ctx: RequestContext, group: str, request: Callable[[Coordinator, int], Reply[T]]
) -> tuple[T | None, int]:
    """``call`` as (value, error code)."""
    try:
        return await call(ctx, group, request), errors.NONE
    except (LaminarError, TimeoutError) as exc:
        return None, group_error(exc)


FIND_WAIT_SECONDS = 5.0
"""How long FindCoordinator waits for a shard leader (the internal topic being created, an
election under way) before answering COORDINATOR_NOT_AVAILABLE: some clients (kafka-python's
admin) give up on the first such answer."""


async def coordinator_address(ctx: RequestContext, group: str) -> tuple[Any, int]:
    """(BrokerAddress of ``group``'s coordinator, error code)."""
    broker = ctx.broker
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FIND_WAIT_SECONDS
    while True:
        try:
            async with asyncio.timeout(FIND_WAIT_SECONDS):
                node = await broker.groups.coordinator_node(group)
        except (LaminarError, TimeoutError):
            node = None
        address = next((b for b in broker.brokers() if b.node_id == node), None)
        if address is not None:
            return address, errors.NONE
        if loop.time() >= deadline:
            return None, COORDINATOR_NOT_AVAILABLE
        await asyncio.sleep(0.05)
