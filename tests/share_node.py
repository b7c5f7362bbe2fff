"""One real in-process node with topic ``jobs`` (one partition), for share-group tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

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


@pytest.fixture
async def bootstrap(tmp_path: Path) -> AsyncIterator[str]:
    client_port, peer_port = free_port(), free_port()
    node = Node(
        NodeConfig(
            node_id=1,
            data_dir=tmp_path,
            listen=f"127.0.0.1:{client_port}",
            peer_listen=f"127.0.0.1:{peer_port}",
            peers={1: f"127.0.0.1:{peer_port}"},
            metadata_replicas=1,
            tick_ms=10,
        )
    )
    await node.start()
    address = f"127.0.0.1:{client_port}"
    try:
        async with Admin(address) as admin:
            while TOPIC not in await admin.list_topics():
                try:
                    await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
                except LaminarError:
                    await asyncio.sleep(0.1)
        yield address
    finally:
        await node.stop()
