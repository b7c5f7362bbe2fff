"""When a node's peer network dials: PeerNetworks on real sockets.

A restarting node learns its peers' addresses while it replays its metadata log, before it has
opened its replicas. Dialed then, its peers' Raft traffic (thousands of groups probing a
replica not yet open) competed with the opening for the CPU: at 10,000 partitions the opening
took 14 s instead of 8. A network therefore dials only once started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from laminar.framing import MAX_PAYLOAD_BYTES
from laminar.node.peers import PeerNetwork
from laminar.node.raft_codec import GroupMessage, encode_frames
from laminar.raft import Entry, EntryKind, Message, MessageType
from laminar.segment.batch import build_batch
from tests.test_peer_auth import _free_port
from tests.test_swim_driver import wait_for


def _network(
    node_id: int,
    ups: list[int],
    on_raft: Callable[[int, list[GroupMessage]], None] = lambda peer, messages: None,
) -> PeerNetwork:
    return PeerNetwork(
        node_id,
        "laminar",
        f"127.0.0.1:{_free_port()}",
        f"127.0.0.1:{_free_port()}",
        on_raft=on_raft,
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


def _appends(groups: int, record_bytes: int) -> list[GroupMessage]:
    """One append of one record of ``record_bytes`` to node 2 in each of ``groups`` groups."""
    batch = build_batch([(None, b"v" * record_bytes, (), 0)])
    entry = Entry(1, 0, 0, EntryKind.NORMAL, batch)
    return [
        (group, Message(type=MessageType.APPEND, to=2, frm=1, term=1, entries=[entry]))
        for group in range(groups)
    ]


def test_frames_hold_a_bounded_share_of_the_entries_in_order() -> None:
    messages = _appends(10, 300)
    per_message = len(messages[0][1].entries[0].data)
    frames = encode_frames(messages, max_entry_bytes=3 * per_message + 1)
    assert [len(payload) for _, payload in frames] == [3, 3, 3, 1]
    alone = encode_frames(messages[:2], max_entry_bytes=per_message // 2)
    assert [len(payload) for _, payload in alone] == [1, 1]  # a message larger goes alone
    assert len(encode_frames(messages)) == 1  # the usual drain: one frame


async def test_a_drain_owing_more_than_one_frame_holds_reaches_the_peer() -> None:
    # A node back after a while is owed entries by thousands of groups at once. Sent in one
    # frame they passed the receiver's limit, which closed the connection, and every retry
    # did the same: the node never caught up.
    received: list[int] = []
    one = _network(1, [])
    two = _network(2, [], lambda peer, messages: received.extend(g for g, _ in messages))
    messages = _appends(80, 1 << 20)
    assert sum(len(m.entries[0].data) for _, m in messages) > MAX_PAYLOAD_BYTES
    await two.start()
    await one.start()
    try:
        one.add_peer(2, two.peer_address)
        await wait_for(lambda: one.connected(2) and two.connected(1), 5, "the pair to connect")
        one.send_raft(2, messages)
        await wait_for(lambda: len(received) == len(messages), 20, "every append to arrive")
        assert received == list(range(len(messages)))
        assert one.connected(2) and two.connected(1)
    finally:
        await one.stop()
        await two.stop()
