"""Run one request against the cluster, refreshing metadata and backing off between tries.

Leaders move and metadata lags (a topic created a moment ago may not be known to every node
yet); both cure themselves within an election or two, which is what the retry budget covers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from laminar.client.cluster import Cluster
from laminar.client.connection import is_retriable
from laminar.client.log import get_logger
from laminar.errors import LaminarError

log = get_logger(__name__)

T = TypeVar("T")

DEFAULT_ATTEMPTS = 8
DEFAULT_BACKOFF = 0.1
MAX_BACKOFF = 1.0


async def retrying(
    cluster: Cluster,
    operation: Callable[[], Awaitable[T]],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: float = DEFAULT_BACKOFF,
    retriable: Callable[[BaseException], bool] = is_retriable,
) -> T:
    """Await ``operation()``; on a retriable error refresh metadata, wait, and try again."""
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            return await operation()
        except (ConnectionError, OSError, LaminarError) as exc:
            if not retriable(exc) or attempt == attempts:
                raise
            log.debug("retrying request", attempt=attempt, error=str(exc))
            await _refresh(cluster)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _refresh(cluster: Cluster) -> None:
    """Whatever went wrong (leader moved, node gone, metadata lag), fresh metadata is the cure."""
    try:
        await cluster.refresh_metadata()
    except (ConnectionError, LaminarError) as exc:
        log.debug("metadata refresh failed", error=str(exc))
