"""When a node's peer network dials: PeerNetworks on real sockets.

A restarting node learns its peers' addresses while it replays its metadata log, before it has
opened its replicas. Dialed then, its peers' Raft traffic (thousands of groups probing a
replica not yet open) competed with the opening for the CPU: at 10,000 partitions the opening
took 14 s instead of 8. A network therefore dials only once started.
"""

from __future__ import annotations

import asyncio

from laminar.node.peers import PeerNetwork
from tests.test_peer_auth import _free_port
from tests.test_swim_driver import wait_for


def _network(node_id: int, ups: list[int]) -> PeerNetwork:
    return PeerNetwork(
        node_id,
        "laminar",
        f"127.0.0.1:{_free_port()}",
        f"127.0.0.1:{_free_port()}",
        on_raft=lambda peer, messages: None,
        on_other=lambda peer, which, body: None,
        on_up=lambda peer, address, client: ups.append(peer),
        on_down=lambda peer: None,
        dead_after=2.0,
    )


async def test_a_peer_learnt_before_the_start_is_dialed_only_once_started() -> None:
    ups_one: list[int] = []
    ups_two: list[int] = []
    one, two = _network(1, ups_one), _network(2, ups_two)
    await two.start()
    try:
        one.add_peer(2, two.peer_address)  # node 1 dials node 2 (the lower id dials)
        await asyncio.sleep(0.5)
        assert not one.connected(2) and not two.connected(1)
        assert ups_one == [] and ups_two == []
        await one.start()
        await wait_for(lambda: one.connected(2) and two.connected(1), 5, "the pair to connect")
        assert ups_one == [2] and ups_two == [1]
    finally:
        await one.stop()
        await two.stop()
