"""A large metadata answer is built once and copied into identical requests' answers until
something it shows moves: a topic altered or created (the metadata log applied further), a
replica taken offline (a replica gone from the node). One real in-process node; the size from
which answers are kept is lowered so that a small topic is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.client import Admin
from laminar.node import client_api
from tests.single_node import SingleNode, create_topic


async def test_a_kept_metadata_answer_is_rebuilt_once_what_it_shows_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_api, "CACHE_METADATA_FROM", 1)
    single = SingleNode(tmp_path)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, "a", 2)
        async with Admin(single.bootstrap) as admin:
            first = await admin.describe_topic("a")
            assert [p.leader for p in first.partitions] == [1, 1]
            kept = node.client_server._metadata_cache
            assert kept is not None
            assert await admin.describe_topic("a") == first
            assert node.client_server._metadata_cache is kept  # served from it, not rebuilt

            await admin.alter_topic("a", retention_ms=60_000)  # the metadata log moves on
            assert (await admin.describe_topic("a")).retention_ms == 60_000
            await admin.create_topic("b", partitions=1, replication_factor=1)
            assert "b" in await admin.list_topics()

            replica = node.replica_for("a", 1)
            assert replica is not None
            kept = node.client_server._metadata_cache
            node.runtime.fail(replica, OSError("injected storage fault"))
            await admin.describe_topic("a")
            assert node.client_server._metadata_cache is not kept  # a replica went away
    finally:
        await node.stop()
