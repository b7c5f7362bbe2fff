"""A node stops even when one of its services never finishes stopping (a hang injected into
the queue service's stop): the stuck phase is given up after a bound, and the Raft runtime
still stops (logs made durable and closed) and the data directory is released."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.node import node as node_module
from tests.single_node import SingleNode


async def test_a_service_that_never_stops_does_not_keep_the_node_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_module, "STOP_PHASE_S", 0.5)
    node = await SingleNode(tmp_path).start()
    stuck = asyncio.Event()

    async def never_stops() -> None:
        await stuck.wait()  # nothing ever sets it

    monkeypatch.setattr(node.queues, "stop", never_stops)
    started = time.monotonic()
    await asyncio.wait_for(node.stop(), 10)
    assert time.monotonic() - started < 5
    assert node.runtime.replicas == {}  # the runtime stopped too (logs synced and closed)
    again = await SingleNode(tmp_path).start()  # the data directory's lock was released
    await again.stop()
