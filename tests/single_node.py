"""One real in-process node (its own metadata group of one), for tests that need a node they
can configure and restart in the test process: `SingleNode(tmp_path).start()`, `create_topic`,
and the `bootstrap` fixture (topic ``jobs``, one partition) of the share-group tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Admin
from laminar.errors import LaminarError
from laminar.node.config import NodeConfig
from laminar.node.node import Node

TOPIC = "jobs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SingleNode:
    """Node 1 on fixed free ports and ``data_dir``, so it can be stopped and started again."""

    def __init__(self, data_dir: Path, **config: Any) -> None:
        self.data_dir = data_dir
        self.client_port, self.peer_port = free_port(), free_port()
        self.config = config
        self.bootstrap = f"127.0.0.1:{self.client_port}"

    async def start(self) -> Node:
        node = Node(
            NodeConfig(
                node_id=1,
                data_dir=self.data_dir,
                listen=self.bootstrap,
                peer_listen=f"127.0.0.1:{self.peer_port}",
                peers={1: f"127.0.0.1:{self.peer_port}"},
                metadata_replicas=1,
                tick_ms=10,
                **self.config,
            )
        )
        await node.start()
        return node


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` (RF 1) once the node has registered itself and can place replicas."""
    async with Admin(bootstrap) as admin:
        while topic not in await admin.list_topics():
            try:
                await admin.create_topic(topic, partitions=partitions, replication_factor=1)
            except LaminarError:  # not registered yet
                await asyncio.sleep(0.1)


@pytest.fixture
async def bootstrap(tmp_path: Path) -> AsyncIterator[str]:
    single = SingleNode(tmp_path)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, TOPIC, 1)
        yield single.bootstrap
    finally:
        await node.stop()
